"""`python -m ctl.sweep`: sweep files checked before any trial, an exact budget with two workers,
pruning at evaluations, failed trials, HParams, SIGTERM, kill -9 and the heartbeat takeover.

One module-scoped sweep (4 trials, 2 workers, tiny digits runs) is read by several tests. Its random
sampler is seeded (each trial's suggestions are a function of its number): trials 0 and 1 train well,
trial 2 has a learning rate of 1e-6 and starts once one of them completed (median pruner, one startup
trial), so it is pruned at its first evaluation, and trial 3 binds `hidden_units = -1`, which the
task's argument checks refuse: it fails.
"""

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.support.env import ROOT, ctl_env
from tests.hold_tasks import held_step
from tests.support.sweeps import DIGITS_GIN, HOLD_GIN, TINY, write

# The tests that read the shared sweep run in one test process (its module fixture); the others
# go to whichever is free.
SHARED = pytest.mark.xdist_group("the_shared_sweep")

SWEEP = """\
objective = "accuracy"
direction = "maximize"
trials = 4
sampler = "random"
seed = 40
pruner = { name = "median", startup_trials = 1 }
[space]
"DigitsTask.learning_rate" = { choice = [0.01, 1e-6] }
"DigitsTask.hidden_units" = { choice = [32, -1] }
"""


def sweep_command(sweep_file, sweep_dir, *args):
    return [sys.executable, "-m", "ctl.sweep", f"--gin_file={DIGITS_GIN}",
            f"--sweep_file={sweep_file}", f"--sweep_dir={sweep_dir}", *args]


def run_sweep(sweep_file, sweep_dir, *args, timeout=600):
    return subprocess.run(sweep_command(sweep_file, sweep_dir, *args), cwd=ROOT, env=ctl_env(),
                          capture_output=True, text=True, timeout=timeout)


def start_sweep(sweep_file, sweep_dir, *args, log=None):
    return subprocess.Popen(sweep_command(sweep_file, sweep_dir, *args), cwd=ROOT, env=ctl_env(),
                            stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True)


def parent_of_process_running(argument):
    """The parent pid of the live process whose command line holds `argument` (None: none)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().split(b"\0")
            if entry.isdigit() and argument.encode() in command:
                with open(f"/proc/{entry}/stat") as f:
                    return int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    return None


def load_trials(sweep_dir, name):
    import optuna

    from ctl.sweep import study

    storage = study.open_storage(sweep_dir, None)
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def hold_flags(gate):
    """The flags that hold each trial after its checkpoints while the file `gate` exists
    (tests/hold_tasks.py): a test signals or kills trials held mid-training, however fast the host."""
    return [f"--gin_file={HOLD_GIN}", f"--gin_bindings=HoldAtCheckpoints.gate='{gate}'"]


def trial_log(trial_dir):
    """What the trial's run has written to its log so far ('' before it starts)."""
    from ctl.sweep.sweep_dir import LOG_FILE

    try:
        with open(os.path.join(trial_dir, LOG_FILE), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def wait_while_running(process, condition, what, timeout=600):
    """Waits until `condition()` holds; fails if `process` ends first or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the sweep ended ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"not in {timeout} s: {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The shared sweep: 4 trials, 2 workers."""
    root = tmp_path_factory.mktemp("sweep")
    sweep_file = write(root / "tiny.toml", SWEEP)
    sweep_dir = str(root / "sweep")
    started = time.time()
    done = run_sweep(sweep_file, sweep_dir, "--workers=2", *TINY)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"dir": sweep_dir, "file": sweep_file, "done": done, "seconds": time.time() - started,
            "trials": {t.number: t for t in load_trials(sweep_dir, "tiny")}}


# The sweep file: one line, exit 2, before any trial.


@pytest.mark.parametrize("text, expected", [
    ('objectiv = "accuracy"\ntrials = 2\n[space]\n"X.y" = { choice = [1] }\n',
     "unknown key 'objectiv'; did you mean 'objective'?"),
    ('objective = "accuracy"\ntrials = 2\n[space]\n"X.y" = { log_uniform = [0, 1] }\n',
     "log_uniform needs LOW > 0"),
    ('objective = "accuracy"\ntrials = 2\n[space]\n"X.y" = { log_unifrom = [1, 2] }\n',
     "unknown distribution 'log_unifrom'; did you mean 'log_uniform'?"),
    ('objective = "accuracy"\ntrials = 2\nsampler = "tpe2"\n[space]\n"X.y" = { choice = [1] }\n',
     "sampler = 'tpe2'; expected one of: tpe, random, grid."),
    ('objective = "accuracy"\ntrials = 0\n[space]\n"X.y" = { choice = [1] }\n',
     "trials = 0: the budget must be a positive integer"),
    ('objective = "accuracy"\ntrials = 2\npruner = { name = "asha", min_resorce = 5 }\n'
     '[space]\n"X.y" = { choice = [1] }\n', "unknown key 'min_resorce' in pruner 'asha'"),
    ('objective = "accuracy"\ntrials = 9\nsampler = "grid"\n[space]\n"X.y" = { choice = [1, 2] }\n',
     "trials = 9 is more than the grid's 2 points"),
    ('objective = "accuracy"\ntrials = 2\ntimeout = -5\n[space]\n"X.y" = { choice = [1] }\n',
     "timeout = -5: the wall budget is a positive number of seconds"),
    ('objective = "accuracy"\ntrials = 2\ntimeout = "1h"\n[space]\n"X.y" = { choice = [1] }\n',
     "timeout = '1h': the wall budget is a positive number of seconds"),
    ('objective = "accuracy"\ntrials = 2\nvalue = "max"\n[space]\n"X.y" = { choice = [1] }\n',
     "value = 'max'; expected one of: best, last."),
])
def test_a_bad_sweep_file_is_one_line(tmp_path, text, expected):
    """The sweep file's check, in this process: one line (`python -m ctl.sweep` prints it as its
    error and exits 2 before it makes the sweep dir: the test below)."""
    from ctl.sweep import sweep_file
    from ctl.utils.errors import UserError

    with pytest.raises(UserError) as raised:
        sweep_file.load(write(tmp_path / "bad.toml", text))
    message = str(raised.value)
    assert expected in message and "\n" not in message, message


@pytest.mark.slow
def test_a_bad_sweep_file_through_the_command_is_one_line_exit_2_and_no_sweep_dir(tmp_path):
    text = 'objectiv = "accuracy"\ntrials = 2\n[space]\n"X.y" = { choice = [1] }\n'
    done = run_sweep(write(tmp_path / "bad.toml", text), str(tmp_path / "sweep"), timeout=120)
    lines = [line for line in done.stderr.splitlines() if "cuInit" not in line]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0] == ("ctl.sweep: error: " + str(sweep_error(tmp_path / "bad.toml"))), lines[0]
    assert "unknown key 'objectiv'; did you mean 'objective'?" in lines[0]
    assert not os.path.exists(tmp_path / "sweep")


def sweep_error(path):
    """The UserError `ctl.sweep.sweep_file.load` raises for the file at `path`."""
    from ctl.sweep import sweep_file
    from ctl.utils.errors import UserError

    try:
        sweep_file.load(str(path))
    except UserError as error:
        return error
    raise AssertionError(f"{path} loaded")


# Sweep files that do not fit the config: (objective, space, the message).
NOT_FITTING = {
    "a space key the config lacks": (
        "accuracy", '"DigitsTask.learning_rat" = { log_uniform = [1e-4, 1e-1] }',
        "[space] 'DigitsTask.learning_rat': bad gin config: Configurable 'DigitsTask' doesn't have a "
        "parameter named 'learning_rat'"),
    "an objective the task does not evaluate": (
        "acuracy", '"DigitsTask.hidden_units" = { choice = [32] }',
        "objective = 'acuracy' is not an eval metric of DigitsTask; did you mean 'accuracy'?"),
}


def not_fitting(tmp_path, name):
    objective, space, _ = NOT_FITTING[name]
    return write(tmp_path / "bad.toml", f'objective = "{objective}"\ntrials = 2\n[space]\n{space}\n')


@pytest.mark.parametrize("name", sorted(NOT_FITTING))
def test_a_sweep_file_that_does_not_fit_the_config_is_one_line(tmp_path, name):
    """The check `python -m ctl.sweep` runs before any trial, in this process (the command's
    one line, exit 2 and no sweep dir: the test below)."""
    from ctl.sweep import sweep_file
    from ctl.utils.errors import UserError

    sweep = sweep_file.load(not_fitting(tmp_path, name))
    with pytest.raises(UserError) as raised:
        sweep_file.check_against_config(sweep, [DIGITS_GIN], [], [])
    message = str(raised.value)
    assert NOT_FITTING[name][2] in message and "\n" not in message, message


@pytest.mark.slow
def test_a_sweep_file_that_does_not_fit_the_config_ends_before_any_trial(tmp_path):
    """Through the command (TensorFlow imported for the check): one line, exit 2, no sweep dir.
    Each kind of mistake: the test above."""
    name = "a space key the config lacks"
    done = run_sweep(not_fitting(tmp_path, name), str(tmp_path / "sweep"), timeout=300)
    lines = done.stderr.splitlines()  # No cuInit line of TensorFlow's on a host with no GPU.
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("ctl.sweep: error: ") and NOT_FITTING[name][2] in lines[0], lines
    assert not os.path.exists(tmp_path / "sweep")


CHANGED = 'objective = "{objective}"\ntrials = {trials}\nsampler = "random"\nseed = 0\npruner = "none"\n{more}' \
    '[space]\n"DigitsTask.learning_rate" = {{ log_uniform = [{low}, 1e-2] }}\n{binding}'


@pytest.mark.slow
@pytest.mark.timeout(1800)  # Two sweeps of tiny trials, and five commands that end at once.
def test_a_sweep_file_that_does_not_match_its_study_is_one_line_and_more_trials_extend_it(tmp_path):
    """A study made by a 1-trial file; then files that change its space, objective, direction or
    value: each one line, exit 2, no trial added or started (two workers: still one line); then
    trials = 2 (with a timeout): the second trial runs."""
    sweep_dir = str(tmp_path / "sweep")
    path = str(tmp_path / "s.toml")
    short = [*TINY, "--gin_bindings=TRAIN_STEPS=40"]

    def sweep(trials=1, more=""):
        write(path, CHANGED.format(objective="accuracy", trials=trials, more=more, low="1e-3",
                                   binding=""))
        return run_sweep(path, sweep_dir, *short, timeout=1200)

    done = sweep()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for change, expected in [
        (dict(low="1e-4"), "[space] 'DigitsTask.learning_rate' = { log_uniform = [0.0001, 0.01] }, "
         "but the study was created with { log_uniform = [0.001, 0.01] }"),
        (dict(binding='"DigitsTask.hidden_units" = { choice = [16, 32] }\n'),
         "[space] 'DigitsTask.hidden_units' is new (the study was created without it)"),
        (dict(objective="loss"),
         'objective = "loss", but the study was created with objective = "accuracy"'),
        (dict(more='direction = "minimize"\n'), 'direction = "minimize", but the study '),
        (dict(more='value = "last"\n'), 'value = "last", but the study was created with value = "best"'),
    ]:
        write(path, CHANGED.format(**{"objective": "accuracy", "trials": 3, "more": "", "low": "1e-3",
                                      "binding": "", **change}))
        done = run_sweep(path, sweep_dir, *short, "--workers=2", timeout=1200)
        lines = done.stderr.splitlines()  # No cuInit line of TensorFlow's on a host with no GPU.
        assert done.returncode == 2 and len(lines) == 1, done.stdout[-3000:] + done.stderr[-3000:]
        assert lines[0].startswith(f"ctl.sweep: error: --sweep_file={path}: ") and expected in lines[0], lines
        assert "trial" not in done.stdout, done.stdout
        assert [t.state.name for t in load_trials(sweep_dir, "s")] == ["COMPLETE"]
    assert lines[0].endswith("put the file back, or name a new study (study = \"...\") or a new "
                             "--sweep_dir.")
    done = sweep(2, "timeout = 900\n")  # What may change: the budget and the timeout.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [t.state.name for t in load_trials(sweep_dir, "s")] == ["COMPLETE", "COMPLETE"]
    assert "2/2 ended (2 complete, 0 pruned, 0 failed)" in done.stdout
    panels = report_panels(sweep_dir, tmp_path)
    assert panels["DigitsTask.learning_rate"]["xscale"] == "log"  # The file's log_uniform.


@pytest.mark.slow
def test_without_optuna_one_line_names_the_extra(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    write(blocker / "optuna.py", "raise ImportError('No module named optuna')\n")
    done = subprocess.run([sys.executable, "-m", "ctl.sweep", "--sweep_file=x.toml", "--sweep_dir=d"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=ctl_env({"PYTHONPATH": os.pathsep.join([str(blocker), ROOT])}))
    assert done.returncode == 2
    assert done.stderr.strip() == ("ctl.sweep: error: ctl.sweep runs on Optuna, which is not "
                                   "installed: pip install -e '.[sweep]' in ctl's checkout.")


# The shared sweep.


@pytest.mark.slow
@SHARED
def test_the_budget_is_exact_with_two_workers(sweep):
    trials = sweep["trials"]
    assert sorted(trials) == [0, 1, 2, 3]
    assert all(t.state.name in ("COMPLETE", "PRUNED", "FAIL") for t in trials.values())
    assert sorted(os.listdir(os.path.join(sweep["dir"], "trials"))) == ["0", "1", "2", "3"]
    out = sweep["done"].stdout
    assert "4/4 ended (2 complete, 1 pruned, 1 failed), 0 running" in out
    assert "worker 0" in out and "worker 1" in out
    assert "best accuracy = " in out
    # The end, once for the command (not once per worker).
    assert out.count("sweep | done: 4/4 ended") == 1 and out.count("sweep | to look: ") == 1, out
    assert sweep["done"].stderr == "", sweep["done"].stderr  # No cuInit line on a host with no GPU.


@pytest.mark.slow
@SHARED
def test_a_trial_is_a_ctl_run_with_its_bindings_and_its_objective(sweep):
    from ctl.hooks.best import best_record
    from ctl.model_dir import ModelDir, read_json_lines

    for number in (0, 1):
        trial = sweep["trials"][number]
        assert trial.state.name == "COMPLETE"
        model_dir = ModelDir(os.path.join(sweep["dir"], "trials", str(number)))
        with open(model_dir.config_file) as f:
            config = f.read()
        assert "DigitsTask.learning_rate = 0.01" in config and "DigitsTask.hidden_units = 32" in config
        evals = [r for r in read_json_lines(model_dir.metrics_file) if r["kind"] == "eval"]
        assert evals[-1]["step"] == 400
        assert trial.intermediate_values == {r["step"]: r["accuracy"] for r in evals}
        assert model_dir.final_checkpoint_number() == 400
        # value = "best" (the default): its best evaluation, whose checkpoint the run kept.
        best = max(evals, key=lambda r: r["accuracy"])
        assert trial.value == best["accuracy"]
        record = best_record(model_dir)
        assert (record["metric"], record["value"], record["step"]) == (
            "accuracy", best["accuracy"], best["step"])
        assert os.path.isfile(record["path"] + ".index")


@pytest.mark.slow
@SHARED
def test_a_pruned_trial_stops_at_a_checkpoint_and_says_why(sweep):
    """The trial's own run asks the pruner at its evaluation of step 20 and stops right there: its
    last train loop ends at 20, its final checkpoint is 20, it exits 0 and says why."""
    from ctl.model_dir import ModelDir
    from ctl.sweep import pruning

    trial = sweep["trials"][2]
    assert trial.state.name == "PRUNED" and trial.params["DigitsTask.learning_rate"] == 1e-6
    model_dir = os.path.join(sweep["dir"], "trials", "2")
    record = pruning.read_pruned(ModelDir(model_dir))
    assert record["pruner"] == "median" and record["step"] == 20 and record["objective"] == "accuracy"
    assert "not good enough for the median pruner" in record["why"]
    assert trial.intermediate_values == {20: record["value"]}
    directory = ModelDir(model_dir)
    assert [r["step"] for r in directory.metrics("train")][-1] == 20  # Not a step past the prune...
    assert directory.final_checkpoint_number() == 20  # ...and a checkpoint of it: a clean stop.
    with open(os.path.join(model_dir, "sweep_trial.log")) as f:
        log = f.read()
    assert "stop requested: pruned by the median pruner: accuracy = " in log
    assert "ctl.run: preempted" not in log and "trial 2: pruned = " in sweep["done"].stdout


@pytest.mark.slow
@SHARED
def test_a_pruned_trial_run_again_stops_at_once(sweep):
    """As after a worker killed between its trial's prune and the study's update: the trial's
    command again (what the next worker runs) trains no step, stops at its pruned checkpoint and
    exits 0, and the worker would read the same pruning record."""
    from ctl.model_dir import ModelDir
    from ctl.sweep import runner, sweep_file

    spec, trial = sweep_file.load(sweep["file"]), sweep["trials"][2]
    model_dir = os.path.join(sweep["dir"], "trials", "2")
    bindings = [flag.split("=", 1)[1] for flag in TINY] + spec.bindings(trial.params)
    done = subprocess.run(runner.command(ModelDir(model_dir), [DIGITS_GIN], bindings, [],
                                         runner.trial_flags(spec, sweep["dir"], None, 2)),
                          cwd=ROOT, env=ctl_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "stop requested: the trial was pruned at step 20" in done.stdout
    directory = ModelDir(model_dir)
    assert [r["step"] for r in directory.metrics("train")][-1] == 20
    assert max(directory.checkpoints()) == 20


@pytest.mark.slow
@SHARED
def test_a_failed_trial_is_recorded_with_its_one_line_and_the_sweep_goes_on(sweep):
    trial = sweep["trials"][3]
    assert trial.state.name == "FAIL" and trial.params["DigitsTask.hidden_units"] == -1
    reason = trial.user_attrs["fail_reason"]
    # A value the task refuses: ctl.run's one line for it (its argument checks), exit 2.
    assert reason.startswith("exit status 2: ctl.run: error: DigitsTask.hidden_units=-1") and "\n" not in reason
    assert "trial 3: failed in" in sweep["done"].stdout


def hparams_of_runs(logdir):
    """{run: {hparam: value}} of the HParams summaries under `logdir`, read by TensorBoard's own
    reader (a number as a float, a string as a string)."""
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    runs = plugin_event_multiplexer.EventMultiplexer()
    runs.AddRunsFromDirectory(logdir)
    runs.Reload()
    found = {}
    for run, tags in runs.PluginRunToTagToContent("hparams").items():
        for content in tags.values():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("session_start_info"):
                found[run] = {name: getattr(value, value.WhichOneof("kind"))
                              for name, value in data.session_start_info.hparams.items()}
    return found


@pytest.mark.slow
@SHARED
def test_the_sweep_dir_is_one_tensorboard_logdir_with_every_trial_its_state_and_step_in_hparams(sweep):
    """Trials 0 and 1 completed, trial 2 was pruned, trial 3 failed: each is a run of the HParams
    dashboard, with its sampled values, its state and its last step; integers as integers (their
    text: TensorBoard has no integer type), a macro's binding as the macro's value."""
    trials = sweep["trials"]
    found = hparams_of_runs(sweep["dir"])
    assert set(found) == {os.path.join("trials", str(n)) for n in range(4)}, sorted(found)
    for number, state, step in [(0, "complete", "400"), (1, "complete", "400"), (2, "pruned", "20"),
                                (3, "failed", "0")]:
        values = found[os.path.join("trials", str(number))]
        assert (values["state"], values["step"]) == (state, step), values
        assert values["DigitsTask.learning_rate"] == pytest.approx(
            trials[number].params["DigitsTask.learning_rate"])
        assert values["DigitsTask.hidden_units"] == str(trials[number].params["DigitsTask.hidden_units"])
    complete = found[os.path.join("trials", "0")]
    assert complete["Schedule.train_steps"] == "400" and complete["TRAIN_STEPS"] == "400", complete
    assert complete["DigitsTask.batch_size"] == "64", complete


def report_panels(sweep_dir, tmp_path):
    """What each panel of `ctl.report`'s figure of `sweep_dir` shows, by title."""
    from ctl.sweep import report

    unused_text, trials, record, study = report.table(sweep_dir)
    shown = report.plot(trials, record, str(tmp_path / "report.png"), report.space_of(study, trials))
    assert os.path.getsize(tmp_path / "report.png") > 10_000
    return {panel["title"]: panel for panel in shown}


def integers(labels):
    return [int(label.replace("\u2212", "-")) for label in labels if label]


@pytest.mark.slow
@SHARED
def test_the_reports_panels_show_pruned_trials_choices_and_log_ranges(sweep, tmp_path):
    """The shared sweep (2 completed, 1 pruned, 1 failed; choices only): the pruned and the failed
    trial are drawn apart, on every panel; a choice's values are categories in the file's order; the
    trial axis has integer ticks. (A log-uniform range on a log axis: the sweep of the test below.)"""
    panels = report_panels(sweep["dir"], tmp_path)
    history = panels["optimization history"]
    assert history["points"] == {"complete": 2, "pruned": 1, "failed": 1}, history
    assert integers(history["xticks"]) == sorted(set(integers(history["xticks"])))  # Whole numbers.
    rate = panels["DigitsTask.learning_rate"]
    assert rate["xticks"] == ["0.01", "1e-06"], rate
    assert rate["points"] == {"complete": 2, "pruned": 1, "failed": 1}, rate
    assert panels["DigitsTask.hidden_units"]["xticks"] == ["32", "-1"]


@pytest.mark.slow
def test_a_sweep_in_which_every_trial_failed_exits_1_with_the_first_ones_line(tmp_path):
    sweep_file = write(tmp_path / "bad.toml", 'objective = "accuracy"\ntrials = 2\nsampler = "random"\n'
                       'pruner = "none"\n[space]\n"DigitsTask.hidden_units" = { choice = [-1, -2] }\n')
    done = run_sweep(sweep_file, str(tmp_path / "sweep"), "--workers=2", *TINY, timeout=1200)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ctl.sweep: error: every trial that ended failed (2); trial 0: exit status "
                               "2: ctl.run: error: DigitsTask.hidden_units=-"), lines
    assert lines[0].endswith("fix what it says, then run the sweep with a new --sweep_dir (or study name).")
    assert "2/2 ended (0 complete, 0 pruned, 2 failed)" in done.stdout
    assert "to look" not in done.stdout


# Faults.


@pytest.mark.slow
@pytest.mark.timeout(1800)  # Three sweep commands, one after another, on a loaded host.
def test_sigterm_then_kill_9_then_a_dead_worker_taken_over_one_trial_resumed(tmp_path):
    """SIGTERM: the trial checkpoints, the worker exits 75. The same command: the trial resumes (its
    slot's orphan). kill -9 of that worker mid-trial, then a worker in another slot (the first slot
    held, as by a worker that never returns): it takes the trial over after the grace period. One
    trial, same number, same values, resumed from its checkpoints each time, never restarted."""
    from ctl.model_dir import ModelDir, read_json_lines

    sweep_file = write(tmp_path / "one.toml", 'objective = "accuracy"\ntrials = 1\nsampler = "random"\n'
                       'seed = 0\npruner = "none"\n[space]\n'
                       '"DigitsTask.learning_rate" = { log_uniform = [1e-3, 1e-2] }\n')
    sweep_dir = str(tmp_path / "sweep")
    gate = str(tmp_path / "gate")  # While it exists, the trial holds after each checkpoint.
    long_run = ["--gin_bindings=TRAIN_STEPS=1000", "--gin_bindings=ctl.Schedule.steps_per_loop=100",
                "--gin_bindings=ctl.Schedule.checkpoint_interval=200",
                "--gin_bindings=ctl.Schedule.eval_interval=1000",
                "--heartbeat_seconds=1", "--grace_seconds=6", *hold_flags(gate)]
    model_dir = ModelDir(os.path.join(sweep_dir, "trials", "0"))

    def held_after(step, proc):
        """Waits until the trial is held at a checkpoint after `step`; returns that step."""
        wait_while_running(proc, lambda: (held_step(gate, model_dir.path) or 0) > step,
                           f"the trial held at a checkpoint after step {step}")
        return held_step(gate, model_dir.path)

    write(gate, "")
    with tempfile.TemporaryFile("w+") as log:
        first = start_sweep(sweep_file, sweep_dir, *long_run, log=log)
        try:
            step = held_after(0, first)
            params = load_trials(sweep_dir, "one")[0].params
            first.send_signal(signal.SIGTERM)
            wait_while_running(first, lambda: "received SIGTERM" in trial_log(model_dir.path),
                               "the trial told of the signal")
            os.remove(gate)
            assert first.wait(timeout=120) == 75
        finally:
            first.kill()
        log.seek(0)
        assert "stopped at a checkpoint; the same command resumes it" in log.read()
    assert [t.state.name for t in load_trials(sweep_dir, "one")] == ["RUNNING"]

    write(gate, "")
    with tempfile.TemporaryFile("w+") as log:
        second = start_sweep(sweep_file, sweep_dir, *long_run, log=log)
        try:
            step = held_after(max(model_dir.checkpoints()), second)
            from ctl.model_dir.trainer_lock import TRAINER_LOCK_FILE

            with open(model_dir.file(TRAINER_LOCK_FILE)) as f:
                trial_pid = json.load(f)["pid"]  # The trial's ctl.run: forked by the worker's launcher.
            assert trial_pid != second.pid
            second.kill()  # kill -9: its trial's ctl.run dies with it (PR_SET_PDEATHSIG).
            second.wait(timeout=60)
            deadline = time.monotonic() + 5
            while os.path.exists(f"/proc/{trial_pid}") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not os.path.exists(f"/proc/{trial_pid}"), "the trial outlived its killed worker"
            assert not os.path.exists(model_dir.finished_file), "the trial outlived its killed worker"
        finally:
            second.kill()
        log.seek(0)
        assert "trial 0: resuming it" in log.read()
    os.remove(gate)

    with open(os.path.join(sweep_dir, "workers", "0.lock"), "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # Slot 0's worker "never returns".
        third = run_sweep(sweep_file, sweep_dir, *long_run)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "worker 1 | trial 0: taking it over (its heartbeat is" in third.stdout
    trials = load_trials(sweep_dir, "one")
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE")]
    assert trials[0].params == params
    steps = [r["step"] for r in read_json_lines(model_dir.metrics_file) if r["kind"] == "train"]
    assert steps.count(100) == 1, steps  # Each run resumed from a checkpoint, none from step 0.
    assert steps[-1] == 1000 and step < 1000
    assert model_dir.final_checkpoint_number() == 1000
    # Its time on the console is the report's: from its start (by the first command) to its end.
    from ctl.sweep import progress

    said = re.search(r"trial 0: complete = \S+ in (\d+) s", third.stdout)
    assert said and int(said.group(1)) == round(progress.trial_seconds(trials[0])), third.stdout[-3000:]


@pytest.mark.slow
def test_no_trial_starts_after_the_timeout_and_the_sweep_ends(tmp_path):
    """timeout = 3: the first trial starts at once and runs past it (its launcher alone imports
    TensorFlow for longer); no other trial of the budget starts; the worker ends with status 0."""
    sweep_file = write(tmp_path / "timed.toml", 'objective = "accuracy"\ntrials = 5\ntimeout = 3\n'
                       'sampler = "random"\nseed = 0\npruner = "none"\n[space]\n'
                       '"DigitsTask.learning_rate" = { log_uniform = [1e-3, 1e-2] }\n')
    sweep_dir = str(tmp_path / "sweep")
    done = run_sweep(sweep_file, sweep_dir, *TINY)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "timeout: the sweep is 3 s old; 4 trial(s) of the budget not started" in done.stdout
    trials = load_trials(sweep_dir, "timed")
    assert [t.state.name for t in trials] == ["COMPLETE"] + ["WAITING"] * 4
    assert sorted(os.listdir(os.path.join(sweep_dir, "trials"))) == ["0"]


@pytest.mark.slow
def test_forked_trials_end_as_the_same_trials_in_processes_of_their_own(tmp_path):
    """Two trials forked by one worker's launcher (TensorFlow imported once, each child parsing its
    own flags and gin) end with the same evaluations as the same trials each in a new process, and
    each writes its own log: its own run's evaluation lines and end, in its trial dir."""
    from ctl.model_dir import ModelDir
    from ctl.sweep.sweep_dir import LOG_FILE

    sweep_file = write(tmp_path / "two.toml", 'objective = "accuracy"\ntrials = 2\nsampler = "random"\n'
                       'seed = 3\npruner = "none"\n[space]\n'
                       '"DigitsTask.learning_rate" = { log_uniform = [1e-3, 1e-2] }\n'
                       '"DigitsTask.hidden_units" = { choice = [16, 48] }\n')
    evaluations = {}
    for fork in ("true", "false"):
        sweep_dir = str(tmp_path / fork)
        done = run_sweep(sweep_file, sweep_dir, f"--fork_trials={fork}", *TINY)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        trials = load_trials(sweep_dir, "two")
        assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
        evaluations[fork] = [(t.params, [(r["step"], r["loss"]) for r in ModelDir(
            os.path.join(sweep_dir, "trials", str(t.number))).metrics("eval")]) for t in trials]
        for trial, (_, evaluated) in zip(trials, evaluations[fork]):
            trial_dir = os.path.join(sweep_dir, "trials", str(trial.number))
            with open(os.path.join(trial_dir, LOG_FILE)) as f:
                log = f.read()
            steps = [int(s) for s in re.findall(r" eval \| step: +(\d+) \| loss", log)]
            assert steps == [step for step, _ in evaluated], (fork, trial.number, log[-2000:])
            assert f"done | in {trial_dir}:" in log, (fork, trial.number, log[-2000:])
    assert evaluations["true"][0][0] != evaluations["true"][1][0]
    assert evaluations["true"] == evaluations["false"]


# Model dirs on a bucket.


@pytest.mark.slow
def test_trials_on_a_bucket_with_the_study_and_the_logs_in_the_sweep_dir(tmp_path, gcs_dir):
    """--trials_dir=gs://...: each trial is a run in <trials_dir>/<number> on the GCS emulator, its
    evaluations reported, its objective and its pruning record read from there; the study and
    the logs stay in the local sweep dir; ctl.report's table reads the trials' steps from the
    bucket and TensorBoard finds both trials' HParams there. One worker: trial 0 (learning rate
    0.01) completes, then trial 1 (1e-6) is pruned at its first evaluation."""
    from tensorboard.backend.event_processing import plugin_event_multiplexer

    from ctl.model_dir import ModelDir
    from ctl.sweep import pruning, report

    sweep_file = write(tmp_path / "bucket.toml", 'objective = "accuracy"\ntrials = 2\nsampler = "random"\n'
                       'seed = 11\nvalue = "last"\n'
                       'pruner = { name = "median", startup_trials = 1 }\n[space]\n'
                       '"DigitsTask.learning_rate" = { choice = [0.01, 1e-6] }\n')
    sweep_dir = str(tmp_path / "sweep")
    done = run_sweep(sweep_file, sweep_dir, f"--trials_dir={gcs_dir}", *TINY,
                     "--gin_bindings=TRAIN_STEPS=40")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = {t.number: t for t in load_trials(sweep_dir, "bucket")}
    assert [(t.state.name, t.params["DigitsTask.learning_rate"]) for t in trials.values()] == [
        ("COMPLETE", 0.01), ("PRUNED", 1e-6)]
    for trial in trials.values():
        directory = ModelDir(f"{gcs_dir}/{trial.number}")
        assert trial.system_attrs["ctl_model_dir"] == directory.path
        evals = directory.metrics("eval")
        assert trial.intermediate_values == {r["step"]: r["accuracy"] for r in evals}
        assert os.listdir(os.path.join(sweep_dir, "trials", str(trial.number))) == ["sweep_trial.log"]
    complete, pruned = (ModelDir(f"{gcs_dir}/{n}") for n in (0, 1))
    assert trials[0].value == complete.metrics("eval")[-1]["accuracy"]  # value = "last"
    assert complete.final_checkpoint_number() == 40 and pruned.final_checkpoint_number() == 20
    assert pruning.read_pruned(pruned)["step"] == 20
    text, png = report.report(sweep_dir)
    lines = text.splitlines()
    assert lines[0].endswith(f"; model dirs in {gcs_dir}")
    assert [line.split()[-2] for line in lines[3:5]] == ["40", "20"], text  # Steps, read from gs://.
    assert os.path.isfile(png)
    logdir = plugin_event_multiplexer.EventMultiplexer()
    logdir.AddRunsFromDirectory(gcs_dir)
    logdir.Reload()
    assert set(logdir.PluginRunToTagToContent("hparams")) == {"0", "1"}


@pytest.mark.parametrize("trials_dir, expected", [
    ("foo://bucket/x", "File system scheme 'foo' not implemented"),
    ("gs:///x", "doesn't contain a bucket name"),
    ("gs://no-such-bucket/x", "the bucket gs://no-such-bucket does not exist or cannot be read"),
    ("FILE", "is a file"),
])
def test_a_bad_trials_dir_is_one_line(tmp_path, gcs, trials_dir, expected):
    from ctl.utils.errors import UserError
    from ctl.sweep import sweep_dir

    if trials_dir == "FILE":
        trials_dir = write(tmp_path / "file", "")
    with pytest.raises(UserError) as raised:
        sweep_dir.check_trials_dir(trials_dir)
    message = str(raised.value)
    assert message.startswith(f"--trials_dir={trials_dir}") and expected in message, message
    assert message.endswith("name a gs://BUCKET/PATH prefix in an existing bucket, or a local directory.")
    assert "\n" not in message


@pytest.mark.slow
def test_a_sweep_with_a_bad_trials_dir_ends_before_any_trial(tmp_path, gcs):
    sweep_file = write(tmp_path / "s.toml", 'objective = "accuracy"\ntrials = 2\n[space]\n'
                       '"DigitsTask.hidden_units" = { choice = [16, 32] }\n')
    done = run_sweep(sweep_file, str(tmp_path / "sweep"), "--trials_dir=gs://no-such-bucket/x",
                     timeout=300)
    lines = done.stderr.splitlines()  # No cuInit line of TensorFlow's on a host with no GPU.
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("ctl.sweep: error: --trials_dir=gs://no-such-bucket/x: the bucket")
    assert not os.path.exists(tmp_path / "sweep")


@pytest.mark.parametrize("value, direction, expected", [
    ("best", "maximize", 0.9), ("best", "minimize", 0.5), ("last", "maximize", 0.8),
    ("last", "minimize", 0.8)])
def test_a_trials_value_is_its_best_or_its_last_evaluation(tmp_path, value, direction, expected):
    from ctl.sweep import runner, sweep_file

    sweep = sweep_file.load(write(tmp_path / "s.toml", f'objective = "accuracy"\ntrials = 2\n'
                                  f'value = "{value}"\ndirection = "{direction}"\n[space]\n'
                                  '"X.y" = { choice = [1] }\n'))
    assert runner.trial_value([0.5, float("nan"), 0.9, 0.8], sweep) == expected


def test_the_shipped_sweep_file_fits_its_config():
    from ctl.sweep import sweep_file

    sweep = sweep_file.load(os.path.join(ROOT, "configs", "digits_sweep.toml"))
    assert sweep.trials == 12 and sweep.pruner["name"] == "asha"
    sweep_file.check_against_config(sweep, [DIGITS_GIN], [], [])


@pytest.mark.slow
@pytest.mark.timeout(1200)  # Two sweeps of two trials each, on a loaded host.
# Each signal once, each way of running trials once (a worker's own process or forked): one
# worker, a third run of 40 s, adds no case that two do not hold.
@pytest.mark.parametrize("signum, workers, fork", [
    (signal.SIGINT, 2, "true"), (signal.SIGTERM, 2, "false")],
    ids=["ctrl_c-2_workers-forked", "sigterm-2_workers-processes"])
def test_a_signal_to_the_sweeps_process_group_leaves_every_running_trial_resumable(
        tmp_path, signum, workers, fork):
    """As a terminal's Ctrl-C does (SIGINT to the foreground process group) or a SIGTERM to the
    group, while every trial trains: the sweep exits 75 with its one line, every trial stays
    RUNNING with a checkpoint, and the same command resumes each (none restarted, none failed)."""
    from ctl.model_dir import ModelDir, read_json_lines

    sweep_file = write(tmp_path / "group.toml", f'objective = "accuracy"\ntrials = {workers}\n'
                       'sampler = "random"\nseed = 0\npruner = "none"\n[space]\n'
                       '"DigitsTask.learning_rate" = { log_uniform = [1e-3, 1e-2] }\n')
    sweep_dir = str(tmp_path / "sweep")
    gate = write(tmp_path / "gate", "")  # Each trial holds at its first checkpoint until it goes.
    args = [f"--workers={workers}", f"--fork_trials={fork}", "--gin_bindings=TRAIN_STEPS=300",
            "--gin_bindings=ctl.Schedule.steps_per_loop=50",
            "--gin_bindings=ctl.Schedule.checkpoint_interval=100",
            "--gin_bindings=ctl.Schedule.eval_interval=300", *hold_flags(gate)]
    dirs = [ModelDir(os.path.join(sweep_dir, "trials", str(n))) for n in range(workers)]
    with tempfile.TemporaryFile("w+") as log:
        sweep = subprocess.Popen(sweep_command(sweep_file, sweep_dir, *args), cwd=ROOT,
                                 env=ctl_env(), stdout=log, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)  # A terminal's foreground group.
        try:
            wait_while_running(sweep, lambda: all(held_step(gate, d.path) for d in dirs),
                               "every trial held at a checkpoint")
            os.killpg(sweep.pid, signum)
            wait_while_running(sweep, lambda: all(
                "received SIG" in trial_log(d.path) for d in dirs), "every trial told of the signal")
            os.remove(gate)
            assert sweep.wait(timeout=180) == 75
        finally:
            if sweep.poll() is None:
                os.killpg(sweep.pid, signal.SIGKILL)
        log.seek(0)
        output = log.read()
    assert output.rstrip().endswith("run the same command again to resume them."), output[-3000:]
    assert output.count("stopped at a checkpoint; the same command resumes it") == workers, output
    assert [t.state.name for t in load_trials(sweep_dir, "group")] == ["RUNNING"] * workers

    again = run_sweep(sweep_file, sweep_dir, *args)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("resuming it") == workers, again.stdout
    assert [t.state.name for t in load_trials(sweep_dir, "group")] == ["COMPLETE"] * workers
    for directory in dirs:
        steps = [r["step"] for r in read_json_lines(directory.metrics_file) if r["kind"] == "train"]
        assert steps.count(50) == 1 and steps[-1] == 300, steps  # Resumed, not restarted.


@pytest.mark.slow
@pytest.mark.timeout(1800)  # Six TensorFlow processes at once, then five trials.
def test_stale_trials_of_a_dead_machine_are_taken_over_first_each_by_one_worker(tmp_path):
    """Three workers killed with -9 while their trials train (a dead machine: three trials go stale
    at once); then two workers in other slots (the dead ones' slots held, as by workers that never
    return) on a budget of five: the three stale trials are taken over once their grace passed,
    before trial 3 or 4 starts, each by one worker, the message saying the heartbeat's age; each
    resumes from its checkpoint and every trial completes, none failed."""
    from ctl.model_dir import ModelDir, read_json_lines

    sweep_file = write(tmp_path / "stale.toml", 'objective = "accuracy"\ntrials = 5\n'
                       'sampler = "random"\nseed = 0\npruner = "none"\n[space]\n'
                       '"DigitsTask.learning_rate" = { log_uniform = [1e-3, 1e-2] }\n')
    sweep_dir = str(tmp_path / "sweep")
    gate = write(tmp_path / "gate", "")  # Each trial holds at its first checkpoint until it goes.
    args = ["--heartbeat_seconds=1", "--grace_seconds=5", "--gin_bindings=TRAIN_STEPS=400",
            "--gin_bindings=ctl.Schedule.steps_per_loop=20",
            "--gin_bindings=ctl.Schedule.checkpoint_interval=40",
            "--gin_bindings=ctl.Schedule.eval_interval=400", *hold_flags(gate)]
    dirs = [ModelDir(os.path.join(sweep_dir, "trials", str(n))) for n in range(5)]
    dead = [start_sweep(sweep_file, sweep_dir, "--fork_trials=false", *args)  # Slots 0, 1, 2.
            for _ in range(3)]
    try:
        deadline, killed = time.monotonic() + 900, set()
        while len(killed) < 3:  # Each worker dies while its trial is held: none completes.
            for directory in dirs[:3]:
                if held_step(gate, directory.path):
                    worker = parent_of_process_running(f"--model_dir={directory.path}")
                    if worker is not None and worker not in killed:
                        os.kill(worker, signal.SIGKILL)  # kill -9: its trial dies with it.
                        killed.add(worker)
            assert all(p.poll() is None for p in dead if p.pid not in killed), \
                "a worker ended before its checkpoint"
            assert time.monotonic() < deadline, "the three trials did not train in time"
            time.sleep(0.1)
    finally:
        for process in dead:
            process.kill()  # kill -9: their trials die with them (PR_SET_PDEATHSIG).
            process.wait(timeout=60)
    os.remove(gate)
    assert [t.state.name for t in load_trials(sweep_dir, "stale")] == ["RUNNING"] * 3 + ["WAITING"] * 2
    from ctl.model_dir.sweep_workers import heartbeat_age

    deadline = time.monotonic() + 60  # The grace passed: then no worker may start a new trial first.
    while not all(heartbeat_age(t) >= 5 for t in load_trials(sweep_dir, "stale")[:3]):
        assert time.monotonic() < deadline
        time.sleep(0.2)

    held = [open(os.path.join(sweep_dir, "workers", f"{i}.lock"), "a+") for i in range(3)]
    try:
        for f in held:
            fcntl.flock(f, fcntl.LOCK_EX)  # The dead machine's workers "never return".
        done = run_sweep(sweep_file, sweep_dir, "--workers=2", *args)
    finally:
        for f in held:
            f.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    taken = [i for i, line in enumerate(lines) if "taking it over (its heartbeat is" in line]
    numbers = sorted(int(lines[i].split("trial ")[1].split(":")[0]) for i in taken)
    assert numbers == [0, 1, 2], done.stdout  # Each once.
    new = [i for i, line in enumerate(lines) if re.search(r"trial [34]: starting", line)]
    assert len(new) == 2 and max(taken) < min(new), done.stdout  # Before any new trial.
    assert all(int(re.search(r"heartbeat is (\d+) s old", lines[i]).group(1)) >= 5 for i in taken)
    assert [t.state.name for t in load_trials(sweep_dir, "stale")] == ["COMPLETE"] * 5
    for directory in dirs[:3]:
        steps = [r["step"] for r in read_json_lines(directory.metrics_file) if r["kind"] == "train"]
        assert steps.count(20) == 1 and steps[-1] == 400, steps  # Resumed, not restarted.


def test_lines_the_workers_say_at_once_come_out_whole(tmp_path):
    """The workers are threads of one process: each line comes out whole, never split around
    another worker's line (the console, and the tests here, read the output line by line)."""
    import contextlib
    import io
    import threading
    import types

    from ctl.sweep.worker import Worker

    workers = [Worker.__new__(Worker) for _ in range(4)]  # Only their slots: say() reads no more.
    for index, worker in enumerate(workers):
        worker.slot = types.SimpleNamespace(index=index)

    def say(worker):
        for n in range(2000):
            worker.say(f"trial {n}: " + "x" * 60)

    # Unbuffered (as under PYTHONUNBUFFERED): each write is a call of its own, so the race shows.
    out = io.TextIOWrapper(io.FileIO(tmp_path / "console", "w"), write_through=True)
    with out, contextlib.redirect_stdout(out):
        threads = [threading.Thread(target=say, args=(worker,)) for worker in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    lines = (tmp_path / "console").read_text().splitlines()
    whole = re.compile(r"sweep \| worker [0-3] \| trial \d+: x{60}")
    assert len(lines) == 8000 and all(whole.fullmatch(line) for line in lines), \
        [line for line in lines if not whole.fullmatch(line)][:5]


# The study, the pruner, a worker and the sweep's end, in this process on a journal file (the
# commands above run them in processes of their own).

IN_PROCESS_SWEEP = """\
objective = "accuracy"
trials = 3
sampler = "random"
seed = 1
pruner = { name = "median", startup_trials = 0 }
[space]
"X.y" = { choice = [1, 2] }
"""


def open_study(tmp_path):
    """The study of IN_PROCESS_SWEEP in `<tmp_path>/sweep` (created, or opened again)."""
    from ctl.sweep import pruning, study, sweep_file
    from ctl.sweep.storage import open_storage

    sweep = sweep_file.load(write(tmp_path / "s.toml", IN_PROCESS_SWEEP))
    sweep_dir = str(tmp_path / "sweep")
    return study.Study(open_storage(sweep_dir, None), sweep, pruning.make_pruner(sweep.pruner),
                       wait_s=0, sweep_dir=sweep_dir), sweep, sweep_dir


def test_the_budget_is_a_queue_handed_out_once_and_the_pruner_is_the_sweep_files(tmp_path):
    opened, unused_sweep, unused_dir = open_study(tmp_path)
    assert [opened.claim_next() for _ in range(4)] == [0, 1, 2, None]
    again, unused_sweep, unused_dir = open_study(tmp_path)  # Opened again: no trial added.
    assert [t.number for t in again.all_trials()] == [0, 1, 2]
    assert again.counts() == {"complete": 0, "pruned": 0, "fail": 0, "running": 3, "waiting": 0}
    # The median pruner with startup_trials = 0: once trial 0 completed, trial 1, worse at the
    # same step, is pruned.
    first = opened.optuna_trial(0)
    first.report(0.9, 20)
    opened.optuna.tell(0, 0.9)
    second = opened.optuna_trial(1)
    second.report(0.1, 20)
    assert second.should_prune()


def test_the_pruned_record_is_read_back_and_absent_from_a_trial_not_pruned(tmp_path):
    from ctl.model_dir import ModelDir
    from ctl.sweep import pruning

    pruned, other = ModelDir(str(tmp_path / "0")), ModelDir(str(tmp_path / "1"))
    pruning.record_pruned(pruned, {"name": "median"}, "accuracy", 20, 0.125)
    record = pruning.read_pruned(pruned)
    assert (record["pruner"], record["step"], record["value"]) == ("median", 20, 0.125)
    assert record["why"].startswith("accuracy = 0.125 at step 20 was not good enough for the median")
    assert pruning.read_pruned(other) is None


def test_a_worker_ends_with_the_budget_and_a_sweep_of_failed_trials_ends_with_the_first_ones_line(
        tmp_path, capsys):
    from optuna.trial import TrialState

    from ctl.model_dir.sweep_workers import Slot
    from ctl.sweep import worker
    from ctl.sweep import __main__ as sweep_command

    opened, sweep, sweep_dir = open_study(tmp_path)
    for number in (0, 1, 2):
        assert opened.claim_next() == number
        opened.set_attr(number, "fail_reason", f"reason {number}", user=True)
        opened.optuna.tell(number, None, state=TrialState.FAIL)
    one = worker.Worker(opened, sweep, sweep_dir, Slot(0, "here:0", None), [], [], [], 1.0, 60.0,
                        fork_trials=False)
    assert one.run() == 0  # Nothing waits, nothing runs: no trial started, no launcher.
    assert sweep_command._end(opened, sweep, sweep_dir) == 1
    last = capsys.readouterr().err.splitlines()[-1]  # After Optuna's log lines, if any.
    assert last.startswith("ctl.sweep: error: every trial that ended failed (3); trial 0: reason 0;"), last
    opened.optuna.tell(opened.optuna.ask().number, 0.5)  # A trial beyond the budget: not counted.
    assert sweep_command._end(opened, sweep, sweep_dir) == 1


def test_the_launchers_thread_count_sees_a_thread_start():
    """What the warm launcher checks before each fork (`ctl.sweep.launcher.serve`)."""
    import threading

    from ctl.sweep import launcher

    seen = []  # (before, during, after) per attempt.
    for unused_attempt in range(50):  # Until an attempt no other thread of the process disturbed.
        before, stop = launcher.threads(), threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        during = launcher.threads()
        stop.set()
        thread.join()
        seen.append((before, during, launcher.threads()))
        if seen[-1] == (before, before + 1, before):
            break
        time.sleep(0.05)
    assert seen[-1][1] == seen[-1][0] + 1, seen


def test_a_trial_command_without_its_trial_number_is_one_line_exit_2(monkeypatch, capsys):
    """`python -m ctl.sweep.trial`'s required flags, checked in this process."""
    from absl import flags

    from ctl.sweep import trial

    monkeypatch.setattr(flags.FLAGS["sweep_file"], "value", "s.toml")
    monkeypatch.setattr(flags.FLAGS["sweep_dir"], "value", "sweep")
    with pytest.raises(SystemExit) as ended:
        trial.main(["ctl.sweep.trial"])
    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        "ctl.sweep.trial: error: --trial is required: The trial's number in the study.\n")
