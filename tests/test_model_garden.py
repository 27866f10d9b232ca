"""`ctl.ModelGardenTask`: Model Garden's image-classification experiment under ctl, and under
Model Garden's own `train_lib` in the same model dir, in both directions. (Both shipped Model Garden
configs also run through the CLI in tests/test_comforts.py's smoke test of every config.)"""

import json
import os
import re
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.adapters import model_garden
from ctl.core import checkpoint_contents
from tests.support.env import ROOT
from tests.support.in_process import run_ctl_in_process
from tests.support.processes import run_ctl
from tests.support.reading import ctl_stderr_lines, scalars
from tests.support.strategies import mirrored

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


def train_with_ctl(task, model_dir, steps, seed=None):
    """Returns the `Weights` of the run (seeded with `ctl.FaultTolerance.seed`, if given)."""
    weights = Weights()
    schedule = ctl.Schedule(train_steps=steps, steps_per_loop=2, checkpoint_interval=2)
    ctl.run_experiment("train", str(model_dir), experiment=ctl.Experiment(
        task=task, schedule=schedule, hooks=[weights],
        fault_tolerance=ctl.FaultTolerance(seed=seed)))
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
    # Restores Model Garden's checkpoint, seeded as `python -m ctl.train` runs: its dropout layers
    # draw from generators whose state Model Garden's checkpoint does not hold (they start from
    # the seed; a line says so).
    ctl_run = train_with_ctl(task, model_dir, 3 * STEPS, seed=1)
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


class Backbone(ctl.hooks.Hook):
    """The backbone's weights as the run ended."""

    trained = None

    def on_trial_close(self, unused_logs):
        self.trained = [w.numpy() for w in self.run.model.backbone.weights]


@pytest.mark.slow  # A Model Garden training: tens of seconds.
def test_model_gardens_init_checkpoint_modules_reads_the_backbone_of_a_ctl_checkpoint(tmp_path):
    # Model Garden's trainer holds the model's `checkpoint_items` (the classifier's `backbone`) at
    # its checkpoint's top level, where a fine-tune's `init_checkpoint_modules: backbone` reads it
    # (`tf.train.Checkpoint(backbone=...)`, every variable matched): ctl's checkpoint holds it too.
    from ctl.core import checkpointing
    from ctl.model_dir import ModelDir

    task = configured_task(tmp_path / "data")
    backbone = Backbone()
    ctl.run_experiment("train", str(tmp_path / "run"), experiment=ctl.Experiment(
        task=task, schedule=ctl.Schedule(train_steps=2, steps_per_loop=2), hooks=[backbone]))
    path = tf.train.latest_checkpoint(str(tmp_path / "run"))
    roots = checkpoint_contents.SavedGraph(tf.train.load_checkpoint(path)).root_children()
    assert {"global_step", "model", "optimizer", "backbone"} <= set(roots), roots
    params = model_garden.experiment_config("image_classification", params_override=[
        task.params.as_dict(), {"task": {"init_checkpoint": str(tmp_path / "run"),
                                         "init_checkpoint_modules": "backbone"}}])
    garden = model_garden.garden_task(params, logging_dir=str(tmp_path / "garden"))
    model = garden.build_model()
    garden.initialize(model)  # Model Garden's own: raises if a backbone variable is not there.
    assert_same_weights([w.numpy() for w in model.backbone.weights], backbone.trained)
    # A checkpoint of an older ctl, without the items, still restores (the same variables,
    # under `model`), and the one with them holds the model's values under `backbone/`.
    step = tf.Variable(0, dtype=tf.int64)
    older = checkpoint_contents.build_checkpoint(step, model, garden.create_optimizer(
        params.trainer.optimizer_config, params.runtime))
    written = tf.train.CheckpointManager(older, str(tmp_path / "older"), 1).save(0)
    again = ctl.ModelGardenTask(experiment="image_classification",
                                params_override=[params.as_dict()])
    fresh = again.build_model()
    items = again.checkpoint_items(fresh)
    assert list(items) == ["backbone"]
    checkpoint = checkpoint_contents.build_checkpoint(
        tf.Variable(5, dtype=tf.int64), fresh, again.build_optimizer(), items=items)
    checkpointing.restore(checkpoint, written, ModelDir(str(tmp_path / "older")))
    assert_same_weights([w.numpy() for w in fresh.weights], [w.numpy() for w in model.weights])


def test_a_tasks_checkpoint_items_may_not_take_ctls_names():
    with pytest.raises(ctl.UserError, match=r"checkpoint_items\(model\) names \['model'\]"):
        checkpoint_contents.build_checkpoint(tf.Variable(0), tf.Module(), None,
                                             items={"model": tf.Module()})


# Model Garden's `mock` experiment: its aggregation reduces a `loss` of its own (the sum over
# steps), beside the eval loss's mean that its trainer calls `validation_loss`.
MOCK = {"trainer": {
    "train_steps": 4, "steps_per_loop": 2, "summary_interval": 2, "checkpoint_interval": 2,
    "validation_interval": 2, "validation_steps": 3, "best_checkpoint_export_subdir": "best_ckpt",
    "best_checkpoint_eval_metric": "acc", "best_checkpoint_metric_comp": "higher",
    "optimizer_config": {"optimizer": {"type": "sgd"}, "learning_rate": {
        "type": "constant", "constant": {"learning_rate": 0.1}}}}}


@pytest.mark.slow  # Two trainings, ctl's and Model Garden's.
def test_a_task_that_reduces_its_own_loss_gets_model_gardens_names_in_validation_and_info_json(
        tmp_path):
    from official.core import train_lib
    from official.utils.testing import mock_task  # noqa: F401  (registers `mock`)

    gin.clear_config()
    ctl.run_experiment("train_and_eval", str(tmp_path / "ctl"), experiment=ctl.Experiment(
        task=ctl.ModelGardenTask(experiment="mock", params_override=[MOCK])))
    params = model_garden.experiment_config("mock", params_override=[MOCK])
    train_lib.run_experiment(
        distribution_strategy=tf.distribute.get_strategy(), mode="train_and_eval",
        task=model_garden.garden_task(params, logging_dir=str(tmp_path / "garden")),
        params=params, model_dir=str(tmp_path / "garden"))
    ours, theirs = (scalars(str(tmp_path / name / "validation")) for name in ("ctl", "garden"))
    # Model Garden's own record of the best, and its speed, are its trainer's alone.
    theirs = {name: values for name, values in theirs.items()
              if not name.startswith("best_") and name != "steps_per_second"}
    assert {"loss", "validation_loss", "counter", "acc"} <= set(theirs)
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for name, values in theirs.items():
        assert ours[name] == pytest.approx(values, rel=1e-6), name
    # ctl's own eval/: the task's `loss`, and the mean beside it.
    evaluated = scalars(str(tmp_path / "ctl" / "eval"))
    assert evaluated["loss"] == pytest.approx(theirs["loss"], rel=1e-6)
    assert evaluated["mean_loss"] == pytest.approx(theirs["validation_loss"], rel=1e-6)
    infos = [json.loads((tmp_path / name / "best_ckpt" / "info.json").read_text())
             for name in ("ctl", "garden")]
    assert set(infos[0]) == set(infos[1]), infos
    assert infos[0] == pytest.approx(infos[1], rel=1e-6)


def test_ctl_train_sets_tf_use_legacy_keras_for_a_ranking_experiment_and_refuses_it_off(
        monkeypatch):
    # Before Model Garden's registries use tf.keras (tests/test_model_garden_train.py runs the
    # command): for a ranking experiment only, and a value that turns it off is one line.
    monkeypatch.delenv(model_garden.LEGACY_KERAS, raising=False)
    import official.vision.registry_imports  # noqa: F401

    model_garden.legacy_keras_for("image_classification")
    assert model_garden.LEGACY_KERAS not in os.environ
    model_garden.legacy_keras_for("dcn_criteo")
    assert os.environ[model_garden.LEGACY_KERAS] == "1"
    monkeypatch.setenv(model_garden.LEGACY_KERAS, "0")
    with pytest.raises(ctl.UserError, match=r"^TF_USE_LEGACY_KERAS='0' in the environment, but "
                       r"experiment 'dcn_criteo' is a ranking experiment.*set it to 1\.$"):
        model_garden.legacy_keras_for("dcn_criteo")


def test_an_unknown_experiment_or_override_is_a_user_error():
    # In a gin file, the name is the binding's.
    with pytest.raises(ctl.UserError, match="^ctl.ModelGardenTask.experiment='no/such_experiment' "
                       "is not a registered Model Garden experiment .*import the module that "
                       "registers yours in the gin file"):
        model_garden.experiment_config("no/such_experiment")
    import official.vision.registry_imports  # noqa: F401

    # A typo: the nearest registered names, not "import the module".
    with pytest.raises(ctl.UserError, match=r"^ctl.ModelGardenTask.experiment="
                       r"'retinanet_resnetfpn_cooc' is not a registered Model Garden experiment; "
                       r"did you mean 'retinanet_resnetfpn_coco'"):
        model_garden.experiment_config("retinanet_resnetfpn_cooc")
    # Under python -m ctl.train, the flag's (which imported Model Garden's registries).
    from ctl.adapters import model_garden_command

    with pytest.raises(ctl.UserError, match=r"^--experiment='no/such_experiment' is not one of "
                       r"the \d+ experiments Model Garden's vision, NLP and ranking modules "
                       r"register; check the name"):
        model_garden_command.experiment_params("no/such_experiment", [], None, None, None)

    with pytest.raises(ctl.UserError, match="cannot apply 'task.modle.num_classes=3'"):
        model_garden.experiment_config("image_classification",
                                       params_override="task.modle.num_classes=3")


@pytest.mark.slow  # A fresh interpreter: this one has imported every registry.
def test_ctl_train_imports_only_the_registries_up_to_the_experiments(tmp_path):
    # A vision experiment's start imports what official.vision.train imports, not NLP's modules
    # too; an unknown name is still held against every registry's names.
    code = (
        "import sys; from ctl.adapters import model_garden as m; "
        "m.import_registries('image_classification'); "
        "print(sorted(n for n in m.REGISTRIES if n in sys.modules)); "
        "print(m.unknown_experiment('bert/sqaud', m.FLAG_EXPERIMENT))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    imported, said = result.stdout.splitlines()[-2:]
    assert imported == repr(["official.vision.registry_imports"]), imported
    assert "did you mean 'bert/squad'" in said, said


@pytest.mark.slow  # A python -m ctl.train process.
def test_ctl_train_names_its_flag_for_an_unknown_experiment(tmp_path):
    # Model Garden's own command, with the module name changed and a typo: the line names the
    # flag the user wrote (not the gin binding) and the nearest registered names.
    model_dir = tmp_path / "run"
    result = run_ctl("--experiment=retinanet_resnetfpn_cooc", "--mode=train",
                     f"--model_dir={model_dir}", module="ctl.train", timeout=600)
    lines = ctl_stderr_lines(result.stderr)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(
        "ctl.train: error: --experiment='retinanet_resnetfpn_cooc' is not a registered Model "
        "Garden experiment; did you mean 'retinanet_resnetfpn_coco'"), lines
    assert not model_dir.exists()


def test_ctl_train_refuses_a_stray_argument_in_one_line(capsys):
    """`python -m ctl.train`'s main in this process: every setting is a flag."""
    from ctl import train

    with pytest.raises(SystemExit) as ended:
        train.main(["ctl.train", "retina.yaml"])
    assert ended.value.code == 2
    assert capsys.readouterr().err == (
        "ctl.train: error: unexpected arguments ['retina.yaml']; every setting is a --flag.\n")


# A Model Garden experiment's mistakes through `python -m ctl.run`: one line naming the experiment,
# the setting and the fix, exit status 2, before any step (the model dir not created).
SMALL_CLASSIFIER = ("task.model.input_size=[32, 32, 3],task.model.backbone.resnet.model_id=10,"
                    "task.model.backbone.resnet.depth_multiplier=0.25,"
                    "task.train_data.global_batch_size=4,task.validation_data.global_batch_size=4,"
                    "trainer.optimizer_config.optimizer.type=sgd,"
                    "trainer.optimizer_config.learning_rate.type=constant")


def test_an_ema_optimizer_gets_its_shadow_copy_of_the_model():
    # Model Garden's trainer makes the averages of an `ema` optimizer (ResNet-RS's) from the
    # model before the first update; without them the update fails ('NoneType' is not iterable).
    import official.vision.registry_imports  # noqa: F401

    task = ctl.ModelGardenTask(experiment="image_classification", params_override=[
        SMALL_CLASSIFIER, {"trainer": {"optimizer_config": {"ema": {"average_decay": 0.5, "dynamic_decay": False}}}}])
    model = task.build_model()
    optimizer = task.build_optimizer()
    variables = model.trainable_variables
    optimizer.apply_gradients([(tf.ones_like(v), v) for v in variables])
    average = optimizer.get_slot(variables[0], "average")  # Half the weight after one update.
    np.testing.assert_allclose(average.numpy(), 0.5 * variables[0].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # A Model Garden training: tens of seconds.
def test_a_loss_per_example_is_reported_as_the_mean_model_gardens_trainer_reports(tmp_path):
    # ELECTRA's pretraining loss is one per sentence pair (its next-sentence loss is not
    # reduced); Model Garden's trainer reports the mean of its elements (a Keras Mean), as the
    # task's own `total_loss` metric does. ctl's loops take that scalar.
    from bench.model_garden_zoo import data, registry, variants

    registry.import_all()
    experiment = "electra/pretraining"
    task = ctl.ModelGardenTask(experiment=experiment, params_override=variants.overrides(
        experiment, 2) + data.data_overrides(experiment, str(tmp_path)))
    model, optimizer = task.build_model(), task.build_optimizer()
    metrics = task.build_metrics(training=True)
    logs = task.train_step(next(iter(task.build_inputs(training=True))), model, optimizer, metrics)
    assert logs["loss"].shape == ()
    total = {m.name: m for m in metrics}["total_loss"].result()
    assert logs["loss"].numpy() == total.numpy()


def ema_task(data_dir):
    """The shipped config's task with Model Garden's `ema` optimizer (averages: half the weights)."""
    return ctl.ModelGardenTask(experiment="image_classification", params_override=[
        configured_task(data_dir).params.as_dict(),
        {"trainer": {"optimizer_config": {"ema": {"average_decay": 0.5, "dynamic_decay": False}}}}])


@pytest.mark.slow  # A Model Garden training: tens of seconds.
def test_evaluation_uses_an_ema_optimizers_averages_and_training_its_weights(tmp_path):
    # As Model Garden's trainer: its averages swapped into the model for each evaluation only.
    task = ema_task(tmp_path / "data")
    trainer = ctl.Trainer(task)
    trainer.train(tf.constant(1))
    variables = trainer.model.trainable_variables
    trained = [v.numpy() for v in variables]
    averages = [trainer.optimizer.get_slot(v, "average").numpy() for v in variables]
    evaluated = float(trainer.evaluate(tf.constant(-1))["loss"])  # The one eval batch.
    for variable, weight in zip(variables, trained):  # Swapped back: (w + a) - a, rounded.
        np.testing.assert_allclose(variable.numpy(), weight, rtol=1e-6, atol=1e-7)
    raw = float(task.validation_step(next(iter(task.build_inputs(training=False))),
                                     trainer.model, trainer.eval_metrics)["loss"])
    for variable, average in zip(variables, averages):
        variable.assign(average)
    average_loss = float(task.validation_step(next(iter(task.build_inputs(training=False))),
                                              trainer.model, trainer.eval_metrics)["loss"])
    assert abs(average_loss - raw) > 1e-3 * abs(raw)  # Half the weights: another loss.
    assert evaluated == pytest.approx(average_loss, rel=1e-5)


@pytest.mark.slow  # A Model Garden training: tens of seconds.
def test_the_sidecar_evaluates_an_ema_optimizers_averages_as_in_line(tmp_path):
    # The sidecar restores the optimizer's averages too, and evaluates them.
    model_dir = str(tmp_path / "run")
    schedule = ctl.Schedule(train_steps=2, steps_per_loop=2, eval_interval=2, checkpoint_interval=2)
    in_line = ctl.run_experiment("train_and_eval", model_dir, experiment=ctl.Experiment(
        task=ema_task(tmp_path / "data"), schedule=schedule))
    sidecar = ctl.run_experiment("continuous_eval", model_dir, experiment=ctl.Experiment(
        task=ema_task(tmp_path / "data"), schedule=schedule))
    assert sidecar["step"] == 2
    assert sidecar["results"]["loss"] == pytest.approx(float(in_line["loss"]), rel=1e-6)
    assert sidecar["results"]["accuracy"] == float(in_line["accuracy"])


def experiment_gin(tmp_path, experiment, *overrides):
    path = tmp_path / "experiment.gin"
    path.write_text("import official.vision.registry_imports\n"
                    "import official.nlp.configs.experiment_configs\n"
                    "ctl.Experiment.task = @ctl.ModelGardenTask()\n"
                    f"ctl.ModelGardenTask.experiment = {experiment!r}\n"
                    f"ctl.ModelGardenTask.params_override = {list(overrides)!r}\n"
                    "ctl.Schedule.train_steps = 2\nctl.Schedule.steps_per_loop = 1\n")
    return str(path)


def shards(directory, split, count=2):
    """Files named as TFRecord shards (what they hold is not read: a reader would fail on it,
    never wait); the glob that matches them."""
    tf.io.gfile.makedirs(directory)
    for k in range(count):
        with tf.io.gfile.GFile(f"{directory}/{split}-{k:05d}-of-{count:05d}.tfrecord", "w") as f:
            f.write("not a record")
    return f"{directory}/{split}-*-of-{count:05d}.tfrecord"


MISTAKES = {  # name -> (experiment, overrides(tmp_path), mode, what the one line says)
    "a base template without an optimizer": (
        "retinanet", lambda tmp: [], "train",
        "experiment 'retinanet' sets no optimizer (trainer.optimizer_config.optimizer.type is "
        "unset); add one to ctl.ModelGardenTask.params_override"),
    "a learning-rate schedule without its step counts": (
        "bert/sentence_prediction", lambda tmp: [], "train",
        "experiment 'bert/sentence_prediction': Model Garden cannot build its learning rate "
        "(trainer.optimizer_config.learning_rate.polynomial.decay_steps, "
        "trainer.optimizer_config.warmup.polynomial.warmup_steps unset)"),
    "a train input_path that matches nothing": (
        "image_classification",
        lambda tmp: [SMALL_CLASSIFIER, f"task.train_data.input_path={tmp}/no/train-*-of-00002"],
        "train", "experiment 'image_classification': task.train_data.input_path="
        "'{tmp}/no/train-*-of-00002' matches no file; point it at the experiment's TFRecord"),
    "one of a comma list of input files missing, in eval": (
        "image_classification",
        lambda tmp: [SMALL_CLASSIFIER, f"task.train_data.input_path={shards(tmp, 'train')}", {
            "task": {"validation_data": {"input_path": f"{shards(tmp, 'eval')},{tmp}/eval-extra"}}}],
        "train_and_eval", "task.validation_data.input_path='{tmp}/eval-extra' matches no file"),
    "an empty train input_path": (  # Model Garden's reader fails on it (dcn_criteo's default).
        "image_classification", lambda tmp: [SMALL_CLASSIFIER], "train",
        "experiment 'image_classification': task.train_data.input_path is empty, and the task "
        "cannot read its data without it (ValueError: "),
    "an empty validation input_path, in eval": (
        "image_classification",
        lambda tmp: [SMALL_CLASSIFIER, f"task.train_data.input_path={shards(tmp, 'train')}"],
        "train_and_eval",
        "task.validation_data.input_path is empty, and the task cannot read its data without it "
        "(ValueError: "),
    "a comma in an override string": (
        "image_classification", lambda tmp: [f"task.train_data.input_path={tmp}/a,{tmp}/b"], "train",
        "Model Garden read it as a YAML file"),
    "a config Model Garden's validate() refuses": (
        "image_classification",
        lambda tmp: [SMALL_CLASSIFIER, {"task": {"train_data": {"is_training": None}}}], "train",
        "experiment 'image_classification' is refused by Model Garden's config check "
        "('Found inconsistency between key `task.train_data.is_training"),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_model_garden_experiments_mistake_ends_in_one_line(name, tmp_path):
    experiment, overrides, mode, message = MISTAKES[name]
    model_dir = tmp_path / "run"
    code, _, stderr = run_ctl_in_process([
        f"--mode={mode}", f"--model_dir={model_dir}",
        f"--gin_file={experiment_gin(tmp_path, experiment, *overrides(str(tmp_path)))}"])
    lines = ctl_stderr_lines(stderr)
    assert code == 2 and "Traceback" not in stderr and len(lines) == 1, stderr[-2000:]
    assert lines[0].startswith("ctl.run: error: ctl.ModelGardenTask: "), lines
    assert message.format(tmp=tmp_path) in lines[0], lines[0]
    assert not model_dir.exists()


def test_input_paths_are_checked_as_model_garden_reads_them_locally_and_in_a_bucket(
        tmp_path, gcs_dir):
    from official.core import input_reader  # Model Garden's own matching, for comparison.

    import official.vision.registry_imports  # noqa: F401

    for root in (str(tmp_path), gcs_dir):
        sharded, other = shards(f"{root}/data", "train"), shards(f"{root}/data", "eval", 1)
        params = model_garden.experiment_config("image_classification", params_override={
            "task": {"train_data": {"input_path": f"{sharded}, {other}"},
                     "validation_data": {"input_path": [sharded, other.replace("*", "00000")]}}})
        for split in ("train_data", "validation_data"):
            data = getattr(params.task, split)
            model_garden.check_input_path("image_classification", data, f"task.{split}")
            assert input_reader.match_files(data.input_path)
        for missing in (f"{root}/data/train-*-of-00003", f"{root}/nothing/train.tfrecord"):
            params = model_garden.experiment_config("image_classification", params_override={
                "task": {"train_data": {"input_path": [sharded, missing]}}})
            with pytest.raises(ctl.UserError, match=re.escape(
                    f"task.train_data.input_path='{missing}' matches no file")):
                model_garden.check_input_path("image_classification", params.task.train_data,
                                              "task.train_data")


# RetinaNet with its COCO evaluation: the task's validation logs carry a nested `(groundtruths,
# outputs)` pair of dicts per replica for its aggregate_logs.
RETINANET = "retinanet_resnetfpn_coco"


def coco_annotations(pattern, path):
    """A COCO annotation file of the boxes in the tf.Examples of `pattern`: the experiment's
    `annotation_file`, as a real COCO run has one."""
    images, annotations, categories = [], [], set()
    for record in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern)):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        image = int(feature["image/source_id"].bytes_list.value[0])
        height, width = (feature[f"image/{k}"].int64_list.value[0] for k in ("height", "width"))
        images.append({"id": image, "height": height, "width": width})
        corners = zip(*(feature[f"image/object/bbox/{k}"].float_list.value
                        for k in ("xmin", "ymin", "xmax", "ymax")))
        for (x0, y0, x1, y1), label, area in zip(
                corners, feature["image/object/class/label"].int64_list.value,
                feature["image/object/area"].float_list.value):
            categories.add(label)
            annotations.append({
                "id": len(annotations) + 1, "image_id": image, "category_id": label, "iscrowd": 0,
                "bbox": [x0 * width, y0 * height, (x1 - x0) * width, (y1 - y0) * height],
                "area": area})
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": annotations,
                   "categories": [{"id": c} for c in sorted(categories)]}, f)
    return path


def retinanet_overrides(data_dir, steps=2):
    """The zoo's tiny RetinaNet (ResNet-18 at depth 0.25, FPN, 128x128) on its generated
    tf.Examples (8 in the eval set), COCO metrics on against an annotation file of them."""
    from bench.model_garden_zoo import data, variants

    overrides = variants.overrides(RETINANET, steps) + data.data_overrides(RETINANET, str(data_dir))
    evals = overrides[-1]["task"]["validation_data"]["input_path"]
    annotations = coco_annotations(evals, str(data_dir / "eval.json"))
    return overrides + [{"task": {"init_checkpoint": "", "use_coco_metrics": True,
                                  "annotation_file": annotations}}]


class RecordingTask(ctl.ModelGardenTask):
    """RetinaNet's task, recording what its aggregate_logs is handed at each eval step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = []

    def aggregate_logs(self, state, step_logs):
        self.steps.append(step_logs)
        return super().aggregate_logs(state, step_logs)


def evaluated(step_logs):
    """Per image (its source id): the scores of its detections, from every replica."""
    found = {}
    for logs in step_logs:
        for groundtruths, outputs in logs[model_garden_coco_name()]:
            for source, scores in zip(groundtruths["source_id"], outputs["detection_scores"]):
                assert int(source) not in found, f"image {int(source)} aggregated twice"
                found[int(source)] = scores
    return found


def model_garden_coco_name():
    from official.vision.evaluation import coco_evaluator

    return coco_evaluator.COCOEvaluator(annotation_file=None, include_mask=False).name


@pytest.mark.slow
def test_retinanets_coco_evaluation_aggregates_nested_logs_on_default_and_mirrored(tmp_path):
    import official.vision.registry_imports  # noqa: F401

    from bench.model_garden_zoo import compare

    overrides = retinanet_overrides(tmp_path)
    model_dir = str(tmp_path / "run")
    # Step 0 as Model Garden's trainer lays it out (the zoo's): one checkpoint, evaluated twice.
    compare.write_initial_checkpoint(RETINANET, overrides, [model_dir])
    schedule = ctl.Schedule(train_steps=2)
    task = RecordingTask(experiment=RETINANET, params_override=overrides)
    default = ctl.run_experiment("eval", model_dir, experiment=ctl.Experiment(
        task=task, schedule=schedule))
    task_mirrored = RecordingTask(experiment=RETINANET, params_override=overrides)
    mirrored_results = ctl.run_experiment("eval", model_dir, strategy=mirrored(),
                                          experiment=ctl.Experiment(task=task_mirrored,
                                                                    schedule=schedule))
    # COCO's metrics, computed by the task's reduce_aggregated_logs, in both.
    for results in (default, mirrored_results):
        assert {"AP", "AP50", "ARmax100"} <= set(results), sorted(results)
    # Every one of the 8 eval images reached the aggregation once, with its detections, whether
    # one replica or two evaluated it; under MirroredStrategy a step's log holds both replicas'.
    one, two = evaluated(task.steps), evaluated(task_mirrored.steps)
    assert sorted(one) == sorted(two) == list(range(1, 9)), (sorted(one), sorted(two))
    assert {len(logs[model_garden_coco_name()]) for logs in task_mirrored.steps} == {2}
    for image, scores in one.items():
        np.testing.assert_allclose(two[image], scores, rtol=1e-5, atol=1e-6)
    for name in ("AP", "AP50", "ARmax100"):
        assert mirrored_results[name] == pytest.approx(default[name]), name


@pytest.mark.slow
def test_a_ctl_checkpoint_exports_with_model_gardens_export_module_and_serves_the_same(tmp_path):
    """Model Garden's `official.vision.serving.export_saved_model_lib` exports ctl's checkpoint; the
    SavedModel serves what Model Garden's export module serves around the model ctl trained."""
    from official.vision.serving import export_saved_model_lib
    from official.vision.serving import image_classification as serving

    model_dir = str(tmp_path / "run")
    task = configured_task(tmp_path / "data")
    trained = train_with_ctl(task, model_dir, STEPS).trained
    export_dir = str(tmp_path / "export")
    export_saved_model_lib.export_inference_graph(
        input_type="image_tensor", batch_size=3, input_image_size=[32, 32], params=task.params,
        checkpoint_path=tf.train.latest_checkpoint(model_dir), export_dir=export_dir)
    images = tf.constant(np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3)), tf.uint8)
    served = tf.saved_model.load(export_dir).signatures[
        "serving_default"](inputs=images)
    model = task.build_model()
    model.set_weights(trained)
    in_memory = serving.ClassificationModule(params=task.params, model=model, batch_size=3,
                                             input_image_size=[32, 32]).serve(images)
    assert set(served) == set(in_memory) >= {"logits", "probs"}, (set(served), set(in_memory))
    for name in in_memory:
        np.testing.assert_allclose(served[name].numpy(), in_memory[name].numpy(),
                                   rtol=1e-5, atol=1e-6)
    # Not the model at its initial weights: Model Garden's module read ctl's checkpoint.
    fresh = serving.ClassificationModule(params=task.params, model=task.build_model(), batch_size=3,
                                         input_image_size=[32, 32]).serve(images)
    assert not np.allclose(fresh["logits"].numpy(), in_memory["logits"].numpy())
