"""Bad inputs and damaged model dirs through `python -m ctl.run`, `ctl.report` and `ctl.launch`.

Every bad input ends with exit status 2, exactly one line from ctl on stderr
(TensorFlow's own native start-up lines aside) that names the problem, no
traceback, and every file of the model dir unchanged by hash (or the model
dir not created). Every damaged model dir ends with the newest checkpoint that
restores restored and the run completed to `train_steps` (docs/faults.md,
"the corruption policy"), or, when none restores, with the one-line error.

Cost: the `ctl.run` cases run its `main` in this process (stderr captured,
`SystemExit` caught), where TensorFlow is imported already; real processes, run
a few at a time from one test, are left for what needs a process of its own: a
TensorFlow not yet set up (logical CPUs, a cluster strategy) and the other tools,
whose flags would clash with `ctl.run`'s.
"""

import concurrent.futures
import dataclasses
import fcntl
import json
import os
import shutil
from typing import Callable, Dict, List, Optional

import pytest

from ctl.model_dir.trainer_lock import TRAINER_LOCK_FILE
from ctl.model_dir import ModelDir, read_json
from tests.support.env import ROOT, TEST_GIN
from tests.support.in_process import run_ctl_in_process
from tests.support.processes import ctl_command
from tests.support.processes import run as run_command
from tests.support.reading import ctl_stderr_lines, snapshot

DIGITS_GIN = os.path.join(ROOT, "configs", "digits.gin")
FAULTS_GIN = os.path.join(ROOT, "tests", "faults.gin")
PROCESS_TIMEOUT_S = 300  # A bound, not a timing: the 2-core host is shared.


@dataclasses.dataclass
class Case:
    args: Callable[..., List[str]]  # (model_dir, tmp) -> arguments
    message: str  # Part of the one line ctl prints.
    tool: str = "ctl.run"
    in_process: bool = True  # False: needs a process of its own (see the module's docstring).
    model_dir: str = "trained"  # "trained" (a copy of a 20-step run), "new" (not there), "empty"
    env: Optional[Dict[str, str]] = None
    setup: Optional[Callable] = None  # (model_dir, tmp) -> None, before the snapshot.
    stdout: Optional[str] = None  # Also expected on stdout.


def gin_file(text, name="bad.gin"):
    def make(tmp):
        path = os.path.join(tmp, name)
        with open(path, "w" if isinstance(text, str) else "wb") as f:
            f.write(text)
        return f"--gin_file={path}"
    return make


def run(*args, mode="train", gin=TEST_GIN):
    """`ctl.run` arguments on the case's model dir; `args` may hold gin_file() makers."""
    def make(model_dir, tmp):
        flags = [f"--mode={mode}", f"--model_dir={model_dir}"]
        if gin:
            flags.append(f"--gin_file={gin}")
        return flags + [a(tmp) if callable(a) else a for a in args]
    return make


def cluster(task_type, index=0):
    spec = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]},
            "task": {"type": task_type, "index": index}}
    return {"TF_CONFIG": json.dumps(spec)}


def hold_trainer_lock(model_dir, tmp):
    """Takes `trainer.lock` as a live trainer would (released when the test ends)."""
    path = ModelDir(model_dir).file(TRAINER_LOCK_FILE)
    handle = open(path, "a+")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"role": "trainer", "pid": 1, "host": "elsewhere",
                             "since": "2026-01-01T00:00:00Z"}) + "\n")
    handle.flush()
    _held.append(handle)


_held = []


def damage_all(model_dir, tmp):
    for name in os.listdir(model_dir):
        if name.startswith("ckpt-") and (".data-" in name or name.endswith(".index")):
            path = os.path.join(model_dir, name)
            os.truncate(path, os.path.getsize(path) // 3)


WIDE = ("--gin_bindings=RegressionTask.flavor='tf_keras'",
        "--gin_bindings=PredictionsTask.batch_size=3",
        "--gin_bindings=ctl.Experiment.task=@WideTask()")

CASES = {
    # Flags.
    "unknown mode": Case(run(mode="trian"), "--mode"),
    "no mode": Case(lambda d, t: [f"--model_dir={d}"], "--mode"),
    "no model dir": Case(lambda d, t: ["--mode=train", f"--gin_file={TEST_GIN}"], "needs --model_dir"),
    "stray argument": Case(run("train"), "unexpected arguments"),
    "unknown flag": Case(run("--modle_dir=x"), "modle_dir"),
    "unknown strategy": Case(run("--strategy=horovod"), "--strategy"),
    "negative cpu_replicas": Case(run("--cpu_replicas=-1"), "--cpu_replicas (-1) must be between 0"),
    "cpu_replicas=100000": Case(run("--strategy=mirrored", "--cpu_replicas=100000"),
                                "--cpu_replicas (100000) must be between 0 and 64"),
    "cpu_replicas not a number": Case(run("--cpu_replicas=two"), "cpu_replicas"),
    "malformed --gin. flag": Case(run("--gin.ctl.Schedule.train_steps"), "write --gin.NAME=VALUE"),
    # Gin files.
    "missing gin file in a folder that is no package": Case(
        run(gin="configs/nope.gin"), "--gin_file=configs/nope.gin does not exist"),
    "missing gin file": Case(run(gin="nope.gin"), "nope.gin does not exist"),
    "gin file is a directory": Case(run(gin="configs/"), "--gin_file=configs/ is a directory"),
    "include of a missing file": Case(
        run(gin_file("include 'configs/typo.gin'\n"), gin=None),
        "configs/typo.gin (`include` at"),
    "gin file includes itself": Case(
        run(lambda t: gin_file(f"include '{os.path.join(t, 'loop.gin')}'\n", "loop.gin")(t),
            gin=None), "includes itself"),
    "gin file not UTF-8": Case(run(gin_file(b"\xff\xfe\x00\x81ctl.Schedule"), gin=None),
                               "pass a UTF-8 text file"),
    "unparsable gin file": Case(run(gin_file("import tests.tasks\nfoo = = 3\n"), gin=None),
                                "cannot parse gin config"),
    "gin file imports a missing module": Case(run(gin_file("import tests.no_such_module\n"), gin=None),
                                              "cannot be imported"),
    "gin search path without the file": Case(
        run("--gin_search_paths=/no/such/dir", gin="nope.gin"), "searched: /no/such/dir"),
    "empty gin file": Case(run(gin_file(""), gin=None), "Required bindings", model_dir="new"),
    # Gin bindings.
    "unknown configurable": Case(run("--gin_bindings=ctl.Scheduel.train_steps=3"), "ctl.Scheduel"),
    "unknown parameter": Case(run("--gin_bindings=ctl.Schedule.train_stepz=3"), "train_stepz"),
    "mistyped macro": Case(run("--gin_bindings=TRAIN_STEP=20", gin=DIGITS_GIN),
                           "binds the macro TRAIN_STEP, which no config refers to (as %TRAIN_STEP); "
                           "did you mean TRAIN_STEPS?"),
    "macro nothing refers to": Case(run("--gin_bindings=UNUSED=1"), "binds the macro UNUSED"),
    "REQUIRED macro unset": Case(run("--gin_bindings=STEPS=%gin.REQUIRED",
                                     "--gin_bindings=ctl.Schedule.train_steps=%STEPS"), "REQUIRED"),
    "ctl.Experiment.task unset": Case(
        run(gin_file("ctl.Schedule.train_steps = 5\n"), gin=None), "task", model_dir="new"),
    "REQUIRED schedule unset": Case(
        run(gin_file("import tests.tasks\nctl.Experiment.task = @RegressionTask()\n"), gin=None),
        "train_steps", model_dir="new"),
    "unparsable binding": Case(run("--gin_bindings=ctl.Schedule.train_steps = = 3"),
                               "cannot parse gin config"),
    "reference to an unknown configurable": Case(
        run("--gin_bindings=ctl.Experiment.task=@NoSuchTask()"), "NoSuchTask"),
    # Settings, refused before any file is written.
    "negative train_steps": Case(run("--gin_bindings=ctl.Schedule.train_steps=-5"), "train_steps",
                                 model_dir="new"),
    "steps_per_loop 0": Case(run("--gin_bindings=ctl.Schedule.steps_per_loop=0"),
                             "Schedule.steps_per_loop=0 is out of range", model_dir="new"),
    # --mode=smoke (no model dir: it rehearses in a temporary one).
    "smoke: steps_per_loop 0": Case(
        lambda d, t: ["--mode=smoke", f"--gin_file={TEST_GIN}",
                      "--gin_bindings=ctl.Schedule.steps_per_loop=0"],
        "Schedule.steps_per_loop=0 is out of range", model_dir="new"),
    "smoke: unknown configurable": Case(
        lambda d, t: ["--mode=smoke", f"--gin_file={TEST_GIN}",
                      "--gin_bindings=ctl.Scheduel.train_steps=3"], "ctl.Scheduel", model_dir="new"),
    "checkpoint_interval 0": Case(run("--gin_bindings=ctl.Schedule.checkpoint_interval=0"),
                                  "checkpoint_interval", model_dir="new"),
    "async_checkpointing not a bool": Case(
        run("--gin_bindings=ctl.Schedule.async_checkpointing='yes'"), "async_checkpointing",
        model_dir="new"),
    "bad nan_policy": Case(run("--gin_bindings=ctl.FaultTolerance.nan_policy='retry'"),
                           "Expected one of: stop, recover", model_dir="new"),
    "negative max_recoveries": Case(run("--gin_bindings=ctl.FaultTolerance.max_recoveries=-1"),
                                    "max_recoveries (-1)", model_dir="new"),
    "float seed": Case(run("--gin_bindings=ctl.FaultTolerance.seed=1.5"), "seed (1.5)",
                       model_dir="new"),
    "while_loop without tf.function": Case(
        run("--gin_bindings=ctl.Trainer.use_tf_function=False"), "use_tf_while_loop=True needs",
        model_dir="new"),
    "EarlyStopping patience 0": Case(
        run("--gin_bindings=ctl.Experiment.hooks=[@ctl.hooks.EarlyStopping()]",
            "--gin_bindings=ctl.hooks.EarlyStopping.patience=0"), "patience (0)", model_dir="new"),
    "exporter max_to_keep 0": Case(
        run("--gin_bindings=ctl.Experiment.hooks=[@ctl.hooks.LatestExporter()]",
            "--gin_bindings=ctl.hooks.LatestExporter.max_to_keep=0"), "max_to_keep (0)", model_dir="new"),
    "hook without hook methods": Case(
        run("--gin_bindings=ctl.Experiment.hooks=[@ctl.Schedule()]",
            "--gin_bindings=ctl.Schedule.train_steps=1"), "none of the hook methods",
        model_dir="new"),
    "sidecar policy": Case(run("--gin_bindings=ctl.ContinuousEval.policy='newest'",
                               mode="continuous_eval"), "ctl.ContinuousEval.policy"),
    "sidecar timeout": Case(run("--gin_bindings=ctl.ContinuousEval.timeout=-1",
                                mode="continuous_eval"), "ctl.ContinuousEval.timeout (-1)"),
    "sidecar poll_interval": Case(run("--gin_bindings=ctl.ContinuousEval.poll_interval=-1",
                                      mode="continuous_eval"), "poll_interval (-1)"),
    # Model dirs.
    "model dir is a file": Case(run(), "is a file, not a directory", model_dir="file"),
    "model dir under a file": Case(run(), "cannot write to --model_dir", model_dir="under a file"),
    "eval without a checkpoint": Case(run(mode="eval"), "holds no checkpoint", model_dir="empty"),
    "mismatched checkpoint": Case(run(*WIDE, mode="train_and_eval"),
                                  "holds a checkpoint of a different model"),
    "mismatched checkpoint, eval": Case(run(*WIDE, mode="eval"),
                                        "holds a checkpoint of a different model"),
    "every checkpoint damaged": Case(run(), "no checkpoint in --model_dir", setup=damage_all),
    "every checkpoint damaged, eval": Case(run(mode="eval"), "no checkpoint in --model_dir",
                                           setup=damage_all),
    "model dir in use by another trainer": Case(
        run(), "is in use by another trainer (pid 1 on host elsewhere", setup=hold_trainer_lock),
    # The sidecar without --gin_file waits for the trainer's config.gin: bounded, checked.
    "sidecar: model dir is a file": Case(run(gin=None, mode="continuous_eval"),
                                         "is a file, not a directory", model_dir="file"),
    "sidecar with --gin_file: model dir is a file": Case(
        run(mode="continuous_eval"), "is a file, not a directory", model_dir="file"),
    "sidecar: mistyped parameter": Case(
        run("--gin_bindings=ctl.ContinuousEval.timout=5", gin=None, mode="continuous_eval"),
        "timout", model_dir="empty"),
    "sidecar: mistyped configurable": Case(
        run("--gin_bindings=ctl.ContinusEval.timeout=5", gin=None, mode="continuous_eval"),
        "ctl.ContinusEval", model_dir="empty"),
    "sidecar: timeout bounds the wait for config.gin": Case(
        run("--gin_bindings=ctl.ContinuousEval.timeout=0.5", gin=None, mode="continuous_eval"),
        "config.gin after 0.5 s", model_dir="empty"),
    "sidecar: bad timeout before the wait": Case(
        run("--gin_bindings=ctl.ContinuousEval.timeout=0", gin=None, mode="continuous_eval"),
        "ctl.ContinuousEval.timeout (0)", model_dir="empty"),
    "sidecar of a different model": Case(
        run(*WIDE, mode="continuous_eval"), "evaluate it with the trainer's config"),
    # TF_CONFIG.
    "TF_CONFIG not JSON": Case(run(), "TF_CONFIG", env={"TF_CONFIG": "{not json"}),
    "TF_CONFIG without task": Case(run(), "TF_CONFIG",
                                   env={"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}})}),
    "TF_CONFIG cluster with a local strategy": Case(run(), "TF_CONFIG describes a cluster",
                                                    env=cluster("worker")),
    "TF_CONFIG evaluator told --mode=train (said in a log line)": Case(
        run("--gin_bindings=ctl.ContinuousEval.timeout=0.5", gin=None), "config.gin after 0.5 s",
        model_dir="empty", env=cluster("evaluator"),
        stdout="TF_CONFIG names this task the evaluator: running --mode=continuous_eval, not "
               "--mode=train"),
    "parameter_server without TF_CONFIG": Case(run("--strategy=parameter_server"),
                                               "needs a TF_CONFIG"),
    "stop_check='loop' under multi-worker": Case(
        run("--strategy=multi_worker_mirrored", "--gin_bindings=ctl.FaultTolerance.stop_check='loop'"),
        "stop_check='loop' is for one-process strategies, not MultiWorkerMirroredStrategy",
        in_process=False),
    # The task's own settings, found when its input pipeline is built.
    # The shipped experiments' arguments, checked as the task is built (`ctl.check_arguments`).
    "BATCH_SIZE=0 (digits)": Case(run("--gin_bindings=BATCH_SIZE=0", gin=DIGITS_GIN),
                                  "DigitsTask.batch_size=0 is out of range; bind it to an "
                                  "integer >= 1 (default: 64).", model_dir="new"),
    "hidden_units=0 (digits)": Case(run("--gin.DigitsTask.hidden_units=0", gin=DIGITS_GIN),
                                    "DigitsTask.hidden_units=0 is out of range; bind it to an "
                                    "integer >= 1 (default: 128).", model_dir="new"),
    "a learning rate that is a string (digits)": Case(
        run("--gin.DigitsTask.learning_rate='fast'", gin=DIGITS_GIN),
        "DigitsTask.learning_rate='fast' is a str; bind it to a number > 0 or a callable"),
    "a negative hidden size (the fit user's model function)": Case(
        run("--gin.compiled_mlp.hidden_units=-1", gin=os.path.join(ROOT, "configs", "keras_model.gin")),
        "compiled_mlp.hidden_units=-1 is out of range; bind it to an integer >= 1"),
    "a BERT hidden size the attention heads cannot split": Case(
        run("--gin.BertClassifierTask.hidden_size=33",
            gin=os.path.join(ROOT, "configs", "bert_classifier.gin")),
        "BertClassifierTask.hidden_size=33 is not a multiple of 2 (the attention heads); bind it "
        "to an integer >= 2 that is a multiple of 2", model_dir="new"),
    "a one-token sequence (Model Garden sentence prediction)": Case(
        run("--gin.sentence_prediction_data.seq_length=1",
            gin=os.path.join(ROOT, "configs", "model_garden_sentence_prediction.gin")),
        "sentence_prediction_data.seq_length=1 is out of range; bind it to an integer >= 2",
        model_dir="new"),
    "batch size the replicas cannot split": Case(
        run("--strategy=mirrored", "--cpu_replicas=2", "--gin_bindings=RegressionTask.batch_size=7"),
        "RegressionTask cannot build its input pipeline", model_dir="new", in_process=False),
    # ctl.report.
    "report without --model_dir": Case(lambda d, t: [], "model_dir", tool="ctl.report",
                                       in_process=False),
    "report: output in a missing dir": Case(
        lambda d, t: [f"--model_dir={d}", "--output=/no/such/dir/r.png"],
        "cannot write --output=/no/such/dir/r.png", tool="ctl.report", in_process=False),
    "report: output is a directory": Case(
        lambda d, t: [f"--model_dir={d}", f"--output={t}"], "it names a directory",
        tool="ctl.report", in_process=False),
    "report: model dir without summaries": Case(
        lambda d, t: [f"--model_dir={d}"], "holds no TensorBoard scalars", tool="ctl.report",
        model_dir="empty", in_process=False),
    "report: model dir missing": Case(lambda d, t: [f"--model_dir={d}"], "is not a directory",
                                      tool="ctl.report", model_dir="new", in_process=False),
    "report: stray argument": Case(lambda d, t: [f"--model_dir={d}", "extra"],
                                   "unexpected arguments", tool="ctl.report", in_process=False),
    "report: unknown flag": Case(lambda d, t: [f"--model_dir={d}", "--outptu=x.png"], "outptu",
                                 tool="ctl.report", in_process=False),
    # ctl.launch.
    "launch: no ctl.run flags": Case(lambda d, t: ["--workers=1"], "give the ctl.run flags after",
                                     tool="ctl.launch", in_process=False),
    "launch: zero workers": Case(lambda d, t: ["--workers=0", "--", "--mode=train"],
                                 "--workers (0) must be >= 1", tool="ctl.launch", in_process=False),
    "launch: unknown flag": Case(lambda d, t: ["--wokers=2", "--", "--mode=train"],
                                 "unrecognized arguments: --wokers=2", tool="ctl.launch",
                                 in_process=False),
    "launch: a worker's bad input": Case(
        lambda d, t: ["--workers=1", "--", "--mode=train", f"--model_dir={d}", "--gin_file=nope.gin"],
        "worker 0 exited with status 2: ctl.run: error: cannot read gin file", tool="ctl.launch",
        model_dir="new", in_process=False),
}


def prepare(case: Case, trained: str, tmp: str) -> str:
    """The case's model dir (a copy of the model dir `trained`, if it asks), set up; the path the
    case is run with."""
    model_dir = os.path.join(tmp, "run")
    if case.model_dir == "trained":
        shutil.copytree(trained, model_dir)
    elif case.model_dir == "empty":
        os.makedirs(model_dir)
    elif case.model_dir == "file":
        with open(model_dir, "w") as f:
            f.write("not a directory\n")
    elif case.model_dir == "under a file":
        with open(model_dir, "w") as f:
            f.write("not a directory\n")
        return os.path.join(model_dir, "run")
    if case.setup is not None:
        case.setup(model_dir, tmp)
    return model_dir


def state(path: str):
    """What a model dir holds (file -> hash), or what the file is, or None if nothing."""
    if os.path.isdir(path):
        return snapshot(path)
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    return None


def run_in_process(tool: str, args: List[str], env: Optional[Dict[str, str]]):
    """`python -m ctl.run ARGS` as `main` in this process: (exit status, stdout, stderr)."""
    assert tool == "ctl.run"
    return run_ctl_in_process(args, env)


def run_process(tool: str, args: List[str], env: Optional[Dict[str, str]]):
    result = run_command(ctl_command(*args, module=tool), timeout=PROCESS_TIMEOUT_S, env=env)
    return result.returncode, result.stdout, result.stderr


def check(name: str, case: Case, code, stdout: str, stderr: str, before, after) -> List[str]:
    """What is wrong with a case's outcome (empty when it passed)."""
    problems = []
    lines = ctl_stderr_lines(stderr)
    if code != 2:
        problems.append(f"exit status {code}, not 2")
    if "Traceback" in stderr:
        problems.append("a traceback")
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines from ctl on stderr, not 1")
    elif not lines[0].startswith(f"{case.tool}: error: ") or case.message not in lines[0]:
        problems.append(f"the line does not say {case.message!r}")
    if case.stdout and case.stdout not in stdout:
        problems.append(f"stdout does not say {case.stdout!r}")
    if before != after:
        problems.append(f"the model dir changed: {sorted(set(str(before)) ^ set(str(after)))[:0]}"
                        f"{_changes(before, after)}")
    return [f"{name}: {p}\n    stderr: {stderr.strip()[-600:]}" for p in problems]


def _changes(before, after) -> str:
    if isinstance(before, dict) and isinstance(after, dict):
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        return f"files {changed}"
    return f"{'created' if before is None else 'replaced'}"


IN_PROCESS = sorted(name for name, case in CASES.items() if case.in_process)
PROCESSES = sorted(name for name, case in CASES.items() if not case.in_process)


def test_there_are_sixty_distinct_bad_inputs():
    assert len(CASES) + len(DAMAGED) >= 60


@pytest.mark.parametrize("name", IN_PROCESS)
def test_bad_input_in_process(name, trained_dir, tmp_path):
    case = CASES[name]
    model_dir = prepare(case, trained_dir(), str(tmp_path))
    before = state(model_dir)
    try:
        code, stdout, stderr = run_in_process(case.tool, case.args(model_dir, str(tmp_path)),
                                              case.env)
    finally:
        while _held:
            _held.pop().close()
    problems = check(name, case, code, stdout, stderr, before, state(model_dir))
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_bad_inputs_in_processes(trained_dir, tmp_path):
    """The cases that need a process of their own (a fresh TensorFlow, another tool): a few at a time."""
    prepared = {}
    for index, name in enumerate(PROCESSES):
        tmp = str(tmp_path / f"case{index}")
        os.makedirs(tmp)
        model_dir = prepare(CASES[name], trained_dir(), tmp)
        prepared[name] = (tmp, model_dir, state(model_dir))

    def one(name):
        case = CASES[name]
        tmp, model_dir, before = prepared[name]
        code, stdout, stderr = run_process(case.tool, case.args(model_dir, tmp), case.env)
        return check(name, case, code, stdout, stderr, before, state(model_dir))

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            problems = [p for found in pool.map(one, PROCESSES) for p in found]
    finally:
        while _held:
            _held.pop().close()
    assert not problems, "\n".join(problems)


# Damaged model dirs that still hold a checkpoint that restores, through `python -m ctl.run`: the run
# restores the newest one and completes (`--mode=train`, 30 steps; eval evaluates it), saying which it
# restored and nothing on stderr. Every kind of damage, on a local disk and in a bucket:
# tests/test_damaged_model_dir.py.
def _remove(prefix):
    def damage(model_dir):
        for name in os.listdir(model_dir):
            if name.startswith(prefix):
                os.remove(os.path.join(model_dir, name))
    return damage


def _cut(prefix, part):
    def damage(model_dir):
        for name in os.listdir(model_dir):
            if name.startswith(prefix) and part in name:
                path = os.path.join(model_dir, name)
                os.truncate(path, os.path.getsize(path) // 2)
    return damage


DAMAGED = {  # name -> (damage, mode, checkpoint restored)
    "newest checkpoint deleted, eval": (_remove("ckpt-20."), "eval", 10),
    "newest checkpoint truncated": (_cut("ckpt-20.", ".data-"), "train", 10),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_model_dirs_restore_the_newest_intact_checkpoint_and_complete(name, trained_dir,
                                                                             tmp_path):
    damage, mode, restored = DAMAGED[name]
    model_dir = str(tmp_path / "damaged")
    shutil.copytree(trained_dir(), model_dir)
    damage(model_dir)
    code, stdout, stderr = run_in_process(
        "ctl.run", [f"--mode={mode}", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
                    "--gin_bindings=ctl.Schedule.train_steps=30"], None)
    assert code == 0 and "Traceback" not in stderr and not ctl_stderr_lines(stderr), (
        f"exit status {code}; stderr: {stderr.strip()[-600:]}")
    assert f"restored model from {os.path.join(model_dir, f'ckpt-{restored}')}\n" in stdout
    if mode == "train":
        marker = read_json(ModelDir(model_dir).finished_file) or {}
        latest = ModelDir(model_dir).checkpoint_state().latest or ""
        assert marker.get("final_step") == 30 and latest.endswith("ckpt-30"), (marker, latest)
    else:
        assert f"eval | step: {restored:6d}" in stdout, stdout
