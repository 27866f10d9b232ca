"""The GCS API the suite runs `gs://` tests against (tests/gcs): TensorFlow's own GCS
filesystem, through the emulator's HTTPS proxy port, to the emulator."""

import numpy as np
import pytest
import tensorflow as tf

from tests.support.processes import Process, python_command


def test_gfile_writes_reads_lists_renames_and_globs(gcs_dir):
    gfile = tf.io.gfile
    gfile.makedirs(f"{gcs_dir}/sub/deep")  # Empty `dir/` marker objects beside their children.
    with gfile.GFile(f"{gcs_dir}/a.txt", "w") as f:
        f.write("hello")
    with gfile.GFile(f"{gcs_dir}/sub/deep/x", "w") as f:
        f.write("x")
    big = np.random.default_rng(0).bytes(3 << 20)  # Over TensorFlow's one-request size: resumable.
    with gfile.GFile(f"{gcs_dir}/big", "wb") as f:
        f.write(big)

    with gfile.GFile(f"{gcs_dir}/a.txt") as f:
        assert f.read() == "hello"
    with gfile.GFile(f"{gcs_dir}/big", "rb") as f:
        assert f.read() == big
    assert sorted(gfile.listdir(gcs_dir)) == ["a.txt", "big", "sub/"]
    assert gfile.isdir(f"{gcs_dir}/sub") and gfile.isdir(f"{gcs_dir}/sub/deep")
    gfile.rename(f"{gcs_dir}/a.txt", f"{gcs_dir}/b.txt")
    assert not gfile.exists(f"{gcs_dir}/a.txt") and gfile.exists(f"{gcs_dir}/b.txt")
    assert sorted(gfile.glob(f"{gcs_dir}/*")) == [f"{gcs_dir}/{name}" for name in ("b.txt", "big", "sub")]
    gfile.rmtree(f"{gcs_dir}/sub")
    assert not gfile.exists(f"{gcs_dir}/sub/deep/x")


def test_a_checkpoint_saves_and_restores(gcs_dir):
    weights = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=weights), gcs_dir, max_to_keep=2)
    for _ in range(3):
        weights.assign_add(tf.ones_like(weights))
        manager.save()
    assert tf.train.latest_checkpoint(gcs_dir) == f"{gcs_dir}/ckpt-3"
    assert not tf.io.gfile.glob(f"{gcs_dir}/ckpt-1.*")  # max_to_keep deleted it.

    restored = tf.Variable(tf.zeros((3, 4)))
    tf.train.Checkpoint(w=restored).restore(manager.latest_checkpoint).assert_consumed()
    np.testing.assert_array_equal(restored.numpy(), np.arange(12).reshape(3, 4) + 3)


def test_the_injected_fault_answers_uploads_only(gcs, gcs_dir):
    with tf.io.gfile.GFile(f"{gcs_dir}/kept", "w") as f:
        f.write("before")
    gcs.inject_faults([{"status": 403, "methods": ["POST", "PUT"], "path_contains": "/upload/"}])
    with pytest.raises(tf.errors.PermissionDeniedError):
        with tf.io.gfile.GFile(f"{gcs_dir}/refused", "w") as f:
            f.write("x")
    with tf.io.gfile.GFile(f"{gcs_dir}/kept") as f:  # Reads still go through.
        assert f.read() == "before"
    gcs.reset()
    with tf.io.gfile.GFile(f"{gcs_dir}/refused", "w") as f:
        f.write("after")
    assert tf.io.gfile.exists(f"{gcs_dir}/refused")


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_record_another_process_rewrites_reads_whole(gcs_dir):
    """TensorFlow caches a `gs://` object's size for seconds, and `GFile.read()` asks for
    that many bytes: a record another process rewrote reads cut to the old length.
    `model_dir.read_bytes` (every record read of ctl's, the claims' too) reads one whole
    version each time."""
    from ctl.model_dir import read_bytes, write_atomically

    path = f"{gcs_dir}/record.json"
    versions = {b'{"n": 1}\n'} | {b'{"pad": "' + b"x" * n + b'"}\n' for n in range(40)}
    write_atomically(path, b'{"n": 1}\n')
    rewrite = ("import time; from ctl.model_dir import write_atomically\n"
               "for n in range(100000):\n"
               f"    write_atomically({path!r}, b'{{\"n\": 1}}\\n' if n % 2 else "
               "b'{\"pad\": \"' + b'x' * (n % 40) + b'\"}\\n')\n"
               "    print('wrote', flush=True) if n == 3 else time.sleep(0.1)")
    with Process(python_command(rewrite)) as writer:
        writer.wait_for_line("^wrote$", timeout=120)
        reads = [read_bytes(path) for _ in range(100)]
    assert set(reads) <= versions, {r for r in reads if r not in versions}
    assert len(set(reads)) > 2  # The rewrites did happen meanwhile.
