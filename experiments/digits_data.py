"""The digits data: scikit-learn's 8x8 digits, split once by a seed.

Imports neither ctl nor TensorFlow, so that a peer (bench/mg_digits.py) reads the same split.
"""

import numpy as np

HELD_OUT_FRACTION = 0.2


def load_split(training: bool, seed: int = 0):
    """Returns `(images, labels)` of the train or held-out split, images in [0, 1]."""
    from sklearn.datasets import load_digits  # Imported here: only this task needs it.

    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = int(len(labels) * (1 - HELD_OUT_FRACTION))
    chosen = order[:cut] if training else order[cut:]
    return (images[chosen] / 16.0).astype(np.float32), labels[chosen].astype(np.int32)
