"""`Evaluation`: the Trainer's side of orbit's evaluator protocol (`evaluate(num_steps)`).

ctl's `Trainer` inherits it; its override points (`eval_begin`, `next_eval_inputs`, `eval_step`,
`eval_reduce`, `eval_end`) are overridden on a Trainer subclass. One evaluation (`evaluate`)
runs each eval set from its start: `eval_begin` (eager), the loop of `eval_step`s (inside
`tf.function` when it can be) to the steps asked for or the end of the set, whichever comes
first, `eval_reduce` after each step (eager, only if the task aggregates,
`ctl.core.aggregation`), then `eval_end` (eager). Metrics are read, and the extra
logs of `validation_step` gathered, across all replicas of all workers, so every worker computes
the same results over the whole eval set; the eval loss is a mean over examples.

With a seed (`ctl.FaultTolerance.seed`), an eval step that draws from TensorFlow's stateful
random ops (`stateful_random_ops`) draws the same numbers in every evaluation of a checkpoint,
in-line at any point of a run, on the sidecar after any number of evaluations, and in
`--mode=eval`: such ops keep their state in their kernels, so each evaluation runs a freshly
traced function, whose new kernels start from the op seeds the seed fixes.

The loop as pseudo-code: docs/explanation/training-loop.md.
"""

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import orbit
import tensorflow as tf

from ctl.core import contract, loops
from ctl.core.loops import plain
from ctl.core.runner import EvaluationEnd, EvaluationStopped, Logs
from ctl.utils import console

# The eval loss's mean, where the task's aggregation reports a `loss` of its own (`eval_end`).
MEAN_LOSS = "mean_loss"

# TensorFlow's random ops whose state lives in their kernel, where no checkpoint holds it (the
# ops of `tf.random.Generator` keep theirs in a variable; the stateless ones keep none).
STATEFUL_RANDOM = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "RandomGamma", "RandomPoisson",
    "RandomPoissonV2", "Multinomial", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
    "UniformCandidateSampler", "LogUniformCandidateSampler", "LearnedUnigramCandidateSampler",
    "ThreadUnsafeUnigramCandidateSampler", "FixedUnigramCandidateSampler", "AllCandidateSampler"})


def stateful_random_ops(function) -> List[str]:
    """The stateful random ops (`STATEFUL_RANDOM`) a traced function holds, sorted by name,
    those of the functions it calls (loop bodies, nested `tf.function`s) included.

    Args:
        function: a concrete function (`tf.function(...).get_concrete_function(...)`).
    """
    graph = function.graph.as_graph_def()
    ops = {node.op for node in graph.node}
    ops.update(node.op for each in graph.library.function for node in each.node_def)
    return sorted(ops & STATEFUL_RANDOM)


class Evaluation(orbit.AbstractEvaluator):
    """Evaluates what a Trainer built, every eval set in turn; the override points a subclass overrides.

    The Trainer builds what is evaluated and sets it before the first
    evaluation: `strategy`, `task`, `global_step`, `eval_model`, `ema` (or
    None), `averaged_optimizer` (or None: `Task.averaged_optimizer`),
    `eval_loss`, `eval_metrics` and `eval_sets` (`{name: distributed
    dataset}`, `{None: dataset}` for the one unnamed set). `run_seed` is the run's
    `ctl.FaultTolerance.seed` (None: unseeded; `ctl.core.build_run` sets it), with which an
    eval step that draws from stateful random ops is traced anew for each evaluation.
    """

    def __init__(self, aggregations, use_tf_function: bool, use_tf_while_loop: bool,
                 eval_stop=None, eval_callbacks: Sequence[Any] = ()):
        """Keeps the evaluation's settings; the Trainer builds what is evaluated.

        Args:
            aggregations: the task's host aggregations (`ctl.core.aggregation.of_task`).
            use_tf_function: the Trainer's setting, for its train loops as well: run each
                evaluation as a `tf.function`.
            use_tf_while_loop: the Trainer's setting: run an evaluation's steps in one
                `tf.while_loop`.
            eval_stop: the stop source that ends an evaluation before its next step
                (`evaluate` then raises `EvaluationStopped`), or None.
            eval_callbacks: the Keras callbacks every evaluation calls (`evaluate`).
        """
        self._use_tf_function = use_tf_function
        self._use_tf_while_loop = use_tf_while_loop
        self.aggregations = aggregations  # Host aggregation of eval outputs.
        self._aggregates = bool(aggregations)
        self._scalar_logs = set()  # (name, leaf index) of extra eval logs of rank 0, found tracing.
        self._log_structures: Dict[str, Any] = {}  # name -> the nest of each extra eval log.
        self._last_eval = loops.LastResults()  # For eval_end.
        self._eval_steps_read = loops.StepCount()  # The steps of the eval set in hand read so far.
        self._graph_eval_loop: Optional[Any] = None  # Built on first use.
        self._host_eval_parts: Optional[Any] = None
        self._eval_stop = eval_stop
        self._eval_callbacks = tuple(eval_callbacks)
        self.run_seed: Optional[int] = None  # The run's ctl.FaultTolerance.seed (build_run sets it).
        # The stateful random ops the eval step draws from (found on its first trace, when
        # seeded): each evaluation then runs a function traced anew. None: not looked at yet.
        self._eval_random_ops: Optional[List[str]] = None

    @property
    def eval_stop(self):
        """The stop source that ends an evaluation early (its `stop_requested` variable, its
        `requested()`), or None; fixed at construction."""
        return self._eval_stop

    def evaluate(self, num_steps: tf.Tensor) -> EvaluationEnd:
        """One evaluation of `num_steps` batches (-1: the whole eval set) of every eval set.

        Returns the logs of the one unnamed set, or `{name: logs}` for the
        named sets of `Task.eval_datasets()`, each evaluated in turn from its
        start (in-line and on the sidecar alike), as an `EvaluationEnd` that
        also says how many batches were read. A set that ends before
        `num_steps` ends its loop there, in either loop: its results are over
        the batches it had (as orbit's loops and Model Garden's trainer end
        it). A fixed number of steps
        runs as one `tf.function` call that also resets and reads the metrics
        (measured in bench/, figure 2). The Keras callbacks given at
        construction (`eval_callbacks`: `ctl.hooks.KerasCallbacks`, in-line and
        on the sidecar alike) see `on_test_begin`/`on_test_end` around each set
        and `on_test_batch_begin/end` around each step, in the host loop. The eval
        steps' own `tf.summary` calls go to the default writer of the caller
        (ctl's Controller: its eval summaries, `SummaryManager.writing()`).

        Args:
            num_steps: batches per eval set (-1: the whole set), a scalar tensor.
        """
        if not self.eval_sets:
            raise ValueError("this Trainer was built with evaluate=False: it has no eval dataset.")
        if self.ema is not None:
            self.ema.follow_weights_if_unstarted()
        self._swap_averages()  # The optimizer's averages in the model, for this evaluation only.
        try:
            if list(self.eval_sets) == [None]:
                return self.evaluate_set(self.eval_sets[None], num_steps)
            ends = {name: self.evaluate_set(dataset, num_steps)
                    for name, dataset in self.eval_sets.items()}
        finally:
            self._swap_averages()
            self._drop_drawn_functions()
        asked = [end.steps_asked for end in ends.values()]
        return EvaluationEnd(ends, steps=sum(end.steps for end in ends.values()),
                             steps_asked=None if None in asked else sum(asked))

    def _swap_averages(self) -> None:
        """Swaps `averaged_optimizer`'s averages and the model's weights (eager, in the
        strategy's cross-replica context, which the default strategy enters by a merge call)."""
        averaged = self.averaged_optimizer
        if averaged is None:
            return
        with self.strategy.scope():
            if tf.distribute.in_cross_replica_context():
                averaged.swap_weights()
            else:
                tf.distribute.get_replica_context().merge_call(
                    lambda strategy: averaged.swap_weights())

    def evaluate_set(self, dataset, num_steps: tf.Tensor) -> EvaluationEnd:
        """One evaluation of `num_steps` batches of one distributed eval `dataset`, or to its end
        if it ends first.

        Args:
            dataset: one distributed eval dataset.
            num_steps: batches to evaluate (-1: the whole set).

        Returns:
            The set's loss, metrics and aggregation results, with the batches read.
        """
        self.eval_dataset = dataset
        callbacks = self._eval_callbacks
        for callback in callbacks:
            callback.on_test_begin()
        logs, steps = self._evaluate_dataset(num_steps, callbacks)
        if self.eval_stop is not None and self.eval_stop.requested():  # Incomplete: dropped.
            raise EvaluationStopped("the evaluation was stopped before its end")
        for callback in callbacks:
            callback.on_test_end(_python_logs(logs))
        asked = int(num_steps)
        return EvaluationEnd(logs, steps=steps, steps_asked=asked if asked >= 0 else None)

    def trace_eval_loop(self, steps: int) -> bool:
        """Traces the function an evaluation of `steps` batches runs, on the first eval set,
        before its first call.

        Runs no step and reads no batch: the first `evaluate(steps)` then finds
        the function traced (called as `ctl.core.controller.Controller` does,
        under the eval summaries' writer, which the caller makes the default for
        this trace too). Returns False for an evaluation without a `tf.function`
        (`use_tf_function=False`).

        Args:
            steps: the batches each evaluation reads (-1: the whole set).

        Returns:
            Whether the evaluation's function was traced.
        """
        if not self._use_tf_function or not self.eval_sets:
            return False
        iterator = tf.nest.map_structure(iter, next(iter(self.eval_sets.values())))
        if self._runs_in_one_call(steps, self.eval_begin()):
            traced = self._eval_loop().get_concrete_function(iterator, loops.LOOP_SIZE)
        else:
            traced = self._host_parts()[0].get_concrete_function(iterator)
        self._look_for_random_ops(traced)
        loops.end_off_path(iterator)
        del iterator
        return True

    def _runs_in_one_call(self, steps: int, state) -> bool:
        """Whether an evaluation of `steps` batches runs as one `tf.function` call (metrics reset
        and read in it); else the host loop calls the eval step once per batch."""
        return state is None and steps >= 0 and self._use_tf_while_loop and not self._eval_callbacks

    def _to_look_for_random_ops(self) -> bool:
        """Whether the eval step's stateful random ops are still to be found: seeded, traced, and
        not found yet."""
        return self.run_seed is not None and self._use_tf_function and self._eval_random_ops is None

    def _look_for_random_ops(self, traced) -> None:
        """Finds, once and only in a seeded run, the stateful random ops of the eval step's
        traced function `traced`; says once that each evaluation traces it anew if it has any."""
        if not self._to_look_for_random_ops():
            return
        self._eval_random_ops = stateful_random_ops(traced)
        if self._eval_random_ops:
            console.info(
                "eval", "the eval step draws from stateful random ops (%s), whose state lives in "
                "their kernels: each evaluation traces it anew, so that every evaluation of a "
                "checkpoint draws what the seed (ctl.FaultTolerance.seed=%d) gives, wherever and "
                "whenever it runs", ", ".join(self._eval_random_ops), self.run_seed)

    def _drop_drawn_functions(self) -> None:
        """After an evaluation whose seeded eval step drew from stateful random ops: drops its
        functions, so the next evaluation traces new ones, whose kernels start from their op
        seeds. Not `tf.random.set_seed`, which would start every function's kernels over, the
        train step's too."""
        if self._eval_random_ops:
            self._graph_eval_loop = None
            self._host_eval_parts = None

    def _eval_loop(self):
        if self._graph_eval_loop is None:
            self._graph_eval_loop = self._function(self._eval_loop_with_metrics)
        return self._graph_eval_loop

    def _host_parts(self):
        """The host loop's eval step, metrics reset and metrics read, each a `tf.function`
        with `use_tf_function`."""
        if self._host_eval_parts is None:
            self._host_eval_parts = tuple(
                self._function(fn) if self._use_tf_function else fn
                for fn in (self.eval_step, self._reset_eval_metrics, self._eval_results))
        return self._host_eval_parts

    def _function(self, fn):
        """`fn` as a `tf.function`. One traced anew for each evaluation by design
        (`_drop_drawn_functions`) wraps a Python callable of its own: TensorFlow counts traces
        by a function's code and would warn of retracing after a few evaluations."""
        return tf.function(functools.partial(fn) if self._eval_random_ops else fn)

    def _evaluate_dataset(self, num_steps: tf.Tensor, batch_callbacks) -> Tuple[Logs, int]:
        """The set's results and the steps read; either loop ends at the end of the set."""
        state = self.eval_begin()
        iterator = tf.nest.map_structure(iter, self.eval_dataset)
        steps = int(num_steps)
        if self._runs_in_one_call(steps, state):
            if not (tf.is_tensor(num_steps) and num_steps.dtype == tf.int32):
                num_steps = tf.constant(steps, tf.int32)
            if self._to_look_for_random_ops():  # The trace this call runs, made before it runs.
                self._look_for_random_ops(self._eval_loop().get_concrete_function(
                    iterator, num_steps))
            try:
                self._last_eval.logs, read = self._eval_loop()(iterator, num_steps)
                read = int(read)
            except tf.errors.OutOfRangeError:
                # The set ended before `num_steps`: the call ended in the step that found no
                # batch, which updated nothing; the metrics and the count hold the steps before.
                self._last_eval.logs = self._eval_results()
                read = self._eval_steps_read.read()
        else:
            step_fn, reset, results = self._host_parts()
            if self._to_look_for_random_ops():
                self._look_for_random_ops(step_fn.get_concrete_function(iterator))
            reset()
            self._eval_steps_read.variable.assign(0)
            # orbit's host loop ends at the end of the set (on its OutOfRangeError) as well.
            loop = orbit.utils.create_loop_fn(loops.stoppable(self._eval_steps_read.counted(
                loops.with_batch_callbacks(step_fn, batch_callbacks)), self.eval_stop))
            state = loop(iterator, steps, state=state,
                         reduce_fn=self.eval_reduce if state is not None else None)
            self._last_eval.logs = results()
            read = self._eval_steps_read.read()
        loops.end_off_path(iterator)
        del iterator
        return (self.eval_end(state) if state is not None else self.eval_end()), read

    def _eval_loop_with_metrics(self, iterator, num_steps):
        self._reset_eval_metrics()
        end = loops.graph_eval_loop(self.eval_step, self.eval_stop, self._eval_steps_read)(
            iterator, num_steps)
        return self._eval_results(), end

    @plain
    def _reset_eval_metrics(self) -> None:
        for metric in [self.eval_loss, *self.eval_metrics]:
            metric.reset_state()

    @plain
    def _eval_results(self) -> Logs:
        return loops.metric_results([self.eval_loss, *self.eval_metrics])

    def eval_begin(self):
        """Returns the state `eval_reduce` accumulates, or None (eager)."""
        if not self._aggregates:
            return None
        # A non-None state makes the loop call eval_reduce after each step.
        return [each.start() for each in self.aggregations]

    # Two override points of one shape, this and `Trainer.next_train_inputs`: a subclass changes
    # what one side reads (train-time augmentation, an eval-only feature) without the other.
    @plain
    def next_eval_inputs(self, iterator):
        """Returns the next inputs for the model; runs inside `tf.function`.

        Args:
            iterator: the distributed eval iterator.

        Returns:
            The next element, `(features, labels)`.
        """
        return next(iterator)

    def eval_step(self, iterator):
        """One eval step on every replica (inside `tf.function`); returns the extra entries to aggregate, gathered over
        the replicas.

        Args:
            iterator: the distributed eval iterator.
        """
        def step_fn(inputs):
            # Every op of the step waits for the inputs: the step after the last batch ends
            # at the end of the eval set, before an update that reads no input (a static
            # batch size's example count, a metric of constants) could run. A composite
            # input (a SparseTensor) by its component tensors.
            with tf.control_dependencies(tf.nest.flatten(inputs, expand_composites=True)):
                return replica_step(inputs)

        def replica_step(inputs):
            logs = self.task.validation_step(inputs, model=self.eval_model, metrics=self.eval_metrics)
            contract.check_step_logs(self.task, logs, "validation_step")  # As it is traced.
            logs = dict(logs)
            # Weigh each batch by its size, so that the remainder batch (and the
            # empty batch a replica gets when the eval set runs out) count right.
            examples = tf.shape(tf.nest.flatten(inputs)[0])[0]
            loss = logs.pop("loss", None)  # None: an eval set without labels (no 'loss' result).
            if loss is not None:
                loss = tf.where(examples > 0, loss, tf.zeros_like(loss))
                self.eval_loss.update_state(loss, sample_weight=tf.cast(examples, loss.dtype))
            if not self._aggregates:
                return {}
            # Each entry may be a nested structure (Model Garden's detection tasks log a
            # `(groundtruths, outputs)` pair of dicts): its leaves are gathered one by one.
            sized = {}
            for name, value in logs.items():
                self._log_structures[name] = tf.nest.map_structure(lambda _: None, value)
                sized[name] = [self._with_size((name, index), leaf)
                               for index, leaf in enumerate(tf.nest.flatten(value))]
            return sized

        outputs = self.strategy.run(step_fn, args=(self.next_eval_inputs(iterator),))
        # Concatenated over all replicas of all workers, with each replica's size.
        return tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), outputs)

    @plain
    def _with_size(self, leaf, value):
        value = tf.convert_to_tensor(value)
        if value.shape.rank == 0:
            self._scalar_logs.add(leaf)
            value = value[tf.newaxis]
        return value, tf.shape(value)[:1]

    def eval_reduce(self, state=None, step_outputs=None):
        """Folds one step's gathered outputs into each aggregation's state (eager, on the host).

        Args:
            state: one state per aggregation, or None when the task aggregates nothing.
            step_outputs: `eval_step`'s outputs: each entry's values over all replicas, with each replica's size.
        """
        if state is None:  # The task aggregates nothing.
            return None
        step_logs = {}
        for name, leaves in step_outputs.items():
            per_leaf = []  # [leaf][replica]
            for index, (values, sizes) in enumerate(leaves):
                per_replica = np.split(values.numpy(), np.cumsum(sizes.numpy())[:-1])
                if (name, index) in self._scalar_logs:
                    per_replica = [value[0] for value in per_replica]
                per_leaf.append(per_replica)
            structure = self._log_structures[name]
            step_logs[name] = [tf.nest.pack_sequence_as(structure, list(replica))
                               for replica in zip(*per_leaf)]
        return [each.update(s, step_logs) for each, s in zip(self.aggregations, state)]

    def eval_end(self, aggregated_logs=None) -> Logs:
        """The eval loss and metrics, and the results of the task's aggregations.

        A result of the task's aggregations named `loss` (the task's own loss, as Model
        Garden's `mock` reduces it) is the results' `loss`; the eval loss's mean is then
        `mean_loss` (`MEAN_LOSS`).

        Args:
            aggregated_logs: the aggregations' states after the last step (None: none).
        """
        logs = dict(self._last_eval.logs)
        if not int(self.eval_loss.count.numpy()):  # The steps reported no loss.
            logs.pop(self.eval_loss.name, None)
        if aggregated_logs is not None:
            step = int(self.global_step.numpy())
            own: Logs = {}
            for each, state in zip(self.aggregations, aggregated_logs):
                own.update(each.results(state, step))
            if self.eval_loss.name in own and self.eval_loss.name in logs:
                # The task's own `loss` takes the name; the mean stays, under another.
                logs[MEAN_LOSS] = logs[self.eval_loss.name]
            logs.update(own)
        return logs


def model_garden_names(logs: Logs) -> Logs:
    """An evaluation's results under the names Model Garden's trainer gives them: the eval loss's
    mean is its `validation_loss`; every other result keeps the name its task gave it (a task's
    own `loss`, from its aggregation, stays `loss`), and wins over the mean's.

    Args:
        logs: the results of `eval_end` (named eval sets nested: their names are kept).
    """
    logs = dict(logs)
    mean = logs.pop(MEAN_LOSS if MEAN_LOSS in logs else "loss", None)
    return {**({} if mean is None else {"validation_loss": mean}), **logs}


def _python_logs(logs) -> Logs:
    """`logs` as Keras callbacks take them: Python numbers (lists for non-scalars)."""
    values: Dict[str, Any] = {}
    for name, value in logs.items():
        array = np.asarray(value)
        values[name] = array.item() if array.ndim == 0 else array.tolist()
    return values
