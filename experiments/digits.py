"""Handwritten digits (scikit-learn's bundled 8x8 set) with a small Keras 3 MLP.

The data ships inside scikit-learn, so nothing is downloaded. The 1,797 images
are split once, with a fixed seed, into 1,437 for training and 360 held out.
"""

import gin
import keras
import tensorflow as tf

import ctl

from experiments.checks import AtLeastOne, LearningRate, Seed
from experiments.digits_data import HELD_OUT_FRACTION, load_split  # noqa: F401 (re-exported)


@gin.configurable
@ctl.check_arguments
class DigitsTask(ctl.Task):
    """Classifies 8x8 digits with a `64-hidden_units-10` MLP."""

    def __init__(self, hidden_units: AtLeastOne = 128, batch_size: AtLeastOne = 64,
                 learning_rate: LearningRate = 1e-3, seed: Seed = 0):
        self.hidden_units = hidden_units
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.seed = seed

    def build_model(self):
        keras.utils.set_random_seed(self.seed)
        return keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(self.hidden_units, activation="relu"),
            keras.layers.Dense(10),
        ])

    def build_optimizer(self):
        return keras.optimizers.Adam(self.learning_rate)

    def build_inputs(self, training, input_context=None):
        images, labels = load_split(training, self.seed)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        batch_size = self.batch_size
        if input_context is not None:
            dataset = dataset.shard(input_context.num_input_pipelines,
                                    input_context.input_pipeline_id)
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        if training:
            dataset = dataset.repeat().shuffle(len(labels), seed=self.seed)
        return dataset.batch(batch_size, drop_remainder=training).prefetch(2)

    def build_losses(self, labels, outputs, aux_losses=None):
        loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True))
        if aux_losses:
            loss += tf.add_n(aux_losses)
        return loss

    def build_metrics(self, training=True):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]
