"""ctl's exporters on Model Garden models: the SavedModel Model Garden's own export writes.

`ctl.hooks.FinalExporter`, bound to a tiny RetinaNet (detection) and a tiny BERT sentence
classifier (the zoo's variants), exports through `ctl.ModelGardenTask.serving_signatures`. The
SavedModel, loaded, takes the inputs Model Garden's export module declares and gives, on one
input, what that module gives around the model in memory (RetinaNet: its detections; BERT: the
model's own logits; a WMT Transformer: its translations, where the module can export it)."""

import re

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl.core.hook_protocol import Run
from ctl.hooks import exporting
from ctl.model_dir import ModelDir

STEP = 3  # The global step the export is named by.


def exported_by_ctl(task, model, model_dir):
    """`ctl.hooks.FinalExporter`'s SavedModel of `model`, at step STEP, loaded."""
    exporter = ctl.hooks.FinalExporter()
    exporter.bind(Run(directory=ModelDir(str(model_dir)), model=model,
                      checkpoint=tf.train.Checkpoint(model=model),
                      global_step=tf.Variable(STEP, dtype=tf.int64), task=task))
    exporter.on_trial_close({})
    return tf.saved_model.load(str(model_dir / "export" / "final" / str(STEP)))


def inputs_of(signature):
    """{name: (shape, dtype)} of a signature's inputs (a loaded one's, or one in memory)."""
    positional, named = signature.structured_input_signature
    specs = {**{spec.name: spec for spec in positional if isinstance(spec, tf.TensorSpec)}, **named}
    return {name: (spec.shape.as_list(), spec.dtype) for name, spec in specs.items()}


def assert_same_outputs(served, expected):
    assert set(served) == set(expected), (sorted(served), sorted(expected))
    for name, value in expected.items():
        np.testing.assert_allclose(served[name].numpy(), np.asarray(value), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def perturbed(model):
    """`model` with every weight moved off its initial value (an export of fresh weights would
    not tell them apart from a built-again model's)."""
    rng = np.random.default_rng(0)
    for weight in model.weights:
        if weight.dtype.is_floating:
            weight.assign(weight + rng.normal(0, 0.01, weight.shape).astype(weight.dtype.as_numpy_dtype))
    return model


@pytest.mark.slow
def test_ctls_exporter_serves_a_detection_model_as_model_gardens_export(tmp_path):
    import official.vision.registry_imports  # noqa: F401
    from official.vision.serving import detection

    from bench.model_garden_zoo import variants

    experiment = "retinanet_resnetfpn_coco"
    # An export reads no eval data: no COCO annotation file (ctl checks the paths it names).
    task = ctl.ModelGardenTask(experiment=experiment, params_override=variants.overrides(
        experiment, 2) + [{"task": {"init_checkpoint": "", "annotation_file": ""}}])
    model = perturbed(task.build_model())
    served = exported_by_ctl(task, model, tmp_path / "ctl").signatures["serving_default"]
    # Model Garden's export module around the same model, as its export_saved_model_lib makes
    # it (input type image_tensor, batch size free): its signature, traced in memory.
    size = list(task.params.task.model.input_size[:2])
    garden = detection.DetectionModule(params=task.params, model=model, batch_size=None,
                                       input_image_size=size).get_inference_signatures(
        {"image_tensor": "serving_default"})["serving_default"]
    assert inputs_of(served) == {"inputs": ([None, None, None, 3], tf.uint8)}
    assert [spec.shape.as_list() for spec in garden.structured_input_signature[0]] == [
        [None, None, None, 3]]
    # One image of another size than the model's: the module resizes it, as it serves.
    images = tf.constant(np.random.default_rng(1).integers(0, 256, (1, size[0] - 16, size[1] + 8, 3)),
                         tf.uint8)
    in_memory = garden(images)
    assert {"detection_boxes", "detection_scores", "detection_classes",
            "num_detections"} <= set(in_memory)
    assert_same_outputs(served(inputs=images), in_memory)


@pytest.mark.slow
def test_ctls_exporter_serves_a_bert_classifier_as_model_gardens_export(tmp_path):
    from official.nlp.configs import experiment_configs  # noqa: F401
    from official.nlp.serving import serving_modules

    from bench.model_garden_zoo import variants

    experiment = "bert/sentence_prediction"
    task = ctl.ModelGardenTask(experiment=experiment, params_override=variants.overrides(
        experiment, 2) + [{"task": {"init_checkpoint": "", "model": {"num_classes": 3}}}])
    model = perturbed(task.build_model())
    served = exported_by_ctl(task, model, tmp_path / "ctl").signatures["serving_default"]
    # Model Garden's NLP export module around the same model, as its export makes it (`serve`).
    garden = serving_modules.SentencePrediction(
        params=serving_modules.SentencePrediction.Params(), model=model).get_inference_signatures(
        {"serve": "serving_default"})["serving_default"]
    assert inputs_of(served) == inputs_of(garden) == {"input_word_ids": ([None, None], tf.int32)}
    vocab = task.params.task.model.encoder.get().vocab_size
    ids = np.random.default_rng(1).integers(1, vocab, (2, 16)).astype(np.int32)
    ids[1, 10:] = 0  # Padding: the module masks it.
    words = tf.constant(ids)
    logits = model({"input_word_ids": words, "input_mask": tf.cast(words != 0, tf.int32),
                    "input_type_ids": tf.zeros_like(words)}, training=False)
    assert_same_outputs(served(input_word_ids=words), {"outputs": logits})
    assert_same_outputs(garden(input_word_ids=words), {"outputs": logits})


@pytest.mark.slow
def test_a_translation_model_that_decodes_padded_exports_as_model_gardens_module_can(tmp_path):
    """`wmt_transformer/large` decodes with `padded_decode`, which needs a fixed batch size that
    Model Garden's `Translation` module, with its defaults, leaves free: Model Garden's own
    module fails on the model, and ctl's export says so in one line. With `padded_decode`
    off, which the line names, ctl's exporter serves what that module gives in memory."""
    from official.nlp.configs import wmt_transformer_experiments  # noqa: F401
    from official.nlp.serving import serving_modules

    from bench.model_garden_zoo import data, variants

    experiment = "wmt_transformer/large"
    overrides = variants.overrides(experiment, 2) + data.data_overrides(
        experiment, str(tmp_path / "data"))
    task = ctl.ModelGardenTask(experiment=experiment, params_override=overrides)
    model = task.build_model()
    assert task.params.task.model.padded_decode
    params = serving_modules.Translation.Params(
        sentencepiece_model_path=task.params.task.sentencepiece_model_path)
    with pytest.raises(TypeError, match=r"Failed to convert elements of \[None, 1\] to Tensor"):
        serving_modules.Translation(params=params, model=model).get_inference_signatures(
            {"serve_text": "serving_default"})
    with pytest.raises(ctl.UserError, match=r"experiment 'wmt_transformer/large': its model "
                       r"decodes with task.model.padded_decode=True, which needs a fixed batch "
                       r"size, .*Model Garden's own export of this model fails the same way; set "
                       r"task.model.padded_decode=false") as raised:
        exported_by_ctl(task, model, tmp_path / "ctl")
    assert "\n" not in str(raised.value)

    task = ctl.ModelGardenTask(experiment=experiment, params_override=overrides + [
        {"task": {"model": {"padded_decode": False}}}])
    model = perturbed(task.build_model())
    served = exported_by_ctl(task, model, tmp_path / "unpadded").signatures["serving_default"]
    garden = serving_modules.Translation(params=params, model=model).get_inference_signatures(
        {"serve_text": "serving_default"})["serving_default"]
    assert inputs_of(served) == inputs_of(garden) == {"text": ([None], tf.string)}
    text = tf.constant(["ba ke mo", "ti su", "lo"])  # Any batch size.
    translated = served(text=text)
    assert set(translated) == {"output_0"}  # Model Garden's serve_text returns the text alone.
    np.testing.assert_array_equal(translated["output_0"].numpy(), garden(text).numpy())
    # `--mode=smoke`'s and the zoo's check of an export, on one eval batch, passes too.
    features = task.features(next(iter(task.build_inputs(training=False))))
    served = exporting.check_served(task.serving_signatures(model),
                                    str(tmp_path / "unpadded" / "export" / "final" / str(STEP)),
                                    features)
    assert set(served["serving_default"]) == {"output_0"}


def test_a_family_without_an_export_module_says_so_in_one_line():
    """Model Garden has no export module for its `mock` experiment, whose model has no Keras
    inputs: the export names the experiment, the task config and the fix."""
    from official.core import exp_factory  # noqa: F401
    from official.utils.testing import mock_task  # noqa: F401  (registers `mock`)

    task = ctl.ModelGardenTask(experiment="mock", params_override=(
        "trainer.optimizer_config.optimizer.type=sgd,"
        "trainer.optimizer_config.learning_rate.type=constant"))
    model = task.build_model()
    with pytest.raises(ctl.UserError, match=r"experiment 'mock': Model Garden has no export module "
                       r"for its task \(MockTaskConfig\)") as raised:
        task.serving_signatures(model)
    assert "\n" not in str(raised.value)


def test_an_error_of_model_gardens_export_module_ends_in_one_line(tmp_path):
    """`bert/text_wiki_pretraining` on text without next-sentence labels has no classification
    head, which Model Garden's masked LM export module serves (`next_sentence` by default): the
    module fails on the model, in Model Garden's own export as in ctl's, and ctl's exporter
    says so in one line naming the module, its error and the ways out."""
    from official.nlp.configs import pretraining_experiments  # noqa: F401
    from official.nlp.serving import serving_modules

    from bench.model_garden_zoo import data, variants

    experiment = "bert/text_wiki_pretraining"
    task = ctl.ModelGardenTask(experiment=experiment, params_override=variants.overrides(
        experiment, 2) + data.data_overrides(experiment, str(tmp_path / "data")))
    assert not task.params.task.model.cls_heads
    model = task.build_model()
    with pytest.raises(KeyError, match="next_sentence"):
        serving_modules.MaskedLM(params=serving_modules.MaskedLM.Params(),
                                 model=model).get_inference_signatures({"serve": "serving_default"})
    with pytest.raises(ctl.UserError, match=re.escape(
            "experiment 'bert/text_wiki_pretraining': Model Garden's export module "
            "(official.nlp.serving.serving_modules.MaskedLM) cannot build its serving signatures "
            "around this model (KeyError: 'next_sentence'); ctl makes it as Model Garden's own "
            "export does, which fails the same way on this model;")) as raised:
        exported_by_ctl(task, model, tmp_path / "ctl")
    assert "\n" not in str(raised.value) and "drop the exporters" in str(raised.value)
