"""A train loop that checks, before every step, whether it must stop.

orbit's loops run `num_steps` steps no matter what. `StepGuard` gives the
Trainer a loop that also ends early, at a step boundary, when

  * a stop was requested (`ctl.faults.preemption.SignalWatcher` sets a variable), or
  * the last step's loss was NaN or Inf (`check_loss`, called by the Trainer
    after each step, records that step in `bad_step`).

Both are `tf.Variable`s read inside the loop, so the check costs one variable
read per step and works the same in a host loop and in one `tf.while_loop`:

    i = 0
    while i < num_steps and not (stop_requested or bad_step >= 0):   # in-graph
      train_step(iterator)        # ends with check_loss(loss, global_step)
      i += 1

What to do after such a loop (save, restore, raise) is `ctl.faults.handler`' job.
"""

import tensorflow as tf

from ctl.core.trainer import NO_BAD_STEP


class StepGuard:
    """Per-step stop conditions of the train loop (variables live on the host).

    Implements the Trainer's extension point `ctl.core.trainer.StepGuard`.
    """

    def __init__(self, stop_requested: tf.Variable):
        self.stop_requested = stop_requested
        self.bad_step = tf.Variable(
            tf.constant(NO_BAD_STEP, tf.int64), trainable=False, name="ctl_bad_step"
        )

    def should_stop(self) -> tf.Tensor:
        """Whether the loop must end before its next step (graph or eager)."""
        return tf.logical_or(self.stop_requested.read_value(),
                             self.bad_step.read_value() >= 0)

    def check_loss(self, strategy: tf.distribute.Strategy, per_replica_loss, global_step) -> None:
        """Records `global_step` in `bad_step` if any replica's loss is not finite.

        Called in cross-replica context, after `strategy.run` and the step's
        `global_step.assign_add(1)`, usually inside `tf.function`. A sum of
        losses is finite only if every loss is.
        """
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
        finite = tf.reduce_all(tf.math.is_finite(total))
        step = tf.cast(global_step, tf.int64)
        self.bad_step.assign(tf.where(finite, self.bad_step.read_value(), step))

    def clear(self) -> None:
        """Forgets a recorded bad step (eager)."""
        self.bad_step.assign(NO_BAD_STEP)

    def graph_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)`: a `tf.while_loop` over `step_fn`; call it in `tf.function`."""
        def loop_fn(iterator, num_steps):
            def cond(i):
                return tf.logical_and(i < num_steps, tf.logical_not(self.should_stop()))

            def body(i):
                with tf.name_scope(""):
                    step_fn(iterator)
                return (i + 1,)

            tf.while_loop(cond, body, (tf.constant(0, num_steps.dtype),))

        return loop_fn

    def host_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)`: a Python loop calling `step_fn` once per step."""
        def loop_fn(iterator, num_steps):
            for _ in range(int(num_steps)):
                if bool(self.should_stop()):
                    break
                step_fn(iterator)

        return loop_fn
