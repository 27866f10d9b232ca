"""The core of ctl: what a user writes, how it is trained, and the extension points.

`task` is what a user writes (`Task`; `contract` checks it at start); the
`trainer` runs it on orbit (`Trainer` over `evaluation`, its loops in `loops`,
the runner contract in `runner`; the step's gradient pipeline in `train_step`,
`precision`, `xla`, `ema`; learning rates in `schedules`), and `controller`
drives train and eval loops with `checkpointing` and `summaries`. The model
dir's files are `model_dir`'s (with `checkpoint_contents`, `claims`,
`staging` and `background` for object stores), who evaluates it is
`evaluator_role`'s, and what a mode runs is `run_plan`'s; the extension points the
subsystems plug into are `hook_protocol` (hooks, train/eval actions), `stop`
(the stop request, signals, the second signal's exit), `runner` and
`aggregation`. A configurable's declared argument checks are `arguments`'. Around them: gin at the edges (`config`,
`gin_text`), `UserError` (`errors`), what a run prints (`console`; TensorFlow's
devices listed without the cuInit line on a host with no GPU: `devices`), the
default serving signature (`serving`), the report's PNGs (`figures`) and a
command's end (`process_end`).
`Experiment` (`ctl.experiment`) and the composition root (`ctl.train_lib`)
are above core. Nothing is re-exported here: the public API is `ctl`.
"""
