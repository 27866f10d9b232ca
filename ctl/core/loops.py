"""The loop functions of ctl's Trainer: the train loops, the eval loops' parts, the iterator ender.

Built from orbit's utilities (`create_tf_while_loop_fn`, `create_loop_fn`); the Trainer
(`ctl.core.trainer`, `ctl.core.evaluation`) picks one and hands it its override points:

- `graph_train_loop`: reset, the steps and the reads in one `tf.function` call (`use_tf_while_loop`);
- `host_train_loop`: the host calls the step once per step;
- `scheduled_train_loop`: parameter servers, one scheduled closure per step;
- `StepGuard`: a train loop that ends early, at a step boundary, on a stop request or a NaN loss
  (cluster-wide under `MultiWorkerMirroredStrategy`);
- `graph_eval_loop`, `StepCount`, `stoppable`, `with_batch_callbacks`, `metric_results`: the eval
  loops' parts;
- `end_off_path`: a finished eval iterator ended on a thread of its own.

The loops as pseudo-code, and why the guard is built as it is: docs/explanation/training-loop.md.
"""

import atexit
import collections
import itertools
import queue
import threading
from typing import Optional

import orbit
import tensorflow as tf

from ctl.core.runner import NO_BAD_STEP, Logs

# A loop's `num_steps` (train or eval), as `ctl.core.controller.Controller` passes it.
LOOP_SIZE = tf.TensorSpec((), tf.int32)

# ctl's own graph code with no Python control flow on tensors and no user code
# in it: autograph need not convert it (converting these helpers took most of
# the autograph time of the digits job's tracing). Keras' own fit does not
# convert metrics' `result`/`reset_state` or learning-rate schedules either.
# Methods a subclass overrides are converted as usual.
plain = tf.autograph.experimental.do_not_convert


class LastResults:
    """A loop's last results (`Logs`, or None until there are some), for the method that returns them.

    A plain holder: a dict set on the trainer itself would be wrapped for tracking each time.
    """

    def __init__(self):
        self.logs: Optional[Logs] = None


@plain
def metric_results(metrics) -> Logs:
    """Each metric's result by name (a metric that returns a dict adds its entries).

    Args:
        metrics: Keras metrics.
    """
    logs = {}
    for metric in metrics:
        result = metric.result()
        if isinstance(result, dict):
            logs.update(result)
        else:
            logs[metric.name] = result
    return logs


# Training.

class StepGuard:
    """Per-step stop conditions of the train loop (variables live on the host): the
    Trainer's with a stop source (`ctl.Trainer(stop=..., guard_steps=True)`), see above."""

    def __init__(self, watcher, global_step: tf.Variable, cluster_wide: bool = False):
        """Makes the guard's variables (the bad step, and cluster-wide the agreed stop).

        Args:
            watcher: the stop source (its `stop_requested` and `step_limit`).
            global_step: the trainer's, recorded as the bad step.
            cluster_wide: agree on stopping with the other workers (one all-reduce per step).
        """
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
        """A guard that is cluster-wide under `MultiWorkerMirroredStrategy`.

        Args:
            strategy: the run's strategy.
            watcher: the stop source.
            global_step: the trainer's global step.
        """
        return cls(watcher, global_step,
                   cluster_wide=isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))

    @plain
    def should_stop(self) -> tf.Tensor:
        """Whether the loop must end before its next step (graph or eager)."""
        return tf.logical_or(self._stop_read(), self.bad_step.read_value() >= 0)

    @plain
    def _stop_read(self) -> tf.Tensor:
        """Whether a stop was requested (cluster-wide: agreed); the loops carry the NaN verdict."""
        return (self.stop_agreed if self.cluster_wide else self.stop_requested).read_value()

    def stopped_by_request(self) -> bool:
        """Whether the last loop ended on a stop request: this process's or, cluster-wide, any worker's (eager)."""
        return bool((self.stop_agreed if self.cluster_wide else self.stop_requested).numpy())

    @plain
    def check_loss(self, strategy: tf.distribute.Strategy, per_replica_loss,
                   global_step) -> tf.Tensor:
        """The step's verdict: True if every replica's loss is finite.

        Called in cross-replica context, after `strategy.run` and the step's
        `global_step.assign_add(1)`, usually inside `tf.function`; the Trainer's
        `train_step` returns the verdict to the loop, which records the bad
        step. A sum of losses is finite only if every loss is. Cluster-wide,
        also agrees on the stop flags (`stop_agreed`).

        Args:
            strategy: the run's strategy.
            per_replica_loss: the step's loss on each replica (`strategy.run`'s result).
            global_step: the global step after the step's update.
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

    @plain
    def _record(self, ok) -> None:
        """Records the current global step as the bad one unless `ok`."""
        step = tf.cast(self.global_step.read_value(), tf.int64)
        self.bad_step.assign(tf.where(ok, self.bad_step.read_value(), step))

    def graph_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)`: a `tf.while_loop` over `step_fn`; call it in `tf.function`.

        `step_fn(iterator)` returns the step's verdict (`check_loss`), or None.

        Args:
            step_fn: the step function, `step_fn(iterator)`.
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

        Args:
            step_fn: the step function, `step_fn(iterator)`.
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
        """`loop_fn(iterator, num_steps)`: a Python loop calling `step_fn` once per step.

        Args:
            step_fn: the step function, `step_fn(iterator)`.
        """
        def loop_fn(iterator, num_steps):
            for _ in range(int(num_steps)):
                if bool(self.should_stop()):
                    break
                verdict = step_fn(iterator)
                if verdict is not None and not bool(verdict):
                    self._record(False)
                    break

        return loop_fn


def scheduled_train_loop(coordinator, step_fn, guard: Optional[StepGuard], reset):
    """`loop_fn(iterator, num_steps)` on parameter servers: one closure per step.

    Scheduled steps run later, on whichever worker is free: with a guard,
    `step_fn` checks it first and does nothing once the loop must stop
    (`StepGuard.skip_if_stopped`), and at most 4 steps per worker are
    scheduled ahead, so a stop waits for the steps running and for these.
    `reset` resets the metrics first; the results are read after `join()`.

    Args:
        coordinator: the `ClusterCoordinator` that schedules the steps.
        step_fn: the step function, `step_fn(iterator)`.
        guard: the step guard, or None.
        reset: resets the train metrics (run before the first step).
    """
    workers = {device.name.split("/device:")[0] for device in tf.config.list_logical_devices()
               if device.name.startswith("/job:worker/")}  # The coordinator sees their devices.
    ahead = 4 * max(1, len(workers))

    def schedule_steps(iterator, num_steps):
        reset()
        scheduled = collections.deque()
        for _ in range(int(num_steps)):
            if guard is not None and bool(guard.should_stop()):
                break  # Those already scheduled see it too.
            scheduled.append(coordinator.schedule(step_fn, args=(iterator,)))
            if guard is not None and len(scheduled) > ahead:
                wait_for_step(scheduled.popleft())  # The oldest.

    return schedule_steps


def wait_for_step(remote_value) -> None:
    """Waits for a step scheduled on a parameter-server worker to end.

    Its result (a flag) stays on the worker that ran it until fetched; if that
    worker was lost since, the copy fails ("failed to connect", seen once in
    about eight runs of a worker SIGKILL) though the step is done. A lost ps
    fails the steps themselves, and `ClusterCoordinator` reports that.

    Args:
        remote_value: the step's `RemoteValue`.
    """
    try:
        remote_value.fetch()
    except tf.errors.UnavailableError:
        pass


def graph_train_loop(step_fn, guard: Optional[StepGuard], reset, read, read_end):
    """`loop_fn(iterator, num_steps) -> (results, end)`: reset, the steps and the reads in one
    `tf.function` call.

    The loop also returns `read_end()` (the global step and the guard's bad
    step it ended at): a separate reset or read right after a loop cost a
    share of a short loop of a small model (figure 1, bench/README.md).

    Args:
        step_fn: the step function, `step_fn(iterator)`.
        guard: the step guard, or None.
        reset: resets the train metrics, at the loop's start.
        read: reads the loop's results, at its end.
        read_end: reads the global step and the bad step, at its end.
    """
    loop = (guard.graph_loop if guard else orbit.utils.create_tf_while_loop_fn)(step_fn)

    def loop_with_metrics(iterator, num_steps):
        reset()
        loop(iterator, num_steps)
        return read(), read_end()

    return tf.function(loop_with_metrics)


def host_train_loop(step_fn, guard: Optional[StepGuard], reset, read):
    """`loop_fn(iterator, num_steps) -> results`: the host calls `step_fn` once per step.

    Args:
        step_fn: the step function, `step_fn(iterator)`.
        guard: the step guard, or None.
        reset: resets the train metrics, at the loop's start.
        read: reads the loop's results, at its end.
    """
    loop = (guard.host_loop if guard else orbit.utils.create_loop_fn)(step_fn)

    def host_loop(iterator, num_steps):
        reset()
        loop(iterator, num_steps)
        return read()

    return host_loop


# Evaluation.

class StepCount:
    """The steps an eval loop has read, in a host variable (`ctl_eval_steps_read`).

    An eval set that ends before the steps asked for ends its loop with an
    `OutOfRangeError` in the step that finds no batch; inside one `tf.function`
    call (`graph_eval_loop`) that error ends the call and drops what it would
    return, so the loop keeps its count here as it goes. A plain holder, as
    `LastResults`: a variable set on the trainer itself would be tracked as one
    of its own.
    """

    def __init__(self):
        self.variable = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                    name="ctl_eval_steps_read")

    def read(self) -> int:
        """The steps counted (eager)."""
        return int(self.variable.numpy())

    def counted(self, step_fn):
        """`step_fn` for the host loop, counting each step that ran (eager).

        The count after a step is a separate op after the step's call: a step that
        found no batch raised, or (orbit runs its host loop in an async scope) left
        the executor in its error state, which skips the count.

        Args:
            step_fn: the step function, `step_fn(iterator)`.
        """
        variable = self.variable

        def step(iterator):
            outputs = step_fn(iterator)
            variable.assign_add(1)
            return outputs

        return step


def graph_eval_loop(step_fn, eval_stop, count: StepCount):
    """`loop_fn(iterator, num_steps) -> steps` as one `tf.while_loop`, for inside `tf.function`;
    with an `eval_stop`, it also ends before the next step once a stop is requested.

    Returns the steps it ran. Before each step it sets `count` to the steps run
    so far: the step's ops (its read of the inputs first) wait for that, and it
    waits for the step before (a loop body's result waits for all its stateful
    ops). So when the eval set ends in a step, and the `OutOfRangeError` ends the
    call, `count` holds the steps read, and the metrics hold their updates.

    Args:
        step_fn: the step function, `step_fn(iterator)`.
        eval_stop: the stop source that ends an evaluation early, or None.
        count: where the loop keeps its count as it goes.
    """
    stop = None if eval_stop is None else eval_stop.stop_requested
    steps_read = count.variable

    def loop(iterator, num_steps):
        def cond(i):
            if stop is None:
                return i < num_steps
            return tf.logical_and(i < num_steps, tf.logical_not(stop.read_value()))

        def body(i):
            with tf.name_scope(""), tf.control_dependencies(
                    [steps_read.assign(tf.cast(i, tf.int64))]):
                step_fn(iterator)
            return (i + 1,)

        end, = tf.while_loop(cond, body, (tf.constant(0, num_steps.dtype),))
        return end

    return loop


def stoppable(step_fn, eval_stop):
    """`step_fn` for orbit's host loop, which ends it (StopIteration) once `eval_stop` asks.

    Args:
        step_fn: the step function, `step_fn(iterator)`.
        eval_stop: the stop source that ends an evaluation early.
    """
    if eval_stop is None:
        return step_fn
    requested = eval_stop.requested

    def step(iterator):
        if requested():
            raise StopIteration
        return step_fn(iterator)

    return step


def with_batch_callbacks(step_fn, callbacks):
    """`step_fn`, with each Keras callback's `on_test_batch_begin/end` around it.

    Args:
        step_fn: the step function, `step_fn(iterator)`.
        callbacks: Keras callbacks.
    """
    if not callbacks:
        return step_fn
    batches = itertools.count()

    def step(iterator):
        batch = next(batches)
        for callback in callbacks:
            callback.on_test_batch_begin(batch)
        outputs = step_fn(iterator)
        for callback in callbacks:
            callback.on_test_batch_end(batch)
        return outputs

    return step


class _IteratorEnder:
    """Ends finished eval iterators on a thread of its own, off the evaluation's path.

    The last reference to an iterator stops its input pipeline's threads
    (prefetch, parallel map) and waits for them: after each evaluation of
    figure 2's MLP (bench/eval_throughput.py) that time was all on the
    caller's path. TensorFlow
    lets go of the GIL while it does so, so the run goes on meanwhile; the
    next evaluation makes its own iterator.
    """

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None

    def put(self, iterator) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._end_each, daemon=True,
                                                name="ctl-end-eval-iterators")
                self._thread.start()
                # The process does not exit while TensorFlow is ending one.
                atexit.register(self._finish, timeout_s=_END_AT_EXIT_S)
        self._queue.put(iterator)

    def _end_each(self) -> None:
        while self._queue.get() is not None:  # Dropped at once: the iterator ends here.
            pass

    def _finish(self, timeout_s: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)


_END_AT_EXIT_S = 10.0  # A bound: ending an iterator waits for its pipeline's work in flight.
_ENDER = _IteratorEnder()


def end_off_path(iterator) -> None:
    """Ends `iterator` on the ender's thread, once the caller has dropped its own references.

    Args:
        iterator: the iterator to end (a dataset iterator whose end may block).
    """
    _ENDER.put(iterator)
