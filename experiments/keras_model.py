"""What a `model.fit` user already has: a function returning a compiled model, and the data.

Used by configs/keras_model.gin through `ctl.KerasModelTask`; the model
function's arguments are checked as every shipped experiment's are
(`ctl.check_arguments`), the one use of ctl here. The data is scikit-learn's
bundled digits (experiments/digits.py).
"""

from typing import Annotated

import gin
import keras

import ctl
from experiments import digits
from experiments.checks import AtLeastOne, Seed


@gin.configurable
@ctl.check_arguments
def compiled_mlp(hidden_units: AtLeastOne = 128,
                 learning_rate: Annotated[float, ctl.Range(above=0)] = 1e-3, seed: Seed = 0):
    """A compiled Keras 3 MLP, exactly as one would pass it to `fit`."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(hidden_units, activation="relu",
                           kernel_regularizer=keras.regularizers.L2(1e-5)),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


@gin.configurable
def digits_train():
    """fit's `(x, y)`."""
    return digits.load_split(training=True)


@gin.configurable
def digits_validation():
    """fit's `validation_data`."""
    return digits.load_split(training=False)
