"""The A/A check of a row whose numbers differ: does Model Garden reproduce itself?

A difference between ctl and `train_lib` is ctl's until `train_lib` is shown
to give different numbers against itself. `compare` then trains `train_lib` a
second time from the same initial checkpoint, files and global seed, in the
same process, and builds the experiment's train dataset several times, each
after the same global seed, comparing the batches it yields (`first_differing_batch`).
Either showing a difference means the experiment does not train reproducibly
under Model Garden's own trainer, and the row's reason says which (`reason`).
"""

import hashlib
import math
from typing import Any, Callable, Dict, List, Optional

BUILDS = 3  # Builds of the train dataset compared (a race shows in some builds, not all).


def _digest(element) -> str:
    import numpy as np
    import tensorflow as tf

    digest = hashlib.sha1()
    for leaf in tf.nest.flatten(element):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def batch_digests(build: Callable[[], Any], batches: int, seed: int = 1) -> List[str]:
    """A digest of each of the first `batches` elements of `build()`'s dataset, built after
    `tf_keras.utils.set_random_seed(seed)` (as `compare` seeds each trainer).

    Args:
      build: makes the dataset (e.g. the experiment's task's `build_inputs` on its train data).
      batches: how many elements to read.
      seed: the global seed set before the build.
    """
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    return [_digest(element) for element in build().take(batches)]


def first_differing_batch(build: Callable[[], Any], batches: int,
                          builds: int = BUILDS) -> Optional[int]:
    """The first batch (counted from 1) at which `builds` datasets made by `build()`, each
    after the same global seed, differ; None where every build yields the same batches.

    Args:
      build: makes the dataset.
      batches: how many elements of each build to compare.
      builds: how many times to build it.
    """
    first = batch_digests(build, batches)
    found: Optional[int] = None
    for _ in range(builds - 1):
        other = batch_digests(build, batches)
        differ = [i + 1 for i, (a, b) in enumerate(zip(first, other)) if a != b]
        if len(other) != len(first):
            differ.append(min(len(first), len(other)) + 1)
        if differ:
            found = min(differ) if found is None else min(found, *differ)
    return found


def _differ(a: float, b: Optional[float], tolerance: float) -> bool:
    if b is None or math.isnan(a) != math.isnan(b):
        return True
    return not math.isnan(a) and abs(a - b) > tolerance * max(abs(a), abs(b), 1e-12)


def reason(again: Dict[str, Any], tolerance: float) -> str:
    """The row's reason where `train_lib` does not reproduce itself, else ''.

    Args:
      again: `train_lib`'s second run: `max_rel_loss_diff` against its first, `eval` (metric:
        [first, second], the second None where it is missing) and `first_differing_batch`.
      tolerance: the relative difference below which two numbers are the same.
    """
    parts = []
    if (again.get("max_rel_loss_diff") or 0.0) > tolerance:
        parts.append(f"its training losses differ by up to {again['max_rel_loss_diff']:.2e}")
    differing = {key: (a, b) for key, (a, b) in again.get("eval", {}).items()
                 if _differ(a, b, tolerance)}
    if differing:
        parts.append("its eval " + ", ".join(f"{key} {a:.6g} vs {b if b is None else f'{b:.6g}'}"
                                              for key, (a, b) in differing.items()))
    batch = again.get("first_differing_batch")
    if batch:
        parts.append(f"its train dataset, built {BUILDS} times after the same global seed "
                     f"under op determinism, yields different batches from batch {batch}")
    if not parts:
        return ""
    return ("train_lib does not reproduce itself (run again from the same checkpoint, files "
            "and seed: " + "; ".join(parts) + "), so its numbers are no reference for ctl's")
