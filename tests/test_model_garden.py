"""`ctl.ModelGardenTask`: Model Garden's image-classification experiment under ctl, and under
Model Garden's own `train_lib` in the same model dir, in both directions. (Both shipped Model Garden
configs also run through the CLI in tests/test_comforts.py's smoke test of every config.)"""

import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.adapters import model_garden
from tests.support.env import ROOT
from tests.support.reading import scalars

CONFIG = os.path.join(ROOT, "configs", "model_garden_image_classification.gin")
STEPS = 4


def configured_task(data_dir):
    """The shipped config's ModelGardenTask, with its data in `data_dir`."""
    gin.clear_config()
    gin.parse_config_file(CONFIG)
    gin.bind_parameter("image_classification_data.data_dir", str(data_dir))
    gin.bind_parameter("image_classification_data.train_examples", 32)
    gin.bind_parameter("image_classification_data.eval_examples", 16)
    return ctl.ModelGardenTask()


def checkpoint_step(model_dir):
    path = tf.train.latest_checkpoint(model_dir)
    return int(tf.train.load_checkpoint(path).get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))


class Weights(ctl.hooks.Hook):
    """The model's weights as ctl restored them and as its run ended."""

    restored = trained = None

    def on_checkpoint_load(self, unused_path):
        self.restored = [w.numpy() for w in self.run.model.weights]

    def on_trial_close(self, unused_logs):
        self.trained = [w.numpy() for w in self.run.model.weights]


def train_with_ctl(task, model_dir, steps):
    """Returns the `Weights` of the run."""
    weights = Weights()
    schedule = ctl.Schedule(train_steps=steps, steps_per_loop=2, checkpoint_interval=2)
    ctl.run_experiment("train", str(model_dir), experiment=ctl.Experiment(
        task=task, schedule=schedule, hooks=[weights]))
    return weights


def train_with_model_garden(task, model_dir, steps):
    """Model Garden's own trainer and controller (`official.core.train_lib`) on the same config;
    returns the weights of its model when it returns."""
    from official.core import task_factory, train_lib

    params = model_garden.experiment_config("image_classification", params_override=[
        task.params.as_dict(),
        {"trainer": {"train_steps": steps, "steps_per_loop": 2, "checkpoint_interval": 2,
                     "summary_interval": 2, "validation_interval": steps}}])
    model, _ = train_lib.run_experiment(
        distribution_strategy=tf.distribute.get_strategy(),
        task=task_factory.get_task(params.task, logging_dir=str(model_dir)), mode="train",
        params=params, model_dir=str(model_dir))
    return [w.numpy() for w in model.weights]


def assert_same_weights(actual, expected):
    assert len(actual) == len(expected) > 10
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)


@pytest.mark.slow
def test_ctl_and_model_gardens_train_lib_continue_each_other(tmp_path):
    model_dir = tmp_path / "run"
    task = configured_task(tmp_path / "data")
    ctl_trained = train_with_ctl(task, model_dir, STEPS).trained
    assert checkpoint_step(str(model_dir)) == STEPS
    # Model Garden restores ctl's weights: asked for the steps already taken, it
    # returns the model as restored.
    assert_same_weights(train_with_model_garden(task, model_dir, STEPS), ctl_trained)
    garden_trained = train_with_model_garden(task, model_dir, 2 * STEPS)
    assert checkpoint_step(str(model_dir)) == 2 * STEPS
    task = configured_task(tmp_path / "data")
    ctl_run = train_with_ctl(task, model_dir, 3 * STEPS)  # Restores Model Garden's checkpoint.
    assert_same_weights(ctl_run.restored, garden_trained)
    assert checkpoint_step(str(model_dir)) == 3 * STEPS
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    roots = {key.split("/")[0] for key in reader.get_variable_to_shape_map()}
    assert {"global_step", "model", "optimizer"} <= roots
    # The optimizer counted every step, whoever ran it.
    assert int(reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")) == 3 * STEPS
    # Both ran the experiment's optimizer: its constant learning rate (0.05) in every train summary.
    rates = scalars(os.path.join(model_dir, "train"))["learning_rate"]
    assert {2, 8, 12} <= set(rates), rates  # ctl's steps 2 and 12, Model Garden's 8.
    assert all(rate == pytest.approx(0.05) for rate in rates.values()), rates


def test_an_unknown_experiment_or_override_is_a_user_error():
    with pytest.raises(ctl.UserError, match="is not registered with Model Garden's exp_factory"):
        model_garden.experiment_config("no/such_experiment")
    import official.vision.registry_imports  # noqa: F401

    with pytest.raises(ctl.UserError, match="cannot apply 'task.modle.num_classes=3'"):
        model_garden.experiment_config("image_classification",
                                       params_override="task.modle.num_classes=3")
