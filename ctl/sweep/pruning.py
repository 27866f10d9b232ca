"""Pruning: the sweep file's pruner as Optuna's, asked at each evaluation of a trial.

    asha    `SuccessiveHalvingPruner` (asynchronous successive halving): at rungs of
            min_resource * reduction_factor**k steps, a trial goes on only if its value
            is in the top 1/reduction_factor of the trials that reached the rung.
            min_resource defaults to Optuna's estimate ("auto": from the first trials
            that end), reduction_factor to 4.
    median  `MedianPruner`: stops a trial whose value at a step is worse than the
            median of the other trials' at that step, after startup_trials trials
            ended (default 5) and warmup_steps steps (default 0).
    none    every trial runs to its end.

The step a value is reported at is the evaluation's global step. A pruned
trial stops at a checkpoint boundary (its `ctl.run` gets SIGTERM: it saves a
checkpoint and exits 75) and `<trial dir>/sweep_pruned.json` says why.
"""

import time
from typing import Any, Dict, Optional

import optuna



def make_pruner(options: Dict[str, Any]) -> optuna.pruners.BasePruner:
    name = options["name"]
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=options.get("min_resource", "auto"),
            reduction_factor=options.get("reduction_factor", 4))
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=options.get("startup_trials", 5),
                                           n_warmup_steps=options.get("warmup_steps", 0))
    return optuna.pruners.NopPruner()


def record_pruned(model_dir: str, pruner: Dict[str, Any], objective: str, step: int,
                  value: float) -> None:
    """Writes `<model_dir>/sweep_pruned.json`: which pruner stopped the trial, at which step, on
    which value."""
    from ctl.core.model_dir import ModelDir, write_json

    write_json(ModelDir(model_dir).sweep_pruned_file, {
        "pruner": pruner["name"], "options": pruner, "step": step, "objective": objective,
        "value": value, "time": time.time(),
        "why": f"{objective} = {value:.6g} at step {step} was not good enough for the "
               f"{pruner['name']} pruner, against the other trials at that step"})


def read_pruned(model_dir: str) -> Optional[Dict[str, Any]]:
    from ctl.core.model_dir import ModelDir, read_json

    return read_json(ModelDir(model_dir).sweep_pruned_file)
