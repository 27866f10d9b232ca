"""Claims: the lease an object store gets, the evaluator role (an `flock` on a local disk),
and directories published whole.

The lease is exercised on local files here (it reads and writes only through
tf.io.gfile, as in `gs://`), with its timings shortened, and on the GCS emulator
(tests/gcs) where the bucket's answers matter: reads answered 503, uploads held, a publish
refused halfway. tests/test_gcs_model_dir.py runs trainers and sidecars there.
"""

import contextlib
import json
import os
import socket
import threading
import time

import pytest
import tensorflow as tf

from ctl.model_dir import claims, lease as leases
from tests.support.processes import Process, python_command, run
from ctl.model_dir.evaluator_role import SIDECAR, TRAINER, EvaluatorRole
from ctl.model_dir import PUBLISHED_MARKER, ModelDir, is_published, publish_directory, read_bytes


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(leases, "RENEW_SECONDS", 0.2)
    monkeypatch.setattr(leases, "STALE_SECONDS", 1.5)
    monkeypatch.setattr(leases, "SETTLE_SECONDS", 0.1)


def test_a_lease_has_one_holder_until_it_is_released(tmp_path, quick):
    path = str(tmp_path / "evaluator.lock")
    first, second = claims.Lease(path, "trainer"), claims.Lease(path, "sidecar evaluator")
    assert first.try_acquire()
    try:
        assert not second.try_acquire()
        assert second.holder_role() == "trainer" and f"pid {os.getpid()}" in second.holder()
        renewed = json.loads(open(path).read())["renewed"]
        time.sleep(3 * leases.RENEW_SECONDS)
        assert json.loads(open(path).read())["renewed"] > renewed  # Its holder renews it.
        time.sleep(leases.STALE_SECONDS)
        assert not second.try_acquire()  # Renewed: never stale while its holder lives.
    finally:
        first.release()
    assert not os.path.exists(path)
    assert second.try_acquire()
    second.release()


def test_a_lease_taken_right_after_its_check_reads_it_once_and_back_once(gcs, gcs_dir, tmp_path):
    # In a bucket a read of the record is one request, and a take right after a check that
    # found it free writes at once: the take is its write (a resumable upload's two
    # requests) and the read-back (two requests less than an existence check before each
    # read and a read of its own before the write).
    log = tmp_path / "requests.jsonl"
    lease = claims.Lease(f"{gcs_dir}/trainer.lock", "trainer", wait=True)
    gcs.log_requests(str(log))
    try:
        assert not lease.held_elsewhere()
        checked = len(log.read_text().splitlines())
        assert lease.try_acquire()
        took = [json.loads(line)["method"] for line in log.read_text().splitlines()[checked:]]
    finally:
        lease.release()
        gcs.log_requests(None)
    assert checked == 1 and took == ["POST", "PUT", "GET"], (checked, took)


def _hold_and_die(path, signal_name):
    """A process that takes the lease and is then killed (or leaves it behind unrenewed)."""
    code = (f"import os, signal, time; from ctl.model_dir import claims, lease as leases; "
            f"lease = claims.Lease({path!r}, 'trainer'); assert lease.try_acquire(); "
            f"print('held', flush=True); os.kill(os.getpid(), signal.{signal_name})")
    process = run(python_command(code), timeout=120)
    assert "held" in process.stdout, process.stderr


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_lease_left_by_a_killed_process_of_this_host_is_taken_at_once(tmp_path, quick):
    path = str(tmp_path / "trainer.lock")
    _hold_and_die(path, "SIGKILL")
    assert json.loads(open(path).read())["role"] == "trainer"  # Left behind.
    lease = claims.Lease(path, "trainer", wait=True)
    started = time.monotonic()
    assert lease.try_acquire()
    assert time.monotonic() - started < leases.STALE_SECONDS  # No wait for staleness.
    lease.release()


@contextlib.contextmanager
def _a_process_that_said(line, code):
    """`python -c code` once it printed `line` (a lease it holds); killed on the way out."""
    with Process(python_command(code)) as process:
        process.wait_for_line(f"^{line}$", timeout=120)
        yield process


def _renewing(path, record, stop):
    """Renews `record` at `path` every `RENEW_SECONDS` until `stop` is set: a live holder."""
    while not stop.wait(leases.RENEW_SECONDS):
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps({**record, "renewed": time.time()}))
        os.replace(path + ".tmp", path)


@pytest.mark.parametrize("wait", [False, True])
def test_a_renewed_record_of_this_host_in_another_pid_namespace_is_not_taken(tmp_path, quick,
                                                                                   wait):
    """Two containers of one pod: the same host name, not the same PIDs (both often PID 1).
    Its pid means nothing here, dead or this very process's: only its renewals tell."""
    path = str(tmp_path / "evaluator.lock")
    record = {"role": "trainer", "pid": os.getpid(), "host": socket.gethostname(),
              "boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(), "pid_namespace": "pid:[4026500001]",
              "token": "the-trainer-container", "since": "2026-11-26T00:00:00Z"}
    stop = threading.Event()
    with open(path, "w") as f:
        f.write(json.dumps({**record, "renewed": time.time()}))
    renewer = threading.Thread(target=_renewing, args=(path, record, stop))
    renewer.start()
    try:
        lease = claims.Lease(path, "sidecar evaluator", wait=wait)
        assert not lease.try_acquire()
        assert json.loads(open(path).read())["token"] == "the-trainer-container"
    finally:
        stop.set()
        renewer.join(timeout=30)
    assert claims.Lease(path, "sidecar evaluator", wait=True).try_acquire()  # Unrenewed: gone.


def _foreign_record(renewed):
    return {"role": "trainer", "pid": 4242, "host": "elsewhere", "token": "theirs",
            "renewed": renewed, "since": "2026-11-26T00:00:00Z"}


def _foreign(path, renewed):
    record = _foreign_record(renewed)
    with open(path, "w") as f:
        f.write(json.dumps(record))
    return record


def test_another_host_s_lease_is_refused_while_fresh_and_taken_once_stale(tmp_path, quick):
    path = str(tmp_path / "evaluator.lock")
    _foreign(path, time.time())
    lease = claims.Lease(path, "sidecar evaluator")
    assert not lease.try_acquire()
    assert "pid 4242 on host elsewhere" in lease.holder()
    _foreign(path, time.time() - 2 * leases.STALE_SECONDS)
    assert lease.try_acquire()
    assert json.loads(open(path).read())["token"] == lease.token
    lease.release()


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_waiting_trainer_takes_a_lease_that_is_not_renewed_and_refuses_one_that_is(
        tmp_path, quick):
    path = str(tmp_path / "trainer.lock")
    _foreign(path, time.time())  # Fresh by its clock, but nobody renews it.
    lease = claims.Lease(path, "trainer", wait=True)
    assert lease.try_acquire()
    lease.release()

    code = ("import time; from ctl.model_dir import claims, lease as leases; leases.RENEW_SECONDS = 0.2; "
            "leases.SETTLE_SECONDS = 0.1; "
            f"lease = claims.Lease({path!r}, 'trainer'); assert lease.try_acquire(); "
            "print('held', flush=True); time.sleep(60)")
    with _a_process_that_said("held", code) as holder:
        waiting = claims.Lease(path, "trainer", wait=True)
        started = time.monotonic()
        assert not waiting.try_acquire()  # A live holder renews.
        assert time.monotonic() - started < leases.STALE_SECONDS
        assert f"pid {holder.pid}" in waiting.holder()


def test_of_two_takers_that_found_no_record_the_later_write_wins(tmp_path, quick, monkeypatch):
    """The read-back after `SETTLE_SECONDS`: another taker's record written while this one
    settles (both found none) wins; this one backs off and names it."""
    monkeypatch.setattr(leases, "SETTLE_SECONDS", 3.0)  # The window the other write lands in.
    path = str(tmp_path / "trainer.lock")
    lease = claims.Lease(path, "trainer")
    taken = []
    taker = threading.Thread(target=lambda: taken.append(lease.try_acquire()))
    taker.start()
    deadline = time.monotonic() + 30
    while not (os.path.exists(path) and lease.token in open(path).read()):  # Written, settling.
        assert taker.is_alive() and time.monotonic() < deadline, taken
        time.sleep(0.01)
    _foreign(path, time.time())  # The other taker's write, in the window.
    taker.join(timeout=30)
    assert taken == [False] and not lease.held
    assert "pid 4242 on host elsewhere" in lease.holder()
    assert json.loads(open(path).read())["token"] == "theirs"


def test_a_trainer_takes_its_lease_beside_its_first_loop_and_writes_only_once_it_has_it(
        gcs_dir, quick, monkeypatch):
    """In an object store the trainer's lease settles while its first loop computes
    (`ModelDirLock.acquire_aside` returns at once); the run's first writes wait for it. A
    trainer whose record another trainer's overwrote meanwhile stops at its first loop's end
    with one line naming the holder, having written nothing but its record."""
    from ctl.model_dir.trainer_lock import ModelDirLock
    from ctl.utils.errors import UserError

    monkeypatch.setattr(leases, "SETTLE_SECONDS", 3.0)  # The window the other write lands in.
    for other_writes in (False, True):
        directory = ModelDir(f"{gcs_dir}/{other_writes}")
        lock, written = ModelDirLock(directory), []
        lock.acquire_aside(reads=lambda: None, first_writes=lambda: written.append(directory.path))
        assert not written  # Settling: the caller goes on.
        deadline = time.monotonic() + 30
        while not (tf.io.gfile.exists(lock.path) and lock._claim.token in read_bytes(lock.path).decode()):
            assert time.monotonic() < deadline and not written
            time.sleep(0.01)
        if other_writes:
            with tf.io.gfile.GFile(lock.path, "w") as f:  # The other trainer's write, in the window.
                f.write(json.dumps(_foreign_record(time.time())))
            with pytest.raises(UserError, match="in use by another trainer .*pid 4242 on host elsewhere"):
                lock.stop_if_taken(step=5)
            assert not written
        else:
            lock.stop_if_taken(step=5)
            assert written == [directory.path]  # Once held, before the loop's end goes on.
        lock.release()


def test_a_holder_that_lost_its_lease_says_so_and_stops_renewing(tmp_path, quick):
    path = str(tmp_path / "evaluator.lock")
    lease = claims.Lease(path, "trainer")
    assert lease.try_acquire()
    try:
        _foreign(path, time.time())  # Taken while this holder was frozen.
        time.sleep(3 * leases.RENEW_SECONDS)
        assert lease.lost
        assert json.loads(open(path).read())["token"] == "theirs"
    finally:
        lease.release()
    assert os.path.exists(path)  # Not its record: left alone.


def test_eval_side_hooks_stop_once_their_lease_is_taken(tmp_path, quick):
    """A holder frozen past the staleness window finds its claim taken: its eval-side hooks
    stop (said once), the taker's run; nothing of this process runs them twice."""
    path = str(tmp_path / "evaluator.lock")
    ran = []
    owned = EvaluatorRole(ModelDir(str(tmp_path)), TRAINER, [ran.append])
    owned.claim = claims.Lease(path, TRAINER)  # A lease on a local file (as in gs://).
    try:
        owned({"step": 10})
        assert ran == [{"step": 10}] and owned.owned
        _foreign(path, time.time())  # Taken by another process (another token).
        deadline = time.monotonic() + 30
        while not owned.claim.lost:  # Its next renewal finds the other record.
            assert time.monotonic() < deadline
            time.sleep(0.05)
        owned({"step": 20})
        owned({"step": 30})
        assert ran == [{"step": 10}] and owned.owned is False
    finally:
        owned.release()
    assert json.loads(open(path).read())["token"] == "theirs"  # Not its record: left alone.


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_sidecar_is_announced_while_its_process_lives(tmp_path, quick):
    """The evaluator role's one record (an `flock` on a local disk): a sidecar holding it is
    live to a reader while its holder lives, the record is deleted when released and not
    live at once when its process is killed; a trainer's in-line evaluation holds it until
    its eval-side hooks ran, and a sidecar takes it between two of them."""
    directory = ModelDir(str(tmp_path / "run"))
    trainer = EvaluatorRole(directory, TRAINER)
    assert trainer.live_sidecar() is None
    sidecar = EvaluatorRole(directory, SIDECAR)
    sidecar.announce()
    try:
        assert trainer.live_sidecar() is not None  # Another claim of this process.
    finally:
        sidecar.release()
    assert trainer.live_sidecar() is None
    assert not os.path.exists(directory.evaluator_file)  # Deleted at its end.

    ran = []
    in_line = EvaluatorRole(directory, TRAINER, [ran.append])
    assert not in_line.steps_aside(10)  # Evaluates, holding the role until its hooks ran...
    late = EvaluatorRole(directory, SIDECAR, [ran.append])
    late.announce()  # ... so a sidecar starting now does not get it ...
    assert not late.claim.held and ran == []
    in_line({"step": 10})
    assert ran == [{"step": 10}] and not os.path.exists(directory.evaluator_file)
    late.take_over()  # ... and takes it between two evaluations: the hand-over.
    try:
        assert late.claim.held and in_line.steps_aside(20)
        late({"step": 15})
        assert ran == [{"step": 10}, {"step": 15}]
    finally:
        late.release()
    assert not in_line.steps_aside(30)  # Evaluating in-line again.
    in_line({"step": 30})
    assert ran[-1] == {"step": 30}

    code = ("import time; from ctl.model_dir.evaluator_role import SIDECAR, EvaluatorRole; "
            "from ctl.model_dir import ModelDir; "
            f"EvaluatorRole(ModelDir({directory.path!r}), SIDECAR).announce(); "
            "print('announced', flush=True); time.sleep(120)")
    with _a_process_that_said("announced", code) as process:
        assert f"pid {process.pid} on host" in trainer.live_sidecar()
        second = EvaluatorRole(directory, SIDECAR)
        second.announce()
        try:
            assert not second.claim.held  # One sidecar announced at a time.
        finally:
            second.release()
        assert trainer.live_sidecar() is not None  # The second left it alone.
    assert os.path.exists(directory.evaluator_file)  # Left behind by the kill...
    assert trainer.live_sidecar() is None  # ... and not live: the kernel dropped its flock.


def _saved_model_like(directory):
    os.makedirs(os.path.join(directory, "variables"))
    for name in ("variables/variables.index", "variables/variables.data-00000-of-00001",
                 "saved_model.pb", "fingerprint.pb"):
        with open(os.path.join(directory, name), "w") as f:
            f.write(name)


def test_a_directory_is_published_whole_with_its_marker_last(tmp_path):
    temp, final = str(tmp_path / ".tmp-7"), str(tmp_path / "7")
    _saved_model_like(temp)
    os.makedirs(final)  # Half of an interrupted publish: replaced.
    open(os.path.join(final, "saved_model.pb"), "w").close()
    assert not is_published(final)
    publish_directory(temp, final, last=["saved_model.pb"])
    assert is_published(final) and not os.path.exists(temp)
    with open(os.path.join(final, "saved_model.pb")) as f:
        assert f.read() == "saved_model.pb"
    assert sorted(os.listdir(final)) == sorted(
        ["variables", "saved_model.pb", "fingerprint.pb", PUBLISHED_MARKER])


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_bucket_publish_copies_the_entry_file_and_marker_last(gcs, gcs_dir, tmp_path):
    """What a reader polling the final directory sees: the bucket refuses the upload of
    `saved_model.pb` (503), and the publish stops there with every other file copied and
    neither the entry file nor the marker in place."""
    temp, final = str(tmp_path / ".tmp-7"), f"{gcs_dir}/export/7"
    _saved_model_like(temp)
    gcs.inject_faults([{"status": 503, "methods": ["POST", "PUT"], "path_contains": "saved_model.pb"}])
    code = ("from ctl.model_dir import publish_directory\n"
            f"try:\n    publish_directory({temp!r}, {final!r}, last=['saved_model.pb'])\n"
            "except Exception as error:\n    print(type(error).__name__)")
    publisher = run(python_command(code), env=FEW_RETRIES)
    assert publisher.stdout.strip() == "AbortedError", publisher.stdout + publisher.stderr
    gcs.reset()
    copied = {os.path.relpath(os.path.join(root, name), final)
              for root, _, names in tf.io.gfile.walk(final) for name in names}
    assert copied == {"variables/variables.index", "variables/variables.data-00000-of-00001",
                      "fingerprint.pb"}
    assert not is_published(final)
    publish_directory(temp, final, last=["saved_model.pb"])  # Again, the bucket answering.
    assert is_published(final) and not os.path.exists(temp)
    with tf.io.gfile.GFile(f"{final}/saved_model.pb") as f:
        assert f.read() == "saved_model.pb"


# In the processes below: TensorFlow retries a 5xx answer twice, not 10 times up to 32 s apart.
FEW_RETRIES = {"GCS_RETRY_CONFIG_MAX_RETRIES": "2", "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
               "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000"}
QUICK = "leases.RENEW_SECONDS = 0.5; leases.STALE_SECONDS = 20.0; leases.SETTLE_SECONDS = 0.2; "


def _in_a_process(code, **kwargs):
    return Process(python_command("from ctl.model_dir import claims, lease as leases; " + QUICK + code),
                   env=FEW_RETRIES, **kwargs)


def _record(path):
    return json.loads(read_bytes(path))  # One whole version while its holder renews it.


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_record_the_bucket_cannot_read_is_neither_taken_nor_lost(gcs, gcs_dir):
    """The bucket answers 503 to every read of the record: a second process takes nothing
    (refused; the trainer's waiting claim raises the store's error, a storage fault, which
    `ctl.run` ends with exit 74), and
    the holder does not think it lost the claim: it renews again once reads come back."""
    path = f"{gcs_dir}/run/evaluator.lock"
    holder = _in_a_process(
        f"import sys; lease = claims.Lease({path!r}, 'trainer'); assert lease.try_acquire(); "
        "print('held', flush=True); [print(lease.lost, flush=True) for _ in sys.stdin]", stdin=True)
    with holder:
        holder.wait_for_line("^held$", timeout=120)
        token = _record(path)["token"]
        gcs.inject_faults([{"status": 503, "methods": ["GET"], "path_contains": "evaluator.lock"}])
        for wait in (False, True):
            taker = _in_a_process(
                f"lease = claims.Lease({path!r}, 'sidecar evaluator', wait={wait})\n"
                "try:\n    print(lease.try_acquire(), lease.holder())\n"
                "except Exception as error:\n    from ctl.faults import storage\n"
                "    from ctl.model_dir import ModelDir\n"
                # What `ctl.run` makes of it: a storage fault (exit 74), or a bug (a traceback).
                f"    print(type(error).__name__, storage.storage_fault_within(error, ModelDir({gcs_dir + '/run'!r}))"
                " is not None, error)")
            taken = taker.finish(timeout=300)
            out, err = taken.stdout, taken.stderr
            if wait:  # The trainer's claim: `ctl.run` ends with EXIT_STORAGE_FAULT (74).
                assert out.startswith("AbortedError True") and "503" in out, out + err
            else:
                assert out.startswith("False holder unknown: ") and "503" in out, out + err
        gcs.reset()
        assert _record(path)["token"] == token  # Never overwritten.
        renewed = _record(path)["renewed"]
        deadline = time.monotonic() + 120
        while _record(path)["renewed"] == renewed:  # Its holder renews again.
            assert holder.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        holder.write_line("lost?")
        _, _, answer = holder.wait_for_line("^(True|False)$", after=1)
        assert answer.group(1) == "False"
        assert _record(path)["token"] == token


def test_a_lease_released_while_a_renewal_uploads_leaves_no_record(gcs, gcs_dir, quick):
    """The bucket holds each upload of the record 2 s (longer than `STALE_SECONDS` here): the
    renewal in flight when the holder releases lands before the delete, not after it."""
    path = f"{gcs_dir}/run/evaluator.lock"
    lease = claims.Lease(path, "released-while-renewing")  # Its renewer's thread is named so.
    assert lease.try_acquire()
    gcs.inject_faults([{"delay_ms": 2000, "methods": ["POST"], "path_contains": "evaluator.lock"}])
    time.sleep(5 * leases.RENEW_SECONDS)  # A renewal is uploading, held by the bucket.
    lease.release()
    for renewer in [t for t in threading.enumerate()
                    if t.name == "ctl-lease-released-while-renewing"]:
        renewer.join(timeout=60)  # Whatever it was writing has landed (not other tests' leases).
    assert not tf.io.gfile.exists(path)


def test_in_a_bucket_the_role_passes_from_an_in_line_trainer_to_a_sidecar(gcs_dir, quick, monkeypatch):
    """The evaluator role's lease in a bucket: a trainer takes it while it evaluates in-line
    (on a thread of its own) and lets it go after its eval-side hooks; a sidecar refused
    meanwhile takes it then; the trainer runs no hook once it is taken and steps aside (its
    reads run ahead: one evaluation later at most), and evaluates in-line again after."""
    # The role passes by release, never by staleness: a lease stale after 1.5 s (`quick`) went
    # stale under a load of 25 before the sidecar asked (the sidecar then took it).
    monkeypatch.setattr(leases, "STALE_SECONDS", 600.0)
    directory = ModelDir(gcs_dir)
    ran = []
    trainer = EvaluatorRole(directory, TRAINER, [lambda logs: ran.append(("trainer", logs["step"]))])
    sidecar = EvaluatorRole(directory, SIDECAR, [lambda logs: ran.append(("sidecar", logs["step"]))])
    path = directory.evaluator_file

    def until(condition, what):
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    try:
        assert not trainer.steps_aside(10)
        until(lambda: tf.io.gfile.exists(path) and _record(path)["role"] == TRAINER, "the take")
        sidecar.announce()  # While the trainer evaluates: refused.
        assert not sidecar.claim.held
        trainer({"step": 10})
        until(lambda: sidecar.take_over() or sidecar.claim.held, "the hand-over")
        sidecar({"step": 15})
        if not trainer.steps_aside(20):  # Read before the sidecar took it: its take is refused.
            trainer({"step": 20})
        assert trainer.steps_aside(30)
        assert ran == [("trainer", 10), ("sidecar", 15)]
        sidecar.release()
        if trainer.steps_aside(40):  # Read while the sidecar held it.
            assert not trainer.steps_aside(50)
        trainer({"step": 50})
        assert ran[-1] == ("trainer", 50)
    finally:
        sidecar.release()
        trainer.release()
    assert not tf.io.gfile.exists(path)
