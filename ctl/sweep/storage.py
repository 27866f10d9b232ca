"""Where a sweep's study is stored, and the record that says where.

By default the study is Optuna's journal file `<sweep_dir>/study.journal`
(`JournalFileBackend`: appends under a lock file, so the worker processes of one
machine share it). `--storage=postgresql://USER@HOST:PORT/DB` puts it in
PostgreSQL (Optuna's `RDBStorage`, SQLAlchemy with psycopg 3: the URL's scheme
becomes `postgresql+psycopg://`): the same command on several machines works one
study. `<sweep_dir>/sweep.json` records where the study is (the URL without its
password), for `python -m ctl.report`.
"""

import os
import time
import urllib.parse
from typing import Optional

import optuna

from ctl.utils.errors import UserError, first_line
from ctl.sweep import sweep_dir as layout
from ctl.sweep.sweep_file import SweepFile


def storage_url(storage: Optional[str]) -> Optional[str]:
    """The SQLAlchemy URL of a `--storage` (`postgresql://` becomes `postgresql+psycopg://`).

    Args:
        storage: `--storage`, or None.
    """
    if not storage:
        return None
    scheme, sep, rest = storage.partition("://")
    if not sep:
        raise UserError(f"--storage={storage} is not a URL; use postgresql://USER@HOST:PORT/DB "
                        "(or leave it out for a journal file in --sweep_dir).")
    if scheme in ("postgresql", "postgres"):
        return f"postgresql+psycopg://{rest}"
    if scheme in ("postgresql+psycopg", "sqlite", "mysql+pymysql"):
        return storage
    raise UserError(f"--storage={storage}: unknown scheme {scheme!r}; use postgresql://USER@HOST:"
                    "PORT/DB (or leave it out for a journal file in --sweep_dir).")


def without_password(url: str) -> str:
    """`url` with its password, if any, as `***` (what the record and the console show).

    Args:
        url: a database URL.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def open_storage(sweep_dir: str, storage: Optional[str]) -> optuna.storages.BaseStorage:
    """The study's storage: the journal file in `sweep_dir`, or the database at `storage`.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        storage: the sweep's `--storage` (None: the journal file in the sweep dir).
    """
    url = storage_url(storage)
    if url is None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        os.makedirs(sweep_dir, exist_ok=True)
        return JournalStorage(JournalFileBackend(layout.journal_file(sweep_dir)))
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        except Exception as error:  # noqa: BLE001 - SQLAlchemy's and the driver's errors alike.
            # Machines that start together race to create the tables: the loser sees a
            # duplicate key, and finds the tables there when it looks again.
            if "duplicate key" in str(error) and attempt < 4:
                time.sleep(1 + attempt)
                continue
            raise UserError(f"cannot open --storage={without_password(storage)} "
                            f"({first_line(error)}); check the server, the user and the database."
                            ) from error
    raise AssertionError("unreachable: the last attempt returns or raises")


def write_record(sweep_dir: str, sweep: SweepFile, storage: Optional[str],
                 trials_dir: Optional[str] = None) -> None:
    """`<sweep_dir>/sweep.json`: the study's name and storage (no password), the objective, and
    where the trials' model dirs go (None: `<sweep_dir>/trials`).

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        sweep: the parsed sweep file.
        storage: the sweep's `--storage` (None: the journal file in the sweep dir).
        trials_dir: `--trials_dir` (None: the sweep dir's `trials/`).
    """
    layout.write_record(sweep_dir, {
        "study": sweep.study, "storage": without_password(storage) if storage else None,
        "objective": sweep.objective, "direction": sweep.direction, "trials": sweep.trials,
        "sweep_file": os.path.abspath(sweep.path), "trials_dir": trials_dir})
