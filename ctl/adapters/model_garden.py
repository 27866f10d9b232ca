"""`ctl.ModelGardenTask`: a registered Model Garden experiment, run by ctl unchanged.

    import official.vision.registry_imports        # registers the experiments (in the gin file)
    ctl.Experiment.task = @ctl.ModelGardenTask()
    ctl.ModelGardenTask.experiment = 'resnet_imagenet'       # an exp_factory name
    ctl.ModelGardenTask.config_files = ['my_overrides.yaml']  # optional, applied in order
    ctl.ModelGardenTask.params_override = 'task.train_data.global_batch_size=64'

The experiment's config is built as Model Garden's own `train.py` builds it
(`exp_factory.get_exp_config`, then each YAML file, then `params_override`: a
string of `a.b=v` pairs, a dict, or a list of either, all strict), and its
task (`task_factory.get_task`) provides everything: `build_model`,
`build_inputs` (with `task.train_data` / `task.validation_data`),
`build_losses`, `build_metrics`, `train_step`, `validation_step`,
`aggregate_logs` / `reduce_aggregated_logs`, `initialize`, and the optimizer
(`task.create_optimizer(trainer.optimizer_config, runtime)`). ctl brings its
controller, sidecar, fault tolerance, exports and console; its checkpoints
hold `global_step`, `model` and `optimizer` under those names, and the
model's `checkpoint_items` (`backbone`, `encoder`) at the top level, as Model
Garden's trainer writes them, so either can continue the other's model dir.

The experiment's `trainer` and `runtime` settings are the run's, field by field
(`ctl.adapters.model_garden_settings`: `config_settings()`, which `ctl.Experiment` takes where
you set nothing; a field ctl has nothing for is refused when set), and the model dir gets what
Model Garden's tools read (`ctl.adapters.model_garden_dir`: `params.yaml`, `validation/`; the
best checkpoint's `best_ckpt/`). With an `ema` in the optimizer config (ResNet-RS's), evaluation
uses the optimizer's moving averages, swapped into the model around each evaluation as Model
Garden's trainer does (`averaged_optimizer`).

Mistakes in the experiment's config are the user's to fix and end as one
`UserError` naming the experiment, the setting and the fix, before any step:
an unknown experiment (with the nearest registered names), an override Model
Garden refuses, a config its `validate()` refuses, a `trainer`/`runtime`
setting ctl refuses, an optimizer or learning-rate schedule its optimizer
factory cannot build (the base templates set none; BERT's schedules need their
step counts), and a file the config names that matches nothing (`check_files`:
any field named `input_path`, `*_path`, `*_file`; a file, a glob such as a
sharded `train-*-of-00016`, a comma list, a list, a dict of sources; local or
`gs://`): the task's when it is made, each data config's when its inputs are
built (the modes that read it), where an empty `input_path` the task cannot
build its inputs without is one too (`has_no_input`).

Its exports (ctl's exporters, `--mode=smoke`) carry the signatures of Model
Garden's own export module for the experiment, around ctl's model
(`serving_signatures`, `ctl.adapters.model_garden_serving`); an error the
module raises while it builds them around the model ends in one line.

Model Garden's modules load when the task is built (they take a second or
two); importing `ctl` does not load them.
"""

import difflib
import importlib
import inspect
import os
import re
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import gin
import tensorflow as tf

from ctl.adapters import model_garden_settings
from ctl.adapters.model_garden_dir import ModelGardenFiles
from ctl.utils.errors import UserError, first_line, one_line
from ctl.core.task import ConfigSetting, ServingSignatures, Task, default_serving_signatures

Override = Union[str, Mapping[str, Any]]
# Where a user names the experiment: a gin file's binding, or python -m ctl.train's flag.
GIN_EXPERIMENT = "ctl.ModelGardenTask.experiment"
FLAG_EXPERIMENT = "--experiment"
# The entry of `validation_step` that hands the task's loss to its own aggregation (Model Garden's
# trainer aggregates every entry of the task's logs, its loss too); "loss" is ctl's eval mean.
TASK_LOSS = "model_garden_task_loss"


def experiment_config(experiment: str, config_files: Sequence[str] = (),
                      params_override: Union[Override, Sequence[Override]] = (),
                      named_by: str = GIN_EXPERIMENT):
    """The locked `ExperimentConfig` of a registered experiment, with overrides applied.

    Args:
        experiment: the experiment's `exp_factory` name, e.g. `'resnet_imagenet'`.
        config_files: YAML files applied in order.
        params_override: `a.b=v` pairs in a string, a dict, or a list of either, applied after the files.
        named_by: where the user gave the name, for the message of an unknown one: the gin
            binding (`GIN_EXPERIMENT`) or `python -m ctl.train`'s flag (`FLAG_EXPERIMENT`).

    Raises:
        UserError: an experiment that is not registered, or an override that names no key.
    """
    from official.core import exp_factory
    from official.modeling import hyperparams

    try:
        params = exp_factory.get_exp_config(experiment)
    except LookupError as error:
        raise UserError(unknown_experiment(experiment, named_by)) from error
    overrides = ([params_override] if isinstance(params_override, (str, Mapping))
                 else list(params_override))
    for source in [*config_files, *overrides]:
        if not source:
            continue
        try:
            params = hyperparams.override_params_dict(params, source, is_strict=True)
        except (KeyError, ValueError, AttributeError) as error:
            raise UserError(f"ctl.ModelGardenTask: cannot apply {source!r} to experiment "
                            f"{experiment!r} ({first_line(error, 200)}); "
                            "check the key names.") from error
        except tf.errors.OpError as error:  # Neither `a.b=v` pairs nor a YAML file it can read.
            raise UserError(f"ctl.ModelGardenTask: cannot apply {source!r} to experiment "
                            f"{experiment!r}: Model Garden read it as a YAML file "
                            f"({first_line(error, 200)}); write `a.b=v` pairs whose values hold "
                            "no comma, or give a dict or a YAML file that exists.") from error
    try:
        params.validate()
    except (KeyError, ValueError) as error:
        raise UserError(f"ctl.ModelGardenTask: experiment {experiment!r} is refused by Model "
                        f"Garden's config check ({first_line(error, 200)}); fix it in "
                        "ctl.ModelGardenTask.params_override or config_files.") from error
    params.lock()
    return params


def registered_experiments() -> List[str]:
    """The names registered with Model Garden's `exp_factory` so far (nested names joined by '/').

    `exp_factory` has no lister: `ctl.compat.registered_experiments` reads its registry, and
    raises if that moved.
    """
    from ctl import compat

    return compat.registered_experiments()


def unknown_experiment(experiment: str, named_by: str = GIN_EXPERIMENT) -> str:
    """The one line for an experiment name `exp_factory` does not hold, naming the setting the
    user wrote it in: the nearest names, or how to register one.

    Args:
        experiment: the name given.
        named_by: where it was given: the gin binding (`GIN_EXPERIMENT`) or the flag
            (`FLAG_EXPERIMENT`).
    """
    if named_by == FLAG_EXPERIMENT:  # Near names among all of Model Garden's, not the first module's.
        import_registries()
    names = registered_experiments()
    near = difflib.get_close_matches(experiment, names, n=3, cutoff=0.5)
    where = f"{named_by}={experiment!r}"
    if near:
        return (f"{where} is not a registered Model Garden experiment; did you mean "
                f"{', '.join(repr(name) for name in near)}?")
    if named_by == FLAG_EXPERIMENT:  # python -m ctl.train imported Model Garden's registries.
        return (f"{where} is not one of the {len(names)} experiments Model Garden's vision, NLP "
                "and ranking modules register; check the name, or run an experiment of your own "
                "with python -m ctl.run and a gin file that imports the module registering it "
                "(docs/how-to/model-garden.md).")
    return (f"{where} is not a registered Model Garden experiment ({len(names)} registered here); "
            "check the name, or import the module that registers yours in the gin file (e.g. "
            "`import official.vision.registry_imports`; python -m ctl.train imports Model "
            "Garden's).")


# Model Garden's modules whose import registers its experiments (python -m ctl.train imports them, as
# Model Garden's vision, NLP and ranking train.py do between them); the ranking task's own module
# needs tensorflow_recommenders (the `model_garden` extra) and is imported when its task is built.
REGISTRIES = ("official.vision.registry_imports", "official.nlp.configs.experiment_configs",
              "official.nlp.configs.finetuning_experiments",
              "official.nlp.configs.pretraining_experiments",
              "official.nlp.configs.wmt_transformer_experiments",
              "official.recommendation.ranking.configs.config")


def import_registries(experiment: Optional[str] = None) -> None:
    """Imports the modules that register Model Garden's experiments (`REGISTRIES`), in order.

    Args:
        experiment: stop at the first module after which this experiment is registered (None:
            import them all). A vision experiment's start then imports what Model Garden's
            vision train.py imports, not the NLP modules too (about 2 s here).
    """
    for name in REGISTRIES:
        if experiment is not None and experiment in registered_experiments():
            return
        importlib.import_module(name)


def is_ranking(params) -> bool:
    """Whether `params` is a ranking experiment's (its module needs `TF_USE_LEGACY_KERAS=1`).

    Args:
        params: an `ExperimentConfig`.
    """
    return type(params.task).__module__ == RANKING_CONFIG


RANKING_CONFIG = "official.recommendation.ranking.configs.config"
LEGACY_KERAS = "TF_USE_LEGACY_KERAS"  # Read once, when something first uses tf.keras.
LEGACY_KERAS_ON = ("1", "true", "True")  # The values TensorFlow reads as on.


def legacy_keras_for(experiment: str) -> None:
    """Sets `TF_USE_LEGACY_KERAS=1` in this process when `experiment` is a ranking experiment
    (its task's module, through tensorflow_recommenders, needs tf.keras to be tf_keras), before
    Model Garden's other registries are imported: they use tf.keras, which reads the variable
    once, at its first use. Only the ranking registry is imported here (it uses no tf.keras).

    Args:
        experiment: the experiment's `exp_factory` name (one not registered by the ranking
            registry: nothing is set).

    Raises:
        UserError: the environment sets `TF_USE_LEGACY_KERAS` to a value TensorFlow reads as off.
    """
    from official.core import exp_factory

    importlib.import_module(RANKING_CONFIG)
    try:
        params = exp_factory.get_exp_config(experiment)
    except LookupError:  # Another registry's, or unknown (said once they are all imported).
        return
    if not is_ranking(params):
        return
    value = os.environ.setdefault(LEGACY_KERAS, "1")
    if value not in LEGACY_KERAS_ON:
        raise UserError(f"{LEGACY_KERAS}={value!r} in the environment, but experiment "
                        f"{experiment!r} is a ranking experiment, whose Model Garden module "
                        "(tensorflow_recommenders) needs tf.keras to be tf_keras; unset "
                        f"{LEGACY_KERAS} or set it to 1.")


def check_optimizer(experiment: str, params) -> None:
    """Raises `UserError` unless Model Garden's optimizer factory builds the experiment's
    optimizer and learning-rate schedule (`trainer.optimizer_config`), as its trainer would.

    Args:
      experiment: the experiment's `exp_factory` name, for the message.
      params: its `ExperimentConfig`.
    """
    from official.modeling import optimization

    config = params.trainer.optimizer_config
    if not (hasattr(config, "optimizer") and hasattr(config, "learning_rate")):
        return  # Not the factory's config: the task builds its own (the ranking task's).
    where = "trainer.optimizer_config"
    if config.optimizer.type is None:
        raise UserError(
            f"ctl.ModelGardenTask: experiment {experiment!r} sets no optimizer "
            f"({where}.optimizer.type is unset); add one to ctl.ModelGardenTask.params_override, "
            f"e.g. '{where}.optimizer.type=sgd,{where}.learning_rate.type=constant', or run a "
            "complete experiment built on it.")
    if config.learning_rate.type is None:
        raise UserError(
            f"ctl.ModelGardenTask: experiment {experiment!r} sets no learning rate "
            f"({where}.learning_rate.type is unset); add one to "
            f"ctl.ModelGardenTask.params_override, e.g. '{where}.learning_rate.type=constant'.")
    try:
        optimization.OptimizerFactory(config).build_learning_rate()
    except (TypeError, ValueError) as error:
        unset = [f"{where}.{part}.{getattr(config, part).type}.{name}"
                 for part in ("learning_rate", "warmup") if getattr(config, part).type
                 for name, value in getattr(config, part).get().as_dict().items() if value is None]
        problem = f"{', '.join(unset)} unset" if unset else first_line(error, 200)
        raise UserError(
            f"ctl.ModelGardenTask: experiment {experiment!r}: Model Garden cannot build its "
            f"learning rate ({problem}); set it in ctl.ModelGardenTask.params_override "
            "(step counts such as decay_steps and warmup_steps from ctl.Schedule.train_steps)."
        ) from error


# A field of a config that names a file to read, by its name: `input_path`, `annotation_file`,
# `vocab_file`, `sentencepiece_model_path`, `init_checkpoint`, ... (`tfds_data_dir`, a directory
# TFDS may write, is not one).
_PATH_FIELD = re.compile(r"(^|_)(path|paths|file|files|checkpoint)$")
# Read when a fresh run initializes the model (`initialize`), not by a run that resumes.
_READ_ON_INITIALIZE = ("init_checkpoint",)


def _is_data_config(value) -> bool:
    from official.core import config_definitions

    return isinstance(value, config_definitions.DataConfig)


def path_fields(config, where: str, data: bool = False):
    """(field's name in the experiment, its value) of every field of `config` that names files,
    walking nested configs and lists.

    Args:
        config: a Model Garden config (`params.task`, a data config).
        where: its name in the experiment, e.g. "task".
        data: walk into data configs too (False: skip them; `check_data_files` checks each when
            its inputs are built, in the modes that read it).
    """
    from official.modeling.hyperparams import base_config

    for name in getattr(config, "__dataclass_fields__", {}):
        value = getattr(config, name)
        path = f"{where}.{name}"
        if _is_data_config(value) and not data:
            continue
        if name == "input_path" and getattr(config, "tfds_name", None):
            continue  # Model Garden's own rules for TFDS.
        if isinstance(value, base_config.Config) and not (
                name == "input_path" and not _is_data_config(value)):
            yield from path_fields(value, path, data)
        elif isinstance(value, (list, tuple)) and value and not all(isinstance(v, str) for v in value):
            for index, item in enumerate(value):
                if isinstance(item, base_config.Config):
                    yield from path_fields(item, f"{path}[{index}]", data)
        elif _PATH_FIELD.search(name) and name not in _READ_ON_INITIALIZE and value:
            yield path, value


def check_files(experiment: str, config, where: str, data: bool = False) -> None:
    """Raises `UserError` for the first field of `config` naming a file or pattern that matches
    nothing (`path_fields`): a path, a glob such as `train-*-of-00016`, comma-separated ones, a
    list, a dict of sources; local or in an object store.

    Args:
        experiment: the experiment's name, for the message.
        config: the config to walk (`params.task`, or a data config).
        where: its name in the experiment, e.g. "task" or "task.train_data".
        data: walk into data configs too.
    """
    for name, value in path_fields(config, where, data):
        sources = value.as_dict() if hasattr(value, "as_dict") else {"": value}
        for key, source in sources.items():
            field = f"{name}{'.' + key if key else ''}"
            for pattern in _patterns(source):
                _check_pattern(experiment, field, pattern)


def _check_pattern(experiment: str, field: str, pattern: str) -> None:
    try:
        found = tf.io.gfile.glob(pattern)
    except tf.errors.OpError as error:
        raise UserError(f"ctl.ModelGardenTask: experiment {experiment!r}: {field} "
                        f"{pattern!r} cannot be read ({first_line(error)}); check the "
                        "path and its permissions.") from error
    if not found:
        what = ("the experiment's TFRecord files" if field.split(".")[-1].startswith("input_path")
                else "a file that exists")
        raise UserError(
            f"ctl.ModelGardenTask: experiment {experiment!r}: {field}={pattern!r} matches "
            f"no file; point it at {what} in --params_override or a --config_file "
            "(ctl.ModelGardenTask.params_override; a path, a glob such as "
            "'train-*-of-00016', or several separated by commas).")


def check_input_path(experiment: str, data, where: str) -> None:
    """Raises `UserError` if a file a data config names (its `input_path`, a vocabulary, ...)
    matches nothing (`check_files`).

    Args:
      experiment: the experiment's name, for the message.
      data: a Model Garden `DataConfig` (`task.train_data`, `task.validation_data`).
      where: its name in the experiment, e.g. "task.train_data".
    """
    check_files(experiment, data, where, data=True)


def has_no_input(data) -> bool:
    """Whether a data config names no input: an empty `input_path` and no `tfds_name`. Some
    tasks read none (Model Garden's `mock` makes its own); the others cannot build their inputs.

    Args:
      data: a Model Garden data config (`task.train_data`, `task.validation_data`).
    """
    return (hasattr(data, "input_path") and not data.input_path
            and not getattr(data, "tfds_name", None))


def empty_input_path(experiment: str, where: str, eval_set: Optional[str],
                     error: BaseException) -> str:
    """The one line for a data config whose task could not build its inputs without an
    `input_path` (`has_no_input`): the field, Model Garden's error, and how to set it.

    Args:
      experiment: the experiment's name.
      where: the data config's name in the experiment, e.g. "task.train_data".
      eval_set: the name of the `ctl.ModelGardenTask.eval_sets` entry read, or None.
      error: what the task's `build_inputs` raised.
    """
    if eval_set is not None:
        fix = ("give it files (a path, a glob, or several separated by commas) in "
               "ctl.ModelGardenTask.eval_sets, e.g. "
               f"{{{eval_set!r}: {{'input_path': '/data/eval-*-of-00016'}}}}")
    else:
        task, split = where.split(".")  # "task", "train_data" or "validation_data".
        files = "train" if split == "train_data" else "eval"
        fix = ("set it to the experiment's files (a path, a glob, or several separated by "
               "commas) in --params_override (e.g. "
               f"'{where}.input_path=/data/{files}-*-of-00016') or a --config_file YAML "
               f"({task}: {{{split}: {{input_path: ...}}}}); in a gin file, "
               "ctl.ModelGardenTask.params_override")
    return (f"ctl.ModelGardenTask: experiment {experiment!r}: {where}.input_path is empty, and "
            f"the task cannot read its data without it ({type(error).__name__}: "
            f"{one_line(error, 160)}); {fix}.")


def _patterns(value) -> List[str]:
    """The patterns of a path field as Model Garden reads an `input_path`: a string of
    comma-separated patterns, or a list of such strings."""
    values = [value] if isinstance(value, str) else list(value or [])
    return [part.strip() for each in values for part in str(each).split(",") if part.strip()]


def eval_set_config(experiment: str, params, name: str, override: Override):
    """A named eval set's data config: `task.validation_data` with `override` applied (strictly).

    Args:
      experiment: the experiment's name, for the message.
      params: its `ExperimentConfig`.
      name: the eval set's name (`ctl.ModelGardenTask.eval_sets`).
      override: a dict or a string of `a.b=v` pairs for the fields of `task.validation_data`.

    Raises:
      UserError: a name that is not a non-empty string, or an override naming no field.
    """
    from official.modeling import hyperparams

    if not isinstance(name, str) or not name or "/" in name:
        raise UserError(f"ctl.ModelGardenTask.eval_sets: the name {name!r} must be a non-empty "
                        "string without '/' (it names the set's summaries and metrics).")
    data = params.task.validation_data.replace()  # An unlocked copy.
    try:
        data = hyperparams.override_params_dict(data, override, is_strict=True)
    except (KeyError, ValueError, AttributeError, tf.errors.OpError) as error:
        raise UserError(f"ctl.ModelGardenTask.eval_sets[{name!r}]: cannot apply {override!r} to "
                        f"task.validation_data of experiment {experiment!r} "
                        f"({first_line(error, 200)}); name fields of task.validation_data, "
                        "e.g. {'input_path': '...'}.") from error
    data.lock()
    return data


def garden_task(params, logging_dir: Optional[str] = None):
    """The Model Garden task of an experiment config, as its own trainer builds it.

    Args:
      params: the experiment's config (`experiment_config`).
      logging_dir: where the task may write files (Model Garden's trainer gives its model dir).
    """
    from official.core import task_factory

    if is_ranking(params):
        # The ranking task is not in task_factory: its train.py builds it with the trainer config.
        from official.recommendation.ranking import task as ranking

        return ranking.RankingTask(params.task, trainer_config=params.trainer, logging_dir=logging_dir)
    return task_factory.get_task(params.task, logging_dir=logging_dir)


@tf.autograph.experimental.do_not_convert  # One op: nothing for autograph to convert.
def reported_loss(loss) -> tf.Tensor:
    """The loss Model Garden's trainer reports for a step: the mean of every element of the task's loss.

    A task's steps may return a loss per example (ELECTRA's, with next-sentence labels, is
    one per sentence pair): its trainer feeds it to a Keras `Mean`, which averages every
    element; ctl's loops take one scalar per replica, this one.

    Args:
        loss: the loss the Model Garden task's step returned (a scalar, a per-example vector, a
            Python number).
    """
    return tf.reduce_mean(tf.cast(loss, tf.float32))


def _has_variables(model) -> bool:
    try:
        return bool(model.variables)
    except ValueError:  # A tf_keras Sequential inside that is not built yet (DCN's) says so.
        return False


@gin.configurable(module="ctl")
class ModelGardenTask(Task):
    """Runs the task of a registered Model Garden experiment as a ctl task.

    Args:
        experiment: the registered experiment's `exp_factory` name, e.g. `'resnet_imagenet'` (required); the gin file
            imports the module that registers it.
        config_files: YAML files applied to the experiment's config, in order (as Model Garden's `--config_file`).
        params_override: overrides applied after the files (as `--params_override`): a string of `a.b=v` pairs
            separated by commas, a dict, or a list of either; strict (an unknown key is an error).
        logging_dir: where the task may write files as Model Garden's trainer runs it (the WMT Transformer its
            eval records, SQuAD its predictions; Model Garden passes its model dir); a temporary dir by default.
        eval_sets: named eval sets (`Task.eval_datasets`), e.g. `{'held_out': {'input_path': '...'}}`: each
            name maps to overrides of `task.validation_data` (a dict or `a=v` pairs, strict), and every
            evaluation evaluates each set with the experiment's metrics and aggregation. None (the default):
            the one unnamed set, `task.validation_data`.
    """

    def __init__(self, experiment: str = gin.REQUIRED, config_files: Sequence[str] = (),
                 params_override: Union[Override, Sequence[Override]] = (),
                 logging_dir: Optional[str] = None,
                 eval_sets: Optional[Mapping[str, Override]] = None):
        self.experiment = experiment
        self.params = experiment_config(experiment, config_files, params_override)
        model_garden_settings.check(experiment, self.params)
        check_optimizer(experiment, self.params)
        check_files(experiment, self.params.task, "task")  # Its data configs' when they are read.
        self.eval_sets = {name: eval_set_config(experiment, self.params, name, override)
                          for name, override in (eval_sets or {}).items()}
        # Some tasks write files there as Model Garden's trainer runs them (the WMT
        # Transformer its eval records, SQuAD its predictions): a temporary dir by default.
        self.garden_task = garden_task(self.params, logging_dir or tempfile.mkdtemp(
            prefix="ctl-model-garden-"))
        self._model = None

    def config_settings(self) -> Sequence[ConfigSetting]:
        """The experiment's `trainer` and `runtime` settings under ctl's names
        (`ctl.adapters.model_garden_settings`), each with its field."""
        return model_garden_settings.settings(self.params)

    def config_hooks(self) -> Sequence[Any]:
        """`params.yaml` and the evaluation summaries in Model Garden's validation subdir
        (`ctl.adapters.model_garden_dir.ModelGardenFiles`)."""
        return [ModelGardenFiles(self.params)]

    # What Model Garden's trainer would build, in the same way.

    def build_model(self):
        model = self.garden_task.build_model()
        if not _has_variables(model):  # Built on its first call (the ranking model): on one train batch.
            model(self.features(next(iter(self.build_inputs(training=True)))), training=False)
        self._model = model
        return model

    def build_optimizer(self):
        optimizer = self.garden_task.create_optimizer(self.params.trainer.optimizer_config,
                                                      self.params.runtime)
        # An `ema` in the optimizer config (ResNet-RS's) wraps it in Model Garden's moving
        # average, whose averages its trainer makes from the model before the first update.
        if getattr(optimizer, "has_shadow_copy", True) is False and self._model is not None:
            optimizer.shadow_copy(self._model)
        # The ranking task compiles its model with its optimizers and returns None here.
        return optimizer if optimizer is not None else getattr(self._model, "optimizer", None)

    def averaged_optimizer(self, optimizer):
        """The optimizer if it is Model Garden's `ExponentialMovingAverage` (an `ema` in the
        optimizer config): evaluation swaps its averages in, as Model Garden's trainer does.

        Args:
            optimizer: the optimizer `build_optimizer()` returned.
        """
        from official.modeling import optimization

        return optimizer if isinstance(optimizer, optimization.ExponentialMovingAverage) else None

    def eval_datasets(self) -> Sequence[str]:
        """The names of `eval_sets`, in order; `()` without them."""
        return tuple(self.eval_sets)

    def build_inputs(self, training: bool, input_context=None,
                     name: Optional[str] = None) -> tf.data.Dataset:
        """The Model Garden task's `build_inputs` on `task.train_data`, `task.validation_data` or a named eval
            set's, its `input_path` checked first.

        Args:
            training: True for the train dataset, False for an eval dataset.
            input_context: this input pipeline's `tf.distribute.InputContext` (given to a task that takes it); None
                outside a strategy's distribution.
            name: the eval set of `eval_sets` to read (None: `task.validation_data`).
        """
        where = "task.train_data" if training else "task.validation_data"
        data = self.params.task.train_data if training else self.params.task.validation_data
        if not training and name is not None:
            where, data = f"ctl.ModelGardenTask.eval_sets[{name!r}]", self.eval_sets[name]
        check_input_path(self.experiment, data, where)
        try:
            # As orbit's make_distributed_dataset: the context only to a task that takes it.
            if "input_context" in inspect.signature(self.garden_task.build_inputs).parameters:
                return self.garden_task.build_inputs(data, input_context=input_context)
            return self.garden_task.build_inputs(data)
        except (ValueError, TypeError, tf.errors.OpError) as error:
            if not has_no_input(data):
                raise
            raise UserError(empty_input_path(self.experiment, where, name, error)) from error

    def build_losses(self, labels, outputs, aux_losses=None):
        """The Model Garden task's `build_losses`.

        Args:
            labels: the labels of one replica's batch (the second of each `(features, labels)` element).
            outputs: the model's outputs on that batch (float32 under mixed precision).
            aux_losses: the model's own losses (`model.losses`), each a scalar; None or empty without any.
        """
        return self.garden_task.build_losses(labels, outputs, aux_losses=aux_losses)

    def build_metrics(self, training: bool = True):
        """The Model Garden task's `build_metrics`, then the model's own (as Model Garden's trainer).

        Args:
            training: True for the train metrics, False for the eval metrics.
        """
        # As Model Garden's trainer: the task's metrics, then the model's own (a compiled model's).
        return list(self.garden_task.build_metrics(training=training)) + list(
            getattr(self._model, "metrics", None) or [])

    def features(self, inputs):
        """Model Garden's convention: a 2-tuple is `(features, labels)`, else the element
        (a dict) is both (`official.core.base_task.Task.train_step`).

        Args:
            inputs: one element (or batch) of a `build_inputs` dataset.
        """
        return inputs[0] if isinstance(inputs, tuple) and len(inputs) == 2 else inputs

    def checkpoint_items(self, model) -> Dict[str, Any]:
        """The model's `checkpoint_items` (e.g. `backbone`, BERT's `encoder`), which Model Garden's
        trainer holds at its checkpoint's top level and its `init_checkpoint_modules` reads there.

        Args:
            model: the built model.
        """
        return dict(getattr(model, "checkpoint_items", None) or {})

    def initialize(self, model) -> None:
        """The Model Garden task's `initialize` (its `init_checkpoint`), on a fresh run.

        Args:
            model: the built model.
        """
        try:
            self.garden_task.initialize(model)
        except (ValueError, tf.errors.OpError) as error:
            path = getattr(self.params.task, "init_checkpoint", None)
            if not path:
                raise
            raise UserError(
                f"ctl.ModelGardenTask: experiment {self.experiment!r}: task.init_checkpoint="
                f"{path!r} cannot be read ({first_line(error, 200)}); point it at a checkpoint "
                "you can read, or set task.init_checkpoint='' in "
                "ctl.ModelGardenTask.params_override to start from scratch.") from error

    # Its steps: ctl reads the loss under Model Garden's name for it.

    def train_step(self, inputs, model, optimizer, metrics):
        """The Model Garden task's `train_step`; its loss is read under the task's name for it.

        Args:
            inputs: one replica's batch, as the Model Garden task's dataset yields it.
            model: the model (the task's `build_model()`, built under the strategy's scope).
            optimizer: under a Trainer its `ctl.core.train_step.GradientPipeline`; else a Keras optimizer.
            metrics: the task's `build_metrics(training=...)` for this loop, to update.
        """
        logs = self.garden_task.train_step(inputs, model=model, optimizer=optimizer,
                                           metrics=metrics)
        return {"loss": reported_loss(logs[self.garden_task.loss])}

    def validation_step(self, inputs, model, metrics):
        """The Model Garden task's `validation_step`: its loss, and the entries it aggregates if it does.

        Args:
            inputs: one replica's batch, as the Model Garden task's dataset yields it.
            model: the model evaluated.
            metrics: the task's `build_metrics(training=...)` for this loop, to update.
        """
        logs = dict(self.garden_task.validation_step(inputs, model=model, metrics=metrics))
        # None where the eval set has no labels (SQuAD's): no eval loss, as in Model Garden. A
        # float32 tensor as its trainer's Keras Mean takes it (Mask R-CNN's is a Python 0).
        loss = logs.pop(self.garden_task.loss, None)
        loss = None if loss is None else tf.cast(loss, tf.float32)
        own = {} if loss is None else {"loss": reported_loss(loss)}
        if not self.aggregates_logs():
            return own
        # The entries the task aggregates, minus the metric results it reads as it goes. As
        # under Model Garden's trainer, its aggregation gets its loss too (under the task's
        # name for it, restored in `aggregate_logs`): ctl's "loss" is the eval loss's mean.
        logs = {name: value for name, value in logs.items() if name not in {m.name for m in metrics}}
        return {**own, **({} if loss is None else {TASK_LOSS: loss}), **logs}

    def serving_signatures(self, model) -> Dict[str, Any]:
        """Model Garden's own export module for the experiment, around `model`: the signatures its
        export gives the model (`ctl.adapters.model_garden_serving`); for a family without an
        export module, the model's Keras inputs, or one line saying it has neither. A model
        Model Garden's module cannot export either (a translation model that decodes with
        `padded_decode`) ends in one line saying so (`model_garden_serving.export_problem`), as
        does any error the module raises while it builds its signatures (`module_failure`).

        Args:
            model: the model exported (the evaluated one: the moving average with `ema_decay`).
        """
        from ctl.adapters import model_garden_serving

        module_class = model_garden_serving.export_module_class(self.params, self.garden_task)
        problem = module_class and model_garden_serving.export_problem(self.params, module_class)
        if problem:
            raise UserError(f"ctl.ModelGardenTask: experiment {self.experiment!r}: {problem}.")
        if module_class is not None:
            try:
                module = model_garden_serving.serving_module(self.params, self.garden_task, model)
                signatures = model_garden_serving.signatures(module)
            except model_garden_serving.MODULE_ERRORS as error:
                raise UserError(f"ctl.ModelGardenTask: experiment {self.experiment!r}: "
                                f"{model_garden_serving.module_failure(module_class, error)}."
                                ) from error
            return ServingSignatures(signatures, model_garden_serving.saved_objects(module, model))
        try:
            return default_serving_signatures(model)
        except UserError as error:
            raise UserError(
                f"ctl.ModelGardenTask: experiment {self.experiment!r}: Model Garden has no export "
                f"module for its task ({type(self.params.task).__name__}) and "
                f"{type(model).__name__} has no Keras inputs to serve from; subclass "
                "ctl.ModelGardenTask and override serving_signatures(model), or drop the "
                "exporters.") from error

    def aggregates_logs(self) -> bool:  # Per task: whether its class aggregates.
        from official.core import base_task

        return type(self.garden_task).aggregate_logs is not base_task.Task.aggregate_logs

    def aggregate_logs(self, state, step_logs):
        """The Model Garden task's `aggregate_logs`, each entry as per-replica tensors (a nested entry leaf by leaf).

        Args:
            state: the state so far; None at the first step of each evaluation.
            step_logs: each extra entry of `validation_step` mapped to a list of NumPy arrays, one per replica, of
                every worker.
        """
        # Model Garden's trainer hands each leaf of an entry over as a tuple of per-replica
        # tensors (`strategy.experimental_local_results`); ctl gives a nest per replica.
        tensors = {self.garden_task.loss if name == TASK_LOSS else name:
                   tf.nest.map_structure(lambda *leaf: tuple(map(tf.constant, leaf)), *values)
                   for name, values in step_logs.items()}
        return self.garden_task.aggregate_logs(state, tensors)

    def reduce_aggregated_logs(self, aggregated_logs, global_step: int) -> Dict[str, Any]:
        """The Model Garden task's `reduce_aggregated_logs` (`{}` when it returns None).

        Args:
            aggregated_logs: the state `aggregate_logs` returned after the last step.
            global_step: the global step the evaluation ran at.
        """
        return self.garden_task.reduce_aggregated_logs(aggregated_logs, global_step) or {}

