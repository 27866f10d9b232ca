"""`python -m ctl.run` end to end: modes, outputs and resume (every bad input: test_bad_inputs.py).

A run in a process of its own (`alone`, and Mirrored over two logical CPUs, which a process splits
at its start); evaluating and resuming its checkpoint run the command's main in this process
(`tests/support/in_process.py`: the same flags and output, a TensorFlow import less)."""

import os
import shutil

import numpy as np
import pytest

from tests.support.env import TEST_GIN
from tests.support.in_process import ctl_in_process
from tests.support.processes import run_ctl
from tests.support.reading import scalars
from tests.tasks import regression_data

pytestmark = pytest.mark.slow


# The tests that read `alone` run in one test process (an xdist group), so it runs once.
ALONE = pytest.mark.xdist_group("cli_alone")


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """`python -m ctl.run --mode=train_and_eval` on tests/regression.gin (tf_keras), one device."""
    model_dir = str(tmp_path_factory.mktemp("alone"))
    result = run_ctl("--mode=train_and_eval", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}",
                     "--gin_bindings=RegressionTask.flavor='tf_keras'")
    assert result.returncode == 0, result.stderr
    return model_dir


@ALONE
def test_a_run_writes_checkpoints_configs_and_summaries(alone):
    files = set(os.listdir(alone))
    assert {"ckpt-10.index", "ckpt-20.index", "checkpoint", "config.gin",
            "operative_config.gin"} <= files
    with open(os.path.join(alone, "config.gin")) as f:
        assert "Schedule.train_steps = 20" in f.read()  # As gin writes it, module or not.
    with open(os.path.join(alone, "operative_config.gin")) as f:
        assert "RegressionTask.learning_rate = 0.1" in f.read()  # A default, recorded.
    train = scalars(os.path.join(alone, "train"))
    for tag in ("loss", "mae", "learning_rate", "steps_per_second"):
        assert set(train[tag]) == {10, 20}, tag
    assert "operative_config" in train


def test_eval_mode_evaluates_the_latest_checkpoint(trained_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained_dir(), model_dir)
    result = ctl_in_process("--mode=eval", f"--model_dir={model_dir}", f"--gin_file={TEST_GIN}")
    assert result.returncode == 0, result.stderr
    evals = scalars(os.path.join(model_dir, "eval"))
    assert evals["examples"] == {20: 10.0}
    assert "eval | step:     20" in result.stdout
    # The checkpoint also holds the train input's position, which evaluation does not read:
    # no TensorFlow warning about unrestored values at exit.
    assert "unrestored values" not in result.stdout + result.stderr


def test_train_and_eval_resumes_and_evaluates_at_intervals(trained_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained_dir(), model_dir)
    result = ctl_in_process("--mode=train_and_eval", f"--model_dir={model_dir}",
                            f"--gin_file={TEST_GIN}", "--gin_bindings=ctl.Schedule.train_steps=40")
    assert result.returncode == 0, result.stderr
    assert "restored model from" in result.stdout and "ckpt-20" in result.stdout
    # Step 20, a multiple of eval_interval that `--mode=train` did not evaluate, is evaluated first.
    assert set(scalars(os.path.join(model_dir, "eval"))["loss"]) == {20, 30, 40}
    assert set(scalars(os.path.join(model_dir, "train"))["loss"]) == {10, 20, 30, 40}
    assert "train | step:     30" in result.stdout  # One log line per loop.


@ALONE
@pytest.mark.parametrize("loop", ["True", "False"])
def test_mirrored_over_two_logical_cpus(tmp_path, loop, alone):
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
    expected = scalars(os.path.join(alone, "eval"))["loss"]
    assert expected[20] < 0.5 * expected[10] < 0.5 * untrained_eval_loss()
    assert evals["loss"] == pytest.approx(expected, rel=1e-4)


def untrained_eval_loss():
    """RegressionTask's eval loss before any step (zero weights): the mean squared target."""
    _, targets = regression_data(10, seed=1)
    return float(np.mean(np.square(targets)))
