"""The sidecar evaluator (`--mode=continuous_eval`) beside real trainers, on real checkpoints."""

import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import socket
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import ctl
from ctl.hooks.best import best_record
from ctl.model_dir import EVAL_DIR
from ctl.model_dir.sidecar_progress import SIDECAR_PROGRESS_FILE
from ctl.model_dir import PUBLISHED_MARKER, ModelDir, read_json
from ctl.sidecar import continuous_eval
from tests.support.env import ROOT, TEST_GIN
from tests.support.in_process import ctl_in_process, run_ctl_in_process
from tests.support.processes import Process, run_ctl
from tests.support.reading import ctl_stderr_lines, scalars, snapshot
from tests.sidecar_tasks import DeleteOnFirstEvaluation, RecordingCallback, TwoEvalSetsTask
from tests.tasks import RegressionTask, regression_data

pytestmark = pytest.mark.slow
WAIT_S = 240  # Bound on every wait; the 2-core host is shared.


def progress(model_dir):
    with open(ModelDir(model_dir).file(EVAL_DIR, SIDECAR_PROGRESS_FILE)) as f:
        return {int(k): v for k, v in json.load(f)["checkpoints"].items()}


def evaluated_numbers(model_dir):
    return [r["number"] for r in ModelDir(model_dir).sidecar_evaluations()]


def experiment(task=None, callbacks=(), **schedule):
    """The experiment of the run being evaluated; `callbacks`: Keras callbacks, through their one
    route (`ctl.hooks.KerasCallbacks`)."""
    return ctl.Experiment(task=task or RegressionTask(),
                          hooks=[ctl.hooks.KerasCallbacks(callbacks)] if callbacks else [],
                          schedule=ctl.Schedule(**{"train_steps": 40, "steps_per_loop": 10,
                                                   "checkpoint_interval": 10, **schedule}))


@pytest.fixture
def run_dir(trained_dir, tmp_path):
    """A copy of a finished 40-step run: checkpoints 10, 20, 30, 40."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained_dir(40), model_dir)
    return model_dir


@pytest.fixture
def start_ctl():
    """Starts `python -m ctl.run args` (stdout and stderr as one); all killed at the test's end."""
    started = []

    def start(*args, env=None):
        started.append(Process.ctl(*args, env=env, merge_stderr=True))
        return started[-1]
    yield start
    for process in started:
        process.kill()


def wait_until(condition, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_checkpoint_once_with_the_evaluator_killed_and_restarted(tmp_path, start_ctl):
    model_dir = str(tmp_path / "run")
    # The evaluator starts first: it waits for the dir, the trainer's config.gin and a checkpoint.
    evaluator = start_ctl("--mode=continuous_eval", f"--model_dir={model_dir}")
    tf_config = json.dumps({"cluster": {"chief": [f"127.0.0.1:{free_port()}"],
                                        "evaluator": [f"127.0.0.1:{free_port()}"]},
                            "task": {"type": "chief", "index": 0}})
    trainer = start_ctl(
        "--mode=train_and_eval", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
        "--gin_bindings=import tests.sidecar_tasks",
        "--gin_bindings=ctl.Experiment.task = @SlowRegressionTask()",
        "--gin_bindings=SlowRegressionTask.delay = 0.1", "--gin_bindings=ctl.Schedule.train_steps = 60",
        "--gin_bindings=ctl.Schedule.max_checkpoints = 10", env={"TF_CONFIG": tf_config})
    wait_until(lambda: evaluated_numbers(model_dir), "the first evaluation")
    evaluator.send_signal(signal.SIGKILL)  # Mid-run: wherever it is.
    evaluator.wait(timeout=30)
    restarted = start_ctl("--mode=continuous_eval", f"--model_dir={model_dir}")
    assert trainer.wait(timeout=WAIT_S) == 0, trainer.stdout()[-3000:]
    assert restarted.wait(timeout=WAIT_S) == 0, restarted.stdout()[-3000:]

    steps = [10, 20, 30, 40, 50, 60]
    assert evaluated_numbers(model_dir) == steps  # Each exactly once, in order (as recorded).
    assert progress(model_dir) == {step: "evaluated" for step in steps}
    evals = scalars(os.path.join(model_dir, "eval"))
    assert set(evals["loss"]) == set(steps) and evals["examples"][60] == 10.0
    assert evals["loss"][60] < evals["loss"][10]
    log = restarted.stdout()
    assert "finished: the trainer's final checkpoint (number 60) is evaluated" in log
    assert "eval | step:     60" in log
    trainer_log = trainer.stdout()
    assert "training without in-line eval" in trainer_log and "eval | step" not in trainer_log


def test_a_sidecar_killed_after_a_metrics_line_before_its_progress_evaluates_each_once(tmp_path):
    """A sidecar killed (tests/sidecar_killed_after_metrics_line.py) in the window between appending a
    checkpoint's metrics line and recording its progress; the restarted sidecar
    evaluates every checkpoint exactly once (metrics, progress and summaries)."""
    model_dir = str(tmp_path / "run")
    # The trainer and the restarted sidecar: the command's main in this process (the killed one
    # is a process).
    trained = ctl_in_process("--mode=train", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
                             "--gin_bindings=ctl.Schedule.train_steps = 40",
                             "--gin_bindings=ctl.Schedule.eval_interval = None")
    assert trained.returncode == 0, trained.stderr[-3000:]
    steps = sorted(ModelDir(model_dir).checkpoints())
    assert steps == [10, 20, 30, 40]

    killed = run_ctl(  # Killed after its first metrics line, before its progress.
        "--mode=continuous_eval", f"--model_dir={model_dir}",
        module="tests.sidecar_killed_after_metrics_line", timeout=WAIT_S)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # In the window: one metrics line, and no progress recorded for it.
    [first] = evaluated_numbers(model_dir)
    progress_file = ModelDir(model_dir).file(EVAL_DIR, SIDECAR_PROGRESS_FILE)
    assert not os.path.exists(progress_file) or first not in progress(model_dir)

    restarted = ctl_in_process("--mode=continuous_eval", f"--model_dir={model_dir}")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert evaluated_numbers(model_dir) == steps  # Each exactly once, in order (as recorded).
    assert progress(model_dir) == {step: "evaluated" for step in steps}
    loss_steps = [event.step for path in glob.glob(os.path.join(model_dir, "eval", "events.out.*"))
                  for event in tf.compat.v1.train.summary_iterator(path)
                  if any(value.tag == "loss" for value in event.summary.value)]
    assert sorted(loss_steps) == steps  # One summary per checkpoint.


@pytest.mark.parametrize("storage", ["local", "gs"])
def test_one_owner_for_the_eval_side_effects_of_a_trainer_and_a_sidecar(
        request, tmp_path, start_ctl, storage):
    """A sidecar beside a trainer in `train_and_eval` (no TF_CONFIG): the trainer's in-line
    evaluation steps aside (one line), the sidecar evaluates every checkpoint and owns the
    best checkpoint and the exports; the trainer keeps its run-end hooks (FinalExporter).
    On a local disk (flock) and in a bucket (a real GCS API: leases, no lock)."""
    from ctl.config import gin_config as config
    root = request.getfixturevalue("gcs_dir") if storage == "gs" else str(tmp_path)
    model_dir = f"{root}/run"
    gfile = tf.io.gfile
    comforts_gin = os.path.join(ROOT, "tests", "comforts.gin")
    keep = "ctl.Schedule.max_checkpoints = 5"  # Every checkpoint stays for the sidecar.
    config.parse([comforts_gin], ["ctl.Schedule.train_steps = 20", keep])
    ctl.run_experiment("train", model_dir)  # ckpt-10, ckpt-20 and config.gin; no evaluation.
    gfile.remove(ModelDir(model_dir).finished_file)  # Still training, as far as the sidecar knows.
    claim = ModelDir(model_dir).evaluator_file
    sidecar = start_ctl("--mode=continuous_eval", f"--model_dir={model_dir}",
                        "--gin_bindings=ctl.ContinuousEval.timeout=240")
    wait_until(lambda: evaluated_numbers(model_dir) == [10, 20] and gfile.exists(claim)
               and "sidecar evaluator" in gfile.GFile(claim).read(), "the sidecar's claim")
    trainer = start_ctl("--mode=train_and_eval", f"--model_dir={model_dir}",
                        f"--gin_file={comforts_gin}", f"--gin_bindings={keep}")
    for process in (trainer, sidecar):
        process.wait(timeout=WAIT_S)
    trainer_log, sidecar_log = trainer.stdout(), sidecar.stdout()
    assert trainer.returncode == 0 and sidecar.returncode == 0, trainer_log[-3000:] + sidecar_log[-3000:]
    assert evaluated_numbers(model_dir) == [10, 20, 30, 40]
    assert trainer_log.count(f"a sidecar evaluator (pid {sidecar.pid} on host") == 1, trainer_log
    assert "in-line evaluation steps aside" in trainer_log
    assert not re.search(r" eval \| step: +\d+ \| loss", trainer_log)  # No in-line evaluation...
    assert "best | step:" not in trainer_log  # ... and no eval-side file.
    assert not [line for line in trainer_log.splitlines()
                if "export | step:" in line and "final" not in line and "checkpoint" not in line]
    for step in (10, 20, 30, 40):
        assert f"export | step: {step:6d} | latest SavedModel" in sidecar_log, step
    listing = lambda path: sorted(n.rstrip("/") for n in gfile.listdir(path))  # noqa: E731
    assert listing(f"{model_dir}/export/latest") == ["30", "40"]
    assert listing(f"{model_dir}/export/final") == ["40"]  # The trainer's.
    published_by = lambda path: read_json(f"{path}/{PUBLISHED_MARKER}")["pid"]  # noqa: E731
    assert [published_by(f"{model_dir}/export/latest/{s}") for s in ("30", "40")] == [sidecar.pid] * 2
    assert published_by(f"{model_dir}/export/final/40") == trainer.pid
    best = best_record(ModelDir(model_dir))
    # The sidecar's best checkpoint holds what it restored: the model and step, no optimizer.
    names = {name for name, _ in tf.train.list_variables(best["path"])}
    assert any(n.startswith("model/") for n in names) and not any(
        n.startswith("optimizer/") for n in names), names


def test_checkpoints_deleted_by_a_fast_trainer_are_skipped_never_fatal(tmp_path, start_ctl):
    """A trainer keeping 2 checkpoints outruns its evaluator, in an order the test sets
    with gates: one checkpoint is deleted while it is evaluated (its evaluation goes
    on from what it restored), one after the evaluator saw it and before its turn
    (skipped, recorded `deleted`), and the run still ends `finished`."""
    model_dir, gates = str(tmp_path / "run"), tmp_path / "gates"
    gates.mkdir()

    def release(name):
        (gates / name).touch()

    def wait_for_gate(name):
        wait_until(lambda: (gates / name).exists(), name)

    def wait_for_latest(number):
        wait_until(lambda: (tf.train.latest_checkpoint(model_dir) or "").endswith(f"ckpt-{number}"),
                   f"ckpt-{number}")

    evaluator = start_ctl(
        "--mode=continuous_eval", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
        "--gin_bindings=import tests.sidecar_tasks",
        "--gin_bindings=ctl.Experiment.hooks = [@ctl.hooks.KerasCallbacks()]",
        "--gin_bindings=ctl.hooks.KerasCallbacks.callbacks = [@GateCallback()]",
        f"--gin_bindings=GateCallback.gate_dir = '{gates}'", "--gin_bindings=GateCallback.gated = (1, 2)")
    wait_until(lambda: "waiting for a new checkpoint" in evaluator.stdout(),
               "the evaluator to wait for checkpoints")
    trainer = start_ctl(
        "--mode=train", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
        "--gin_bindings=import tests.sidecar_tasks",
        "--gin_bindings=ctl.Experiment.task = @GatedRegressionTask()",
        f"--gin_bindings=GatedRegressionTask.gate_dir = '{gates}'",
        "--gin_bindings=GatedRegressionTask.gated_steps = (11, 31)",
        "--gin_bindings=ctl.Schedule.train_steps = 50", "--gin_bindings=ctl.Schedule.max_checkpoints = 2")
    wait_for_gate("eval-1.started")  # ckpt-10 restored; the trainer waits at step 11.
    release("train-11")
    wait_for_latest(30)  # ckpt-20 and ckpt-30 written, ckpt-10 deleted; the trainer waits at 31.
    release("eval-1")
    wait_for_gate("eval-2.started")  # ckpt-20 restored; ckpt-20 and ckpt-30 seen.
    release("train-31")
    assert trainer.wait(timeout=WAIT_S) == 0, trainer.stdout()[-3000:]  # ckpt-20, -30 deleted.
    release("eval-2")
    assert evaluator.wait(timeout=WAIT_S) == 0, evaluator.stdout()[-3000:]
    assert progress(model_dir) == {10: "evaluated", 20: "evaluated", 30: "deleted",
                                   40: "evaluated", 50: "evaluated"}
    assert evaluated_numbers(model_dir) == [10, 20, 40, 50]
    log = evaluator.stdout()
    assert "skipping ckpt-30: deleted before its evaluation" in log
    assert "finished: the trainer's final checkpoint (number 50) is evaluated" in log


def test_a_sidecar_for_an_extended_run_does_not_take_the_old_finished_marker(run_dir, start_ctl):
    """`run_dir` finished at step 40 (its marker says so). A sidecar started with the
    extended run's config (60 steps) while that marker is still there (here: before the
    trainer even starts, the extreme of the seconds before a trainer clears it) waits
    for the trainer and evaluates up to its new final checkpoint."""
    extended = (f"--gin_file={TEST_GIN}", "--gin_bindings=ctl.Schedule.train_steps = 60",
                "--gin_bindings=ctl.Schedule.max_checkpoints = 10")
    evaluator = start_ctl("--mode=continuous_eval", f"--model_dir={run_dir}",
                                *extended)
    wait_until(lambda: evaluator.poll() is not None or "marks a run of fewer steps than "
               "ctl.Schedule.train_steps (60)" in evaluator.stdout(),
               "the evaluator to see the old marker")
    # The trainer: the command's main in this process, while the sidecar's process waits for it.
    trainer = ctl_in_process("--mode=train", f"--model_dir={run_dir}", *extended)
    assert trainer.returncode == 0, trainer.stdout[-3000:] + trainer.stderr[-3000:]
    assert evaluator.wait(timeout=WAIT_S) == 0, evaluator.stdout()[-3000:]
    assert evaluated_numbers(run_dir) == [10, 20, 30, 40, 50, 60]
    assert ("finished: the trainer's final checkpoint (number 60) is evaluated"
            in evaluator.stdout())


def test_truncated_checkpoint_is_recorded_failed_and_skipped(run_dir):
    data = os.path.join(run_dir, "ckpt-20.data-00000-of-00001")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    result = ctl_in_process("--mode=continuous_eval", f"--model_dir={run_dir}", f"--gin_file={TEST_GIN}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert evaluated_numbers(run_dir) == [10, 30, 40]
    assert progress(run_dir) == {10: "evaluated", 20: "failed", 30: "evaluated", 40: "evaluated"}
    assert "skipping ckpt-20, recorded as failed: cannot read checkpoint" in result.stdout
    assert set(scalars(os.path.join(run_dir, "eval"))["loss"]) == {10, 30, 40}


def test_checkpoint_of_a_different_model_is_an_error(run_dir):
    before = snapshot(run_dir)
    result = ctl_in_process("--mode=continuous_eval", f"--model_dir={run_dir}", f"--gin_file={TEST_GIN}",
                            "--gin_bindings=ctl.Experiment.task = @WideTask()")
    assert result.returncode == 2, result.stderr[-3000:]
    lines = ctl_stderr_lines(result.stderr)
    assert len(lines) == 1 and "holds a checkpoint of a different model" in lines[0], lines
    assert snapshot(run_dir) == before  # Nothing evaluated, nothing recorded.


def test_idle_timeout_ends_with_a_clear_message(run_dir):
    os.remove(ModelDir(run_dir).finished_file)  # A trainer that vanished before train_steps
    result = ctl_in_process("--mode=continuous_eval", f"--model_dir={run_dir}", f"--gin_file={TEST_GIN}",
                            "--gin_bindings=ctl.ContinuousEval.timeout = 2",  # (once past it, the end is 0).
                            "--gin_bindings=ctl.Schedule.train_steps = 100")
    assert result.returncode == 2, result.stderr[-3000:]
    assert evaluated_numbers(run_dir) == [10, 20, 30, 40]
    lines = ctl_stderr_lines(result.stderr)
    assert len(lines) == 1 and "no new checkpoint in --model_dir=" in lines[0], lines
    assert "for 2 s (ctl.ContinuousEval.timeout)" in lines[0]


def test_deleted_before_and_during_evaluation(run_dir, caplog):
    # While ckpt-10 is evaluated, its own files and those of ckpt-20 (already seen) vanish.
    deleter = DeleteOnFirstEvaluation(run_dir, [10, 20])
    continuous_eval.evaluate_continuously(ModelDir(run_dir), experiment=experiment(callbacks=[deleter]),
                                          settings=ctl.ContinuousEval())
    assert progress(run_dir) == {10: "evaluated", 20: "deleted", 30: "evaluated", 40: "evaluated"}
    assert evaluated_numbers(run_dir) == [10, 30, 40]
    assert "skipping ckpt-20: deleted before its evaluation" in caplog.text


def test_latest_policy_and_max_evaluations(run_dir):
    settings = ctl.ContinuousEval(policy="latest")
    continuous_eval.evaluate_continuously(ModelDir(run_dir), experiment=experiment(), settings=settings)
    assert evaluated_numbers(run_dir) == [40]
    assert progress(run_dir) == {10: "skipped", 20: "skipped", 30: "skipped", 40: "evaluated"}

    shutil.rmtree(os.path.join(run_dir, "eval"))
    settings = ctl.ContinuousEval(max_evaluations=3)
    continuous_eval.evaluate_continuously(ModelDir(run_dir), experiment=experiment(), settings=settings)
    assert evaluated_numbers(run_dir) == [10, 20, 30]
    # Counted over restarts: a new evaluator with the same limit has nothing left to do.
    continuous_eval.evaluate_continuously(ModelDir(run_dir), experiment=experiment(), settings=settings)
    assert evaluated_numbers(run_dir) == [10, 20, 30]


RANDOM_EVAL_ARGS = [f"--gin_file={TEST_GIN}", "--gin_bindings=import tests.sidecar_tasks",
                    "--gin_bindings=ctl.Experiment.task = @RandomEvalTask()",
                    "--gin_bindings=ctl.FaultTolerance.seed = 3"]


def run_in_process(*args):
    """`python -m ctl.run args` in this process, as a new process starts (no seed until the
    run sets one); asserts it succeeded and returns its console (stdout)."""
    tf.random.set_seed(None)
    code, out, err = run_ctl_in_process([*args, *RANDOM_EVAL_ARGS])
    assert code == 0, err[-2000:]
    return out


def eval_mode_draw(model_dir, tmp_path, name, *args):
    """`--mode=eval`'s draw (its step, its draw) on a copy of `model_dir` (its latest checkpoint),
    with more `args`."""
    copy = str(tmp_path / name)
    shutil.copytree(model_dir, copy)
    run_in_process("--mode=eval", f"--model_dir={copy}", *args)
    record = ModelDir(copy).metrics("eval")[-1]
    return record["step"], record["draw"]


def test_a_seeded_sidecar_draws_what_the_eval_mode_draws_on_the_same_checkpoint(run_dir, tmp_path):
    # An eval step that draws from TensorFlow's stateful random ops, under `ctl.FaultTolerance.seed`:
    # the sidecar evaluates checkpoints 10, 20, 30 and 40 in turn, and its evaluation of each (the
    # last after three others) is --mode=eval's of the same checkpoint, draw for draw. The draws do
    # not depend on the weights: --mode=eval on checkpoint 40 stands for every checkpoint.
    expected = eval_mode_draw(run_dir, tmp_path, "copy")
    out = run_in_process("--mode=continuous_eval", f"--model_dir={run_dir}")
    said = [line for line in out.splitlines() if "each evaluation traces it anew" in line]
    assert len(said) == 1 and "(RandomUniform)" in said[0], out[-3000:]
    sidecar = ModelDir(run_dir).sidecar_evaluations()
    assert [each["number"] for each in sidecar] == [10, 20, 30, 40]
    assert (sidecar[-1]["step"], sidecar[-1]["results"]["draw"]) == expected, (sidecar, expected)
    assert {each["results"]["draw"] for each in sidecar} == {expected[1]}, sidecar


def test_a_seeded_in_line_evaluation_draws_what_the_eval_mode_draws_on_the_same_checkpoint(
        run_dir, tmp_path):
    # In-line, the evaluation at step 60 comes after the ones at steps 40 and 50 in the same
    # process, with train loops between them: it draws what --mode=eval draws on checkpoint 60.
    # Two eval steps, the whole eval set: each evaluation one tf.function call (the sidecar's
    # test above runs the host loop).
    steps = "--gin_bindings=ctl.Schedule.eval_steps = 2"
    run_in_process("--mode=train_and_eval", f"--model_dir={run_dir}",
                   "--gin_bindings=ctl.Schedule.train_steps = 60", steps)
    in_line = {each["step"]: each["draw"] for each in ModelDir(run_dir).metrics("eval")
               if "draw" in each}
    assert sorted(in_line)[-2:] == [50, 60], in_line
    step, draw = eval_mode_draw(run_dir, tmp_path, "copy", steps)
    assert (step, draw) == (60, in_line[60]), in_line
    assert in_line[50] == draw, in_line


def test_named_eval_sets_and_keras_callback_hooks(tmp_path):
    model_dir = str(tmp_path)
    task = TwoEvalSetsTask()
    ctl.run_experiment("train", model_dir, experiment=experiment(task, train_steps=20))
    recorder = RecordingCallback()
    sidecar_experiment = experiment(task, callbacks=[recorder], train_steps=20)
    sidecar_experiment = dataclasses.replace(  # A set's metric, by "set/name".
        sidecar_experiment, hooks=[ctl.hooks.BestCheckpoint(metric="far/loss"), *sidecar_experiment.hooks])
    continuous_eval.evaluate_continuously(ModelDir(model_dir), experiment=sidecar_experiment,
                                          settings=ctl.ContinuousEval())
    records = ModelDir(model_dir).sidecar_evaluations()
    assert [r["step"] for r in records] == [10, 20]
    far_losses = {r["step"]: r["results"]["far"]["loss"] for r in records}
    best = best_record(ModelDir(model_dir))
    assert best["metric"] == "far/loss" and best["step"] == min(far_losses, key=far_losses.get)
    assert records[1]["results"]["near"]["examples"] == 6.0
    assert records[1]["results"]["far"]["examples"] == 10.0
    for name in ("near", "far"):
        assert set(scalars(os.path.join(model_dir, "eval", name))["loss"]) == {10, 20}
    # Per evaluation of one set: begin, a begin/end pair per batch, one begin that meets the end;
    # an epoch per evaluation, its logs by "val_set/name".
    near = ["begin", "batch_begin:0", "batch_end:0", "batch_begin:1", "batch_end:1",
            "batch_begin:2", "end:['examples', 'loss']"]
    far = near[:5] + ["batch_begin:2", "batch_end:2", "batch_begin:3", "end:['examples', 'loss']"]
    epoch = ("epoch_end:{}:['val_far/examples', 'val_far/loss', 'val_near/examples', "
             "'val_near/loss']")
    assert recorder.calls == (["train_begin"] + near + far + [epoch.format(0)] + near + far
                              + [epoch.format(1), "train_end"])


def test_keras_callbacks_see_the_same_calls_in_line_and_on_the_sidecar(trained_dir, tmp_path):
    """One route (`ctl.hooks.KerasCallbacks`): a callback of a `train_and_eval` run and one of a
    sidecar evaluating a `train` run of the same schedule see the same calls, in the same order."""
    in_line = RecordingCallback()
    ctl.run_experiment("train_and_eval", str(tmp_path / "in_line"),
                       experiment=experiment(callbacks=[in_line], train_steps=20, eval_interval=10))
    sidecar_dir = str(tmp_path / "sidecar")
    shutil.copytree(trained_dir(20), sidecar_dir)  # Checkpoints 10 and 20, as in-line's evaluations.
    on_sidecar = RecordingCallback()
    continuous_eval.evaluate_continuously(ModelDir(sidecar_dir), settings=ctl.ContinuousEval(),
                                          experiment=experiment(callbacks=[on_sidecar], train_steps=20))
    evaluation = ["begin"] + [f"batch_{end}:{b}" for b in range(2) for end in ("begin", "end")] + [
        "batch_begin:2", "end:['examples', 'loss']"]
    epoch = "epoch_end:{}:['val_examples', 'val_loss']"
    assert in_line.calls == (["train_begin"] + evaluation + [epoch.format(0)] + evaluation
                             + [epoch.format(1), "train_end"])
    assert on_sidecar.calls == in_line.calls


def _eval_loss(model):
    features, targets = regression_data(10, seed=1)
    return float(np.mean((model(features).numpy() - targets) ** 2))


def test_tf_keras_model_checkpoint_files_evaluate(tmp_path):
    model_dir = str(tmp_path)
    model = RegressionTask(flavor="tf_keras").build_model()
    model.compile(tf_keras.optimizers.SGD(0.05), loss="mse")
    features, targets = regression_data(64)
    saver = tf_keras.callbacks.ModelCheckpoint(os.path.join(model_dir, "ckpt-{epoch}"),
                                               save_weights_only=True)
    model.fit(features, targets, batch_size=16, epochs=3, callbacks=[saver], verbose=0)
    recorder = RecordingCallback()
    settings = ctl.ContinuousEval(max_evaluations=3)
    continuous_eval.evaluate_continuously(
        ModelDir(model_dir), experiment=experiment(RegressionTask(flavor="tf_keras"), callbacks=[recorder]),
        settings=settings)
    records = ModelDir(model_dir).sidecar_evaluations()
    # In order, although only the newest is named in the state file; at the optimizer's step.
    assert [(r["number"], r["step"]) for r in records] == [(1, 4), (2, 8), (3, 12)]
    assert records[2]["results"]["loss"] == pytest.approx(_eval_loss(model), rel=1e-4)
    np.testing.assert_allclose(recorder.kernels[2], model.get_weights()[0].ravel(), rtol=1e-6)


def test_checkpoint_manager_over_model_and_optimizer_evaluates(tmp_path):
    model_dir = str(tmp_path)
    task = RegressionTask()
    model, optimizer = task.build_model(), task.build_optimizer()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                         model_dir, max_to_keep=3)
    features, targets = regression_data(8)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features) - targets))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        manager.save()
    settings = ctl.ContinuousEval(max_evaluations=2)
    continuous_eval.evaluate_continuously(ModelDir(model_dir), experiment=experiment(), settings=settings)
    records = ModelDir(model_dir).sidecar_evaluations()
    assert [(r["number"], r["step"]) for r in records] == [(1, 1), (2, 2)]  # optimizer.iterations
    assert records[1]["results"]["loss"] == pytest.approx(_eval_loss(model), rel=1e-4)


def test_bad_setting_is_one_clear_line(run_dir):
    before = snapshot(run_dir)
    result = ctl_in_process("--mode=continuous_eval", f"--model_dir={run_dir}", f"--gin_file={TEST_GIN}",
                            "--gin_bindings=ctl.ContinuousEval.policy = 'newest'")
    assert result.returncode == 2, result.stderr[-3000:]
    lines = ctl_stderr_lines(result.stderr)
    assert lines == ["ctl.run: error: Received ctl.ContinuousEval.policy='newest'. "
                     "Expected one of: all, latest."], lines
    assert snapshot(run_dir) == before
