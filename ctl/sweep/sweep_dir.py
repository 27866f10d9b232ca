"""A sweep dir: what `python -m ctl.sweep` keeps in it (no Optuna needed to find it).

    <sweep_dir>/
      sweep.json              where the study is: its name, storage (no password), objective, budget
      study.journal           the study (Optuna's journal file), unless --storage names a database
      trials/<number>/        each trial's model dir (`ctl.core.model_dir`), plus
        sweep_trial.log         the trial's ctl.run output
        sweep_pruned.json       why it was pruned (`ctl.sweep.pruning`)
      workers/<slot>.lock     held (flock) by the worker in that slot
      report.png              `python -m ctl.report`'s figure
"""

import os
from typing import Any, Dict, Optional

RECORD_FILE = "sweep.json"
JOURNAL_FILE = "study.journal"
TRIALS_DIR = "trials"
WORKERS_DIR = "workers"


def is_sweep_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, RECORD_FILE))


def journal_file(sweep_dir: str) -> str:
    return os.path.join(sweep_dir, JOURNAL_FILE)


def trial_dir(sweep_dir: str, number: int) -> str:
    return os.path.join(sweep_dir, TRIALS_DIR, str(number))


def slot_lock_file(sweep_dir: str, index: int) -> str:
    return os.path.join(sweep_dir, WORKERS_DIR, f"{index}.lock")


def write_record(sweep_dir: str, record: Dict[str, Any]) -> None:
    from ctl.core.model_dir import write_json

    write_json(os.path.join(sweep_dir, RECORD_FILE), record)


def read_record(sweep_dir: str) -> Optional[Dict[str, Any]]:
    from ctl.core.model_dir import read_json

    return read_json(os.path.join(sweep_dir, RECORD_FILE))
