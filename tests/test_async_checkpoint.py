"""`ctl.Schedule.async_checkpointing`: the same checkpoints, written in the background."""

import os

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.utils.errors import UserError
from tests.tasks import RegressionTask


def _train(model_dir, strategy, flavor, async_checkpointing, mode="train", hooks=()):
    schedule = ctl.Schedule(
        train_steps=30, steps_per_loop=10, checkpoint_interval=10, eval_interval=20,
        max_checkpoints=5, async_checkpointing=async_checkpointing,
    )
    experiment = ctl.Experiment(task=RegressionTask(flavor=flavor), schedule=schedule,
                                hooks=list(hooks))
    return ctl.run_experiment(mode, str(model_dir), strategy, experiment)


def _values(path):
    return {
        name: tf.train.load_variable(path, name)
        for name, _ in tf.train.list_variables(path)
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and "save_counter" not in name
        and not name.startswith("train_input/")  # The input position: a variant, no array.
        # Attached after TensorFlow's async saver took the checkpoint's objects (docs/faults.md).
        and not name.startswith("train_examples/")
    }


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_async_checkpoints_equal_synchronous_ones(tmp_path, strategy, flavor):
    _train(tmp_path / "sync", strategy, flavor, async_checkpointing=False)
    _train(tmp_path / "async", strategy, flavor, async_checkpointing=True)
    state = tf.train.get_checkpoint_state(str(tmp_path / "async"))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-10", "ckpt-20", "ckpt-30"]
    for step in (10, 20, 30):
        sync = _values(str(tmp_path / "sync" / f"ckpt-{step}"))
        written = _values(str(tmp_path / "async" / f"ckpt-{step}"))
        assert sync.keys() == written.keys()
        assert len(sync) > 3
        for name in sync:
            np.testing.assert_array_equal(sync[name], written[name], err_msg=name)
        assert written["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == step


def test_async_train_and_eval_resumes_from_its_checkpoint(tmp_path):
    model_dir = tmp_path / "run"
    first = _train(model_dir, None, "keras3", async_checkpointing=True, mode="train_and_eval")
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-30")
    # A second run restores step 30: it trains no step, saves nothing, and does not
    # evaluate again (step 30's evaluation is on record); it returns that evaluation.
    seen = []

    class Recorder(ctl.hooks.Hook):
        def on_checkpoint_load(self, path):
            seen.append(("load", os.path.basename(path), self.run.step))

        def on_train_loop_end(self, unused_logs):
            seen.append(("train", self.run.step))

        def on_checkpoint_end(self, path):
            seen.append(("save", os.path.basename(path)))

        def on_eval_end(self, unused_logs):
            seen.append(("eval", self.run.step))

    again = _train(model_dir, None, "keras3", async_checkpointing=True, mode="train_and_eval",
                   hooks=[Recorder()])
    assert seen == [("load", "ckpt-30", 30)]
    assert float(again["loss"]) == pytest.approx(float(first["loss"]))


def test_async_checkpointing_must_be_a_bool():
    with pytest.raises(UserError, match=r"Schedule.async_checkpointing='yes' is a str; bind it to True or False"):
        ctl.Schedule(train_steps=1, async_checkpointing="yes")


def test_checkpoint_hooks_see_the_checkpoint_just_saved_complete(tmp_path):
    """With async saving, on_checkpoint_end gets the new path once its files are written."""
    seen = []

    class Recorder:
        def on_checkpoint_end(self, path):
            seen.append((os.path.basename(path), tf.train.list_variables(path) != []))

    schedule = ctl.Schedule(train_steps=30, steps_per_loop=10, checkpoint_interval=10,
                            eval_interval=None, async_checkpointing=True)
    experiment = ctl.Experiment(task=RegressionTask(), schedule=schedule, hooks=[Recorder()])
    ctl.run_experiment("train", str(tmp_path), None, experiment)
    assert seen == [("ckpt-10", True), ("ckpt-20", True), ("ckpt-30", True)]


def test_eval_hooks_see_the_checkpoint_of_the_step_they_evaluate_complete(tmp_path):
    """The write runs beside the evaluation (it is not waited for when a train stretch
    ends); the eval hooks run once it is complete."""
    seen = []

    class Recorder:
        def bind(self, run):
            self.run = run

        def on_eval_end(self, unused_logs):
            latest = tf.train.latest_checkpoint(str(tmp_path))
            seen.append((self.run.step, os.path.basename(latest),
                         tf.train.load_variable(latest, "global_step/.ATTRIBUTES/VARIABLE_VALUE")))

    schedule = ctl.Schedule(train_steps=30, steps_per_loop=10, checkpoint_interval=10,
                            eval_interval=10, async_checkpointing=True)
    experiment = ctl.Experiment(task=RegressionTask(), schedule=schedule, hooks=[Recorder()])
    ctl.run_experiment("train_and_eval", str(tmp_path), None, experiment)
    assert seen == [(10, "ckpt-10", 10), (20, "ckpt-20", 20), (30, "ckpt-30", 30)]
