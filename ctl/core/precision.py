"""Mixed precision: the Keras dtype policy while a task builds its model, loss scaling, float32 outputs.

    ctl.Trainer.mixed_precision = 'mixed_bfloat16'    # or 'mixed_float16', or None

Both Keras flavours keep their own global policy (`keras.mixed_precision`,
`tf_keras.mixed_precision`); ctl sets the policy of each while the task builds
its model (a layer takes the global policy when it is constructed) and puts the
previous policies back afterwards, so nothing leaks into other models of the
process. Variables stay float32; layers compute in float16 or bfloat16.

With `mixed_float16` the optimizer is wrapped in the `LossScaleOptimizer` of
its own flavour (dynamic loss scaling): the loss is multiplied by the scale
before gradients are taken, gradients are divided by it, and an update whose
gradients overflow is skipped (the scale halves) rather than applied.
`bfloat16` has float32's range and needs no loss scale.

ctl never imports tf_keras itself: a tf_keras model or optimizer means the
task imported it already.
"""

import contextlib
import sys
from typing import Optional

import keras
import tensorflow as tf

from ctl.utils.errors import require_choice

POLICIES = ("mixed_float16", "mixed_bfloat16")


def validate(mixed_precision: Optional[str]) -> None:
    """Raises `UserError` unless `mixed_precision` is None or a policy ctl knows.

    Args:
        mixed_precision: `ctl.Trainer.mixed_precision`.
    """
    if mixed_precision is not None:
        require_choice("ctl.Trainer.mixed_precision", mixed_precision, POLICIES + ("None",))


def _flavours():
    """The Keras modules whose policy ctl sets: Keras 3, and tf_keras if it is imported."""
    return [module for module in (keras, sys.modules.get("tf_keras")) if module is not None]


@contextlib.contextmanager
def policy(mixed_precision: Optional[str]):
    """Within: every Keras flavour's global dtype policy is `mixed_precision` (None: unchanged).

    Args:
        mixed_precision: a Keras dtype policy name, or None.
    """
    if mixed_precision is None:
        yield
        return
    _import_tf_keras_if_installed()
    previous = [(module, module.mixed_precision.global_policy()) for module in _flavours()]
    try:
        for module, _ in previous:
            module.mixed_precision.set_global_policy(mixed_precision)
        yield
    finally:
        for module, old in previous:
            module.mixed_precision.set_global_policy(old)


def _import_tf_keras_if_installed() -> None:
    """A task may import tf_keras only inside `build_model`: its policy must be set before."""
    try:
        import tf_keras  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        pass


def is_tf_keras(obj) -> bool:
    """Whether `obj` (a model, optimizer or schedule) is a tf_keras object.

    Args:
        obj: a model, optimizer or schedule.
    """
    return type(obj).__module__.split(".", 1)[0] == "tf_keras"


def wrap_optimizer(optimizer, mixed_precision: Optional[str]):
    """`optimizer`, in its flavour's `LossScaleOptimizer` under `mixed_float16`.

    Args:
        optimizer: the task's optimizer.
        mixed_precision: the policy (only `mixed_float16` wraps).
    """
    if mixed_precision != "mixed_float16" or is_loss_scaled(optimizer):
        return optimizer
    flavour = sys.modules["tf_keras"] if is_tf_keras(optimizer) else keras
    return flavour.mixed_precision.LossScaleOptimizer(optimizer)


def is_loss_scaled(optimizer) -> bool:
    """Whether `optimizer` is a Keras 3 or tf_keras `LossScaleOptimizer`.

    Args:
        optimizer: an optimizer.
    """
    return any(isinstance(optimizer, module.mixed_precision.LossScaleOptimizer)
               for module in _flavours())


def loss_scale(optimizer) -> Optional[tf.Tensor]:
    """The current loss scale of a `LossScaleOptimizer`, else None.

    Args:
        optimizer: an optimizer.
    """
    if not is_loss_scaled(optimizer):
        return None
    if is_tf_keras(optimizer):
        return tf.convert_to_tensor(optimizer.loss_scale)
    return tf.convert_to_tensor(optimizer.dynamic_scale)


@tf.autograph.experimental.do_not_convert  # No control flow on tensors (tracing time).
def float32_outputs(outputs):
    """`outputs` with every float16/bfloat16 tensor cast to float32, for losses and metrics.

    Args:
        outputs: a model's outputs (a tensor or a nest of them).
    """
    def cast(tensor):
        if isinstance(tensor, tf.Tensor) and tensor.dtype in (tf.float16, tf.bfloat16):
            return tf.cast(tensor, tf.float32)
        return tensor
    return tf.nest.map_structure(cast, outputs)
