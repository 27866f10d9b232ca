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
hold `global_step`, `model` and `optimizer` under those names, as Model
Garden's trainer writes them, so either can continue the other's model dir.

What ctl takes from `trainer` is the optimizer: the schedule (train steps,
intervals) is ctl's (`ctl.Schedule`), so a run has one source for each
setting. `trainer_settings()` maps the experiment's trainer config onto
`ctl.Schedule`'s names for whoever wants to bind them the same.

Model Garden's modules load when the task is built (they take a second or
two); importing `ctl` does not load them.
"""

from typing import Any, Dict, Mapping, Sequence, Union

import gin
import tensorflow as tf

from ctl.utils.errors import UserError, first_line
from ctl.core.task import Task

Override = Union[str, Mapping[str, Any]]


def experiment_config(experiment: str, config_files: Sequence[str] = (),
                      params_override: Union[Override, Sequence[Override]] = ()):
    """The locked `ExperimentConfig` of a registered experiment, with overrides applied.

    Args:
        experiment: the experiment's `exp_factory` name, e.g. `'resnet_imagenet'`.
        config_files: YAML files applied in order.
        params_override: `a.b=v` pairs in a string, a dict, or a list of either, applied after the files.

    Raises:
        UserError: an experiment that is not registered, or an override that names no key.
    """
    from official.core import exp_factory
    from official.modeling import hyperparams

    try:
        params = exp_factory.get_exp_config(experiment)
    except LookupError as error:
        raise UserError(f"ctl.ModelGardenTask.experiment={experiment!r} is not registered with "
                        "Model Garden's exp_factory; import the module that registers it in the "
                        "gin file (e.g. `import official.vision.registry_imports`).") from error
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
    params.validate()
    params.lock()
    return params


@gin.configurable(module="ctl")
class ModelGardenTask(Task):
    """Runs the task of a registered Model Garden experiment as a ctl task.

    Args:
        experiment: the registered experiment's `exp_factory` name, e.g. `'resnet_imagenet'` (required); the gin file
            imports the module that registers it.
        config_files: YAML files applied to the experiment's config, in order (as Model Garden's `--config_file`).
        params_override: overrides applied after the files (as `--params_override`): a string of `a.b=v` pairs
            separated by commas, a dict, or a list of either; strict (an unknown key is an error).
    """

    def __init__(self, experiment: str = gin.REQUIRED, config_files: Sequence[str] = (),
                 params_override: Union[Override, Sequence[Override]] = ()):
        from official.core import task_factory

        self.params = experiment_config(experiment, config_files, params_override)
        self.garden_task = task_factory.get_task(self.params.task)

    def trainer_settings(self) -> Dict[str, Any]:
        """The experiment's trainer config under `ctl.Schedule`'s names."""
        trainer = self.params.trainer
        return {"train_steps": trainer.train_steps, "steps_per_loop": trainer.steps_per_loop,
                "eval_steps": trainer.validation_steps if trainer.validation_steps > 0 else None,
                "eval_interval": trainer.validation_interval,
                "checkpoint_interval": trainer.checkpoint_interval,
                "max_checkpoints": trainer.max_to_keep}

    # What Model Garden's trainer would build, in the same way.

    def build_model(self):
        return self.garden_task.build_model()

    def build_optimizer(self):
        return self.garden_task.create_optimizer(self.params.trainer.optimizer_config,
                                                 self.params.runtime)

    def build_inputs(self, training: bool, input_context=None) -> tf.data.Dataset:
        data = self.params.task.train_data if training else self.params.task.validation_data
        return self.garden_task.build_inputs(data, input_context=input_context)

    def build_losses(self, labels, outputs, aux_losses=None):
        """The Model Garden task's `build_losses`.

        Args:
            labels: the labels of one replica's batch (the second of each `(features, labels)` element).
            outputs: the model's outputs on that batch (float32 under mixed precision).
            aux_losses: the model's own losses (`model.losses`), each a scalar; None or empty without any.
        """
        return self.garden_task.build_losses(labels, outputs, aux_losses=aux_losses)

    def build_metrics(self, training: bool = True):
        """The Model Garden task's `build_metrics`.

        Args:
            training: True for the train metrics, False for the eval metrics.
        """
        return list(self.garden_task.build_metrics(training=training))

    def features(self, inputs):
        """Model Garden's convention: a 2-tuple is `(features, labels)`, else the element
        (a dict) is both (`official.core.base_task.Task.train_step`).

        Args:
            inputs: one element (or batch) of a `build_inputs` dataset.
        """
        return inputs[0] if isinstance(inputs, tuple) and len(inputs) == 2 else inputs

    def initialize(self, model) -> None:
        """The Model Garden task's `initialize` (its `init_checkpoint`), on a fresh run.

        Args:
            model: the built model.
        """
        self.garden_task.initialize(model)

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
        return {"loss": logs[self.garden_task.loss]}

    def validation_step(self, inputs, model, metrics):
        """The Model Garden task's `validation_step`: its loss, and the entries it aggregates if it does.

        Args:
            inputs: one replica's batch, as the Model Garden task's dataset yields it.
            model: the model evaluated.
            metrics: the task's `build_metrics(training=...)` for this loop, to update.
        """
        logs = dict(self.garden_task.validation_step(inputs, model=model, metrics=metrics))
        logs["loss"] = logs.pop(self.garden_task.loss)
        if not self.aggregates_logs():
            return {"loss": logs["loss"]}
        # The entries the task aggregates, minus the metric results it reads as it goes.
        return {name: value for name, value in logs.items()
                if name not in {m.name for m in metrics}}

    def aggregates_logs(self) -> bool:  # Per task: whether its class aggregates.
        from official.core import base_task

        return type(self.garden_task).aggregate_logs is not base_task.Task.aggregate_logs

    def aggregate_logs(self, state, step_logs):
        """The Model Garden task's `aggregate_logs`, each entry as per-replica tensors.

        Args:
            state: the state so far; None at the first step of each evaluation.
            step_logs: each extra entry of `validation_step` mapped to a list of NumPy arrays, one per replica, of
                every worker.
        """
        # Model Garden's tasks take each entry as per-replica tensors.
        tensors = {name: [tf.constant(v) for v in values] for name, values in step_logs.items()}
        return self.garden_task.aggregate_logs(state, tensors)

    def reduce_aggregated_logs(self, aggregated_logs, global_step: int) -> Dict[str, Any]:
        """The Model Garden task's `reduce_aggregated_logs` (`{}` when it returns None).

        Args:
            aggregated_logs: the state `aggregate_logs` returned after the last step.
            global_step: the global step the evaluation ran at.
        """
        return self.garden_task.reduce_aggregated_logs(aggregated_logs, global_step) or {}

