"""ctl.sweep.optuna_internals: each assumption it makes below Optuna's public API, checked on the
installed Optuna with real storages (a journal file, an SQLite file; PostgreSQL's advisory lock in
tests/test_sweep_postgres.py). A release that breaks one fails here, not in a sweep."""

import os
import re
import threading
import time

import pytest

optuna = pytest.importorskip("optuna")

from optuna.storages.journal import JournalFileBackend, JournalStorage  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from ctl.sweep import optuna_internals as internals  # noqa: E402
from tests.support.env import ROOT  # noqa: E402


def journal(tmp_path):
    return JournalStorage(JournalFileBackend(str(tmp_path / "study.journal")))


def queue(storage, name="q", trials=3):
    study = optuna.create_study(storage=storage, study_name=name)
    study_id = storage.get_study_id_from_name(name)
    for _ in range(trials):
        internals.add_waiting(storage, study_id)
    return study, study_id


def test_optuna_is_the_major_version_that_pyproject_pins():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pins = set(re.findall(r'"optuna>=(\d+),<(\d+)"', f.read()))
    major = int(optuna.__version__.split(".")[0])
    assert pins == {(str(internals.SUPPORTED_MAJOR), str(internals.SUPPORTED_MAJOR + 1))}
    assert major == internals.SUPPORTED_MAJOR, (
        f"Optuna {optuna.__version__}: check ctl/sweep/optuna_internals.py, then its pin")


def test_ask_creates_a_trial_when_none_waits_so_the_budget_needs_pop_waiting(tmp_path):
    study, _ = queue(journal(tmp_path), trials=1)
    assert hasattr(optuna.Study, "_pop_waiting_trial_id")  # What pop_waiting does, kept in step.
    study.ask()
    study.ask()  # Nothing waits: a trial beyond the queue.
    assert len(study.get_trials()) == 2


def test_pop_waiting_gives_each_trial_to_one_caller_and_skips_ended_ones(tmp_path):
    one = journal(tmp_path)
    study, study_id = queue(one, trials=3)
    other = journal(tmp_path)  # A second worker: its own storage on the same file.
    assert [t.state for t in study.get_trials()] == [TrialState.WAITING] * 3
    assert internals.pop_waiting(one, study_id, iter([0, 1, 2])) == 0
    assert internals.pop_waiting(other, study_id, iter([0])) is None  # RUNNING already.
    study.tell(0, 1.0)
    assert internals.pop_waiting(other, study_id, iter([0, 1])) == 1  # 0 ended: skipped.
    assert internals.frozen(one, study_id, 1).state == TrialState.RUNNING
    assert len(study.get_trials()) == 3  # Nothing created.


def test_trial_of_a_running_trial_samples_once_and_returns_its_values_after(tmp_path):
    storage = journal(tmp_path)
    study, study_id = queue(storage, trials=1)
    assert internals.pop_waiting(storage, study_id, iter([0])) == 0
    first = internals.trial_of(study, storage, study_id, 0).suggest_float("x", 0.0, 1.0)
    reopened = optuna.load_study(study_name="q", storage=journal(tmp_path))
    again = internals.trial_of(reopened, reopened._storage, study_id, 0)  # A resumed trial.
    assert again.suggest_float("x", 0.0, 1.0) == first
    assert internals.frozen(storage, study_id, 0).params == {"x": first}


def test_the_objective_is_named_without_a_warning(tmp_path, recwarn):
    study, _ = queue(journal(tmp_path), trials=0)
    internals.name_objective(study, "accuracy")
    assert optuna.load_study(study_name="q", storage=journal(tmp_path)).metric_names == ["accuracy"]
    assert not [w for w in recwarn if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]


def test_attrs_written_by_number_are_read_by_another_storage(tmp_path):
    storage = journal(tmp_path)
    _, study_id = queue(storage, trials=2)
    internals.set_trial_attr(storage, study_id, 1, "ctl_owner", "host:dir:0")
    internals.set_trial_attr(storage, study_id, 1, "fail_reason", "why", user=True)
    trial = internals.frozen(journal(tmp_path), study_id, 1)
    assert trial.system_attrs["ctl_owner"] == "host:dir:0"
    assert trial.user_attrs["fail_reason"] == "why"


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_exclusive_is_held_by_one_at_a_time(tmp_path, kind):
    if kind == "journal":
        storage = journal(tmp_path)
    else:
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/study.db")
        assert storage.engine.dialect.name == "sqlite"  # RDBStorage.engine: what exclusive reads.
    lock_file = str(tmp_path / "workers" / "takeover.lock")
    inside, events = threading.Event(), []

    def second():
        inside.wait()
        with internals.exclusive(storage, "q", lock_file):
            events.append("second in")

    thread = threading.Thread(target=second)
    thread.start()
    with internals.exclusive(storage, "q", lock_file):
        inside.set()
        time.sleep(0.5)  # The second waits, however long this takes.
        events.append("first out")
    thread.join(timeout=30)
    assert events == ["first out", "second in"]
