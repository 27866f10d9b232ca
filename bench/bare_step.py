"""The baseline of figure 5: import TensorFlow and Keras, build the bench MLP, run one step.

Prints "bare | step: 1" once the step has completed. Imports nothing of ctl,
orbit or gin; the model, data and step match `bench.workloads.BenchTask("mlp")`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import keras
import numpy as np
import tensorflow as tf


def main():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(2048, 64)).astype(np.float32)
    labels = rng.integers(0, 10, size=2048).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(64)
    model = keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function
    def step(iterator):
        features, labels = next(iterator)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, model(features, training=True), from_logits=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    loss = step(iter(data))
    print(f"bare | step: 1 | loss: {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    main()
