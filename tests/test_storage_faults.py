"""Storage faults during a run: a full disk, a refused write, a read-only file system,
an object store answering errors. Each ends in one line on stderr naming the path and
the cause, exit 74, the newest complete checkpoint intact; once the cause is fixed the
same command resumes, bit-identical to a run that never failed.

Every run is `python -m ctl.run` on tests/faults.gin (ProbeTask, seed 7) with a
600 KiB frozen weight, so that a 2 MiB tmpfs holds three checkpoints and not a fourth.
A run that meets the fault is a process of its own (its exit status and its one line); the
uninterrupted run and the resumes once the cause is fixed run the command's main in this process
(`tests/support/in_process.py`: a TensorFlow import less each), where no environment or wrapper
of their own is needed.
"""

import errno
import os
import shutil
import subprocess

import pytest
import tensorflow as tf

from ctl.faults.storage import EXIT_STORAGE_FAULT, StorageFault, storage_fault_within
from tests.support.env import ROOT
from tests.support.in_process import ctl_in_process
from tests.support.processes import run_ctl
from tests.support.reading import checkpoint_values, ctl_stderr_lines
from ctl.model_dir import ModelDir

FAULTS_GIN = os.path.join(ROOT, "tests", "faults.gin")
BALLAST = "--gin_bindings=ProbeTask.ballast_kb=600"


def train(model_dir, steps, env=None, wrapper=(), here=False):
    """`python -m ctl.run --mode=train` to `steps`; `here`: its main in this process."""
    args = ("--mode=train", f"--model_dir={model_dir}", f"--gin_file={FAULTS_GIN}", BALLAST,
            f"--gin_bindings=ctl.Schedule.train_steps={steps}")
    if here:
        assert env is None and not wrapper, "a run with its own environment or wrapper is a process"
        return ctl_in_process(*args)
    return run_ctl(*args, env=env, wrapper=wrapper)


# The tests that read `straight_run` run in one test process (an xdist group), so it runs once.
STRAIGHT = pytest.mark.xdist_group("straight_run")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """A local run of 40 steps that nothing interrupted: ckpt-20, ckpt-30, ckpt-40."""
    model_dir = str(tmp_path_factory.mktemp("straight"))
    result = train(model_dir, 40, here=True)
    assert result.returncode == 0, result.stderr
    return model_dir


def assert_same_checkpoint(path, reference):
    a, b = checkpoint_values(path), checkpoint_values(reference)
    assert sorted(a) == sorted(b)
    for name in a:
        if a[name] is not None:  # The input position has no array form.
            assert a[name].tobytes() == b[name].tobytes(), name


def assert_ended_cleanly(result, path_part, cause, newest):
    """Exit 74, one line from ctl naming the path and the cause, no traceback."""
    assert result.returncode == EXIT_STORAGE_FAULT, result.stderr
    lines = ctl_stderr_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    line = lines[0]
    assert line.startswith("ctl.run: storage error: "), line
    assert path_part in line and cause in line, line
    assert f"the newest complete checkpoint, {newest}, is intact" in line, line


def mount_tmpfs(directory, options):
    os.makedirs(directory)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={options}", "tmpfs", directory],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        pytest.skip(f"cannot mount a tmpfs here (root in a VM can): {error}")


def umount(directory):
    subprocess.run(["umount", directory], capture_output=True, timeout=30)


@pytest.mark.slow
@STRAIGHT
def test_a_full_disk(tmp_path, straight_run):
    disk = str(tmp_path / "disk")
    mount_tmpfs(disk, "2m")
    try:
        model_dir = os.path.join(disk, "run")
        result = train(model_dir, 40)
        # ckpt-40 does not fit beside ckpt-10, 20 and 30 (max_checkpoints = 3).
        assert_ended_cleanly(result, f"{model_dir}/ckpt-40", "No space left on device",
                             f"{model_dir}/ckpt-30")
        assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-30"
        assert_same_checkpoint(f"{model_dir}/ckpt-30", f"{straight_run}/ckpt-30")

        subprocess.run(["mount", "-o", "remount,size=8m", disk], check=True, timeout=30)
        again = train(model_dir, 40, here=True)
        assert again.returncode == 0, again.stderr
        assert "restored model from" in again.stdout and "ckpt-30" in again.stdout
        assert_same_checkpoint(f"{model_dir}/ckpt-40", f"{straight_run}/ckpt-40")
    finally:
        umount(disk)


# A model dir that cannot be written at start is a bad --model_dir (exit 2, tests/test_bad_inputs.py);
# these faults strike a running job: TensorFlow writes a checkpoint's files into `ckpt-N_temp/` first,
# and that is where the storage refuses the save of step 30, after ckpt-10 and ckpt-20 were written.


@pytest.mark.slow
@STRAIGHT
def test_a_read_only_file_system_during_a_save(tmp_path, straight_run):
    model_dir = str(tmp_path / "run")
    refused = os.path.join(model_dir, "ckpt-30_temp")
    mount_tmpfs(refused, "1m,ro")
    try:
        result = train(model_dir, 40)
        assert_ended_cleanly(result, refused, "Read-only file system", f"{model_dir}/ckpt-20")
        assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-20"
    finally:
        umount(refused)
    again = train(model_dir, 40, here=True)
    assert again.returncode == 0, again.stderr
    assert_same_checkpoint(f"{model_dir}/ckpt-40", f"{straight_run}/ckpt-40")


# Root writes where permission bits say no; without CAP_DAC_OVERRIDE it cannot.
WITHOUT_OVERRIDE = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")


@pytest.mark.slow
@STRAIGHT
def test_permission_denied_during_a_save(tmp_path, straight_run):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot drop CAP_DAC_OVERRIDE")
    model_dir = str(tmp_path / "run")
    refused = os.path.join(model_dir, "ckpt-30_temp")
    os.makedirs(refused)
    os.chmod(refused, 0o555)
    probe = subprocess.run([*WITHOUT_OVERRIDE, "touch", f"{refused}/probe"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("this process ignores permission bits even without CAP_DAC_OVERRIDE")
    result = train(model_dir, 40, wrapper=WITHOUT_OVERRIDE)
    assert_ended_cleanly(result, refused, "Permission denied", f"{model_dir}/ckpt-20")
    assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-20"

    os.chmod(refused, 0o755)
    again = train(model_dir, 40, wrapper=WITHOUT_OVERRIDE)
    assert again.returncode == 0, again.stderr
    assert_same_checkpoint(f"{model_dir}/ckpt-40", f"{straight_run}/ckpt-40")


# TensorFlow retries an object store's 5xx answers 10 times, up to 32 s apart; two here.
FEW_RETRIES = {"GCS_RETRY_CONFIG_MAX_RETRIES": "2", "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
               "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000"}


@pytest.mark.slow
@STRAIGHT
def test_an_object_store_answering_errors_during_a_save(gcs, gcs_dir, straight_run):
    # Every upload of ckpt-30's files fails (503 Service Unavailable, retried, then given up);
    # the rest of the run's traffic goes through. ckpt-30 is the run's last save: uploads of
    # later checkpoints would go on after the failure and name theirs.
    gcs.inject_faults([{"status": 503, "methods": ["POST", "PUT"], "path_contains": "ckpt-30"}])
    result = train(gcs_dir, 30, env=FEW_RETRIES)
    assert_ended_cleanly(result, f"{gcs_dir}/ckpt-30", "HTTP response code 503", f"{gcs_dir}/ckpt-20")
    assert tf.train.latest_checkpoint(gcs_dir) == f"{gcs_dir}/ckpt-20"
    assert_same_checkpoint(f"{gcs_dir}/ckpt-20", f"{straight_run}/ckpt-20")

    gcs.reset()
    again = train(gcs_dir, 30, here=True)
    assert again.returncode == 0, again.stderr
    assert_same_checkpoint(f"{gcs_dir}/ckpt-30", f"{straight_run}/ckpt-30")


def test_only_errors_naming_the_model_dir_or_a_refusing_errno_are_storage_faults():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/m/metrics.jsonl")
    assert storage_fault_within(full, ModelDir("/m")) == StorageFault("/m/metrics.jsonl", "No space left on device")
    wrapped = RuntimeError("in a hook")
    wrapped.__cause__ = full
    assert storage_fault_within(wrapped, ModelDir("/m")) == StorageFault("/m/metrics.jsonl", "No space left on device")
    upload = tf.errors.AbortedError(None, None, "All 10 retry attempts failed. The last failure: HTTP "
                                    "response code 503 with body 'x'\n\t when uploading gs://b/run/ckpt-9_temp/")
    assert storage_fault_within(upload, ModelDir("gs://b/run")) == StorageFault("gs://b/run/ckpt-9_temp/",
                                                                      "HTTP response code 503")
    # An out-of-memory error names no path: a bug's traceback, not a storage fault.
    oom = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[1000000]")
    assert storage_fault_within(oom, ModelDir("/m")) is None
    assert storage_fault_within(FileNotFoundError(errno.ENOENT, "gone", "/m/x"), ModelDir("/m")) is None
    assert storage_fault_within(ValueError("/m/x"), ModelDir("/m")) is None


@pytest.mark.slow
@STRAIGHT
def test_a_full_local_disk_under_a_bucket_model_dir(gcs, gcs_dir, tmp_path, straight_run):
    # A model dir in a bucket stages its checkpoints on the local disk ($TMPDIR): a 256 KiB
    # tmpfs there has no room for the first one (600 KiB of ballast).
    tmp = str(tmp_path / "tmp")
    mount_tmpfs(tmp, "256k")
    try:
        result = train(gcs_dir, 30, env={"TMPDIR": tmp})
        assert result.returncode == EXIT_STORAGE_FAULT, result.stderr
        lines = ctl_stderr_lines(result.stderr)
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(f"ctl.run: storage error: {tmp}/ctl-stage-"), lines[0]
        assert "(local staging" in lines[0] and "No space left on device" in lines[0], lines[0]
        assert "no checkpoint was complete yet" in lines[0], lines[0]
        assert tf.train.latest_checkpoint(gcs_dir) is None

        subprocess.run(["mount", "-o", "remount,size=8m", tmp], check=True, timeout=30)
        again = train(gcs_dir, 30, env={"TMPDIR": tmp})
        assert again.returncode == 0, again.stderr
        assert_same_checkpoint(f"{gcs_dir}/ckpt-30", f"{straight_run}/ckpt-30")
        assert os.listdir(tmp) == [], os.listdir(tmp)  # Both runs' staging is gone.
    finally:
        umount(tmp)


@pytest.mark.slow
def test_a_full_local_disk_under_the_sidecar_s_restore_copy(gcs, gcs_dir, tmp_path):
    # The sidecar copies a checkpoint's files from the bucket to the local disk ($TMPDIR) before
    # it restores them: a 256 KiB tmpfs there has no room for one (600 KiB of ballast). That is
    # the local disk's fault, not the checkpoint's: exit 74, and evaluated after a restart.
    assert train(gcs_dir, 20).returncode == 0  # ckpt-10, ckpt-20, the run marked finished.
    tmp = str(tmp_path / "tmp")
    mount_tmpfs(tmp, "256k")
    try:
        result = run_ctl("--mode=continuous_eval", f"--model_dir={gcs_dir}", env={"TMPDIR": tmp})
        assert result.returncode == EXIT_STORAGE_FAULT, result.stderr
        lines = ctl_stderr_lines(result.stderr)
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(f"ctl.run: storage error: {tmp}/ctl-stage-"), lines[0]
        assert "No space left on device" in lines[0], lines[0]
        assert ModelDir(gcs_dir).sidecar_evaluations() == []

        subprocess.run(["mount", "-o", "remount,size=8m", tmp], check=True, timeout=30)
        again = run_ctl("--mode=continuous_eval", f"--model_dir={gcs_dir}", env={"TMPDIR": tmp})
        assert again.returncode == 0, again.stderr
        assert [r["number"] for r in ModelDir(gcs_dir).sidecar_evaluations()] == [10, 20]
    finally:
        umount(tmp)


@pytest.mark.slow
@STRAIGHT
def test_a_bucket_gets_a_checkpoint_s_data_then_its_index_then_the_state_file(gcs, gcs_dir, straight_run):
    # Only the upload of ckpt-30's index is refused (503): its data went before it, and the
    # state file that would name it goes after it, so it is never named.
    gcs.inject_faults([{"status": 503, "methods": ["POST", "PUT"], "path_contains": "ckpt-30.index"}])
    result = train(gcs_dir, 30, env=FEW_RETRIES)
    assert_ended_cleanly(result, f"{gcs_dir}/ckpt-30.index", "HTTP response code 503", f"{gcs_dir}/ckpt-20")
    names = tf.io.gfile.listdir(gcs_dir)
    assert "ckpt-30.index" not in names and "ckpt-30.data-00000-of-00001" in names, names
    assert tf.train.latest_checkpoint(gcs_dir) == f"{gcs_dir}/ckpt-20"

    gcs.reset()
    again = train(gcs_dir, 30, here=True)
    assert again.returncode == 0, again.stderr
    assert f"restored model from {gcs_dir}/ckpt-20" in again.stdout, again.stdout
    assert_same_checkpoint(f"{gcs_dir}/ckpt-30", f"{straight_run}/ckpt-30")
