"""Learning-rate schedules from gin: Keras' own, and a linear warmup in front of any of them.

    DigitsTask.learning_rate = @ctl.with_warmup()
    ctl.with_warmup.schedule = @keras.optimizers.schedules.CosineDecay()
    ctl.with_warmup.warmup_steps = 100
    keras.optimizers.schedules.CosineDecay.initial_learning_rate = 1e-3
    keras.optimizers.schedules.CosineDecay.decay_steps = 2000

Every `LearningRateSchedule` of Keras 3 is registered with gin under its
Keras name (`keras.optimizers.schedules.NAME`); a module that uses tf_keras
registers tf_keras' with `ctl.register_schedules(tf_keras)`
(`tf_keras.optimizers.schedules.NAME`). A schedule is evaluated at the
optimizer's iteration count, which advances once per update (with
`ctl.Trainer.accumulation_steps`, once per K batches); the loop summaries show
its value at the end of each loop (`learning_rate`).
"""

import functools
import inspect
import sys

import gin
import keras
import tensorflow as tf

from ctl.utils.errors import UserError


def register_schedules(keras_module) -> None:
    """Registers every `LearningRateSchedule` of `keras_module` (keras or tf_keras) with gin.

    Args:
        keras_module: the `keras` or `tf_keras` module whose `optimizers.schedules` are registered.
    """
    schedules = keras_module.optimizers.schedules
    module = f"{keras_module.__name__}.optimizers.schedules"
    for name, cls in sorted(vars(schedules).items()):
        if (inspect.isclass(cls) and issubclass(cls, schedules.LearningRateSchedule)
                and cls is not schedules.LearningRateSchedule):
            try:
                gin.external_configurable(cls, name=name, module=module)
            except ValueError:  # Registered already (a second call).
                pass


@gin.configurable(module="ctl")
def with_warmup(schedule, warmup_steps: int, initial_learning_rate: float = 0.0):
    """`schedule` after a linear ramp from `initial_learning_rate` over `warmup_steps` updates.

    During the ramp the rate goes linearly to `schedule(warmup_steps)`; after
    it, the rate is `schedule(step)`. Returns a schedule of `schedule`'s own
    Keras flavour (an optimizer accepts only its own).

    Args:
        schedule: a Keras `LearningRateSchedule`, of Keras 3 or of tf_keras.
        warmup_steps: the updates the ramp lasts.
        initial_learning_rate: the rate at step 0.
    """
    base = _base_class(schedule)
    if base is None:
        raise UserError(f"ctl.with_warmup.schedule ({schedule!r}) must be a Keras 3 or tf_keras "
                        "LearningRateSchedule.")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise UserError(f"ctl.with_warmup.warmup_steps ({warmup_steps!r}) must be a positive integer.")
    return _warmup_class(base)(schedule, warmup_steps, initial_learning_rate)


def _base_class(schedule):
    for module in (keras, sys.modules.get("tf_keras")):
        if module is not None and isinstance(schedule, module.optimizers.schedules.LearningRateSchedule):
            return module.optimizers.schedules.LearningRateSchedule
    return None


@functools.lru_cache(maxsize=None)
def _warmup_class(base):
    class LinearWarmUp(base):
        def __init__(self, schedule, warmup_steps, initial_learning_rate=0.0):
            super().__init__()
            self.schedule = schedule
            self.warmup_steps = warmup_steps
            self.initial_learning_rate = initial_learning_rate

        def __call__(self, step):
            step = tf.cast(step, tf.float32)
            warmup = tf.cast(self.warmup_steps, tf.float32)
            start = tf.cast(self.initial_learning_rate, tf.float32)
            target = tf.cast(self.schedule(self.warmup_steps), tf.float32)
            ramp = start + (target - start) * step / warmup
            return tf.where(step < warmup, ramp, tf.cast(self.schedule(step), tf.float32))

        def get_config(self):
            return {"schedule": self.schedule.get_config(), "warmup_steps": self.warmup_steps,
                    "initial_learning_rate": self.initial_learning_rate}

    return LinearWarmUp


register_schedules(keras)
