"""Hyperparameter sweeps: `python -m ctl.sweep`, many ctl runs over gin bindings, on Optuna.

A sweep file (TOML, `ctl.sweep.sweep_file`) names the objective, the budget,
the sampler, the pruner and the space: gin bindings and their distributions.
Each trial is one ctl run, `python -m ctl.sweep.trial --mode=train_and_eval`
(ctl.run's path with the pruning hook appended), in its own process and
`<sweep_dir>/trials/<number>/` (`ctl.sweep.runner`), its sampled bindings on
its command line and so in its `config.gin`. The study (`ctl.sweep.study`) lives
in Optuna's storage (`ctl.sweep.storage`): a journal file in the sweep dir by
default, PostgreSQL for several machines. The budget is a queue of exactly `trials` trials, claimed one
at a time, so that it is exact with any number of workers
(`ctl.sweep.worker`). The pruner (`ctl.sweep.pruning`) is asked inside the
trial's run at each evaluation, and the run stops there when pruned; the
console (`ctl.sweep.progress`) shows the counts and the best so far;
`ctl.sweep.report` is `python -m ctl.report`'s view of a sweep dir.

An entry point, above ctl.run (whose path its trials run): only `ctl.report`
imports it. Optuna is the
`sweep` extra (`pip install -e '.[sweep]'` in the checkout).
"""
