"""The modes of a run: what `--mode` and `ctl.run_experiment` accept.

    python -m ctl.run --mode=train|eval|train_and_eval|continuous_eval   (MODES; or smoke)

What one process runs for its mode and its place in a cluster is its
`RunPlan`, decided once at the entry (`ctl.run`) and passed down; nothing
below it compares mode strings. Pure Python: `ctl.run`'s flags read `MODES`
before TensorFlow is imported.
"""

TRAIN = "train"
EVAL = "eval"
TRAIN_AND_EVAL = "train_and_eval"
CONTINUOUS_EVAL = "continuous_eval"
MODES = (TRAIN, EVAL, TRAIN_AND_EVAL, CONTINUOUS_EVAL)  # `ctl.MODES`
"""What `ctl.run_experiment` (and `python -m ctl.run --mode`) can run: `train` (to
`ctl.Schedule.train_steps`), `eval` (one evaluation of the latest checkpoint),
`train_and_eval` (train, evaluating every `ctl.Schedule.eval_interval` steps) and
`continuous_eval` (a sidecar: evaluate each new checkpoint of the model dir)."""
SMOKE = "smoke"  # `python -m ctl.run --mode=smoke` (`ctl.smoke`), not a mode of `run_experiment`.
