"""Tasks and Keras callbacks for the sidecar evaluator's tests (tests/tasks.py's regression)."""

import glob
import os
import time

import gin
import keras
import numpy as np
import tensorflow as tf

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
class SlowEvalCallback(keras.callbacks.Callback):
    """Makes each evaluation take at least `seconds` (an evaluator slower than its trainer)."""

    def __init__(self, seconds=1.0):
        super().__init__()
        self.seconds = seconds

    def on_test_begin(self, logs=None):
        time.sleep(self.seconds)


class RecordingCallback(keras.callbacks.Callback):
    """Records the hooks called, and the model's first weight at `on_test_begin`."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.kernels = []

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
