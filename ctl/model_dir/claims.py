"""Claims on a model dir: which process is the trainer, which runs the eval-side hooks,
whether a sidecar evaluator serves it.

    claim = claim_for(ModelDir(d).file("trainer.lock"), "trainer", wait=True)
    if not claim.try_acquire():
        ...  # claim.holder() names the live process that has it

Two kinds, one interface (`Claim`: `try_acquire`, `release`, `held`,
`held_elsewhere`, `holder`, `holder_role`, `lost`, `read_error`). A process
that only asks whether someone live holds a claim calls `held_elsewhere()` and
takes nothing: a trainer asks so of the evaluator role's record
(`ctl.model_dir.evaluator_role`).

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
`lost`: the eval-side hooks stop there (`ctl.model_dir.evaluator_role`), a
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

from typing import Optional, Protocol

from ctl.model_dir.file_lock import FileLock
from ctl.model_dir.files import is_object_store
from ctl.model_dir.lease import Lease


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
