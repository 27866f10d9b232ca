"""A train loop that ends early, at a step boundary, on a signal or a NaN loss.

orbit's loops run `num_steps` steps no matter what. `StepGuard` gives the
Trainer a loop that also ends early when

  * a stop was requested (`ctl.faults.preemption.SignalWatcher` sets a
    variable, from a thread, while the loop runs): checked before every step;
  * the last step's loss was NaN or Inf: `check_loss`, called by the Trainer
    after each step, returns the step's verdict, and the loop carries it to
    its next condition; the loop records the step it ended at in `bad_step`.

In one `tf.while_loop` (`graph_loop`):

    i, ok = 0, True
    while i < num_steps and ok and not stop_requested:   # one variable read
      ok = train_step(iterator)   # ends with ok = check_loss(loss, ...): all losses finite
      i += 1
    if not ok: bad_step = global_step                     # once per loop

The verdict is a loop variable rather than a variable written each step and
read back by the condition: the guard adds about 7 scalar ops to a step
instead of about 20 (a variable read, a select and an assign in the step; two
reads and four logical ops in the condition), which is most of its cost on a
small model (docs/bench.md, figure 1). `host_loop` does the same with one
`tf.function` call per step. What to do after such a loop (save, restore,
raise) is `ctl.faults.handler`'s job.
"""

import tensorflow as tf

from ctl.core.trainer import NO_BAD_STEP

# No Python control flow on tensors here: autograph need not convert it (tracing time).
_plain = tf.autograph.experimental.do_not_convert


class StepGuard:
    """Per-step stop conditions of the train loop (variables live on the host).

    Implements the Trainer's extension point `ctl.core.trainer.StepGuard`.
    """

    def __init__(self, stop_requested: tf.Variable, global_step: tf.Variable):
        self.stop_requested = stop_requested
        self.global_step = global_step
        self.bad_step = tf.Variable(
            tf.constant(NO_BAD_STEP, tf.int64), trainable=False, name="ctl_bad_step"
        )

    @_plain
    def should_stop(self) -> tf.Tensor:
        """Whether a stop was requested: the loop ends before its next step (graph or eager)."""
        return self.stop_requested.read_value()

    @_plain
    def check_loss(self, strategy: tf.distribute.Strategy, per_replica_loss,
                   global_step) -> tf.Tensor:
        """The step's verdict: True if every replica's loss is finite.

        Called in cross-replica context, after `strategy.run` and the step's
        `global_step.assign_add(1)`, usually inside `tf.function`; the Trainer's
        `train_step` returns the verdict to the loop. A sum of losses is finite
        only if every loss is. Records nothing: the loop does, once.
        """
        del global_step  # The loop reads the step it ended at.
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
        finite = tf.math.is_finite(total)
        return finite if finite.shape.rank == 0 else tf.reduce_all(finite)

    def clear(self) -> None:
        """Forgets a recorded bad step (eager)."""
        self.bad_step.assign(NO_BAD_STEP)

    @_plain
    def _record(self, ok) -> None:
        """Records the current global step as the bad one unless `ok`."""
        step = tf.cast(self.global_step.read_value(), tf.int64)
        self.bad_step.assign(tf.where(ok, self.bad_step.read_value(), step))

    def graph_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)`: a `tf.while_loop` over `step_fn`; call it in `tf.function`.

        `step_fn(iterator)` returns the step's verdict (`check_loss`), or None.
        """
        def loop_fn(iterator, num_steps):
            def cond(i, ok):
                return tf.logical_and(tf.logical_and(i < num_steps, ok),
                                      tf.logical_not(self.should_stop()))

            def body(i, unused_ok):
                with tf.name_scope(""):
                    verdict = step_fn(iterator)
                return (i + 1, tf.constant(True) if verdict is None else verdict)

            _, ok = tf.while_loop(cond, body, (tf.constant(0, num_steps.dtype), tf.constant(True)))
            self._record(ok)

        return loop_fn

    def host_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)`: a Python loop calling `step_fn` once per step."""
        def loop_fn(iterator, num_steps):
            for _ in range(int(num_steps)):
                if bool(self.should_stop()):
                    break
                verdict = step_fn(iterator)
                if verdict is not None and not bool(verdict):
                    self._record(False)
                    break

        return loop_fn
