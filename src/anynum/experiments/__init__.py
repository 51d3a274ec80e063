"""Studies and measurements behind the ``anynum`` command.

``bench`` (quantization speed), and the format studies of ``anynum study``:
``datasets`` (bundled offline data), ``models`` (MLP, CNN, LSTM), ``trials``
(one trial, a pure function of its config), ``runner`` (grids, executors,
resumable JSONL results), ``report`` (table, CSV, heatmap) and ``plots``
(value distribution and decimal accuracy of formats). See docs/cli.md.
"""

__all__: list[str] = []
