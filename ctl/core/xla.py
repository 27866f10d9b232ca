"""XLA for the train step: `ctl.Trainer.jit_compile = True`.

Each replica's train step (the task's `train_step`: forward, backward,
metrics) runs as `tf.function(jit_compile=True)`, as Keras `fit` compiles its
step; `strategy.run` calls it. The gradient update after it
(`ctl.core.train_step`) is not compiled: it synchronizes the replicas, which
TensorFlow's MirroredStrategy compiles only when every device is a GPU.

An op that XLA cannot compile (a `tf.numpy_function`, a string op, `tf.print`)
shows up when the step first runs, as does a variable created outside the
strategy's scope that a replica on another device reads; `explain` turns
TensorFlow's error into a `UserError` naming the op or the variable, and the
fix.
"""

import re
from typing import Callable, Optional

import tensorflow as tf

from ctl.utils.errors import UserError

_UNSUPPORTED = re.compile(
    r"Detected unsupported operations when trying to compile graph .*? on (\S+?): (.*?)"
    r" \(No registered '([^']+)' OpKernel", re.S)


_OTHER_DEVICE = re.compile(
    r"Trying to access resource (\S+) (?:\(defined @ ([^)]*)\) )?located in device (\S+) "
    r"from device (\S+)")


def validate(jit_compile) -> None:
    """Raises `UserError` unless `jit_compile` is True or False.

    Args:
        jit_compile: `ctl.Trainer.jit_compile`.
    """
    if not isinstance(jit_compile, bool):
        raise UserError(f"ctl.Trainer.jit_compile ({jit_compile!r}) must be True or False.")


def compile_if(jit_compile: bool, fn: Callable) -> Callable:
    """`fn` as an XLA-compiled `tf.function` if `jit_compile`, else `fn` itself.

    Args:
        jit_compile: whether to compile.
        fn: the replica step.
    """
    return tf.function(fn, jit_compile=True) if jit_compile else fn


def explain(error: Exception, task_name: str) -> Optional[UserError]:
    """A `UserError` for an op XLA cannot compile in the task's step, or None if it is not that.

    Args:
        error: the error the train loop raised.
        task_name: the task's class name, for the message.
    """
    if not isinstance(error, (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)):
        return None
    match = _OTHER_DEVICE.search(str(error))
    if match is not None:
        name, defined, home, device = match.groups()
        return UserError(
            f"ctl.Trainer.jit_compile=True: {task_name}.train_step reads variable {name!r}"
            f"{f' (created at {defined})' if defined else ''}, which lives on {home}, from a "
            f"replica on {device}: an XLA-compiled step reads only its replica's variables; "
            "create it inside the strategy's scope (e.g. in build_model) or set "
            "ctl.Trainer.jit_compile=False.")
    match = _UNSUPPORTED.search(str(error))
    if match is None:
        return None
    device, op, kernel = match.groups()
    return UserError(
        f"ctl.Trainer.jit_compile=True: XLA cannot compile {task_name}.train_step: its op "
        f"{op.split()[0]!r} ({kernel}) has no XLA kernel on {device}; move it out of the train "
        "step (e.g. into the input pipeline) or set ctl.Trainer.jit_compile=False.")
