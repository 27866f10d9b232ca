"""The benchmark workloads, as ctl Tasks with synthetic in-memory data.

- `mlp`: a 64-128-10 MLP on batches of 64, the size of the digits example: a
  step takes well under a millisecond on a CPU, so loop overhead dominates.
- `cnn`: two 3x3 convolutions (16, 32 filters) and a dense layer on 28x28
  images in batches of 32: compute dominates.
- `wide`: a 64-2048-2048-10 MLP (4.3 M parameters; with Adam's slots a 52 MB
  checkpoint), for the checkpoint stall.

Every variant of a comparison builds its model, optimizer and dataset from the
same Task, so they do the same work per step.
"""

import gin
import keras
import numpy as np
import tensorflow as tf

import ctl
from experiments.digits import DigitsTask, load_split

EXAMPLES = 2048


@gin.configurable
class BenchTask(ctl.Task):
    """A classifier on random data; `workload` is one of mlp, cnn, wide."""

    def __init__(self, workload: str = "mlp", seed: int = 0):
        if workload not in SHAPES:
            raise ValueError(f"workload={workload!r}; expected one of {sorted(SHAPES)}")
        self.workload = workload
        self.seed = seed
        self.batch_size = SHAPES[workload]["batch_size"]

    def build_model(self):
        keras.utils.set_random_seed(self.seed)
        return SHAPES[self.workload]["model"]()

    def build_optimizer(self):
        return keras.optimizers.Adam(1e-3)

    def build_inputs(self, training, input_context=None):
        """Repeats in training and evaluation: evaluations run a fixed number of steps."""
        return dataset(self.workload, training, self.seed)

    def build_losses(self, labels, outputs, aux_losses=None):
        return tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True))

    def build_metrics(self, training=True):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]


def dataset(workload: str, training: bool, seed: int = 0) -> tf.data.Dataset:
    shape = SHAPES[workload]
    rng = np.random.default_rng(seed + (0 if training else 1))
    features = rng.normal(size=(EXAMPLES, *shape["input"])).astype(np.float32)
    labels = rng.integers(0, 10, size=EXAMPLES).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((features, labels)).repeat()
    return data.batch(shape["batch_size"], drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _mlp():
    return keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])


def _wide():
    return keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(10)])


def _cnn():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])


SHAPES = {
    "mlp": {"input": (64,), "batch_size": 64, "model": _mlp},
    "cnn": {"input": (28, 28, 1), "batch_size": 32, "model": _cnn},
    "wide": {"input": (64,), "batch_size": 64, "model": _wide},
}


@gin.configurable
class SlowMapDigits(ctl.Task):
    """The digits MLP on a train pipeline whose `map` costs about 1 ms per example.

    The map stands for decoding and augmenting: `matmuls` products of a
    128x128 matrix per example, pure TensorFlow (so the iterator's state can
    be saved); `bench.resume_cost` reports what it measures per example.
    """

    def __init__(self, matmuls: int = 8, batch_size: int = 64, seed: int = 0):
        self.digits = DigitsTask(batch_size=batch_size, seed=seed)
        self.matmuls = matmuls
        self.batch_size = batch_size
        self.seed = seed

    def build_model(self):
        return self.digits.build_model()

    def build_optimizer(self):
        return self.digits.build_optimizer()

    def build_losses(self, labels, outputs, aux_losses=None):
        return self.digits.build_losses(labels, outputs, aux_losses)

    def build_metrics(self, training=True):
        return self.digits.build_metrics(training)

    def build_inputs(self, training, input_context=None):
        if not training:
            return self.digits.build_inputs(training, input_context)
        images, labels = load_split(True, self.seed)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
        dataset = dataset.shuffle(len(labels), seed=self.seed)
        dataset = dataset.map(self.expensive, num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.batch(self.batch_size, drop_remainder=True).prefetch(2)

    def expensive(self, image, label):
        """`image` after `matmuls` 128x128 products that leave it unchanged."""
        square = tf.eye(128) + tf.reshape(tf.tile(image, [256]), (128, 128)) * 1e-6
        product = square
        for _ in range(self.matmuls):
            product = tf.matmul(product, square) / tf.reduce_max(product)
        return image + 0.0 * tf.reduce_sum(product[:1, :1]), label
