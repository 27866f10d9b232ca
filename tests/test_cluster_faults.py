"""Faults where they really happen: clusters on 127.0.0.1 preempted, killed and poisoned.

Each test runs `python -m ctl.launch` (which starts the tasks, and with
`--restarts` restarts lost ones, as a cluster manager would) on
tests/faults.gin (ProbeTask, seed 7), follows its output and the progress file
the task writes from inside the graph, and signals single tasks by the pid the
launcher prints. Every wait is bounded; each launcher runs in its own session,
killed as a whole in a `finally`.
"""

import glob
import json
import os
import random
import re
import shutil
import signal
import time

import pytest
import tensorflow as tf

import numpy as np

from ctl import launch
from ctl.cluster import peers
from ctl.cluster.peers import EXIT_PEER_LOST
from ctl.faults import run_size
from ctl.core.stop import EXIT_PREEMPTED
from tests.support.env import FAULTS_GIN
from tests.support.processes import Process, ctl_command
from tests.support.probe import read_steps
from tests.support.reading import assert_bit_equal, ctl_stderr_lines, exported, latest_step, model_at, served
from tests.fault_tasks import ProbeTask

# Under xdist (`--dist loadgroup`, pyproject.toml) the tests that share the module's uninterrupted
# reference run are one group, so it runs once; the parameter-server cluster is another.
pytestmark = [pytest.mark.slow, pytest.mark.soak]

TIMEOUT_S = 480
# From a signal or a kill to the exit of every worker, on a loaded 2-core machine
# (docs/faults.md states the bounds these stand for: one step, TensorFlow's
# peer-loss detection).
EXIT_BOUND_S = 60
MULTI_WORKER = ("--mode=train", "--strategy=multi_worker_mirrored")
# Host loop of 400 steps, a checkpoint every 50 (all kept): each phase lasts
# long enough to be interrupted mid-run, and every checkpoint can be evaluated.
LONG_RUN = ("ctl.Schedule.train_steps=400", "ctl.Trainer.use_tf_while_loop=False",
            "ctl.Schedule.steps_per_loop=25", "ctl.Schedule.checkpoint_interval=50",
            "ctl.Schedule.max_checkpoints=100")


class Launched(Process):
    """A `python -m ctl.launch` process (its tasks' output in its stdout, read as it comes)."""

    def __init__(self, tmp_path, name, launch_args, *bindings, run_args=MULTI_WORKER, env=None):
        self.model_dir = str(tmp_path / name)
        self.progress = str(tmp_path / f"{name}.progress")
        super().__init__(ctl_command(
            *launch_args, f"--timeout_s={TIMEOUT_S}", "--", *run_args, f"--model_dir={self.model_dir}",
            f"--gin_file={FAULTS_GIN}", f"--gin_bindings=ProbeTask.progress_file='{self.progress}'",
            *(f"--gin_bindings={b}" for b in bindings), module="ctl.launch"), env=env, merge_stderr=True)

    def wait_for(self, pattern, timeout=TIMEOUT_S, after=0):
        """`wait_for_line` within the cluster's bound."""
        return self.wait_for_line(pattern, timeout, after)

    def task_pid(self, task):
        _, _, match = self.wait_for(rf"^\[launch\] started {task} \(pid (\d+)\)", timeout=60)
        pids = re.findall(rf"^\[launch\] started {task} \(pid (\d+)\)", self.stdout(), re.M)
        return int(pids[-1]) if pids else int(match.group(1))

    def wait_for_step(self, step, timeout=TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            steps = read_steps(self.progress)
            if steps and steps[-1] >= step:
                return steps[-1]
            assert self.proc.poll() is None, self.stdout()[-6000:]
            time.sleep(0.02)
        raise AssertionError(f"step {step} not reached in {timeout}s:\n{self.stdout()[-6000:]}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 2-worker run of LONG_RUN, started at once; `final()` waits for its last checkpoint."""
    run = Launched(tmp_path_factory.mktemp("reference"), "run", ["--workers=2"], *LONG_RUN)

    def final():
        if run.proc.returncode is None:
            assert run.finish(TIMEOUT_S + 60).returncode == 0, run.stdout()[-6000:]
        assert run.proc.returncode == 0, run.stdout()[-6000:]
        return tf.train.latest_checkpoint(run.model_dir)

    yield final
    run.kill()


def start_workers(tmp_path, name, *bindings, count=2):
    """`count` multi-worker `python -m ctl.run` processes without a launcher: each one's own status counts."""
    model_dir = str(tmp_path / name)
    return model_dir, [
        Process.ctl(*MULTI_WORKER, f"--model_dir={model_dir}", f"--gin_file={FAULTS_GIN}",
                    *(f"--gin_bindings={b}" for b in bindings), env={"TF_CONFIG": tf_config})
        for _, tf_config in sorted(launch.tf_configs(launch.local_cluster(count)).items())]


def finish_all(workers, timeout=TIMEOUT_S):
    """(status, ctl's stderr lines) per worker; kills any still running."""
    results = []
    try:
        for worker in workers:
            result = worker.finish(timeout)
            results.append((result.returncode, ctl_stderr_lines(result.stderr)))
    finally:
        for worker in workers:
            worker.kill()
    return results


def evaluations(model_dir):
    """Checkpoint numbers in the evaluator's metrics.jsonl, in order."""
    with open(os.path.join(model_dir, "eval", "metrics.jsonl")) as f:
        return [json.loads(line)["number"] for line in f if line.strip()]


def committed_checkpoints(model_dir):
    return sorted(int(p.rsplit("-", 1)[1].split(".")[0])
                  for p in glob.glob(os.path.join(model_dir, "ckpt-*.index")))


@pytest.mark.xdist_group("beside_the_reference")
def test_multi_worker_sigterm_then_sigkill_resume_bit_identical_beside_a_sidecar(tmp_path, reference):
    """Items 1, 2 and 5: SIGTERM to worker 1, then SIGKILL of the chief, restarts by the launcher."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"chaos seed {seed}")  # Shown on failure: rerun with this seed to replay the kill.
    chaos = Launched(tmp_path, "chaos", ["--workers=2", "--evaluator", "--restarts=2"], *LONG_RUN)
    try:
        # 1. SIGTERM to the non-chief worker: both stop after the same step, one checkpoint.
        chaos.wait_for_step(20)
        os.kill(chaos.task_pid("worker 1"), signal.SIGTERM)
        signalled = time.monotonic()
        stops = {}
        for task in ("worker 0", "worker 1"):
            _, at, match = chaos.wait_for(
                rf"^\[{task}\] ctl.run: preempted: stopped by (.*) at step (\d+); checkpoint (\S+) ",
                timeout=EXIT_BOUND_S)
            stops[task] = (match.group(1), int(match.group(2)))
            assert match.group(3) == os.path.join(chaos.model_dir, f"ckpt-{match.group(2)}")  # The chief's.
            assert at - signalled < EXIT_BOUND_S
        assert stops["worker 1"][0] == "SIGTERM" and "another worker" in stops["worker 0"][0]
        stop_step = stops["worker 0"][1]
        assert stops["worker 1"][1] == stop_step and 20 <= stop_step < 400
        restarted, _, _ = chaos.wait_for(
            rf"^\[launch\] worker \d exited with status {EXIT_PREEMPTED}; restarting worker 0, worker 1")
        for task in ("worker 0", "worker 1"):  # Both exited 75 (the launcher saw the first).
            assert re.search(rf"^\[{task}\] .*preempted", chaos.stdout(), re.M)
        assert stop_step in committed_checkpoints(chaos.model_dir)
        assert read_steps(chaos.progress) == list(range(1, stop_step + 1))  # Nothing past the stop.

        # 2. SIGKILL of the chief at a random step of the resumed run: worker 1 names it and exits 69.
        kill_at = rng.randint(stop_step + 5, 330)
        print(f"SIGKILL of worker 0 at step {kill_at}")
        chaos.wait_for(r"^\[worker 0\] .*restored model from", after=restarted)
        chaos.wait_for_step(kill_at)
        time.sleep(rng.uniform(0, 0.05))
        os.kill(chaos.task_pid("worker 0"), signal.SIGKILL)
        killed = time.monotonic()
        _, at, match = chaos.wait_for(r"^\[worker 1\] ctl.run: peer lost: (.*)", timeout=EXIT_BOUND_S,
                                      after=restarted)
        assert match.group(1).startswith("lost worker 0 (127.0.0.1:"), match.group(0)
        assert at - killed < EXIT_BOUND_S
        chaos.wait_for(rf"^\[launch\] worker \d exited with status (-9|{EXIT_PEER_LOST}); restarting",
                       after=restarted)
        assert chaos.finish(TIMEOUT_S + 60).returncode == 0, chaos.stdout()[-6000:]
    finally:
        chaos.kill()
    assert latest_step(chaos.model_dir) == 400
    # Model, optimizer, RNG state and step, bit for bit, as a run never interrupted.
    assert_bit_equal(reference(), tf.train.latest_checkpoint(chaos.model_dir))
    # 5. The sidecar evaluated every checkpoint exactly once, through both faults, and ended.
    assert evaluations(chaos.model_dir) == committed_checkpoints(chaos.model_dir)
    assert re.search(r"^\[launch\] started evaluator", chaos.stdout(), re.M)
    assert len(re.findall(r"^\[launch\] started evaluator", chaos.stdout(), re.M)) == 1


@pytest.mark.xdist_group("beside_the_reference")
def test_multi_worker_nan_on_one_replica_stops_or_recovers_every_worker_alike(tmp_path, reference):
    """Item 3 ('stop' and 'recover' with a NaN on worker 1's replica only) and item 4 (chief-only side effects)."""
    poison = ("ProbeTask.nan_replica=1", "ctl.Schedule.train_steps=30")
    stop_dir, stopping = start_workers(tmp_path, "stop", "ProbeTask.nan_at_steps=[15]", *poison)
    results = finish_all(stopping)
    for status, lines in results:  # Both workers: the same bad step, exit 2, one line.
        assert status == 2, lines
        assert lines[-1].startswith("ctl.run: error: the training loss is NaN or Inf at step 15 "), lines
    assert latest_step(stop_dir) == 10  # Nothing computed from step 15 saved.

    hooks = ("ctl.Experiment.hooks=[@ctl.hooks.BestCheckpoint(), @ctl.hooks.LatestExporter(), "
             "@ctl.hooks.BestExporter(), @ctl.hooks.FinalExporter()]", "ctl.Schedule.eval_interval=100")
    recovering = Launched(tmp_path, "recover", ["--workers=2"], *LONG_RUN, *hooks,
                          "ProbeTask.nan_at_steps=[123]", "ProbeTask.nan_replica=1",
                          "ctl.FaultTolerance.nan_policy='recover'",
                          run_args=("--mode=train_and_eval", "--strategy=multi_worker_mirrored"))
    try:
        assert recovering.finish(TIMEOUT_S + 60).returncode == 0, recovering.stdout()[-6000:]
    finally:
        recovering.kill()
    model_dir, output = recovering.model_dir, recovering.stdout()
    for task in ("worker 0", "worker 1"):  # Both restored the same checkpoint and replayed.
        assert re.search(rf"^\[{task}\] .*loss is NaN or Inf at step 123: restored .*ckpt-100, "
                         r"replaying from step 100", output, re.M), output[-6000:]
    assert_bit_equal(reference(), tf.train.latest_checkpoint(model_dir))

    # Side effects: by the chief alone, once each, equal to their checkpoints.
    assert exported(model_dir, "latest") == [100, 200, 300, 400]
    assert exported(model_dir, "final") == [400]
    for line in re.findall(r"^\[(worker \d)\] .*(?:export \| step|best \| step)", output, re.M):
        assert line == "worker 0"
    assert len(re.findall(r"^\[worker 0\] .*export \| step:    400 \| final SavedModel", output, re.M)) == 1
    features = np.random.default_rng(3).normal(size=(5, 3)).astype(np.float32)
    for name, step in [("latest", 200), ("final", 400), ("best", exported(model_dir, "best")[-1])]:
        expected = model_at(os.path.join(model_dir, f"ckpt-{step}"), ProbeTask())(features).numpy()
        np.testing.assert_array_equal(
            served(os.path.join(model_dir, "export", name, str(step)), features), expected, err_msg=name)
    with open(os.path.join(model_dir, "best", "best.json")) as f:
        best_step = json.load(f)["step"]
    assert_bit_equal(os.path.join(model_dir, "best", f"ckpt-{best_step}", "ckpt"),
                     os.path.join(model_dir, f"ckpt-{best_step}"))
    # Worker 1 wrote nothing in the model dir: every summary is worker 0's (<host>.<pid>.<n>.v2),
    # its checkpoints went to a scratch dir, now gone.
    events = glob.glob(os.path.join(model_dir, "**", "events.out.tfevents.*"), recursive=True)
    assert {os.path.basename(path).split(".")[-3] for path in events} == {str(recovering.task_pid("worker 0"))}
    assert re.search(r"^\[worker 1\] .*saved checkpoint to .*ctl-worker-checkpoints-", output, re.M)
    assert not re.search(r"^\[worker 1\] .*saved checkpoint to " + re.escape(model_dir), output, re.M)


PARAMETER_SERVERS = ("--mode=train", "--strategy=parameter_server")
WORKERS = 2  # Of the parameter-server cluster.
# One loop of 100,000 scheduled steps: a stop must not wait for it to end.
PS_RUN = ("ctl.Schedule.train_steps=1000000", "ctl.Schedule.steps_per_loop=100000",
          "ctl.Schedule.checkpoint_interval=100000", "ProbeTask.print_steps=True")


# The coordinator's verdict on a frozen ps (item 8'), sooner than the 30 s default: a wait the test
# sits out (`ctl.cluster.peers.answer_timeout_s`). Still three probe intervals: a live ps on the
# loaded host answers in time, as the cluster's steps before the freeze show.
ANSWER_TIMEOUT_S = 15


def checkpoint_step(path):
    return int(tf.train.load_variable(path, "global_step/.ATTRIBUTES/VARIABLE_VALUE"))


@pytest.mark.xdist_group("parameter_servers")
def test_parameter_servers_lose_a_worker_the_coordinator_and_the_ps(tmp_path):
    """Items 6, 7 and 8 (the ps killed, then frozen) on one cluster (chief + 2 workers + 1 ps),
    restarted by the launcher; then NaN under parameter servers."""
    cluster = Launched(tmp_path, "ps", [f"--workers={WORKERS}", "--ps=1", "--restarts=3"], *PS_RUN,
                       run_args=PARAMETER_SERVERS, env={peers.ANSWER_TIMEOUT_ENV: str(ANSWER_TIMEOUT_S)})
    try:
        # 6. A worker is killed: the coordinator goes on with the other, the restarted one rejoins.
        cluster.wait_for_step(30)
        os.kill(cluster.task_pid("worker 1"), signal.SIGKILL)
        restarted, _, _ = cluster.wait_for(r"^\[launch\] worker 1 exited with status -9; restarting worker 1 ")
        cluster.wait_for(r"^\[worker 1\] probe step \d+", after=restarted)  # It runs steps again.
        cluster.wait_for(r"^\[worker 0\] probe step \d+", after=restarted)
        launcher = [line for _, line in cluster.lines if line.startswith(("[launch]", "[chief] ctl.run"))]
        assert sum(line.startswith("[launch] started chief") for line in launcher) == 1, "\n".join(launcher)

        # 7. SIGTERM to the coordinator in the middle of its 100,000-step loop: checkpoint, exit 75.
        os.kill(cluster.task_pid("chief"), signal.SIGTERM)
        signalled = time.monotonic()
        _, at, match = cluster.wait_for(r"^\[chief\] ctl.run: preempted: stopped by SIGTERM at step "
                                        r"(\d+); checkpoint (\S+) ", timeout=EXIT_BOUND_S)
        assert at - signalled < EXIT_BOUND_S
        stop_step, path = int(match.group(1)), match.group(2)
        assert checkpoint_step(path) == stop_step and path == tf.train.latest_checkpoint(cluster.model_dir)
        preempted, _, _ = cluster.wait_for(
            rf"^\[launch\] chief exited with status {EXIT_PREEMPTED}; restarting chief, worker 0, worker 1, ps 0")
        restored, _, _ = cluster.wait_for(rf"^\[chief\] .*restored model from {re.escape(path)}",
                                          after=preempted)
        # At least once: every step the workers started (each prints once) is in the global step,
        # but the one cut off by the kill, run again elsewhere, counts once or twice; the steps
        # scheduled after the signal did not run. Counted up to the restarted coordinator's restore
        # (before it no restarted worker runs a step): a worker's last lines may reach the launcher's
        # output after its line about the coordinator's exit, and the killed worker's last line may
        # be lost with it (seen: 600 lines for global step 601).
        started = sum(1 for _, line in cluster.lines[:restored] if re.match(r"\[worker \d\] probe step", line))
        assert stop_step - 1 <= started <= stop_step + 1, (started, stop_step)
        # Steps print the optimizer's iterations + 1, which lag the global step under parameter
        # servers (docs/faults.md): the first steps after the restart continue from the checkpoint's.
        iterations = int(tf.train.load_variable(path, "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))
        resumed = cluster.wait_for(r"^\[worker \d\] probe step (\d+)", after=restored)[2]
        assert iterations < int(resumed.group(1)) <= iterations + 2

        # 8. The ps is killed: the coordinator says so in one line and exits 69 by itself; the
        # launcher then restarts the whole cluster, which resumes from the last checkpoint.
        cluster.wait_for_step(iterations + 30)
        os.kill(cluster.task_pid("ps 0"), signal.SIGKILL)
        killed = time.monotonic()
        _, at, match = cluster.wait_for(r"^\[chief\] ctl.run: peer lost: (.*)", timeout=EXIT_BOUND_S,
                                        after=preempted)
        assert at - killed < EXIT_BOUND_S
        assert match.group(1).startswith("lost ps 0 (127.0.0.1:"), match.group(0)
        assert "worker" not in match.group(1).split(" (TensorFlow")[0], match.group(0)
        lost, _, _ = cluster.wait_for(
            rf"^\[launch\] (ps 0 exited with status -9|chief exited with status {EXIT_PEER_LOST}); "
            "restarting chief, worker 0, worker 1, ps 0", after=preempted)
        restored, _, _ = cluster.wait_for(rf"^\[chief\] .*restored model from {re.escape(path)}",
                                          after=lost)

        # 8'. The new ps freezes (SIGSTOP: its sockets stay open, TensorFlow waits on it forever):
        # the coordinator's watchdog names it and the coordinator exits 69 within the stated bound.
        cluster.wait_for(r"^\[worker \d\] probe step", after=restored)
        os.kill(cluster.task_pid("ps 0"), signal.SIGSTOP)
        frozen = time.monotonic()
        _, at, match = cluster.wait_for(r"^\[chief\] ctl.run: peer lost: (.*)", after=restored,
                                        timeout=ANSWER_TIMEOUT_S + EXIT_BOUND_S)
        assert ANSWER_TIMEOUT_S - peers.PROBE_INTERVAL_S < at - frozen \
            < ANSWER_TIMEOUT_S + EXIT_BOUND_S, at - frozen
        assert re.match(rf"lost ps 0 \(127.0.0.1:\d+\) \(no answer to a probe in {ANSWER_TIMEOUT_S} s",
                        match.group(1)), match.group(0)
        cluster.wait_for(rf"^\[launch\] chief exited with status {EXIT_PEER_LOST}", after=restored)
    finally:
        cluster.kill()
    # Restarting the whole cluster resumes from the last checkpoint; a NaN loss there is seen by the
    # scheduled steps (item 7: the guard), 'recover' restores that checkpoint and replays to train_steps.
    target = stop_step + 20
    poisoned = stop_step + 10  # A global step: the first step that starts at or past it.
    again = Launched(tmp_path, "ps", [f"--workers={WORKERS}", "--ps=1"], *PS_RUN[1:],
                     f"ctl.Schedule.train_steps={target}", f"ProbeTask.nan_at_steps=[{poisoned}]",
                     "ctl.Experiment.trainer_cls=@GlobalStepTrainer",
                     "ctl.FaultTolerance.nan_policy='recover'", run_args=PARAMETER_SERVERS)
    try:
        assert again.finish(TIMEOUT_S + 60).returncode == 0, again.stdout()[-6000:]
    finally:
        again.kill()
    assert f"restored model from {path}" in again.stdout()
    recovered = re.findall(rf"^\[chief\] .*loss is NaN or Inf at step (\d+): restored {re.escape(path)}, "
                           rf"replaying from step {stop_step} ", again.stdout(), re.M)
    assert len(recovered) == 1, again.stdout()[-6000:]
    # The bad step is the global step when the poisoned step, or a step that saw its NaN weights,
    # recorded it: not before the poisoned step's own increment, and not after the steps that can
    # finish while it runs: one already running on each worker, and the steps scheduled after it
    # (the coordinator schedules at most 4 per worker ahead of the oldest unfinished step).
    bad_step = int(recovered[0])
    assert poisoned <= bad_step <= poisoned + WORKERS + 4 * WORKERS, (bad_step, poisoned)
    assert checkpoint_step(tf.train.latest_checkpoint(again.model_dir)) == target


@pytest.mark.xdist_group("beside_the_reference")
def test_multi_worker_restart_at_a_new_size_two_workers_one_then_two(tmp_path, reference):
    """Item 'restart at a new size': the same global step, the examples consumed carried over, one WARNING."""
    model_dir = tmp_path / "resized"
    shutil.copytree(os.path.dirname(reference()), model_dir)  # 400 steps by 2 workers: [0, 0, 2, 2, 4].
    record = run_size.TRAIN_EXAMPLES + "/.ATTRIBUTES/VARIABLE_VALUE"
    for workers, target, expected in [(1, 420, [3200, 400, 1, 1, 8]), (2, 440, [3360, 420, 2, 2, 4])]:
        run = Launched(tmp_path, "resized", [f"--workers={workers}"], *LONG_RUN[1:],
                       f"ctl.Schedule.train_steps={target}")
        try:
            assert run.finish(TIMEOUT_S + 60).returncode == 0, run.stdout()[-6000:]
        finally:
            run.kill()
        for task in range(workers):  # Each worker says it once.
            warnings = re.findall(rf"^\[worker {task}\] .*at a new size: it was written by a run of "
                                  r"(\d) input pipeline\(s\).* this one has (\d) input pipeline", run.stdout(), re.M)
            assert warnings == [(str(3 - workers), str(workers))], run.stdout()[-6000:]
            assert re.search(rf"^\[worker {task}\] .*restored model from .*ckpt-{target - 20}", run.stdout(), re.M)
        path = tf.train.latest_checkpoint(str(model_dir))
        assert checkpoint_step(path) == target
        assert list(tf.train.load_variable(path, record)) == expected
