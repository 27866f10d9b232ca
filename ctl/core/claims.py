"""Claims on a model dir: which process is the trainer, which runs the eval-side hooks,
whether a sidecar evaluator serves it.

    claim = claim_for(ModelDir(d).trainer_lock_file, "trainer", wait=True)
    if not claim.try_acquire():
        ...  # claim.holder() names the live process that has it

Two kinds, one interface (`try_acquire`, `release`, `held`, `held_elsewhere`,
`holder`, `holder_role`). A process that only asks whether someone live holds
a claim calls `held_elsewhere()` and takes nothing: a trainer asks so of the
sidecar evaluator's announcement, a `Lease` on every storage
(`ctl.sidecar.announce`).

- `FileLock`, on a file system (local disk, NFSv4): an exclusive `flock` on the
  claim's file. The kernel drops it when the holder ends, however it ends
  (exit, exception, SIGKILL), so a restart is never blocked.
- `Lease`, in an object store (`gs://`, `s3://`), which has no lock: a JSON
  record `{"role", "pid", "host", "token", "since", "renewed"}` at the claim's
  path that the holder renews every `RENEW_SECONDS` from a thread of its own
  and deletes when it releases. Another process takes the claim when there is
  no record, or when the record is stale: not renewed for `STALE_SECONDS`, or
  left by a process of this host that is gone. A taker writes its record,
  waits `SETTLE_SECONDS` and reads it back: of two processes that write in that
  window, the later record wins and the other backs off.

What a lease cannot promise (docs/faults.md, "One trainer per model dir"):
it needs the hosts' clocks to agree within `STALE_SECONDS` (cloud VMs keep
theirs within a second); two takers whose write and read-back are more than
`SETTLE_SECONDS` apart can both believe they hold it; a holder frozen for
longer than `STALE_SECONDS` (SIGSTOP, a VM pause) loses it to a taker and
finds out at its next renewal, which logs a WARNING and stops renewing. With
`wait=True` (the trainer's lock) a taker that finds a fresh record of another
host watches it for up to `STALE_SECONDS`: renewed means live (refused), not
renewed means its holder is gone (taken), so a trainer restarted on a new host
after a SIGKILL waits at most that long instead of being refused.
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
from typing import Any, Dict, Optional

import tensorflow as tf

from ctl.core import console
from ctl.core.model_dir import ModelDir, is_object_store, read_text, write_atomically

RENEW_SECONDS = 5.0
STALE_SECONDS = 30.0
SETTLE_SECONDS = 1.0
READ_ATTEMPTS = 3

_HELD_HERE: Dict[str, str] = {}  # path -> token of each lease this process holds.


def claim_for(path: str, role: str, wait: bool = False):
    """A `Lease` for a path in an object store, else a `FileLock`."""
    return Lease(path, role, wait=wait) if is_object_store(path) else FileLock(path, role)


def eval_hooks_claim(model_dir: str, role: str):
    """The claim on the eval-side hooks of `model_dir` (best checkpoint, exports, early
    stopping): whichever process takes it first runs them, the other none (docs/comforts.md)."""
    return claim_for(ModelDir(model_dir).eval_hooks_lock_file, role)


def _holder_record(role: str, token: Optional[str] = None) -> Dict[str, Any]:
    return {"role": role, "pid": os.getpid(), "host": socket.gethostname(),
            "token": token, "renewed": time.time(),
            "since": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _describe(record: Any, path: str) -> str:
    try:
        return f"pid {record['pid']} on host {record['host']} since {record['since']}"
    except (KeyError, TypeError):
        return f"holder unknown, see {path}"


def _role(record: Any) -> str:
    role = record.get("role") if isinstance(record, dict) else None
    return role if isinstance(role, str) else "another process"


class FileLock:
    """An exclusive `flock` on a local file, with its holder recorded in it."""

    def __init__(self, path: str, role: str):
        self.path = path
        self.role = role
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder_record(self.role)) + "\n").encode(), 0)
        self._fd = fd
        return True

    def held_elsewhere(self) -> bool:
        """Whether another live process holds it now; creates and changes nothing."""
        if self._fd is not None or not os.path.exists(self.path):
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            return True
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
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
        self._stop: Optional[threading.Event] = None
        self._renewer: Optional[threading.Thread] = None

    @property
    def held(self) -> bool:
        return self._stop is not None

    def try_acquire(self) -> bool:
        if self.held:
            return True
        record = self._read()
        if record and not self._stale(record):
            if not (self.wait and self._watch_until_stale(record)):
                self._seen = record
                return False
        tf.io.gfile.makedirs(os.path.dirname(self.path))
        self._write()
        time.sleep(SETTLE_SECONDS)
        self._seen = self._read()
        if self._seen.get("token") != self.token:
            return False
        self._stop = threading.Event()
        _HELD_HERE[self.path] = self.token
        self._renewer = threading.Thread(target=self._renew, args=(self._stop,), daemon=True,
                                         name=f"ctl-lease-{self.role}")
        self._renewer.start()
        return True

    def held_elsewhere(self) -> bool:
        """Whether another live process holds it now (with `wait`: watched until renewed or
        stale); writes nothing."""
        if self.held:
            return False
        record = self._read()
        if not record or self._stale(record):
            return False
        self._seen = record
        return not (self.wait and self._watch_until_stale(record))

    def release(self) -> None:
        if self._stop is None:
            return
        self._stop.set()
        self._stop = None
        _HELD_HERE.pop(self.path, None)
        # Not left inside a write while the interpreter exits (TensorFlow aborts then).
        self._renewer.join(timeout=STALE_SECONDS)
        try:
            record = self._read()
            if record.get("token") == self.token:
                tf.io.gfile.remove(self.path)
        except tf.errors.OpError as error:  # Best effort: it goes stale on its own.
            console.warning("lock", "could not delete %s (%s); it goes stale in %g s.",
                            self.path, str(error).splitlines()[0], STALE_SECONDS)

    def holder(self) -> str:
        return _describe(self._seen, self.path)

    def holder_role(self) -> str:
        return _role(self._seen)

    def _read(self) -> Dict[str, Any]:
        """The record ({} when there is none). A read that fails is tried again (a store under
        load answers an error now and then); a record still unreadable is garbage, taken as {}
        with the `renewed` it lacks, so it goes stale."""
        for attempt in range(READ_ATTEMPTS):
            try:
                text = read_text(self.path)
                if text is None:
                    return {}
                record = json.loads(text)
                return record if isinstance(record, dict) else {"garbage": text[:80]}
            except ValueError as error:  # json.JSONDecodeError is one.
                problem = error
                time.sleep(0.5 * (attempt + 1))
        console.warning("lock", "%s is unreadable (%s): taken as stale.", self.path, problem)
        return {"garbage": str(problem)}

    def _write(self) -> None:
        write_atomically(self.path, json.dumps(_holder_record(self.role, self.token)) + "\n")

    def _stale(self, record: Dict[str, Any]) -> bool:
        if record.get("token") == self.token:
            return True
        if self.path in _HELD_HERE and record.get("token") == _HELD_HERE[self.path]:
            return False  # Another claim of this process holds it.
        if record.get("host") == socket.gethostname() and not _alive(record.get("pid")):
            return True  # Its holder, on this host, is gone (a SIGKILL, a crash).
        renewed = record.get("renewed")
        return not isinstance(renewed, (int, float)) or time.time() - renewed > STALE_SECONDS

    def _watch_until_stale(self, record: Dict[str, Any]) -> bool:
        """Watches another host's fresh record: True once it went unrenewed for
        `STALE_SECONDS` (its holder is gone), False as soon as it is renewed."""
        console.info("lock", "%s is held by the %s (%s); waiting up to %g s to see whether it "
                     "is still alive", self.path, _role(record), _describe(record, self.path),
                     STALE_SECONDS)
        deadline = time.monotonic() + STALE_SECONDS
        while time.monotonic() < deadline:
            time.sleep(min(RENEW_SECONDS, max(0.0, deadline - time.monotonic())))
            now = self._read()
            if not now:
                return True  # Released meanwhile.
            if now.get("renewed") != record.get("renewed") or now.get("token") != record.get(
                    "token"):
                self._seen = now
                return False
        return True

    def _renew(self, stop: threading.Event) -> None:
        while not stop.wait(RENEW_SECONDS):
            try:
                record = self._read()
                if record and record.get("token") != self.token:
                    self.lost = True
                    self._seen = record
                    console.warning("lock", "lost %s to the %s (%s): another process took this "
                                  "model dir's %s claim; stop one of them.", self.path,
                                  _role(record), _describe(record, self.path), self.role)
                    return
                self._write()
            except tf.errors.OpError as error:  # The next renewal tries again.
                console.warning("lock", "could not renew %s (%s)", self.path,
                                str(error).splitlines()[0])


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
