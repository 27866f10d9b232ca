"""A sweep's workers: which worker runs which trial, in files and records several processes share.

Each worker of a sweep dir holds a slot for its life, and each trial it claims records its owner
and a heartbeat in the study (trial system attributes, where every machine of the sweep looks):

    <sweep_dir>/workers/<slot>.lock    held (flock, `ctl.model_dir.file_lock.FileLock`) by the worker in that slot
    <sweep_dir>/workers/takeover.lock  held while a worker takes a stale trial over (a journal file's study)
    trial attribute `ctl_owner`        `host:sweep_dir:slot`, the slot that runs the trial (`OWNER`)
    trial attribute `ctl_heartbeat`    a time, renewed every `heartbeat` seconds by its owner (`HEARTBEAT`)

A worker that starts in a slot resumes the RUNNING trials of its slot (its predecessor died: kill
-9, a reboot). Before it starts a new trial, a worker takes over another's RUNNING trial whose
heartbeat is `grace` seconds old (`heartbeat_age`): under the takeover lock (`takeover_lock`: the
study's database's own lock, or for a journal file the sweep dir's `takeover.lock`) it reads the
trial again and, still stale, writes itself as the owner with a fresh heartbeat; a second worker
then finds it fresh. One worker takes each stale trial over (`ctl.sweep.study.Study.take_over_stale`;
`ctl.sweep.optuna_internals.exclusive` finds the database's engine in Optuna's storage).

One rule of the sweep's processes is not here: machines that open a new PostgreSQL study together
take turns creating Optuna's tables (`ctl.sweep.storage`, an advisory lock held while Optuna's
`RDBStorage` opens). It is Optuna's tables, not a record of ctl's, and it is taken before a sweep
refuses a changed sweep file, which answers without TensorFlow (this package imports it).

Why not the model dir's claims (`ctl.model_dir.claims`). The slot is a `FileLock`: a worker holds
it for its life and the kernel drops it when the worker dies, as a trainer's lock. The heartbeat is
not a `ctl.model_dir.lease.Lease`: a lease is a file beside a model dir, and a trial's owner must be
found where every machine of the sweep looks, the study (the database); its grace is the user's
(`--grace_seconds`); and a takeover is decided under the storage's lock, not by a lease's
write-then-read-back (two workers whose writes land within the settling time could both believe
they own the trial). Nor is it Optuna's heartbeat (`RDBStorage(heartbeat_interval=,
grace_period=)`, PostgreSQL only, with `RetryFailedTrialCallback`): Optuna ends a stale trial FAIL
and retries its values as a new trial, with a new number beyond the budget and a new model dir,
where a sweep's trial resumes from its own checkpoints under its number. The heartbeat is the
worker's clock: machines' clocks must agree to well within `grace` (cloud VMs keep theirs within
a second).
"""

import contextlib
import dataclasses
import os
import socket
import time
import zlib
from typing import Any, Iterator

from ctl.model_dir.file_lock import FileLock

WORKERS_DIR = "workers"  # In the sweep dir.
TAKEOVER_LOCK = "takeover.lock"  # In WORKERS_DIR.
# Trial system attributes.
OWNER = "ctl_owner"
HEARTBEAT = "ctl_heartbeat"


def slot_lock_file(sweep_dir: str, index: int) -> str:
    """The lock file of worker slot `index`.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        index: the slot's number.
    """
    return os.path.join(sweep_dir, WORKERS_DIR, f"{index}.lock")


def takeover_lock_file(sweep_dir: str) -> str:
    """Held while a worker takes a stale trial over (a journal file's study).

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
    """
    return os.path.join(sweep_dir, WORKERS_DIR, TAKEOVER_LOCK)


@dataclasses.dataclass(frozen=True)
class Slot:
    """A worker slot of this machine's sweep dir, held while its worker lives.

    Args:
        index: the slot's number.
        key: the slot's name in the study's records (host, sweep dir, index).
        lock: the slot's lock (a `FileLock`), held while the worker lives.
    """

    index: int
    key: str  # host:sweep_dir:index, the owner a trial records.
    lock: Any  # ctl.model_dir.file_lock.FileLock


def take_slot(sweep_dir: str) -> Slot:
    """The lowest free worker slot of `sweep_dir` (held until the process ends).

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
    """
    index = 0
    while True:
        lock = FileLock(slot_lock_file(sweep_dir, index), f"sweep worker {index}")
        if lock.try_acquire():
            return Slot(index, f"{socket.gethostname()}:{os.path.abspath(sweep_dir)}:{index}", lock)
        index += 1


@contextlib.contextmanager
def takeover_lock(lock_file: str, engine: Any = None, study_name: str = "") -> Iterator[None]:
    """Held by one worker at a time among those of a study, waited for: with the study's database
    (a PostgreSQL or MySQL `engine`), the database's own lock keyed by `study_name` (PostgreSQL: a
    transaction-scoped advisory lock; MySQL: `GET_LOCK`); else (a journal file's or SQLite's study)
    `lock_file`'s. A worker killed while it holds one releases it (its connection or its file closes).

    Args:
        lock_file: the lock file (`takeover_lock_file`) of a study in a journal file or SQLite.
        engine: the study's SQLAlchemy engine (None: a journal file's study).
        study_name: the study's name (the database lock's key).
    """
    dialect = engine.dialect.name if engine is not None else None
    if dialect in ("postgresql", "mysql"):
        from sqlalchemy import text

        key = zlib.crc32(f"ctl.sweep:{study_name}".encode())
        with engine.begin() as connection:
            if dialect == "postgresql":  # Released at the transaction's end, or its connection's.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
                yield
            else:
                connection.execute(text("SELECT GET_LOCK(:key, -1)"), {"key": str(key)})
                try:
                    yield
                finally:
                    connection.execute(text("SELECT RELEASE_LOCK(:key)"), {"key": str(key)})
        return
    lock = FileLock(lock_file, "sweep takeover")
    while not lock.try_acquire():
        time.sleep(0.05)
    try:
        yield
    finally:
        lock.release()


def heartbeat_age(trial: Any) -> float:
    """Seconds since the trial's last heartbeat (since its start without one).

    Args:
        trial: a trial of the study (an `optuna.trial.FrozenTrial`).
    """
    beat = trial.system_attrs.get(HEARTBEAT)
    if beat is None:
        start = trial.datetime_start
        beat = start.timestamp() if start else 0.0
    return time.time() - beat
