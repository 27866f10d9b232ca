"""What a ctl checkpoint holds.

A ctl checkpoint is one `tf.train.Checkpoint` with these objects at its root,
under these names, so that Keras' SidecarEvaluator and Model Garden tools read
it too:

    global_step   the train step (int64 variable)
    model         the Keras model
    optimizer     its optimizer (slots, iterations)
    rng           the model's Keras 3 RNG states (seed generators), if it has any
    ema           the moving average of the weights (`ctl.core.ema`: `ema/model`,
                  `ema/updates`), with `ctl.Trainer.ema_decay`
    ...           the task's `checkpoint_items(model)`: parts of the model that tools read by
                  name (Model Garden's `checkpoint_items`, e.g. `backbone`, BERT's `encoder`,
                  which its `init_checkpoint_modules` and its trainer's checkpoint hold at the
                  top level). Their variables are the model's: a checkpoint written without
                  them (an older ctl) restores into one with them.

Keras 3 keeps a `SeedGenerator`'s state (Dropout, noise layers) in a variable
that is part of the model's `variables` but not of its `weights`, and that
`tf.train.Checkpoint(model=...)` does not save; ctl adds those variables as
`rng`, so that a resumed run draws the numbers an uninterrupted one would.
tf_keras models keep theirs out of checkpoints: with `ctl.FaultTolerance.seed`
their layers draw from `tf.random.Generator`s, whose states ctl adds to `rng`.
A layer built on the model's first call makes its state as the train step is
traced: the Trainer adds it then (`track_new_rng_states`), before a step draws.

Reading what a checkpoint holds goes through its object graph (`SavedGraph`),
the graph `tf.train.Checkpoint` restores through: object paths such as
`model/layer_with_weights-0/kernel` lead to checkpoint keys. `variable_paths`
gives the same paths for a live object, so the two can be matched without
assuming how Keras names its attributes.
"""

import collections
from typing import Any, Dict, List, Optional

import tensorflow as tf

from ctl import compat
from ctl.utils.errors import UserError


GLOBAL_STEP, MODEL, OPTIMIZER, RNG, EMA = "global_step", "model", "optimizer", "rng", "ema"
OWN = (GLOBAL_STEP, MODEL, OPTIMIZER, RNG, EMA)  # ctl's names: a task's items take others.


def rng_state_variables(model) -> List:
    """The model's RNG states, in a stable order: its variables that are not its weights (Keras
    3's seed generators), then the state of each `tf.random.Generator` its layers draw from.

    tf_keras layers draw from generators once `enable_tf_random_generator()` is on (ctl turns
    it on with `ctl.FaultTolerance.seed`) but keep them out of checkpoints; they are found among
    each layer's attributes and their attributes.

    Args:
        model: a Keras model (Keras 3 or tf_keras).
    """
    weights = {id(weight) for weight in getattr(model, "weights", [])}
    states = [v for v in getattr(model, "variables", []) if id(v) not in weights]
    return states + [generator.state for generator in _random_generators(model)]


def _random_generators(model) -> List[tf.random.Generator]:
    found: Dict[int, tf.random.Generator] = {}
    for layer in getattr(model, "submodules", ()):
        for value in vars(layer).values():
            for candidate in (value, *getattr(value, "__dict__", {}).values()):
                if isinstance(candidate, tf.random.Generator):
                    found.setdefault(id(candidate), candidate)
    return list(found.values())


def track_new_rng_states(checkpoint: tf.train.Checkpoint, model) -> int:
    """Adds to `checkpoint`'s `rng` the model's RNG states it does not hold yet; returns how many.

    A layer built on its first call (a head that a subclassed model calls in `call`, as BERT's
    pretrainer calls its next-sentence head) makes its RNG state as the train step is traced,
    after the checkpoint was built. The new states go after those already held, in the order
    `rng_state_variables` finds them, so each process of a run numbers them alike; a checkpoint
    restored before they existed gives each its saved value as it is added (TensorFlow restores
    an object added to a restored one from the checkpoint still being read).

    Args:
        checkpoint: the run's checkpoint (`build_checkpoint`).
        model: the model it holds.
    """
    held = getattr(checkpoint, RNG, None)
    known = {id(state) for state in held} if held is not None else set()
    new = [state for state in rng_state_variables(model) if id(state) not in known]
    if not new:
        return 0
    if held is None:
        setattr(checkpoint, RNG, new)
    else:
        held.extend(new)
    return len(new)


def build_checkpoint(global_step: tf.Variable, model, optimizer,
                     ema=None, items: Optional[Dict[str, Any]] = None) -> tf.train.Checkpoint:
    """The checkpoint of a run: `global_step`, `model`, `optimizer` and, if any, `rng`, `ema`
    and the task's `items`.

    A checkpoint written without `rng` (Model Garden's trainer, an older ctl), or
    without the states of layers built on the model's first call (an older ctl),
    restores into a model that has RNG states, which keep the values the seed gave
    them (`ctl.core.checkpointing.restore` says so); one written without `items`
    restores too (their variables are the model's, found under `model`).

    Args:
        global_step: the step variable.
        model: the trained model.
        optimizer: its optimizer.
        ema: the `ctl.core.ema.MovingAverage`, or None without `ema_decay`.
        items: more top-level objects by name (`Task.checkpoint_items(model)`), parts of
            `model`; None: none.

    Raises:
        UserError: an item takes one of ctl's names (`OWN`).
    """
    taken = sorted(set(items or {}) & set(OWN))
    if taken:
        raise UserError(f"Task.checkpoint_items(model) names {taken}, which ctl's checkpoint "
                        f"holds itself ({', '.join(OWN)}); give the items other names.")
    objects = {**(items or {}), GLOBAL_STEP: global_step, MODEL: model, OPTIMIZER: optimizer}
    states = rng_state_variables(model)
    if states:
        objects[RNG] = states
    if ema is not None:
        objects[EMA] = ema
    return tf.train.Checkpoint(**objects)


def variable_paths(obj) -> Dict[str, Any]:
    """Maps object path (e.g. `layer_with_weights-0/kernel`) -> variable, under `obj`.

    Walks the object graph breadth-first with `tf.train.TrackableView`, the
    graph a checkpoint records, so each path also leads to the variable there.

    Args:
        obj: a trackable object (a model, a layer, a checkpoint).
    """
    view = tf.train.TrackableView(tf.train.Checkpoint(root=obj))
    paths = {}
    seen = {id(obj)}
    queue = collections.deque([(obj, "")])
    while queue:
        node, path = queue.popleft()
        for name, child in view.children(node).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{name}" if path else name
            if _is_variable(child):
                paths[child_path] = child
            queue.append((child, child_path))
    return paths


def checkpoint_variable_paths(checkpoint) -> Dict[str, Any]:
    """`variable_paths(checkpoint)`, each variable of its `model` at its path under `model`.

    A task's items (`build_checkpoint`'s `items`) hold parts of the model at the
    top level as well, where a checkpoint written without them has nothing: the
    path under `model` is the one every ctl checkpoint (and Model Garden's) has.

    Args:
        checkpoint: a run's checkpoint (`build_checkpoint`).
    """
    paths = variable_paths(checkpoint)
    model = getattr(checkpoint, MODEL, None)
    if model is None:
        return paths
    under_model = {id(v): f"{MODEL}/{path}" for path, v in variable_paths(model).items()}
    return {under_model.get(id(v), path): v for path, v in paths.items()}


def _is_variable(obj) -> bool:
    return isinstance(obj, tf.Variable) or hasattr(obj, "assign") and hasattr(obj, "trainable")


class SavedGraph:
    """The object graph stored in a checkpoint: follows object paths to checkpoint keys.

    `reader` is `tf.train.load_checkpoint(path)`; a name-based (TF1)
    checkpoint, which has no object graph, raises `ValueError`.

    Args:
        reader: `tf.train.load_checkpoint(path)` of the checkpoint.
    """

    def __init__(self, reader):
        self.proto = compat.checkpoint_object_graph(reader)

    def root_children(self) -> List[str]:
        """Names of the checkpoint's top-level objects (`global_step`, `model`, ...)."""
        return [child.local_name for child in self.proto.nodes[0].children]

    def node(self, path: str, start: int = 0) -> Optional[int]:
        """The node at `path` (names joined by "/") below node `start`, or None.

        Args:
            path: object names joined by "/".
            start: the node to start from (0: the checkpoint's root).
        """
        node = start
        for name in path.split("/"):
            children = {c.local_name: c.node_id for c in self.proto.nodes[node].children}
            if name not in children:
                return None
            node = children[name]
        return node

    def key(self, node: Optional[int]) -> Optional[str]:
        """The checkpoint key of the variable at `node`, or None.

        Args:
            node: a node id (None gives None).
        """
        if node is None:
            return None
        for attribute in self.proto.nodes[node].attributes:
            if attribute.name == "VARIABLE_VALUE":
                return attribute.checkpoint_key
        return None

    def variables_under(self, start: int) -> Dict[str, str]:
        """Maps path (from `start`) -> checkpoint key for every variable below `start`.

        Args:
            start: a node id.
        """
        found, seen = {}, {start}
        queue = collections.deque([(start, "")])
        while queue:
            node, path = queue.popleft()
            for child in self.proto.nodes[node].children:
                if child.node_id in seen:
                    continue
                seen.add(child.node_id)
                child_path = f"{path}/{child.local_name}" if path else child.local_name
                key = self.key(child.node_id)
                if key:
                    found[child_path] = key
                queue.append((child.node_id, child_path))
        return found


def saved_step(reader, graph: SavedGraph, optimizer) -> Optional[int]:
    """The step a checkpoint was written at: its `global_step`, else its optimizer's iterations.

    ctl's checkpoints hold `global_step`; `tf.train.Checkpoint(model=...,
    optimizer=...)` and tf_keras' `save_weights` hold only the optimizer, whose
    iteration count is found by the path of `optimizer.iterations` in the live
    `optimizer` (Keras names it differently across versions). None if neither.

    Args:
        reader: the checkpoint's reader.
        graph: its object graph.
        optimizer: the live optimizer, whose `iterations` path is looked up.
    """
    paths = [GLOBAL_STEP]
    paths += [f"{OPTIMIZER}/{path}" for path, variable in variable_paths(optimizer).items()
              if variable is optimizer.iterations]
    for path in paths:
        key = graph.key(graph.node(path))
        if key is not None:
            return int(reader.get_tensor(key))
    return None
