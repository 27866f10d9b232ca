"""The gradient pipeline of a train step: loss scaling, clipping, accumulation, the update.

A task's `train_step` receives the trainer's `GradientPipeline` as its `optimizer`: it takes
gradients of `optimizer.scale_loss(loss)` and calls `optimizer.apply_gradients` once, which only
records them. The Trainer runs the update after the task's step returns (`update`, per replica),
so that with `jit_compile` XLA compiles the task's step without cross-replica synchronization:

    g = recorded gradients (+ those of earlier micro-batches of this update)
    if clipping or loss scaling:  g = sum of g over replicas   (all-reduce)
    g = g / accumulation_steps;  norm = global_norm(g) / loss scale   -> `gradient_norm`
    if clip_norm: g = g * min(1, clip_norm / norm)
    optimizer.apply_gradients(g)        # LossScaleOptimizer: unscale, skip on overflow

What a custom `train_step` must do, and the settings (`ctl.Trainer.clip_norm`,
`accumulation_steps`, ...): docs/train_step.md.
"""

import inspect
import threading
from typing import List, Optional

import keras
import tensorflow as tf

from ctl.core import precision
from ctl.utils.errors import UserError

# What a train step calls here has no Python control flow on tensors: autograph need
# not convert it (converting these was a share of the digits job's time: bench figure 8, bench/README.md).
# The functions that lead to the task's own code stay converted (ctl.core.trainer).
_plain = tf.autograph.experimental.do_not_convert


def validate(clip_norm: Optional[float], accumulation_steps: int) -> None:
    """Raises `UserError` unless `clip_norm` is None or positive and `accumulation_steps` a positive integer.

    Args:
        clip_norm: `ctl.Trainer.clip_norm`.
        accumulation_steps: `ctl.Trainer.accumulation_steps`.
    """
    if clip_norm is not None and (isinstance(clip_norm, bool) or not isinstance(
            clip_norm, (int, float)) or not clip_norm > 0):
        raise UserError(f"ctl.Trainer.clip_norm ({clip_norm!r}) must be a positive number or "
                        "None (no clipping).")
    if isinstance(accumulation_steps, bool) or not isinstance(
            accumulation_steps, int) or accumulation_steps < 1:
        raise UserError(f"ctl.Trainer.accumulation_steps ({accumulation_steps!r}) must be a "
                        "positive integer (1: an update per batch).")


@_plain
def scale_loss(optimizer, loss):
    """What a train step differentiates: `optimizer.scale_loss(loss)` for ctl's
    pipeline; for a plain Keras optimizer, the loss over the replica count
    (gradients are summed over replicas).

    Args:
        optimizer: the step's optimizer: ctl's `GradientPipeline` or a Keras optimizer.
        loss: this replica's loss.
    """
    if isinstance(optimizer, GradientPipeline):
        return optimizer.scale_loss(loss)
    return loss / tf.distribute.get_strategy().num_replicas_in_sync


class GradientPipeline:
    """Loss scaling, clipping, accumulation and the optimizer update of a train step.

    Built by the Trainer inside its strategy's scope; `optimizer` is the
    trainer's Keras optimizer (a `LossScaleOptimizer` under `mixed_float16`).

    Args:
        optimizer: the trainer's Keras optimizer (a `LossScaleOptimizer` under `mixed_float16`).
        variables: the variables it updates (the model's trainable ones), or a callable returning them, read as
            each step is traced (a model may make variables on its first call).
        clip_norm: clip the gradients, summed over replicas, to this global norm (None: no clipping).
        accumulation_steps: one update per this many batches.
        model_optimizer: the model's own optimizer (`model.optimizer`, set by `compile`), if any. When it is
            `optimizer` itself, a train step may apply the update through the model (Keras' `Model.train_step`
            calls `self.optimizer.apply_gradients`) instead of through this pipeline (`recorded`).
    """

    def __init__(self, optimizer, variables, clip_norm: Optional[float] = None,
                 accumulation_steps: int = 1, model_optimizer=None):
        validate(clip_norm, accumulation_steps)
        self.inner = optimizer
        self.model_updates = model_optimizer is not None and model_optimizer is optimizer
        self.clip_norm = clip_norm
        self.accumulation_steps = accumulation_steps
        self.loss_scaled = precision.is_loss_scaled(optimizer)
        # A callable is read at each trace: a model may make variables on its first call.
        self._source = variables if callable(variables) else (lambda fixed=list(variables): fixed)
        self._replicas = tf.distribute.get_strategy().num_replicas_in_sync
        # Clipping needs the whole gradient, and so does the overflow check (one
        # replica's overflow must skip the update on all of them).
        self._sum_here = clip_norm is not None or self.loss_scaled
        self._aggregation_kwargs = _skip_aggregation_kwargs(optimizer) if self._sum_here else {}
        self.gradient_norm = keras.metrics.Mean("gradient_norm") if clip_norm else None
        # Each replica's running sum over the micro-batches of one update;
        # zero between train steps, so they are not in the checkpoint.
        self._sums = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="ctl_gradient_sum",
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM)
            for v in self._variables
        ] if accumulation_steps > 1 else []
        self._summed = [id(v) for v in self._variables] if self._sums else []
        self._recording = threading.local()  # Per replica thread (MirroredStrategy).

    @property
    def _variables(self) -> list:
        return list(self._source())

    # What a task's train_step calls.

    @property
    def iterations(self):
        return self.inner.iterations

    @property
    def learning_rate(self):
        return self.inner.learning_rate

    @_plain
    def scale_loss(self, loss):
        """This replica's share of the loss to differentiate: `loss / replicas * loss scale`.

        Args:
            loss: this replica's unscaled loss.
        """
        if self._replicas > 1:
            loss = loss / self._replicas
        recorder = self._recorder("scale_loss")
        recorder.scaled = True
        if not self.loss_scaled:
            return loss
        if precision.is_tf_keras(self.inner):
            return self.inner.get_scaled_loss(loss)
        return self.inner.scale_loss(loss)

    @_plain
    def apply_gradients(self, grads_and_vars, **unused_kwargs) -> None:
        """Records this replica's gradients; the Trainer applies them after the step returns.

        Args:
            grads_and_vars: `(gradient, variable)` pairs, as Keras optimizers take them.
            **unused_kwargs: Keras' other arguments (not read).
        """
        recorder = self._recorder("apply_gradients")
        if recorder.gradients is not None:
            raise UserError("a train_step called optimizer.apply_gradients twice; ctl applies "
                            "one set of gradients per step (sum them first).")
        if self.loss_scaled and not recorder.scaled:
            raise UserError(
                "with ctl.Trainer.mixed_precision='mixed_float16' a train_step must take "
                "gradients of optimizer.scale_loss(loss) (it applies the loss scale); see "
                "docs/train_step.md.")
        by_variable = {id(v): g for g, v in grads_and_vars}
        if self._sums and [id(v) for v in self._variables] != self._summed:
            raise UserError("the model made variables on its first call, after the Trainer built "
                            "the sums of ctl.Trainer.accumulation_steps; build them in "
                            "build_model (call the model once there).")
        unknown = set(by_variable) - {id(v) for v in self._variables}
        if unknown:
            raise UserError("a train_step applied gradients to variables that are not the "
                            "model's trainable variables; ctl updates model.trainable_variables.")
        recorder.gradients = [by_variable.get(id(v)) for v in self._variables]

    # What the Trainer calls.

    def recording(self):
        """Context for one replica's task step: yields the recorder of its gradients."""
        return _Recording(self._recording)

    @_plain
    def recorded(self, recording, task_name: str):
        """The gradients a replica's step recorded; None where the model applied its update itself.

        Args:
            recording: the step's `recording()`, after the step.
            task_name: the task's class name, for the messages.

        Raises:
            UserError: a step that applied no gradients; or one that updated through the model's own
                optimizer while clipping, accumulation or loss scaling need its gradients.
        """
        if recording.gradients is not None:
            return recording.gradients
        if not self.model_updates:
            raise UserError(f"{task_name}.train_step did not call optimizer.apply_gradients; "
                            "call it once per step.")
        if self.clip_norm is not None or self.accumulation_steps > 1:
            raise UserError(
                f"{task_name}.train_step updates the model through its own optimizer "
                "(model.optimizer), so ctl.Trainer.clip_norm and accumulation_steps cannot "
                "reach its gradients; leave them unset, or call optimizer.apply_gradients.")
        return None

    @_plain
    def update(self, gradients: List, apply: bool) -> None:
        """Adds `gradients` to this update's sum; with `apply`, applies the update (replica context).

        Args:
            gradients: this replica's gradients of the micro-batch, in the order of `variables`.
            apply: the update's last micro-batch: apply the sum.
        """
        if gradients is None:  # The model applied its own update (`recorded`).
            return
        if not apply:
            for total, gradient in zip(self._sums, gradients):
                if gradient is not None:
                    total.assign_add(tf.convert_to_tensor(gradient))
            return
        if self._sums:
            gradients = [None if g is None else s.read_value() + tf.convert_to_tensor(g)
                         for s, g in zip(self._sums, gradients)]
            for total in self._sums:
                total.assign(tf.zeros_like(total))
        present = [i for i, g in enumerate(gradients) if g is not None]
        values = [gradients[i] for i in present]
        trainable = self._variables  # Read once: each read walks the model's layers.
        variables = [trainable[i] for i in present]
        if self._sum_here and self._replicas > 1:
            values = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, values)
        if self.accumulation_steps > 1:
            values = [g / self.accumulation_steps for g in values]
        if self.clip_norm is not None:
            scale = precision.loss_scale(self.inner) if self.loss_scaled else None
            norm = tf.linalg.global_norm(values)
            threshold = tf.constant(self.clip_norm, norm.dtype)
            if scale is not None:  # Clip the scaled gradients: the same as unscaled, scaled.
                threshold = threshold * scale
            values, _ = tf.clip_by_global_norm(values, threshold, use_norm=norm)
            # Summarized over the updates that are applied (an overflow is skipped).
            finite = tf.math.is_finite(norm)
            norm = norm if scale is None else norm / scale
            self.gradient_norm.update_state(tf.where(finite, norm, tf.zeros_like(norm)),
                                            sample_weight=tf.cast(finite, norm.dtype))
        self._apply(values, variables)

    @_plain
    def _apply(self, values, variables) -> None:
        optimizer = self.inner
        if self.loss_scaled and precision.is_tf_keras(optimizer):
            values = optimizer.get_unscaled_gradients(values)  # Keras 3's unscales in apply.
        if self._sum_here and self._replicas > 1 and not self._aggregation_kwargs:
            # The optimizer sums over replicas again: hand it each replica's share.
            values = [g / self._replicas for g in values]
        optimizer.apply_gradients(list(zip(values, variables)), **self._aggregation_kwargs)

    def metrics(self) -> list:
        """Metrics of the loop summaries: `gradient_norm` (pre-clip) when clipping."""
        return [self.gradient_norm] if self.gradient_norm is not None else []

    @_plain
    def _recorder(self, method: str):
        recorder = getattr(self._recording, "current", None)
        if recorder is None:
            raise UserError(f"optimizer.{method} was called outside the Trainer's train step.")
        return recorder


class _Recording:
    def __init__(self, local: threading.local):
        self._local = local
        self.gradients = None
        self.scaled = False

    def __enter__(self):
        self._local.current = self
        return self

    def __exit__(self, *unused):
        self._local.current = None


def _skip_aggregation_kwargs(optimizer) -> dict:
    """The keyword that stops `optimizer.apply_gradients` summing over replicas again, if any.

    tf_keras optimizers have one (`skip_gradients_aggregation`, or the legacy
    `experimental_aggregate_gradients`); Keras 3's always sum.
    """
    parameters = inspect.signature(optimizer.apply_gradients).parameters
    if "skip_gradients_aggregation" in parameters:
        return {"skip_gradients_aggregation": True}
    if "experimental_aggregate_gradients" in parameters:
        return {"experimental_aggregate_gradients": False}
    return {}
