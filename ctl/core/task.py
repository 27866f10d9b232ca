"""`Task`: what a user writes to train a new model with ctl.

A task says *what* to train: the model, its optimizer, the data, the losses and
the metrics. The `Trainer` says *how*: loops, distribution, checkpoints.

Input contract: every element of the datasets returned by `build_inputs` is a
`(features, labels)` pair of batches: every tensor's first dimension is the
batch. `features` is whatever the model's `call` takes (a tensor or a dict of
tensors); `labels` is whatever `build_losses` and the metrics take. A task
whose data does not fit this pair overrides `train_step` and
`validation_step`; ctl never inspects the structure to guess. ctl checks the
contract when a run starts (`ctl.core.contract`; docs/guide/writing-a-task.md).

When a task declares no serving signatures, exports serve the default one
(`default_serving_signatures`): `model(inputs, training=False)` on the model's
Keras inputs.
"""

import contextlib
import contextvars
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence

import tensorflow as tf

from ctl.core.precision import float32_outputs
from ctl.core.train_step import scale_loss
from ctl.utils.errors import UserError

Logs = Dict[str, Any]


class ConfigSetting(NamedTuple):
    """A setting of the run that a task's own config holds (`Task.config_settings`).

    Args:
        name: ctl's setting, as gin names it: `ctl.Schedule.train_steps`, `ctl.Trainer.mixed_precision`,
            `ctl.FaultTolerance.nan_policy`, `ctl.ContinuousEval.timeout`, `ctl.hooks.BestCheckpoint.metric`.
        value: its value.
        source: where the task's config holds it, for the run's start (e.g. `trainer.train_steps`).
    """

    name: str
    value: Any
    source: str


class Task:
    """Base class for user tasks. Subclass it and register it with gin.

    Required: `build_model`, `build_optimizer`, `build_inputs`, `build_losses`.
    Optional: `build_metrics`, `train_step`, `validation_step`,
    `aggregate_logs`, `reduce_aggregated_logs`, `initialize`,
    `eval_datasets`, `serving_signatures`, `checkpoint_items`.

    All `build_*` methods are called inside the distribution strategy's scope,
    so variables they create are placed correctly. Models may be Keras 3
    (`tf.keras`, `keras`) or Keras 2 (`tf_keras`), as long as the optimizer
    comes from the same Keras.

    Example (a linear regression; [Writing a Task](../guide/writing-a-task.md) runs it whole):

        @gin.configurable
        class Regression(ctl.Task):
            def build_model(self):
                return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

            def build_optimizer(self):
                return keras.optimizers.SGD(0.1)

            def build_inputs(self, training, input_context=None):
                x = np.random.default_rng(0).normal(size=(256, 3)).astype(np.float32)
                dataset = tf.data.Dataset.from_tensor_slices((x, x @ WEIGHTS))
                if training:
                    dataset = dataset.shuffle(256, seed=0).repeat()
                return dataset.batch(32, drop_remainder=training)

            def build_losses(self, labels, outputs, aux_losses=None):
                return tf.reduce_mean(tf.square(labels - outputs))  # this replica's mean

    and in its gin file `ctl.Experiment.task = @Regression()`.
    """

    def build_model(self):
        """Returns a built Keras model (its variables exist, e.g. via `Input`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_model().")

    def build_optimizer(self):
        """Returns an optimizer from the same Keras as the model."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement build_optimizer()."
        )

    def build_inputs(
        self, training: bool, input_context: Optional[tf.distribute.InputContext] = None
    ) -> tf.data.Dataset:
        """Returns the train (`training=True`) or eval dataset of one input pipeline.

        Batch with `input_context.get_per_replica_batch_size(global_batch)` and
        shard with `input_context.input_pipeline_id` when `input_context` is
        given. The train dataset may repeat; if it ends (its length is finite
        or unknown), ctl repeats it, as Keras `fit` runs epochs. The eval
        dataset must end after one pass over the eval set (keep the remainder
        batch), unless `ctl.Schedule.eval_steps` says how many batches to read.

        Args:
            training: True for the train dataset, False for an eval dataset.
            input_context: this input pipeline's `tf.distribute.InputContext` (its id, the pipelines, the per-replica
                batch size); None outside a strategy's distribution.

        Returns:
            A `tf.data.Dataset` of `(features, labels)` batches.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement build_inputs(training, input_context)."
        )

    def eval_datasets(self) -> Sequence[str]:
        """Names of several eval sets; `()` (the default) for the one unnamed set.

        With names, every evaluation (in-line in `eval` and `train_and_eval`,
        and on the sidecar evaluator) calls `build_inputs(training=False,
        input_context=..., name=NAME)` once per name, evaluates each set with
        the task's loss and metrics, and returns `{NAME: results}`: each
        set's summaries go to `<model_dir>/eval/NAME`, and hooks name a
        set's metric `"NAME/metric"` (e.g. `ctl.hooks.BestCheckpoint.metric =
        'far/loss'`).
        """
        return ()

    def build_losses(self, labels, outputs, aux_losses: Optional[List[Any]] = None):
        """Returns the scalar loss of one replica's batch (a mean, not a sum).

        `aux_losses` are the model's own losses (`model.losses`: weight
        regularization, `add_loss`), each a scalar. Add them (`loss +
        tf.add_n(aux_losses)`, as Model Garden's tasks do) or ignore them: when
        the returned loss does not depend on them, the default steps add them
        to it (as Keras `fit` does), and ctl says so once when the run starts.
        Either way they are counted once. A per-example vector is refused at
        start (`ctl.core.contract`): return the mean.

        Args:
            labels: the labels of one replica's batch (the second of each `(features, labels)` element).
            outputs: the model's outputs on that batch (float32 under mixed precision).
            aux_losses: the model's own losses (`model.losses`), each a scalar; None or empty without any.

        Returns:
            The scalar loss.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement build_losses(labels, outputs, aux_losses)."
        )

    def build_metrics(self, training: bool = True) -> List[Any]:
        """Returns Keras metrics updated with `(labels, outputs)` each step.

        Args:
            training: True for the train metrics, False for the eval metrics (the same list may serve both).

        Returns:
            A list of Keras metrics.
        """
        del training
        return []

    def train_step(self, inputs, model, optimizer, metrics) -> Logs:
        """One replica's training step; runs inside `tf.function` and `strategy.run`.

        Under a Trainer, `optimizer` is its `ctl.core.train_step.GradientPipeline`:
        take gradients of `optimizer.scale_loss(loss)` and call
        `optimizer.apply_gradients` once; loss scaling, clipping, accumulation
        and the update happen there (docs/train_step.md). A plain Keras
        optimizer works too (outside a Trainer). Returns a dict with at least
        `"loss"`, the unscaled per-replica loss.

        Args:
            inputs: one replica's batch, `(features, labels)`.
            model: the model (the task's `build_model()`, built under the strategy's scope).
            optimizer: under a Trainer its `ctl.core.train_step.GradientPipeline`; else a Keras optimizer.
            metrics: the task's `build_metrics(training=...)` for this loop, to update.

        Returns:
            `{"loss": loss, ...}`: at least the unscaled per-replica loss.
        """
        features, labels = inputs
        with tf.GradientTape() as tape:
            # Mixed precision: losses and metrics see float32 outputs.
            outputs = float32_outputs(model(features, training=True))
            loss = total_loss(self, labels, outputs, model)
            scaled_loss = scale_loss(optimizer, loss)
        variables = model.trainable_variables
        gradients = tape.gradient(scaled_loss, variables)
        optimizer.apply_gradients(zip(gradients, variables))
        for metric in metrics:
            metric.update_state(labels, outputs)
        return {"loss": loss}

    def validation_step(self, inputs, model, metrics) -> Logs:
        """One replica's eval step; runs inside `tf.function` and `strategy.run`.

        Returns a dict with `"loss"`; any other entries are handed, per replica,
        to the task's host aggregation (`aggregate_logs`).

        Args:
            inputs: one replica's batch, `(features, labels)`.
            model: the model evaluated (with `ctl.Trainer.ema_decay`, the moving average).
            metrics: the task's `build_metrics(training=...)` for this loop, to update.

        Returns:
            `{"loss": loss, ...}`; the other entries go to `aggregate_logs`.
        """
        features, labels = inputs
        outputs = float32_outputs(model(features, training=False))
        loss = total_loss(self, labels, outputs, model)
        for metric in metrics:
            metric.update_state(labels, outputs)
        return {"loss": loss}

    def aggregate_logs(self, state: Any, step_logs: Mapping[str, List[Any]]) -> Any:
        """Folds one eval step's extra logs into `state` (eager, NumPy values).

        `state` starts as `None`; `step_logs` maps each extra entry returned by
        `validation_step` to a list with one NumPy array per replica, of every
        worker: each worker aggregates the whole eval set. An entry that is a
        nested structure (dicts, tuples, lists of tensors) comes as one such
        structure of NumPy arrays per replica.
        Override this (and `reduce_aggregated_logs`; Model Garden's names) for
        results that Keras metrics cannot hold, such as predictions over the
        whole eval set: the one route for host aggregation. A `ctl.Reducer`
        (e.g. `ctl.cluster.reducers.AUC`) takes the same calls: return
        `reducer.update(state, step_logs)` here and
        `reducer.results(aggregated_logs, global_step)` from `reduce_aggregated_logs`
        (`ctl.core.aggregation`).

        Args:
            state: the state so far; None at the first step of each evaluation.
            step_logs: each extra entry of `validation_step` mapped to a list of NumPy arrays, one per replica, of
                every worker.

        Returns:
            The new state.
        """
        del step_logs
        return state

    def reduce_aggregated_logs(self, aggregated_logs: Any, global_step: int) -> Dict[str, Any]:
        """Turns the aggregated state into named scalar results (eager).

        Args:
            aggregated_logs: the state `aggregate_logs` returned after the last step.
            global_step: the global step the evaluation ran at.

        Returns:
            `{name: scalar}` added to the evaluation's results.
        """
        del aggregated_logs, global_step
        return {}

    def config_settings(self) -> Sequence[ConfigSetting]:
        """Settings of the run that the task's own config holds (none by default).

        `ctl.Experiment` takes each where you set nothing (a gin binding, or in Python a value
        other than ctl's default, wins) and the run's start names each one's source:
        `ctl.ModelGardenTask` gives its experiment's `trainer` and `runtime` settings.
        """
        return ()

    def config_hooks(self) -> Sequence[Any]:
        """Hooks the task's own config asks for, run after the experiment's (none by default):
        `ctl.ModelGardenTask` writes `params.yaml` and its evaluation summaries where Model Garden does."""
        return ()

    def averaged_optimizer(self, optimizer):
        """The optimizer whose moving averages evaluation uses, or None (the default).

        Each evaluation (in-line and on the sidecar, which then restores the
        optimizer too) swaps them into the model with its `swap_weights()` and
        swaps back after, as Model Garden's trainer does with its
        `ExponentialMovingAverage` (`ctl.ModelGardenTask` returns it); training
        goes on with the trained weights.

        Args:
            optimizer: the task's `build_optimizer()`.
        """
        del optimizer
        return None

    def checkpoint_items(self, model) -> Dict[str, Any]:
        """Parts of the model that a checkpoint holds at its top level as well, by name (none by
        default).

        Tools that read one part of a model find it there, e.g.
        `tf.train.Checkpoint(backbone=model.backbone).read(path)`: `ctl.ModelGardenTask`
        returns the model's `checkpoint_items`, which Model Garden's trainer adds to its
        checkpoints and its `init_checkpoint_modules` reads. The parts' variables are the
        model's, so a checkpoint written without them still restores. The names must not be
        ctl's own (`global_step`, `model`, `optimizer`, `rng`, `ema`).

        Args:
            model: the model, built.
        """
        del model
        return {}

    def initialize(self, model) -> None:
        """Called once when the model dir holds no checkpoint yet.

        The task's side of the one warm-start route (`Hooks.initialize` in
        `ctl.core.hook_protocol`): it runs right after the hooks' `on_initialize`,
        so after `ctl.hooks.WarmStart`, which loads pretrained weights from gin
        without code. Override it for what a hook cannot say (Model Garden's
        name: `ctl.ModelGardenTask` forwards it), e.g.
        `tf.train.Checkpoint(encoder=model.encoder).read(path)`.

        Args:
            model: the model, built, before its first step.
        """
        del model

    def features(self, inputs):
        """The model's features in one element of a `build_inputs` dataset.

        The first of the `(features, labels)` pair; a task whose elements have
        another structure overrides it (`--mode=smoke` serves these features
        through the exported signatures).

        Args:
            inputs: one element (or batch) of a `build_inputs` dataset.

        Returns:
            The features, as the model takes them.
        """
        features, _ = inputs
        return features

    def serving_signatures(self, model) -> Dict[str, Any]:
        """Returns `{name: tf.function with an input_signature}` for SavedModel exports.

        The default serves `model(inputs, training=False)` as `serving_default`,
        with the model's Keras `inputs` as the signature; override it for models
        without Keras inputs or to serve preprocessing. Traced when exported.

        Args:
            model: the model exported (the evaluated one: the moving average with `ema_decay`).

        Returns:
            The signatures by name; `serving_default` is the one servers call by default.
        """
        return default_serving_signatures(model)

    def aggregates_logs(self) -> bool:
        """Whether this task collects eval outputs beyond its Keras metrics."""
        return type(self).aggregate_logs is not Task.aggregate_logs


def shard_for_pipeline(dataset: tf.data.Dataset, global_batch_size: int,
                       input_context: Optional[tf.distribute.InputContext] = None):
    """This input pipeline's share of `dataset` and its per-replica batch size.

    Returns `(dataset, batch_size)`: without an `input_context`, `dataset`
    itself and `global_batch_size`.

    Args:
        dataset: the whole dataset, of single examples.
        global_batch_size: the batch size over all replicas.
        input_context: this input pipeline's `tf.distribute.InputContext` (its id, the pipelines, the per-replica
            batch size); None outside a strategy's distribution.
    """
    if input_context is None:
        return dataset, global_batch_size
    return (dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id),
            input_context.get_per_replica_batch_size(global_batch_size))


def total_loss(task: Task, labels, outputs, model):
    """`task.build_losses(labels, outputs, aux_losses=model.losses)`, with the model's
    losses added if the returned loss does not depend on them.

    Whether it does is decided when the step is traced (a gradient of the
    loss with respect to the model's losses exists or not), so a task's own
    `loss + tf.add_n(aux_losses)` (Model Garden's way) is never added twice,
    and a task that ignores them trains with them, as under Keras `fit`.

    Args:
        task: the task whose `build_losses` is called.
        labels: the labels of one replica's batch (the second of each `(features, labels)` element).
        outputs: the model's outputs on that batch (float32 under mixed precision).
        model: the model, whose `losses` are the aux losses.

    Returns:
        The scalar loss the step minimizes.
    """
    aux_losses = list(model.losses)
    if not aux_losses:
        return task.build_losses(labels, outputs, aux_losses=[])
    loss, ignored = loss_and_ignored_aux(task, labels, outputs, aux_losses)
    if ignored:
        loss = loss + tf.cast(tf.add_n([tf.cast(a, loss.dtype) for a in aux_losses]), loss.dtype)
        noted = _IGNORED_AUX.get()
        if noted is not None:
            noted.append(len(aux_losses))
    return loss


# What `total_loss` added while a step was traced (`noting_ignored_aux`); None: not noting.
_IGNORED_AUX: contextvars.ContextVar[Optional[List[int]]] = contextvars.ContextVar(
    "ctl_ignored_aux", default=None)


@contextlib.contextmanager
def noting_ignored_aux():
    """Within it, `total_loss` notes in the yielded list how many of the model's losses it
    added to a `build_losses` that ignores them (an entry each time), as a step is traced."""
    noted: List[int] = []
    token = _IGNORED_AUX.set(noted)
    try:
        yield noted
    finally:
        _IGNORED_AUX.reset(token)


def loss_and_ignored_aux(task: Task, labels, outputs, aux_losses):
    """`(task.build_losses(labels, outputs, aux_losses), whether the loss ignores them)`.

    Args:
        task: the task whose `build_losses` is called.
        labels: the labels of one replica's batch (the second of each `(features, labels)` element).
        outputs: the model's outputs on that batch (float32 under mixed precision).
        aux_losses: the model's losses (at least one).
    """
    aux_losses = [tf.convert_to_tensor(a) for a in aux_losses]
    with tf.GradientTape(watch_accessed_variables=False) as probe:
        probe.watch(aux_losses)
        loss = task.build_losses(labels, outputs, aux_losses=aux_losses)
    if not tf.is_tensor(loss) or not loss.dtype.is_floating:
        return loss, False  # The contract check names such a loss.
    gradients = probe.gradient(loss, aux_losses)
    return loss, all(gradient is None for gradient in gradients)


# The default serving signature (`Task.serving_signatures`; `ctl.hooks.exporting` writes it).

DEFAULT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY  # "serving_default"


class ServingSignatures(dict):
    """Serving signatures by name, with the `tf.Module` that tracks everything they read (the
    model's variables, a tokenizer's resource): an export saves that module in place of the model.

    Args:
        signatures: the signatures by name (`tf.function`s with an input signature, or concrete functions).
        module: the `tf.Module` tracking what they read; None: the model does.
    """

    def __init__(self, signatures: Dict[str, Callable], module: Optional[tf.Module] = None):
        super().__init__(signatures)
        self.module = module


def default_serving_signatures(model) -> Dict[str, Callable]:
    """One `serving_default` signature from the model's Keras inputs.

    The signature takes the model's inputs as named tensors (the keys of a dict
    input, else the Input names) and returns `{"outputs": model(inputs,
    training=False)}` (or the model's own dict of outputs).

    Args:
        model: a Keras model with Keras inputs (built from `Input`s, or called once).
    """
    try:
        structure = model.input  # The nested inputs of a functional model.
    except (AttributeError, ValueError):
        inputs = getattr(model, "inputs", None)  # Keras 3 Sequential has only these.
        structure = (inputs[0] if len(inputs) == 1 else list(inputs)) if inputs else None
    if structure is None:
        raise UserError(
            f"cannot tell the serving signature of {type(model).__name__}: it has no Keras "
            "inputs; override Task.serving_signatures(model) to declare it."
        )
    flat = tf.nest.flatten(structure)
    if isinstance(structure, dict) and len(flat) == len(structure):
        names = sorted(structure)  # tf.nest flattens a dict in sorted key order.
    else:
        names = [_input_name(x, i) for i, x in enumerate(flat)]
    specs = [tf.TensorSpec(tuple(x.shape), tf.as_dtype(x.dtype), name=name)
             for x, name in zip(flat, names)]

    def serve(*features):
        outputs = model(tf.nest.pack_sequence_as(structure, list(features)), training=False)
        return outputs if isinstance(outputs, dict) else {"outputs": outputs}

    return {DEFAULT_SIGNATURE: tf.function(serve, input_signature=specs)}


def _input_name(tensor, index: int) -> str:
    name = str(getattr(tensor, "name", "") or "").split(":")[0]
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return name if name and not name.startswith("keras_tensor") else f"input_{index}"
