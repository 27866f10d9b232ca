"""The loop functions of ctl's Trainer: the train loops, the eval loops' parts, the iterator ender.

Built from orbit's utilities (`create_tf_while_loop_fn`, `create_loop_fn`);
the Trainer (`ctl.core.trainer`, `ctl.core.evaluation`) picks one and hands it
its hooks. One training loop of `num_steps` steps (`Trainer.train`, as ctl's
Controller calls it):

    train_loop_begin()                      # eager hook; does nothing by default
    loop(iterator, num_steps):              # one tf.function call (tf.while_loop): graph_train_loop
      reset loss and metrics
      ok = True
      for _ in range(num_steps):
        if not ok or step_guard.should_stop(): break  # only with a step_guard (ctl.faults.handler)
        ok = train_step(iterator)           # one update (ctl.core.train_step)
          repeat accumulation_steps - 1 times:   # only with accumulation
            strategy.run(replica_step, next_train_inputs(iterator), apply=False)
          loss = strategy.run(replica_step, next_train_inputs(iterator), apply=True)
            replica_step:                   # per replica; XLA-compiled with jit_compile
              task.train_step(inputs, model, optimizer=gradient pipeline, metrics)
            then gradients.update(...)      # sum, clip, apply (not compiled)
          ema.update()                      # only with ema_decay
          global_step += 1
          return step_guard.check_loss(loss)  # the verdict: all losses finite
      (the guard records the step it ended at if not ok: bad_step)
      read loss, metrics, learning rate, global step, bad step
    logs = train_loop_end()                 # eager; what the loop read
    return TrainLoopEnd(logs, step, bad_step)  # values: nothing kept to go stale

Under `ParameterServerStrategy` the loop runs on the coordinator (the chief):
each step is one closure that the `ClusterCoordinator` schedules on a
free worker (`scheduled_train_loop`), and `train_loop_end` first waits for
them all (`join()`), then reads the metrics. With a step guard the host
schedules at most 4 steps per worker ahead, stops scheduling once the guard
says stop, and each scheduled step that starts after that does nothing
(`StepGuard.skip_if_stopped`).

`use_tf_while_loop=True` runs the training loop (and evaluations of a fixed
number of steps: `graph_eval_loop`) as one `tf.while_loop` inside one
`tf.function` call, metric resets and reads included; with `False` the host
drives the loop and each step is its own `tf.function` call
(`host_train_loop`). Evaluations over the whole eval set, and of tasks that
aggregate logs on the host, always use the host loop (`ctl.core.evaluation`).
"""

import atexit
import collections
import itertools
import queue
import threading
from typing import Optional

import orbit
import tensorflow as tf

from ctl.core.runner import EvalStop, Logs, StepGuard

# ctl's own graph code with no Python control flow on tensors and no user code
# in it: autograph need not convert it (converting these helpers took most of
# the autograph time of the digits job's tracing). Keras' own fit does not
# convert metrics' `result`/`reset_state` or learning-rate schedules either.
# Methods a subclass overrides are converted as usual.
plain = tf.autograph.experimental.do_not_convert


class LastResults:
    """A loop's last results (`Logs`, or None until there are some), for the hook that returns them.

    A plain holder: a dict set on the trainer itself would be wrapped for tracking each time.
    """

    def __init__(self):
        self.logs: Optional[Logs] = None


@plain
def metric_results(metrics) -> Logs:
    """Each metric's result by name (a metric that returns a dict adds its entries)."""
    logs = {}
    for metric in metrics:
        result = metric.result()
        if isinstance(result, dict):
            logs.update(result)
        else:
            logs[metric.name] = result
    return logs


# Training.

def scheduled_train_loop(coordinator, step_fn, guard: Optional[StepGuard], reset):
    """`loop_fn(iterator, num_steps)` on parameter servers: one closure per step.

    Scheduled steps run later, on whichever worker is free: with a guard,
    `step_fn` checks it first and does nothing once the loop must stop
    (`StepGuard.skip_if_stopped`), and at most 4 steps per worker are
    scheduled ahead, so a stop waits for the steps running and for these.
    `reset` resets the metrics first; the results are read after `join()`.
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
    share of a short loop of a small model (figure 1, docs/bench.md).
    """
    loop = (guard.graph_loop if guard else orbit.utils.create_tf_while_loop_fn)(step_fn)

    def loop_with_metrics(iterator, num_steps):
        reset()
        loop(iterator, num_steps)
        return read(), read_end()

    return tf.function(loop_with_metrics)


def host_train_loop(step_fn, guard: Optional[StepGuard], reset, read):
    """`loop_fn(iterator, num_steps) -> results`: the host calls `step_fn` once per step."""
    loop = (guard.host_loop if guard else orbit.utils.create_loop_fn)(step_fn)

    def host_loop(iterator, num_steps):
        reset()
        loop(iterator, num_steps)
        return read()

    return host_loop


# Evaluation.

def graph_eval_loop(step_fn, eval_stop: Optional[EvalStop]):
    """`loop_fn(iterator, num_steps)` as one `tf.while_loop`, for inside `tf.function`; with an
    `eval_stop`, it also ends before the next step once a stop is requested."""
    if eval_stop is None:
        return orbit.utils.create_tf_while_loop_fn(step_fn)
    stop = eval_stop.stop_requested

    def loop(iterator, num_steps):
        def body(i):
            with tf.name_scope(""):
                step_fn(iterator)
            return (i + 1,)

        tf.while_loop(lambda i: tf.logical_and(i < num_steps, tf.logical_not(stop.read_value())),
                      body, (tf.constant(0, num_steps.dtype),))

    return loop


def stoppable(step_fn, eval_stop: Optional[EvalStop]):
    """`step_fn` for orbit's host loop, which ends it (StopIteration) once `eval_stop` asks."""
    if eval_stop is None:
        return step_fn
    requested = eval_stop.requested

    def step(iterator):
        if requested():
            raise StopIteration
        return step_fn(iterator)

    return step


def with_batch_callbacks(step_fn, callbacks):
    """`step_fn`, with each Keras callback's `on_test_batch_begin/end` around it."""
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
    """Ends `iterator` on the ender's thread, once the caller has dropped its own references."""
    _ENDER.put(iterator)
