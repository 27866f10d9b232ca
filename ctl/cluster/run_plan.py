"""The run's plan: what one process runs for its mode and its place in a cluster.

    python -m ctl.run --mode=train|eval|train_and_eval|continuous_eval   (MODES; or smoke)

`plan` is the one maker of a `RunPlan`: `ctl.run` calls it once with its flags and
TF_CONFIG (`ctl.cluster.tf_config.read_tf_config`), `ctl.run_experiment` with a Python
caller's mode and the strategy it created; the plan is passed down and nothing below
compares mode strings. From the flags, each role of a cluster runs:

    role        multi_worker_mirrored        parameter_server
    chief       trains (writes model_dir)    coordinates training (writes model_dir)
    worker      trains (worker 0 is chief     serves steps for the coordinator
                when there is no chief)
    ps          -- (an error)                serves variables
    evaluator   runs --mode=continuous_eval on the model dir (either strategy)

Pure Python: `ctl.run`'s flags read `MODES` before TensorFlow is imported.
"""

import dataclasses
from typing import TYPE_CHECKING, Optional, Union

from ctl.cluster.tf_config import ClusterConfig, has_evaluator
from ctl.utils.errors import UserError, require_choice

if TYPE_CHECKING:
    import tensorflow as tf

TRAIN = "train"
EVAL = "eval"
TRAIN_AND_EVAL = "train_and_eval"
CONTINUOUS_EVAL = "continuous_eval"
MODES = (TRAIN, EVAL, TRAIN_AND_EVAL, CONTINUOUS_EVAL)  # `ctl.MODES`
"""What `ctl.run_experiment` (and `python -m ctl.run --mode`) can run: `train` (to
`ctl.Schedule.train_steps`), `eval` (one evaluation of the latest checkpoint),
`train_and_eval` (train, evaluating every `ctl.Schedule.eval_interval` steps) and
`continuous_eval` (a sidecar: evaluate each new checkpoint of the model dir)."""
SMOKE = "smoke"  # `python -m ctl.run --mode=smoke` (`ctl.smoke`), not a mode of `run_experiment`.

# The strategies of one process on one machine (with a TF_CONFIG of several trainers: an error).
LOCAL_STRATEGIES = ("default", "one_device", "mirrored")
# The strategies whose processes are the tasks of TF_CONFIG's cluster (the others run in one process).
CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
# What an evaluator, outside the training cluster, evaluates under.
_EVALUATOR_STRATEGY = {"multi_worker_mirrored": "mirrored", "parameter_server": "default",
                       "tpu": "default"}


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What one process runs: decided once, at the entry, and passed down.

    `plan` makes it: `ctl.run` from the flags and TF_CONFIG, `ctl.run_experiment`
    from a Python caller's mode and strategy. Nothing below compares mode
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
        """Holds the trainer's claim on the model dir (`ctl.model_dir.trainer_lock`)."""
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


def plan(mode: str, strategy: Union[str, "tf.distribute.Strategy"],
         cluster: Optional[ClusterConfig] = None) -> RunPlan:
    """The one maker of a `RunPlan`: what this process runs for `mode` under `strategy`.

    `ctl.run` passes its flags (`--strategy` by name, with TF_CONFIG's cluster);
    `ctl.run_experiment` passes a Python caller's mode and the strategy it created,
    whose cluster resolver says whether this process is the chief and one of several
    workers (TF_CONFIG then says only whether an evaluator task is beside it).

    Args:
      mode: `--mode`: one of `MODES`, or `smoke` with a strategy's name; one of
        `MODES` with a created strategy.
      strategy: `--strategy`, one of `STRATEGIES`; or a created `tf.distribute.Strategy`.
      cluster: `read_tf_config()`'s answer (None: no cluster); with a created
        strategy, None (its resolver has the cluster).

    Raises:
      UserError: the strategy and the cluster disagree, or the mode is not one of them
        (one line that says the fix).
    """
    if isinstance(strategy, str):
        return _from_flags(mode, strategy, cluster)
    return _for_strategy(mode, strategy)


def _from_flags(mode: str, strategy: str, cluster: Optional[ClusterConfig]) -> RunPlan:
    """What this process runs for `--mode` and `--strategy` in `cluster`."""
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


def _for_strategy(mode: str, strategy: "tf.distribute.Strategy") -> RunPlan:
    """The plan of a Python caller of `ctl.run_experiment`, from the strategy it created."""
    import tensorflow as tf  # Imported already: the caller created a strategy.

    require_choice("mode", mode, MODES)
    return RunPlan(mode, chief=is_chief(strategy),
                   one_process=not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
                   evaluator_beside=has_evaluator())


def is_chief(strategy: "tf.distribute.Strategy") -> bool:
    """Whether this process writes checkpoints, summaries and configs.

    Args:
        strategy: the run's strategy.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker"
        and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict()
    )
