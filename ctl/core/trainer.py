"""`Trainer`: the train and eval loops of a `Task`, on orbit's runner protocol.

The Trainer is an `orbit.AbstractTrainer` and `orbit.AbstractEvaluator`
(`train(num_steps)`, `evaluate(num_steps)`) with its own loops, built from
orbit's utilities (`create_tf_while_loop_fn`, `create_loop_fn`,
`make_distributed_dataset`); no orbit runner class to keep in step with.

One training loop of `num_steps` steps (`train`, as ctl's Controller calls it):

    train_loop_begin()                      # eager hook; does nothing by default
    loop(iterator, num_steps):              # one tf.function call (tf.while_loop)
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
free worker, and `train_loop_end` first waits for them all (`join()`), then
reads the metrics. With a step guard the host schedules at most 4 steps per
worker ahead, stops scheduling once the guard says stop, and each scheduled
step that starts after that does nothing (`StepGuard.skip_if_stopped`).

One evaluation (`evaluate`), from the start of the eval set:

    state = eval_begin()                    # eager: the aggregation state, or None
    loop(iterator, num_steps):              # one tf.function call if it can be
      reset eval loss and metrics
      for _ in range(num_steps or until the eval set ends):
        if eval_stop requested: break       # only with an eval_stop (ctl.faults.handler)
        outputs = eval_step(iterator)
          inputs = next_eval_inputs(iterator)
          strategy.run(task.validation_step, inputs)
          strategy.gather(extra logs)       # from every replica of every worker
        state = eval_reduce(state, outputs) # eager; only if the task aggregates
                                            # (ctl.core.aggregation)
      read eval loss and metrics
      write them to the eval summaries      # only with Controller.evaluate's summaries:
                                            # tf.summary ops and a flush in the same call
    if eval_stop requested: raise EvaluationStopped   # incomplete: nothing written
    return eval_end(state)                  # eager: {loss, metrics, task results}
                                            # (the iterator ends on a thread of its own)

The first dimension of every input tensor is the batch: the eval loss is a mean
over examples, weighted by batch size. Metrics are read across all replicas of
all workers, and the extra logs of `validation_step` are gathered from all of
them, so that every worker computes the same results over the whole eval set.

The train-step settings (`mixed_precision`, `jit_compile`, `clip_norm`,
`accumulation_steps`, `ema_decay`) are described in docs/train_step.md; their
machinery lives in `ctl.core.precision`, `ctl.core.train_step` and
`ctl.core.ema`. `global_step` counts updates: with `accumulation_steps=K` a
step reads K batches, and every interval of the `Schedule` is in updates.

`use_tf_while_loop=True` runs the training loop (and evaluations of a fixed
number of steps) as one `tf.while_loop` inside one `tf.function` call, metric
resets and reads included; with `False` the host drives the loop and each step
is its own `tf.function` call. Evaluations over the whole eval set, and of
tasks that aggregate logs on the host, always use the host loop.
"""

import atexit
import collections
import contextlib
import functools
import itertools
import queue
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Protocol

import gin
import numpy as np
import orbit
import tensorflow as tf

from ctl.core import aggregation, checkpoint_contents, contract, precision, xla
from ctl.core.ema import MovingAverage
from ctl.core.errors import UserError, user_error_within
from ctl.core.summaries import SummaryManager, in_graph
from ctl.core.task import Task
from ctl.core.train_step import GradientPipeline

Logs = Dict[str, Any]

# ctl's own graph code with no Python control flow on tensors and no user code
# in it: autograph need not convert it (converting these helpers took ~70% of
# the autograph time of the digits job's tracing). Keras' own fit does not
# convert metrics' `result`/`reset_state` or learning-rate schedules either.
# Methods a subclass overrides are converted as usual.
_plain = tf.autograph.experimental.do_not_convert
NO_BAD_STEP = -1  # A StepGuard's `bad_step` when every loss was finite.


class StepGuard(Protocol):
    """The extension point that may end a train loop early, at a step boundary.

    A Trainer's `step_guard` is None (orbit's loops) or an object like this one;
    `ctl.faults.step_guard.StepGuard` (signals, NaN losses) is ctl's.
    """

    bad_step: tf.Variable  # The step whose loss was not finite, or NO_BAD_STEP.

    def graph_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)` as one `tf.while_loop`; called inside `tf.function`.

        `step_fn` (the Trainer's `train_step`) returns what `check_loss` returned.
        """

    def host_loop(self, step_fn):
        """`loop_fn(iterator, num_steps)` as a Python loop of `step_fn` calls."""

    def should_stop(self) -> tf.Tensor:
        """Whether the loop must end before its next step (graph or eager)."""

    def skip_if_stopped(self, step_fn):
        """`step_fn` that does nothing once `should_stop()`: for steps scheduled ahead (parameter servers)."""

    def check_loss(self, strategy: tf.distribute.Strategy, per_replica_loss,
                   global_step) -> Optional[tf.Tensor]:
        """Called after each step, in cross-replica context, with the step's loss.

        May return a verdict (a bool tensor: may the loop go on) that `train_step`
        hands back to the loop.
        """


class EvalStop(Protocol):
    """The extension point that may end an in-line evaluation early, before its next step.

    A Trainer's `eval_stop` is None (evaluations run to their end) or an object
    like this one; `ctl.faults.preemption.SignalWatcher` (a signal) is ctl's.
    """

    stop_requested: tf.Variable  # A bool: graph eval loops read it before every step.

    def requested(self) -> bool:
        """Whether a stop was requested (eager: between host loop steps, after an evaluation)."""


class EvaluationStopped(Exception):
    """An evaluation ended early on the Trainer's `eval_stop`: its results are incomplete."""


class _LastResults:
    """The last train loop's and evaluation's results (`Logs`, or None until there are some)."""

    def __init__(self):
        self.train: Optional[Logs] = None
        self.eval: Optional[Logs] = None


class _EvalWriting(NamedTuple):
    """Where an evaluation's results go (`Trainer.evaluate(summaries=, step=)`)."""

    summaries: SummaryManager
    step: int
    step_tensor: tf.Tensor  # The same, int64, for the writing loop's calls.


class _WritingEvalLoop:
    """An eval loop's `tf.function` that writes its results, and the names it writes (traced)."""

    def __init__(self):
        self.function = None
        self.written: List[str] = []


class TrainLoopEnd(NamedTuple):
    """What one train loop hands back (`Trainer.train`): its results and where it ended.

    Plain values, handed from the trainer to the controller and from there to
    whatever runs after the loop (the fault handler, train actions, hooks), so
    nothing has to remember to refresh a shared copy when a restore moves the
    global step: whoever restores returns a new `TrainLoopEnd`
    (`end._replace(step=..., restored=path)`).
    """

    logs: Logs
    step: int  # The global step the loop ended at.
    bad_step: Optional[int] = None  # The step whose loss was NaN or Inf (with a step guard).
    restored: Optional[str] = None  # Set by a handler that restored this checkpoint after the loop.


@gin.configurable(module="ctl", denylist=["task", "strategy", "train", "evaluate"])
class Trainer(orbit.AbstractTrainer, orbit.AbstractEvaluator):
    """Trains and evaluates a `Task` under a `tf.distribute` strategy.

    The checkpoint (`self.checkpoint`) holds `global_step`, `model` and
    `optimizer` under those names, so Keras' SidecarEvaluator and Model Garden
    tools can read it, `rng`: the Keras 3 RNG states of the model, if any
    (`ctl.faults.resume`), and `ema`: the moving average, with `ema_decay`.
    Subclass and override a hook to change one part of the loop; point gin's
    `ctl.Experiment.trainer_cls` at the subclass.

    Train-step settings (docs/train_step.md):
      mixed_precision: 'mixed_float16' or 'mixed_bfloat16': the Keras dtype
        policy while the task builds its model; float16 adds loss scaling.
      jit_compile: compile each replica's train step with XLA.
      clip_norm: clip the gradients, summed over replicas, to this global norm.
      accumulation_steps: one update per this many batches (micro-batches).
      ema_decay: keep a moving average of the weights; evaluation, the
        sidecar, the best checkpoint and exports use it.
    """

    def __init__(
        self,
        task: Task,
        strategy: Optional[tf.distribute.Strategy] = None,
        train: bool = True,
        evaluate: bool = True,
        use_tf_function: bool = True,
        use_tf_while_loop: bool = True,
        mixed_precision: Optional[str] = None,
        jit_compile: bool = False,
        clip_norm: Optional[float] = None,
        accumulation_steps: int = 1,
        ema_decay: Optional[float] = None,
    ):
        if use_tf_while_loop and not use_tf_function:
            raise UserError(
                "ctl.Trainer.use_tf_while_loop=True needs use_tf_function=True; "
                "set one of them differently."
            )
        precision.validate(mixed_precision)
        xla.validate(jit_compile)
        self.mixed_precision = mixed_precision
        self.task = task
        self.strategy = strategy or tf.distribute.get_strategy()
        self._use_tf_function = use_tf_function
        self._use_tf_while_loop = use_tf_while_loop
        # The last train loop's and evaluation's results, for train_loop_end and eval_end; in a
        # plain holder: a dict set on the trainer itself would be wrapped for tracking each time.
        self._last = _LastResults()
        self._train_loop = None  # Built on first use (create_train_loop_fn).
        self._train_iterator = None  # (dataset, its iterator): made anew when the dataset changes.
        self._graph_eval_loop = None  # Built on first use.
        self._writing_eval_loops = {}  # The same, writing its results: per summaries and set.
        self._host_eval_parts = None
        # Set by ctl.faults.handler: ends a train loop early on a signal or a NaN loss,
        self.step_guard: Optional[StepGuard] = None
        # and an evaluation on a signal (`evaluate` then raises EvaluationStopped).
        self.eval_stop: Optional[EvalStop] = None
        with self.strategy.scope():
            with precision.policy(mixed_precision):
                # The average's copy first: a task that remembers the model it built last
                # (KerasModelTask) then holds the one that trains.
                average_model = task.build_model() if ema_decay is not None else None
                self.model = task.build_model()
            contract.check_model(task, self.model)
            optimizer = task.build_optimizer()
            contract.check_optimizer(task, optimizer, self.model)
            self.optimizer = precision.wrap_optimizer(optimizer, mixed_precision)
            # Keras 3 optimizers must own their slots before a strategy traces
            # apply_gradients; tf_keras ones accept it as well. tf_keras' legacy
            # optimizers (Model Garden's) have no `build`: they make slots as they go.
            build = getattr(self.optimizer, "build", None)
            if callable(build):
                build(self.model.trainable_variables)
            # What the task's train_step gets as its `optimizer`.
            self.gradients = GradientPipeline(self.optimizer, self.model.trainable_variables,
                                              clip_norm, accumulation_steps)
            self.ema = (MovingAverage(self.model, average_model, ema_decay)
                        if average_model is not None else None)
            self.global_step = orbit.utils.create_global_step()
            self.train_metrics = contract.check_metrics(task, task.build_metrics(training=True), True)
            self.eval_metrics = contract.check_metrics(task, task.build_metrics(training=False), False)
            self.train_loss = tf.keras.metrics.Mean("loss")
            self.eval_loss = tf.keras.metrics.Mean("loss")
        self._task_step = xla.compile_if(jit_compile, self._task_train_step)
        self._eval_checkpoint = None  # Built on first use, with ema_decay.
        self.aggregations = aggregation.of_task(task)  # Host aggregation of eval outputs.
        self._aggregates = bool(self.aggregations)
        self._scalar_logs = set()  # Extra eval logs of rank 0, found while tracing.
        self.init_async()
        if evaluate and self._coordinator is not None:
            raise UserError(
                "ParameterServerStrategy trains only; evaluate with the sidecar evaluator "
                "(--mode=continuous_eval, the \"evaluator\" task of TF_CONFIG)."
            )
        self.checkpoint = checkpoint_contents.build_checkpoint(
            self.global_step, self.model, self.optimizer,
            ema=self.ema.state if self.ema is not None else None)
        # Distributed datasets; setting one (e.g. a resume's) makes the next loop iterate it anew.
        self.train_dataset = (
            self.distribute_dataset(self.checked_inputs, training=True, announce=True)
            if train else None)
        # Every eval set of the task, distributed: {None: dataset} for the one
        # unnamed set, else {name: dataset} in the order of Task.eval_datasets().
        self.eval_sets: Dict[Optional[str], Any] = self.build_eval_sets() if evaluate else {}
        self.eval_dataset = next(iter(self.eval_sets.values()), None)  # The one being evaluated.

    def build_eval_sets(self) -> Dict[Optional[str], Any]:
        """The task's eval datasets, distributed, by name (`None`: the one unnamed set).

        With names (`Task.eval_datasets()`), `build_inputs(training=False,
        input_context, name=NAME)` is called once per name.
        """
        names = tuple(self.task.eval_datasets())
        if not names:
            return {None: self.distribute_dataset(self.checked_inputs, training=False)}
        return {name: self.distribute_dataset(self.checked_inputs, training=False, name=name)
                for name in names}

    def checked_inputs(self, training: bool, input_context=None, **kwargs):
        """`task.build_inputs(...)` as ctl reads it: checked, the train set repeated
        (`ctl.core.contract.inputs`)."""
        return contract.inputs(self.task, training, input_context, **kwargs)

    @property
    def eval_model(self):
        """The model evaluation and exports use: the moving average with `ema_decay`, else `model`."""
        return self.ema.model if self.ema is not None else self.model

    @property
    def eval_checkpoint(self) -> tf.train.Checkpoint:
        """The evaluated state, as the best checkpoint saves it and a sidecar restores it.

        The trainer's checkpoint; with `ema_decay`, the averaged model as
        `model`, and the global step.
        """
        if self.ema is None:
            return self.checkpoint
        if self._eval_checkpoint is None:
            self._eval_checkpoint = tf.train.Checkpoint(global_step=self.global_step,
                                                        model=self.ema.model)
        return self._eval_checkpoint

    def eval_restore_objects(self) -> Dict[str, Any]:
        """What an evaluator restores from a training checkpoint: `model`, or `ema`."""
        return {"ema": self.ema.state} if self.ema is not None else {"model": self.model}

    @property
    def batches_per_step(self) -> int:
        """Batches each train step reads from the train input (`accumulation_steps`)."""
        return self.gradients.accumulation_steps

    def distribute_dataset(self, dataset_or_fn, *args, **kwargs):
        """Distributes a dataset, or a function `fn(*args, input_context, **kwargs)`.

        Under parameter servers each worker builds its own copy of the dataset
        (`ClusterCoordinator.create_per_worker_dataset`).
        """
        if self._coordinator is not None:
            per_worker_fn = tf.function(lambda: orbit.utils.make_distributed_dataset(
                self.strategy, dataset_or_fn, *args, **kwargs))
            return self._coordinator.create_per_worker_dataset(per_worker_fn)
        try:
            return orbit.utils.make_distributed_dataset(
                self.strategy, dataset_or_fn, *args, **kwargs
            )
        except (tf.errors.InvalidArgumentError, ValueError) as error:
            # A value the task was configured with that tf.data or the strategy
            # refuses (a batch size of 0, one the replicas cannot split).
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(
                f"{type(self.task).__name__} cannot build its input pipeline ({text}); check "
                "the task's settings in the gin config (e.g. its batch size)."
            ) from error

    # Parameter-server training (the names Model Garden's trainer uses).

    def init_async(self) -> None:
        """Creates the `ClusterCoordinator` under `ParameterServerStrategy` (eager)."""
        self._coordinator = None
        if isinstance(self.strategy, tf.distribute.ParameterServerStrategy):
            self._coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)

    def join(self) -> None:
        """Waits for every scheduled step (eager); a no-op without parameter servers."""
        if self._coordinator is not None:
            self._coordinator.join()

    # Training.

    def train(self, num_steps: tf.Tensor) -> TrainLoopEnd:
        """Runs one train loop of `num_steps` steps; returns its results and end step.

        The loop's end state is returned as a value rather than kept on the trainer.
        A user's mistake found while the step is traced or compiled (a `UserError`
        of the gradient pipeline, an op XLA cannot compile) is a `UserError`.
        """
        self.train_loop_begin()
        if self._train_loop is None:
            self._train_loop = self.create_train_loop_fn()
        try:
            end = self._train_loop(self.train_iterator, num_steps)
        except Exception as error:  # noqa: BLE001 - re-raised unless it is the user's.
            explained = user_error_within(error) or xla.explain(error, type(self.task).__name__)
            if explained is None or explained is error:
                raise
            raise explained from error
        logs = self.train_loop_end()
        if end is None:  # A host or parameter-server loop (or an orbit-style loop_fn).
            end = self._loop_end_values()
        bad_step = int(end["bad_step"]) if "bad_step" in end else NO_BAD_STEP
        return TrainLoopEnd(logs, int(end["global_step"]),
                            None if bad_step == NO_BAD_STEP else bad_step)

    @property
    def train_iterator(self):
        """The iterator train loops read from: made from `train_dataset` on first use, and
        again whenever `train_dataset` is replaced (so a checkpoint can hold it)."""
        dataset = self.train_dataset
        if self._train_iterator is None or self._train_iterator[0] is not dataset:
            self._train_iterator = (dataset, tf.nest.map_structure(iter, dataset))
        return self._train_iterator[1]

    @_plain
    def _loop_end_values(self) -> Dict[str, tf.Tensor]:
        end = {"global_step": self.global_step.read_value()}
        if self.step_guard is not None:
            end["bad_step"] = self.step_guard.bad_step.read_value()
        return end

    def create_train_loop_fn(self):
        """The loop `train` calls: resets the metrics, runs the steps, reads the metrics.

        With `use_tf_while_loop` all three are one `tf.function` call, which
        also returns the global step (and the guard's bad step) it ended at:
        a separate reset or read cost 0.4-0.7 ms right after a loop here, 2-4%
        of a 100-step loop of a small model (bench/, figure 1). The returned
        function may return None (as orbit's loops do): `train` then reads
        the end state itself.
        """
        guard = self.step_guard
        if self._coordinator is not None:  # Parameter servers: one closure per step.
            # Scheduled steps run later, on whichever worker is free: each one
            # checks the guard first and does nothing once the loop must stop.
            step_fn = tf.function(guard.skip_if_stopped(self.train_step) if guard else self.train_step)

            # With a guard, at most this many steps are scheduled ahead: a stop waits
            # for the steps running and for these, which do nothing.
            workers = {device.name.split("/device:")[0] for device in tf.config.list_logical_devices()
                       if device.name.startswith("/job:worker/")}  # The coordinator sees their devices.
            ahead = 4 * max(1, len(workers))

            def schedule_steps(iterator, num_steps):
                self._reset_train_metrics()
                scheduled = collections.deque()
                for _ in range(int(num_steps)):
                    if guard is not None and bool(guard.should_stop()):
                        break  # Those already scheduled see it too.
                    scheduled.append(self._coordinator.schedule(step_fn, args=(iterator,)))
                    if guard is not None and len(scheduled) > ahead:
                        _wait_for_step(scheduled.popleft())  # The oldest.
                self._last.train = None  # Read in train_loop_end, after join().

            return schedule_steps
        if self._use_tf_while_loop:
            loop = (guard.graph_loop if guard else orbit.utils.create_tf_while_loop_fn)(
                self.train_step)

            def loop_with_metrics(iterator, num_steps):
                self._reset_train_metrics()
                loop(iterator, num_steps)
                return self._train_results(), self._loop_end_values()

            loop_with_metrics = tf.function(loop_with_metrics)

            def graph_loop(iterator, num_steps):
                self._last.train, end = loop_with_metrics(iterator, num_steps)
                return end

            return graph_loop
        step_fn = tf.function(self.train_step) if self._use_tf_function else self.train_step
        loop = (guard.host_loop if guard else orbit.utils.create_loop_fn)(step_fn)
        reset = self._maybe_tf_function(self._reset_train_metrics)
        read = self._maybe_tf_function(self._train_results)

        def host_loop(iterator, num_steps):
            reset()
            loop(iterator, num_steps)
            self._last.train = read()

        return host_loop

    @_plain
    def next_train_inputs(self, iterator):
        """Returns the next inputs for the model; runs inside `tf.function`."""
        return next(iterator)

    def train_step(self, iterator):
        """One update: `accumulation_steps` batches, each through `strategy.run`."""
        micro_batches = self.gradients.accumulation_steps
        if micro_batches > 1:
            accumulate = functools.partial(self._replica_step, apply=False)

            def body(i):
                self.strategy.run(accumulate, args=(self.next_train_inputs(iterator),))
                return (i + 1,)

            tf.while_loop(lambda i: i < micro_batches - 1, body, (tf.constant(0),))
        apply = functools.partial(self._replica_step, apply=True)
        loss = self.strategy.run(apply, args=(self.next_train_inputs(iterator),))
        if self.ema is not None:
            self.ema.update()
        self.global_step.assign_add(1)
        if self.step_guard is not None:
            return self.step_guard.check_loss(self.strategy, loss, self.global_step)
        return None

    def _replica_step(self, inputs, apply: bool):
        loss, gradients = self._task_step(inputs)
        self.gradients.update(gradients, apply=apply)
        return loss

    def _task_train_step(self, inputs):
        """The task's step on one replica's batch: its loss and the gradients it applied."""
        with self.gradients.recording() as recorded:
            logs = self.task.train_step(
                inputs,
                model=self.model,
                optimizer=self.gradients,
                metrics=self.train_metrics,
            )
        if recorded.gradients is None:
            raise UserError(f"{type(self.task).__name__}.train_step did not call "
                            "optimizer.apply_gradients; call it once per step.")
        self.train_loss.update_state(logs["loss"])
        return logs["loss"], recorded.gradients

    def train_loop_begin(self) -> None:
        """Called eagerly before each train loop; does nothing by default."""

    def train_loop_end(self) -> Logs:
        """The loop's loss, metrics and learning rate (eager)."""
        self.join()
        if self._last.train is None:  # Parameter servers: the steps are done only now.
            self._last.train = self._train_results()
        return self._last.train

    @_plain
    def _reset_train_metrics(self) -> None:
        for metric in [self.train_loss, *self.train_metrics, *self.gradients.metrics()]:
            metric.reset_state()

    @_plain
    def _train_results(self) -> Logs:
        logs = _results([self.train_loss, *self.train_metrics, *self.gradients.metrics()])
        logs["learning_rate"] = current_learning_rate(self.optimizer)
        scale = precision.loss_scale(self.optimizer)
        if scale is not None:
            logs["loss_scale"] = scale
        return logs

    def _maybe_tf_function(self, fn):
        return tf.function(fn) if self._use_tf_function and self._coordinator is None else fn

    # Evaluation.

    def evaluate(self, num_steps: tf.Tensor, batch_callbacks=(),
                 summaries: Optional[SummaryManager] = None, step: Optional[int] = None) -> Logs:
        """One evaluation of `num_steps` batches (-1: the whole eval set) of every eval set.

        Returns the logs of the one unnamed set, or `{name: logs}` for the
        named sets of `Task.eval_datasets()`, each evaluated in turn from its
        start (in-line and on the sidecar alike). A fixed number of steps
        runs as one `tf.function` call that also resets and reads the metrics
        (measured in bench/, figure 2). `batch_callbacks` (Keras callbacks)
        see `on_test_begin`/`on_test_end` around each set and
        `on_test_batch_begin/end` around each step of a host loop.

        `summaries` (ctl's Controller passes its eval summaries): the results
        are written there at `step`, a named set's in its subdirectory, and
        are on disk when this returns, and its writer is the default for the
        eval steps' own `tf.summary` calls. The one-call loop writes them and
        flushes as ops of that call (no eager TensorFlow op after it); what it
        cannot write (a task's aggregations, a value that is no scalar) and a
        host loop's results are written eagerly after.
        """
        if not self.eval_sets:
            raise ValueError("this Trainer was built with evaluate=False: it has no eval dataset.")
        if self.ema is not None:
            self.ema.follow_weights_if_unstarted()
        writing = None
        if summaries is not None and summaries.enabled:
            step = int(self.global_step.numpy()) if step is None else step
            writing = _EvalWriting(summaries, step, tf.constant(step, tf.int64))
            kept = summaries.kept
        if list(self.eval_sets) == [None]:
            logs = self.evaluate_set(self.eval_sets[None], num_steps, batch_callbacks, writing)
        else:
            logs = {name: self.evaluate_set(dataset, num_steps, batch_callbacks, writing, name)
                    for name, dataset in self.eval_sets.items()}
        if writing is not None and summaries.kept > kept:  # Results the loop could not write.
            summaries.flush()
        return logs

    def evaluate_set(self, dataset, num_steps: tf.Tensor, batch_callbacks=(),
                     writing: Optional["_EvalWriting"] = None, name: Optional[str] = None) -> Logs:
        """One evaluation of `num_steps` batches of one distributed eval `dataset` (set `name`).

        `writing`: where its results go (`evaluate`); those it leaves are kept in its summaries.
        """
        self.eval_dataset = dataset
        for callback in batch_callbacks:
            callback.on_test_begin()
        logs, written = self._evaluate_dataset(num_steps, batch_callbacks, writing, name or "")
        if self.eval_stop is not None and self.eval_stop.requested():  # Incomplete: dropped.
            raise EvaluationStopped("the evaluation was stopped before its end")
        if writing is not None:
            rest = {key: value for key, value in logs.items() if key not in written}
            if rest:
                writing.summaries.write_summaries({name: rest} if name else rest, writing.step)
        for callback in batch_callbacks:
            callback.on_test_end(_python_logs(logs))
        return logs

    def _evaluate_dataset(self, num_steps: tf.Tensor, batch_callbacks,
                          writing: Optional["_EvalWriting"], set_path: str):
        """The set's logs, and the names of those its loop wrote to `writing` (in the graph)."""
        state = self.eval_begin()
        iterator = tf.nest.map_structure(iter, self.eval_dataset)
        steps = int(num_steps)
        written = ()
        if state is None and steps >= 0 and self._use_tf_while_loop and not batch_callbacks:
            if not (tf.is_tensor(num_steps) and num_steps.dtype == tf.int32):
                num_steps = tf.constant(steps, tf.int32)
            if writing is None:
                if self._graph_eval_loop is None:
                    self._graph_eval_loop = tf.function(self._eval_loop_with_metrics)
                self._last.eval = self._graph_eval_loop(iterator, num_steps)
            else:
                loop = self._writing_eval_loop(writing.summaries, set_path)
                self._last.eval = loop.function(iterator, num_steps, writing.step_tensor)
                written = loop.written
        else:
            if self._host_eval_parts is None:
                self._host_eval_parts = (
                    tf.function(self.eval_step) if self._use_tf_function else self.eval_step,
                    self._maybe_tf_function(self._reset_eval_metrics),
                    self._maybe_tf_function(self._eval_results),
                )
            step_fn, reset, read = self._host_eval_parts
            # The eval steps' own summaries go to the eval summaries, flushed at the end.
            with (writing.summaries.summary_writer().as_default() if writing is not None
                  else contextlib.nullcontext()):
                reset()
                loop = orbit.utils.create_loop_fn(self._stoppable(
                    _with_batch_callbacks(step_fn, batch_callbacks)))
                state = loop(iterator, steps, state=state,
                             reduce_fn=self.eval_reduce if state is not None else None)
                self._last.eval = read()
        end_off_path(iterator)
        del iterator
        logs = self.eval_end(state) if state is not None else self.eval_end()
        # Written by the loop, unless eval_end put another value in its place.
        return logs, [key for key in written if logs.get(key) is self._last.eval[key]]

    def _writing_eval_loop(self, summaries: SummaryManager, set_path: str) -> "_WritingEvalLoop":
        """The one-call eval loop that also writes its results to `summaries` (`set_path`)."""
        key = f"{id(summaries)}/{set_path}"  # (A string: the Trainer tracks its attributes.)
        loop = self._writing_eval_loops.get(key)
        if loop is None:
            loop = _WritingEvalLoop()

            def loop_and_write(iterator, num_steps, step):
                # The eval steps' own tf.summary calls go to the root writer; its context's
                # exit flushes it, and write_in_graph flushes the set's: ops of this call.
                with summaries.summary_writer().as_default():
                    results = self._eval_loop_with_metrics(iterator, num_steps)
                    # A stopped evaluation's results are incomplete: not written. (Read
                    # after the loop: a read need not wait for the loop's reads otherwise.)
                    record = True
                    if self.eval_stop is not None:
                        with tf.control_dependencies(tf.nest.flatten(results)):
                            record = tf.logical_not(self.eval_stop.stop_requested.read_value())
                    loop.written = summaries.write_in_graph(results, step, set_path, record)
                return results

            loop.function = tf.function(loop_and_write)
            self._writing_eval_loops[key] = loop
        return loop

    def _eval_loop_with_metrics(self, iterator, num_steps):
        self._reset_eval_metrics()
        if self.eval_stop is None:
            orbit.utils.create_tf_while_loop_fn(self.eval_step)(iterator, num_steps)
        else:  # Also ends before the next step once a stop is requested.
            stop = self.eval_stop.stop_requested

            def body(i):
                with tf.name_scope(""):
                    self.eval_step(iterator)
                return (i + 1,)

            tf.while_loop(lambda i: tf.logical_and(i < num_steps,
                                                   tf.logical_not(stop.read_value())),
                          body, (tf.constant(0, num_steps.dtype),))
        return self._eval_results()

    def _stoppable(self, step_fn):
        """`step_fn` for orbit's host loop, which ends it (StopIteration) once `eval_stop` asks."""
        if self.eval_stop is None:
            return step_fn
        requested = self.eval_stop.requested

        def step(iterator):
            if requested():
                raise StopIteration
            return step_fn(iterator)

        return step

    @_plain
    def _reset_eval_metrics(self) -> None:
        for metric in [self.eval_loss, *self.eval_metrics]:
            metric.reset_state()

    @_plain
    def _eval_results(self) -> Logs:
        return _results([self.eval_loss, *self.eval_metrics])

    def eval_begin(self):
        """Returns the state `eval_reduce` accumulates, or None (eager)."""
        if not self._aggregates:
            return None
        # A non-None state makes the loop call eval_reduce after each step.
        return [each.start() for each in self.aggregations]

    @_plain
    def next_eval_inputs(self, iterator):
        """Returns the next inputs for the model; runs inside `tf.function`."""
        return next(iterator)

    def eval_step(self, iterator):
        def step_fn(inputs):
            logs = dict(
                self.task.validation_step(inputs, model=self.eval_model, metrics=self.eval_metrics)
            )
            # Weigh each batch by its size, so that the remainder batch (and the
            # empty batch a replica gets when the eval set runs out) count right.
            examples = tf.shape(tf.nest.flatten(inputs)[0])[0]
            loss = logs.pop("loss")
            loss = tf.where(examples > 0, loss, tf.zeros_like(loss))
            self.eval_loss.update_state(loss, sample_weight=tf.cast(examples, loss.dtype))
            if not self._aggregates:
                return {}
            return {name: self._with_size(name, value) for name, value in logs.items()}

        outputs = self.strategy.run(step_fn, args=(self.next_eval_inputs(iterator),))
        # Concatenated over all replicas of all workers, with each replica's size.
        return tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), outputs)

    def _with_size(self, name, value):
        value = tf.convert_to_tensor(value)
        if value.shape.rank == 0:
            self._scalar_logs.add(name)
            value = value[tf.newaxis]
        return value, tf.shape(value)[:1]

    def eval_reduce(self, state=None, step_outputs=None):
        if state is None:  # The task aggregates nothing.
            return None
        step_logs = {}
        for name, (values, sizes) in step_outputs.items():
            per_replica = np.split(values.numpy(), np.cumsum(sizes.numpy())[:-1])
            if name in self._scalar_logs:
                per_replica = [value[0] for value in per_replica]
            step_logs[name] = per_replica
        return [each.update(s, step_logs) for each, s in zip(self.aggregations, state)]

    def eval_end(self, aggregated_logs=None) -> Logs:
        """The eval loss and metrics, and the results of the task's aggregations."""
        logs = dict(self._last.eval)
        if aggregated_logs is not None:
            step = int(self.global_step.numpy())
            for each, state in zip(self.aggregations, aggregated_logs):
                logs.update(each.results(state, step))
        return logs


def _wait_for_step(remote_value) -> None:
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


class _IteratorEnder:
    """Ends finished eval iterators on a thread of its own, off the evaluation's path.

    The last reference to an iterator stops its input pipeline's threads
    (prefetch, parallel map) and waits for them: after each evaluation of
    figure 2's MLP (bench/eval_throughput.py) that was 0.5 ms of a 1-step one
    and 1.6 ms of a 100-step one, all of it on the caller's path. TensorFlow
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


def _python_logs(logs) -> Logs:
    """`logs` as Keras callbacks take them: Python numbers (lists for non-scalars)."""
    values = {}
    for name, value in logs.items():
        array = np.asarray(value)
        values[name] = array.item() if array.ndim == 0 else array.tolist()
    return values


def _with_batch_callbacks(step_fn, callbacks):
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


@_plain
def _results(metrics) -> Logs:
    logs = {}
    for metric in metrics:
        result = metric.result()
        if isinstance(result, dict):
            logs.update(result)
        else:
            logs[metric.name] = result
    return logs


@_plain
def current_learning_rate(optimizer) -> tf.Tensor:
    """The optimizer's current learning rate, as its Keras reports it.

    With a schedule, Keras 3 (and tf_keras' legacy optimizers) evaluate it at
    the current iteration: the next update's rate; tf_keras optimizers report
    the rate of the last update.
    """
    learning_rate = optimizer.learning_rate
    if callable(learning_rate):  # A tf_keras schedule; Keras 3 evaluates its own.
        learning_rate = learning_rate(optimizer.iterations)
    return tf.convert_to_tensor(learning_rate)
