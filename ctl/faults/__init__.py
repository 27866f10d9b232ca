"""Fault tolerance of a training run.

`handler` holds the `FaultTolerance` settings and the handler run after each
train loop; around it, signals are honoured at step boundaries (`preemption`; the
guarded loop is core's, `ctl.core.loops.StepGuard`), NaN policy (`nan_guard`), a restart resumes
exactly where the run stopped (`resume`) and one trainer owns a model dir
(`lock`). Nothing is re-exported here: the public API is `ctl`.
"""
