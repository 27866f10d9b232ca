"""A checkpoint's files, and the `checkpoint` state file read defensively.

The corruption policy for checkpoints (train, eval and the sidecar alike;
docs/faults.md, "Damaged model dir"): `restore_newest` restores the checkpoint
the state file names; if that file is unreadable, names a checkpoint that is
gone, or names one that does not restore, it scans the `*.index` files and
restores the newest checkpoint that does, with one WARNING naming what was
skipped and why. It never starts from step 0 while a checkpoint is there: if
none restores, the run stops with an error naming them.
(`ModelDir.restore_newest` applies it; this module holds what it reads and returns.)
"""

import dataclasses
import json
import re
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from ctl.utils.errors import UserError

CHECKPOINT_STATE_FILE = "checkpoint"
CHECKPOINT_INDEX = re.compile(r"^(.+)-(\d+)\.index$")  # `ckpt-N.index`: the checkpoint `ckpt-N` is whole.


def checkpoint_index(prefix: str) -> str:
    """The index file of the checkpoint `prefix` (`ckpt-N.index`): there once it is whole.

    Args:
        prefix: the checkpoint's prefix (`.../ckpt-N`).
    """
    return prefix + ".index"


def checkpoint_files(prefix: str) -> List[str]:
    """The files of the checkpoint `prefix` (`ckpt-N.index`, `ckpt-N.data-*`), as listed.

    Args:
        prefix: the checkpoint's prefix (`.../ckpt-N`).
    """
    return tf.io.gfile.glob(prefix + ".*")


class UnreadableCheckpointError(UserError):
    """A checkpoint that is gone (deleted meanwhile) or cannot be read (corrupt, truncated).

    Args:
        message: what is wrong with it, and the fix.
        deleted: the checkpoint was deleted meanwhile (not damaged).
    """

    def __init__(self, message: str, deleted: bool):
        super().__init__(message)
        self.deleted = deleted


@dataclasses.dataclass(frozen=True)
class CheckpointState:
    """What the `checkpoint` state file says, read defensively.

    Args:
        latest: the path it names as the latest.
        all: every path it names.
        problem: why it cannot be used, if it cannot (None: it can).
    """

    latest: Optional[str] = None
    all: Sequence[str] = ()
    problem: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `restore_newest` restored, and what the state file should say from now on.

    Args:
        path: the checkpoint restored; None: the model dir holds no checkpoint, nothing restored.
        state_is_stale: the state file does not name `path` as the latest.
        keep: the checkpoints up to `path` to name in a rewritten state file.
    """

    path: Optional[str]
    state_is_stale: bool = False
    keep: Sequence[str] = ()


_STATE_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths): ("(?:[^"\\]|\\.)*")$'
                         r'|^(all_model_checkpoint_timestamps|last_preserved_timestamp): [-+.\deE]+$')


def parse_checkpoint_state(text: str) -> Dict[str, List[str]]:
    """The path fields of a `CheckpointState` text proto; `ValueError` on anything else.

    Args:
        text: the state file's text.
    """
    if not text.strip():
        raise ValueError("the file is empty")
    fields: Dict[str, List[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        match = _STATE_LINE.match(line)
        if not match:
            raise ValueError(f"line {number} is not a checkpoint state field: {line[:40]!r}")
        if match.group(1):
            fields.setdefault(match.group(1), []).append(json.loads(match.group(2)))
    return fields
