"""Tasks and Keras callbacks for the sidecar evaluator's tests (tests/tasks.py's regression)."""

import glob
import os
import time

import gin
import keras
import numpy as np
import tensorflow as tf

from tests.support.processes import wait_for_file
from tests.tasks import RegressionTask, regression_data


@gin.configurable
class SlowRegressionTask(RegressionTask):
    """RegressionTask whose train step waits `delay` seconds: a trainer that takes long
    enough for an evaluator to run beside it. (The wait is in the step, not in tf.data:
    a Python function in an input pipeline can hang the process at exit.)"""

    def __init__(self, delay=0.05, **kwargs):
        super().__init__(**kwargs)
        self.delay = delay

    def train_step(self, inputs, model, optimizer, metrics):
        tf.numpy_function(lambda: np.float32(time.sleep(self.delay) or 0), [], tf.float32,
                          stateful=True)
        return super().train_step(inputs, model, optimizer, metrics)


@gin.configurable
class TwoEvalSetsTask(RegressionTask):
    """Offers two named eval sets of different sizes."""

    SIZES = {"near": 6, "far": 10}

    def eval_datasets(self):
        return tuple(self.SIZES)

    def build_inputs(self, training, input_context=None, name="near"):
        if training:
            return super().build_inputs(training, input_context)
        features, targets = regression_data(self.SIZES[name], seed=7)
        if name == "far":
            features = features * 3.0
            targets = targets * 3.0
        return tf.data.Dataset.from_tensor_slices((features, targets)).batch(4)


@gin.configurable
class GatedRegressionTask(RegressionTask):
    """RegressionTask whose train steps `gated_steps` each wait for a file
    `<gate_dir>/train-<step>`: a test decides when the trainer goes on."""

    def __init__(self, gate_dir=None, gated_steps=(), **kwargs):
        super().__init__(**kwargs)
        self.gate_dir = gate_dir
        self.gated_steps = tuple(gated_steps)

    def train_step(self, inputs, model, optimizer, metrics):
        step = tf.cast(optimizer.iterations, tf.int64) + 1
        go = tf.ensure_shape(tf.py_function(self._gate, [step], tf.float32), [])
        features, labels = inputs
        # The step's inputs wait for the gate: the step, and the loop, end after it.
        return super().train_step((features * go, labels), model, optimizer, metrics)

    def _gate(self, step):
        if int(step) in self.gated_steps:
            wait_for_file(os.path.join(self.gate_dir, f"train-{int(step)}"))
        return tf.constant(1.0)


@gin.configurable
class GateCallback(keras.callbacks.Callback):
    """Evaluation number k (from 1) of those in `gated` writes `<gate_dir>/eval-k.started`
    once its checkpoint is restored, then waits for `<gate_dir>/eval-k`."""

    def __init__(self, gate_dir=None, gated=()):
        super().__init__()
        self.gate_dir = gate_dir
        self.gated = tuple(gated)
        self.count = 0

    def on_test_begin(self, logs=None):
        self.count += 1
        if self.count in self.gated:
            name = os.path.join(self.gate_dir, f"eval-{self.count}")
            open(name + ".started", "w").close()
            wait_for_file(name)


class RecordingCallback(keras.callbacks.Callback):
    """Records the methods called (an epoch's logs by their `val_` names: a sidecar trains
    nothing), and the model's first weight at `on_test_begin`."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.kernels = []

    def on_train_begin(self, logs=None):
        self.calls.append("train_begin")

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(f"epoch_end:{epoch}:{sorted(k for k in logs if k.startswith('val_'))}")

    def on_train_end(self, logs=None):
        self.calls.append("train_end")

    def on_test_begin(self, logs=None):
        self.calls.append("begin")
        self.kernels.append(np.array(self.model.trainable_variables[0]).ravel().copy())

    def on_test_batch_begin(self, batch, logs=None):
        self.calls.append(f"batch_begin:{batch}")

    def on_test_batch_end(self, batch, logs=None):
        self.calls.append(f"batch_end:{batch}")

    def on_test_end(self, logs=None):
        self.calls.append(f"end:{sorted(logs)}")


class DeleteOnFirstEvaluation(keras.callbacks.Callback):
    """During the first evaluation's first batch, deletes the files of the given checkpoints."""

    def __init__(self, model_dir, numbers):
        super().__init__()
        self.model_dir = model_dir
        self.numbers = numbers
        self.done = False

    def on_test_batch_begin(self, batch, logs=None):
        if self.done:
            return
        self.done = True
        for number in self.numbers:
            for path in glob.glob(os.path.join(self.model_dir, f"ckpt-{number}.*")):
                os.remove(path)


class RandomDraw(keras.metrics.Mean):
    """The mean of a draw of TensorFlow's stateful random ops per batch: what an eval step
    that samples (a generator, dropout left on) reports."""

    def __init__(self):
        super().__init__(name="draw")

    def update_state(self, labels, outputs, sample_weight=None):
        return super().update_state(tf.random.uniform([]))


@gin.configurable
class RandomEvalTask(RegressionTask):
    """RegressionTask whose evaluation reports a random draw (`RandomDraw`)."""

    def build_metrics(self, training=True):
        return super().build_metrics(training) + ([] if training else [RandomDraw()])
