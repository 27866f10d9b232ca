"""Tiny variants of Model Garden's experiments, by overrides only.

`overrides(experiment, steps)` reads the experiment's config and returns the
`params_override` dicts that make it tiny: image size, depth or width,
sequence length, vocabulary, batch, steps. The rules are keyed by what the
config holds (its task config's class, its backbone's type, the fields
present), not by experiment names, so any registered experiment gets one.
The model's structure and the experiment's input pipeline, losses, metrics
and augmentations stay its own.

Besides size, a variant pins what would otherwise make two runs of the same
experiment differ or fail on this CPU-only host, and says so in `PINNED`.
"""

from typing import Any, Dict, List

# What a variant sets beyond size, and why (the docs page lists these).
PINNED = {
    "runtime.mixed_precision_dtype=float32, data dtype float32":
        "bfloat16 is for TPUs: the tiny variants compare float32 runs on a CPU",
    "trainer.optimizer_config (where the template has none): sgd, constant 0.01":
        "the base templates (`retinanet`, `image_classification`, ...) name no optimizer",
    "trainer.train_steps = K; a schedule's unset step counts: decay_steps = K, warmup_steps = K/2":
        "the learning-rate schedules of the BERT and ELECTRA configs leave them unset",
    "train_data.seed / validation_data.seed = 1":
        "one shuffle order for both trainers",
    "video: train_data.is_training = false (the eval parser's centre crop, no shuffle)":
        "the train parser's random crop passes no seed to tf.image.sample_distorted_bounding_box, "
        "which op determinism refuses, under train_lib too",
    "video: 64x64 frames (not 32x32)":
        "at 32x32 ResNet3D's last stage sees 1x1 feature maps: batch norm over 2 values per "
        "channel, whose losses explode (past train_lib's loss bound) and evaluate to NaN",
    "detection: train_data.parser.skip_crowd_during_training = false":
        "the generated boxes have no crowds; RetinaNet's crowd filter is a graph that the "
        "make_deterministic rewrite of the input pipeline (op determinism) cannot run",
    "segmentation: task.allow_image_summary = false":
        "train_lib's image summary of the eval outputs fails (a tf.summary.image shape error)",
}

IMAGE = {"classification": 32, "detection": 128, "segmentation": 64, "video": 64}
BATCH = {"classification": 8, "detection": 2, "segmentation": 2, "video": 2, "nlp": 4, "ranking": 16}
NUM_CLASSES = 4
SEQ_LENGTH = 16
FRAMES = 4
SMALL_FILTERS = 16
RANKING_DENSE = 4
RANKING_VOCAB = [16, 16, 16, 16]


def _has(config, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def _backbone(model) -> Dict[str, Any]:
    """Depth and width of the backbone, per its type."""
    kind = model.backbone.type
    small = {
        "resnet": {"model_id": 18, "depth_multiplier": 0.25},
        "dilated_resnet": {"model_id": 50},
        "revnet": {"model_id": 38},
        "mobilenet": {"filter_size_scale": 0.35},
        "vit": {"model_name": "vit-ti16", "representation_size": 32},
        "spinenet": {"model_id": "49S"},
        "spinenet_mobile": {"model_id": "49XS"},
        "resnet_3d": {},  # ResNet3D has no width multiplier; the clip is small instead.
    }.get(kind, {})
    if kind == "dilated_resnet" and getattr(model.backbone.dilated_resnet, "multigrid", None):
        small["multigrid"] = list(model.backbone.dilated_resnet.multigrid)
    return {"backbone": {kind: small}} if small else {}


def _shrink_filters(node, keys=("num_filters", "fc_dims", "low_level_num_filters")) -> Dict[str, Any]:
    """A dict setting each of `keys` present in `node` to something small."""
    out = {}
    for key in keys:
        if hasattr(node, key) and isinstance(getattr(node, key), int):
            out[key] = SMALL_FILTERS * (2 if key == "fc_dims" else 1)
    if hasattr(node, "num_convs") and isinstance(node.num_convs, int):
        out["num_convs"] = 1
    return out


def _vision(task, family: str) -> Dict[str, Any]:
    size = IMAGE[family]
    model: Dict[str, Any] = {**_backbone(task.model)}
    if family != "video":
        model["input_size"] = [size, size, 3]
        model["num_classes"] = NUM_CLASSES
    if _has(task, "model.decoder.type"):
        kind = task.model.decoder.type
        decoder = _shrink_filters(getattr(task.model.decoder, kind, None) or object())
        if kind == "aspp":
            decoder["pool_kernel_size"] = None  # Global pooling at any size.
        if decoder:
            model["decoder"] = {kind: decoder}
    for head in ("head", "rpn_head", "detection_head", "mask_head"):
        if _has(task, f"model.{head}"):
            model[head] = _shrink_filters(getattr(task.model, head))
    if family == "detection":
        model.update(_detection(task.model))
    data = {"global_batch_size": BATCH[family], "seed": 1, "dtype": "float32",
            "shuffle_buffer_size": 16}
    train, evals = dict(data), dict(data)
    if family == "detection":
        for split in (train, evals):
            split["parser"] = {"max_num_instances": 8}
            if _has(task, "train_data.parser.rpn_batch_size_per_im"):
                split["parser"]["rpn_batch_size_per_im"] = 32
        if _has(task, "train_data.parser.skip_crowd_during_training"):
            # See PINNED: RetinaNet's crowd filter puts constants under a control dependency
            # on the parser's input, which the make_deterministic rewrite cannot split.
            train["parser"]["skip_crowd_during_training"] = False
    if family == "segmentation":
        for split in (train, evals):
            split["output_size"] = [size, size]
            if _has(task, "train_data.crop_size") and task.train_data.crop_size:
                split["crop_size"] = [size, size]
        if _has(task, "validation_data.groundtruth_padded_size") and task.validation_data.groundtruth_padded_size:
            evals["groundtruth_padded_size"] = [size, size]
    if family == "video":
        for split in (train, evals):
            split.update({"feature_shape": [FRAMES, size, size, 3], "temporal_stride": 1,
                          "min_image_size": size + 4, "num_classes": NUM_CLASSES,
                          "tfds_name": "", "tfds_split": "", "num_examples": 8})
            if hasattr(task.train_data, "random_stride_range"):
                split["random_stride_range"] = 0
        # Its train parser's random crop (`preprocess_ops_3d.random_crop_resize`) passes no seed,
        # which op determinism refuses: train batches go through the eval parser (centre crop).
        train["is_training"] = evals["is_training"] = False
    out = {"model": model, "train_data": train, "validation_data": evals}
    if _has(task, "allow_image_summary"):
        out["allow_image_summary"] = False  # train_lib's image summary fails on its eval outputs.
    return out


def _detection(model) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if _has(model, "roi_sampler.num_sampled_rois"):
        out["roi_sampler"] = {"num_sampled_rois": 32}
    if _has(model, "mask_sampler.num_sampled_masks"):
        out["mask_sampler"] = {"num_sampled_masks": 8}
    if _has(model, "roi_generator.num_proposals"):
        out["roi_generator"] = {"num_proposals": 64, "pre_nms_top_k": 128,
                                "test_num_proposals": 64, "test_pre_nms_top_k": 128}
    if _has(model, "detection_generator.pre_nms_top_k"):
        out["detection_generator"] = {"pre_nms_top_k": 128, "max_num_detections": 16}
    return out


def _bert(width: int = 32) -> Dict[str, Any]:
    return {"bert": {"num_layers": 1, "hidden_size": width, "num_attention_heads": 2,
                     "intermediate_size": 2 * width, "max_position_embeddings": 4 * SEQ_LENGTH,
                     "vocab_size": _VOCAB_SIZE}}


# The vocabulary the NLP data uses (data.py writes a vocab file of this size).
_VOCAB_SIZE = 64


def _nlp(task) -> Dict[str, Any]:
    kind = type(task).__name__
    data = {"global_batch_size": BATCH["nlp"], "seed": 1}
    train, evals = dict(data), dict(data)
    model: Dict[str, Any] = {}
    for name in ("encoder", "generator_encoder", "discriminator_encoder"):
        if _has(task, f"model.{name}.type") and getattr(task.model, name).type == "bert":
            model[name] = _bert()
    if _has(task, "model.cls_heads") and task.model.cls_heads:
        model["cls_heads"] = [dict(head.as_dict(), inner_dim=32) for head in task.model.cls_heads]
    sizes = {"max_predictions_per_seq": 4, "seq_length": SEQ_LENGTH, "max_seq_length": SEQ_LENGTH,
             "seq_bucket_lengths": [SEQ_LENGTH // 2, SEQ_LENGTH]}
    if kind == "QuestionAnsweringConfig":
        sizes.update({"seq_length": 2 * SEQ_LENGTH, "query_length": 8, "doc_stride": 8})
    for split, config in ((train, task.train_data), (evals, task.validation_data)):
        split.update({key: value for key, value in sizes.items() if hasattr(config, key)})
    if hasattr(task.validation_data, "is_training"):  # Its default is True; the eval set, once.
        evals["is_training"] = False
    if kind == "ElectraPretrainConfig":
        model.update({"sequence_length": SEQ_LENGTH, "num_masked_tokens": 4})
    if kind == "TranslationConfig":
        layers = {"num_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
        model = {"encoder": layers, "decoder": layers, "embedding_width": 16,
                 "decode_max_length": SEQ_LENGTH, "beam_size": 2}
        # Its train batches are counted in tokens (batched by length), its eval batches in sentences.
        train["global_batch_size"] = BATCH["nlp"] * SEQ_LENGTH
        evals["global_batch_size"] = BATCH["nlp"]
    return {"model": model, "train_data": train, "validation_data": evals}


def _ranking(task) -> Dict[str, Any]:
    width = 4
    model = {"num_dense_features": RANKING_DENSE, "vocab_sizes": RANKING_VOCAB, "embedding_dim": width,
             "bottom_mlp": [8, width], "top_mlp": [8, 1], "size_threshold": -1,
             "use_partial_tpu_embedding": False}
    if task.model.interaction == "multi_layer_dcn":
        model["dcn_low_rank_dim"] = width
    if task.model.use_multi_hot:
        model["multi_hot_sizes"] = [1] * len(RANKING_VOCAB)
    data = {"global_batch_size": BATCH["ranking"], "num_shards_per_host": 1, "cycle_length": 1}
    return {"model": model, "train_data": data, "validation_data": dict(data)}


def _step_counts(config, steps: int) -> Dict[str, Any]:
    """The step counts a learning-rate schedule leaves unset (BERT's and ELECTRA's
    `decay_steps` and `warmup_steps`), scaled to `steps`: decay over the run, warm up over half."""
    out: Dict[str, Any] = {}
    for part in ("learning_rate", "warmup"):
        kind = getattr(config, part).type
        if not kind:
            continue
        unset = {name: (steps if name == "decay_steps" else max(1, steps // 2))
                 for name, value in getattr(config, part).get().as_dict().items()
                 if value is None and name.endswith("steps")}
        if unset:
            out[part] = {kind: unset}
    return out


def overrides(experiment: str, steps: int) -> List[Dict[str, Any]]:
    """The params_override dicts that make `experiment`'s tiny variant (data paths not included)."""
    from official.core import exp_factory
    from bench.model_garden_zoo.registry import FAMILIES

    params = exp_factory.get_exp_config(experiment)
    task = params.task
    family = FAMILIES.get(type(task).__name__, "other")
    if family in IMAGE:
        task_override = _vision(task, family)
    elif family == "nlp":
        task_override = _nlp(task)
    elif family == "ranking":
        task_override = _ranking(task)
    else:
        task_override = {}
    out: List[Dict[str, Any]] = [{"task": task_override}] if task_override else []
    trainer: Dict[str, Any] = {"train_steps": steps}
    if _has(params, "trainer.optimizer_config.optimizer.type") and not params.trainer.optimizer_config.optimizer.type:
        trainer["optimizer_config"] = {"optimizer": {"type": "sgd"}, "learning_rate": {
            "type": "constant", "constant": {"learning_rate": 0.01}}}
    elif _has(params, "trainer.optimizer_config.learning_rate.type"):
        schedule = _step_counts(params.trainer.optimizer_config, steps)
        if schedule:
            trainer["optimizer_config"] = schedule
    out.append({"trainer": trainer})
    if _has(params, "runtime.mixed_precision_dtype"):
        out.append({"runtime": {"mixed_precision_dtype": "float32"}})
    return out
