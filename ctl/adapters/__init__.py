"""Adapters: what users already have, run under ctl unchanged.

`keras_model` trains a compiled Keras model (`ctl.KerasModelTask`);
`model_garden` runs a registered Model Garden experiment (`ctl.ModelGardenTask`):
`model_garden_settings` says what ctl does with each field of its trainer and runtime
configs, `model_garden_dir` writes the files Model Garden's tools read (`params.yaml`, its
validation summaries), `model_garden_command` turns Model Garden's train.py flags into a run
(`python -m ctl.train`), `model_garden_serving` gives its exports Model Garden's serving
signatures.
Each is a `ctl.Task`; nothing here knows the loop. Nothing is re-exported
here: the public API is `ctl`.
"""
