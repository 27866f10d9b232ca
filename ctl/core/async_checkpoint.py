"""Asynchronous checkpoints for Keras 3 models (`ctl.Schedule.async_checkpointing`).

TensorFlow writes a checkpoint asynchronously (`tf.train.CheckpointOptions(
enable_async=True)`, which orbit's Controller passes to the manager) by first
copying every variable to a CPU twin inside one `tf.function`, then writing the
twins on a background thread. The `checkpoint` state file is updated by a
callback once the write has finished, so a checkpoint is never visible half
written.

Keras 3 (checked on 3.15) breaks the second save: its `Variable` makes a fresh
`tf.Variable` twin on every copy, and a `tf.function` may create variables on
its first call only ("tf.function only supports singleton tf.Variables"). Its
underlying `tf.Variable` already keeps a CPU twin that each copy refreshes, and
both serialize to the same `VARIABLE_VALUE` tensor, so `enable()` makes the
Keras variable reuse that twin. The checkpoints hold the same values as
synchronous ones (tested in `tests/test_async_checkpoint.py`).

`enable()` is called by `ctl.train_lib` when async checkpointing is on; it
changes nothing for synchronous saves, and nothing if Keras fixes the bug
upstream in a different way (it only replaces the method it knows).
"""

_patched = False


def enable() -> None:
    """Lets Keras 3 variables take part in repeated async checkpoint saves."""
    global _patched
    if _patched:
        return
    try:
        from keras.src.backend.tensorflow.core import Variable
    except ImportError:  # No Keras 3 with the TensorFlow backend: nothing to fix.
        _patched = True
        return
    if getattr(Variable._copy_trackable_to_cpu, "__qualname__", "") == (
        "Variable._copy_trackable_to_cpu"
    ):
        Variable._copy_trackable_to_cpu = _copy_trackable_to_cpu
    _patched = True


def _copy_trackable_to_cpu(self, object_map):
    """Refreshes the CPU twin of the underlying `tf.Variable` and shares it."""
    self.value._copy_trackable_to_cpu(object_map)
    object_map[self] = object_map[self.value]
