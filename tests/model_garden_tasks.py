"""A Model Garden experiment's task (`ctl.ModelGardenTask`, unchanged) that says, from inside
the graph, what each train step did: for the kill -9 tests of tests/test_model_garden_guarantees.py.

`RecordedModelGardenTask` appends `step loss` to `steps_file` after each train step, the loss as
the integer of its float32 bits (`tf.print` would round it); step `hold_at_step` first writes
`held_file` and then waits (up to 120 s) until `release_file` exists, so that a test may kill the
process there, mid-loop. `StepTrainer` gives the task the global step it counts steps by.
`HoldAfterCheckpoint` (a hook) holds the same way after a checkpoint of one model dir.
"""

import os

import gin
import tensorflow as tf

import ctl
from tests.support.processes import wait_for_file

HOLD_S = 120


@gin.configurable
class RecordedModelGardenTask(ctl.ModelGardenTask):
    """ctl.ModelGardenTask, each train step's number and loss written to `steps_file`.

    Args:
      steps_file: where each train step appends `step loss_bits`.
      hold_at_step, held_file, release_file: step `hold_at_step` writes `held_file`, then waits
        until `release_file` exists before it runs.
      inputs_file: where each train step appends `step sum_bits examples`: the float64 sum of its
        (each replica's) numeric input tensors, its bits as an int64, and the examples of its
        batch (the first numeric tensor's first dimension).
      **kwargs: ctl.ModelGardenTask's.
    """

    def __init__(self, steps_file=None, hold_at_step=None, held_file=None, release_file=None,
                 inputs_file=None, **kwargs):
        super().__init__(**kwargs)
        self.steps_file, self.hold_at_step = steps_file, hold_at_step
        self.inputs_file = inputs_file
        self.held_file, self.release_file = held_file, release_file
        self.global_step = None  # Given by StepTrainer.

    def train_step(self, inputs, model, optimizer, metrics):
        if self.global_step is None:  # Traced before StepTrainer gave it (ctl's contract check).
            return super().train_step(inputs, model, optimizer, metrics)
        step = self.global_step + 1
        hold = [] if self.hold_at_step is None else [
            tf.py_function(self._hold, [step], tf.float32)]
        with tf.control_dependencies(hold):  # The step waits for the hold.
            logs = super().train_step(inputs, model, optimizer, metrics)
        if self.steps_file:
            tf.print(step, tf.bitcast(tf.cast(logs["loss"], tf.float32), tf.int32),
                     output_stream=f"file://{self.steps_file}")
        if self.inputs_file:  # What the step read: each replica its own line.
            numbers = [tf.reduce_sum(tf.cast(t, tf.float64)) for t in tf.nest.flatten(inputs)
                       if isinstance(t, tf.Tensor) and (t.dtype.is_floating or t.dtype.is_integer)]
            total = tf.add_n(numbers) if numbers else tf.constant(0.0, tf.float64)
            batched = [t for t in tf.nest.flatten(inputs) if isinstance(t, tf.Tensor)
                       and (t.dtype.is_floating or t.dtype.is_integer) and t.shape.rank]
            examples = tf.shape(batched[0])[0] if batched else tf.constant(0)
            tf.print(step, tf.bitcast(total, tf.int64), examples,
                     output_stream=f"file://{self.inputs_file}")
        return logs

    def _hold(self, step):
        if int(step) != self.hold_at_step:
            return 0.0
        _hold(self.held_file, self.release_file, str(int(step)))
        return 0.0


def _hold(held_file, release_file, text):
    """Writes `text` to `held_file`, then waits (up to HOLD_S) until `release_file` exists."""
    with open(held_file, "w") as f:
        f.write(text)
    wait_for_file(release_file, HOLD_S, poll_s=0.02)


@gin.configurable
class HoldAfterCheckpoint(ctl.hooks.Hook):
    """After checkpoint `name` is written in a model dir named `directory_name`, writes the
    checkpoint's path to `held_file` and waits until `release_file` exists (a test kills the
    process there): for the kill -9 test of continuous fine-tuning."""

    def __init__(self, directory_name=None, name=None, held_file=None, release_file=None):
        self.directory_name, self.name = directory_name, name
        self.held_file, self.release_file = held_file, release_file

    def on_checkpoint_end(self, path):
        if (os.path.basename(self.run.directory.path.rstrip("/")) == self.directory_name
                and os.path.basename(path) == self.name):
            _hold(self.held_file, self.release_file, path)


@gin.configurable
class StepTrainer(ctl.Trainer):
    """A Trainer that gives its task its `global_step`."""

    def __init__(self, task, *args, **kwargs):
        super().__init__(task, *args, **kwargs)
        task.global_step = self.global_step


def read_input_sums(path):
    """step -> the sum of what the step read (its replicas' lines added) of an `inputs_file`."""
    import numpy as np

    sums = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    step, bits = (int(x) for x in line.split()[:2])
                    sums[step] = sums.get(step, 0.0) + float(np.array([bits], np.int64).view(np.float64)[0])
    return sums


def read_input_examples(path):
    """step -> the examples the step read (its replicas' batches added) of an `inputs_file`."""
    examples = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    step, _, count = (int(x) for x in line.split())
                    examples[step] = examples.get(step, 0) + count
    return examples


def read_losses(path):
    """The (step, loss bits) pairs of a `steps_file`, in the order written."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


@gin.configurable
class PolicyRecorder(ctl.hooks.Hook):
    """Writes `{layer name: compute dtype}` of the trained model's layers with weights to `path`
    after the first train loop: what the run's Keras policy really built."""

    def __init__(self, path=None):
        self.path = path

    def on_train_loop_end(self, logs):
        if self.path and not os.path.exists(self.path):
            import json

            with open(self.path, "w") as f:
                json.dump({layer.name: layer.compute_dtype for layer in self.run.model.layers
                           if layer.weights}, f)
