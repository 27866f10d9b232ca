"""`ctl.KerasModelTask`: a model you `compile()` and `fit()`, trained by ctl unchanged.

The model's compiled loss, metrics and optimizer train it as `fit` would, on data given as
fit's `(x, y)` or a dataset of examples; `KerasModelTask`'s docstring shows the gin lines
and each setting (docs/how-to/from-model-fit.md walks through a conversion).
"""

import importlib
from typing import Any, Callable, Optional, Union

import gin
import tensorflow as tf

from ctl.utils.errors import UserError
from ctl.core.task import Task, shard_for_pipeline


@gin.configurable(module="ctl")
class KerasModelTask(Task):
    """Trains a compiled Keras model with its compiled loss, metrics and optimizer.

        def my_model():                       # what you already have
            model = keras.Sequential([...])
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"])
            return model

        ctl.Experiment.task = @ctl.KerasModelTask()
        # Plain functions, by path; the data functions return (x, y) or a dataset.
        ctl.KerasModelTask.model_fn = 'my_package.my_module.my_model'
        ctl.KerasModelTask.train_data = 'my_package.my_module.my_train_data'
        # fit's validation_data:
        ctl.KerasModelTask.eval_data = 'my_package.my_module.my_eval_data'
        ctl.KerasModelTask.batch_size = 32                # fit's batch_size (global)

    Each function is a `'package.module.function'` string (imported when the task is built:
    the function needs no gin decorator), or `@my_model` for one decorated with
    `@gin.configurable` (or registered with `gin.external_configurable`) in a module the gin
    file imports. After the run, `ctl.restore_model(my_model(), model_dir)` gives the trained
    model back.

    The model's compiled loss (`Model.compute_loss`, with its regularization losses), compiled
    metrics (`Model.compute_metrics`) and optimizer train it, as `fit` would; the model may be
    Keras 3 or tf_keras. The train data is shuffled and repeated; the eval data is read once per
    evaluation, its remainder batch kept. Both Keras flavours divide `compute_loss` by the
    replicas in sync under a distribution strategy (their losses are made for summed
    gradients); the step applies those gradients as they are and reports the per-replica mean.

    Args:
        model_fn: a function returning the compiled Keras model (`model.compile(optimizer=..., loss=...,
            metrics=...)`): a `'package.module.function'` string or a gin reference (`@my_model`).
        train_data: a function returning the train data: fit's `(x, y)` arrays, or a `tf.data.Dataset` of single `(x,
            y)` examples (not batched). A string or a gin reference, as `model_fn`.
        eval_data: the same for the validation data (fit's `validation_data`); None: no evaluation is possible.
        batch_size: fit's `batch_size`: the global batch, over all replicas (a positive integer).
        shuffle_buffer: examples in the train data's shuffle buffer; 0 does not shuffle.
        seed: the shuffle's seed (None: a different order each run).

    Raises:
        UserError: a function that cannot be imported or is not callable, or a batch size that is not a positive
            integer.
    """

    def __init__(self, model_fn: Union[str, Callable[[], Any]] = gin.REQUIRED,
                 train_data: Union[str, Callable[[], Any]] = gin.REQUIRED,
                 eval_data: Union[None, str, Callable[[], Any]] = None, batch_size: int = 32,
                 shuffle_buffer: int = 10_000, seed: Optional[int] = None):
        model_fn = _function("model_fn", model_fn)
        train_data = _function("train_data", train_data)
        eval_data = None if eval_data is None else _function("eval_data", eval_data)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"ctl.KerasModelTask.batch_size ({batch_size!r}) must be a positive "
                            "integer (fit's batch_size: the global batch).")
        self.model_fn = model_fn
        self.train_data = train_data
        self.eval_data = eval_data
        self.batch_size = batch_size
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.model: Any = None

    # The model and its optimizer, as compiled.

    def build_model(self):
        model = self.model_fn()
        if getattr(model, "optimizer", None) is None or not hasattr(model, "compute_loss"):
            raise UserError(
                f"ctl.KerasModelTask.model_fn returned {type(model).__name__}, not a compiled "
                "Keras model; call model.compile(optimizer=..., loss=..., metrics=...) in it.")
        self.model = model
        self._build_compiled(model)
        return model

    def _build_compiled(self, model) -> None:
        """Calls the model, its compiled loss and metrics once on one train batch, so that
        their variables exist (per replica) before a train step is traced."""
        x, y = next(iter(self._dataset(self.train_data, "train_data").batch(self.batch_size)))

        def call(x, y):
            y_pred = model(x, training=False)
            model.compute_loss(x, y, y_pred)
            model.compute_metrics(x, y, y_pred, None)

        tf.distribute.get_strategy().run(call, args=(x, y))

    def build_optimizer(self):
        return self.model.optimizer

    def build_metrics(self, training: bool = True):
        """The model's compiled metrics (shared by training and evaluation; ctl resets
        them before each loop and each evaluation). Its own loss tracker is left out:
        ctl keeps the loss.

        Args:
            training: not read: training and evaluation share the compiled metrics.
        """
        del training
        return [metric for metric in self.model.metrics if metric.name != "loss"]

    # The steps: Keras' own loss and metrics.

    def build_losses(self, labels, outputs, aux_losses=None):
        """The compiled loss, per replica, with the model's regularization losses.

        Args:
            labels: the labels of one replica's batch (the second of each `(features, labels)` element).
            outputs: the model's outputs on that batch (float32 under mixed precision).
            aux_losses: not read: `compute_loss` adds `model.losses` itself.
        """
        del aux_losses  # compute_loss adds model.losses itself.
        return self.model.compute_loss(None, labels, outputs) * _replicas()

    def train_step(self, inputs, model, optimizer, metrics):
        """One replica's step as `fit`'s: the compiled loss, its gradients applied, the compiled metrics updated.

        Args:
            inputs: one replica's batch, `(x, y)`.
            model: the compiled model.
            optimizer: under a Trainer its `ctl.core.train_step.GradientPipeline`; else a Keras optimizer.
            metrics: not read: the compiled metrics are updated through the model.

        Returns:
            `{"loss": loss}`, the per-replica loss.
        """
        x, y = inputs
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred)  # Divided by the replicas in sync.
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        model.compute_metrics(x, y, y_pred, None)
        return {"loss": loss * _replicas()}

    def validation_step(self, inputs, model, metrics):
        """One replica's eval step: the compiled loss and metrics.

        Args:
            inputs: one replica's batch, `(x, y)`.
            model: the model evaluated.
            metrics: not read: the compiled metrics are updated through the model.

        Returns:
            `{"loss": loss}`, the per-replica loss.
        """
        x, y = inputs
        y_pred = model(x, training=False)
        loss = model.compute_loss(x, y, y_pred)
        model.compute_metrics(x, y, y_pred, None)
        return {"loss": loss * _replicas()}

    # The data: fit's (x, y), or a dataset of examples.

    def build_inputs(self, training: bool, input_context=None) -> tf.data.Dataset:
        """This pipeline's share of the train data (shuffled, repeated, batches of the per-replica size) or of the eval
        data (read once, its remainder batch kept).

        Args:
            training: True for the train dataset, False for an eval dataset.
            input_context: this input pipeline's `tf.distribute.InputContext` (its id, the pipelines, the per-replica
                batch size); None outside a strategy's distribution.

        Raises:
            UserError: an evaluation without `eval_data`.
        """
        source, name = (self.train_data, "train_data") if training else (
            self.eval_data, "eval_data")
        if source is None:
            raise UserError("ctl.KerasModelTask.eval_data is not set; bind it to a function "
                            "returning the validation (x, y) to evaluate.")
        dataset, batch_size = shard_for_pipeline(self._dataset(source, name), self.batch_size,
                                                 input_context)
        if training:
            if self.shuffle_buffer:
                dataset = dataset.shuffle(self.shuffle_buffer, seed=self.seed)
            dataset = dataset.repeat()
        return dataset.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)

    def _dataset(self, source, name: str) -> tf.data.Dataset:
        data = source()
        if isinstance(data, tf.data.Dataset):
            return data
        if isinstance(data, (tuple, list)) and len(data) == 2:
            return tf.data.Dataset.from_tensor_slices(tuple(data))
        raise UserError(
            f"ctl.KerasModelTask.{name} returned {type(data).__name__}; return fit's (x, y) "
            "or a tf.data.Dataset of single (x, y) examples.")


def _function(name: str, value):
    """`value`, a function; a `'package.module.function'` string is imported."""
    if isinstance(value, str) and "." in value.strip("."):
        module_name, function_name = value.rsplit(".", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise UserError(f"ctl.KerasModelTask.{name} ({value!r}): cannot import "
                            f"{module_name!r} ({error}); name a module on the PYTHONPATH, "
                            "as 'package.module.function'.") from error
        if not callable(getattr(module, function_name, None)):
            raise UserError(f"ctl.KerasModelTask.{name} ({value!r}): module {module_name!r} "
                            f"has no function {function_name!r}; check the name.")
        return getattr(module, function_name)
    if not callable(value):
        raise UserError(f"ctl.KerasModelTask.{name} ({value!r}) must be a function: bind a "
                        f"'package.module.function' string (ctl.KerasModelTask.{name} = "
                        f"'my_package.my_module.my_function'), or @my_function for a function "
                        "decorated with @gin.configurable.")
    return value


def _replicas() -> int:
    return tf.distribute.get_strategy().num_replicas_in_sync
