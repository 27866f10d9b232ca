"""Generated data in each experiment's own input format: nothing is downloaded.

`data_overrides(experiment, directory)` writes (once, from a fixed seed) the
files the experiment's input pipeline reads and returns the `params_override`
pointing its `train_data` and `validation_data` at them. The experiment's own
decoders, parsers and augmentations then run on them:

- vision: `tf.Example` TFRecords as `official.vision.data.tf_example_builder`
  writes them (the builder `official.vision.dataloaders.tfexample_utils`
  uses), images made here with numpy rather than by
  `fake_feature_generator`, whose `np.reshape(..., newshape=...)` numpy 2.4
  refuses; a COCO annotation file of the detection eval set; video as
  `tf.SequenceExample`s of JPEG frames;
- NLP: token TFRecords with a WordPiece vocabulary file, raw-text TFRecords
  for the text pipelines, a SQuAD JSON file for question answering, and a
  SentencePiece model trained here on generated text for the WMT Transformer;
- ranking: Criteo-format TSV lines (label, dense, categorical).
"""

import json
import os
from typing import Any, Callable, Dict, Iterable, List

import numpy as np
import tensorflow as tf

from bench.model_garden_zoo import variants

EXAMPLES = {"train": 32, "eval": 8}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _rng(split: str, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng([7, 0 if split == "train" else 1, salt])


def _write(directory: str, name: str, records: Callable[[], Iterable[bytes]], shards: int = 2) -> str:
    """Writes `records` as `shards` TFRecord files unless present; returns their glob."""
    pattern = os.path.join(directory, f"{name}-*-of-{shards:05d}.tfrecord")
    if len(tf.io.gfile.glob(pattern)) == shards:
        return pattern
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"{name}-{k:05d}-of-{shards:05d}.tfrecord") for k in range(shards)]
    writers = [tf.io.TFRecordWriter(f"{path}.tmp") for path in paths]
    for index, record in enumerate(records()):
        writers[index % shards].write(record)
    for writer, path in zip(writers, paths):
        writer.close()
        os.replace(f"{path}.tmp", path)
    return pattern


def _ints(values) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _floats(values) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def _bytes(values) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[v.encode() if isinstance(v, str) else v for v in values]))


def _example(features: Dict[str, tf.train.Feature]) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _image(rng, height: int, width: int, label: int) -> np.ndarray:
    image = rng.normal(96, 24, size=(height, width, 3))
    image[..., label % 3] += 96
    return np.clip(image, 0, 255).astype(np.uint8)


# -- vision --

def _classification(directory: str, task) -> Dict[str, Any]:
    from official.vision.data import tf_example_builder

    size = variants.IMAGE["classification"]

    def records(split):
        rng = _rng(split)
        for index in range(EXAMPLES[split]):
            label = int(rng.integers(variants.NUM_CLASSES))
            builder = tf_example_builder.TfExampleBuilder()
            builder.add_image_matrix_feature(_image(rng, size, size, label), "JPEG", str(index))
            builder.add_ints_feature("image/class/label", [label])
            yield builder.example.SerializeToString()

    return _splits(directory, "images", records)


def _boxes(rng, count: int):
    """`count` normalized boxes (ymin, xmin, ymax, xmax), each at least a quarter of a side."""
    corners = rng.uniform(0.0, 0.6, size=(count, 2))
    sizes = rng.uniform(0.25, 0.4, size=(count, 2))
    return np.concatenate([corners, np.minimum(corners + sizes, 1.0)], axis=1)


def _detection_examples(split: str):
    """(image id, image, boxes, labels, masks) of each generated detection example."""
    size = variants.IMAGE["detection"]
    rng = _rng(split)
    for index in range(EXAMPLES[split]):
        count = int(rng.integers(1, 4))
        boxes = _boxes(rng, count)
        labels = rng.integers(1, variants.NUM_CLASSES, size=count)
        image = _image(rng, size, size, int(labels[0]))
        # Instance masks of 0 and 1, as COCO's records hold them (Model Garden's decoder reads
        # the PNG's values as they are: 255 would be a mask target the loss cannot take).
        masks = np.zeros((count, size, size), np.uint8)
        for k, (ymin, xmin, ymax, xmax) in enumerate((boxes * size).astype(int)):
            masks[k, ymin:ymax, xmin:xmax] = 1
            image[ymin:ymax, xmin:xmax, int(labels[k]) % 3] = 250
        yield index + 1, image, boxes, labels, masks


def _coco_annotations(path: str) -> str:
    """The eval set's ground truth as a COCO annotation file (boxes, and each box-shaped mask as
    a polygon), as a COCO evaluation reads it."""
    if os.path.exists(path):
        return path
    size = variants.IMAGE["detection"]
    images, annotations = [], []
    for image_id, _, boxes, labels, masks in _detection_examples("eval"):
        images.append({"id": image_id, "height": size, "width": size})
        for (ymin, xmin, ymax, xmax), label, mask in zip((boxes * size).astype(int), labels, masks):
            annotations.append({
                "id": len(annotations) + 1, "image_id": image_id, "category_id": int(label),
                "bbox": [int(xmin), int(ymin), int(xmax - xmin), int(ymax - ymin)],
                "area": float(mask.sum()), "iscrowd": 0,
                "segmentation": [[int(xmin), int(ymin), int(xmax), int(ymin), int(xmax), int(ymax),
                                  int(xmin), int(ymax)]]})
    categories = [{"id": k, "name": f"c{k}"} for k in range(1, variants.NUM_CLASSES)]
    with open(f"{path}.tmp", "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    os.replace(f"{path}.tmp", path)
    return path


def _detection(directory: str, task) -> Dict[str, Any]:
    from official.vision.data import tf_example_builder

    def records(split):
        for image_id, image, boxes, labels, masks in _detection_examples(split):
            builder = tf_example_builder.TfExampleBuilder()
            builder.add_image_matrix_feature(image, "JPEG", str(image_id))
            ymins, xmins, ymaxs, xmaxs = boxes.T.tolist()
            builder.add_boxes_feature(xmins, xmaxs, ymins, ymaxs, labels.tolist())
            builder.add_instance_mask_matrices_feature(masks[..., None])
            builder.add_ints_feature("image/object/is_crowd", [0] * len(labels))
            builder.add_floats_feature("image/object/area", [float(m.sum()) for m in masks])
            builder.add_bytes_feature("image/object/class/text", [b"c%d" % label for label in labels])
            yield builder.example.SerializeToString()

    out = _splits(directory, "boxes", records)
    # Model Garden builds the ground truth from the eval set without one, in code NumPy 2.4
    # refuses (`coco_utils.convert_groundtruths_to_coco_dataset`), under train_lib too.
    out["task"]["annotation_file"] = _coco_annotations(os.path.join(directory, "instances_eval.json"))
    return out


def _segmentation(directory: str, task) -> Dict[str, Any]:
    from official.vision.data import tf_example_builder

    size = variants.IMAGE["segmentation"]

    def records(split):
        rng = _rng(split)
        for index in range(EXAMPLES[split]):
            mask = np.zeros((size, size, 1), np.uint8)
            image = _image(rng, size, size, 0)
            for ymin, xmin, ymax, xmax in (_boxes(rng, 2) * size).astype(int):
                label = int(rng.integers(1, variants.NUM_CLASSES))
                mask[ymin:ymax, xmin:xmax] = label
                image[ymin:ymax, xmin:xmax, label % 3] = 250
            builder = tf_example_builder.TfExampleBuilder()
            builder.add_image_matrix_feature(image, "JPEG", str(index))
            builder.add_semantic_mask_matrix_feature(mask, "PNG")
            yield builder.example.SerializeToString()

    return _splits(directory, "masks", records)


def _video(directory: str, task) -> Dict[str, Any]:
    size = variants.IMAGE["video"] + 8
    frames = 2 * variants.FRAMES

    def records(split):
        rng = _rng(split)
        for _ in range(EXAMPLES[split]):
            label = int(rng.integers(variants.NUM_CLASSES))
            example = tf.train.SequenceExample()
            example.context.feature["clip/label/index"].int64_list.value[:] = [label]
            frames_list = example.feature_lists.feature_list["image/encoded"]
            for _ in range(frames):
                frames_list.feature.add().bytes_list.value[:] = [
                    tf.io.encode_jpeg(_image(rng, size, size, label)).numpy()]
            yield example.SerializeToString()

    return _splits(directory, "clips", records)


def _splits(directory: str, name: str, records) -> Dict[str, Any]:
    train = _write(directory, f"{name}-train", lambda: records("train"))
    evals = _write(directory, f"{name}-eval", lambda: records("eval"))
    return {"task": {"train_data": {"input_path": train}, "validation_data": {"input_path": evals}}}


# -- NLP --

WORDS = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"][:variants._VOCAB_SIZE - len(SPECIAL)]
VOCAB = SPECIAL + WORDS


def _vocab_file(directory: str) -> str:
    path = os.path.join(directory, "vocab.txt")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        with open(f"{path}.tmp", "w") as f:
            f.write("\n".join(VOCAB) + "\n")
        os.replace(f"{path}.tmp", path)
    return path


def _sentence(rng, length: int) -> List[str]:
    return [WORDS[k] for k in rng.integers(len(WORDS), size=length)]


def _label(words: List[str]) -> int:
    """Whether the first half of the vocabulary outnumbers the second in `words`."""
    return int(sum(WORDS.index(w) < len(WORDS) // 2 for w in words) * 2 > len(words))


def _token_ids(words: List[str]) -> List[int]:
    return [VOCAB.index("[CLS]"), *(VOCAB.index(w) for w in words), VOCAB.index("[SEP]")]


def _sentence_prediction(directory: str, task) -> Dict[str, Any]:
    seq = variants.SEQ_LENGTH
    if hasattr(task.train_data, "text_fields"):  # The raw-text pipeline: WordPiece on the fly.
        def text_records(split):
            rng = _rng(split)
            for _ in range(EXAMPLES[split]):
                words = _sentence(rng, seq - 4)
                yield _example({"sentence": _bytes([" ".join(words)]), "label": _ints([_label(words)])})

        out = _splits(directory, "text", text_records)
        vocab = _vocab_file(directory)
        for split in ("train_data", "validation_data"):
            out["task"][split].update({"text_fields": ["sentence"], "vocab_file": vocab})
        out["task"]["model"] = {"num_classes": 2}
        return out

    def records(split):
        rng = _rng(split)
        for _ in range(EXAMPLES[split]):
            words = _sentence(rng, seq - 2)
            yield _example({"input_ids": _ints(_token_ids(words)), "input_mask": _ints([1] * seq),
                            "segment_ids": _ints([0] * seq), "label_ids": _ints([_label(words)])})

    out = _splits(directory, "sentences", records)
    out["task"]["model"] = {"num_classes": 2}
    return out


def _tagging(directory: str, task) -> Dict[str, Any]:
    seq = variants.SEQ_LENGTH

    def records(split):
        rng = _rng(split)
        for _ in range(EXAMPLES[split]):
            words = _sentence(rng, seq - 2)
            labels = [-1, *(int(WORDS.index(w) < len(WORDS) // 2) for w in words), -1]
            yield _example({"input_ids": _ints(_token_ids(words)), "input_mask": _ints([1] * seq),
                            "segment_ids": _ints([0] * seq), "label_ids": _ints(labels)})

    out = _splits(directory, "tags", records)
    out["task"]["class_names"] = ["low", "high"]
    return out


def _masked(rng, seq: int, predictions: int):
    """A pretraining example: tokens with `predictions` of them masked, and what they were."""
    words = _sentence(rng, seq - 3)
    ids = [VOCAB.index("[CLS]")] + [VOCAB.index(w) for w in words[:seq // 2 - 1]] + [VOCAB.index("[SEP]")]
    segments = [0] * len(ids)
    rest = [VOCAB.index(w) for w in words[seq // 2 - 1:]] + [VOCAB.index("[SEP]")]
    ids, segments = ids + rest, segments + [1] * len(rest)
    positions = sorted(rng.choice(np.arange(1, seq - 1), size=predictions, replace=False).tolist())
    positions = [p for p in positions if ids[p] != VOCAB.index("[SEP]")][:predictions]
    masked = [ids[p] for p in positions]
    for p in positions:
        ids[p] = VOCAB.index("[MASK]")
    weights = [1.0] * len(positions) + [0.0] * (predictions - len(positions))
    positions += [0] * (predictions - len(positions))
    masked += [0] * (predictions - len(masked))
    return {"input_ids": _ints(ids), "input_mask": _ints([1] * seq), "segment_ids": _ints(segments),
            "masked_lm_positions": _ints(positions), "masked_lm_ids": _ints(masked),
            "masked_lm_weights": _floats(weights), "next_sentence_labels": _ints([int(rng.integers(2))])}


def _pretraining(directory: str, task) -> Dict[str, Any]:
    seq = variants.SEQ_LENGTH
    if hasattr(task.train_data, "text_field_names"):  # Raw text, masked on the fly.
        def text_records(split):
            rng = _rng(split)
            for _ in range(EXAMPLES[split]):
                yield _example({"text": _bytes([" ".join(_sentence(rng, seq))])})

        out = _splits(directory, "docs", text_records)
        vocab = _vocab_file(directory)
        for split in ("train_data", "validation_data"):
            out["task"][split].update({"vocab_file_path": vocab, "tfds_name": "", "tfds_split": "",
                                       "text_field_names": ["text"], "use_next_sentence_label": False})
        out["task"]["model"] = {"cls_heads": []}
        return out

    def records(split):
        rng = _rng(split)
        for _ in range(EXAMPLES[split]):
            yield _example(_masked(rng, seq, 4))

    return _splits(directory, "pretrain", records)


def _squad(directory: str, task) -> Dict[str, Any]:
    """Training features as the SQuAD preprocessing writes them; evaluation from a SQuAD JSON file
    (the task tokenizes it with the vocabulary itself)."""
    seq = 2 * variants.SEQ_LENGTH

    def records(split):
        rng = _rng(split)
        for _ in range(EXAMPLES[split]):
            question, context = _sentence(rng, 4), _sentence(rng, seq - 7)
            ids = _token_ids(question) + [VOCAB.index(w) for w in context] + [VOCAB.index("[SEP]")]
            start = 6 + int(rng.integers(len(context) - 2))
            yield _example({"input_ids": _ints(ids), "input_mask": _ints([1] * seq),
                            "segment_ids": _ints([0] * 6 + [1] * (seq - 6)),
                            "start_positions": _ints([start]), "end_positions": _ints([start + 1])})

    train = _write(directory, "squad-train", lambda: records("train"))
    path = os.path.join(directory, "squad-eval.json")
    if not os.path.exists(path):
        rng, articles = _rng("eval"), []
        for index in range(EXAMPLES["eval"]):
            context = _sentence(rng, seq - 12)
            start = int(rng.integers(len(context) - 2))
            offset = len(" ".join(context[:start])) + (1 if start else 0)
            answer = " ".join(context[start:start + 2])
            articles.append({"title": f"t{index}", "paragraphs": [{"context": " ".join(context), "qas": [{
                "id": f"q{index}", "question": " ".join(_sentence(rng, 4)),
                "answers": [{"text": answer, "answer_start": offset}]}]}]})
        with open(f"{path}.tmp", "w") as f:
            json.dump({"version": "1.1", "data": articles}, f)
        os.replace(f"{path}.tmp", path)
    vocab = _vocab_file(directory)
    return {"task": {"train_data": {"input_path": train, "vocab_file": vocab},
                     "validation_data": {"input_path": path, "vocab_file": vocab}}}


def _sentencepiece_model(directory: str) -> str:
    import sentencepiece

    prefix = os.path.join(directory, "spm")
    if not os.path.exists(prefix + ".model"):
        os.makedirs(directory, exist_ok=True)
        rng = _rng("train", 1)
        lines = [" ".join(_sentence(rng, 12)) for _ in range(400)]
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=prefix + ".tmp", vocab_size=variants._VOCAB_SIZE,
            model_type="bpe", pad_id=0, unk_id=1, bos_id=-1, eos_id=2, character_coverage=1.0,
            num_threads=1, minloglevel=2)
        for ext in (".model", ".vocab"):
            os.replace(prefix + ".tmp" + ext, prefix + ext)
    return prefix + ".model"


def _translation(directory: str, task) -> Dict[str, Any]:
    src, tgt = "en", "de"

    def records(split):
        rng = _rng(split)
        for _ in range(EXAMPLES[split]):
            words = _sentence(rng, int(rng.integers(3, 7)))
            # The "translation": each syllable's vowel shifted by one.
            shifted = [w[0] + "aeiou"[("aeiou".index(w[1]) + 1) % 5] for w in words]
            yield _example({src: _bytes([" ".join(words)]), tgt: _bytes([" ".join(shifted)])})

    out = _splits(directory, "wmt", records)
    model = _sentencepiece_model(directory)
    out["task"]["sentencepiece_model_path"] = model
    for split in ("train_data", "validation_data"):
        out["task"][split].update({"src_lang": src, "tgt_lang": tgt, "tfds_name": "",
                                   "sentencepiece_model_path": model})
    return out


# -- ranking --

def _ranking(directory: str, task) -> Dict[str, Any]:
    dense, sparse = variants.RANKING_DENSE, variants.RANKING_VOCAB

    def write(split):
        path = os.path.join(directory, f"criteo-{split}.tsv")
        if not os.path.exists(path):
            os.makedirs(directory, exist_ok=True)
            rng = _rng(split)
            with open(f"{path}.tmp", "w") as f:
                for _ in range(EXAMPLES[split] * 8):
                    values = rng.integers(0, 10, size=dense)
                    ids = [int(rng.integers(size)) for size in sparse]
                    label = int(values.sum() + ids[0] > 5 * dense)
                    f.write("\t".join(map(str, [label, *values, *ids])) + "\n")
            os.replace(f"{path}.tmp", path)
        return path

    return {"task": {"train_data": {"input_path": write("train")},
                     "validation_data": {"input_path": write("eval")}}}


WRITERS = {
    "ImageClassificationTask": _classification,
    "RetinaNetTask": _detection,
    "MaskRCNNTask": _detection,
    "SemanticSegmentationTask": _segmentation,
    "VideoClassificationTask": _video,
    "SentencePredictionConfig": _sentence_prediction,
    "TaggingConfig": _tagging,
    "MaskedLMConfig": _pretraining,
    "ElectraPretrainConfig": _pretraining,
    "QuestionAnsweringConfig": _squad,
    "TranslationConfig": _translation,
    "Task": _ranking,  # official.recommendation.ranking.configs.config.Task
}


def data_overrides(experiment: str, directory: str) -> List[Dict[str, Any]]:
    """Writes `experiment`'s data under `directory` (once); returns the params_override for it.

    Args:
      experiment: a registered experiment's name.
      directory: where the files go; one directory can serve every experiment.
    """
    from official.core import exp_factory

    task = exp_factory.get_exp_config(experiment).task
    writer = WRITERS.get(type(task).__name__)
    if writer is None:  # An experiment that makes its own input (Model Garden's `mock`).
        return []
    return [writer(os.path.join(directory, writer.__name__.strip("_")), task)]
