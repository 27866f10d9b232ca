"""A moving average of the weights, kept in a second copy of the model.

    ctl.Trainer.ema_decay = 0.999

After every train step (one optimizer update, or one attempted update under
`mixed_float16`), in the train loop's graph:

    average = weights                                      # the first update
    average = decay * average + (1 - decay) * weights      # every later one

for each trainable variable; the model's other variables (batch-norm
statistics) are copied as they are. The average lives in `average_model`, a
second model the task builds, so evaluation, exports and the best checkpoint
simply use that model (`Trainer.eval_model`): no weights are swapped in and
out. Before the first update the average is the weights themselves.

The checkpoint holds it as `ema` (`ema/model`, `ema/updates`), so a resumed
run continues the same average. Works for Keras 3 and tf_keras models alike:
only their variables are read and assigned.
"""

import tensorflow as tf

from ctl.utils.errors import UserError


def validate(decay) -> None:
    """Raises `UserError` unless `decay` is None or a number between 0 and 1.

    Args:
        decay: `ctl.Trainer.ema_decay`.
    """
    if decay is not None and (isinstance(decay, bool) or not isinstance(decay, (int, float))
                              or not 0.0 < decay < 1.0):
        raise UserError(f"ctl.Trainer.ema_decay ({decay!r}) must be a number between 0 and 1 "
                        "(e.g. 0.999), or None for no moving average.")


class MovingAverage:
    """The exponential moving average of `model`'s trainable weights, held in `average_model`.

    Args:
        model: the trained model.
        average_model: a second copy of it (another `build_model()`), which holds the average.
        decay: the average's decay per update, between 0 and 1 (e.g. 0.999).

    Raises:
        UserError: the two models are one, or have different variables.
    """

    def __init__(self, model, average_model, decay: float):
        validate(decay)
        self.decay = decay
        self.model = average_model
        pairs = list(zip(average_model.variables, model.variables))
        if average_model is model or len(average_model.variables) != len(model.variables) or any(
                tuple(a.shape) != tuple(w.shape) for a, w in pairs):
            raise UserError(
                "ctl.Trainer.ema_decay needs Task.build_model() to build the same model each "
                "time it is called (the average lives in a second copy); it returned the "
                "same model, or models with different variables.")
        trainable = {id(v) for v in model.trainable_variables}
        self._averaged = [(a, w) for a, w in pairs if id(w) in trainable]
        self._copied = [(a, w) for a, w in pairs if id(w) not in trainable]
        self.updates = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="ema_updates")
        # What the checkpoint holds, under `ema`.
        self.state = tf.train.Checkpoint(model=average_model, updates=self.updates)

    def update(self) -> None:
        """One step of the average (in the train step's graph, cross-replica context)."""
        first = tf.equal(self.updates.read_value(), 0)
        for average, weight in self._averaged:
            decay = tf.where(first, tf.constant(0.0, average.dtype),
                             tf.constant(self.decay, average.dtype))
            value = tf.convert_to_tensor(weight)
            average.assign(decay * tf.convert_to_tensor(average) + (1 - decay) * value)
        self._copy(self._copied)
        self.updates.assign_add(1)

    def follow_weights_if_unstarted(self) -> None:
        """Before the first update, the average is the weights themselves (eager)."""
        if int(self.updates.numpy()) == 0:
            self._copy(self._averaged + self._copied)

    @staticmethod
    def _copy(pairs) -> None:
        for average, weight in pairs:
            average.assign(tf.convert_to_tensor(weight))
