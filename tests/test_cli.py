"""`python -m ctl.run` end to end: modes, outputs, resume and every bad input."""

import os
import shutil

import numpy as np
import pytest

from tests.cli import TEST_GIN, ctl_stderr_lines, run_ctl, scalars, snapshot
from tests.tasks import regression_data

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A model dir trained for 20 steps by `--mode=train`."""
    model_dir = str(tmp_path_factory.mktemp("trained"))
    result = run_ctl("--mode=train", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}")
    assert result.returncode == 0, result.stderr
    return model_dir


def test_train_writes_checkpoints_configs_and_summaries(trained_dir):
    files = set(os.listdir(trained_dir))
    assert {"ckpt-10.index", "ckpt-20.index", "checkpoint", "config.gin",
            "operative_config.gin"} <= files
    with open(os.path.join(trained_dir, "config.gin")) as f:
        assert "Schedule.train_steps = 20" in f.read()  # As gin writes it, module or not.
    with open(os.path.join(trained_dir, "operative_config.gin")) as f:
        assert "RegressionTask.learning_rate = 0.1" in f.read()  # A default, recorded.
    train = scalars(os.path.join(trained_dir, "train"))
    for tag in ("loss", "mae", "learning_rate", "steps_per_second"):
        assert set(train[tag]) == {10, 20}, tag
    assert "operative_config" in train


def test_eval_mode_evaluates_the_latest_checkpoint(trained_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained_dir, model_dir)
    result = run_ctl("--mode=eval", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}")
    assert result.returncode == 0, result.stderr
    evals = scalars(os.path.join(model_dir, "eval"))
    assert evals["examples"] == {20: 10.0}
    assert "eval | step:     20" in result.stdout
    # The checkpoint also holds the train input's position, which evaluation does not read:
    # no TensorFlow warning about unrestored values at exit.
    assert "unrestored values" not in result.stdout + result.stderr


def test_train_and_eval_resumes_and_evaluates_at_intervals(trained_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained_dir, model_dir)
    result = run_ctl("--mode=train_and_eval", f"--model_dir={model_dir}",
                     f"--gin_file={TEST_GIN}", "--gin_bindings=ctl.Schedule.train_steps=40")
    assert result.returncode == 0, result.stderr
    assert "restored model from" in result.stdout and "ckpt-20" in result.stdout
    # Step 20, a multiple of eval_interval that `--mode=train` did not evaluate, is evaluated first.
    assert set(scalars(os.path.join(model_dir, "eval"))["loss"]) == {20, 30, 40}
    assert set(scalars(os.path.join(model_dir, "train"))["loss"]) == {10, 20, 30, 40}
    assert "train | step:     30" in result.stdout  # One log line per loop.


@pytest.mark.parametrize("loop", ["True", "False"])
def test_mirrored_over_two_logical_cpus(tmp_path, loop):
    result = run_ctl("--mode=train_and_eval", f"--model_dir={tmp_path}", f"--gin_file={TEST_GIN}",
                     "--strategy=mirrored", "--cpu_replicas=2",
                     f"--gin_bindings=ctl.Trainer.use_tf_while_loop={loop}",
                     "--gin_bindings=RegressionTask.flavor='tf_keras'")
    assert result.returncode == 0, result.stderr
    assert "setup | --strategy=mirrored: 2 replica(s) on " in result.stdout
    assert "device:CPU:1" in result.stdout
    evals = scalars(os.path.join(tmp_path, "eval"))
    assert evals["examples"][20] == 10.0
    # Two replicas of half a batch each take the steps one device takes on the whole batch.
    alone = run_ctl("--mode=train_and_eval", f"--model_dir={tmp_path / 'alone'}",
                    f"--gin_file={TEST_GIN}", "--gin_bindings=RegressionTask.flavor='tf_keras'")
    assert alone.returncode == 0, alone.stderr
    expected = scalars(os.path.join(tmp_path, "alone", "eval"))["loss"]
    assert expected[20] < 0.5 * expected[10] < 0.5 * untrained_eval_loss()
    assert evals["loss"] == pytest.approx(expected, rel=1e-4)


def untrained_eval_loss():
    """RegressionTask's eval loss before any step (zero weights): the mean squared target."""
    _, targets = regression_data(10, seed=1)
    return float(np.mean(np.square(targets)))


def _bad_gin_file(tmp_path, text):
    path = tmp_path / "bad.gin"
    path.write_text(text)
    return f"--gin_file={path}"


BAD_INPUTS = {
    "unknown mode": (lambda d, t: ["--mode=trian", f"--model_dir={d}", f"--gin_file={TEST_GIN}"],
                     "--mode=trian"),
    "missing gin file": (lambda d, t: ["--mode=train", f"--model_dir={d}", "--gin_file=nope.gin"],
                         "nope.gin"),
    "unparsable gin file": (lambda d, t: ["--mode=train", f"--model_dir={d}",
                                          _bad_gin_file(t, "import tests.tasks\nfoo = = 3\n")],
                            "cannot parse gin config"),
    "unknown gin binding": (lambda d, t: ["--mode=train", f"--model_dir={d}", f"--gin_file={TEST_GIN}",
                                          "--gin_bindings=ctl.Schedule.train_stepz=3"],
                            "train_stepz"),
    "REQUIRED macro unset": (lambda d, t: ["--mode=train", f"--model_dir={d}", f"--gin_file={TEST_GIN}",
                                           "--gin_bindings=STEPS=%gin.REQUIRED",
                                           "--gin_bindings=ctl.Schedule.train_steps=%STEPS"],
                             "REQUIRED"),
    "REQUIRED parameter unset": (lambda d, t: ["--mode=train", f"--model_dir={d}",
                                               _bad_gin_file(t, "import tests.tasks\n"
                                                             "ctl.Experiment.task = @RegressionTask()\n")],
                                 "train_steps"),
    "bad schedule value": (lambda d, t: ["--mode=train", f"--model_dir={d}", f"--gin_file={TEST_GIN}",
                                         "--gin_bindings=ctl.Schedule.steps_per_loop=0"],
                           "steps_per_loop (0) must be a positive integer"),
    "mismatched checkpoint": (lambda d, t: ["--mode=train_and_eval", f"--model_dir={d}",
                                            f"--gin_file={TEST_GIN}",
                                            "--gin_bindings=ctl.Schedule.train_steps=40",
                                            "--gin_bindings=RegressionTask.flavor='tf_keras'",
                                            "--gin_bindings=PredictionsTask.batch_size=3",
                                            "--gin_bindings=ctl.Experiment.task=@WideTask()"],
                              "holds a checkpoint of a different model"),
    "stray argument": (lambda d, t: ["--mode=train", f"--model_dir={d}", "train"],
                       "unexpected arguments"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_clear_line_and_damages_nothing(case, trained_dir, tmp_path):
    args, message = BAD_INPUTS[case]
    before = snapshot(trained_dir)
    result = run_ctl(*args(trained_dir, tmp_path))
    assert result.returncode == 2, result.stderr
    lines = ctl_stderr_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ctl.run: error: ") and message in lines[0], lines[0]
    assert snapshot(trained_dir) == before


def test_unwritable_model_dir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = run_ctl("--mode=train", f"--model_dir={blocker}/run", f"--gin_file={TEST_GIN}")
    assert result.returncode == 2
    lines = ctl_stderr_lines(result.stderr)
    assert len(lines) == 1 and "cannot write to --model_dir" in lines[0], result.stderr
    assert blocker.read_text() == "not a directory"


def test_eval_without_checkpoint_refuses(tmp_path):
    result = run_ctl("--mode=eval", f"--model_dir={tmp_path}", f"--gin_file={TEST_GIN}")
    assert result.returncode == 2
    lines = ctl_stderr_lines(result.stderr)
    assert len(lines) == 1 and "holds no checkpoint" in lines[0], result.stderr
    assert os.listdir(tmp_path) == []
