"""The sweep's progress on the console: one line after each trial that ends.

    sweep | worker 0 | 7/12 ended (4 complete, 2 pruned, 1 failed), 2 running | best accuracy = 0.9611 (trial 3)

Once every worker ended, the command prints it once more (`sweep | done: ...`)
with where to look; a sweep in which no trial ended but failed ends instead
with one line on stderr naming the first failed trial's own line, and exits
`EXIT_ALL_FAILED` (1, as a run whose task has a bug: docs/reference/exit-statuses.md).
"""

from optuna.trial import TrialState

from ctl.sweep.study import Study

EXIT_ALL_FAILED = 1
FAILED = TrialState.FAIL


def line(study: Study, objective: str) -> str:
    """The console line of the sweep's progress: trials ended, pruned, failed, running, and the best so far.

    Args:
        study: the sweep's study.
        objective: the objective's name.
    """
    counts = study.counts()
    ended = counts["complete"] + counts["pruned"] + counts["fail"]
    best = study.best()
    best_text = (f"best {objective} = {best.value:.6g} (trial {best.number})" if best is not None
                 else "no trial complete yet")
    return (f"{ended}/{study.budget} ended ({counts['complete']} complete, {counts['pruned']} "
            f"pruned, {counts['fail']} failed), {counts['running']} running | {best_text}")
