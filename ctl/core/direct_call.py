"""Calling a loop's `tf.function` without finding its trace again on every call.

Every call of a `tf.function` finds its trace afresh: it binds the
arguments, works out their types (an iterator's among them) and hashes them,
with the call's context, against its cache; the public call of the concrete
function it finds then binds and converts the arguments again. For a train
loop that captures a model, an optimizer and metrics, that is 0.3-0.85 ms of
host time a call here (`python -m bench.host_overhead`, its `call:` lines),
up to 4% of a 100-step loop of a small model. A loop is called over and over
with inputs of the same types, so `DirectCall` keeps the concrete function
of each kind of call and runs it on the call's flat input tensors
(`ctl.compat.flat_caller`; the public call where that entry is missing):

    loop = DirectCall(tf.function(loop_fn))
    loop(iterator, num_steps, key=dataset)   # through the tf.function; keeps its trace
    loop(iterator, num_steps, key=dataset)   # that trace, directly

A call is of a kept kind when its key is the same object (the key stands for
the iterators among the arguments: the dataset they were made from; every
iterator of one dataset has its types), its tensors have the same dtypes and
shapes, its Python numbers and strings the same values (in lists, tuples and
dicts alike), every other argument is the same object, and it is made inside
a strategy's scope or outside alike. Any other call goes through the
`tf.function`, which traces or finds the trace for it, and its kind is kept
too (the `KEPT` most recent kinds). Every call goes through the `tf.function`
while `tf.config.run_functions_eagerly(True)`.
"""

from typing import Any, Callable

import tensorflow as tf

from ctl import compat


class DirectCall:
    """`function` (a `tf.function`), called through the concrete functions of its calls."""

    KEPT = 8  # Concrete functions kept (the most recently traced or found).

    def __init__(self, function):
        self.function = function
        self._calls = {}  # signature -> call(args), oldest first.

    def __call__(self, *args, key: Any):
        """`function(*args)`; `key`: the dataset of the iterators in `args` (see the module)."""
        if tf.config.functions_run_eagerly():
            return self.function(*args)
        signature = _signature(args, key)
        call = self._calls.get(signature)
        if call is not None:
            return call(args)
        result = self.function(*args)
        if len(self._calls) >= self.KEPT:
            del self._calls[next(iter(self._calls))]
        self._calls[signature] = _direct(self.function.get_concrete_function(*args), args)
        return result


def _direct(concrete, args) -> Callable[[tuple], Any]:
    """`call(args)` that runs `concrete`: on the flat tensors of `args` if they are its inputs."""
    flat = tf.nest.flatten(args, expand_composites=True)
    inputs = concrete.inputs[:len(concrete.inputs) - len(concrete.captured_inputs)]
    call_flat = compat.flat_caller(concrete)
    if call_flat is None or len(flat) != len(inputs) or not all(
            isinstance(value, tf.Tensor) and value.dtype == placeholder.dtype
            for value, placeholder in zip(flat, inputs)):
        return lambda args: concrete(*args)  # The public call binds them again.
    return lambda args: call_flat(tf.nest.flatten(args, expand_composites=True))


def _signature(args, key) -> tuple:
    """What a concrete function traced for `args` must match (see the module)."""
    return (_Identity(key), tf.distribute.has_strategy(), *map(_describe, args))


def _describe(arg):
    if isinstance(arg, tf.Tensor):
        return arg.dtype, tuple(arg.shape)
    if isinstance(arg, _ITERATORS):
        return type(arg)  # Its dataset is the key.
    if isinstance(arg, (bool, int, float, str, type(None))):
        return type(arg), arg
    if isinstance(arg, (list, tuple)):  # A nest of iterators (one per input), say.
        return type(arg), tuple(map(_describe, arg))
    if isinstance(arg, dict):
        return type(arg), tuple((name, _describe(value)) for name, value in arg.items())
    return _Identity(arg)


_ITERATORS = (tf.data.Iterator, tf.distribute.DistributedIterator)


class _Identity:
    """Compares equal to another only if both wrap the same object."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.value is self.value

    def __hash__(self):
        return id(self.value)
