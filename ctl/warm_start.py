"""Warm start: initialize a new run from a pretrained checkpoint, all or in part.

    ctl.Experiment.hooks = [@ctl.WarmStart()]
    ctl.WarmStart.init_checkpoint = '/pretrained/ckpt-10000'   # a file prefix or a directory
    ctl.WarmStart.include = ['encoder']                         # layer names or attributes

It runs only when the model dir holds no checkpoint (a restart resumes from the
run's own checkpoints instead). Variables are matched by their object path in
the checkpoint, as `tf.train.Checkpoint` would match them: `model/...` in a
ctl checkpoint (`checkpoint_prefix` names another root, e.g. for a checkpoint
written as `tf.train.Checkpoint(encoder=...)`). Only model weights are read;
the optimizer and the step start fresh.

It logs what was restored and what was not. A checkpoint that provides none of
the chosen variables, a shape mismatch, or an `include` that names nothing is a
`UserError`. Runs eagerly on the host, before the first step.
"""

import collections
from typing import Dict, Sequence

from absl import logging
import gin
import tensorflow as tf

from ctl.errors import UserError
from ctl.hooks import Hook

_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def variable_keys(root_name: str, obj) -> Dict[str, object]:
    """Maps checkpoint key -> variable for every variable reachable from `obj`.

    Walks the object graph breadth-first with `tf.train.TrackableView`, as the
    checkpoint writer does, so the first path to a variable is its key.
    """
    root = tf.train.Checkpoint(**{root_name: obj})
    view = tf.train.TrackableView(root)  # Holds a weak reference to `root`.
    keys = {}
    seen = set()
    queue = collections.deque([(root, "")])
    while queue:
        node, path = queue.popleft()
        for name, child in view.children(node).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{name}" if path else name
            if _is_variable(child):
                keys[child_path + _VALUE] = child
            queue.append((child, child_path))
    return keys


def _is_variable(obj) -> bool:
    return isinstance(obj, tf.Variable) or hasattr(obj, "assign") and hasattr(obj, "trainable")


def select(model, include: Sequence[str]):
    """The variables of the layers or attributes named in `include` (all if empty)."""
    if not include:
        return list(model.variables)
    chosen = []
    for name in include:
        part = _find(model, name)
        if part is None:
            layers = ", ".join(layer.name for layer in getattr(model, "layers", []))
            raise UserError(
                f"ctl.WarmStart.include names {name!r}, which is neither a layer nor an "
                f"attribute of {type(model).__name__} (its layers: {layers}); fix the name."
            )
        chosen.extend(part.variables if hasattr(part, "variables") else [part])
    return chosen


def _find(model, name: str):
    try:
        return model.get_layer(name)
    except (ValueError, AttributeError):
        pass
    obj = model
    for attribute in name.split("."):
        obj = getattr(obj, attribute, None)
        if obj is None:
            return None
    return obj


@gin.configurable(module="ctl")
class WarmStart(Hook):
    """Loads `include` (default: the whole model) from `init_checkpoint` on a fresh run."""

    def __init__(self, init_checkpoint: str = gin.REQUIRED, include: Sequence[str] = (),
                 checkpoint_prefix: str = "model"):
        self.init_checkpoint = init_checkpoint
        self.include = list(include)
        self.checkpoint_prefix = checkpoint_prefix
        self.report = None

    def on_initialize(self) -> None:
        self.report = warm_start(self.run.model, self.init_checkpoint, self.include,
                                 self.checkpoint_prefix)


def _resolve(path: str) -> str:
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise UserError(f"ctl.WarmStart.init_checkpoint={path!r} is a directory without a "
                            "checkpoint; point it at a checkpoint prefix such as .../ckpt-1000.")
        return latest
    return path


def warm_start(model, init_checkpoint: str, include: Sequence[str] = (),
               checkpoint_prefix: str = "model") -> Dict[str, list]:
    """Assigns the chosen variables of `model` from `init_checkpoint`.

    Returns {"restored": [variable names], "not_in_checkpoint": [variable names],
    "not_restored": [checkpoint paths under `checkpoint_prefix` left unread]}.
    """
    path = _resolve(init_checkpoint)
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as error:
        raise UserError(f"cannot read ctl.WarmStart.init_checkpoint={init_checkpoint!r} "
                        f"({str(error).splitlines()[0][:160]}); check the path.") from error
    available = reader.get_variable_to_shape_map()
    wanted_ids = {id(v) for v in select(model, include)}
    keys = {k: v for k, v in variable_keys(checkpoint_prefix, model).items() if id(v) in wanted_ids}
    restored = sorted(k for k in keys if k in available)
    missing = sorted(k for k in keys if k not in available)
    mismatched = [f"{k} {list(available[k])} vs {list(keys[k].shape)}" for k in restored
                  if list(available[k]) != list(keys[k].shape)]
    if mismatched:
        raise UserError(f"ctl.WarmStart.init_checkpoint={init_checkpoint!r} has other shapes for "
                        f"{len(mismatched)} variable(s): {'; '.join(mismatched[:3])}; restore a "
                        "subset with ctl.WarmStart.include or fix the model.")
    if not restored:
        sample = ", ".join(sorted(k for k in available if k != "_CHECKPOINTABLE_OBJECT_GRAPH")[:3])
        raise UserError(
            f"ctl.WarmStart.init_checkpoint={init_checkpoint!r} matches none of the "
            f"{len(keys)} chosen variables (they start with {checkpoint_prefix!r}/; the checkpoint "
            f"has e.g. {sample}); check the path, ctl.WarmStart.include and "
            "ctl.WarmStart.checkpoint_prefix."
        )
    for key in restored:
        keys[key].assign(reader.get_tensor(key))
    prefix = checkpoint_prefix + "/"
    unused = sorted(k for k in available if k.startswith(prefix) and k.endswith(_VALUE)
                    and k not in keys)
    names = lambda ks: [_name(keys[k]) for k in ks]  # noqa: E731
    report = {"restored": names(restored), "not_in_checkpoint": names(missing),
              "not_restored": [k[: -len(_VALUE)] for k in unused]}
    logging.info("warm start from %s: restored %d of %d chosen variables%s: %s", path,
                 len(restored), len(keys), f" (include={list(include)})" if include else "",
                 ", ".join(report["restored"]))
    if missing:
        logging.info("warm start: not in the checkpoint, left as initialized: %s",
                     ", ".join(report["not_in_checkpoint"]))
    if unused:
        logging.info("warm start: in the checkpoint but not restored: %s",
                     ", ".join(report["not_restored"]))
    return report


def _name(variable) -> str:
    return str(getattr(variable, "path", None) or variable.name).split(":")[0]
