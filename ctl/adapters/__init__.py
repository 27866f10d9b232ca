"""Adapters: what users already have, run under ctl unchanged.

`keras_model` trains a compiled Keras model (`ctl.KerasModelTask`);
`model_garden` runs a registered Model Garden experiment (`ctl.ModelGardenTask`).
Each is a `ctl.Task`; nothing here knows the loop. Nothing is re-exported
here: the public API is `ctl`.
"""
