"""Hyperparameter sweeps: `python -m ctl.sweep`, many ctl runs over gin bindings, on Optuna.

A sweep file (TOML, `ctl.sweep.sweep_file`) names the objective, the budget,
the sampler, the pruner and the space: gin bindings and their distributions.
Each trial is one `python -m ctl.run --mode=train_and_eval` process in
`<sweep_dir>/trials/<number>/` (`ctl.sweep.runner`), its sampled bindings on its
command line and so in its `config.gin`. The study lives in Optuna's storage
(`ctl.sweep.study`): a journal file in the sweep dir by default, PostgreSQL for
several machines. The budget is a queue of exactly `trials` trials, claimed one
at a time, so that it is exact with any number of workers
(`ctl.sweep.worker`). The pruner (`ctl.sweep.pruning`) is asked at each
evaluation; the console (`ctl.sweep.progress`) shows the counts and the best so
far; `ctl.sweep.report` is `python -m ctl.report`'s view of a sweep dir.

An entry point: nothing in core or the subsystems imports it. Optuna is the
`sweep` extra (`pip install 'ctl[sweep]'`).
"""
