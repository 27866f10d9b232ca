"""Uploads to an object store off the training thread (ctl.model_dir.background), and checkpoints
staged locally and uploaded (ctl.core.checkpointing) on a real GCS API."""

import os
import sys
import threading
import time

import pytest
import tensorflow as tf

from ctl.core import checkpointing
from ctl.model_dir.background import Uploads, uploads
from ctl.core.checkpointing import CheckpointManager
from ctl.model_dir import ModelDir
from tests.tasks import RegressionTask


def test_uploads_run_in_order_and_an_error_is_raised_on_the_caller_s_thread():
    queue = Uploads("test-uploads")
    done, gate = [], threading.Event()
    queue.submit(gate.wait)
    for number in range(5):
        queue.submit(done.append, number)
    assert queue.pending == 6 and done == []  # Nothing ran on the caller's thread.
    gate.set()
    queue.wait()
    assert done == [0, 1, 2, 3, 4]

    def fail():
        raise tf.errors.PermissionDeniedError(None, None, "no write access to gs://b/x")

    queue.submit(fail)
    queue.submit(done.append, 5)  # Runs all the same: a later upload may release a waiter.
    with pytest.raises(tf.errors.PermissionDeniedError, match="no write access"):
        queue.wait()
    assert done[-1] == 5
    queue.wait()  # Raised once.


def test_uploads_of_different_objects_overlap_and_those_of_one_object_keep_their_order():
    # On a lane of several threads: what was handed over under another key runs while an upload
    # is held; what was handed over under the held one waits for it, and a mark waits for all.
    queue = Uploads("test-uploads", workers={"files": 2})
    done, gate = [], threading.Event()
    queue.submit(gate.wait, key="events")
    queue.submit(done.append, "events, after the held one", key="events")
    queue.submit(done.append, "metrics", key="metrics")
    mark = queue.mark()
    deadline = time.monotonic() + 30
    while "metrics" not in done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == ["metrics"]  # Beside the held upload; the same object's next one waits.
    waited = threading.Thread(target=queue.wait_for, args=("files", mark), daemon=True)
    waited.start()
    waited.join(timeout=0.3)
    assert waited.is_alive()  # The mark counts the held upload too.
    gate.set()
    waited.join(timeout=30)
    queue.wait()
    assert not waited.is_alive() and done == ["metrics", "events, after the held one"]


def _manager(model_dir, max_to_keep=2):
    task = RegressionTask()
    model, optimizer = task.build_model(), task.build_optimizer()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(global_step=step, model=model, optimizer=optimizer)
    return CheckpointManager(checkpoint, ModelDir(model_dir), step_counter=step, max_to_keep=max_to_keep,
                             checkpoint_interval=1), step, model


def test_a_checkpoint_in_a_bucket_is_staged_uploaded_and_retired_and_saves_wait_for_the_store(gcs, gcs_dir):
    gcs.set_latency(200)  # Uploads slower than the saves.
    manager, step, model = _manager(gcs_dir)
    for number in range(1, 6):
        step.assign(number)
        path = manager.save()
        assert path == f"{gcs_dir}/ckpt-{number}"  # Named where it will be.
        # Saves wait rather than queue: at most UPLOADS_IN_FLIGHT behind the training, each its
        # files' upload and its state file's (and one more whose upload is done, still retiring
        # older checkpoints).
        assert uploads().pending <= 2 * checkpointing.UPLOADS_IN_FLIGHT + 1
    manager.sync()  # The uploads; the retired checkpoints' deletes are close()'s to wait for.
    gcs.set_latency(0)
    directory = ModelDir(gcs_dir)
    state = directory.checkpoint_state()
    assert state.latest == f"{gcs_dir}/ckpt-5" and state.all == [f"{gcs_dir}/ckpt-4", state.latest]
    assert manager.checkpoints == state.all  # What the bucket keeps, not the staged copies.
    restored, _, restored_model = _manager(gcs_dir)
    assert restored.restore_or_initialize() == f"{gcs_dir}/ckpt-5"
    for mine, theirs in zip(model.weights, restored_model.weights):
        assert (mine.numpy() == theirs.numpy()).all()
    manager.close()
    assert sorted(directory.checkpoints()) == [4, 5]  # max_to_keep, in the bucket.
    assert not os.path.exists(manager._staging)


@pytest.mark.parametrize("held", ["files", "checkpoints"], ids=["summaries", "state_file"])
def test_a_checkpoints_files_upload_beside_a_held_lane_and_it_is_named_only_after(gcs_dir, held):
    # summaries: an upload of summaries handed over before the save has not landed; the
    # checkpoint's files upload meanwhile, and the state file waits for it. state_file: the state
    # file's lane is busy (naming an earlier checkpoint, held here); the next checkpoint's files
    # upload meanwhile on their own lane, and it is named after.
    manager, step, _ = _manager(gcs_dir)
    gate = threading.Event()
    uploads().submit(gate.wait, lane=held)
    try:
        step.assign(1)
        manager.save()
        deadline = time.monotonic() + 60
        while not tf.io.gfile.exists(f"{gcs_dir}/ckpt-1.index") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tf.io.gfile.exists(f"{gcs_dir}/ckpt-1.index")  # Not behind the held lane.
        time.sleep(0.5)
        assert ModelDir(gcs_dir).checkpoint_state().latest is None  # Not named before it.
    finally:
        gate.set()
    manager.close()
    assert ModelDir(gcs_dir).checkpoint_state().latest == f"{gcs_dir}/ckpt-1"


def test_a_checkpoints_files_upload_beside_those_of_the_checkpoint_before(gcs, gcs_dir):
    # The bucket holds the upload of ckpt-1's data for 5 s: ckpt-2's files land meanwhile, and
    # the state file names neither before ckpt-1 is whole (in the order saved), then both.
    gcs.inject_faults([{"delay_ms": 5000, "methods": ["POST"], "path_contains": "ckpt-1.data"}])
    manager, step, _ = _manager(gcs_dir)
    for number in (1, 2):
        step.assign(number)
        manager.save()
    deadline = time.monotonic() + 60
    while not tf.io.gfile.exists(f"{gcs_dir}/ckpt-2.index") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tf.io.gfile.exists(f"{gcs_dir}/ckpt-2.index")
    assert not tf.io.gfile.exists(f"{gcs_dir}/ckpt-1.index")  # Still held: not behind it.
    assert ModelDir(gcs_dir).checkpoint_state().latest is None  # Neither named yet.
    manager.close()
    gcs.reset()
    state = ModelDir(gcs_dir).checkpoint_state()
    assert state.all == [f"{gcs_dir}/ckpt-1", f"{gcs_dir}/ckpt-2"] and state.latest == state.all[-1]


def _write_operative_config(model_dir):
    from ctl.config import gin_config

    gin_config.save_operative_config(ModelDir(model_dir))
    return "operative_config"


def _write_hparams(model_dir):
    from ctl.hooks import hparams

    uploads().submit(hparams.write_summary, model_dir, {"lr": 0.1}, "complete", 3)
    return None  # Its tags are the HParams plugin's.


@pytest.mark.parametrize("write", [_write_operative_config, _write_hparams],
                         ids=["operative_config", "hparams"])
def test_a_summary_written_once_in_a_bucket_holds_up_no_summary_of_the_training_thread(
        gcs, gcs_dir, tmp_path, write):
    # Written on the uploads' thread while every request takes 300 ms: the training thread's
    # own summary writes (a local writer) do not wait for it (a TensorFlow writer on the
    # store itself held them for seconds), and it lands in the bucket whole.
    writer = tf.summary.create_file_writer(str(tmp_path / "train"))

    @tf.function
    def summary(step):
        with writer.as_default():
            tf.summary.scalar("loss", 1.0, step=step)

    summary(tf.constant(0, tf.int64))
    writer.flush()
    gcs.set_latency(300)
    directory = f"{gcs_dir}/train" if write is _write_operative_config else gcs_dir
    tag = write(gcs_dir)
    longest, step = 0.0, 1
    while uploads().pending:
        started = time.monotonic()
        summary(tf.constant(step, tf.int64))
        writer.flush()
        longest = max(longest, time.monotonic() - started)
        step += 1
        time.sleep(0.05)
    uploads().wait()
    gcs.set_latency(0)
    assert step > 5 and longest < 1.5, (step, longest)  # Held: 3 s and more.
    events = tf.io.gfile.glob(f"{directory}/events.out.tfevents.*")
    assert len(events) == 1
    if tag:
        tags = {value.tag for record in tf.compat.v1.train.summary_iterator(events[0])
                for value in record.summary.value}
        assert tag in {t.split("/")[0] for t in tags}, tags


def _pausing_in(code, at, pause):
    """A trace function for `sys.settrace`: in frames running `code`, calls `pause()` before
    the `at`-th bytecode instruction (0 first), so another thread runs right there."""
    seen = [0]

    def local(frame, event, arg):
        if event == "opcode":
            if seen[0] == at:
                pause()
            seen[0] += 1
        return local

    def start(frame, event, arg):
        if frame.f_code is code:
            frame.f_trace_opcodes = True
            return local
        return None

    return start


def test_an_error_stored_while_check_runs_is_raised_by_the_next_wait():
    # The uploads thread stores its error while the caller's thread is inside `check()`, at
    # each instruction of `check()` in turn: it is raised then, or by the next `wait()`, never lost.
    code = Uploads.check.__code__
    at = 0
    while True:
        queue = Uploads("test-uploads")
        gate = threading.Event()

        def fail():
            gate.wait()
            raise tf.errors.UnavailableError(None, None, f"gs://b/x: upload {at} refused")

        queue.submit(fail)

        def pause():  # The upload fails now: the uploads thread has 50 ms to store its error.
            gate.set()
            threading.Event().wait(0.05)

        previous = sys.gettrace()
        sys.settrace(_pausing_in(code, at, pause))
        try:
            queue.check()
            raised = False
        except tf.errors.UnavailableError:
            raised = True
        finally:
            sys.settrace(previous)
        if not gate.is_set():  # `check()` ran fewer than `at` instructions: every point was tried.
            gate.set()
            with pytest.raises(tf.errors.UnavailableError):
                queue.wait()
            break
        if not raised:
            with pytest.raises(tf.errors.UnavailableError, match=f"upload {at} refused"):
                queue.wait()
        at += 1
    assert at > 5  # `check()` was paused at each of its instructions.


def _failed_upload(gcs, gcs_dir, local):
    """An upload on the process's uploads thread that the store refuses (403, not retried),
    run to its end: its error is waiting for the next submit, wait or check."""
    gcs.inject_faults([{"status": 403, "methods": ["POST", "PUT"], "path_contains": "refused"}])
    uploads().submit(tf.io.gfile.copy, local, f"{gcs_dir}/refused", True)
    deadline = time.monotonic() + 60
    while uploads().pending and time.monotonic() < deadline:
        time.sleep(0.01)
    gcs.reset()


def test_a_save_that_hears_of_an_earlier_failed_upload_keeps_its_upload_slot(gcs, gcs_dir, tmp_path):
    local = tmp_path / "file"
    local.write_text("x")
    manager, step, _ = _manager(gcs_dir)
    step.assign(1)
    for _ in range(checkpointing.UPLOADS_IN_FLIGHT):  # More than enough to take every slot.
        _failed_upload(gcs, gcs_dir, str(local))
        with pytest.raises(tf.errors.PermissionDeniedError):
            manager.save()
    saved = []
    saving = threading.Thread(target=lambda: saved.append(manager.save()), daemon=True)
    saving.start()
    saving.join(timeout=60)
    assert saved == [f"{gcs_dir}/ckpt-1"]  # Not stuck waiting for a slot that was never freed.
    manager.close()
    assert ModelDir(gcs_dir).checkpoint_state().latest == f"{gcs_dir}/ckpt-1"


def test_an_old_checkpoint_is_retired_index_first_and_a_failed_delete_is_a_warning(gcs, gcs_dir, caplog):
    # The bucket refuses to delete ckpt-1's index (403, not retried) when ckpt-2 retires it.
    gcs.inject_faults([{"status": 403, "methods": ["DELETE"], "path_contains": "ckpt-1.index"}])
    manager, step, _ = _manager(gcs_dir, max_to_keep=1)
    for number in (1, 2):
        step.assign(number)
        manager.save()
    with caplog.at_level("WARNING", logger="ctl"):
        manager.close()  # Waits for the uploads: the failed delete raises nothing.
    gcs.reset()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"{gcs_dir}/ckpt-1" in warnings[0], warnings
    names = tf.io.gfile.listdir(gcs_dir)
    indexes = [n[:-len(".index")] for n in names if n.endswith(".index")]
    for checkpoint in indexes:  # An index in the bucket always has its data there.
        assert any(n.startswith(checkpoint + ".data-") for n in names), names
    assert ModelDir(gcs_dir).checkpoint_state().all == [f"{gcs_dir}/ckpt-2"] == manager.checkpoints
