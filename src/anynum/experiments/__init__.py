"""Studies and measurements behind the ``anynum`` command.

``bench`` (quantization speed), and the format studies of ``anynum study``:
``datasets`` (bundled offline data), ``models`` (MLP, CNN, LSTM), ``trials``
(one trial, a pure function of its config; the studies' training loop), ``runner``
(grids, executors, resumable JSONL results), ``report`` (table, CSV, heatmap) and
``plots`` (value distribution and decimal accuracy of formats); behind ``anynum
diagnose`` and ``anynum search``: ``diagnosis``, ``formatsearch``, ``setup`` (model,
data, progress, files) and ``userfiles`` (a user's model and data files, loaded without
running them). See docs/cli.md and docs/diagnose.md.
"""

__all__: list[str] = []
