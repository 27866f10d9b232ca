"""The study: where it is stored, its budget as a queue of trials, and who runs which trial.

Storage. The study is Optuna's journal file in the sweep dir, or a PostgreSQL
database (`--storage`): `ctl.sweep.storage` opens it and records where it is.

The budget is exact. The process that creates the study enqueues exactly
`trials` WAITING trials (numbers 0 .. trials-1); a worker claims one by moving
it from WAITING to RUNNING, which the storage does for one caller only (a row
lock in PostgreSQL, the journal's lock file). No trial is ever created beyond
the queue, so a study never holds more than `trials` trials that ran, whatever
the number of workers. (Two commands that create the same study at the same
moment may both enqueue: the trials numbered `trials` and above are never
claimed.) What this takes from below Optuna's public API is in
`ctl.sweep.optuna_internals`.

The sweep file. The study keeps what the sweep file that created it said (its
`identity`: objective, direction, value, sampler, seed, pruner, space) as a user
attribute; opened again with a file that says otherwise, it raises `UserError`
naming the first difference, before a trial is added or claimed
(`check_existing` does it first, before TensorFlow is imported). Only `trials`
and `timeout` may change on an existing study.

Ownership. Which worker runs which trial (its slot, the owner and heartbeat a claimed trial
records, the takeover of a stale one) is a rule of the files and records the sweep's processes
share: `ctl.model_dir.sweep_workers` states it; `Study` reads and writes those records (`own`,
`beat`, `orphans`, `take_over_stale`, `owner`).
"""

import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import optuna
from optuna.trial import TrialState

from ctl.utils.errors import UserError
from ctl.sweep import optuna_internals as internals
from ctl.sweep import sweep_dir as layout
from ctl.sweep.storage import open_storage
from ctl.sweep.sweep_file import SweepFile, check_same_study, identity

if TYPE_CHECKING:
    from ctl.model_dir import ModelDir
    from ctl.model_dir.sweep_workers import Slot

# Trial system attributes (the owner's and the heartbeat's: `ctl.model_dir.sweep_workers`).
MODEL_DIR = "ctl_model_dir"
FAIL_REASON = "ctl_fail_reason"
STARTED = "ctl_started"  # The study's user attribute: when it was created (time.time()).
SWEEP_FILE = "ctl_sweep_file"  # The study's user attribute: the sweep file's `identity`.
ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def check_existing(sweep_dir: str, storage: Optional[str], sweep: SweepFile) -> None:
    """If the sweep's study exists (in the journal file of `sweep_dir`, or at `storage`), raises
    `UserError` when `sweep` does not match what it kept (`check_same_study`); creates nothing
    (no sweep dir, no study). Cheap: no TensorFlow, so a changed file is refused at once.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        storage: the sweep's `--storage` (None: the journal file in the sweep dir).
        sweep: the parsed sweep file.
    """
    if storage is None and not os.path.isfile(layout.journal_file(sweep_dir)):
        return
    opened = open_storage(sweep_dir, storage)
    try:
        existing = optuna.load_study(study_name=sweep.study, storage=opened)
    except KeyError:  # No study of that name yet.
        return
    kept = existing.user_attrs.get(SWEEP_FILE)
    if kept is not None:
        check_same_study(kept, sweep, sweep.study)


def make_sampler(sweep: SweepFile, number: int = 0) -> optuna.samplers.BaseSampler:
    """The sweep file's sampler, for trial `number`: seeded with `seed + number`, so that with
    `seed` the suggestions depend on the study's history, not on which worker asks.

    Args:
        sweep: the parsed sweep file.
        number: the trial's number.
    """
    seed = None if sweep.seed is None else sweep.seed + number
    if sweep.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sweep.sampler == "grid":
        return optuna.samplers.GridSampler(sweep.grid(), seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


class Study:
    """An Optuna study of a sweep, with its storage and its budget."""

    def __init__(self, storage: optuna.storages.BaseStorage, sweep: SweepFile,
                 pruner: optuna.pruners.BasePruner, wait_s: float = 30.0,
                 sweep_dir: Optional[str] = None):
        """Loads the study, creating it (with its queue of `sweep.trials` trials) if it is new.

        A study found with fewer trials than the budget (the budget was raised, or
        its creator died while it enqueued) is topped up once its creator had
        `wait_s` seconds to enqueue. `sweep_dir`: where the lock of a journal file's
        takeovers is (`<sweep_dir>/workers/takeover.lock`).

        Args:
            storage: the study's storage (`open_storage`).
            sweep: the parsed sweep file.
            pruner: the sweep's pruner (`ctl.sweep.pruning.make_pruner`).
            wait_s: seconds a study's creator has to enqueue the budget before another tops it up.
            sweep_dir: the sweep dir, where the lock of a journal file's takeovers is (None: no such lock).
        """
        self.storage = storage
        self.budget = sweep.trials
        self.timeout = sweep.timeout
        self.name = sweep.study
        self.lock_file = _workers().takeover_lock_file(sweep_dir or ".")
        sampler = make_sampler(sweep)
        try:
            self.optuna = optuna.create_study(storage=storage, study_name=sweep.study,
                                              sampler=sampler, pruner=pruner,
                                              direction=sweep.direction)  # type: ignore[arg-type]
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            self.optuna = optuna.load_study(study_name=sweep.study, storage=storage,
                                            sampler=sampler, pruner=pruner)
            created = False
        self.study_id = storage.get_study_id_from_name(sweep.study)
        have = self.optuna.direction.name.lower()
        if have != sweep.direction:
            raise UserError(f"--sweep_file={sweep.path}: direction = {sweep.direction!r}, but "
                            f"the study {sweep.study!r} in this storage was created to {have}; "
                            "keep the direction, or name a new study (study = \"...\").")
        kept = self.optuna.user_attrs.get(SWEEP_FILE)
        if kept is not None:  # Before any trial of the budget is added or claimed.
            check_same_study(kept, sweep, sweep.study)
        else:  # A new study (or one made before ctl kept this): what may not change on it.
            self.optuna.set_user_attr(SWEEP_FILE, identity(sweep))
        if created:
            self.optuna.set_user_attr("objective", sweep.objective)
            self.optuna.set_user_attr(STARTED, time.time())
        else:
            deadline = time.monotonic() + wait_s
            while len(self.all_trials()) < self.budget and time.monotonic() < deadline:
                time.sleep(0.5)
        internals.name_objective(self.optuna, sweep.objective)  # optuna-dashboard's label.
        for _ in range(self.budget - len(self.all_trials())):
            internals.add_waiting(storage, self.study_id)

    def all_trials(self, states=None) -> List[optuna.trial.FrozenTrial]:
        """Every trial of the study, the budget's and any other.

        Args:
            states: only trials in these `TrialState`s (None: all).
        """
        return self.optuna.get_trials(deepcopy=False, states=states)

    def trials(self, states=None) -> List[optuna.trial.FrozenTrial]:
        """The trials of the budget's queue (numbers below the budget).

        Args:
            states: only trials in these `TrialState`s (None: all).
        """
        return [t for t in self.all_trials(states) if t.number < self.budget]

    def trial(self, number: int) -> optuna.trial.FrozenTrial:
        """Trial `number` as the storage has it now.

        Args:
            number: the trial's number.
        """
        return internals.frozen(self.storage, self.study_id, number)

    def optuna_trial(self, number: int) -> optuna.Trial:
        """The `optuna.Trial` of RUNNING trial `number`, to ask its values of.

        Args:
            number: the trial's number.
        """
        return internals.trial_of(self.optuna, self.storage, self.study_id, number)

    def timed_out(self) -> bool:
        """True once the sweep file's `timeout` passed since the study was created: no trial starts."""
        if self.timeout is None:
            return False
        started = self.optuna.user_attrs.get(STARTED)
        if started is None:  # A study created before `timeout` existed: from now on.
            started = time.time()
            self.optuna.set_user_attr(STARTED, started)
        return time.time() - started >= self.timeout

    def claim_next(self) -> Optional[int]:
        """Claims the lowest-numbered WAITING trial of the budget; its number, or None (also
        once the sweep's timeout passed)."""
        if self.timed_out():
            return None
        waiting = sorted(t.number for t in self.trials((TrialState.WAITING,)))
        return internals.pop_waiting(self.storage, self.study_id, iter(waiting))

    def set_attr(self, number: int, key: str, value: Any, user: bool = False) -> None:
        """Sets a system attribute of trial `number` (a user attribute, what optuna-dashboard shows, with `user`).

        Args:
            number: the trial's number.
            key: the attribute.
            value: its value (JSON).
            user: a user attribute; False: a system attribute.
        """
        internals.set_trial_attr(self.storage, self.study_id, number, key, value, user=user)

    def beat(self, number: int) -> None:
        """Records a heartbeat of trial `number` (now).

        Args:
            number: the trial's number.
        """
        self.set_attr(number, _workers().HEARTBEAT, time.time())

    def own(self, number: int, slot: "Slot", model_dir: "ModelDir") -> None:
        """Marks trial `number` as this slot's, with its model dir, and beats.

        Args:
            number: the trial's number.
            slot: the worker's slot.
            model_dir: the trial's model dir.
        """
        self.set_attr(number, _workers().OWNER, slot.key)
        self.set_attr(number, MODEL_DIR, model_dir.path)
        self.beat(number)

    def orphans(self, slot: "Slot") -> List[optuna.trial.FrozenTrial]:
        """RUNNING trials of this slot: its previous worker died running them.

        Args:
            slot: the worker's slot.
        """
        owner = _workers().OWNER
        return [t for t in self.trials((TrialState.RUNNING,)) if t.system_attrs.get(owner) == slot.key]

    def take_over_stale(self, slot: "Slot",
                        grace: float) -> Optional[Tuple[optuna.trial.FrozenTrial, float]]:
        """Takes over the lowest-numbered RUNNING trial of another worker whose heartbeat is
        `grace` seconds old, under the storage's lock: the trial (read under the lock,
        before this worker's heartbeat) and its heartbeat's age in seconds, or None.

        Args:
            slot: the worker's slot, the trial's new owner.
            grace: seconds a heartbeat may be old before the trial is stale.
        """
        workers = _workers()
        stale = [t.number for t in self.trials((TrialState.RUNNING,))
                 if t.system_attrs.get(workers.OWNER) != slot.key and workers.heartbeat_age(t) >= grace]
        if not stale:
            return None
        with internals.exclusive(self.storage, self.name, self.lock_file):
            for number in sorted(stale):
                again = self.trial(number)  # Another worker may have taken it meanwhile.
                age = workers.heartbeat_age(again)
                if again.state == TrialState.RUNNING and age >= grace:
                    self.set_attr(number, workers.OWNER, slot.key)
                    self.beat(number)
                    return again, age
        return None

    def owner(self, number: int) -> Optional[str]:
        """The slot that owns trial `number`, as its record says (None: none).

        Args:
            number: the trial's number.
        """
        return self.trial(number).system_attrs.get(_workers().OWNER)

    def counts(self) -> Dict[str, int]:
        """Trials of the budget by state name (complete, pruned, fail, running, waiting)."""
        found = {state.name.lower(): 0 for state in (*ENDED, TrialState.RUNNING, TrialState.WAITING)}
        for trial in self.trials():
            found[trial.state.name.lower()] += 1
        return found

    def best(self) -> Optional[optuna.trial.FrozenTrial]:
        return best_of(self.trials(), self.optuna.direction.name.lower())


def best_of(trials, direction: str) -> Optional[optuna.trial.FrozenTrial]:
    """The best complete trial of `trials`, or None.

    Args:
        trials: trials of the study.
        direction: `maximize` or `minimize`.
    """
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    if not done:
        return None
    return (max if direction == "maximize" else min)(done, key=lambda t: t.value)


def _workers():
    """`ctl.model_dir.sweep_workers` (slots, owners, heartbeats), imported at first use: the model
    dir's package imports TensorFlow, and `check_existing` answers before it."""
    from ctl.model_dir import sweep_workers

    return sweep_workers
