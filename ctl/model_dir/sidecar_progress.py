"""`eval/sidecar_progress.json`: what a sidecar evaluator did with each checkpoint, for the sidecar after it.

The sidecar writes it, atomically, after each checkpoint it handled (evaluated, failed, deleted
or skipped), and each evaluation's line in `eval/metrics.jsonl` before it. A sidecar started again
(a restart, a preempted evaluator VM, another host) reads both: a checkpoint whose line is there
counts as evaluated even when a kill came between the line and this file, and a damaged file
counts as empty (the metrics file still says what was evaluated). What each outcome means is the
sidecar's (`ctl.sidecar.scheduler.Progress`); where the file is and how it is shared, here. A
continuous fine-tuning job (`ctl.sidecar.continuous_finetune`) keeps its record of the watched
run's checkpoints in its own model dir the same way, a fine-tune for an evaluation.
"""

from typing import Any, Dict, List, Tuple

from ctl.model_dir.files import read_json, write_json
from ctl.model_dir.layout import EVAL_DIR, ModelDir

SIDECAR_PROGRESS_FILE = "sidecar_progress.json"  # In the eval dir: what the sidecar did with each checkpoint.


def progress_file(directory: ModelDir) -> str:
    """`<model_dir>/eval/sidecar_progress.json`.

    Args:
        directory: the model dir the sidecar evaluates.
    """
    return directory.file(EVAL_DIR, SIDECAR_PROGRESS_FILE)


def read_progress(directory: ModelDir) -> Tuple[Any, List[int]]:
    """The progress record as written (None without one; a damaged file's value as it parsed),
    and the numbers of the checkpoints `eval/metrics.jsonl` records as evaluated.

    Args:
        directory: the model dir the sidecar evaluates.
    """
    return (read_json(progress_file(directory)),
            [int(record["number"]) for record in directory.sidecar_evaluations()])


def write_progress(directory: ModelDir, record: Dict[str, Any]) -> None:
    """Writes the progress record, atomically (after the metrics line of what it records).

    Args:
        directory: the model dir the sidecar evaluates.
        record: the progress, as `ctl.sidecar.scheduler.Progress.to_record` gives it.
    """
    write_json(progress_file(directory), record)
