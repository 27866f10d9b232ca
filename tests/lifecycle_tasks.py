"""A task whose steps take real time, for tests of a run's life (stop, resume, end).

`PacedTask` is `ProbeTask` (each train step it starts is written to
`progress_file`) with a pause in every train and eval step, so that a signal
sent from outside lands where the test means it to: between two steps of a
stretch, or inside the final evaluation. Each eval step it starts appends
`eval` to `progress_file`.
"""

import atexit
import time

import gin
import tensorflow as tf

import ctl

from tests.fault_tasks import ProbeTask


def _pause(seconds):
    def sleep():
        time.sleep(seconds)
        return 0
    return tf.py_function(sleep, [], tf.int32)


@gin.configurable
class PacedTask(ProbeTask):
    """ProbeTask with `train_seconds` per train step and `eval_seconds` per eval batch."""

    def __init__(self, train_seconds=0.0, eval_seconds=0.0, **kwargs):
        super().__init__(**kwargs)
        self.train_seconds = train_seconds
        self.eval_seconds = eval_seconds

    def train_step(self, inputs, model, optimizer, metrics):
        if self.train_seconds:
            with tf.control_dependencies([_pause(self.train_seconds)]):
                inputs = tf.nest.map_structure(tf.identity, inputs)
        return super().train_step(inputs, model, optimizer, metrics)

    def validation_step(self, inputs, model, metrics):
        if self.progress_file:
            tf.print("eval", output_stream=f"file://{self.progress_file}")
        if self.eval_seconds:
            with tf.control_dependencies([_pause(self.eval_seconds)]):
                inputs = tf.nest.map_structure(tf.identity, inputs)
        return super().validation_step(inputs, model, metrics)


@gin.configurable
class CarelessHook(ctl.hooks.Hook):
    """Leaves its writes to the process's end: at the run's end it writes `path` through a
    file it never closes (a Python file; a `tf.io.gfile.GFile` in an object store, `gs://`),
    and registers an exit handler that writes `path`.atexit."""

    def __init__(self, path):
        self.path = path
        self.file = None

    def on_trial_close(self, unused_logs):
        self.file = tf.io.gfile.GFile(self.path, "w") if "://" in self.path else open(self.path, "w")
        self.file.write("written, never closed\n")
        atexit.register(self._at_exit)

    def _at_exit(self):
        with tf.io.gfile.GFile(self.path + ".atexit", "w") as f:
            f.write("ran\n")
