"""A Model Garden experiment's `trainer` and `runtime` settings under ctl: every field has an entry
(ctl/adapters/model_garden_settings.py), each is honoured or refused in one line, a setting of yours
wins over the experiment's and the run's start says where each came from; in-process, on the
shipped config's tiny `image_classification` (a ResNet-10 at depth 0.25 on 32x32 JPEGs)."""

import dataclasses
import json
import os
import types

import gin
import pytest
import tensorflow as tf

import ctl
from ctl.adapters import model_garden_settings
from ctl.hooks.best import BestCheckpoint, best_record
from ctl.faults.nan_guard import NonFiniteLoss
from ctl.model_dir import ModelDir
from tests.support.env import ROOT
from tests.support.in_process import run_ctl_in_process
from tests.support.reading import ctl_stderr_lines, scalars

SMALL = {"task": {"model": {"backbone": {"type": "resnet", "resnet": {
    "model_id": 10, "depth_multiplier": 0.25}}},
    "train_data": {"global_batch_size": 4, "aug_crop": False, "aug_rand_hflip": False},
    "validation_data": {"global_batch_size": 4, "drop_remainder": False}},
    "trainer": {"optimizer_config": {"optimizer": {"type": "sgd"}, "learning_rate": {
        "type": "constant", "constant": {"learning_rate": 0.05}}}}}


def data(tmp_path):
    from experiments.model_garden_data import image_classification_data

    return image_classification_data(data_dir=str(tmp_path / "data"), train_examples=32,
                                     eval_examples=16)


def task(tmp_path, *overrides):
    import official.vision.registry_imports  # noqa: F401

    return ctl.ModelGardenTask(experiment="image_classification",
                               params_override=[data(tmp_path), SMALL, *overrides])


def trainer_config_classes():
    from official.core import config_definitions
    from official.recommendation.ranking.configs import config as ranking

    return [("trainer", config_definitions.TrainerConfig), ("runtime", config_definitions.RuntimeConfig),
            ("trainer", ranking.TrainerConfig)]


def test_every_trainer_and_runtime_field_has_an_entry():
    # A field a new Model Garden release adds fails here until the table says what ctl does with it.
    for section, cls in trainer_config_classes():
        table = model_garden_settings._table(section, cls())
        missing = [field.name for field in dataclasses.fields(cls) if field.name not in table]
        assert not missing, f"{cls.__module__}.{cls.__name__}: no entry for {missing}"
        assert all(entry.does for entry in table.values())


def test_a_field_without_an_entry_is_refused_when_set_and_accepted_at_its_default():
    from official.core import config_definitions

    @dataclasses.dataclass
    class NewTrainerConfig(config_definitions.TrainerConfig):
        new_knob: int = 0

    def params(**trainer):  # An experiment whose trainer config is the newer class.
        return types.SimpleNamespace(trainer=NewTrainerConfig(**trainer),
                                     runtime=config_definitions.RuntimeConfig())

    model_garden_settings.check("image_classification", params())  # At its default: accepted.
    assert model_garden_settings.settings(params())  # The fields with entries still map.
    with pytest.raises(ctl.UserError, match=r"trainer.new_knob=3 is refused: ctl has no entry for "
                                            r"this field of NewTrainerConfig"):
        model_garden_settings.check("image_classification", params(new_knob=3))


@pytest.mark.parametrize("override, message", [
    ({"runtime": {"num_packs": 2}}, "runtime.num_packs=2 is refused: ctl has nothing for it"),
    ({"trainer": {"recovery_max_trials": -1}}, "trainer.recovery_max_trials=-1 is refused"),
    ({"trainer": {"allow_tpu_summary": True}}, "trainer.allow_tpu_summary=True is refused"),
    ({"trainer": {"eval_tf_function": False}}, "trainer.eval_tf_function=False is refused: differs"),
    ({"runtime": {"mixed_precision_dtype": "int8"}}, "runtime.mixed_precision_dtype='int8' is refused"),
    ({"runtime": {"distribution_strategy": "gpus"}}, "runtime.distribution_strategy='gpus' is refused"),
])
def test_a_setting_ctl_has_nothing_for_is_refused_in_one_line_naming_the_field(override, message):
    import official.vision.registry_imports  # noqa: F401

    with pytest.raises(ctl.UserError, match="ctl.ModelGardenTask: experiment 'image_classification': "
                       + message.replace("(", r"\(").replace("[", r"\[")):
        ctl.ModelGardenTask(experiment="image_classification", params_override=[SMALL, override])


YAML_TRAINER = {"trainer": {
    "train_steps": 6, "steps_per_loop": 2, "summary_interval": 2, "checkpoint_interval": 2,
    "validation_interval": 4, "validation_steps": 2, "max_to_keep": 7,
    "continuous_eval_timeout": 120, "best_checkpoint_export_subdir": "best_ckpt",
    "best_checkpoint_eval_metric": "validation_loss", "best_checkpoint_metric_comp": "lower",
    "recovery_max_trials": 2, "loss_upper_bound": 50.0, "recovery_begin_steps": 1},
    "runtime": {"mixed_precision_dtype": "bfloat16", "run_eagerly": False}}


def test_the_experiments_settings_become_ctls_and_the_start_names_their_source(tmp_path):
    gin.clear_config()
    experiment = ctl.Experiment(task=task(tmp_path, YAML_TRAINER))
    schedule = experiment.schedule
    assert (schedule.train_steps, schedule.steps_per_loop, schedule.summary_interval,
            schedule.checkpoint_interval, schedule.eval_interval, schedule.eval_steps,
            schedule.max_checkpoints) == (6, 2, 2, 2, 4, 2, 7)
    faults = experiment.fault_tolerance
    assert (faults.nan_policy, faults.max_recoveries, faults.loss_upper_bound,
            faults.loss_bound_from_step, faults.healthy_interval) == ("recover", 2, 50.0, 1, 6)
    assert experiment.trainer_args["mixed_precision"] == "mixed_bfloat16"
    assert experiment.continuous_eval.timeout == 120
    best = [hook for hook in experiment.hooks if isinstance(hook, BestCheckpoint)]
    assert [(b.metric, b.higher_is_better, b.export_subdir) for b in best] == [
        ("loss", False, "best_ckpt")]
    assert ("ctl.Schedule.train_steps = 6  (the experiment's trainer.train_steps)"
            in experiment.sources)
    assert ("ctl.Trainer.mixed_precision = 'mixed_bfloat16'  (the experiment's "
            "runtime.mixed_precision_dtype)" in experiment.sources)
    # The same Experiment made again (a run adds its hooks with dataclasses.replace): the same.
    again = dataclasses.replace(experiment, hooks=experiment.hooks)
    assert again.sources == experiment.sources and again.schedule == schedule
    assert again.hooks == experiment.hooks


def test_a_gin_binding_or_a_python_value_wins_over_the_experiments_and_is_named(tmp_path):
    gin.clear_config()
    gin.bind_parameter("ctl.Schedule.steps_per_loop", 3)
    gin.bind_parameter("ctl.Schedule.summary_interval", 3)
    gin.bind_parameter("ctl.Trainer.mixed_precision", None)
    try:
        experiment = ctl.Experiment(task=task(tmp_path, YAML_TRAINER))
    finally:
        gin.clear_config()
    assert experiment.schedule.steps_per_loop == 3 and experiment.schedule.train_steps == 6
    assert "mixed_precision" not in experiment.trainer_args  # Gin's None reaches the Trainer.
    assert ("ctl.Schedule.steps_per_loop = 3  (your setting; the experiment's "
            "trainer.steps_per_loop = 2 is not used)" in experiment.sources)
    assert any(line.startswith("ctl.Trainer.mixed_precision = None  (your setting")
               for line in experiment.sources), experiment.sources
    # In Python: a value other than ctl's default is yours; ctl's default takes the experiment's.
    experiment = ctl.Experiment(task=task(tmp_path, YAML_TRAINER),
                                schedule=ctl.Schedule(train_steps=10, max_checkpoints=5))
    assert (experiment.schedule.train_steps, experiment.schedule.steps_per_loop,
            experiment.schedule.max_checkpoints) == (10, 2, 7)


def test_bfloat16_from_the_yaml_builds_and_trains_the_model_in_bfloat16(tmp_path):
    gin.clear_config()
    experiment = ctl.Experiment(task=task(tmp_path, YAML_TRAINER))
    trainer = ctl.Trainer(experiment.task, **experiment.trainer_args)
    policies = {layer.dtype_policy.name for layer in trainer.model.layers
                if layer.trainable_weights}
    assert policies == {"mixed_bfloat16"}, policies
    convolution = next(layer for layer in trainer.model.layers
                       if layer.trainable_weights and layer.compute_dtype == "bfloat16")
    assert convolution.variable_dtype == "float32"
    logs = trainer.train(tf.constant(1))
    assert int(trainer.global_step.numpy()) == 1 and tf.math.is_finite(logs["loss"])
    import tf_keras

    assert tf_keras.mixed_precision.global_policy().name == "float32"  # Put back after the build.


@pytest.mark.slow  # Trains a Model Garden model.
def test_a_loop_loss_above_the_yamls_bound_stops_the_run_naming_the_bound(tmp_path):
    gin.clear_config()
    bound = {"trainer": {"train_steps": 4, "steps_per_loop": 2, "summary_interval": 2,
                         "checkpoint_interval": 2, "loss_upper_bound": 1e-3,
                         "recovery_begin_steps": 2}}
    with pytest.raises(NonFiniteLoss, match=r"the training loss \([0-9.]+\) is above "
                       r"ctl.FaultTolerance.loss_upper_bound \(0.001, Model Garden's "
                       r"trainer.loss_upper_bound\) in the loop ending at step 2"):
        ctl.run_experiment("train", str(tmp_path / "run"),
                           experiment=ctl.Experiment(task=task(tmp_path, bound)))


def write_gin(tmp_path, yaml_text, *lines):
    (tmp_path / "settings.yaml").write_text(yaml_text)
    path = tmp_path / "experiment.gin"
    path.write_text("import official.vision.registry_imports\n"
                    "ctl.Experiment.task = @ctl.ModelGardenTask()\n"
                    "ctl.ModelGardenTask.experiment = 'image_classification'\n"
                    f"ctl.ModelGardenTask.config_files = [{str(tmp_path / 'settings.yaml')!r}]\n"
                    f"ctl.ModelGardenTask.params_override = [{data(tmp_path)!r}, {SMALL!r}]\n"
                    + "".join(f"{line}\n" for line in lines))
    return str(path)


YAML = """
trainer:
  train_steps: 6
  steps_per_loop: 2
  summary_interval: 2
  checkpoint_interval: 2
  validation_interval: 2
  validation_steps: 2
  max_to_keep: 10
  best_checkpoint_export_subdir: best_ckpt
  best_checkpoint_eval_metric: accuracy
  best_checkpoint_metric_comp: higher
runtime:
  mixed_precision_dtype: bfloat16
"""


@pytest.mark.slow  # Trains a Model Garden model.
def test_a_gin_files_model_garden_task_runs_as_its_yaml_says(tmp_path):
    # Through `python -m ctl.run`: no ctl.Schedule in the gin file; the YAML's steps, intervals,
    # checkpoints kept, best checkpoint (Model Garden's layout and ctl's) and summaries subdir.
    model_dir = tmp_path / "run"
    code, out, err = run_ctl_in_process([
        "--mode=train_and_eval", f"--model_dir={model_dir}", f"--gin_file={write_gin(tmp_path, YAML)}"])
    assert code == 0, err[-3000:]
    assert "ctl.Schedule.checkpoint_interval = 2  (the experiment's trainer.checkpoint_interval)" in out
    state = tf.train.get_checkpoint_state(str(model_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-2", "ckpt-4", "ckpt-6"]
    evaluated = scalars(str(model_dir / "eval"))["accuracy"]
    assert sorted(evaluated) == [2, 4, 6]
    assert sorted(scalars(str(model_dir / "validation"))["accuracy"]) == [2, 4, 6]
    assert "validation_loss" in scalars(str(model_dir / "validation"))
    info = json.loads((model_dir / "best_ckpt" / "info.json").read_text())
    best_step = info["best_ckpt_global_step"]
    assert info["accuracy"] == max(evaluated.values()) == evaluated[best_step]
    assert tf.train.latest_checkpoint(str(model_dir / "best_ckpt")).endswith(f"best_ckpt-{best_step}")
    assert best_record(ModelDir(str(model_dir)))["step"] == best_step
    from official.core import train_utils  # Model Garden's reader of its best checkpoint.

    exporter = train_utils.BestCheckpointExporter(str(model_dir / "best_ckpt"), "accuracy", "higher")
    assert exporter.best_ckpt_logs["best_ckpt_global_step"] == best_step
    params = (model_dir / "params.yaml").read_text()
    assert "mixed_precision_dtype: bfloat16" in params and "train_steps: 6" in params


def test_a_model_garden_setting_refused_through_ctl_run_ends_in_one_line(tmp_path):
    model_dir = tmp_path / "run"
    code, _, err = run_ctl_in_process([
        "--mode=train", f"--model_dir={model_dir}",
        f"--gin_file={write_gin(tmp_path, 'runtime: {num_packs: 2}')}"])
    lines = ctl_stderr_lines(err)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "runtime.num_packs=2 is refused" in lines[0]
    assert not model_dir.exists()


def test_the_docs_table_lists_every_field_with_what_ctl_does():
    with open(os.path.join(ROOT, "docs", "how-to", "model-garden.md")) as f:
        text = f.read()
    for section, cls in trainer_config_classes()[:2]:
        for field in dataclasses.fields(cls):
            assert f"| `{section}.{field.name}` |" in text, f"{section}.{field.name}"


@pytest.mark.slow  # Trains a Model Garden model.
def test_ctls_sidecar_evaluates_a_model_dir_model_gardens_trainer_wrote(tmp_path):
    # Model Garden's train_lib trains 4 steps (a checkpoint every 2, no ctl marker); ctl's sidecar
    # evaluates both checkpoints and ends once no new one came for its timeout after step 4.
    from official.core import task_factory, train_lib

    gin.clear_config()
    model_dir = str(tmp_path / "garden")
    garden = task(tmp_path, {"trainer": {"train_steps": 4, "steps_per_loop": 2,
                                         "checkpoint_interval": 2, "summary_interval": 2}})
    train_lib.run_experiment(
        distribution_strategy=tf.distribute.get_strategy(),
        task=task_factory.get_task(garden.params.task, logging_dir=model_dir), mode="train",
        params=garden.params, model_dir=model_dir)
    result = ctl.run_experiment("continuous_eval", model_dir, experiment=ctl.Experiment(
        task=garden, continuous_eval=ctl.ContinuousEval(timeout=1.0)))
    assert result["step"] == 4
    assert sorted(scalars(os.path.join(model_dir, "eval"))["accuracy"]) == [2, 4]
