"""What a sidecar evaluator does next: its settings, progress and policy.

Pure Python, no TensorFlow: the TensorFlow side (`ctl.sidecar.continuous_eval`) lists
the checkpoints it sees and asks `Scheduler.decide` what to do:

    progress = Progress.from_json(...)        # what earlier runs already did
    scheduler = Scheduler(settings, progress, clock=time.monotonic)
    while True:
      decision = scheduler.decide(ready_checkpoints, final_number)
      if decision.kind == EVALUATE: evaluate it, then progress.record(...)
      elif decision.kind == WAIT: sleep(settings.poll_interval)
      else: stop (FINISHED, MAX_EVALUATIONS or TIMEOUT)

Checkpoints are named by their number (`ckpt-N`; for ctl's trainer, N is the
global step). Each number is handled at most once: once `Progress` holds it as
evaluated, failed or deleted, no policy picks it again, also after a restart.
"""

import dataclasses
import json
import time
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

import gin

from ctl.utils.errors import UserError, require_choice

POLICIES = ("all", "latest")

# What became of a checkpoint.
EVALUATED = "evaluated"
FAILED = "failed"  # Corrupt or truncated: could not be read.
DELETED = "deleted"  # Gone before it could be read (e.g. `max_to_keep`).
SKIPPED = "skipped"  # Passed over by the `latest` policy.
OUTCOMES = (EVALUATED, FAILED, DELETED, SKIPPED)

# What to do next.
EVALUATE = "evaluate"
WAIT = "wait"
FINISHED = "finished"
MAX_EVALUATIONS = "max_evaluations"
TIMEOUT = "timeout"


@gin.configurable(module="ctl")
@dataclasses.dataclass(frozen=True)
class ContinuousEval:
    """Settings of `--mode=continuous_eval`, configured by gin.

        ctl.ContinuousEval.policy = 'latest'
        ctl.ContinuousEval.timeout = 600

    Args:
      policy: 'all' evaluates every checkpoint in order of its number; 'latest'
        skips to the newest one (for evaluators slower than the trainer).
      timeout: seconds without a new checkpoint after which the evaluator
        gives up (exit status 2); `None` waits forever.
      max_evaluations: stop (exit 0) once the eval dir holds this many
        evaluations, counted over restarts; `None` for no limit.
      poll_interval: seconds between looks at the model dir.
      settle_seconds: a checkpoint not yet named in the `checkpoint` state file
        is read only once its index file is this old (it may still be written).
      callbacks: removed (kept only to name its replacement in one line): Keras
        callbacks go to `ctl.hooks.KerasCallbacks`, the same route in-line and here.
    """

    policy: str = "all"
    timeout: Optional[float] = 3600.0
    max_evaluations: Optional[int] = None
    poll_interval: float = 0.05
    settle_seconds: float = 1.0
    callbacks: Sequence[Any] = ()  # Removed: any value is a UserError naming the replacement.

    def __post_init__(self):
        if self.callbacks:
            raise UserError(
                "ctl.ContinuousEval.callbacks is gone: list @ctl.hooks.KerasCallbacks() in "
                "ctl.Experiment.hooks and bind ctl.hooks.KerasCallbacks.callbacks = [...] "
                "instead (the same calls in-line and on the sidecar; docs/comforts.md).")
        require_choice("ctl.ContinuousEval.policy", self.policy, POLICIES)
        for name in ("timeout", "max_evaluations"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise UserError(
                    f"ctl.ContinuousEval.{name} ({value!r}) must be positive or None; "
                    f"fix it with --gin_bindings='ctl.ContinuousEval.{name} = ...'."
                )
        for name in ("poll_interval", "settle_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UserError(
                    f"ctl.ContinuousEval.{name} ({value!r}) must be a non-negative number of "
                    "seconds."
                )


@dataclasses.dataclass
class Progress:
    """Which checkpoint numbers this eval dir has handled, and how.

    Args:
        outcomes: checkpoint number -> how it was handled (one of `OUTCOMES`).
    """

    outcomes: Dict[int, str] = dataclasses.field(default_factory=dict)

    @property
    def evaluations(self) -> int:
        return sum(outcome == EVALUATED for outcome in self.outcomes.values())

    def handled(self, number: int) -> bool:
        """Whether checkpoint `number` was handled.

        Args:
            number: a checkpoint number.
        """
        return number in self.outcomes

    def record(self, number: int, outcome: str) -> None:
        """Records how checkpoint `number` was handled.

        Args:
            number: a checkpoint number.
            outcome: how it was handled.
        """
        self.outcomes[number] = outcome

    def to_record(self) -> Dict[str, Any]:
        return {"version": 1,
                "checkpoints": {str(n): self.outcomes[n] for n in sorted(self.outcomes)}}

    @classmethod
    def from_record(cls, record: Any) -> "Progress":
        """The progress a `to_record()` value holds; empty for anything else (e.g. a
        damaged file: the metrics file still says what was evaluated).

        Args:
            record: a parsed JSON value (anything: a damaged file's gives an empty progress).
        """
        checkpoints = record.get("checkpoints") if isinstance(record, dict) else None
        if not isinstance(checkpoints, dict):
            return cls()
        return cls({int(n): outcome for n, outcome in checkpoints.items()
                    if str(n).isdigit() and outcome in OUTCOMES})

    def to_json(self) -> str:
        return json.dumps(self.to_record(), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: Optional[str]) -> "Progress":
        """The progress the JSON `text` holds (`from_record`).

        Args:
            text: the record file's text, or None.
        """
        return cls.from_record(json.loads(text) if text else None)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the evaluator does next (`Scheduler.decide`).

    Args:
        kind: the action: `EVALUATE`, `WAIT`, or an end (`FINISHED`, `MAX_EVALUATIONS`, `TIMEOUT`).
        number: the checkpoint to evaluate (for `EVALUATE`).
        skipped: older checkpoints the `latest` policy passes over.
    """

    kind: str
    number: Optional[int] = None  # The checkpoint to evaluate (EVALUATE).
    skipped: Sequence[int] = ()  # Older checkpoints the `latest` policy passes over.


class Scheduler:
    """Decides, from the ready checkpoints, what the evaluator does next.

    `clock` returns seconds (monotonic); the idle timeout counts from the
    scheduler's creation or the last new checkpoint seen, whichever is later.

    Args:
        settings: the sidecar's settings.
        progress: what the eval dir has handled so far.
        clock: returns seconds (monotonic).
    """

    def __init__(self, settings: ContinuousEval, progress: Progress,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.progress = progress
        self._clock = clock
        self._seen = set()
        self._idle_since = clock()

    def idle_seconds(self) -> float:
        return self._clock() - self._idle_since

    def decide(self, ready: Iterable[int], final: Optional[int] = None,
               present: Iterable[int] = ()) -> Decision:
        """What to do now.

        Args:
            ready: numbers of committed checkpoints.
            final: the trainer's last checkpoint, once it marked the run finished (else None).
            present: the numbers of those visible, committed or not (the `all` policy waits
                for a lower one to commit rather than evaluate out of order).
        """
        ready = set(ready)
        present = set(present) | ready
        if ready - self._seen:
            self._seen |= ready
            self._idle_since = self._clock()
        limit = self.settings.max_evaluations
        if limit is not None and self.progress.evaluations >= limit:
            return Decision(MAX_EVALUATIONS)
        if final is not None and self.progress.handled(final):
            return Decision(FINISHED)
        pending = sorted(n for n in ready if not self.progress.handled(n))
        if self.settings.policy == "latest":
            newest = max(self.progress.outcomes, default=None)
            pending = [n for n in pending if newest is None or n > newest]
        if pending:
            if self.settings.policy == "all":
                lower = [n for n in present if n < pending[0] and not self.progress.handled(n)]
                if lower:  # Not committed yet: keep step order.
                    return self._wait_or_timeout()
                return Decision(EVALUATE, pending[0])
            return Decision(EVALUATE, pending[-1], skipped=tuple(pending[:-1]))
        if final is not None and final not in present and not any(n > final for n in present):
            # The trainer finished, yet its final checkpoint is not (or no longer)
            # there: nothing more will come.
            if self.idle_seconds() >= self.settings.settle_seconds:
                return Decision(FINISHED)
        return self._wait_or_timeout()

    def _wait_or_timeout(self) -> Decision:
        timeout = self.settings.timeout
        if timeout is not None and self.idle_seconds() >= timeout:
            return Decision(TIMEOUT)
        return Decision(WAIT)
