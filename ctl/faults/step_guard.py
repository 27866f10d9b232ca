"""A train loop that ends early, at a step boundary, on a signal or a NaN loss.

orbit's loops run `num_steps` steps no matter what. `StepGuard` gives the
Trainer a loop that also ends early when

  * a stop was requested (`ctl.faults.preemption.SignalWatcher` lowers its
    `step_limit` variable, from a thread, while the loop runs): checked
    before every step;
  * the last step's loss was NaN or Inf: `check_loss`, called by the Trainer
    after each step, returns the step's verdict, and the loop carries it to
    its next condition; the loop records the step it ended at in `bad_step`.

In one `tf.while_loop` (`graph_loop`), counting the steps up to 0:

    i = -num_steps
    while i < step_limit:            # one variable read: 0, or far below once a stop is requested
      ok = train_step(iterator)      # ends with ok = check_loss(loss, ...): all losses finite
      i = i + 1 if ok else 1         # a bad step ends the loop
    if i == 1: bad_step = global_step                     # once per loop

A loop's condition waits for the step before it: whatever it computes adds
to the time between two steps. This one is a variable read and a
comparison, the least that reading a stop request before every step takes
(the verdict of `check_loss`, a finiteness test and a select, is ready
before the step's updates are). On the bench MLP (240 ops a step) it runs at
1.00 of the same loop without a guard; the previous condition, `i <
num_steps and not stop_requested` (a read, a negation and a conjunction),
at 0.975 (commit f0d7fc8, docs/faults.md). A compute-bound
model notices neither. `host_loop` does the same with one `tf.function`
call per step.

Under `MultiWorkerMirroredStrategy` every worker runs this loop in lockstep,
and each has its own `stop_requested`: a worker that stopped on its own signal
would leave the others blocked in the next step's all-reduce. So there the
guard is *cluster-wide*: `check_loss` all-reduces, in the one collective it
already needs for the losses, each worker's stop flag, and the loop reads the
agreed result (`stop_agreed`). A signal on any worker therefore stops every
worker after the same step: the step during which the signal's flag entered the
all-reduce, at most one step after it arrived. A NaN or Inf loss on any replica
of any worker makes the reduced sum non-finite on every worker alike, so all
record the same `bad_step`.

Under `ParameterServerStrategy` the coordinator schedules the steps of a loop
ahead of time and workers run them later; the host stops scheduling once the
guard says stop and each scheduled step checks the guard before it runs and
records its own bad loss (`skip_if_stopped`; the variables live on the
coordinator and workers read them). The loop therefore ends once the steps
already running when the signal or the bad loss came are done: at most one
step per worker.

What to do after such a loop (save, restore, raise) is `ctl.faults.handler`' job.
"""

import tensorflow as tf

from ctl.core.runner import NO_BAD_STEP

# No Python control flow on tensors here: autograph need not convert it (tracing time).
_plain = tf.autograph.experimental.do_not_convert


class StepGuard:
    """Per-step stop conditions of the train loop (variables live on the host).

    Implements the Trainer's extension point `ctl.core.runner.StepGuard`.
    """

    def __init__(self, watcher, global_step: tf.Variable, cluster_wide: bool = False):
        """`watcher`: a `SignalWatcher` (its `stop_requested` and `step_limit`); `global_step`:
        the trainer's, recorded as the bad step; `cluster_wide`: agree on stopping with the
        other workers (see the module docstring)."""
        self.stop_requested = watcher.stop_requested
        self.step_limit = watcher.step_limit
        self.global_step = global_step
        self.cluster_wide = cluster_wide
        self.bad_step = tf.Variable(
            tf.constant(NO_BAD_STEP, tf.int64), trainable=False, name="ctl_bad_step"
        )
        # Whether any worker asked to stop, as of the last step's all-reduce.
        self.stop_agreed = tf.Variable(False, trainable=False, name="ctl_stop_agreed") \
            if cluster_wide else None

    @classmethod
    def for_strategy(cls, strategy: tf.distribute.Strategy, watcher,
                     global_step: tf.Variable) -> "StepGuard":
        """A guard that is cluster-wide under `MultiWorkerMirroredStrategy`."""
        return cls(watcher, global_step,
                   cluster_wide=isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))

    @_plain
    def should_stop(self) -> tf.Tensor:
        """Whether the loop must end before its next step (graph or eager)."""
        return tf.logical_or(self._stop_read(), self.bad_step.read_value() >= 0)

    @_plain
    def _stop_read(self) -> tf.Tensor:
        """Whether a stop was requested (cluster-wide: agreed); the loops carry the NaN verdict."""
        return (self.stop_agreed if self.cluster_wide else self.stop_requested).read_value()

    def stopped_by_request(self) -> bool:
        """Whether the last loop ended on a stop request: this process's or, cluster-wide, any worker's (eager)."""
        return bool((self.stop_agreed if self.cluster_wide else self.stop_requested).numpy())

    @_plain
    def check_loss(self, strategy: tf.distribute.Strategy, per_replica_loss,
                   global_step) -> tf.Tensor:
        """The step's verdict: True if every replica's loss is finite.

        Called in cross-replica context, after `strategy.run` and the step's
        `global_step.assign_add(1)`, usually inside `tf.function`; the Trainer's
        `train_step` returns the verdict to the loop, which records the bad
        step. A sum of losses is finite only if every loss is. Cluster-wide,
        also agrees on the stop flags (`stop_agreed`).
        """
        del global_step  # The loop reads the step it ended at.
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
            # The count runs up to 0. The verdict rides it: a bad step jumps it to 1,
            # past any limit; a stop request lowers the limit below any count.
            bad = tf.constant(1, tf.int64)
            if self.cluster_wide:  # The agreed flag, written by each step's all-reduce.
                def cond(i):
                    return tf.logical_and(i < 0, tf.logical_not(self.stop_agreed.read_value()))
            else:
                def cond(i):
                    return i < self.step_limit.read_value()

            def body(i):
                with tf.name_scope(""):
                    verdict = step_fn(iterator)
                return i + 1 if verdict is None else tf.where(verdict, i + 1, bad)

            end, = tf.while_loop(cond, body, (-tf.cast(num_steps, tf.int64),))
            self._record(end < bad)

        return loop_fn

    def skip_if_stopped(self, step_fn):
        """`step_fn(iterator)` that runs only if the loop need not stop; returns whether it ran.

        For steps scheduled ahead of time (parameter servers): a step that
        starts after a signal or a bad loss does nothing, so the loop ends
        once the steps already running on workers are done.
        """
        def step(iterator):
            def run():
                verdict = step_fn(iterator)
                if verdict is not None:
                    self._record(verdict)
                return tf.constant(True)

            return tf.cond(self.should_stop(), lambda: tf.constant(False), run)

        return step

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
