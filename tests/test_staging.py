"""Local staging of a model dir in an object store (ctl.model_dir.staging): one root per process,
removed when the process ends, and after a SIGKILL by the next process; a live process's root
is never touched. Real processes, `$TMPDIR` pointed at the test's own directory."""

import os
import signal

import pytest

from ctl.model_dir import staging
from tests.support.processes import Process, python_command
from tests.support.probe import read_steps, run_to_end, Trainer

# A process that makes its staging root, says where, and waits for a line on stdin.
HOLDER = ("import sys; from ctl.model_dir import staging; print(staging.directory('probe'), flush=True); "
          "sys.stdin.readline()")


def roots(tmp):
    return sorted(name for name in os.listdir(tmp) if name.startswith(staging.PREFIX))


def ctl_entries(tmp):
    """What ctl made in `tmp` (TensorFlow's own upload buffers are named otherwise)."""
    return sorted(name for name in os.listdir(tmp) if name.startswith("ctl-"))


def holder(tmp):
    proc = Process(python_command(HOLDER), env={"TMPDIR": str(tmp)}, stdin=True)
    _, _, said = proc.wait_for_line(".", timeout=120)
    made = said.string.strip()
    assert made.startswith(str(tmp)) and os.path.isdir(made), made
    return proc, os.path.dirname(made)


@pytest.mark.slow  # Starts a Python process (tests/support/tiers.py).
def test_a_dead_process_s_root_is_cleared_by_the_next_one_and_a_live_one_s_is_kept(tmp_path):
    live, live_root = holder(tmp_path)
    dead, dead_root = holder(tmp_path)
    try:
        dead.kill()  # SIGKILL: nothing of it runs, its root stays.
        assert roots(tmp_path) == sorted(map(os.path.basename, (live_root, dead_root)))
        newcomer, new_root = holder(tmp_path)  # Makes its root: clears the dead one's first.
        assert os.path.isdir(live_root) and not os.path.exists(dead_root)
        newcomer.write_line("")
        newcomer.finish(timeout=30)  # Ends normally: its root goes with it.
        assert newcomer.returncode == 0 and not os.path.exists(new_root)
        assert roots(tmp_path) == [os.path.basename(live_root)]
    finally:
        for proc in (live, dead):
            proc.kill()
    assert roots(tmp_path) == [os.path.basename(live_root)]  # Killed at last: it stays...
    staging.clear_dead_roots(str(tmp_path))
    assert roots(tmp_path) == []  # ...until a process makes its root and clears the dead ones.


@pytest.mark.slow
def test_a_trainer_on_gs_leaves_no_local_staging_behind_even_after_a_sigkill(
        gcs, gcs_dir, tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # The trainers' temporary dir (os.environ goes on).
    progress, hold = str(tmp_path / "progress"), str(tmp_path / "hold")
    trainer = Trainer(gcs_dir, progress, "ctl.Schedule.train_steps=40",
                      "ProbeTask.hold_at_step=25", f"ProbeTask.hold_file='{hold}'")
    try:
        assert trainer.wait_for_step(25, timeout=240), trainer.finish().stderr
        trainer.proc.send_signal(signal.SIGKILL)
    finally:
        trainer.kill()
    assert ctl_entries(tmp)  # Checkpoints and summaries staged; nothing ran to remove them.
    run_to_end(gcs_dir, progress, "ctl.Schedule.train_steps=40")
    assert read_steps(progress)[-1] == 40
    assert ctl_entries(tmp) == []  # The dead run's staging cleared at start, this run's at its end.
