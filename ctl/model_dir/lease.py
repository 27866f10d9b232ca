"""`Lease`: a claim in an object store (`gs://`, `s3://`), which has no lock: a record
its holder renews, taken over once stale (`ctl.model_dir.claims` tells the protocol and
what it cannot promise)."""

import json
import math
import os
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from ctl.model_dir import holders
from ctl.model_dir.files import is_object_store, read_bytes, write_atomically
from ctl.utils import console
from ctl.utils.errors import first_line

RENEW_SECONDS = 5.0
STALE_SECONDS = 30.0
SETTLE_SECONDS = 1.0
READ_ATTEMPTS = 3
RELEASE_SECONDS = 60.0  # How long `release` waits for a renewal in flight.


class Lease:
    """A claim in an object store: a record its holder renews, taken over once stale.

    Args:
        path: the record's object.
        role: what the holder is, as its record names it.
        wait: watch a fresh record of another host for up to `STALE_SECONDS` before refusing (the trainer's lock).
    """

    def __init__(self, path: str, role: str, wait: bool = False):
        self.path = path
        self.role = role
        self.wait = wait
        self.token = uuid.uuid4().hex
        self.lost = False  # Another process took it while this one held it.
        self._seen: Any = {}  # The last record read.
        self.read_error: Optional[tf.errors.OpError] = None  # Why the last read failed.
        self._written_at = -math.inf  # When this holder last wrote its record (monotonic).
        self._stop: Optional[threading.Event] = None
        self._renewer: Optional[threading.Thread] = None
        self._ending = False  # Its holder releases it soon (`ending`).
        self._replaced: Optional[bytes] = None  # The record the last take wrote over (`undo`).
        # `held_elsewhere`'s last read when it found the claim free: (when, record, its bytes).
        self._looked: Optional[Tuple[float, Dict[str, Any], list]] = None

    @property
    def held(self) -> bool:
        return self._stop is not None

    def try_acquire(self, while_settling: Optional[Callable[[], None]] = None) -> bool:
        """Takes it if there is no record or a stale one. A record that cannot be read (the
        store answers errors) is never taken: refused, or with `wait` its error is raised
        (the trainer ends with a storage fault).

        Args:
            while_settling: work that writes nothing to the store, run while the record
                settles (`SETTLE_SECONDS`) instead of after it, whether or not it is then
                taken; an error it raises is raised once the lease is decided (and held,
                for its holder to release, or to `undo` to leave the store as it was).
        """
        if self.held:
            return True
        looked, self._looked = self._looked, None
        if looked is not None and time.monotonic() - looked[0] < SETTLE_SECONDS / 2:
            # `held_elsewhere` found it free just now: a record written since is caught by the
            # read-back, as one written after a read here would be (both are written within
            # `SETTLE_SECONDS` of this one, so one of the two takers reads the other's back).
            _, record, found = looked
        else:
            found = []  # The record's bytes, if there is one.
            record = self._read(found)
        if record is None:
            return self._unknown()
        if record and not self._stale(record):
            self._seen = record
            gone = self._watch_until_stale(record) if self.wait else False
            if gone is None:
                return self._unknown()
            if not gone:
                return False
        if not is_object_store(self.path):  # An object needs no directory.
            tf.io.gfile.makedirs(os.path.dirname(self.path))
        self._replaced = found[0] if record else None
        self._ending = False
        self._write()
        settled = time.monotonic() + SETTLE_SECONDS
        failed: Optional[BaseException] = None
        if while_settling is not None:
            try:
                while_settling()
            except BaseException as error:  # Raised once the lease is decided.
                failed = error
        time.sleep(max(0.0, settled - time.monotonic()))
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
        if failed is not None:
            raise failed
        return True

    def held_elsewhere(self) -> bool:
        """Whether another live process holds it now (with `wait`: watched until renewed or
        stale); writes nothing. A record that cannot be read counts as not held, or with
        `wait` its error is raised."""
        if self.held:
            return False
        started, found = time.monotonic(), []
        record = self._read(found)
        if record is None:
            return self._unknown()
        if not record or self._stale(record):
            self._looked = (started, record, found)  # For a `try_acquire` that follows at once.
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

    def ending(self) -> None:
        """Its holder releases it soon (the run's end): from now on a renewal starts only once
        its record is `STALE_SECONDS / 2` old (a taker takes none younger than `STALE_SECONDS`),
        so that `release` rarely waits for one in flight and never for one it did not need."""
        self._ending = True

    def undo(self) -> None:
        """Lets go of it as `release` does, but puts back the record its take wrote over (or,
        if there was none, deletes its own): for a taker refused by its own work while the
        record settled (`try_acquire`'s `while_settling`), which leaves the store as it found it.
        A record the store does not let it put back is a WARNING: its own, unrenewed, goes stale."""
        replaced, self._replaced = self._replaced, None
        if replaced is None or not self.held:
            self.release()
            return
        if not self._let_go():
            return
        try:
            fresh = not self.lost and time.monotonic() - self._written_at < STALE_SECONDS / 2
            if fresh or (self._read() or {}).get("token") == self.token:  # Its own (as `release`).
                write_atomically(self.path, replaced)
        except tf.errors.OpError as error:
            console.warning("lock", "could not put back the record %s held before (%s); this "
                            "process's goes stale in %g s.", self.path, first_line(error),
                            STALE_SECONDS)

    def release(self) -> None:
        if not self._let_go():
            return
        try:
            # Its own record, renewed less than half `STALE_SECONDS` ago, is still its own: no
            # taker takes a fresh record, and the renewal read it before it wrote.
            fresh = not self.lost and time.monotonic() - self._written_at < STALE_SECONDS / 2
            if fresh or (self._read() or {}).get("token") == self.token:
                tf.io.gfile.remove(self.path)
        except tf.errors.OpError as error:  # Best effort: it goes stale on its own.
            console.warning("lock", "could not delete %s (%s); it goes stale in %g s.",
                            self.path, first_line(error), STALE_SECONDS)

    def _let_go(self) -> bool:
        """Stops renewing (a renewal in flight lands first); whether its record may be touched."""
        if self._stop is None:
            return False
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
            return False
        return True

    def holder(self) -> str:
        return holders.describe(self._seen, self.path)

    def holder_role(self) -> str:
        return holders.role_of(self._seen)

    def _read(self, found: Optional[list] = None) -> Optional[Dict[str, Any]]:
        """The record: {} when there is none; None when the store does not answer after
        `READ_ATTEMPTS` tries (`read_error` says why): unknown, which is never taken for a
        stale record nor for a lost one. A record that is not a JSON object is
        `{"garbage": ...}`: it lacks `renewed`, so it is stale.

        Args:
            found: gets the record's bytes appended, if there is one.
        """
        for attempt in range(READ_ATTEMPTS):
            if attempt:
                time.sleep(0.5 * attempt)
            try:  # One request (an existence check first would be a second).
                data = read_bytes(self.path)
            except tf.errors.NotFoundError:
                return {}
            except tf.errors.OpError as error:  # A store under load answers an error now and then.
                self.read_error = error
                continue
            self.read_error = None
            if found is not None:
                found.append(data)
            try:
                record = json.loads(data.decode("utf-8"))
            except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are ones.
                record = None
            return record if isinstance(record, dict) else {
                "garbage": data[:80].decode("utf-8", "replace")}
        return None

    def _write(self) -> None:
        started = time.monotonic()
        write_atomically(self.path, json.dumps(holders.holder_record(self.role, self.token)) + "\n")
        self._written_at = started

    def _stale(self, record: Dict[str, Any]) -> bool:
        if record.get("token") == self.token:
            return True
        if record.get("process") == holders.PROCESS and record.get("pid") == os.getpid():
            pass  # Another claim of this process: live while renewed.
        elif holders.pids_comparable(record) and not holders.alive(record.get("pid")):
            return True  # Its holder, on this host and in these PIDs, is gone (a SIGKILL).
        renewed = record.get("renewed")
        return not isinstance(renewed, (int, float)) or time.time() - renewed > STALE_SECONDS

    def _watch_until_stale(self, record: Dict[str, Any]) -> Optional[bool]:
        """Watches another host's fresh record: True once it went unrenewed for
        `STALE_SECONDS` (its holder is gone), False as soon as it is renewed, None if it
        could not be read at the end (unknown)."""
        console.info("lock", "%s is held by the %s (%s); waiting up to %g s to see whether it "
                     "is still alive", self.path, holders.role_of(record), holders.describe(record, self.path),
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
            if self._ending and time.monotonic() - self._written_at < STALE_SECONDS / 2:
                continue  # Released soon, and fresh until then.
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
                                holders.role_of(record), holders.describe(record, self.path), self.role)
                return
            if stop.is_set():  # Released while it read: no write after the delete.
                return
            try:
                self._write()
            except tf.errors.OpError as error:  # The next renewal tries again.
                console.warning("lock", "could not renew %s (%s)", self.path, first_line(error))
