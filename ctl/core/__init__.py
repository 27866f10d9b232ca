"""The core of ctl: what a user writes and how it is trained.

`Task` says what (model, optimizer, inputs, losses, metrics, steps), `Trainer`
runs the train and eval loops on orbit, `Experiment` and `Schedule` say what to
run and when, and `run_experiment` drives the modes on a `Controller` with ctl's
checkpoint manager, loop summaries and asynchronous saving; gin at the edges
(`config`) and `UserError` for user mistakes (`errors`). Nothing is re-exported
here: the public API is `ctl`.
"""
