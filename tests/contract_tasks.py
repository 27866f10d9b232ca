"""Tasks with one common mistake each (tests/test_task_contract.py), and regularized tasks.

Each mistake is a small change to `RegressionTask` (tests/tasks.py), as a user
would make it; gin-registered so that the CLI tests can name them.
"""

import gin
import keras
import numpy as np
import tensorflow as tf
import tf_keras

from tests.tasks import RegressionTask, regression_data


def _batched(training, input_context, batch_size, count=64):
    features, targets = regression_data(count)
    dataset = tf.data.Dataset.from_tensor_slices((features, targets))
    if input_context is not None:
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    return dataset, batch_size


# The data.


@gin.configurable
class NoLabelsTask(RegressionTask):
    """Yields the features only."""

    def build_inputs(self, training, input_context=None):
        return super().build_inputs(training, input_context).map(lambda x, y: x)


@gin.configurable
class DictElementsTask(RegressionTask):
    """Yields `{'x': ..., 'y': ...}` dicts (a TFRecord parse result) to the default steps."""

    def build_inputs(self, training, input_context=None):
        return super().build_inputs(training, input_context).map(lambda x, y: {"x": x, "y": y})


@gin.configurable
class WeightsTask(RegressionTask):
    """Yields `(features, labels, sample_weights)`, as `fit` takes them."""

    def build_inputs(self, training, input_context=None):
        return super().build_inputs(training, input_context).map(
            lambda x, y: (x, y, tf.ones_like(y)))


@gin.configurable
class UnbatchedTask(RegressionTask):
    """Forgets `.batch()`."""

    def build_inputs(self, training, input_context=None):
        dataset, _ = _batched(training, input_context, self.batch_size)
        return dataset.map(lambda x, y: (x, y[0])).repeat()


@gin.configurable
class MismatchedBatchesTask(RegressionTask):
    """Batches features by 8 and labels by 4 (zipped apart)."""

    def build_inputs(self, training, input_context=None):
        features, targets = regression_data(64)
        dataset = tf.data.Dataset.zip(
            (tf.data.Dataset.from_tensor_slices(features).batch(8, drop_remainder=True),
             tf.data.Dataset.from_tensor_slices(targets).batch(4, drop_remainder=True)))
        return dataset.repeat() if training else dataset


@gin.configurable
class ArraysTask(RegressionTask):
    """Returns fit's `(x, y)` arrays instead of a dataset."""

    def build_inputs(self, training, input_context=None):
        return regression_data(64)


@gin.configurable
class EmptyTrainSetTask(RegressionTask):
    """Reads no example (an empty shard, a wrong file pattern)."""

    def build_inputs(self, training, input_context=None):
        return super().build_inputs(training, input_context).take(0)


@gin.configurable
class RepeatedEvalSetTask(RegressionTask):
    """Copies the train pipeline for the eval set: it never ends."""

    def build_inputs(self, training, input_context=None):
        return super().build_inputs(True, input_context)


@gin.configurable
class FiniteTrainSetTask(RegressionTask):
    """Forgets `.repeat()` on the train set: 64 examples, 8 batches of 8."""

    def build_inputs(self, training, input_context=None):
        dataset, batch_size = _batched(training, input_context, self.batch_size)
        return dataset.batch(batch_size, drop_remainder=True)


@gin.configurable
class UnknownLengthTrainSetTask(RegressionTask):
    """A train set of unknown length that ends (like a TFRecordDataset without repeat)."""

    def build_inputs(self, training, input_context=None):
        dataset, batch_size = _batched(training, input_context, self.batch_size)
        return dataset.filter(lambda x, y: True).batch(batch_size, drop_remainder=True)


# The loss and the steps.


@gin.configurable
class VectorLossTask(RegressionTask):
    """Returns the per-example loss."""

    def build_losses(self, labels, outputs, aux_losses=None):
        return tf.reduce_mean(tf.square(labels - outputs), axis=-1)


@gin.configurable
class TensorLogsTask(RegressionTask):
    """Its own train_step returns the loss tensor, not a dict."""

    def train_step(self, inputs, model, optimizer, metrics):
        return super().train_step(inputs, model, optimizer, metrics)["loss"]


@gin.configurable
class NoUpdateTask(RegressionTask):
    """Its own train_step computes gradients but never applies them."""

    def train_step(self, inputs, model, optimizer, metrics):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = self.build_losses(labels, model(features, training=True))
        tape.gradient(loss, model.trainable_variables)
        return {"loss": loss}


@gin.configurable
class MisshapenModelTask(RegressionTask):
    """Its model takes 5 features; the data has 3."""

    def build_model(self):
        return self.k.Sequential([self.k.Input((5,)), self.k.layers.Dense(1)])


# The parts.


@gin.configurable
class OneMetricTask(RegressionTask):
    """Returns one metric, not a list."""

    def build_metrics(self, training=True):
        return self.k.metrics.MeanAbsoluteError("mae")


@gin.configurable
class MetricNamesTask(RegressionTask):
    """Returns metric names, as `compile(metrics=[...])` takes them."""

    def build_metrics(self, training=True):
        return ["mae"]


@gin.configurable
class SameNameMetricsTask(RegressionTask):
    """Two metrics under one name: one result would hide the other."""

    def build_metrics(self, training=True):
        return [self.k.metrics.MeanAbsoluteError("error"), self.k.metrics.MeanSquaredError("error")]


@gin.configurable
class OptimizerNameTask(RegressionTask):
    """Returns an optimizer's name, as `compile(optimizer='sgd')` takes it."""

    def build_optimizer(self):
        return "sgd"


@gin.configurable
class MixedKerasTask(RegressionTask):
    """A Keras 3 model with a tf_keras optimizer."""

    def build_optimizer(self):
        return tf_keras.optimizers.SGD(0.1)


@gin.configurable
class ModelFunctionTask(RegressionTask):
    """Returns the function that builds the model, not the model."""

    def build_model(self):
        return super().build_model


# Regularization: who adds the model's losses.


class RegularizedTask(RegressionTask):
    """A Dense layer with a large L2 penalty, from known weights; `adds_aux`: its
    build_losses adds `aux_losses` itself (Model Garden's way), else ignores them."""

    L2 = 10.0
    KERNEL = 0.3

    def __init__(self, flavor="keras3", adds_aux=False, learning_rate=0.0, **kwargs):
        super().__init__(flavor=flavor, learning_rate=learning_rate, **kwargs)
        self.adds_aux = adds_aux

    def build_model(self):
        return self.k.Sequential([self.k.Input((3,)), self.k.layers.Dense(
            1, kernel_initializer=self.k.initializers.Constant(self.KERNEL),
            kernel_regularizer=self.k.regularizers.L2(self.L2))])

    def build_losses(self, labels, outputs, aux_losses=None):
        loss = tf.reduce_mean(tf.square(labels - outputs))
        if self.adds_aux and aux_losses:
            loss += tf.add_n(aux_losses)
        return loss

    def expected_loss(self, features, targets, kernel, bias):
        """The data loss over these examples plus the L2 penalty, in NumPy."""
        predictions = features @ kernel + bias
        return float(np.mean((targets - predictions) ** 2) + self.L2 * np.sum(kernel ** 2))



# Plain functions (no gin decorator), as a fit user has them: ctl.KerasModelTask takes them by path.


def plain_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, kernel_regularizer=keras.regularizers.L2(0.01))])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def plain_train_data():
    return regression_data(64)


def plain_eval_data():
    return regression_data(20, seed=1)


@gin.configurable
class SparseFeaturesTask(RegressionTask):
    """Its features are a SparseTensor, densified to the static shape its `dense_shape` gives
    (as the embedding lookups of Model Garden's ranking models read it)."""

    def build_inputs(self, training, input_context=None):
        return super().build_inputs(training, input_context).map(
            lambda x, y: (tf.sparse.from_dense(x), y))

    def train_step(self, inputs, model, optimizer, metrics):
        features, labels = inputs
        dense = tf.sparse.to_dense(features)  # Of unknown width if its dense_shape is unknown.
        dense = tf.reshape(dense, [-1, dense.shape[-1]])
        return super().train_step((dense, labels), model, optimizer, metrics)

    def validation_step(self, inputs, model, metrics):
        features, labels = inputs
        return super().validation_step((tf.sparse.to_dense(features), labels), model, metrics)


@gin.configurable
class DynamicBatchTask(RegressionTask):
    """Keeps the remainder batch of each pass of its train set: no static batch size."""

    def build_inputs(self, training, input_context=None):
        dataset, batch_size = _batched(training, input_context, self.batch_size, count=60)
        return dataset.batch(batch_size).repeat()
