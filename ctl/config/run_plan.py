"""The modes of a run, and the plan of one: what this process does, decided once.

    python -m ctl.run --mode=train|eval|train_and_eval|continuous_eval   (MODES; or smoke)

The composition root (`ctl.train_lib.run_experiment`) makes one `RunPlan`
from the mode and the cluster (is this process the chief? one process, or the
workers of a multi-worker cluster? an evaluator task beside the trainers?) and
passes it down; nothing below compares mode strings:

    mode              train  evaluate  in-line eval  sidecar
    train             yes    -         -             -
    eval              -      yes       -             -
    train_and_eval    yes    yes       yes           -
    continuous_eval   -      -         -             yes (`ctl.sidecar.continuous_eval`)

The chief writes the model dir (config, summaries, the finished marker) and
holds the trainer's lock; it alone owns an eval-side role. `train_and_eval`
trains without in-line evaluation when TF_CONFIG has an evaluator task.
Pure Python: `ctl.run`'s flags read `MODES` before TensorFlow is imported.
"""

import dataclasses

from ctl.utils.errors import require_choice

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


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What one process runs for `mode`.

    Attributes:
      mode: one of `MODES` (`train_and_eval` beside an evaluator task becomes `train`).
      chief: this process writes the model dir (False: another worker of its cluster).
      one_process: not a multi-worker cluster, whose workers must agree on every
        evaluation (only then does in-line evaluation step aside for a sidecar).
    """

    mode: str
    chief: bool = True
    one_process: bool = True

    def __post_init__(self):
        require_choice("mode", self.mode, MODES)

    def without_in_line_eval(self) -> "RunPlan":
        """This plan training only: an evaluator task evaluates (`train_and_eval` -> `train`)."""
        return dataclasses.replace(self, mode=TRAIN) if self.in_line_eval else self

    @property
    def sidecar(self) -> bool:
        """A sidecar evaluator (`continuous_eval`): none of what follows applies."""
        return self.mode == CONTINUOUS_EVAL

    @property
    def train(self) -> bool:
        return self.mode in (TRAIN, TRAIN_AND_EVAL)

    @property
    def evaluate(self) -> bool:
        """The Trainer evaluates (in-line, or `eval`'s one evaluation)."""
        return self.mode in (EVAL, TRAIN_AND_EVAL)

    @property
    def in_line_eval(self) -> bool:
        """Trains and evaluates between train loops."""
        return self.mode == TRAIN_AND_EVAL

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
        """Writes the HParams summary (`ctl.comforts.hparams`)."""
        return self.train and self.chief
