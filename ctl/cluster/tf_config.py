"""TF_CONFIG: which cluster a process belongs to, and its task in it.

Cluster managers (Kubernetes TFJob, Vertex AI, SageMaker) start the same
command on every host and tell each process its place in the `TF_CONFIG`
environment variable:

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"],
                 "ps": ["host3:2222"], "evaluator": ["host4:2222"]},
     "task": {"type": "worker", "index": 1}}

`read_tf_config` validates it (`ClusterConfig`); what each role runs in it is its plan
(`ctl.cluster.run_plan`).

Pure Python: nothing here starts TensorFlow.
"""

import dataclasses
import json
import os
from typing import Dict, List, Mapping, Optional

from ctl.utils.errors import UserError

ROLES = ("chief", "worker", "ps", "evaluator")
# The strategies (`ctl.cluster.distribute`): here, without TensorFlow, for the flags.
STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server", "tpu")
_EXAMPLE = '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}'


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated TF_CONFIG: the cluster's jobs and this process's task.

    Args:
        cluster: the jobs, each a list of `host:port` addresses.
        task_type: this process's job (`chief`, `worker`, `ps` or `evaluator`).
        task_id: its index in that job.
    """

    cluster: Mapping[str, List[str]]
    task_type: str
    task_id: int

    @property
    def trainers(self) -> int:
        """The number of tasks that run training steps (chief and workers)."""
        return len(self.cluster.get("chief", ())) + len(self.cluster.get("worker", ()))

    @property
    def is_chief(self) -> bool:
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_id == 0 and "chief" not in self.cluster

    def training_cluster(self) -> Dict[str, List[str]]:
        """The jobs TensorFlow's runtime connects: all but the evaluator."""
        return {job: list(tasks) for job, tasks in self.cluster.items() if job != "evaluator"}


def read_tf_config(environ: Mapping[str, str] = os.environ) -> Optional[ClusterConfig]:
    """Parses and validates `TF_CONFIG`; None when it is unset or names no cluster.

    Args:
        environ: the environment to read `TF_CONFIG` from.

    Raises:
        UserError: malformed JSON, or a cluster or task that cannot work.
    """
    value, text = _load(environ)
    cluster, task = value.get("cluster") or {}, value.get("task") or {}
    if not cluster and not task:
        return None  # '{}' is what some launchers set for a single process.
    if not isinstance(cluster, dict) or not cluster:
        raise UserError(f"TF_CONFIG has no \"cluster\" object: {text[:120]!r}; set it like {_EXAMPLE}.")
    for job, tasks in cluster.items():
        if job not in ROLES:
            raise UserError(
                f"TF_CONFIG cluster has an unknown role {job!r}. Expected roles: {', '.join(ROLES)}."
            )
        if not (isinstance(tasks, list) and tasks
                and all(isinstance(t, str) and ":" in t for t in tasks)):
            raise UserError(
                f"TF_CONFIG cluster[{job!r}] must be a non-empty list of \"host:port\" "
                f"strings, got {tasks!r}."
            )
    if not isinstance(task, dict) or "type" not in task:
        raise UserError(
            f"TF_CONFIG has no \"task\": {{\"type\": ..., \"index\": ...}}: {text[:120]!r}; "
            f"set it like {_EXAMPLE}."
        )
    task_type, task_id = task["type"], task.get("index", 0)
    if task_type not in ROLES:
        raise UserError(
            f"TF_CONFIG task type {task_type!r} is not a role ctl knows. "
            f"Expected one of: {', '.join(ROLES)}."
        )
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
        raise UserError(f"TF_CONFIG task index ({task_id!r}) must be a non-negative integer.")
    if len(cluster.get("evaluator", ())) > 1 or (task_type == "evaluator" and task_id > 0):
        raise UserError(
            "TF_CONFIG names a second evaluator (evaluator index "
            f"{max(task_id, len(cluster.get('evaluator', ())) - 1)}); a cluster has at most one "
            "evaluator: evaluate other model dirs with separate jobs."
        )
    if len(cluster.get("chief", ())) > 1:
        raise UserError(f"TF_CONFIG cluster has {len(cluster['chief'])} chiefs; a cluster has at most one.")
    if task_type != "evaluator" and task_id >= len(cluster.get(task_type, ())):
        raise UserError(
            f"TF_CONFIG task {task_type}:{task_id} is not in the cluster, which has "
            f"{len(cluster.get(task_type, ()))} {task_type} task(s); fix \"task\" or \"cluster\"."
        )
    if not any(job in cluster for job in ("chief", "worker")):
        raise UserError("TF_CONFIG cluster has no chief or worker task to train; add a \"worker\" list.")
    return ClusterConfig(cluster={k: list(v) for k, v in cluster.items()},
                         task_type=task_type, task_id=task_id)


def has_evaluator(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether `TF_CONFIG`'s cluster has an `evaluator` task (a sidecar evaluator).

    Reads only the cluster, so that a trainer whose TF_CONFIG names no task of
    its own still hands evaluation to the evaluator; malformed JSON is a `UserError`.
    The plan of a Python caller's created strategy reads it (`ctl.cluster.run_plan.plan`);
    a plan from the flags reads the validated cluster.

    Args:
        environ: the environment to read `TF_CONFIG` from (None: this process's).
    """
    value, _ = _load(os.environ if environ is None else environ)
    cluster = value.get("cluster") or {}
    return isinstance(cluster, dict) and bool(cluster.get("evaluator"))


def _load(environ: Mapping[str, str]):
    """The JSON object in TF_CONFIG (`{}` when unset) and its text."""
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return {}, text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(
            f"TF_CONFIG is not valid JSON ({error}): {text[:120]!r}; set it like {_EXAMPLE}."
        ) from error
    if not isinstance(value, dict):
        raise UserError(f"TF_CONFIG must be a JSON object, got {text[:120]!r}; set it like {_EXAMPLE}.")
    return value, text
