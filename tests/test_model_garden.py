"""`ctl.ModelGardenTask`: Model Garden's image-classification experiment under ctl, and under
Model Garden's own `train_lib` in the same model dir, in both directions."""

import os

import gin
import pytest
import tensorflow as tf

import ctl
from ctl.adapters import model_garden
from tests.cli import ROOT, run_ctl

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


def train_with_ctl(task, model_dir, steps):
    schedule = ctl.Schedule(train_steps=steps, steps_per_loop=2, checkpoint_interval=2)
    ctl.run_experiment("train", str(model_dir), experiment=ctl.Experiment(task=task,
                                                                           schedule=schedule))


def train_with_model_garden(task, model_dir, steps):
    """Model Garden's own trainer and controller (`official.core.train_lib`) on the same config."""
    from official.core import task_factory, train_lib

    params = model_garden.experiment_config("image_classification", params_override=[
        task.params.as_dict(),
        {"trainer": {"train_steps": steps, "steps_per_loop": 2, "checkpoint_interval": 2,
                     "summary_interval": 2, "validation_interval": steps}}])
    train_lib.run_experiment(
        distribution_strategy=tf.distribute.get_strategy(),
        task=task_factory.get_task(params.task, logging_dir=str(model_dir)), mode="train",
        params=params, model_dir=str(model_dir))


@pytest.mark.slow
def test_ctl_and_model_gardens_train_lib_continue_each_other(tmp_path):
    model_dir = tmp_path / "run"
    task = configured_task(tmp_path / "data")
    train_with_ctl(task, model_dir, STEPS)
    assert checkpoint_step(str(model_dir)) == STEPS
    train_with_model_garden(task, model_dir, 2 * STEPS)  # Restores ctl's checkpoint.
    assert checkpoint_step(str(model_dir)) == 2 * STEPS
    task = configured_task(tmp_path / "data")
    train_with_ctl(task, model_dir, 3 * STEPS)  # Restores Model Garden's checkpoint.
    assert checkpoint_step(str(model_dir)) == 3 * STEPS
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    roots = {key.split("/")[0] for key in reader.get_variable_to_shape_map()}
    assert {"global_step", "model", "optimizer"} <= roots
    # The optimizer counted every step, whoever ran it.
    assert int(reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")) == 3 * STEPS


@pytest.mark.slow
@pytest.mark.parametrize("name", ["model_garden_image_classification.gin",
                                  "model_garden_sentence_prediction.gin"])
def test_model_garden_configs_train_and_evaluate(tmp_path, name):
    result = run_ctl("--mode=train_and_eval", f"--model_dir={tmp_path / 'run'}",
                     f"--gin_file={os.path.join(ROOT, 'configs', name)}",
                     "--gin_bindings=TRAIN_STEPS=40", "--gin_bindings=ctl.Schedule.eval_interval=40",
                     "--gin_bindings=ctl.Schedule.steps_per_loop=20")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " eval | step:     40 | loss: " in result.stdout
    assert checkpoint_step(str(tmp_path / "run")) == 40


def test_an_unknown_experiment_or_override_is_a_user_error():
    with pytest.raises(ctl.UserError, match="is not registered with Model Garden's exp_factory"):
        model_garden.experiment_config("no/such_experiment")
    import official.vision.registry_imports  # noqa: F401

    with pytest.raises(ctl.UserError, match="cannot apply 'task.modle.num_classes=3'"):
        model_garden.experiment_config("image_classification",
                                       params_override="task.modle.num_classes=3")
