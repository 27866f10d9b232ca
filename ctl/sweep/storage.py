"""Where a sweep's study is stored, and the record that says where.

By default the study is Optuna's journal file `<sweep_dir>/study.journal`
(`JournalFileBackend`: appends under a lock file, so the worker processes of one
machine share it). `--storage=postgresql://USER@HOST:PORT/DB` puts it in
PostgreSQL (Optuna's `RDBStorage`, SQLAlchemy with psycopg 3: the URL's scheme
becomes `postgresql+psycopg://`): the same command on several machines works one
study. `<sweep_dir>/sweep.json` records where the study is (the URL without its
password), for `python -m ctl.report`.
"""

import contextlib
import os
import urllib.parse
import zlib
from typing import Iterator, Optional

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
    try:
        with _tables_made_one_at_a_time(url):
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    except Exception as error:  # noqa: BLE001 - SQLAlchemy's and the driver's errors alike.
        raise UserError(f"cannot open --storage={without_password(storage)} "
                        f"({first_line(error)}); check the server, the user and the database."
                        ) from error


# The key of the PostgreSQL advisory lock that machines opening one database take in turn. The sweep's other
# cross-process rules are in ctl.model_dir.sweep_workers; this one stays beside the opening it guards, which
# `check_existing` does before TensorFlow is imported (that package imports it): its docstring says so.
_TABLES_LOCK = zlib.crc32(b"ctl.sweep.storage: Optuna's tables")


@contextlib.contextmanager
def _tables_made_one_at_a_time(url: str) -> Iterator[None]:
    """Holds a PostgreSQL session lock of the database while the caller opens `RDBStorage`,
    which creates Optuna's tables when they are missing: machines that start together would
    race to create them (the loser fails on a table or a key that now exists). Other databases:
    nothing to hold.

    Args:
        url: the SQLAlchemy URL.
    """
    if not url.startswith("postgresql"):
        yield
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"),
                               {"key": _TABLES_LOCK})
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"),
                                   {"key": _TABLES_LOCK})
    finally:
        engine.dispose()


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
