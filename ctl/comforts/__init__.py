"""Everyday comforts around a training run.

Plain-callable hooks with early stopping and stop requests (`hooks`), Keras
callbacks (`keras_callbacks`), the best checkpoint (`best`), SavedModel
exporters (`exporting`), warm starting a subset of variables (`warm_start`),
`--mode=smoke` (`smoke`) and the progress line and metrics.jsonl (`progress`).
Nothing is re-exported here: the public API is `ctl`.
"""
