"""The default serving signature of a Keras model, for `Task.serving_signatures`.

`ctl.comforts.exporting` writes SavedModels with a task's signatures; when a task
declares none, this is what it serves: `model(inputs, training=False)` on the
model's Keras inputs.
"""

from typing import Callable, Dict

import tensorflow as tf

from ctl.utils.errors import UserError

DEFAULT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY  # "serving_default"


def default_serving_signatures(model) -> Dict[str, Callable]:
    """One `serving_default` signature from the model's Keras inputs.

    The signature takes the model's inputs as named tensors (the keys of a dict
    input, else the Input names) and returns `{"outputs": model(inputs,
    training=False)}` (or the model's own dict of outputs).

    Args:
        model: a Keras model with Keras inputs (built from `Input`s, or called once).
    """
    try:
        structure = model.input  # The nested inputs of a functional model.
    except (AttributeError, ValueError):
        inputs = getattr(model, "inputs", None)  # Keras 3 Sequential has only these.
        structure = (inputs[0] if len(inputs) == 1 else list(inputs)) if inputs else None
    if structure is None:
        raise UserError(
            f"cannot tell the serving signature of {type(model).__name__}: it has no Keras "
            "inputs; override Task.serving_signatures(model) to declare it."
        )
    flat = tf.nest.flatten(structure)
    if isinstance(structure, dict) and len(flat) == len(structure):
        names = sorted(structure)  # tf.nest flattens a dict in sorted key order.
    else:
        names = [_input_name(x, i) for i, x in enumerate(flat)]
    specs = [tf.TensorSpec(tuple(x.shape), tf.as_dtype(x.dtype), name=name)
             for x, name in zip(flat, names)]

    def serve(*features):
        outputs = model(tf.nest.pack_sequence_as(structure, list(features)), training=False)
        return outputs if isinstance(outputs, dict) else {"outputs": outputs}

    return {DEFAULT_SIGNATURE: tf.function(serve, input_signature=specs)}


def _input_name(tensor, index: int) -> str:
    name = str(getattr(tensor, "name", "") or "").split(":")[0]
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return name if name and not name.startswith("keras_tensor") else f"input_{index}"
