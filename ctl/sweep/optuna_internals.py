"""Everything ctl.sweep needs from Optuna below its public API, in this module alone.

Optuna is pinned below its next major version (`optuna>=5,<6`, the `sweep`
extra); tests/test_sweep_optuna_internals.py checks each assumption below and
fails when a release breaks one.

- The exact budget. `Study.ask()` takes the next WAITING trial, or creates a
  new trial when none waits: a study would then grow past its budget. ctl
  enqueues the budget's trials itself (`add_waiting`: `create_new_trial` at the
  storage, not `Study.enqueue_trial`, whose trials the grid sampler takes as
  fixed by hand) and takes one with `pop_waiting`, which does what Optuna's
  private `Study._pop_waiting_trial_id` does (WAITING to RUNNING through
  `set_trial_state_values`, which the storage grants to one caller only),
  restricted to the budget's numbers and never creating a trial.
- A trial that resumes (its worker died, or it is taken over) is RUNNING with
  the values it was given: `trial_of` builds `optuna.Trial(study, trial_id)`
  for it, whose `suggest_*` return those values; `ask()` has no way back to a
  RUNNING trial.
- `name_objective`: `Study.set_metric_names`, experimental in Optuna 5 (its
  warning silenced).
- Reads and writes of one trial by its number (`trial_id`, `frozen`,
  `set_trial_attr`): `BaseStorage` methods, which Optuna's
  documentation reserves for its own use.
- `exclusive`: the sweep workers' takeover lock (`ctl.model_dir.sweep_workers.takeover_lock`,
  where the rule is: a database's own lock, or the sweep dir's for a journal file),
  so that of two workers that find the same stale trial, one takes it over
  (`ctl.sweep.study.Study.take_over_stale`); the database is `RDBStorage.engine`.
"""

import warnings
from typing import Any, ContextManager, Iterator, Optional

import optuna
from optuna.trial import TrialState

SUPPORTED_MAJOR = 5  # pyproject.toml: optuna>=5,<6.


def trial_id(storage: optuna.storages.BaseStorage, study_id: int, number: int) -> int:
    """The storage's id of trial `number`.

    Args:
        storage: the study's Optuna storage.
        study_id: the study's id in the storage.
        number: the trial's number.
    """
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def frozen(storage: optuna.storages.BaseStorage, study_id: int,
           number: int) -> optuna.trial.FrozenTrial:
    """Trial `number` as the storage has it now.

    Args:
        storage: the study's Optuna storage.
        study_id: the study's id in the storage.
        number: the trial's number.
    """
    return storage.get_trial(trial_id(storage, study_id, number))


def set_trial_attr(storage: optuna.storages.BaseStorage, study_id: int, number: int, key: str,
                   value: Any, user: bool = False) -> None:
    """Sets a system attribute of trial `number` (a user attribute, what optuna-dashboard shows, with `user`).

    Args:
        storage: the study's Optuna storage.
        study_id: the study's id in the storage.
        number: the trial's number.
        key: the attribute.
        value: its value (JSON).
        user: a user attribute; False: a system attribute.
    """
    trial = trial_id(storage, study_id, number)
    if user:
        storage.set_trial_user_attr(trial, key, value)
    else:
        storage.set_trial_system_attr(trial, key, value)


def add_waiting(storage: optuna.storages.BaseStorage, study_id: int) -> None:
    """One more WAITING trial at the end of the queue, with no values fixed.

    Args:
        storage: the study's Optuna storage.
        study_id: the study's id in the storage.
    """
    storage.create_new_trial(study_id, optuna.trial.create_trial(state=TrialState.WAITING))


def pop_waiting(storage: optuna.storages.BaseStorage, study_id: int,
                numbers: Iterator[int]) -> Optional[int]:
    """Moves the first of `numbers` (WAITING trials) that this caller wins to RUNNING; its
    number, or None. Of several callers, one wins each trial (`Study._pop_waiting_trial_id`).

    Args:
        storage: the study's Optuna storage.
        study_id: the study's id in the storage.
        numbers: the WAITING trials' numbers, in the order to try them.
    """
    for number in numbers:
        try:
            if storage.set_trial_state_values(trial_id(storage, study_id, number),
                                              state=TrialState.RUNNING):
                return number
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def name_objective(study: optuna.Study, objective: str) -> None:
    """Labels the study's one value `objective` (optuna-dashboard shows it), once;
    `set_metric_names` is experimental in Optuna 5: its warning is not the user's.

    Args:
        study: the Optuna study.
        objective: the sweep's objective (an eval metric's name).
    """
    if study.metric_names != [objective]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([objective])


def trial_of(study: optuna.Study, storage: optuna.storages.BaseStorage, study_id: int,
             number: int) -> optuna.Trial:
    """The `optuna.Trial` of RUNNING trial `number`: samples what it lacks, returns what it has.

    Args:
        study: the `optuna.Study`.
        storage: the study's Optuna storage.
        study_id: the study's id in the storage.
        number: the trial's number.
    """
    return optuna.Trial(study, trial_id(storage, study_id, number))


def exclusive(storage: optuna.storages.BaseStorage, study_name: str,
              lock_file: str) -> ContextManager[None]:
    """Held by one process at a time among those on `storage`'s study `study_name`: the sweep
    workers' takeover lock, on the study's database (`RDBStorage.engine`) or on `lock_file`.

    Args:
        storage: the study's Optuna storage.
        study_name: the study's name.
        lock_file: the lock file for a journal file's (and SQLite's) study.
    """
    from ctl.model_dir.sweep_workers import takeover_lock

    return takeover_lock(lock_file, engine=getattr(storage, "engine", None), study_name=study_name)
