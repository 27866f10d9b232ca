"""Warm start: initialize a new run from a pretrained checkpoint, all or in part.

    ctl.Experiment.hooks = [@ctl.hooks.WarmStart()]
    ctl.hooks.WarmStart.init_checkpoint = '/pretrained/ckpt-10000'   # a file prefix or a directory
    ctl.hooks.WarmStart.include = ['encoder']                         # layer names or attributes

It runs only when the model dir holds no checkpoint (a restart resumes from the
run's own checkpoints instead). Variables are matched by their object path in
the checkpoint's object graph, as `tf.train.Checkpoint.restore` matches them:
under `model` in a ctl checkpoint (`checkpoint_prefix` names another root, e.g. for a checkpoint
written as `tf.train.Checkpoint(encoder=...)`). Only model weights are read;
the optimizer and the step start fresh.

It logs what was restored and what was not. A checkpoint that provides none of
the chosen variables, a shape mismatch, or an `include` that names nothing is a
`UserError`. Runs eagerly on the host, before the first step.
"""

from typing import Dict, Optional, Sequence

import gin
import tensorflow as tf

from ctl.utils import console
from ctl.core.checkpoint_contents import SavedGraph, variable_paths
from ctl.utils.errors import UserError, first_line
from ctl.core.hook_protocol import Hook


def select(model, include: Sequence[str]):
    """The variables of the layers or attributes named in `include` (all if empty).

    Args:
        model: the model to choose from.
        include: layer names (`model.get_layer`) or dotted attribute paths; empty: the whole model.

    Returns:
        The chosen variables.

    Raises:
        UserError: a name is neither a layer nor an attribute of the model.
    """
    if not include:
        return list(model.variables)
    chosen = []
    for name in include:
        part = _find(model, name)
        if part is None:
            layers = ", ".join(layer.name for layer in getattr(model, "layers", []))
            raise UserError(
                f"ctl.hooks.WarmStart.include names {name!r}, which is neither a layer nor an "
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


@gin.configurable(module="ctl.hooks")
class WarmStart(Hook):
    """Loads `include` (default: the whole model) from `init_checkpoint` on a fresh run.

    Args:
        init_checkpoint: the checkpoint to load from: a prefix (`.../ckpt-1000`) or a directory, whose latest
            checkpoint is read (required).
        include: the layers or attributes of the model to load (`select`); empty: the whole model.
        checkpoint_prefix: the object in the checkpoint that holds the model (`model` in ctl's and Keras'
            checkpoints).
    """

    def __init__(self, init_checkpoint: str = gin.REQUIRED, include: Sequence[str] = (),
                 checkpoint_prefix: str = "model"):
        self.init_checkpoint = init_checkpoint
        self.include = list(include)
        self.checkpoint_prefix = checkpoint_prefix
        self.report: Optional[Dict[str, list]] = None

    def on_initialize(self) -> None:
        self.report = warm_start(self.run.model, self.init_checkpoint, self.include,
                                 self.checkpoint_prefix)


def _resolve(path: str) -> str:
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise UserError(f"ctl.hooks.WarmStart.init_checkpoint={path!r} is a directory without a "
                            "checkpoint; point it at a checkpoint prefix such as .../ckpt-1000.")
        return latest
    return path


def warm_start(model, init_checkpoint: str, include: Sequence[str] = (),
               checkpoint_prefix: str = "model") -> Dict[str, list]:
    """Assigns the chosen variables of `model` from `init_checkpoint`.

    Returns {"restored": [variable names], "not_in_checkpoint": [variable names],
    "not_restored": [checkpoint paths under `checkpoint_prefix` left unread]}.

    Args:
        model: the model whose variables are assigned.
        init_checkpoint: a checkpoint prefix or a directory (its latest checkpoint).
        include: the layers or attributes to load (`select`); empty: the whole model.
        checkpoint_prefix: the object in the checkpoint that holds the model.

    Returns:
        `{"restored": [variable names], "not_in_checkpoint": [variable names], "not_restored": [checkpoint paths under
            checkpoint_prefix left unread]}`.

    Raises:
        UserError: the checkpoint cannot be read, is name-based (TF1), has other shapes, or matches none of the chosen
            variables.
    """
    path_ = _resolve(init_checkpoint)
    try:
        reader = tf.train.load_checkpoint(path_)
    except (tf.errors.OpError, ValueError) as error:
        raise UserError(f"cannot read ctl.hooks.WarmStart.init_checkpoint={init_checkpoint!r} "
                        f"({first_line(error)}); check the path.") from error
    available = reader.get_variable_to_shape_map()
    try:
        graph = SavedGraph(reader)
    except ValueError as error:
        raise UserError(f"ctl.hooks.WarmStart.init_checkpoint={init_checkpoint!r} is a name-based (TF1) "
                        "checkpoint; warm start reads object-based (TF2) checkpoints.") from error
    wanted_ids = {id(v) for v in select(model, include)}
    chosen = {p: v for p, v in variable_paths(model).items() if id(v) in wanted_ids}
    model_node = graph.node(checkpoint_prefix)
    keys = {p: graph.key(graph.node(p, model_node)) if model_node is not None else None
            for p in chosen}
    restored = sorted(p for p in chosen if keys[p] in available)
    missing = sorted(p for p in chosen if keys[p] not in available)
    mismatched = [f"{p} {list(available[keys[p]])} vs {list(chosen[p].shape)}" for p in restored
                  if list(available[keys[p]]) != list(chosen[p].shape)]
    if mismatched:
        raise UserError(f"ctl.hooks.WarmStart.init_checkpoint={init_checkpoint!r} has other shapes for "
                        f"{len(mismatched)} variable(s): {'; '.join(mismatched[:3])}; restore a "
                        "subset with ctl.hooks.WarmStart.include or fix the model.")
    if not restored:
        top = ", ".join(graph.root_children())
        raise UserError(
            f"ctl.hooks.WarmStart.init_checkpoint={init_checkpoint!r} matches none of the "
            f"{len(chosen)} chosen variables (looked under {checkpoint_prefix!r}; the checkpoint's "
            f"top-level objects: {top}); check the path, ctl.hooks.WarmStart.include and "
            "ctl.hooks.WarmStart.checkpoint_prefix."
        )
    for path in restored:
        chosen[path].assign(reader.get_tensor(keys[path]))
    used = {keys[p] for p in restored}
    unused = sorted(f"{checkpoint_prefix}/{p}" for p, k in graph.variables_under(model_node).items()
                    if k not in used)
    report = {"restored": [_name(chosen[p]) for p in restored],
              "not_in_checkpoint": [_name(chosen[p]) for p in missing],
              "not_restored": unused}
    console.info("warm", "warm start from %s: restored %d of %d chosen variables%s: %s", path_,
                 len(restored), len(chosen), f" (include={list(include)})" if include else "",
                 ", ".join(report["restored"]))
    if missing:
        console.info("warm", "warm start: not in the checkpoint, left as initialized: %s",
                     ", ".join(report["not_in_checkpoint"]))
    if unused:
        console.info("warm", "warm start: in the checkpoint but not restored: %s",
                     ", ".join(report["not_restored"]))
    return report


def _name(variable) -> str:
    return str(getattr(variable, "path", None) or variable.name).split(":")[0]
