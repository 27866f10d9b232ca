"""The Task contract, checked when a run starts: a mistake is one line naming the fix.

Keras checks a `fit` input before its first step; ctl checks what a `Task`
returns once, before the first step, in three places, each as cheap as it can
be (docs/guide/writing-a-task.md lists every check and its message):

    Trainer.__init__ (eager, as the task's parts are built):
      check_model        build_model() returned a Keras model with variables
      check_optimizer    build_optimizer() returned an optimizer of the model's Keras
      check_metrics      build_metrics() returned a list of Keras metrics, names unique
      inputs(...)        every dataset build_inputs() returns, per input pipeline:
                         a tf.data.Dataset; with the default steps, (features, labels)
                         elements; every tensor batched, one batch size; not empty;
                         a train set that ends (finite or unknown length) is repeated;
                         train batches without a static size: a WARNING (a resume at
                         another size needs one, ctl.faults.run_size)
    check_run (train_lib, before the model dir is written):
      an eval set that never ends needs ctl.Schedule.eval_steps
      one trace (no step runs) of the task's train_step and validation_step on
      the datasets' element spec, each replica's: it returns {"loss": scalar},
      the train step applies gradients, and the user's code traces at all
      (a mismatch of model, data, loss or metrics fails here, not at step 1).
      Each trace is the loop's own (Trainer.trace_train_loop,
      Evaluation.trace_eval_loop: the first loop runs it, not a second trace),
      but for a loop without a tf.function, which traces a step of its own.
    check_eval (train_lib, after the first train loop of a one-process
      train_and_eval run, before its first write; else in check_run):
      the validation_step's trace.

A mistake raises `UserError` (exit 2, one line on stderr); an error raised by
the task's own code while its step is traced becomes one too, its traceback
logged on stdout. Nothing here runs a step or reads a batch.
"""

import contextlib
import traceback
from typing import Any, Callable, ContextManager, Mapping, Optional

import tensorflow as tf

from ctl.utils import console
from ctl.utils.errors import UserError, one_line, user_error_within
from ctl.core.task import Task

_INFINITE = int(tf.data.INFINITE_CARDINALITY)
_UNKNOWN = int(tf.data.UNKNOWN_CARDINALITY)


def _name(task) -> str:
    return type(task).__name__


def _default(task, method: str) -> bool:
    """Whether `task` runs the `Task` base class's `method` (and so its (features, labels) contract)."""
    return getattr(type(task), method) is getattr(Task, method)


# The parts of a task (Trainer.__init__).


def check_model(task, model) -> None:
    """Raises `UserError` unless `build_model()` returned a built Keras model.

    Args:
        task: the user's `ctl.Task`, named in the errors.
        model: what `build_model()` returned.
    """
    if not (callable(model) and hasattr(model, "trainable_variables") and hasattr(model, "losses")):
        raise UserError(f"{_name(task)}.build_model() returned {_kind(model)}; return a Keras "
                        "model (keras.Model, tf.keras or tf_keras).")
    if not model.trainable_variables:
        raise UserError(
            f"{_name(task)}.build_model() returned a model without variables; build it "
            "(e.g. start it with an Input layer).")


def check_optimizer(task, optimizer, model) -> None:
    """Raises `UserError` unless `build_optimizer()` returned an optimizer of the model's Keras.

    Args:
        task: the user's `ctl.Task`, named in the errors.
        optimizer: what `build_optimizer()` returned.
        model: the task's model.
    """
    if not hasattr(optimizer, "apply_gradients"):
        raise UserError(f"{_name(task)}.build_optimizer() returned {_kind(optimizer)}; return "
                        "an optimizer object, e.g. keras.optimizers.Adam(1e-3) (not a name).")
    if None not in (_flavour(optimizer), _flavour(model)) and _flavour(optimizer) != _flavour(model):
        raise UserError(
            f"{_name(task)}.build_optimizer() returned a {_flavour(optimizer)} optimizer "
            f"({type(optimizer).__name__}) for a {_flavour(model)} model; build both with the "
            "same Keras (keras / tf.keras, or tf_keras).")


def check_metrics(task, metrics, training: bool) -> list:
    """The task's metrics as a list, each a Keras metric, with unique names.

    Args:
        task: the user's `ctl.Task`, named in the errors.
        metrics: what `build_metrics()` returned.
        training: which call it was (`training=`), for the message.
    """
    where = f"{_name(task)}.build_metrics(training={training})"
    if metrics is None or hasattr(metrics, "update_state") or isinstance(metrics, (str, dict)):
        raise UserError(f"{where} returned {_kind(metrics)}; return a list of Keras metrics, "
                        "e.g. [keras.metrics.SparseCategoricalAccuracy('accuracy')] ([] for none).")
    metrics = list(metrics)
    names = []
    for metric in metrics:
        if not all(hasattr(metric, m) for m in ("update_state", "result", "reset_state", "name")):
            raise UserError(f"{where} returned {_kind(metric)} in its list; every entry must be "
                            "a Keras metric object, e.g. keras.metrics.Mean('my_value') "
                            "(not a name or a function).")
        names.append(metric.name)
    for name in names:
        if name == "loss" or names.count(name) > 1:
            raise UserError(f"{where} returned two results named {name!r} (ctl names the "
                            "loss 'loss'); give each metric its own name=.")
    return metrics


# The datasets (Trainer.__init__ and ctl.faults.resume, per input pipeline).


def inputs(task, training: bool, input_context: Optional[tf.distribute.InputContext] = None,
           *, announce: bool = False, **kwargs) -> tf.data.Dataset:
    """`task.build_inputs(training, input_context, **kwargs)`, checked; the train set repeated.

    A train set that ends (a finite or unknown length: a `TFRecordDataset`
    without `repeat()`) is repeated, as `fit` runs epochs; with `announce`,
    one line says how many batches a pass has, if the dataset knows.

    Args:
        task: the user's `ctl.Task`, named in the errors.
        training: True for the train set, False for an eval set.
        input_context: the input pipeline's context, or None.
        announce: say how many batches a pass of the train set has.
        **kwargs: passed on to `build_inputs` (`name=` for a named eval set).
    """
    dataset = task.build_inputs(training, input_context=input_context, **kwargs)
    where = f"{_name(task)}.build_inputs(training={training}"
    where += "".join(f", {key}={value!r}" for key, value in kwargs.items()) + ")"
    if not isinstance(dataset, tf.data.Dataset):
        raise UserError(f"{where} returned {_kind(dataset)}; return a tf.data.Dataset of "
                        "(features, labels) batches, e.g. "
                        "tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).")
    check_elements(task, dataset.element_spec, training, where)
    if announce and training and _batch_size(dataset.element_spec) is None:
        console.warning("input", "%s's train batches have no static size (batch them with "
                        "drop_remainder=True for one): a resume at another replica or worker "
                        "count cannot find its place in the data", _name(task))
    if not tf.executing_eagerly():  # Parameter servers build it inside a tf.function.
        return dataset.repeat() if training else dataset
    length = int(dataset.cardinality())
    if length == 0:
        raise UserError(f"{where} returned an empty dataset (for this input pipeline); "
                        "check the files or the filter it reads, and the shard.")
    if not training or length == _INFINITE:
        return dataset
    if announce and length != _UNKNOWN:
        per_step = 1  # This pipeline's batches in one global batch.
        if input_context is not None:
            per_step = max(1, input_context.num_replicas_in_sync
                           // input_context.num_input_pipelines)
        console.info("input", "%s's train set ends after %d batches of this input pipeline: "
                     "ctl repeats it (a pass every %d global batches), as fit runs epochs",
                     _name(task), length, max(1, length // per_step))
    return dataset.repeat()


def check_elements(task, spec, training: bool, where: str) -> None:
    """The element structure of a `build_inputs` dataset: batched; `(features, labels)` with
    the default steps.

    Args:
        task: the user's `ctl.Task`, named in the errors.
        spec: the dataset's `element_spec`.
        training: True for the train set.
        where: the dataset, as the message names it.
    """
    step = "train_step" if training else "validation_step"
    if _default(task, step) and not (isinstance(spec, tuple) and len(spec) == 2):
        raise UserError(
            f"{where} yields {_structure(spec)}; the default {step} takes (features, labels) "
            "pairs: return a dataset of (features, labels) (e.g. map(lambda e: "
            "(e['image'], e['label']))), or override train_step and validation_step.")
    sizes = set()
    for path, component in _flat_with_paths(spec):
        shape = getattr(component, "shape", None)
        if shape is None or shape.rank is None:
            continue
        if shape.rank == 0:
            raise UserError(
                f"{where} yields unbatched elements ({path} has shape (), one example); "
                "batch it: dataset.batch(per_replica_batch_size), with "
                "input_context.get_per_replica_batch_size(global_batch_size).")
        if shape[0] is not None:
            sizes.add(int(shape[0]))
    if len(sizes) > 1:
        raise UserError(f"{where} yields batches whose tensors have different batch sizes "
                        f"{sorted(sizes)} (first dimension); batch features and labels together.")


def _batch_size(spec) -> Optional[int]:
    """The static batch size of the first batched tensor of an element, or None."""
    for _, component in _flat_with_paths(spec):
        shape = getattr(component, "shape", None)
        if isinstance(shape, tf.TensorShape) and shape.rank:
            return shape[0]
    return None


# One trace of the steps (train_lib, before the first write).


def check_run(trainer, eval_steps: Optional[int], train: bool, evaluate: bool,
              trace_loop: bool = False,
              loop_context: Callable[[], ContextManager[None]] = contextlib.nullcontext,
              eval_context: Callable[[], ContextManager[None]] = contextlib.nullcontext,
              trace_eval: bool = True) -> None:
    """The eval sets' length, and one trace of the task's steps on their element spec.

    Args:
        trainer: the built Trainer.
        eval_steps: `ctl.Schedule.eval_steps` (None: whole eval sets, which must end).
        train: whether the run trains (its train step is traced).
        evaluate: whether it evaluates (its eval sets' lengths are checked, its eval step
            traced).
        trace_loop: trace the train loop's own function (`Trainer.trace_train_loop`), which
            its first call then runs.
        loop_context: what the train loop runs under (`Controller.train_loop_context`: its
            summary writer), entered for that trace.
        eval_context: what an evaluation runs under (its summaries' writer), for `check_eval`.
        trace_eval: trace the eval step here (False: the caller runs `check_eval` itself).
    """
    if isinstance(trainer.strategy, tf.distribute.ParameterServerStrategy):
        return  # Its steps and datasets live on the workers.
    task = trainer.task
    if evaluate and not eval_steps:
        for name in trainer.eval_sets:
            length = trainer.eval_set_length(name)  # As the Trainer built it, if it did.
            if length is None:
                length = int(inputs(task, False, _input_context(trainer.strategy),
                                    **({"name": name} if name is not None else {})).cardinality())
            if length == _INFINITE:
                label = f"eval set {name!r}" if name is not None else "eval set"
                raise UserError(
                    f"{_name(task)}'s {label} never ends (it repeats) and ctl.Schedule.eval_steps "
                    "is not set: an evaluation reads the eval set once; drop .repeat() from the "
                    "eval dataset, or set ctl.Schedule.eval_steps.")
    if train:
        spec = trainer.train_dataset.element_spec
        with loop_context():
            traced = trace_loop and _trace(trainer, spec, trainer.trace_train_loop, "train_step",
                                           "train set")
        if not traced:
            _trace(trainer, spec, _probe(trainer, spec, _train_probe(trainer)), "train_step",
                   "train set")
    if evaluate and trace_eval:
        check_eval(trainer, eval_steps, eval_context)


def check_eval(trainer, eval_steps: Optional[int],
               eval_context: Callable[[], ContextManager[None]] = contextlib.nullcontext) -> None:
    """One trace of the task's `validation_step` on the first eval set's element spec: the
    evaluation's own function (`Evaluation.trace_eval_loop`, which the first evaluation then
    runs), else a trace of its own. Runs no step. Safe on a thread of its own beside a train
    loop that is already traced (`ctl.train_lib` runs it on the claim's thread, once the first
    loop ended, or beside it while a lease settles).

    Args:
        trainer: the built Trainer (its train loop traced, if it trains: the model's variables
            exist).
        eval_steps: `ctl.Schedule.eval_steps` (None: whole eval sets).
        eval_context: what an evaluation runs under (the eval summaries' writer,
            `SummaryManager.tracing`: the eval step's own `tf.summary` calls write there),
            entered for the trace.
    """
    if isinstance(trainer.strategy, tf.distribute.ParameterServerStrategy) or not trainer.eval_sets:
        return
    spec = next(iter(trainer.eval_sets.values())).element_spec
    with eval_context():
        traced = _trace(trainer, spec, lambda: trainer.trace_eval_loop(eval_steps or -1),
                        "validation_step", "eval set")
    if not traced:
        _trace(trainer, spec, _probe(trainer, spec, _eval_probe(trainer)), "validation_step",
               "eval set")


def _input_context(strategy) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                      num_replicas_in_sync=strategy.num_replicas_in_sync)


def _train_probe(trainer):
    return lambda inputs: trainer.task_train_step(inputs)  # Traced; nothing runs.


def _eval_probe(trainer):
    task = trainer.task

    def replica_step(inputs):
        logs = task.validation_step(inputs, model=trainer.eval_model,
                                    metrics=trainer.eval_metrics)
        check_step_logs(task, logs, "validation_step")

    return replica_step


def say_ignored_aux(task, count: int) -> bool:
    """One line when ctl adds the model's losses to a `build_losses` that ignores them, from
    replica 0 (or a replica whose id is known only when run); returns whether it said it.

    Args:
        task: the user's `ctl.Task`, named in the line.
        count: how many losses the model has.
    """
    replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
    if replica:
        return False
    console.info("setup", "%s.build_losses ignores aux_losses: ctl adds the model's %d "
                 "regularization loss(es) to its loss, as Keras fit does", _name(task), count)
    return True


def _probe(trainer, spec, replica_step):
    """A trace of `replica_step` on every replica, on a batch of `spec`, in a function of its own."""
    strategy = trainer.strategy

    def as_iterated_step(replica_inputs):
        # A copy of the nest: a step may pop entries of its dict (Model Garden's translation
        # task does), which a traced function's own arguments do not allow. Made in the replica
        # function: under a strategy of several replicas `inputs` are per-replica values,
        # each replica's SparseTensors of its own static shape. (A def, not a lambda:
        # autograph took a lambda over two lines for another function.)
        return replica_step(tf.nest.map_structure(_as_iterated, replica_inputs))

    def step_fn(inputs):
        strategy.run(as_iterated_step, args=(inputs,))

    return lambda: tf.function(step_fn).get_concrete_function(spec)


def _trace(trainer, spec, trace, step: str, what: str):
    """`trace()`, its errors a `UserError` naming the task's `step` on the `what`'s batches."""
    try:
        return trace()
    except UserError:
        raise
    except Exception as error:  # The task's own code failed to trace.
        found = user_error_within(error)
        if found is not None:
            raise found from error
        console.info("setup", "%s.%s failed as ctl traced it:\n%s", _name(trainer.task), step,
                     traceback.format_exc())
        raise UserError(
            f"{_name(trainer.task)}.{step} fails on the {what}'s batches "
            f"({_structure(spec, shapes=True)}): {type(error).__name__}: {one_line(error, 300)} "
            "(traceback on stdout); make the model, the data, build_losses and the metrics "
            "agree.") from error


def _as_iterated(value):
    """A copy of one traced input as the train loop's iterator hands it over: a SparseTensor of
    a static shape has it as its `dense_shape` (a step may read it there: the embedding lookups
    of Model Garden's ranking models)."""
    if isinstance(value, tf.SparseTensor) and value.shape.is_fully_defined():
        return tf.SparseTensor(tf.identity(value.indices), tf.identity(value.values),
                               tf.constant(value.shape.as_list(), tf.int64))
    return tf.identity(value)


@tf.autograph.experimental.do_not_convert  # Static checks: nothing for autograph to convert.
def check_step_logs(task, logs, step: str) -> None:
    """Raises `UserError` unless a step returned a dict with a scalar float loss under `"loss"`.

    Args:
        task: the user's `ctl.Task`, named in the errors.
        logs: what the step returned.
        step: `train_step` or `validation_step`.
    """
    # An eval set without labels may have no loss (Model Garden's SQuAD evaluation).
    lossless = step == "validation_step" and isinstance(logs, Mapping)
    if not isinstance(logs, Mapping) or ("loss" not in logs and not lossless):
        raise UserError(f"{_name(task)}.{step} returned {_kind(logs)}; return a dict with the "
                        "step's scalar loss under 'loss', e.g. {'loss': loss}.")
    if "loss" not in logs:
        return
    loss = logs["loss"]
    if not tf.is_tensor(loss):
        loss = tf.convert_to_tensor(loss)
    who = f"{_name(task)}.build_losses" if _default(task, step) else f"{_name(task)}.{step}"
    if not loss.dtype.is_floating:
        raise UserError(f"{who} returned a loss of dtype {loss.dtype.name}; return a float loss.")
    if loss.shape.rank is not None and loss.shape.rank != 0:
        raise UserError(
            f"{who} returned a loss of shape {_shape(loss.shape)}, not a scalar; return the mean "
            "over this replica's batch (e.g. tf.reduce_mean(per_example_loss)): ctl neither "
            "sums nor averages it for you.")


# Descriptions for the messages.


def _flat_with_paths(spec):
    if isinstance(spec, Mapping):
        for key, value in spec.items():
            for path, leaf in _flat_with_paths(value):
                yield f"[{key!r}]{path}", leaf
    elif isinstance(spec, (tuple, list)):
        for index, value in enumerate(spec):
            for path, leaf in _flat_with_paths(value):
                yield f"[{index}]{path}", leaf
    else:
        yield "the element", spec


def _shape(shape) -> str:
    dims = [str(d) if d is not None else "None" for d in shape.as_list()]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _structure(spec, shapes: bool = False) -> str:
    """'one tensor of shape (8, 3)', 'a dict with keys image, label', 'a tuple of 3 parts'."""
    if isinstance(spec, Mapping):
        return f"a dict with keys {', '.join(map(str, spec))} (no (features, labels) pair)"
    if isinstance(spec, (tuple, list)):
        if shapes:
            return "(" + ", ".join(_structure(s, shapes) for s in spec) + ")"
        return f"a tuple of {len(spec)} parts"
    shape = getattr(spec, "shape", None)
    if not isinstance(shape, tf.TensorShape) or shape.rank is None:
        return f"one {type(spec).__name__}"
    return f"one tensor of shape {_shape(shape)}" if not shapes else _shape(shape)


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"a {type(value).__module__.split('.')[0]}.{type(value).__name__}" if not isinstance(
        value, (tuple, list, dict)) else f"a {type(value).__name__}"


def _flavour(obj) -> Optional[str]:
    """'tf_keras' or 'Keras 3' (the Keras `obj`'s class comes from), or None (neither)."""
    for cls in type(obj).__mro__:
        root = cls.__module__.split(".", 1)[0]
        if root == "tf_keras":
            return "tf_keras"
        if root == "keras":
            return "Keras 3"
    return None
