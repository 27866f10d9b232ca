"""`python -m ctl.report` on a sweep dir, in-process over a real journal study: the state and the time of a
trial in the console's words, and failed trials on the PNG (tests/test_sweep.py reads the report of a real
sweep)."""

import datetime
import json
import os

import pytest

optuna = pytest.importorskip("optuna")

from optuna.distributions import CategoricalDistribution, FloatDistribution  # noqa: E402
from optuna.trial import TrialState, create_trial  # noqa: E402

from ctl.sweep import progress, report  # noqa: E402
from ctl.sweep.storage import open_storage  # noqa: E402
from ctl.sweep.study import SWEEP_FILE  # noqa: E402

SPACE = {"units": CategoricalDistribution([32, 64, 128]), "rate": FloatDistribution(1e-4, 1e-1, log=True)}
START = datetime.datetime(2026, 1, 1, 12, 0, 0)


def trial(state, units, rate, value=None, seconds=30):
    frozen = create_trial(state=state, value=value, params={"units": units, "rate": rate}, distributions=SPACE)
    frozen.datetime_start = START
    frozen.datetime_complete = START + datetime.timedelta(seconds=seconds)
    return frozen


@pytest.fixture
def sweep_dir(tmp_path):
    """Trials 0 and 1 failed (every trial with 128 units failed), 2 completed, 3 pruned, 4 failed."""
    path = str(tmp_path)
    with open(os.path.join(path, "sweep.json"), "w") as f:
        json.dump({"study": "s", "trials": 5, "objective": "accuracy", "direction": "maximize"}, f)
    study = optuna.create_study(study_name="s", storage=open_storage(path, None), direction="maximize")
    # The space as ctl.sweep keeps it from the sweep file.
    study.set_user_attr(SWEEP_FILE, {"space": [["units", "choice", [32, 64, 128]],
                                               ["rate", "log_uniform", [1e-4, 1e-1]]]})
    for frozen in [trial(TrialState.FAIL, 128, 0.05, seconds=3), trial(TrialState.FAIL, 128, 0.01),
                   trial(TrialState.COMPLETE, 32, 0.001, value=0.9, seconds=33),
                   trial(TrialState.PRUNED, 64, 0.0003, value=0.5), trial(TrialState.FAIL, 32, 0.02)]:
        study.add_trial(frozen)
    return path


def test_the_table_says_states_and_times_as_the_console_does(sweep_dir):
    text, trials, unused_record, unused_study = report.table(sweep_dir)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:] if line[:1].isdigit()}
    assert [rows[n][1] for n in "01234"] == ["failed", "failed", "complete", "pruned", "failed"], text
    assert rows["2"][-1] == "33s" and rows["0"][-1] == "3s", text
    # The console's words and times are the same functions' (ctl.sweep.worker's `trial N: STATE in S s`).
    by_number = {t.number: t for t in trials}
    assert progress.state_word(by_number[0]) == "failed" and progress.trial_seconds(by_number[2]) == 33


def test_the_png_shows_failed_trials_on_every_panel(sweep_dir, tmp_path):
    unused_text, trials, record, study = report.table(sweep_dir)
    output = str(tmp_path / "report.png")
    panels = {p["title"]: p for p in report.plot(trials, record, output, report.space_of(study, trials))}
    assert os.path.getsize(output) > 10_000
    history = panels["optimization history"]
    assert history["points"] == {"complete": 1, "pruned": 1, "failed": 3}, history
    assert history["xlim"][0] < 0 < 4 < history["xlim"][1], history  # From trial 0, which failed.
    units = panels["units"]
    assert units["points"] == {"complete": 1, "pruned": 1, "failed": 3}, units
    assert units["xticks"] == ["32", "64", "128"]
    rate = panels["rate"]
    assert rate["xscale"] == "log" and rate["points"]["failed"] == 3, rate
