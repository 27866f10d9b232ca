"""The core of ctl: what a user writes, how it is trained, and the extension points.

`task` is what a user writes (`Task`; `contract` checks it at start); the
`trainer` runs it on orbit (`Trainer` over `evaluation`, its loops in `loops`,
the runner contract in `runner`; the step's gradient pipeline in `train_step`,
`precision`, `xla`, `ema`; learning rates in `schedules`), and `controller`
drives train and eval loops with `checkpointing` and `summaries`; a
checkpoint holds `checkpoint_contents`. The model dir and its cross-process
records are `ctl.model_dir`'s; what a mode runs is `run_plan`'s; the extension
points the
subsystems plug into are `hook_protocol` (hooks, train/eval actions), `stop`
(the stop request, signals, the second signal's exit), `runner` and
`aggregation`. A configurable's declared argument checks are `arguments`'. Around them: gin at the edges (`config`,
`gin_text`), the default serving signature (`serving`) and the report's PNGs
(`figures`). `UserError`, what a run prints and a command's end are `ctl.utils`'.
`Experiment` (`ctl.experiment`) and the composition root (`ctl.train_lib`)
are above core. Nothing is re-exported here: the public API is `ctl`.
"""
