"""A sweep dir: what `python -m ctl.sweep` keeps in it (no Optuna needed to find it).

    <sweep_dir>/
      sweep.json              where the study is: its name, storage (no password), objective, budget,
                              the trials' dir
      study.journal           the study (Optuna's journal file), unless --storage names a database
      trials/<number>/        each trial's model dir (`ctl.model_dir`), plus
        sweep_trial.log         the trial's run's output (always here, on this machine)
        sweep_pruned.json       why it was pruned (`ctl.sweep.pruning`)
      workers/<slot>.lock     held (flock) by the worker in that slot (`ctl.model_dir.sweep_workers`)
      workers/takeover.lock   held (flock) while a worker takes a stale trial over
      report.png              `python -m ctl.report`'s figure

With `--trials_dir=gs://BUCKET/PATH` (or another directory), the trials' model
dirs, `sweep_pruned.json` included, are `<trials_dir>/<number>/` instead, read
and written through `tf.io.gfile`; `trials/<number>/` then holds only the log,
and the rest stays in the sweep dir.
"""

import os
from typing import Any, Dict, Optional

from ctl.utils.errors import UserError, first_line

RECORD_FILE = "sweep.json"
JOURNAL_FILE = "study.journal"
TRIALS_DIR = "trials"
LOG_FILE = "sweep_trial.log"


def is_sweep_dir(path: str) -> bool:
    """Whether `path` is a sweep dir (it holds the sweep's record).

    Args:
        path: a directory.
    """
    return os.path.isfile(os.path.join(path, RECORD_FILE))


def journal_file(sweep_dir: str) -> str:
    """The study's journal file in `sweep_dir` (without `--storage`).

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
    """
    return os.path.join(sweep_dir, JOURNAL_FILE)


def trial_dir(sweep_dir: str, number: int, trials_dir: Optional[str] = None) -> str:
    """Trial `number`'s model dir: in `trials_dir` if given, else in the sweep dir's `trials/`.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        number: the trial's number.
        trials_dir: `--trials_dir` (`trials_path`), or None.
    """
    return os.path.join(trials_dir or os.path.join(sweep_dir, TRIALS_DIR), str(number))


def trial_log_file(sweep_dir: str, number: int) -> str:
    """Trial `number`'s output, in the (local) sweep dir wherever its model dir is.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        number: the trial's number.
    """
    return os.path.join(sweep_dir, TRIALS_DIR, str(number), LOG_FILE)


def trials_path(trials_dir: Optional[str]) -> Optional[str]:
    """`--trials_dir` as the workers use it: a `gs://BUCKET/PATH` prefix as it is, a local
    directory made absolute (None: the sweep dir's `trials/`).

    Args:
        trials_dir: `--trials_dir`, or None.
    """
    if not trials_dir:
        return None
    return trials_dir if "://" in trials_dir else os.path.abspath(trials_dir)


def check_trials_dir(trials_dir: str) -> None:
    """Raises `UserError` (one line) if TensorFlow's file systems cannot reach `trials_dir`, its
    bucket is missing or it names a file. Imports TensorFlow; writes nothing.

    Args:
        trials_dir: `--trials_dir`.
    """
    import tensorflow as tf

    path = trials_path(trials_dir)
    fix = "name a gs://BUCKET/PATH prefix in an existing bucket, or a local directory"
    try:
        if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
            raise UserError(f"--trials_dir={trials_dir} is a file; {fix}.")
        if "://" in path:
            scheme, rest = path.split("://", 1)
            bucket = f"{scheme}://{rest.split('/', 1)[0]}"
            if not tf.io.gfile.isdir(bucket):
                raise UserError(f"--trials_dir={trials_dir}: the bucket {bucket} does not exist "
                                f"or cannot be read; {fix}.")
    except tf.errors.OpError as error:
        raise UserError(f"--trials_dir={trials_dir}: {first_line(error)}; {fix}.") from None


def write_record(sweep_dir: str, record: Dict[str, Any]) -> None:
    """Writes the sweep's record (`sweep.json`), atomically.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        record: the record.
    """
    from ctl.model_dir import write_json

    write_json(os.path.join(sweep_dir, RECORD_FILE), record)


def read_record(sweep_dir: str) -> Optional[Dict[str, Any]]:
    """The sweep's record, or None.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
    """
    from ctl.model_dir import read_json

    return read_json(os.path.join(sweep_dir, RECORD_FILE))
