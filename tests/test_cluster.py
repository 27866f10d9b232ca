"""TF_CONFIG validation, the role each task plays, and the launcher's process handling."""

import io
import json
import os
import socket
import sys

import pytest
import tensorflow as tf

from ctl import launch
from ctl.cluster import peers, run_plan, tf_config as cluster
from ctl.utils.errors import UserError
from ctl.core.stop import EXIT_PREEMPTED
from tests.support.env import TEST_GIN
from tests.support.in_process import run_ctl_in_process
from tests.support.reading import ctl_stderr_lines


def tf_config(cluster_spec, task_type, index=0):
    return {"TF_CONFIG": json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})}


WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]}
PS = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]}


def plan(spec, task_type, index=0, mode="train_and_eval", strategy="multi_worker_mirrored"):
    return run_plan.plan(mode, strategy, cluster.read_tf_config(tf_config(spec, task_type, index)))


@pytest.mark.parametrize("value", [None, "", "  ", "{}"])
def test_no_tf_config_is_a_single_process(value):
    environ = {} if value is None else {"TF_CONFIG": value}
    assert cluster.read_tf_config(environ) is None
    assert run_plan.plan("train", "mirrored", None) == run_plan.RunPlan("train", strategy="mirrored")


BAD_TF_CONFIGS = {
    "not json": ("{'cluster': }", "TF_CONFIG is not valid JSON"),
    "not an object": ("[1, 2]", "must be a JSON object"),
    "no task": (json.dumps({"cluster": {"worker": ["h:1"]}}), "has no \"task\""),
    "no cluster": (json.dumps({"task": {"type": "worker", "index": 0}}), "has no \"cluster\""),
    "unknown task role": (tf_config({"worker": ["h:1"]}, "master")["TF_CONFIG"],
                          "task type 'master' is not a role"),
    "unknown cluster role": (tf_config({"worker": ["h:1"], "learner": ["h:2"]}, "worker")["TF_CONFIG"],
                             "unknown role 'learner'"),
    "second evaluator (index)": (tf_config(WORKERS, "evaluator", 1)["TF_CONFIG"], "second evaluator"),
    "second evaluator (cluster)": (tf_config({"worker": ["h:1"], "evaluator": ["h:2", "h:3"]},
                                             "worker")["TF_CONFIG"], "second evaluator"),
    "index out of range": (tf_config(WORKERS, "worker", 2)["TF_CONFIG"], "task worker:2 is not in the cluster"),
    "negative index": (tf_config(WORKERS, "worker", -1)["TF_CONFIG"], "task index (-1)"),
    "address without port": (tf_config({"worker": ["localhost"]}, "worker")["TF_CONFIG"], "host:port"),
    "two chiefs": (tf_config({"chief": ["h:1", "h:2"]}, "chief")["TF_CONFIG"], "2 chiefs"),
    "no trainer": (tf_config({"ps": ["h:1"]}, "ps")["TF_CONFIG"], "no chief or worker"),
}


@pytest.mark.parametrize("case", sorted(BAD_TF_CONFIGS))
def test_bad_tf_config_is_a_clear_user_error(case):
    text, message = BAD_TF_CONFIGS[case]
    with pytest.raises(UserError) as error:
        cluster.read_tf_config({"TF_CONFIG": text})
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_multi_worker_roles():
    chief = plan(WORKERS, "worker", 0)
    assert (chief.serve, chief.mode, chief.strategy) == (False, "train_and_eval", "multi_worker_mirrored")
    assert chief.cluster.is_chief and not plan(WORKERS, "worker", 1).cluster.is_chief
    assert chief.chief and not plan(WORKERS, "worker", 1).chief and not chief.one_process
    assert chief.cluster.training_cluster() == {"worker": WORKERS["worker"]}  # No evaluator.
    # The evaluator task evaluates: the trainers train without in-line evaluation.
    assert chief.train and not chief.evaluate and chief.leaves_eval_to_evaluator
    evaluator = plan(WORKERS, "evaluator")
    assert (evaluator.serve, evaluator.mode, evaluator.strategy) == (False, "continuous_eval", "mirrored")
    assert evaluator.sidecar and not evaluator.train
    alone = plan({"worker": WORKERS["worker"]}, "worker", 1)
    assert alone.in_line_eval and alone.evaluate and not alone.chief


def test_parameter_server_roles():
    coordinator = plan(PS, "chief", mode="train", strategy="parameter_server")
    assert coordinator.train and coordinator.chief and not coordinator.serve
    assert plan(PS, "worker", 1, strategy="parameter_server").serve
    assert plan(PS, "ps", strategy="parameter_server").serve
    with pytest.raises(UserError, match="trains with --mode=train; evaluation runs in the evaluator"):
        plan(PS, "chief", mode="train_and_eval", strategy="parameter_server")
    with pytest.raises(UserError, match="needs a chief, at least one worker and at least one ps"):
        plan({"worker": ["h:1"], "ps": ["h:2"]}, "worker", strategy="parameter_server")
    with pytest.raises(UserError, match="needs a TF_CONFIG"):
        run_plan.plan("train", "parameter_server", None)


def test_strategy_and_cluster_must_agree():
    with pytest.raises(UserError, match="--strategy=mirrored trains in one process"):
        plan(WORKERS, "worker", strategy="mirrored")
    with pytest.raises(UserError, match="only --strategy=parameter_server uses"):
        plan(PS, "worker", strategy="multi_worker_mirrored")
    # A one-task TF_CONFIG (as some managers set) is fine with a local strategy.
    assert plan({"worker": ["h:1"]}, "worker", strategy="mirrored").train


def test_local_cluster_layout_and_tf_configs():
    spec = launch.local_cluster(workers=2, ps=1, evaluator=True)
    assert {job: len(tasks) for job, tasks in spec.items()} == {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}
    addresses = [a for tasks in spec.values() for a in tasks]
    assert len(set(addresses)) == 5 and all(a.startswith("127.0.0.1:") for a in addresses)
    configs = launch.tf_configs(spec)
    assert sorted(configs) == ["chief", "evaluator", "ps 0", "worker 0", "worker 1"]
    for name, text in configs.items():  # Each is valid and names its own task.
        parsed = cluster.read_tf_config({"TF_CONFIG": text})
        expected_id = int(name.split(" ")[-1]) if " " in name else 0
        assert (parsed.task_type, parsed.task_id) == (name.split(" ")[0], expected_id)
    assert set(launch.local_cluster(workers=3)) == {"worker"}


# A stand-in task for the launcher's process handling: "worker 1" exits with
# status 3 after a moment, every other task runs until it is stopped.
_TASK = """
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("started", task["type"], task["index"], flush=True)
if (task["type"], task["index"]) == ("worker", 1):
    time.sleep(float(sys.argv[1])); sys.exit(3)
time.sleep(600)
"""


def _cluster(delay, out, **kwargs):
    return launch.Cluster([str(delay)], out=out, command=[sys.executable, "-c", _TASK], **kwargs)


@pytest.mark.slow
def test_launcher_stops_every_task_when_one_fails():
    out = io.StringIO()
    cluster_ = _cluster(1.0, out, workers=2, ps=1)
    try:
        assert cluster_.wait(timeout=120) == 3
        assert all(p.poll() is not None for p in cluster_.processes.values())
    finally:
        cluster_.stop()
    text = out.getvalue()
    for name in ("chief", "worker 0", "worker 1", "ps 0"):  # Every line has its task's prefix.
        assert f"[{name}] started {name.split(' ')[0]} {name.split(' ')[-1] if ' ' in name else 0}" in text
    assert "[launch] worker 1 exited with status 3; stopping all tasks." in text


@pytest.mark.slow
def test_launcher_timeout_stops_every_task():
    out = io.StringIO()
    cluster_ = _cluster(600, out, workers=1, evaluator=True)
    try:
        assert cluster_.wait(timeout=3) == 124
        assert all(p.poll() is not None for p in cluster_.processes.values())
    finally:
        cluster_.stop()
    assert "[launch] timed out after 3s" in out.getvalue()


@pytest.mark.parametrize("text,message", [
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": ', "TF_CONFIG is not valid JSON"),
    (tf_config({"worker": ["127.0.0.1:1"], "evaluator": ["127.0.0.1:2"]}, "evaluator", 1)["TF_CONFIG"],
     "second evaluator"),
], ids=["malformed", "second evaluator"])
def test_cli_refuses_a_bad_tf_config_in_one_line(tmp_path, text, message):
    # `python -m ctl.run`'s main in this process: TF_CONFIG is read before any strategy is made.
    code, _, stderr = run_ctl_in_process(["--mode=train", f"--model_dir={tmp_path}", f"--gin_file={TEST_GIN}",
                                          "--strategy=multi_worker_mirrored"], env={"TF_CONFIG": text})
    assert code == 2, stderr
    lines = ctl_stderr_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith("ctl.run: error: TF_CONFIG ") and message in lines[0], lines
    assert os.listdir(tmp_path) == []


def test_has_evaluator():
    assert cluster.has_evaluator(tf_config(WORKERS, "worker", 1))
    assert not cluster.has_evaluator(tf_config(PS, "ps"))
    assert not cluster.has_evaluator({})


def test_a_lost_peer_is_the_task_that_refuses_connections_else_the_one_the_error_names():
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    alive, dead = listening.getsockname()[1], gone.getsockname()[1]
    gone.close()
    try:
        spec = {"worker": ["127.0.0.1:1", f"127.0.0.1:{alive}", f"127.0.0.1:{dead}"]}
        me = cluster.ClusterConfig(spec, "worker", 0)
        # TensorFlow's message names the task that reported the failure, not always the lost one.
        assert peers.lost_tasks(me, "from remote target /job:worker/replica:0/task:1") == [
            f"worker 2 (127.0.0.1:{dead})"]
        both_up = cluster.ClusterConfig({"worker": spec["worker"][:2]}, "worker", 0)
        heartbeat = "The following tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1"
        assert peers.lost_tasks(both_up, heartbeat) == [f"worker 1 (127.0.0.1:{alive})"]
        with pytest.raises(peers.PeerLost, match=r"^lost worker 1 \(127.0.0.1:\d+\) \(TensorFlow: The following"):
            with peers.reported_as_peer_loss(both_up):
                raise tf.errors.UnavailableError(None, None, "Graph execution error:\n" + heartbeat)
        # Parameter servers: a lost ps is what stops the coordinator; workers stopped beside it
        # (a cluster manager restarting the job) are not named.
        ps_cluster = cluster.ClusterConfig(
            {"chief": ["127.0.0.1:1"], "worker": [f"127.0.0.1:{dead}"], "ps": [f"127.0.0.1:{dead}"]},
            "chief", 0)
        assert peers.lost_tasks(ps_cluster, "/job:worker/replica:0/task:0") == [f"ps 0 (127.0.0.1:{dead})"]
        # Every peer up and none named: not a lost peer, the error stays as it was.
        with pytest.raises(tf.errors.UnavailableError):
            with peers.reported_as_peer_loss(both_up):
                raise tf.errors.UnavailableError(None, None, "gs://bucket unavailable")
    finally:
        listening.close()


@pytest.mark.parametrize("value", ["9.5", "ten", "inf", "nan", ""])
def test_a_bad_ps_answer_timeout_is_a_user_error_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("CTL_PS_ANSWER_TIMEOUT_S", value)
    with pytest.raises(UserError, match=rf"^CTL_PS_ANSWER_TIMEOUT_S='{value}' is not a number of seconds of "
                                        r"at least 10; set it to one \(the default is 30\), or unset it$"):
        peers.answer_timeout_s()


def test_the_ps_answer_timeout_is_30_s_or_the_environment_s(monkeypatch):
    monkeypatch.delenv("CTL_PS_ANSWER_TIMEOUT_S", raising=False)
    assert peers.answer_timeout_s() == peers.ANSWER_TIMEOUT_S == 30
    monkeypatch.setenv("CTL_PS_ANSWER_TIMEOUT_S", "12.5")
    ps_cluster = cluster.ClusterConfig({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                                        "ps": ["127.0.0.1:3"]}, "chief", 0)
    assert peers.PsWatchdog(ps_cluster).answer_timeout_s == 12.5


def test_launcher_restarts_what_a_cluster_manager_would():
    assert launch.RESTARTABLE == (EXIT_PREEMPTED, peers.EXIT_PEER_LOST)
    assert all(launch.restartable(s) for s in (75, 69, -9, -15, 137, 143))
    assert not any(launch.restartable(s) for s in (1, 2, 124, 130))


# Stand-in multi-worker tasks for the restart policy: the first time, worker 1 is
# preempted (75) and worker 0 then loses its peer (69); started again, both succeed.
_RESTARTED_TASK = """
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
runs = os.path.join(sys.argv[1], f"{task['type']}-{task['index']}")
with open(runs, "a") as f:
    f.write("run\\n")
first = open(runs).read().count("run") == 1
if first and task["index"] == 1:
    sys.exit(75)
while first and not os.path.exists(os.path.join(sys.argv[1], "worker-1")):
    time.sleep(0.05)
sys.exit(69 if first else 0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("restarts", [1, 0])
def test_launcher_restarts_every_multi_worker_worker_together(tmp_path, restarts):
    out = io.StringIO()
    cluster_ = launch.Cluster([str(tmp_path)], workers=2, out=out, restarts=restarts,
                              command=[sys.executable, "-c", _RESTARTED_TASK])
    try:
        status = cluster_.wait(timeout=120)
    finally:
        cluster_.stop()
    text = out.getvalue()
    if not restarts:  # No restart left: the first failure ends everything, with its status.
        assert status in (75, 69) and "stopping all tasks" in text
        return
    assert status == 0, text
    assert text.count("restarting worker 0, worker 1 (0 restart(s) left)") == 1
    for name in ("worker-0", "worker-1"):
        assert open(tmp_path / name).read().count("run") == 2
