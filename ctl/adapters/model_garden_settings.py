"""What ctl does with each field of a Model Garden experiment's `trainer` and `runtime` configs.

One entry per field (`TRAINER`, `RUNTIME`; `RANKING_TRAINER` for the ranking experiments' own
trainer config): either the ctl setting it becomes, as Model Garden's trainer honours it, or why
ctl refuses it when it is set away from Model Garden's default. `settings(params)` turns an
experiment's config into `ctl.core.task.ConfigSetting`s (what `ctl.Experiment` takes where you set
nothing: docs/how-to/model-garden.md, "Precedence"); `check(params)` raises the one-line
`UserError` for the first refused field. A field of the experiment's config class that has no
entry here is refused when set away from its default, so a field a new Model Garden release adds
is never ignored in silence (tests/test_model_garden_settings.py walks the dataclasses).

Pure Python; nothing here imports Model Garden or TensorFlow.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional

from ctl.core.task import ConfigSetting
from ctl.utils.errors import UserError

Settings = Dict[str, Any]  # {ctl setting: value}


@dataclasses.dataclass(frozen=True)
class Field:
    """What ctl does with one field of the experiment's `trainer` or `runtime` config.

    Args:
        does: what ctl does with it, for the docs' table (one sentence).
        settings: the field's value and the whole config -> the ctl settings it gives, or None:
            ctl takes nothing from it (the task reads it itself, or it is refused when set).
        refused: the field's value, Model Garden's default for it and the whole config -> why
            ctl refuses it (one clause, naming what to do instead), or None for a value ctl runs
            as Model Garden does; None: never refused.
    """

    does: str
    settings: Optional[Callable[[Any, Any], Settings]] = None
    refused: Optional[Callable[[Any, Any, Any], Optional[str]]] = None


def _to(name: str, convert: Callable[[Any, Any], Any] = lambda value, params: value):
    return lambda value, params: {name: convert(value, params)}


def _unless_default(why: str):
    """Refused when set away from Model Garden's default: `why` says what ctl has instead."""
    return lambda value, default, params: why if _plain(value) != _plain(default) else None


_PRECISION = {None: None, "float32": None, "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}
# Model Garden's `runtime.distribution_strategy` names (official.common.distribute_utils) -> ctl's.
STRATEGIES = {"off": "default", "one_device": "one_device", "mirrored": "mirrored",
              "multi_worker_mirrored": "multi_worker_mirrored",
              "parameter_server": "parameter_server", "tpu": "tpu"}
BEST_LOSS = "validation_loss"  # Model Garden's name for the eval loss, ctl's `loss`.


def _best(value, params) -> Settings:
    trainer = params.trainer
    if not (trainer.best_checkpoint_export_subdir and trainer.best_checkpoint_eval_metric):
        return {}  # As Model Garden's `maybe_create_best_ckpt_exporter`: both, or no best checkpoint.
    metric = trainer.best_checkpoint_eval_metric
    return {"ctl.hooks.BestCheckpoint.metric": "loss" if metric == BEST_LOSS else metric.replace("|", "/"),
            "ctl.hooks.BestCheckpoint.higher_is_better": trainer.best_checkpoint_metric_comp == "higher",
            "ctl.hooks.BestCheckpoint.export_subdir": trainer.best_checkpoint_export_subdir}


def _comp_refused(value, default, params) -> Optional[str]:
    if value not in ("higher", "lower"):
        return "must be 'higher' or 'lower', as Model Garden's BestCheckpointExporter requires"
    return None


def _recovery(value, params) -> Settings:
    trainer = params.trainer
    if trainer.recovery_max_trials < 0:
        return {}  # Refused (below).
    settings: Settings = {"ctl.FaultTolerance.loss_upper_bound": float(trainer.loss_upper_bound),
                          "ctl.FaultTolerance.loss_bound_from_step": trainer.recovery_begin_steps}
    if trainer.recovery_max_trials > 0:
        # Model Garden counts recoveries over the whole run: a healthy stretch never resets it.
        settings.update({"ctl.FaultTolerance.nan_policy": "recover",
                         "ctl.FaultTolerance.max_recoveries": trainer.recovery_max_trials,
                         "ctl.FaultTolerance.healthy_interval": max(trainer.train_steps, 1)})
    else:
        settings["ctl.FaultTolerance.nan_policy"] = "stop"
    return settings


def _precision_refused(value, default, params) -> Optional[str]:
    if value not in _PRECISION:
        return "must be float32, float16 or bfloat16 (Model Garden's set_mixed_precision_policy)"
    return None


def _strategy_refused(value, default, params) -> Optional[str]:
    if not isinstance(value, str) or value.lower() not in STRATEGIES:
        return (f"names no strategy Model Garden knows; use one of {', '.join(STRATEGIES)} "
                "(quote 'off' in YAML)")
    return None


def _xla(value, params) -> Settings:
    # Model Garden's trainer compiles the train step only when it runs on GPUs.
    return {"ctl.Trainer.jit_compile": bool(value) and params.runtime.num_gpus > 0}


def _tf_function(value, params) -> Settings:
    eager = params.runtime.run_eagerly or not value
    return {"ctl.Trainer.use_tf_function": not eager,
            "ctl.Trainer.use_tf_while_loop": bool(params.trainer.train_tf_while_loop) and not eager}


def _eval_function_refused(value, default, params) -> Optional[str]:
    if bool(value) != bool(params.trainer.train_tf_function):
        return ("differs from trainer.train_tf_function: ctl's evaluation runs as its training "
                "does (ctl.Trainer.use_tf_function); set both alike")
    return None


def _gpus_refused(value, default, params) -> Optional[str]:
    if value:
        return ("ctl's mirrored strategy uses every GPU of the host and --strategy decides; "
                "leave it 0 and choose the devices with CUDA_VISIBLE_DEVICES")
    return None


NOTHING = "ctl has nothing for it"

TRAINER: Mapping[str, Field] = {
    "optimizer_config": Field(
        "The task builds the optimizer and learning rate from it with Model Garden's optimizer "
        "factory (`create_optimizer`), as Model Garden's trainer does; an `ema` is evaluated "
        "with its averages."),
    "train_tf_while_loop": Field(
        "`ctl.Trainer.use_tf_while_loop`.", _tf_function),
    "train_tf_function": Field(
        "`ctl.Trainer.use_tf_function` (false: training and evaluation run eagerly).",
        _tf_function),
    "eval_tf_function": Field(
        "ctl evaluates as it trains (`ctl.Trainer.use_tf_function`): refused when it differs "
        "from `train_tf_function`.", refused=_eval_function_refused),
    "eval_tf_while_loop": Field(
        "Accepted: ctl's evaluation drives its steps from its own loop (one `tf.function`); "
        "the results are the same either way."),
    "allow_tpu_summary": Field(
        "Refused when true: TPU outside compilation of summaries; " + NOTHING + ".",
        refused=_unless_default("TPU summaries by outside compilation: " + NOTHING)),
    "steps_per_loop": Field("`ctl.Schedule.steps_per_loop`.", _to("ctl.Schedule.steps_per_loop")),
    "summary_interval": Field(
        "`ctl.Schedule.summary_interval` (summaries inside the train step; a multiple of "
        "`steps_per_loop`, as orbit requires: rounded up to one of a `steps_per_loop` you set, "
        "and the run's start says so).", _to("ctl.Schedule.summary_interval")),
    "checkpoint_interval": Field("`ctl.Schedule.checkpoint_interval`.",
                                 _to("ctl.Schedule.checkpoint_interval")),
    "max_to_keep": Field("`ctl.Schedule.max_checkpoints`.", _to("ctl.Schedule.max_checkpoints")),
    "continuous_eval_timeout": Field(
        "`ctl.ContinuousEval.timeout` (seconds without a new checkpoint). ctl's evaluator ends "
        "as soon as it evaluated the trainer's final checkpoint.",
        _to("ctl.ContinuousEval.timeout", lambda value, params: None if value is None else float(value))),
    "train_steps": Field("`ctl.Schedule.train_steps`.", _to("ctl.Schedule.train_steps")),
    "validation_steps": Field(
        "`ctl.Schedule.eval_steps` (-1: the whole eval set; a count past the end of the set "
        "ends there, as Model Garden's trainer ends it).",
        _to("ctl.Schedule.eval_steps", lambda value, params: value if value > 0 else None)),
    "validation_interval": Field("`ctl.Schedule.eval_interval`.", _to("ctl.Schedule.eval_interval")),
    "best_checkpoint_export_subdir": Field(
        "With `best_checkpoint_eval_metric`: `ctl.hooks.BestCheckpoint` keeps the best "
        "checkpoint in `<model_dir>/<subdir>/` (`best_ckpt-N`, `info.json`, as Model Garden "
        "writes them) and in ctl's `best/` with its `best.json`.", _best),
    "best_checkpoint_eval_metric": Field(
        "`ctl.hooks.BestCheckpoint.metric` (`validation_loss` is ctl's `loss`; a nested "
        "name's separator becomes `/`).", _best),
    "best_checkpoint_metric_comp": Field(
        "`ctl.hooks.BestCheckpoint.higher_is_better` (`higher`: true).", _best,
        refused=_comp_refused),
    "loss_upper_bound": Field(
        "`ctl.FaultTolerance.loss_upper_bound`: a train loop whose mean loss is above it is a "
        "bad loss, as a NaN is.", _recovery),
    "recovery_begin_steps": Field(
        "`ctl.FaultTolerance.loss_bound_from_step`: the bound holds from this step on.",
        _recovery),
    "recovery_max_trials": Field(
        "0: a bad loss stops the run (`ctl.FaultTolerance.nan_policy='stop'`); N > 0: "
        "`nan_policy='recover'`, at most N recoveries in the run; refused when negative (a run "
        "that goes on with a NaN loss).", _recovery,
        refused=lambda value, default, params: ("a negative value lets Model Garden train on with a "
                                       "NaN loss; ctl always checks the loss: set 0 or more")
        if value < 0 else None),
    "validation_summary_subdir": Field(
        "Evaluation summaries are written to `<model_dir>/<subdir>/` (Model Garden's "
        "`validation/`) as well as ctl's `eval/`."),
    "preemption_on_demand_checkpoint": Field(
        "true: ctl saves a checkpoint when it is preempted (SIGTERM), always; refused when "
        "false.", refused=lambda value, default, params: None if value else (
            "ctl always saves a checkpoint on preemption; " + NOTHING + " to turn it off")),
}

RUNTIME: Mapping[str, Field] = {
    "distribution_strategy": Field(
        "The run's strategy under `python -m ctl.train` (off: the default strategy); "
        "`--strategy` wins over it, and under `ctl.run` decides.",
        lambda value, params: {"--strategy": STRATEGIES[value.lower()]}, refused=_strategy_refused),
    "enable_xla": Field(
        "`ctl.Trainer.jit_compile`, with `num_gpus` > 0 only, as Model Garden's trainer "
        "compiles the train step only on GPUs.", _xla),
    "gpu_thread_mode": Field("Refused when set: " + NOTHING + " (Model Garden's trainer does "
                             "not read it either).", refused=_unless_default(NOTHING)),
    "dataset_num_private_threads": Field("Refused when set: " + NOTHING + ".",
                                         refused=_unless_default(NOTHING)),
    "per_gpu_thread_count": Field("Refused when set: " + NOTHING + ".",
                                  refused=_unless_default(NOTHING)),
    "tpu": Field(
        "The TPU `distribution_strategy: tpu` connects to (Model Garden's `--tpu` sets it); "
        "one that cannot be reached ends in one line."),
    "num_gpus": Field("Refused when set: ctl's mirrored strategy uses every GPU of the host.",
                      refused=_gpus_refused),
    "worker_hosts": Field("Refused when set: ctl reads the cluster from TF_CONFIG.",
                          refused=_unless_default("ctl reads the cluster from TF_CONFIG")),
    "task_index": Field("Refused when set: ctl reads the task from TF_CONFIG.",
                        refused=_unless_default("ctl reads the task from TF_CONFIG")),
    "all_reduce_alg": Field("Refused when set: " + NOTHING + " (TensorFlow chooses).",
                            refused=_unless_default(NOTHING + " (TensorFlow chooses)")),
    "num_packs": Field("Refused when set: " + NOTHING + ".", refused=_unless_default(NOTHING)),
    "mixed_precision_dtype": Field(
        "`ctl.Trainer.mixed_precision` (`bfloat16`: `mixed_bfloat16`, `float16`: "
        "`mixed_float16`): the Keras policy while the model is built, as Model Garden's "
        "train.py sets it.",
        _to("ctl.Trainer.mixed_precision", lambda value, params: _PRECISION.get(value)),
        refused=_precision_refused),
    "loss_scale": Field(
        "With `float16`: the task's optimizer is wrapped in a loss-scale optimizer with it "
        "(`dynamic` or a fixed number), as Model Garden does; no effect otherwise, as in Model "
        "Garden."),
    "run_eagerly": Field("true: `ctl.Trainer.use_tf_function=False` (every step eager).",
                         _tf_function),
    "batchnorm_spatial_persistent": Field("Refused when set: " + NOTHING + ".",
                                          refused=_unless_default(NOTHING)),
    "tpu_enable_xla_dynamic_padder": Field("Refused when set: " + NOTHING + ".",
                                           refused=_unless_default(NOTHING)),
    "num_cores_per_replica": Field("Refused when set: " + NOTHING + " (model parallelism).",
                                   refused=_unless_default(NOTHING + " (model parallelism)")),
    "default_shard_dim": Field("Refused when set: " + NOTHING + ".",
                               refused=_unless_default(NOTHING)),
    "use_tpu_mp_strategy": Field("Refused when set: " + NOTHING + ".",
                                 refused=_unless_default(NOTHING)),
}

_FIT_ONLY = "Model Garden's ranking train.py reads it on its Keras `fit` path only"
# The ranking experiments' own trainer config (official.recommendation.ranking.configs.config).
RANKING_TRAINER: Mapping[str, Field] = {
    "use_orbit": Field("Accepted: ctl runs its own loop over the task's steps either way "
                       "(Model Garden's ranking train.py: orbit when true, Keras `fit` when "
                       "false)."),
    "callbacks": Field("Refused when set: " + _FIT_ONLY + ".", refused=_unless_default(_FIT_ONLY)),
    "enable_metrics_in_training": Field("Refused when set: " + _FIT_ONLY + ".",
                                        refused=_unless_default(_FIT_ONLY)),
    "time_history": Field("Refused when set: " + _FIT_ONLY + ".",
                          refused=_unless_default(_FIT_ONLY)),
    "pipeline_sparse_and_dense_execution": Field(
        "Refused when set: TPU embedding pipelining; " + NOTHING + ".",
        refused=_unless_default(NOTHING)),
}


def _table(section: str, config) -> Mapping[str, Field]:
    if section == "runtime":
        return RUNTIME
    if type(config).__module__ == "official.recommendation.ranking.configs.config":
        return {**TRAINER, **RANKING_TRAINER}
    return TRAINER


def _fields(section: str, config):
    """(name, value, Model Garden's default, entry or None) of each field of `config`."""
    defaults = type(config)()
    table = _table(section, config)
    for field in dataclasses.fields(config):
        yield (field.name, getattr(config, field.name), getattr(defaults, field.name),
               table.get(field.name))


def _plain(value):
    return value.as_dict() if hasattr(value, "as_dict") else value


def check(experiment: str, params) -> None:
    """Raises `UserError` for the first field of `params.trainer` and `params.runtime` ctl refuses.

    Args:
        experiment: the experiment's name, for the message.
        params: its `ExperimentConfig`.
    """
    for section in ("trainer", "runtime"):
        config = getattr(params, section)
        for name, value, default, entry in _fields(section, config):
            if entry is None:
                why = (None if _plain(value) == _plain(default) else
                       f"ctl has no entry for this field of {type(config).__name__}")
            else:
                why = entry.refused and entry.refused(value, default, params)
            if why:
                raise UserError(
                    f"ctl.ModelGardenTask: experiment {experiment!r}: {section}.{name}={value!r} "
                    f"is refused: {why} (docs/how-to/model-garden.md lists what ctl does with "
                    "each field).")


def settings(params) -> List[ConfigSetting]:
    """The ctl settings the experiment's `trainer` and `runtime` give, each with its source field.

    Args:
        params: the experiment's `ExperimentConfig` (checked by `check`).
    """
    found: Dict[str, ConfigSetting] = {}
    for section in ("trainer", "runtime"):
        config = getattr(params, section)
        for name, value, _, entry in _fields(section, config):
            if entry is None or entry.settings is None:
                continue
            for setting, setting_value in entry.settings(value, params).items():
                if setting not in found:  # Several fields give one setting: named by the first.
                    found[setting] = ConfigSetting(setting, setting_value,
                                                   _source(section, name, setting, params))
    return list(found.values())


def _source(section: str, name: str, setting: str, params) -> str:
    """The field a setting comes from, as the run's start names it."""
    trainer, runtime = params.trainer, params.runtime
    if setting.startswith("ctl.hooks.BestCheckpoint."):
        part = setting.rsplit(".", 1)[1]
        return {"metric": "trainer.best_checkpoint_eval_metric",
                "higher_is_better": "trainer.best_checkpoint_metric_comp",
                "export_subdir": "trainer.best_checkpoint_export_subdir"}[part]
    if setting.startswith("ctl.FaultTolerance."):
        part = setting.rsplit(".", 1)[1]
        return {"loss_upper_bound": "trainer.loss_upper_bound",
                "loss_bound_from_step": "trainer.recovery_begin_steps"}.get(
                    part, "trainer.recovery_max_trials")
    if setting in ("ctl.Trainer.use_tf_function", "ctl.Trainer.use_tf_while_loop"):
        if runtime.run_eagerly:
            return "runtime.run_eagerly"
        return ("trainer.train_tf_function" if not trainer.train_tf_function or
                setting.endswith("use_tf_function") else "trainer.train_tf_while_loop")
    if setting == "ctl.Trainer.jit_compile":
        return "runtime.enable_xla, runtime.num_gpus"
    return f"{section}.{name}"


def strategy(params) -> str:
    """ctl's name for the experiment's `runtime.distribution_strategy` (checked by `check`).

    Args:
        params: the experiment's `ExperimentConfig`.
    """
    return STRATEGIES[params.runtime.distribution_strategy.lower()]
