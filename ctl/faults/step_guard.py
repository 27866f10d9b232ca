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

Under `MultiWorkerMirroredStrategy` every worker runs this loop in lockstep,
and each has its own `stop_requested`: a worker that stopped on its own signal
would leave the others blocked in the next step's all-reduce. So there the
guard is *cluster-wide*: `check_loss` all-reduces, in the one collective it
already needs for the losses, each worker's stop flag, and `should_stop` reads
the agreed result (`stop_agreed`). A signal on any worker therefore stops every
worker after the same step: the step during which the signal's flag entered the
all-reduce, at most one step after it arrived. A NaN or Inf loss on any replica
of any worker makes the reduced sum non-finite on every worker alike, so all
record the same `bad_step`.

Under `ParameterServerStrategy` the coordinator schedules the steps of a loop
ahead of time and workers run them later; the host stops scheduling once the
guard says stop and each scheduled step checks the guard before it runs
(`skip_if_stopped`; the variables live on the coordinator and workers read
them). The loop therefore ends once the steps already running when the signal
or the bad loss came are done: at most one step per worker.

What to do after such a loop (save, restore, raise) is `ctl.faults.handler`' job.
"""

import tensorflow as tf

from ctl.core.trainer import NO_BAD_STEP


class StepGuard:
    """Per-step stop conditions of the train loop (variables live on the host).

    Implements the Trainer's extension point `ctl.core.trainer.StepGuard`.
    """

    def __init__(self, stop_requested: tf.Variable, cluster_wide: bool = False):
        """`cluster_wide`: agree on stopping with the other workers (see the module docstring)."""
        self.stop_requested = stop_requested
        self.cluster_wide = cluster_wide
        self.bad_step = tf.Variable(
            tf.constant(NO_BAD_STEP, tf.int64), trainable=False, name="ctl_bad_step"
        )
        # Whether any worker asked to stop, as of the last step's all-reduce.
        self.stop_agreed = tf.Variable(False, trainable=False, name="ctl_stop_agreed") \
            if cluster_wide else None

    @classmethod
    def for_strategy(cls, strategy: tf.distribute.Strategy, stop_requested: tf.Variable) -> "StepGuard":
        """A guard that is cluster-wide under `MultiWorkerMirroredStrategy`."""
        return cls(stop_requested,
                   cluster_wide=isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))

    def should_stop(self) -> tf.Tensor:
        """Whether the loop must end before its next step (graph or eager)."""
        stop = self.stop_agreed if self.cluster_wide else self.stop_requested
        return tf.logical_or(stop.read_value(), self.bad_step.read_value() >= 0)

    def stopped_by_request(self) -> bool:
        """Whether the last loop ended on a stop request: this process's or, cluster-wide, any worker's (eager)."""
        return bool((self.stop_agreed if self.cluster_wide else self.stop_requested).numpy())

    def check_loss(self, strategy: tf.distribute.Strategy, per_replica_loss, global_step) -> None:
        """Records `global_step` in `bad_step` if any replica's loss is not finite.

        Called in cross-replica context, after `strategy.run` and the step's
        `global_step.assign_add(1)`, usually inside `tf.function`. A sum of
        losses is finite only if every loss is.
        """
        if self.cluster_wide:
            flag = self.stop_requested.read_value()
            # One all-reduce: [sum of this replica's losses, this worker's stop flag].
            both = strategy.run(lambda loss: tf.stack([
                tf.reduce_sum(loss), tf.cast(flag, loss.dtype)]), args=(per_replica_loss,))
            both = strategy.reduce(tf.distribute.ReduceOp.SUM, both, axis=None)
            total = both[0]
            self.stop_agreed.assign(both[1] > 0)
        else:
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

    def skip_if_stopped(self, step_fn):
        """`step_fn(iterator)` that runs only if the loop need not stop; returns whether it ran.

        For steps scheduled ahead of time (parameter servers): a step that
        starts after a signal or a bad loss does nothing, so the loop ends
        once the steps already running on workers are done.
        """
        def step(iterator):
            def run():
                step_fn(iterator)
                return tf.constant(True)

            return tf.cond(self.should_stop(), lambda: tf.constant(False), run)

        return step

    def host_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)`: a Python loop calling `step_fn` once per step."""
        def loop_fn(iterator, num_steps):
            for _ in range(int(num_steps)):
                if bool(self.should_stop()):
                    break
                step_fn(iterator)

        return loop_fn
