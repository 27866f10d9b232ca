"""What a ctl checkpoint holds.

A ctl checkpoint is one `tf.train.Checkpoint` with these objects at its root,
under these names, so that Keras' SidecarEvaluator and Model Garden tools read
it too:

    global_step   the train step (int64 variable)
    model         the Keras model
    optimizer     its optimizer (slots, iterations)
    rng           the model's Keras 3 RNG states (seed generators), if it has any

Keras 3 keeps a `SeedGenerator`'s state (Dropout, noise layers) in a variable
that is part of the model's `variables` but not of its `weights`, and that
`tf.train.Checkpoint(model=...)` does not save; ctl adds those variables as
`rng`, so that a resumed run draws the numbers an uninterrupted one would.
tf_keras models have none (their `variables` are their `weights`).
"""

from typing import List

import tensorflow as tf


def rng_state_variables(model) -> List:
    """The model's variables that are not its weights: Keras 3 RNG states, in a stable order."""
    weights = {id(weight) for weight in getattr(model, "weights", [])}
    return [v for v in getattr(model, "variables", []) if id(v) not in weights]


def build_checkpoint(global_step: tf.Variable, model, optimizer) -> tf.train.Checkpoint:
    """The checkpoint of a run: `global_step`, `model`, `optimizer` and, if any, `rng`.

    A checkpoint written without `rng` (an older ctl) does not restore into a
    model that has RNG states.
    """
    checkpoint = tf.train.Checkpoint(global_step=global_step, model=model, optimizer=optimizer)
    states = rng_state_variables(model)
    if states:
        checkpoint.rng = states
    return checkpoint
