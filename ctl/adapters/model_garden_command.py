"""Model Garden's train.py command line, as a ctl run: what `python -m ctl.train` does with its flags.

    python -m official.vision.train --experiment=retinanet_resnetfpn_coco --mode=train_and_eval \
        --model_dir=runs/retina --config_file=retina.yaml
    python -m ctl.train             --experiment=retinanet_resnetfpn_coco --mode=train_and_eval \
        --model_dir=runs/retina --config_file=retina.yaml

The experiment's config is built as Model Garden's `train_utils.parse_configuration` builds it:
the registered experiment, each `--config_file`, `--tpu` (`runtime.tpu`), `--tf_data_service`
(the data configs' `tf_data_service_address`), then `--params_override`; checked before anything
runs. The run is `ctl.ModelGardenTask` with those, as gin bindings (`bindings`), so the experiment's
`trainer` and `runtime` settings reach ctl as they do from a gin file (`ctl.adapters.model_garden_settings`).
`--mode=continuous_train_and_eval` fine-tunes from each checkpoint of the directory
`task.init_checkpoint` names (`ctl.sidecar.continuous_finetune`): `watched_directory` checks it,
`finetune_bindings` makes each fine-tune's, `finetune_records` writes Model Garden's records of each.

Importing this module imports neither TensorFlow nor Model Garden: `modes` checks `--mode` first.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ctl.utils.errors import UserError

EVAL, TRAIN = "eval", "train"  # ctl.cluster.run_plan's modes (adapters import no subsystem)

# Model Garden's `--mode` values (official.common.flags) -> the ctl modes run in order
# (`continuous_train_and_eval`: the mode of each fine-tune, `finetuning`).
MODES = {"train": (TRAIN,), "eval": (EVAL,), "train_and_eval": ("train_and_eval",),
         "continuous_eval": ("continuous_eval",), "train_and_post_eval": (TRAIN, EVAL),
         "continuous_train_and_eval": ("train_and_eval",)}
CONTINUOUS_FINETUNE = "continuous_train_and_eval"
REFUSED_MODES = {
    "train_and_validate": "is not implemented in Model Garden's open-source release either (its "
                          "train_lib raises NotImplementedError); use train_and_eval",
}


def modes(mode: str) -> Tuple[str, ...]:
    """The ctl modes Model Garden's `--mode` runs, in order.

    Args:
        mode: `--mode`, one of Model Garden's.

    Raises:
        UserError: a mode ctl does not run.
    """
    if mode in REFUSED_MODES:
        raise UserError(f"--mode={mode} {REFUSED_MODES[mode]}.")
    return MODES[mode]


def overrides(params, tpu: Optional[str], tf_data_service: Optional[str],
              params_override: Optional[str]) -> List[Any]:
    """The overrides after the config files, in Model Garden's order: `--tpu`, `--tf_data_service`,
    `--params_override`.

    Args:
        params: the experiment's config with its config files applied (to see whether its task
            has Model Garden's standard data configs, which `--tf_data_service` sets).
        tpu: `--tpu`.
        tf_data_service: `--tf_data_service`.
        params_override: `--params_override` (a YAML/JSON string or file).
    """
    from official.core import config_definitions

    found: List[Any] = []
    if tpu:
        found.append({"runtime": {"tpu": tpu}})
    if tf_data_service and isinstance(params.task, config_definitions.TaskConfig):
        address = {"tf_data_service_address": tf_data_service}
        found.append({"task": {"train_data": address, "validation_data": address}})
    if params_override:
        found.append(params_override)
    return found


def experiment_params(experiment: str, config_files: Sequence[str], tpu: Optional[str],
                      tf_data_service: Optional[str], params_override: Optional[str]):
    """The experiment's checked config and the overrides that make it (`overrides`); imports
    Model Garden's registries first, after setting `TF_USE_LEGACY_KERAS=1` for a ranking
    experiment (`model_garden.legacy_keras_for`).

    Args:
        experiment: `--experiment`.
        config_files: `--config_file`, in order.
        tpu: `--tpu`.
        tf_data_service: `--tf_data_service`.
        params_override: `--params_override`.

    Returns:
        (the `ExperimentConfig`, the overrides after the config files).

    Raises:
        UserError: `TF_USE_LEGACY_KERAS` set off for a ranking experiment, an unknown
            experiment (naming `--experiment`, with the nearest names), a key
            no config has, a config Model Garden's check refuses, a refused `trainer`/`runtime`
            setting.
    """
    from ctl.adapters import model_garden, model_garden_settings

    model_garden.legacy_keras_for(experiment)  # Before the registries use tf.keras.
    model_garden.import_registries(experiment)
    flag = model_garden.FLAG_EXPERIMENT  # The name's setting, for an unknown one.
    base = model_garden.experiment_config(experiment, config_files, named_by=flag)
    found = overrides(base, tpu, tf_data_service, params_override)
    params = model_garden.experiment_config(experiment, config_files, found, named_by=flag)
    model_garden_settings.check(experiment, params)
    return params, found


def strategy(params, flag: Optional[str]) -> str:
    """The run's strategy: `--strategy` if given, else the experiment's `runtime.distribution_strategy`.

    Args:
        params: the experiment's config.
        flag: `--strategy` (None: not given).
    """
    from ctl.adapters import model_garden_settings

    return flag or model_garden_settings.strategy(params)


def bindings(experiment: str, config_files: Sequence[str], found: Sequence[Any],
             model_dir: str, async_checkpointing: bool) -> List[str]:
    """The gin bindings of the run: `ctl.ModelGardenTask` on the experiment, writing its files in
    the model dir as Model Garden's train.py has its task do, and `--enable_async_checkpointing`
    (Model Garden's train.py's flag) as `ctl.Schedule.async_checkpointing`.

    Args:
        experiment: `--experiment`.
        config_files: `--config_file`, in order.
        found: the overrides after the files (`overrides`).
        model_dir: `--model_dir`.
        async_checkpointing: `--enable_async_checkpointing`.
    """
    return ["ctl.Experiment.task = @ctl.ModelGardenTask()",
            f"ctl.ModelGardenTask.experiment = {experiment!r}",
            f"ctl.ModelGardenTask.config_files = {list(config_files)!r}",
            f"ctl.ModelGardenTask.params_override = {list(found)!r}",
            f"ctl.ModelGardenTask.logging_dir = {model_dir!r}",
            f"ctl.Schedule.async_checkpointing = {bool(async_checkpointing)!r}"]


def watched_directory(params) -> str:
    """The directory `--mode=continuous_train_and_eval` fine-tunes from: `task.init_checkpoint`.

    Args:
        params: the experiment's config.

    Raises:
        UserError: the task has no `init_checkpoint`, or it is not set.
    """
    path = getattr(params.task, "init_checkpoint", None)
    if not path:
        where = "is not set" if path is not None else "is not a field of its task config"
        raise UserError(f"--mode={CONTINUOUS_FINETUNE} fine-tunes from each checkpoint of the "
                        f"directory task.init_checkpoint names, which {where}; set it to the "
                        "pretraining run's model dir in --config_file or --params_override.")
    return path


def finetune_bindings(params, found: Sequence[Any]):
    """The gin bindings of each fine-tune, as Model Garden's `continuous_finetune_lib` replaces
    the config: `task.init_checkpoint` the pretraining checkpoint, the best checkpoint's subdir
    (`trainer.best_checkpoint_export_subdir`, when set) suffixed with the pretraining step, and
    the task's files in the fine-tune's model dir.

    Args:
        params: the experiment's config.
        found: the overrides after the config files (`overrides`).

    Returns:
        A function of the `ctl.sidecar.continuous_finetune.Pretrained` to the bindings.
    """
    subdir = params.trainer.best_checkpoint_export_subdir

    def bindings(pretrained) -> List[str]:
        override: Dict[str, Any] = {"task": {"init_checkpoint": pretrained.path}}
        if subdir:
            override["trainer"] = {"best_checkpoint_export_subdir": f"{subdir}_{pretrained.step}"}
        return [f"ctl.ModelGardenTask.params_override = {[*found, override]!r}",
                f"ctl.ModelGardenTask.logging_dir = {pretrained.directory.path!r}"]

    return bindings


def finetune_records(params, model_dir: str):
    """What Model Garden writes after each fine-tune (`ctl.adapters.model_garden_dir.PretrainRecords`),
    under its name for the task (its `task.name`, from the task made once, at the first).

    Args:
        params: the experiment's config.
        model_dir: `--model_dir`.
    """
    from ctl.adapters import model_garden
    from ctl.adapters.model_garden_dir import PretrainRecords
    from ctl.model_dir import ModelDir

    return PretrainRecords(params, ModelDir(model_dir),
                           task_name=lambda: model_garden.garden_task(params).name)
