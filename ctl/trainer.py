"""`Trainer`: the train and eval loops of a `Task`, on orbit's standard runners.

One training loop of `num_steps` steps, as `orbit.Controller` calls it:

    train_loop_begin()                      # eager; resets the metrics in one tf.function
    for _ in range(num_steps):              # tf.while_loop or a host loop
      if step_guard.should_stop(): break    # in-loop; only with a step_guard (ctl.faults)
      train_step(iterator)                  # tf.function
        inputs = next_train_inputs(iterator)
        loss = strategy.run(task.train_step, inputs)
        global_step += 1
        step_guard.check_loss(loss)         # records a NaN/Inf loss's step
    return train_loop_end()                 # eager; reads them in one tf.function

Under `ParameterServerStrategy` the loop runs on the coordinator (the chief):
each step is one closure that `coordinator_for_async().schedule()` sends to a
free worker, and `train_loop_end` first waits for them all (`join()`).

One evaluation:

    state = eval_begin()                    # eager: reset eval metrics
    for _ in range(num_steps or until the eval set ends):
      outputs = eval_step(iterator)         # tf.function
        inputs = next_eval_inputs(iterator)
        strategy.run(task.validation_step, inputs)
        strategy.gather(extra logs)         # from every replica of every worker
      state = eval_reduce(state, outputs)   # eager; only if the task aggregates
                                            # (aggregate_logs or build_reducers)
    return eval_end(state)                  # eager: {loss, metrics, task results}

The first dimension of every input tensor is the batch: the eval loss is a mean
over examples, weighted by batch size. Metrics are read across all replicas of
all workers, and the extra logs of `validation_step` are gathered from all of
them, so that every worker computes the same results over the whole eval set.

`use_tf_while_loop=True` runs the training loop (and evaluations of a fixed
number of steps) as one `tf.while_loop` inside one `tf.function` call; with
`False` the host drives the loop and each step is its own `tf.function` call.
Evaluations over the whole eval set, and of tasks that aggregate logs on the
host, always use the host loop.
"""

from typing import Any, Dict, Optional

import gin
import numpy as np
import orbit
import tensorflow as tf

from ctl import reducers
from ctl.errors import UserError
from ctl.resume import track_rng_state
from ctl.step_guard import StepGuard
from ctl.task import Task

Logs = Dict[str, Any]


@gin.configurable(module="ctl", denylist=["task", "strategy", "train", "evaluate"])
class Trainer(orbit.StandardTrainer, orbit.StandardEvaluator):
    """Trains and evaluates a `Task` under a `tf.distribute` strategy.

    The checkpoint (`self.checkpoint`) holds `global_step`, `model` and
    `optimizer` under those names, so Keras' SidecarEvaluator and Model Garden
    tools can read it, and `rng`: the Keras 3 RNG states of the model, if any
    (`ctl.resume`). Subclass and override a hook to change one part of the
    loop; point gin's `ctl.Experiment.trainer_cls` at the subclass.
    """

    def __init__(
        self,
        task: Task,
        strategy: Optional[tf.distribute.Strategy] = None,
        train: bool = True,
        evaluate: bool = True,
        use_tf_function: bool = True,
        use_tf_while_loop: bool = True,
    ):
        if use_tf_while_loop and not use_tf_function:
            raise UserError(
                "ctl.Trainer.use_tf_while_loop=True needs use_tf_function=True; "
                "set one of them differently."
            )
        self.task = task
        self.strategy = strategy or tf.distribute.get_strategy()
        self._use_tf_function = use_tf_function
        self._use_tf_while_loop = use_tf_while_loop
        self._reset_train_metrics = None  # Built on first use: one call per train loop.
        self._read_train_results = None
        # Set by ctl.faults: ends a train loop early on a signal or a NaN loss.
        self.step_guard: Optional[StepGuard] = None
        with self.strategy.scope():
            self.model = task.build_model()
            if not self.model.trainable_variables:
                raise UserError(
                    f"{type(task).__name__}.build_model() returned a model without "
                    "variables; build it (e.g. start it with an Input layer)."
                )
            self.optimizer = task.build_optimizer()
            # Keras 3 optimizers must own their slots before a strategy traces
            # apply_gradients; tf_keras ones accept it as well.
            self.optimizer.build(self.model.trainable_variables)
            self.global_step = orbit.utils.create_global_step()
            self.train_metrics = list(task.build_metrics(training=True))
            self.eval_metrics = list(task.build_metrics(training=False))
            self.train_loss = tf.keras.metrics.Mean("loss")
            self.eval_loss = tf.keras.metrics.Mean("loss")
        self.eval_reducers = list(task.build_reducers())
        self._aggregates = task.aggregates_logs() or bool(self.eval_reducers)
        self._scalar_logs = set()  # Extra eval logs of rank 0, found while tracing.
        self.init_async()
        if evaluate and self._coordinator is not None:
            raise UserError(
                "ParameterServerStrategy trains only; evaluate with the sidecar evaluator "
                "(--mode=continuous_eval, the \"evaluator\" task of TF_CONFIG)."
            )
        self.checkpoint = tf.train.Checkpoint(
            global_step=self.global_step, model=self.model, optimizer=self.optimizer
        )
        track_rng_state(self.checkpoint, self.model)  # Keras 3 Dropout etc., as `rng`.
        orbit.StandardTrainer.__init__(
            self,
            self.distribute_dataset(task.build_inputs, training=True) if train else None,
            options=orbit.StandardTrainerOptions(
                use_tf_function=use_tf_function, use_tf_while_loop=use_tf_while_loop
            ),
        )
        orbit.StandardEvaluator.__init__(
            self,
            self.distribute_dataset(task.build_inputs, training=False) if evaluate else None,
            # The loop choice for eval is made per call in create_eval_loop_fn.
            options=orbit.StandardEvaluatorOptions(use_tf_function=use_tf_function),
        )

    def distribute_dataset(self, dataset_or_fn, *args, **kwargs):
        """Distributes a dataset, or a function `fn(*args, input_context, **kwargs)`.

        Under parameter servers each worker builds its own copy of the dataset
        (`ClusterCoordinator.create_per_worker_dataset`).
        """
        if self._coordinator is not None:
            per_worker_fn = tf.function(lambda: orbit.utils.make_distributed_dataset(
                self.strategy, dataset_or_fn, *args, **kwargs))
            return self._coordinator.create_per_worker_dataset(per_worker_fn)
        return orbit.utils.make_distributed_dataset(
            self.strategy, dataset_or_fn, *args, **kwargs
        )

    # Parameter-server training (the names Model Garden's trainer uses).

    def init_async(self) -> None:
        """Creates the `ClusterCoordinator` under `ParameterServerStrategy` (eager)."""
        self._coordinator = None
        if isinstance(self.strategy, tf.distribute.ParameterServerStrategy):
            self._coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)

    def coordinator_for_async(self) -> tf.distribute.coordinator.ClusterCoordinator:
        """The coordinator that schedules steps on workers; parameter servers only."""
        if self._coordinator is None:
            raise ValueError(
                f"no ClusterCoordinator: the strategy is {type(self.strategy).__name__}, "
                "not ParameterServerStrategy."
            )
        return self._coordinator

    def join(self) -> None:
        """Waits for every scheduled step (eager); a no-op without parameter servers."""
        if self._coordinator is not None:
            self._coordinator.join()

    # Training hooks.

    def create_train_loop_fn(self):
        if self._coordinator is not None:  # Parameter servers: one closure per step.
            step_fn = tf.function(self.train_step)

            def schedule_steps(iterator, num_steps):
                for _ in range(int(num_steps)):
                    self._coordinator.schedule(step_fn, args=(iterator,))

            return schedule_steps
        if self.step_guard is None:
            return super().create_train_loop_fn()
        return self.step_guard.create_loop_fn(
            self.train_step, self._use_tf_function, self._use_tf_while_loop
        )

    def train_loop_begin(self):
        if self._reset_train_metrics is None:
            self._reset_train_metrics = self._maybe_tf_function(
                lambda: [m.reset_state() for m in [self.train_loss, *self.train_metrics]])
        self._reset_train_metrics()

    def next_train_inputs(self, iterator):
        """Returns the next inputs for the model; runs inside `tf.function`."""
        return next(iterator)

    def train_step(self, iterator):
        def step_fn(inputs):
            logs = self.task.train_step(
                inputs,
                model=self.model,
                optimizer=self.optimizer,
                metrics=self.train_metrics,
            )
            self.train_loss.update_state(logs["loss"])
            return logs["loss"]

        loss = self.strategy.run(step_fn, args=(self.next_train_inputs(iterator),))
        self.global_step.assign_add(1)
        if self.step_guard is not None:
            self.step_guard.check_loss(self.strategy, loss, self.global_step)

    def train_loop_end(self) -> Logs:
        self.join()
        if self._read_train_results is None:  # One call reads every result (host overhead).
            self._read_train_results = self._maybe_tf_function(self._train_results)
        return self._read_train_results()

    def _train_results(self) -> Logs:
        logs = _results([self.train_loss, *self.train_metrics])
        logs["learning_rate"] = current_learning_rate(self.optimizer)
        return logs

    def _maybe_tf_function(self, fn):
        return tf.function(fn) if self._use_tf_function and self._coordinator is None else fn

    # Evaluation hooks.

    def create_eval_loop_fn(self, has_state: bool):
        step_fn = tf.function(self.eval_step) if self._use_tf_function else self.eval_step
        host_loop = orbit.utils.create_loop_fn(step_fn)
        if has_state or not self._use_tf_while_loop:
            return host_loop
        graph_loop = tf.function(orbit.utils.create_tf_while_loop_fn(self.eval_step))

        def loop(iterator, num_steps, state=None, reduce_fn=None):
            if num_steps == -1:  # Until the eval set ends: only a host loop can stop there.
                return host_loop(iterator, num_steps, state=state, reduce_fn=reduce_fn)
            graph_loop(iterator, num_steps)
            return state

        return loop

    def eval_begin(self):
        for metric in [self.eval_loss, *self.eval_metrics]:
            metric.reset_state()
        if not self._aggregates:
            return None
        # A non-None state makes orbit call eval_reduce after each step.
        return {"task": None, "reducers": reducers.start(self.eval_reducers)}

    def next_eval_inputs(self, iterator):
        """Returns the next inputs for the model; runs inside `tf.function`."""
        return next(iterator)

    def eval_step(self, iterator):
        def step_fn(inputs):
            logs = dict(
                self.task.validation_step(inputs, model=self.model, metrics=self.eval_metrics)
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
        if self.task.aggregates_logs():
            state["task"] = self.task.aggregate_logs(state["task"], step_logs)
        state["reducers"] = reducers.accumulate(self.eval_reducers, state["reducers"], step_logs)
        return state

    def eval_end(self, aggregated_logs=None) -> Logs:
        logs = _results([self.eval_loss, *self.eval_metrics])
        if aggregated_logs is not None:
            if self.task.aggregates_logs():
                step = int(self.global_step.numpy())
                logs.update(
                    self.task.reduce_aggregated_logs(aggregated_logs["task"], global_step=step))
            logs.update(reducers.results(self.eval_reducers, aggregated_logs["reducers"]))
        return logs


def _results(metrics) -> Logs:
    logs = {}
    for metric in metrics:
        result = metric.result()
        if isinstance(result, dict):
            logs.update(result)
        else:
            logs[metric.name] = result
    return logs


def current_learning_rate(optimizer) -> tf.Tensor:
    """The learning rate the optimizer applies at its current iteration."""
    learning_rate = optimizer.learning_rate
    if callable(learning_rate):  # A tf_keras schedule; Keras 3 evaluates its own.
        learning_rate = learning_rate(optimizer.iterations)
    return tf.convert_to_tensor(learning_rate)
