"""Studies and measurements behind the ``anynum`` command (benchmarks; later format studies)."""

__all__: list[str] = []
