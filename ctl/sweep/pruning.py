"""Pruning: the sweep file's pruner as Optuna's, asked inside each trial at each of its evaluations.

    asha    `SuccessiveHalvingPruner` (asynchronous successive halving): at rungs of
            min_resource * reduction_factor**k steps, a trial goes on only if its value
            is in the top 1/reduction_factor of the trials that reached the rung.
            min_resource defaults to Optuna's estimate ("auto": from the first trials
            that end), reduction_factor to 4.
    median  `MedianPruner`: stops a trial whose value at a step is worse than the
            median of the other trials' at that step, after startup_trials trials
            ended (default 5) and warmup_steps steps (default 0).
    none    every trial runs to its end.

The asking is a hook of the trial's own run (`PruneAtEvaluations`, appended to
the experiment's hooks by `python -m ctl.sweep.trial`): at each evaluation's
end it reports the objective at the evaluation's global step to the trial in
the study (the sweep's storage: the journal file in the sweep dir, or
`--storage`) and asks `should_prune()`. If the pruner says so, it writes
`<trial dir>/sweep_pruned.json` (why) and requests a stop (`run.stop`, as
`ctl.hooks.EarlyStopping` does): the run ends right after that evaluation,
saves a checkpoint of its step, runs its end-of-run hooks (the HParams summary
among them) and exits 0. Its worker reads the outcome from the exit status and
that file (`ctl.sweep.runner`).
"""

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Set

import optuna

from ctl.sweep import optuna_internals as internals
from ctl.sweep.sweep_file import SweepFile

SWEEP_PRUNED_FILE = "sweep_pruned.json"  # In a trial's model dir: why it was pruned.

if TYPE_CHECKING:
    from ctl.model_dir import ModelDir


def make_pruner(options: Dict[str, Any]) -> optuna.pruners.BasePruner:
    """The Optuna pruner the sweep file's `[pruner]` table names (asha, median or none).

    Args:
        options: the table, checked (`name` and its options).
    """
    name = options["name"]
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=options.get("min_resource", "auto"),
            reduction_factor=options.get("reduction_factor", 4))
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=options.get("startup_trials", 5),
                                           n_warmup_steps=options.get("warmup_steps", 0))
    return optuna.pruners.NopPruner()


def record_pruned(model_dir: "ModelDir", pruner: Dict[str, Any], objective: str, step: int,
                  value: float) -> None:
    """Writes `<model_dir>/sweep_pruned.json`: which pruner stopped the trial, at which step, on
    which value.

    Args:
        model_dir: the trial's model dir.
        pruner: the sweep file's `[pruner]` table.
        objective: the objective's name.
        step: the step of the evaluation it was pruned at.
        value: the objective's value there.
    """
    from ctl.model_dir import write_json

    write_json(model_dir.file(SWEEP_PRUNED_FILE), {
        "pruner": pruner["name"], "options": pruner, "step": step, "objective": objective,
        "value": value, "time": time.time(),
        "why": f"{objective} = {value:.6g} at step {step} was not good enough for the "
               f"{pruner['name']} pruner, against the other trials at that step"})


def read_pruned(model_dir: "ModelDir") -> Optional[Dict[str, Any]]:
    """The record `record_pruned` wrote, or None.

    Args:
        model_dir: the trial's model dir.
    """
    from ctl.model_dir import read_json

    return read_json(model_dir.file(SWEEP_PRUNED_FILE))


class PruneAtEvaluations:
    """A hook (`ctl.core.hook_protocol`) of a trial's run: reports the objective at each
    evaluation to trial `number` of the sweep's study and stops the run at that evaluation
    when the pruner says so.

    `open_storage` gives the study's storage; it is called at the first evaluation, so
    that a run that fails before one never opens the study. A step the trial already
    has a value at (a resumed trial) is neither reported nor asked again; nor is a NaN
    (the run's NaN policy decides, and its worker records the trial failed). A run
    started again on a trial that was pruned (its worker died before it recorded the
    end) stops at once, at a checkpoint.

    Args:
        sweep: the parsed sweep file.
        open_storage: returns the study's storage (called at the first evaluation).
        number: the trial's number.
    """

    def __init__(self, sweep: SweepFile, open_storage: Callable[[], optuna.storages.BaseStorage],
                 number: int):
        self.sweep = sweep
        self.open_storage = open_storage
        self.number = number
        self.trial: Optional[optuna.Trial] = None
        self.reported: Set[int] = set()

    def bind(self, run) -> None:
        """Keeps the run; a trial already pruned (its record is in the model dir) is stopped at once.

        Args:
            run: the trial run's `ctl.hooks.Run`.
        """
        self.run = run
        pruned = read_pruned(run.directory)
        if run.chief and isinstance(pruned, dict):
            run.stop.request(f"the trial was pruned at step {pruned.get('step')} "
                             f"({run.directory.file(SWEEP_PRUNED_FILE)})")

    def on_eval_end(self, logs) -> None:
        """Reports the objective at this step to the trial, and stops the run if the pruner says so.

        Args:
            logs: the evaluation's results (the objective among them).
        """
        value, step = self._objective(logs), self.run.step
        if not self.run.chief or math.isnan(value):
            return
        if self.trial is None:
            self._open()
        if step in self.reported:
            return
        self.trial.report(value, step)
        self.reported.add(step)
        if not self.run.stop.should_stop and self.trial.should_prune():
            record_pruned(self.run.directory, self.sweep.pruner, self.sweep.objective, step, value)
            self.run.stop.request(f"pruned by the {self.sweep.pruner['name']} pruner: "
                                  f"{self.sweep.objective} = {value:.6g} at step {step}")

    def _open(self) -> None:
        """The trial, through a study that samples nothing (its worker did) and has the sweep's
        pruner."""
        storage = self.open_storage()
        study = optuna.load_study(study_name=self.sweep.study, storage=storage,
                                  sampler=optuna.samplers.RandomSampler(seed=0),
                                  pruner=make_pruner(self.sweep.pruner))
        study_id = storage.get_study_id_from_name(self.sweep.study)
        self.reported = set(internals.frozen(storage, study_id, self.number).intermediate_values)
        self.trial = internals.trial_of(study, storage, study_id, self.number)

    def _objective(self, logs) -> float:
        from ctl.hooks.eval_results import flat_logs
        from ctl.utils.errors import UserError

        flat = flat_logs(logs)
        if self.sweep.objective not in flat:
            raise UserError(f"objective = {self.sweep.objective!r} of --sweep_file="
                            f"{self.sweep.path} is not among the evaluation results "
                            f"({', '.join(sorted(flat))}); name one of them in the sweep file.")
        return float(flat[self.sweep.objective])
