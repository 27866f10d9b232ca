"""Fault tolerance of a training run.

`handler` holds the `FaultTolerance` settings and the handler run after each
train loop; around it, signals are honoured at step boundaries (`preemption`; the
guarded loop is core's, `ctl.core.loops.StepGuard`), the NaN policy (`nan_guard`), a
restart resumes exactly where the run stopped (`resume`), at a new size too
(`run_size`), and a storage failure ends the run in one line (`storage`). One trainer
per model dir is a rule of the files processes share (`ctl.model_dir.trainer_lock`).
Nothing is re-exported here: the public API is `ctl`.
"""
