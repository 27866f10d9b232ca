"""Claims on a model dir: which process is the trainer, which runs the eval-side hooks,
whether a sidecar evaluator serves it.

    claim = claim_for(ModelDir(d).trainer_lock_file, "trainer", wait=True)
    if not claim.try_acquire():
        ...  # claim.holder() names the live process that has it

Two kinds, one interface (`Claim`: `try_acquire`, `release`, `held`,
`held_elsewhere`, `holder`, `holder_role`, `lost`, `read_error`). A process
that only asks whether someone live holds a claim calls `held_elsewhere()` and
takes nothing: a trainer asks so of the evaluator role's record
(`ctl.core.evaluator_role`).

- `FileLock`, on a file system (local disk, NFSv4): an exclusive `flock` on the
  claim's file. The kernel drops it when the holder ends, however it ends
  (exit, exception, SIGKILL), so a restart is never blocked.
- `Lease`, in an object store (`gs://`, `s3://`), which has no lock: a JSON
  record `{"role", "pid", "host", "boot_id", "pid_namespace", "process", "token",
  "since", "renewed"}` at the claim's path that the holder renews every `RENEW_SECONDS`
  from a thread of its own and deletes when it releases. Another process takes
  the claim when there is no record, or when the record is stale: not renewed
  for `STALE_SECONDS`, or left by a process that is gone, which is only told by
  its pid when the record's host, boot id and PID namespace are this process's
  (two containers of one pod share a host name, not their PIDs: there only the
  renewals tell; a record of this very process, its `process` nonce, is live while
  renewed). A taker writes its record, waits `SETTLE_SECONDS` and reads
  it back: of two processes that write in that window, the later record wins
  and the other backs off.

A record the store does not answer for (an error after `READ_ATTEMPTS` reads)
is unknown, never stale and never lost: a taker refuses (with `wait`, the
trainer's lock, it raises the store's error: a storage fault, exit 74), a holder
tries again at its next renewal. Only a record with another token is a loss; a
record that is not JSON has no `renewed` and is stale. `release` lets a renewal
in flight land (up to `RELEASE_SECONDS`) before it deletes its own record (the
token compared), so no renewal rewrites it afterwards.

What a lease cannot promise (docs/faults.md, "One trainer per model dir"):
it needs the hosts' clocks to agree within `STALE_SECONDS` (cloud VMs keep
theirs within a second); two takers whose write and read-back are more than
`SETTLE_SECONDS` apart can both believe they hold it; a holder frozen for
longer than `STALE_SECONDS` (SIGSTOP, a VM pause) loses it to a taker and
finds out at its next renewal, which logs a WARNING, stops renewing and sets
`lost`: the eval-side hooks stop there (`ctl.core.evaluator_role`), a
trainer stops at its next train loop's end, before its checkpoint, with exit 2
(`ctl.faults.lock.ModelDirLock.stop_if_taken`). With `wait=True` (the trainer's lock) a
taker that finds a fresh record of another host watches it for up to
`STALE_SECONDS`: renewed means live (refused), not renewed means its holder is
gone (taken), so a trainer restarted on a new host after a SIGKILL waits at
most that long instead of being refused.

Tests (tests/test_claims.py unless named): another PID namespace
(`test_a_renewed_record_of_this_host_in_another_pid_namespace_is_not_taken`),
reads answered 503 (`test_a_record_the_bucket_cannot_read_is_neither_taken_nor_lost`),
a release during an upload (`test_a_lease_released_while_a_renewal_uploads_leaves_no_record`),
a lost lease (`test_eval_side_hooks_stop_once_their_lease_is_taken`,
tests/test_gcs_model_dir.py::test_a_trainer_whose_bucket_lease_is_taken_stops_before_its_next_checkpoint).
"""

import datetime
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Dict, Optional, Protocol

import tensorflow as tf

from ctl.utils import console
from ctl.utils.errors import first_line
from ctl.core.model_dir import is_object_store, read_bytes, write_atomically

RENEW_SECONDS = 5.0
STALE_SECONDS = 30.0
SETTLE_SECONDS = 1.0
READ_ATTEMPTS = 3
RELEASE_SECONDS = 60.0  # How long `release` waits for a renewal in flight.

# Told apart from a former process of the same pid (its record, left by a kill, is stale).
_PROCESS = uuid.uuid4().hex


class Claim(Protocol):
    """What both kinds answer (eager, host only)."""

    path: str
    role: str

    @property
    def held(self) -> bool: ...
    @property
    def lost(self) -> bool:
        """Another process took it while this one held it (a lease only)."""
    @property
    def read_error(self) -> Optional[Exception]:
        """Why the last read of its record failed (a lease only): its holder is unknown."""
    def try_acquire(self) -> bool: ...
    def held_elsewhere(self) -> bool: ...
    def release(self) -> None: ...
    def holder(self) -> str: ...
    def holder_role(self) -> str: ...


def claim_for(path: str, role: str, wait: bool = False, transient: bool = False) -> Claim:
    """A `Lease` for a path in an object store (its record always deleted on release), else a
    `FileLock` (`transient`: its file deleted on release)."""
    if is_object_store(path):
        return Lease(path, role, wait=wait)
    return FileLock(path, role, transient=transient)


def _boot_id() -> Optional[str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> Optional[str]:
    try:
        return os.readlink("/proc/self/ns/pid")  # e.g. "pid:[4026531836]"
    except OSError:
        return None


def _holder_record(role: str, token: Optional[str] = None) -> Dict[str, Any]:
    return {"role": role, "pid": os.getpid(), "host": socket.gethostname(),
            "boot_id": _boot_id(), "pid_namespace": _pid_namespace(), "process": _PROCESS,
            "token": token, "renewed": time.time(),
            "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _pids_comparable(record: Dict[str, Any]) -> bool:
    """Whether `record`'s pid names a process this one can see: the same host, the same boot
    and the same PID namespace. Two containers of one pod share the host name, not the PIDs."""
    here = (socket.gethostname(), _boot_id(), _pid_namespace())
    return None not in here[1:] and (record.get("host"), record.get("boot_id"),
                                     record.get("pid_namespace")) == here


def _describe(record: Any, path: str) -> str:
    if isinstance(record, dict) and "unreadable" in record:
        return f"holder unknown: {path} could not be read ({record['unreadable']})"
    try:
        return f"pid {record['pid']} on host {record['host']} since {record['since']}"
    except (KeyError, TypeError):
        return f"holder unknown, see {path}"


def _role(record: Any) -> str:
    role = record.get("role") if isinstance(record, dict) else None
    return role if isinstance(role, str) else "another process"


class FileLock:
    """An exclusive `flock` on a local file, with its holder recorded in it. The kernel
    drops it with its holder: never lost, and its record is always readable.

    A `transient` lock's file exists only while it is held: its holder deletes it
    when it releases (a kill leaves it, not held), and a taker's file appears at
    the path with its record whole, so a reader that finds it held can read who
    holds it (the evaluator role decides by that). A taker holds the file at the
    path only: one it locked after the holder deleted it is let go, and the path's
    new file tried.
    """

    lost = False
    read_error = None

    def __init__(self, path: str, role: str, transient: bool = False):
        self.path = path
        self.role = role
        self.transient = transient
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if self.transient:
            return self._take_whole()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _flock(fd):
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, _record_line(self.role), 0)
        self._fd = fd
        return True

    def _take_whole(self) -> bool:
        """A transient lock: its file appears at the path with its record whole (written
        aside, then linked, or renamed over a free file left by a kill while that file's
        lock is held), so a reader never finds it held without a holder named."""
        while True:
            try:
                old = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                old = None
            if old is not None and not _flock(old):
                os.close(old)
                return False
            if old is not None and not _same_file(old, self.path):
                os.close(old)  # Deleted by its releasing holder meanwhile: the path's new file.
                continue
            fd, aside = _record_aside(self.path, self.role)
            try:
                if old is None:
                    os.link(aside, self.path)  # Fails if a taker's file appeared meanwhile.
                else:
                    os.rename(aside, self.path)  # This process holds the file it replaces.
            except FileExistsError:
                os.close(fd)
                continue
            finally:
                if old is not None:
                    os.close(old)
                if os.path.exists(aside):
                    os.remove(aside)
            self._fd = fd
            return True

    def held_elsewhere(self) -> bool:
        """Whether another live process holds it now; creates and changes nothing. A file
        found free after a taker replaced it (a transient lock) is looked at again."""
        if self._fd is not None:
            return False
        while True:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return False
            try:
                if not _flock(fd):
                    return True
                fcntl.flock(fd, fcntl.LOCK_UN)
                if not self.transient or _same_file(fd, self.path):
                    return False
            finally:
                os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            if self.transient:
                try:
                    os.remove(self.path)  # Still held: no taker has this file yet.
                except FileNotFoundError:
                    pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def holder(self) -> str:
        """`pid 4242 on host worker-3 since ...`, from the file (best effort)."""
        return _describe(self._record(), self.path)

    def holder_role(self) -> str:
        """The role the holder recorded (e.g. `sidecar evaluator`), best effort."""
        return _role(self._record())

    def _record(self) -> Any:
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read().decode() or "{}")
        except (OSError, ValueError):
            return {}


class Lease:
    """A claim in an object store: a record its holder renews, taken over once stale."""

    def __init__(self, path: str, role: str, wait: bool = False):
        self.path = path
        self.role = role
        self.wait = wait
        self.token = uuid.uuid4().hex
        self.lost = False  # Another process took it while this one held it.
        self._seen: Any = {}  # The last record read.
        self.read_error: Optional[tf.errors.OpError] = None  # Why the last read failed.
        self._stop: Optional[threading.Event] = None
        self._renewer: Optional[threading.Thread] = None

    @property
    def held(self) -> bool:
        return self._stop is not None

    def try_acquire(self) -> bool:
        """Takes it if there is no record or a stale one. A record that cannot be read (the
        store answers errors) is never taken: refused, or with `wait` its error is raised
        (the trainer ends with a storage fault)."""
        if self.held:
            return True
        record = self._read()
        if record is None:
            return self._unknown()
        if record and not self._stale(record):
            self._seen = record
            gone = self._watch_until_stale(record) if self.wait else False
            if gone is None:
                return self._unknown()
            if not gone:
                return False
        tf.io.gfile.makedirs(os.path.dirname(self.path))
        self._write()
        time.sleep(SETTLE_SECONDS)
        seen = self._read()
        if seen is None:  # Its record, unrenewed, goes stale.
            return self._unknown()
        self._seen = seen
        if seen.get("token") != self.token:
            return False
        self.lost = False  # A new holding.
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, args=(self._stop,), daemon=True,
                                         name=f"ctl-lease-{self.role}")
        self._renewer.start()
        return True

    def held_elsewhere(self) -> bool:
        """Whether another live process holds it now (with `wait`: watched until renewed or
        stale); writes nothing. A record that cannot be read counts as not held, or with
        `wait` its error is raised."""
        if self.held:
            return False
        record = self._read()
        if record is None:
            return self._unknown()
        if not record or self._stale(record):
            return False
        self._seen = record
        gone = self._watch_until_stale(record) if self.wait else False
        return self._unknown() if gone is None else not gone

    def _unknown(self) -> bool:
        """Whether the record is there and live is unknown: refused (False), or raised."""
        if self.wait:
            raise self.read_error
        self._seen = {"unreadable": first_line(self.read_error)}
        return False

    def release(self) -> None:
        if self._stop is None:
            return
        self._stop.set()
        self._stop = None
        # A renewal in flight lands first: written after the delete, it would leave a record
        # that holds others off until it goes stale (and TensorFlow aborts an interpreter
        # that exits inside a write).
        self._renewer.join(timeout=RELEASE_SECONDS)
        if self._renewer.is_alive():
            console.warning("lock", "a renewal of %s is still being written after %g s: left "
                            "there, it goes stale in %g s.", self.path, RELEASE_SECONDS,
                            STALE_SECONDS)
            return
        try:
            record = self._read() or {}
            if record.get("token") == self.token:
                tf.io.gfile.remove(self.path)
        except tf.errors.OpError as error:  # Best effort: it goes stale on its own.
            console.warning("lock", "could not delete %s (%s); it goes stale in %g s.",
                            self.path, first_line(error), STALE_SECONDS)

    def holder(self) -> str:
        return _describe(self._seen, self.path)

    def holder_role(self) -> str:
        return _role(self._seen)

    def _read(self) -> Optional[Dict[str, Any]]:
        """The record: {} when there is none; None when the store does not answer after
        `READ_ATTEMPTS` tries (`read_error` says why): unknown, which is never taken for a
        stale record nor for a lost one. A record that is not a JSON object is
        `{"garbage": ...}`: it lacks `renewed`, so it is stale."""
        for attempt in range(READ_ATTEMPTS):
            if attempt:
                time.sleep(0.5 * attempt)
            try:
                if not tf.io.gfile.exists(self.path):
                    return {}
                data = read_bytes(self.path)
            except tf.errors.NotFoundError:
                return {}  # Deleted between the two calls.
            except tf.errors.OpError as error:  # A store under load answers an error now and then.
                self.read_error = error
                continue
            self.read_error = None
            try:
                record = json.loads(data.decode("utf-8"))
            except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are ones.
                record = None
            return record if isinstance(record, dict) else {
                "garbage": data[:80].decode("utf-8", "replace")}
        return None

    def _write(self) -> None:
        write_atomically(self.path, json.dumps(_holder_record(self.role, self.token)) + "\n")

    def _stale(self, record: Dict[str, Any]) -> bool:
        if record.get("token") == self.token:
            return True
        if record.get("process") == _PROCESS and record.get("pid") == os.getpid():
            pass  # Another claim of this process: live while renewed.
        elif _pids_comparable(record) and not _alive(record.get("pid")):
            return True  # Its holder, on this host and in these PIDs, is gone (a SIGKILL).
        renewed = record.get("renewed")
        return not isinstance(renewed, (int, float)) or time.time() - renewed > STALE_SECONDS

    def _watch_until_stale(self, record: Dict[str, Any]) -> Optional[bool]:
        """Watches another host's fresh record: True once it went unrenewed for
        `STALE_SECONDS` (its holder is gone), False as soon as it is renewed, None if it
        could not be read at the end (unknown)."""
        console.info("lock", "%s is held by the %s (%s); waiting up to %g s to see whether it "
                     "is still alive", self.path, _role(record), _describe(record, self.path),
                     STALE_SECONDS)
        deadline = time.monotonic() + STALE_SECONDS
        now: Optional[Dict[str, Any]] = record
        while time.monotonic() < deadline:
            time.sleep(min(RENEW_SECONDS, max(0.0, deadline - time.monotonic())))
            now = self._read()
            if now is None:
                continue  # Unknown this time: the next read may tell.
            if not now:
                return True  # Released meanwhile.
            if now.get("renewed") != record.get("renewed") or now.get("token") != record.get(
                    "token"):
                self._seen = now
                return False
        return None if now is None else True

    def _renew(self, stop: threading.Event) -> None:
        """Every `RENEW_SECONDS`: rewrites the record, unless another process's record
        (another token) replaced it: then `lost`, and renewing ends. A read or a write that
        fails is tried again at the next renewal."""
        while not stop.wait(RENEW_SECONDS):
            record = self._read()
            if record is None:
                console.warning("lock", "could not read %s to renew it (%s); trying again in %g s",
                                self.path, first_line(self.read_error), RENEW_SECONDS)
                continue
            token = record.get("token")
            if isinstance(token, str) and token != self.token:
                self.lost = True
                self._seen = record
                console.warning("lock", "lost %s to the %s (%s): another process took this "
                                "model dir's %s claim; stop one of them.", self.path,
                                _role(record), _describe(record, self.path), self.role)
                return
            if stop.is_set():  # Released while it read: no write after the delete.
                return
            try:
                self._write()
            except tf.errors.OpError as error:  # The next renewal tries again.
                console.warning("lock", "could not renew %s (%s)", self.path, first_line(error))


def _flock(fd: int) -> bool:
    """Takes the exclusive `flock` on `fd` if it is free (False: another open file holds it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _record_line(role: str) -> bytes:
    return (json.dumps(_holder_record(role)) + "\n").encode()


def _record_aside(path: str, role: str):
    """A new file beside `path` holding this process's record, its `flock` taken: (fd, name)."""
    aside = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(aside, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    _flock(fd)  # A new file: nobody else has it.
    os.write(fd, _record_line(role))
    return fd, aside


def _same_file(fd: int, path: str) -> bool:
    """Whether the open file `fd` is the file at `path` now."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # This process is not the holder it recorded: a former life of this PID.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
