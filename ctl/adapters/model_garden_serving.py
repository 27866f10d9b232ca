"""The serving signatures of a Model Garden model: Model Garden's own export modules around it.

`ctl.ModelGardenTask.serving_signatures(model)` picks the export module Model
Garden's own export tools pick for the experiment, and serves ctl's model (the
evaluated one) through it, so ctl's exporters (`ctl.hooks.LatestExporter`,
`BestExporter`, `FinalExporter`, `CheckpointExporter`) and `--mode=smoke`
write the SavedModel Model Garden's export writes:

- vision, by the class of the experiment's task config, as
  `official.vision.serving.export_saved_model_lib.export_inference_graph`
  picks: image classification, RetinaNet and Mask R-CNN (detection), semantic
  segmentation, video classification; input type `image_tensor` (uint8
  images, of any size for images, of the experiment's clip shape for video)
  as `serving_default`, batch size free, at the image size the experiment's
  model takes;
- NLP, by the class of the experiment's task, from
  `official.nlp.serving.export_savedmodel.SERVING_MODULES` (sentence
  prediction, masked LM, question answering, tagging, translation): the
  module's `serve` (translation: `serve_text`) as `serving_default`, with the
  module's default parameters (translation: the task's SentencePiece model;
  masked LM: the model's first classification head). A translation model that
  decodes with `padded_decode` (`wmt_transformer/large`) needs a fixed batch
  size the module leaves free: its export ends in one line saying so, as
  Model Garden's own export of it fails (`export_problem`). Any other error a
  module raises while it is made around the model or traces its signatures
  (the masked LM module's `KeyError: 'next_sentence'` on a model without
  that classification head) ends in one line too (`module_failure`).

Other families (ranking, ELECTRA pretraining, the mock) have no export module
in Model Garden: their models are served from their Keras inputs where they
have them, else the export ends in one line saying so.
"""

import functools
import sys
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from ctl.utils.errors import one_line

DEFAULT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
VISION_INPUT_TYPE = "image_tensor"  # Model Garden's `--input_type` default.
NLP_FUNCTION_KEY = "serve"
NLP_FUNCTION_KEYS = {"Translation": "serve_text"}  # The module's one signature where `serve` is not.


def vision_modules() -> Dict[type, type]:
    """{task config class: export module class}, as Model Garden's vision export picks them
    (`official.vision.serving.export_saved_model_lib.export_inference_graph`)."""
    from official.vision import configs
    from official.vision.serving import (detection, image_classification, semantic_segmentation,
                                         video_classification)

    return {configs.image_classification.ImageClassificationTask:
            image_classification.ClassificationModule,
            configs.retinanet.RetinaNetTask: detection.DetectionModule,
            configs.maskrcnn.MaskRCNNTask: detection.DetectionModule,
            configs.semantic_segmentation.SemanticSegmentationTask:
            semantic_segmentation.SegmentationModule,
            configs.video_classification.VideoClassificationTask:
            video_classification.VideoClassificationModule}


def nlp_modules() -> Dict[type, type]:
    """{task class: export module class}: Model Garden's NLP export's own table
    (`official.nlp.serving.export_savedmodel.SERVING_MODULES`)."""
    from official.nlp.serving import export_savedmodel

    return dict(export_savedmodel.SERVING_MODULES)


def export_module_class(params, garden_task) -> Optional[type]:
    """The export module Model Garden's export tools use for this experiment; None without one.

    Args:
        params: the experiment's `ExperimentConfig`.
        garden_task: its Model Garden task (`official.core.base_task.Task`).
    """
    # A vision task config or an NLP task is one of these classes only once their modules are
    # imported: the other family's serving modules are not loaded for nothing.
    if "official.vision.configs" in sys.modules:
        for config_class, module_class in vision_modules().items():
            if isinstance(params.task, config_class):
                return module_class
    if "official.nlp.tasks" in sys.modules:
        return nlp_modules().get(type(garden_task))  # By the exact class, as Model Garden's table.
    return None


def is_vision(module_class: type) -> bool:
    """Whether an export module class is one of Model Garden's vision modules (`vision_modules`).

    Args:
        module_class: an export module class.
    """
    return module_class in set(vision_modules().values())


def image_size(params) -> Tuple[List[int], int]:
    """`(input_image_size, num_channels)` of a vision experiment, as its export module takes them:
    `[frames, height, width]` of `task.train_data.feature_shape` for video, else the height and
    width of `task.model.input_size`, or of `task.validation_data.output_size` where the model
    takes any size (segmentation's).

    Args:
        params: the experiment's `ExperimentConfig`.
    """
    task = params.task
    clip = getattr(task.train_data, "feature_shape", None)
    if clip:  # Video: (frames, height, width, channels).
        return [int(x) for x in clip[:-1]], int(clip[-1])
    size = list(getattr(task.model, "input_size", None) or [])
    channels = int(size[-1]) if size and size[-1] else 3
    if len(size) == 3 and None not in size[:2]:
        return [int(x) for x in size[:2]], channels
    output = list(getattr(task.validation_data, "output_size", None) or [])
    return [int(x) for x in output[:2]], channels


def serving_module(params, garden_task, model):
    """Model Garden's export module for this experiment, serving `model`; None without one.

    A vision module is made as Model Garden's export makes it (which builds a model of its
    own and reads settings such as a video's frames as it does), then serves `model` in place
    of that one; an NLP module takes `model` as Model Garden's export gives it one.

    Args:
        params: the experiment's `ExperimentConfig`.
        garden_task: its Model Garden task.
        model: the model to serve (its variables are the ones exported).
    """
    import tf_keras

    module_class = export_module_class(params, garden_task)
    if module_class is None:
        return None
    if is_vision(module_class):
        size, channels = image_size(params)
        module = module_class(params=params, batch_size=None, input_image_size=size,
                              input_type=VISION_INPUT_TYPE, num_channels=channels)
        module.model = model  # Model Garden's ExportModule.__init__, for this model:
        module.inference_step = (model.call if isinstance(model, tf_keras.Model)
                                 else functools.partial(model.__call__, training=False))
        return module
    return module_class(params=module_class.Params(**nlp_serving_params(module_class, params)),
                        model=model)


def export_problem(params, module_class) -> Optional[str]:
    """Why Model Garden's export module, with the parameters ctl gives it (Model Garden's
    defaults), cannot export the experiment's model; None if it can.

    A translation model that decodes with `task.model.padded_decode` (padded to
    `decode_max_length`, for TPUs; `wmt_transformer/large` sets it) needs a fixed batch size,
    which the `Translation` module's `serve_text` leaves free (its `batch_size`, None by
    default): tracing it fails in the beam search (`TypeError: Failed to convert elements of
    [None, 1] to Tensor`), in Model Garden's own export of that model as in ctl's
    (tests/test_model_garden_export.py checks both).

    Args:
        params: the experiment's `ExperimentConfig`.
        module_class: its export module class (`export_module_class`).
    """
    fields = module_class.Params().as_dict() if hasattr(module_class, "Params") else {}
    if ("batch_size" in fields and fields["batch_size"] is None
            and getattr(params.task.model, "padded_decode", False)):
        return (f"its model decodes with task.model.padded_decode=True, which needs a fixed batch "
                f"size, and Model Garden's export module ({module_class.__module__}."
                f"{module_class.__name__}) leaves it free (its batch_size is unset by default): "
                "Model Garden's own export of this model fails the same way; set "
                "task.model.padded_decode=false (--params_override, or "
                "ctl.ModelGardenTask.params_override) to export a model that takes any batch "
                "size (its weights are the same), or drop the exporters")
    return None


# What an export module raises while it is made around a model or traces its signatures on it
# (an output it names that the model lacks, a shape it cannot take): the model and the module
# disagree, a mistake in the experiment's config rather than in ctl.
MODULE_ERRORS = (KeyError, ValueError, TypeError, IndexError, AttributeError, NotImplementedError,
                 tf.errors.OpError)


def module_failure(module_class, error: BaseException) -> str:
    """The line for an error Model Garden's export module raised while it built its signatures
    around the experiment's model (`MODULE_ERRORS`): the module, the error, and the way out.

    ctl makes the module as Model Garden's own export does (its default parameters but the
    experiment's SentencePiece model and classification head), so that export fails the same
    way on this model: the masked LM module of a model without the classification head it serves
    (`bert/text_wiki_pretraining` without next-sentence labels) raises `KeyError: 'next_sentence'`.

    Args:
        module_class: the export module class (`export_module_class`).
        error: what making the module or tracing its signatures raised.
    """
    kind = next((c.__name__ for c in type(error).__mro__
                 if c.__module__ == "builtins" and c not in (Exception, BaseException)),
                type(error).__name__)  # KeyError, not AutoGraph's MultilineMessageKeyError.
    return (f"Model Garden's export module ({module_class.__module__}.{module_class.__name__}) "
            f"cannot build its serving signatures around this model ({kind}: "
            f"{one_line(error, 200)}); ctl makes it as Model Garden's own export does, which "
            "fails the same way on this model; give the experiment a model the module serves "
            "(task.model), subclass ctl.ModelGardenTask and override serving_signatures(model), "
            "or drop the exporters")


def nlp_serving_params(module_class, params) -> Dict[str, Any]:
    """The NLP module's parameters that the experiment decides (the others keep Model Garden's
    defaults): translation's SentencePiece model, masked LM's classification head.

    Args:
        module_class: the export module class.
        params: the experiment's `ExperimentConfig`.
    """
    fields = set(module_class.Params().as_dict())
    values: Dict[str, Any] = {}
    if "sentencepiece_model_path" in fields:
        values["sentencepiece_model_path"] = params.task.sentencepiece_model_path
    heads = list(getattr(params.task.model, "cls_heads", None) or [])
    if "cls_head_name" in fields and heads:
        values["cls_head_name"] = heads[0].name
    return values


def saved_objects(module, model) -> tf.Module:
    """What an export of `module`'s signatures saves: the model's variables and the module's own
    resources (translation's tokenizer), not the Keras model itself, whose own SavedModel
    serialization would trace its training call (which Mask R-CNN's cannot run without labels).

    Args:
        module: an export module (`serving_module`).
        model: the model it serves.
    """
    import tf_keras

    saved = tf.Module()
    saved.model_variables = list(model.variables)
    saved.resources = [value for value in vars(module).values()
                       if isinstance(value, tf.Module) and value is not model
                       and not isinstance(value, tf_keras.layers.Layer)]
    return saved


def signatures(module) -> Dict[str, Any]:
    """The module's `serving_default` (concrete functions), as Model Garden's export names it.

    Args:
        module: an export module (`serving_module`).
    """
    if is_vision(type(module)):
        key = VISION_INPUT_TYPE
    else:
        key = NLP_FUNCTION_KEYS.get(type(module).__name__, NLP_FUNCTION_KEY)
    return dict(module.get_inference_signatures({key: DEFAULT_SIGNATURE}))
