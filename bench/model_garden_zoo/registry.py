"""Model Garden's registry, listed at run time.

The experiments register themselves when their modules are imported: the
vision ones through `official.vision.registry_imports`, the NLP ones through
the experiment config modules of `official.nlp.configs`, and the ranking ones
through `official.recommendation.ranking.task` (which imports
`tensorflow_recommenders`, the `model_garden` extra). Nothing here names an
experiment: `experiments()` is whatever `exp_factory` holds after the imports.
"""

import importlib
import pkgutil
from typing import Dict, List

# Each module whose import registers experiments (or their tasks); a module
# that cannot be imported is reported, not skipped in silence.
VISION = "official.vision.registry_imports"
RANKING = ("official.recommendation.ranking.configs.config", "official.recommendation.ranking.task")


def _nlp_config_modules() -> List[str]:
    import official.nlp.configs as configs

    return [f"official.nlp.configs.{info.name}" for info in pkgutil.iter_modules(configs.__path__)
            if info.name.endswith("experiments") or info.name == "experiment_configs"]


def import_all() -> Dict[str, str]:
    """Imports every module that registers experiments; returns module -> error for those that fail."""
    failed = {}
    for name in [VISION, *_nlp_config_modules(), *RANKING]:
        try:
            importlib.import_module(name)
        except ImportError as error:  # e.g. the ranking task without tensorflow_recommenders.
            failed[name] = f"{type(error).__name__}: {error}"
    return failed


def import_as_train_py(experiment: str) -> None:
    """Imports what the train.py of `experiment`'s family imports to register it: the vision
    registry (`official.vision.train`); if that does not hold it, NLP's (`official.nlp.train`
    imports `official.common.registry_imports`); then the ranking modules. A trainer's start is
    then timed with the imports its own command pays, not with the whole registry's.

    Args:
      experiment: a registered experiment's name.
    """
    for names in ([VISION], ["official.common.registry_imports", *_nlp_config_modules()], RANKING):
        if experiment in experiments():
            return
        for name in names:
            importlib.import_module(name)


def experiments() -> List[str]:
    """The names registered with `exp_factory` (nested names joined by '/'), in registry order."""
    from ctl.adapters.model_garden import registered_experiments

    return registered_experiments()


def family(experiment: str) -> str:
    """The experiment's family, from the type of its task config (not from its name)."""
    from official.core import exp_factory

    task = type(exp_factory.get_exp_config(experiment).task).__name__
    return FAMILIES.get(task, "other")


# The task config classes of Model Garden's families.
FAMILIES = {
    "ImageClassificationTask": "classification",
    "RetinaNetTask": "detection",
    "MaskRCNNTask": "detection",
    "SemanticSegmentationTask": "segmentation",
    "VideoClassificationTask": "video",
    "SentencePredictionConfig": "nlp",
    "QuestionAnsweringConfig": "nlp",
    "TaggingConfig": "nlp",
    "MaskedLMConfig": "nlp",
    "ElectraPretrainConfig": "nlp",
    "TranslationConfig": "nlp",
    "Task": "ranking",  # official.recommendation.ranking.configs.config.Task
    "MockTaskConfig": "mock",
}
