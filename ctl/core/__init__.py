"""The core of ctl: what a user writes, how it is trained, and the extension points.

`task` is what a user writes (`Task`, and the default serving signature it
exports; `contract` checks it at start); the `trainer` runs it on orbit
(`Trainer` over `evaluation` and `inputs`, its loops in `loops`, the runner
contract in `runner`; the step's gradient pipeline in `train_step`,
`precision`, `xla`, `ema`; its draws from `tf.random` made functions of the step
in `step_random`; learning rates in `schedules`), and `controller`
drives train and eval loops with `checkpointing` and `summaries`; a checkpoint
holds `checkpoint_contents`. Every mode's Trainer is built,
its hooks bound, in `build_run`. The extension points the subsystems plug into are
`hook_protocol` (hooks, train/eval actions), `stop` (the stop request, signals, the second
signal's exit), `runner` and `aggregation`.

Below core: configuration and flags (`ctl.config`), the model dir and its
cross-process records (`ctl.model_dir`), process plumbing (`ctl.utils`).
Above it: `Experiment` (`ctl.experiment`) and the composition root
(`ctl.train_lib`). Nothing is re-exported here: the public API is `ctl`.
"""
