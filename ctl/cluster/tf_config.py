"""TF_CONFIG: which cluster a process belongs to, and what it does in it.

Cluster managers (Kubernetes TFJob, Vertex AI, SageMaker) start the same
command on every host and tell each process its place in the `TF_CONFIG`
environment variable:

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"],
                 "ps": ["host3:2222"], "evaluator": ["host4:2222"]},
     "task": {"type": "worker", "index": 1}}

`read_tf_config` validates it and `plan` decides, from the role and
`--strategy`, what this process runs (its `RunPlan`, made once by `ctl.run`
and passed down):

    role        multi_worker_mirrored        parameter_server
    chief       trains (writes model_dir)    coordinates training (writes model_dir)
    worker      trains (worker 0 is chief     serves steps for the coordinator
                when there is no chief)
    ps          -- (an error)                serves variables
    evaluator   runs --mode=continuous_eval on the model dir (either strategy)

Pure Python: nothing here starts TensorFlow.
"""

import dataclasses
import json
import os
from typing import Dict, List, Mapping, Optional

from ctl.config.run_plan import CONTINUOUS_EVAL, EVAL, MODES, SMOKE, TRAIN, TRAIN_AND_EVAL
from ctl.utils.errors import UserError, require_choice

ROLES = ("chief", "worker", "ps", "evaluator")
# The strategies (`ctl.cluster.distribute`): here, without TensorFlow, for the flags.
STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server", "tpu")
LOCAL_STRATEGIES = ("default", "one_device", "mirrored")
# The strategies whose processes are the tasks of TF_CONFIG's cluster (the others run in one process).
CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
# What an evaluator, outside the training cluster, evaluates under.
_EVALUATOR_STRATEGY = {"multi_worker_mirrored": "mirrored", "parameter_server": "default",
                       "tpu": "default"}
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


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What one process runs: decided once, at the entry, and passed down.

    `ctl.run` makes it with `plan` (the flags and TF_CONFIG); a Python caller of
    `ctl.run_experiment` gets one from its mode and strategy
    (`ctl.cluster.distribute.plan_for_strategy`). Nothing below compares mode
    strings; they read these properties:

        mode              train  evaluate  in-line eval  sidecar
        train             yes    -         -             -
        eval              -      yes       -             -
        train_and_eval    yes    yes       yes           -   (beside an evaluator: train only)
        continuous_eval   -      -         -             yes (`ctl.sidecar.continuous_eval`)

    The chief writes the model dir (config, summaries, the finished marker) and
    holds the trainer's lock; it alone owns an eval-side role.

    Args:
      mode: one of `MODES`, or `smoke` (`ctl.smoke`); None for a task that only
        serves (`serve`). The evaluator task of a cluster runs `continuous_eval`.
      chief: this process writes the model dir (False: another worker of its cluster).
      one_process: not a multi-worker cluster, whose workers must agree on every
        evaluation (only then does in-line evaluation step aside for a sidecar).
      evaluator_beside: TF_CONFIG's cluster has an evaluator task, which evaluates
        this run: `train_and_eval` trains without in-line evaluation.
      strategy: the strategy to create (`--strategy`); None when the caller gives one.
      cluster: the validated TF_CONFIG, or None for a single process.
    """

    mode: Optional[str]
    chief: bool = True
    one_process: bool = True
    evaluator_beside: bool = False
    strategy: Optional[str] = None
    cluster: Optional[ClusterConfig] = None

    def __post_init__(self):
        if self.mode is not None:
            require_choice("mode", self.mode, MODES + (SMOKE,))

    @property
    def serve(self) -> bool:
        """A worker or ps task of parameter-server training: a `tf.distribute.Server`, nothing else."""
        return self.mode is None

    @property
    def sidecar(self) -> bool:
        """A sidecar evaluator (`continuous_eval`): none of what follows applies."""
        return self.mode == CONTINUOUS_EVAL

    @property
    def train(self) -> bool:
        return self.mode in (TRAIN, TRAIN_AND_EVAL)

    @property
    def in_line_eval(self) -> bool:
        """Trains and evaluates between train loops."""
        return self.mode == TRAIN_AND_EVAL and not self.evaluator_beside

    @property
    def evaluate(self) -> bool:
        """The Trainer evaluates (in-line, or `eval`'s one evaluation)."""
        return self.mode == EVAL or self.in_line_eval

    @property
    def leaves_eval_to_evaluator(self) -> bool:
        """`train_and_eval` beside an evaluator task: trains only."""
        return self.mode == TRAIN_AND_EVAL and self.evaluator_beside

    @property
    def writes(self) -> bool:
        """Writes the model dir (config, summaries, metrics.jsonl, the finished marker)."""
        return self.chief

    @property
    def locks(self) -> bool:
        """Holds the trainer's claim on the model dir (`ctl.faults.lock`)."""
        return self.train and self.chief

    @property
    def marks_finished(self) -> bool:
        return self.train and self.chief

    @property
    def eval_side(self) -> bool:
        """Takes part in the evaluator role (`ctl.model_dir.evaluator_role`): its eval-side hooks."""
        return self.evaluate and self.chief

    @property
    def steps_aside(self) -> bool:
        """Its in-line evaluation steps aside while a live sidecar serves the model dir."""
        return self.in_line_eval and self.one_process

    @property
    def hparams(self) -> bool:
        """Writes the HParams summary (`ctl.hooks.hparams`)."""
        return self.train and self.chief


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


def plan(mode: str, strategy: str, cluster: Optional[ClusterConfig]) -> RunPlan:
    """Decides what this process runs for `--mode` and `--strategy` in `cluster`.

    Args:
      mode: `--mode`: one of `MODES`, or `smoke`.
      strategy: `--strategy`: one of `STRATEGIES`.
      cluster: `read_tf_config()`'s answer (None: no cluster).

    Raises:
      UserError: the strategy and the cluster disagree (one line that says the fix).
    """
    if cluster is None:
        if strategy == "parameter_server":
            raise UserError(
                "--strategy=parameter_server needs a TF_CONFIG naming a chief, workers and ps "
                "tasks; set TF_CONFIG on every task, or try a cluster on this machine with "
                "`python -m ctl.launch --workers=2 --ps=1 -- ...`."
            )
        return RunPlan(mode, strategy=strategy, one_process=_one_process(strategy))
    if cluster.task_type == "evaluator":
        return RunPlan(CONTINUOUS_EVAL, strategy=_EVALUATOR_STRATEGY.get(strategy, strategy),
                       cluster=cluster)
    if strategy in LOCAL_STRATEGIES:
        if cluster.task_type == "ps" or cluster.trainers > 1:
            raise UserError(
                f"TF_CONFIG describes a cluster ({_describe(cluster)}) but --strategy={strategy} "
                "trains in one process; use --strategy=multi_worker_mirrored or "
                "--strategy=parameter_server, or unset TF_CONFIG."
            )
        return _trainer_plan(cluster, mode, strategy)
    if strategy == "parameter_server":
        if len(cluster.cluster.get("chief", ())) != 1 or not cluster.cluster.get("worker") \
                or not cluster.cluster.get("ps"):
            raise UserError(
                f"--strategy=parameter_server needs a chief, at least one worker and at least "
                f"one ps in TF_CONFIG; it has {_describe(cluster)}."
            )
        if cluster.task_type in ("worker", "ps"):
            return RunPlan(None, strategy=strategy, cluster=cluster)
        if mode != TRAIN:
            raise UserError(
                f"Received mode={mode!r} with --strategy=parameter_server, which trains with "
                "--mode=train; evaluation runs in the evaluator task (add \"evaluator\" to "
                "TF_CONFIG)."
            )
        return _trainer_plan(cluster, mode, strategy)
    # multi_worker_mirrored and tpu: every chief and worker trains.
    if "ps" in cluster.cluster:
        raise UserError(
            f"TF_CONFIG has ps tasks, which only --strategy=parameter_server uses "
            f"(received --strategy={strategy}); remove \"ps\" or change --strategy."
        )
    return _trainer_plan(cluster, mode, strategy)


def _trainer_plan(cluster: ClusterConfig, mode: str, strategy: str) -> RunPlan:
    """The plan of a chief or worker task of `cluster` that runs `mode`: the chief is
    TF_CONFIG's under a strategy of the cluster's processes, else this one process."""
    return RunPlan(mode, chief=cluster.is_chief if strategy in CLUSTER_STRATEGIES else True,
                   one_process=_one_process(strategy),
                   evaluator_beside="evaluator" in cluster.cluster, strategy=strategy,
                   cluster=cluster)


def _one_process(strategy: str) -> bool:
    """Whether in-line evaluation may step aside for a sidecar (`RunPlan.one_process`)."""
    return strategy != "multi_worker_mirrored"


def _describe(cluster: ClusterConfig) -> str:
    return ", ".join(f"{len(tasks)} {job}" for job, tasks in cluster.cluster.items())


def has_evaluator(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether `TF_CONFIG`'s cluster has an `evaluator` task (a sidecar evaluator).

    Reads only the cluster, so that a trainer whose TF_CONFIG names no task of
    its own still hands evaluation to the evaluator; malformed JSON is a `UserError`.
    A Python caller's plan reads it (`ctl.cluster.distribute.plan_for_strategy`);
    `plan` reads the validated cluster.

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
