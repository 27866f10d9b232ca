"""Everyday comforts around a training run: the hooks ctl ships (`ctl.hooks`).

Early stopping (`early_stopping`, reading results as `eval_results` does),
Keras callbacks (`keras_callbacks`), the best checkpoint (`best`), SavedModel
exporters (`exporting`), warm starting a subset of variables (`warm_start`),
a profile of chosen steps (`profile`), the gin values as HParams (`hparams`),
the progress line and metrics.jsonl (`progress`), the end of a run
(`run_end`) and the PNGs of `ctl.report` and a sweep's report (`figures`).
The hook protocol itself is `ctl.core.hook_protocol`'s;
`--mode=smoke` is `ctl.smoke`. Nothing is re-exported here: the public API is
`ctl`.
"""
