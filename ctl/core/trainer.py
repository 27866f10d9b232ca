"""`Trainer`: builds what a `Task` trains and runs its train loops, on orbit's runner protocol.

An `orbit.AbstractTrainer` and `orbit.AbstractEvaluator` (`train(num_steps)`,
`evaluate(num_steps)`) with its own loops, built from orbit's utilities. Its pieces:

- this module: building (model, optimizer, metrics, datasets, checkpoint), the train step
  and the train loop's override points (the methods a subclass overrides);
- `ctl.core.loops`: the loop functions and the step guard (`StepGuard`);
- `ctl.core.evaluation`: evaluation (`Evaluation`, which the Trainer inherits) and its override points;
- `ctl.core.inputs`: the datasets, checked and distributed (`Inputs`, which the Trainer inherits);
- `ctl.core.runner`: what a train loop returns (`TrainLoopEnd`) and what a stopped
  evaluation raises (`EvaluationStopped`);
- `ctl.core.precision`, `ctl.core.train_step`, `ctl.core.ema`: the train-step settings
  (docs/train_step.md). `global_step` counts updates (K batches with `accumulation_steps=K`).

The loops as pseudo-code: docs/explanation/training-loop.md.
"""

import contextlib
import functools
from typing import Any, Dict, Optional, Sequence

import gin
import orbit
import tensorflow as tf

from ctl.core import aggregation, checkpoint_contents, contract, loops, precision, step_random, xla
from ctl.core.ema import MovingAverage
from ctl.utils import console
from ctl.utils.errors import UserError, user_error_within
from ctl.core.evaluation import Evaluation, stateful_random_ops
from ctl.core.inputs import Inputs
from ctl.core.loops import plain
from ctl.core.runner import NO_BAD_STEP, Logs, TrainLoopEnd
from ctl.core.stop import SignalWatcher
from ctl.core.task import Task, noting_ignored_aux
from ctl.core.train_step import GradientPipeline


@gin.configurable(module="ctl", denylist=["task", "strategy", "train", "evaluate", "stop",
                                          "guard_steps", "eval_callbacks"])
class Trainer(orbit.AbstractTrainer, Evaluation, Inputs):
    """Trains and evaluates a `Task` under a `tf.distribute` strategy.

    The checkpoint (`self.checkpoint`) holds `global_step`, `model` and
    `optimizer` under those names, so Keras' SidecarEvaluator and Model Garden
    tools can read it, `rng`: the Keras 3 RNG states of the model, if any
    (`ctl.faults.resume`), `ema`: the moving average, with `ema_decay`, and
    the task's `checkpoint_items(model)` (Model Garden's `backbone`, `encoder`).
    Subclass and override one of its override points to change one part of
    the loop (the train loop's here, the evaluation's of `ctl.core.evaluation.Evaluation`);
    point gin's `ctl.Experiment.trainer_cls` at the subclass. (Objects that watch a run
    without changing the loop are hooks: `ctl.hooks`.) The override points, and where each runs:

        train_loop_begin()             eager, before each train loop
        next_train_inputs(iterator)    inside tf.function, once per batch
        train_step(iterator)           inside tf.function, one update
        train_loop_end() -> logs       eager, after each train loop
        eval_begin() -> state          eager, before each eval set
        next_eval_inputs(iterator)     inside tf.function, once per batch
        eval_step(iterator)            inside tf.function, one step on every replica
        eval_reduce(state, outputs)    eager, after each eval step (a task that aggregates)
        eval_end(state) -> logs        eager, after each eval set

    The loops they run in, as pseudo-code: [The training loop](../explanation/training-loop.md).
    The train-step settings are explained in [The train step](../train_step.md).

    Example (gin; the task and strategy come from `ctl.Experiment` and `--strategy`):

        ctl.Trainer.use_tf_while_loop = False   # one Python call per step, e.g. to debug
        ctl.Trainer.mixed_precision = 'mixed_bfloat16'
        ctl.Trainer.clip_norm = 1.0

    Args:
      task: the `ctl.Task` to train and evaluate (given by `ctl.Experiment`, not by gin).
      strategy: the `tf.distribute.Strategy` to build and run under (from `--strategy`, not
        gin); `None`: the current one (`tf.distribute.get_strategy()`).
      train: build the train input (`train_dataset`); `False` for a trainer that only
        evaluates (`--mode=eval`, the sidecar). Set by the mode, not gin.
      evaluate: build the eval inputs (`eval_sets`) to evaluate in-line; must be `False`
        under a `ParameterServerStrategy`, which trains only (evaluate with a sidecar,
        `--mode=continuous_eval`). Set by the mode, not gin.
      use_tf_function: run each train loop and evaluation as a `tf.function` (graph);
        `False` runs them eagerly, step by step, where a debugger and `print` work.
      use_tf_while_loop: run a loop's steps in one `tf.while_loop` inside that function
        (fewest host round trips); `False` calls the traced step once per step from
        Python. Needs `use_tf_function=True`.
      mixed_precision: `'mixed_float16'` or `'mixed_bfloat16'`: the Keras dtype policy
        while the task builds its model; float16 adds loss scaling.
      jit_compile: compile each replica's train step with XLA.
      clip_norm: clip the gradients, summed over replicas, to this global norm.
      accumulation_steps: one update per this many batches (micro-batches).
      ema_decay: keep a moving average of the weights; evaluation, the
        sidecar, the best checkpoint and exports use it.
      stop: what may end a loop early, the stop source
        (`ctl.core.stop.SignalWatcher`), or None: loops run to their end. Given
        by the composition root (`ctl.train_lib`), not gin.
      guard_steps: with a `stop`, train loops look at it, and at each step's
        loss, before every step (`ctl.core.loops.StepGuard`: `step_guard`);
        False: only after each loop (`ctl.FaultTolerance.stop_check='loop'`).
        A one-process strategy's evaluations also end before their next step
        on a stop (`eval_stop`); a cluster's run to their end (lockstep). Given
        by `ctl.train_lib` from `ctl.FaultTolerance`, not gin.
      eval_callbacks: Keras callbacks that each evaluation calls, in-line and
        on the sidecar: for each eval set `on_test_begin`,
        `on_test_batch_begin/end` per batch and `on_test_end`. Given by
        `ctl.train_lib` from the experiment's hooks (`ctl.hooks.KerasCallbacks`),
        not gin.

    Raises:
      UserError: a setting that cannot work (`use_tf_while_loop` without `use_tf_function`,
        an unknown precision policy, evaluation under parameter servers), before anything runs.
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
        stop: Optional[SignalWatcher] = None,
        guard_steps: bool = True,
        eval_callbacks: Sequence[Any] = (),
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
        self._last_train = loops.LastResults()  # For train_loop_end.
        self._train_loop: Optional[Any] = None  # Built on first use (create_train_loop_fn).
        self._train_iterator = None  # (dataset, its iterator): made anew when the dataset changes.
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
            # Its moving averages, swapped into the model around each evaluation, if any.
            self.averaged_optimizer = task.averaged_optimizer(optimizer)
            # Keras 3 optimizers must own their slots before a strategy traces
            # apply_gradients; tf_keras ones accept it as well. tf_keras' legacy
            # optimizers (Model Garden's) have no `build`: they make slots as they go.
            build = getattr(self.optimizer, "build", None)
            if callable(build):
                build(self.model.trainable_variables)
            # What the task's train_step gets as its `optimizer`.
            model = self.model  # Its variables as each step is traced (some appear on its first call).
            self.gradients = GradientPipeline(self.optimizer, lambda: model.trainable_variables,
                                              clip_norm, accumulation_steps,
                                              getattr(self.model, "optimizer", None))
            self.ema = (MovingAverage(self.model, average_model, ema_decay)
                        if average_model is not None else None)
            self.global_step = orbit.utils.create_global_step()
            self.train_metrics = contract.check_metrics(task, task.build_metrics(training=True), True)
            self.eval_metrics = contract.check_metrics(task, task.build_metrics(training=False), False)
            self.train_loss = tf.keras.metrics.Mean("loss")
            self.eval_loss = tf.keras.metrics.Mean("loss")
        self._task_step = xla.compile_if(jit_compile, self.task_train_step)
        # The run's seed with ctl.FaultTolerance.stateless_random_ops (build_run sets it): the task's
        # step then draws from tf.random as functions of the step (`ctl.core.step_random`).
        self.step_random_seed: Optional[int] = None
        self._said_stateful_draws = False
        self._rng_tracked_at_trace: Optional[int] = -1  # The loop's trace count then (-1: never).
        self._said_ignored_aux = False  # The aux losses' line: once.
        self._eval_checkpoint = None  # Built on first use, with ema_decay.
        self.init_async()
        # Outside the strategy's scope: plain host variables that every worker reads.
        self._step_guard = (loops.StepGuard.for_strategy(self.strategy, stop, self.global_step)
                            if stop is not None and guard_steps else None)
        lockstep = isinstance(self.strategy, (tf.distribute.MultiWorkerMirroredStrategy,
                                              tf.distribute.ParameterServerStrategy))
        # Evaluation's own state, and the loop settings the train loops follow too.
        Evaluation.__init__(self, aggregation.of_task(task), use_tf_function, use_tf_while_loop,
                            eval_stop=None if lockstep else stop, eval_callbacks=eval_callbacks)
        if evaluate and self._coordinator is not None:
            raise UserError(
                "ParameterServerStrategy trains only; evaluate with the sidecar evaluator "
                "(--mode=continuous_eval, the \"evaluator\" task of TF_CONFIG)."
            )
        # Parts of the model a checkpoint holds at its top level too (Model Garden's `backbone`).
        self.checkpoint_items: Dict[str, Any] = dict(task.checkpoint_items(self.model) or {})
        self.checkpoint = checkpoint_contents.build_checkpoint(
            self.global_step, self.model, self.optimizer,
            ema=self.ema.state if self.ema is not None else None, items=self.checkpoint_items)
        # Distributed datasets; setting one (e.g. a resume's) makes the next loop iterate it anew.
        self.train_dataset = (
            self.distribute_dataset(self.checked_inputs, training=True, announce=True)
            if train else None)
        # Every eval set of the task, distributed: {None: dataset} for the one
        # unnamed set, else {name: dataset} in the order of Task.eval_datasets().
        self.eval_sets: Dict[Optional[str], Any] = self.build_eval_sets() if evaluate else {}
        self.eval_dataset = next(iter(self.eval_sets.values()), None)  # The one being evaluated.

    @property
    def step_guard(self) -> Optional[loops.StepGuard]:
        """What ends a train loop early on a stop or a NaN loss (None: orbit's loops), fixed at
        construction (`stop`, `guard_steps`)."""
        return self._step_guard

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
        """What an evaluator restores from a training checkpoint: `model` and, with
        `ema_decay`, `ema` (the model it evaluates); the optimizer only when
        evaluation swaps in its averages (`Task.averaged_optimizer`)."""
        objects: Dict[str, Any] = {"model": self.model}
        if self.averaged_optimizer is not None:  # Its averages are what is evaluated.
            objects["optimizer"] = self.optimizer
        if self.ema is not None:
            objects["ema"] = self.ema.state
        return objects

    @property
    def batches_per_step(self) -> int:
        """Batches each train step reads from the train input (`accumulation_steps`)."""
        return self.gradients.accumulation_steps

    # Training.

    def train(self, num_steps: tf.Tensor) -> TrainLoopEnd:
        """Runs one train loop of `num_steps` steps; returns its results and end step.

        The loop's end state is returned as a value rather than kept on the trainer.
        A user's mistake found while the step is traced or compiled (a `UserError`
        of the gradient pipeline, an op XLA cannot compile) is a `UserError`.

        Args:
            num_steps: the steps this loop runs (a scalar tensor).

        Returns:
            The loop's `TrainLoopEnd`: its results, its end step and the step a guard stopped at, if any.

        Raises:
            UserError: a user's mistake found while the step is traced or compiled.
        """
        self.train_loop_begin()
        try:
            if self._train_loop is None:
                # Traced before it runs, so that what its trace builds (a layer's RNG state) is
                # in the checkpoint, restored, before a step draws from it.
                self.trace_train_loop()
            self._track_rng_states_if_traced()
            end = self._train_loop(self.train_iterator, num_steps)
        except Exception as error:  # Re-raised unless it is the user's.
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

    @plain
    def _loop_end_values(self) -> Dict[str, tf.Tensor]:
        end = {"global_step": self.global_step.read_value()}
        if self.step_guard is not None:
            end["bad_step"] = self.step_guard.bad_step.read_value()
        return end

    def create_train_loop_fn(self):
        """The loop `train` calls: resets the metrics, runs the steps, reads the metrics.

        One of `ctl.core.loops`' train loops: with `use_tf_while_loop` all
        three are one `tf.function` call, which also returns the global step
        (and the guard's bad step) it ended at. The returned function may
        return None (as orbit's loops do): `train` then reads the end state
        itself.
        """
        guard = self.step_guard
        if self._coordinator is not None:  # Parameter servers: one closure per step.
            step_fn = tf.function(guard.skip_if_stopped(self.train_step) if guard else self.train_step)
            schedule_steps = loops.scheduled_train_loop(self._coordinator, step_fn, guard,
                                                        self._reset_train_metrics)

            def scheduled_loop(iterator, num_steps):
                schedule_steps(iterator, num_steps)
                self._last_train.logs = None  # Read in train_loop_end, after join().

            return scheduled_loop
        if self._use_tf_while_loop:
            loop = loops.graph_train_loop(self.train_step, guard, self._reset_train_metrics,
                                          self._train_results, self._loop_end_values)

            def graph_loop(iterator, num_steps):
                self._last_train.logs, end = loop(iterator, num_steps)
                return end

            graph_loop.trace = lambda iterator: loop.get_concrete_function(  # type: ignore[attr-defined]
                iterator, loops.LOOP_SIZE)
            graph_loop.tracing_count = loop.experimental_get_tracing_count  # type: ignore[attr-defined]
            return graph_loop
        parts = (self.train_step, self._reset_train_metrics, self._train_results)
        if self._use_tf_function:
            parts = tuple(tf.function(part) for part in parts)
        step_fn, reset, read = parts
        loop = loops.host_train_loop(step_fn, guard, reset, read)

        def host_loop(iterator, num_steps):
            self._last_train.logs = loop(iterator, num_steps)

        if self._use_tf_function:
            host_loop.trace = step_fn.get_concrete_function  # type: ignore[attr-defined]
            host_loop.tracing_count = step_fn.experimental_get_tracing_count  # type: ignore[attr-defined]
        return host_loop

    # Two override points of one shape, this and `Evaluation.next_eval_inputs`: a subclass changes
    # what one side reads without the other.
    @plain
    def next_train_inputs(self, iterator):
        """Returns the next inputs for the model; runs inside `tf.function`.

        Args:
            iterator: the distributed train iterator.

        Returns:
            The next element, `(features, labels)`.
        """
        return next(iterator)

    def train_step(self, iterator):
        """One update: `accumulation_steps` batches, each through `strategy.run`.

        Args:
            iterator: the distributed train iterator, read `accumulation_steps` times.

        Returns:
            The step guard's verdict on the step's loss, or None without a step guard.
        """
        micro_batches = self.gradients.accumulation_steps
        if micro_batches > 1:
            accumulate = functools.partial(self._replica_step, apply=False)

            def body(i):
                self.strategy.run(accumulate, args=(self.next_train_inputs(iterator),),
                                  kwargs={"micro_batch": i})
                return (i + 1,)

            tf.while_loop(lambda i: i < micro_batches - 1, body, (tf.constant(0),))
        apply = functools.partial(self._replica_step, apply=True)
        loss = self.strategy.run(apply, args=(self.next_train_inputs(iterator),),
                                 kwargs={"micro_batch": micro_batches - 1})
        if self.ema is not None:
            self.ema.update()
        self.global_step.assign_add(1)
        if self.step_guard is not None:
            return self.step_guard.check_loss(self.strategy, loss, self.global_step)
        return None

    def _replica_step(self, inputs, apply: bool, micro_batch=0):
        with self._draws(micro_batch):
            loss, gradients = self._task_step(inputs)
        self.gradients.update(gradients, apply=apply)
        return loss

    def _draws(self, micro_batch):
        """Where the task's step draws its random numbers from, on one replica: TensorFlow's
        stateful ops, or with `step_random_seed` their stateless twins seeded per step."""
        if self.step_random_seed is None:
            return contextlib.nullcontext()
        return step_random.drawn_per_step(self.step_random_seed, self.global_step, micro_batch)

    def task_train_step(self, inputs):
        """The task's step on one replica's batch: its loss and the gradients it applied.

        Checks the task's contract as it is traced (`ctl.core.contract`): a
        dict with a scalar float `"loss"`, gradients applied once.

        Args:
            inputs: one replica's batch.

        Returns:
            `(loss, gradients)`: the step's loss and the gradients it applied.
        """
        with self.gradients.recording() as recorded, noting_ignored_aux() as ignored_aux:
            logs = self.task.train_step(
                inputs,
                model=self.model,
                optimizer=self.gradients,
                metrics=self.train_metrics,
            )
        contract.check_step_logs(self.task, logs, "train_step")
        gradients = self.gradients.recorded(recorded, type(self.task).__name__)
        if ignored_aux and not self._said_ignored_aux:
            self._said_ignored_aux = contract.say_ignored_aux(self.task, ignored_aux[0])
        self.train_loss.update_state(logs["loss"])
        return logs["loss"], gradients

    def trace_train_loop(self) -> bool:
        """Traces the function `train` runs, on the train iterator, before its first call.

        Runs no step and reads no batch: the first `train` then finds the
        function traced (when called as `ctl.core.controller.Controller` does,
        with a scalar int32 `num_steps`, outside the strategy's scope and any
        summary writer). Returns False for a loop without a `tf.function` of
        its own (`use_tf_function=False`, parameter servers).

        Returns:
            Whether the loop's function was traced.
        """
        if self._train_loop is None:
            self._train_loop = self.create_train_loop_fn()
        trace = getattr(self._train_loop, "trace", None)
        if trace is None:
            return False
        traced = trace(self.train_iterator)
        self._track_rng_states_if_traced()
        self._say_stateful_draws(traced)
        return True

    def _say_stateful_draws(self, traced) -> None:
        """Seeded, says once which stateful random ops the traced train loop still draws from:
        their state is in no checkpoint, so a resumed run draws other numbers there."""
        if self.run_seed is None or self._said_stateful_draws:
            return
        self._said_stateful_draws = True
        ops = stateful_random_ops(traced)
        if not ops:
            return
        if self.step_random_seed is None:
            console.info(
                "train", "the train step draws from stateful random ops (%s), whose state lives "
                "in their kernels, in no checkpoint: a run resumed after kill -9 or SIGTERM draws "
                "other numbers there. ctl.FaultTolerance.stateless_random_ops=True makes "
                "tf.random's draws in the step functions of the step (other numbers than "
                "these ops')", ", ".join(ops))
        else:
            console.info(
                "train", "the train step still draws from stateful random ops (%s), not through "
                "tf.random.uniform, normal, truncated_normal, shuffle or categorical: a run "
                "resumed after kill -9 or SIGTERM draws other numbers there", ", ".join(ops))

    def _track_rng_states_if_traced(self) -> None:
        """`track_new_rng_states` before a loop, if the loop was traced since the last time (only
        a trace builds a layer; a walk of a large model's layers is a share of a short loop). A
        loop that cannot say how often it was traced is tracked before every call."""
        count = getattr(self._train_loop, "tracing_count", None)
        traces = count() if count is not None else None
        if traces is None or traces != self._rng_tracked_at_trace:
            self.track_new_rng_states()
            self._rng_tracked_at_trace = traces

    def track_new_rng_states(self) -> None:
        """Adds to the checkpoint the model's RNG states made since it was built (a layer built
        on its first call, in a trace of the step), which a restore before then gives their saved
        values now (`checkpoint_contents.track_new_rng_states`)."""
        checkpoint_contents.track_new_rng_states(self.checkpoint, self.model)

    def train_loop_begin(self) -> None:
        """Called eagerly before each train loop; does nothing by default."""

    def train_loop_end(self) -> Logs:
        """The loop's loss, metrics and learning rate (eager)."""
        self.join()
        if self._last_train.logs is None:  # Parameter servers: the steps are done only now.
            self._last_train.logs = self._train_results()
        return self._last_train.logs

    @plain
    def _reset_train_metrics(self) -> None:
        for metric in [self.train_loss, *self.train_metrics, *self.gradients.metrics()]:
            metric.reset_state()

    @plain
    def _train_results(self) -> Logs:
        logs = loops.metric_results(
            [self.train_loss, *self.train_metrics, *self.gradients.metrics()])
        if hasattr(self.optimizer, "learning_rate"):  # Not a composite of several (tfrs').
            logs["learning_rate"] = current_learning_rate(self.optimizer)
        scale = precision.loss_scale(self.optimizer)
        if scale is not None:
            logs["loss_scale"] = scale
        return logs


@plain
def current_learning_rate(optimizer) -> tf.Tensor:
    """The optimizer's current learning rate, as its Keras reports it.

    With a schedule, Keras 3 (and tf_keras' legacy optimizers) evaluate it at
    the current iteration: the next update's rate; tf_keras optimizers report
    the rate of the last update.

    Args:
        optimizer: a Keras optimizer (Keras 3 or tf_keras), possibly wrapped for loss scaling.

    Returns:
        The rate as a scalar tensor.
    """
    learning_rate = optimizer.learning_rate
    if callable(learning_rate):  # A tf_keras schedule; Keras 3 evaluates its own.
        learning_rate = learning_rate(optimizer.iterations)
    return tf.convert_to_tensor(learning_rate)
