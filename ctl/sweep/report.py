"""`python -m ctl.report <sweep_dir>`: the trials of a sweep sorted by the objective, and a PNG.

The table has a row per trial of the budget: completed trials first, best
first (by their objective), then pruned ones (by the value they were pruned
at), failed, running and waiting ones; each with its state and its time in the
console's words (`ctl.sweep.progress`: `failed`, from its start to its end),
value, sampled bindings and the steps its run trained. A failed trial's one
line follows the table. The PNG (`<sweep_dir>/report.png`, or `--output`) has
the optimization history (each trial's value and the best so far, on integer
trial ticks) and a panel per binding of the space, its values against the
objective: completed trials as dots, pruned ones as crosses (the value they
were pruned on), failed ones, which have no value, as triangles on the x
axis, a choice's values as categories, a log-uniform range on a log
axis (the space as the study keeps it from its sweep file).

The study is found through `<sweep_dir>/sweep.json` (`ctl.sweep.storage`); a
PostgreSQL study whose URL needs a password reads it from `PGPASSWORD`.
"""

import os
from typing import Any, Dict, List, Optional, Tuple

from ctl.utils.errors import UserError


def _order(trial, maximize: bool) -> Tuple[int, float, int]:
    rank = {"COMPLETE": 0, "PRUNED": 1, "FAIL": 2, "RUNNING": 3, "WAITING": 4}[trial.state.name]
    value = trial.value if trial.value is not None else float("nan")
    key = -value if maximize else value
    return rank, key if key == key else float("inf"), trial.number


def load(sweep_dir: str):
    """(record, study, trials of the budget) of `sweep_dir`.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
    """
    try:
        import optuna
    except ImportError as error:
        raise UserError("reading a sweep needs Optuna, which is not installed: pip install -e "
                        "'.[sweep]' in ctl's checkout.") from error
    from ctl.sweep.storage import open_storage
    from ctl.sweep.sweep_dir import read_record

    record = read_record(sweep_dir)
    if not isinstance(record, dict) or "study" not in record:
        raise UserError(f"{sweep_dir}/sweep.json is unreadable; run the sweep's command again to "
                        "rewrite it.")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(sweep_dir, record.get("storage"))
    loaded = optuna.load_study(study_name=record["study"], storage=storage)
    budget = record.get("trials") or len(loaded.trials)
    return record, loaded, [t for t in loaded.get_trials(deepcopy=False) if t.number < budget]


def _steps(trial, sweep_dir: str, trials_dir: Optional[str]) -> Optional[int]:
    from ctl.model_dir import ModelDir
    from ctl.sweep.study import MODEL_DIR
    from ctl.sweep.sweep_dir import trial_dir

    model_dir = trial.system_attrs.get(MODEL_DIR) or trial_dir(sweep_dir, trial.number, trials_dir)
    steps = [r.get("step") for r in ModelDir(model_dir).metrics()]
    steps = [s for s in steps if isinstance(s, int)]
    return max(steps) if steps else None


def table(sweep_dir: str) -> Tuple[str, list, dict, Any]:
    """(the table's text, the trials of the budget, sweep.json's record, the Optuna study).

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
    """
    from ctl.sweep.progress import state_word, trial_seconds

    record, loaded, trials = load(sweep_dir)
    maximize = record.get("direction", "maximize") == "maximize"
    objective = record.get("objective", "value")
    bindings = sorted({name for t in trials for name in t.params})
    header = ["trial", "state", objective, *bindings, "steps", "time"]
    rows, failures = [], []
    for trial in sorted(trials, key=lambda t: _order(t, maximize)):
        steps, seconds = _steps(trial, sweep_dir, record.get("trials_dir")), trial_seconds(trial)
        rows.append([str(trial.number), state_word(trial),
                     "-" if trial.value is None else f"{trial.value:.6g}",
                     *(_short(trial.params.get(name, "-")) for name in bindings),
                     "-" if steps is None else str(steps),
                     "-" if seconds is None else f"{seconds:.0f}s"])
        if trial.state.name == "FAIL" and trial.user_attrs.get("fail_reason"):
            failures.append(f"trial {trial.number} failed: {trial.user_attrs['fail_reason']}")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    elsewhere = f"; model dirs in {record['trials_dir']}" if record.get("trials_dir") else ""
    lines = [f"ctl report: sweep {record['study']!r} in {sweep_dir}: {len(trials)} trials, "
             f"{record.get('direction', 'maximize')} {objective}{elsewhere}",
             "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("-" * len(lines[-1]))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines + failures), trials, record, loaded


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def space_of(loaded, trials, record: Optional[dict] = None) -> Dict[str, Tuple[str, list]]:
    """{binding: (kind, values)} of the sweep file that created the study (`ctl.sweep.study`
    keeps it); for a study made before ctl kept it, the sweep file `sweep.json` names, else
    guessed from the values sampled.

    Args:
        loaded: the Optuna study.
        trials: the budget's trials.
        record: the sweep's record (`sweep.json`), or None.
    """
    from ctl.sweep import sweep_file
    from ctl.sweep.study import SWEEP_FILE

    kept = loaded.user_attrs.get(SWEEP_FILE) or {}
    if not kept and (record or {}).get("sweep_file"):
        try:
            kept = sweep_file.identity(sweep_file.load(record["sweep_file"]))
        except UserError:
            pass  # Gone or changed since: guessed below.
    space = {binding: (kind, list(values)) for binding, kind, values in kept.get("space", [])}
    for name in sorted({name for t in trials for name in t.params} - set(space)):
        values = sorted({t.params[name] for t in trials if name in t.params}, key=repr)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        space[name] = ("uniform", values) if numeric else ("choice", values)
    return space


def plot(trials: list, record: dict, path: str,
         space: Optional[Dict[str, Tuple[str, list]]] = None) -> List[Dict[str, Any]]:
    """Optimization history and each binding against the objective, as one PNG (written
    atomically): completed trials as dots, pruned ones as crosses (at the value they were pruned
    on), failed ones (no value) as triangles on the x axis; a choice's values as categories in
    the file's order, a log-uniform range on a log axis, integers on integer ticks. Returns what
    each panel shows (title, x scale, x tick labels, x range, points per state).

    Args:
        trials: the budget's trials.
        record: the sweep's record (`sweep.json`).
        path: where the PNG goes.
        space: `space_of`'s answer (None: computed here).
    """
    from matplotlib.ticker import MaxNLocator

    from ctl.figures import pyplot, write_png

    plt = pyplot()
    objective = record.get("objective", "value")
    maximize = record.get("direction", "maximize") == "maximize"
    space = space or {}
    scored = sorted((t for t in trials if t.value is not None and t.state.name in STATES),
                    key=lambda t: t.number)
    failed = sorted((t for t in trials if t.state.name == "FAIL"), key=lambda t: t.number)
    bindings = list(space) or sorted({name for t in trials for name in t.params})
    panels = 1 + len(bindings)
    columns = min(3, panels)
    rows = -(-panels // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    history = axes.flat[0]
    for state in STATES:
        points = [(t.number, t.value) for t in scored if t.state.name == state]
        history.plot([p[0] for p in points], [p[1] for p in points], STATES[state],
                     linestyle="none", label=state.lower())
    _failed(history, [t.number for t in failed])
    best: List[Tuple[int, float]] = []
    for t in (t for t in scored if t.state.name == "COMPLETE"):
        value = t.value if not best else (max if maximize else min)(best[-1][1], t.value)
        best.append((t.number, value))
    history.step([p[0] for p in best], [p[1] for p in best], where="post", label="best so far")
    history.set_title("optimization history")
    history.set_xlabel("trial")
    history.xaxis.set_major_locator(MaxNLocator(integer=True))
    history.legend(fontsize="small")
    for axis, name in zip(list(axes.flat)[1:], bindings):
        kind, values = space.get(name, ("uniform", []))
        for state in STATES:
            points = [(t.params[name], t.value) for t in scored
                      if t.state.name == state and name in t.params]
            xs = [values.index(p[0]) if kind == "choice" and p[0] in values else p[0]
                  for p in points]
            axis.plot(xs, [p[1] for p in points], STATES[state], linestyle="none",
                      label=state.lower())
        _failed(axis, [values.index(t.params[name]) if kind == "choice" and t.params[name] in values
                       else t.params[name] for t in failed if name in t.params])
        if kind == "choice":
            axis.set_xticks(range(len(values)), [_short(v) for v in values])
            axis.set_xlim(-0.5, len(values) - 0.5)
        if kind.endswith("log_uniform"):
            axis.set_xscale("log")
        if kind.startswith("int_"):
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_title(name, fontsize="small")
    for axis in list(axes.flat)[:panels]:
        axis.set_ylabel(objective)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[panels:]:
        axis.axis("off")
    figure.tight_layout()
    shown = [_shown(axis) for axis in list(axes.flat)[:panels]]
    write_png(figure, path)
    return shown


# The states drawn at their value, with their markers: completed trials as dots, pruned ones as crosses.
STATES = {"COMPLETE": "o", "PRUNED": "x"}
FAILED_LABEL = "failed (no value)"  # Failed trials: triangles on the x axis, at their x.


def _failed(axis, xs: list) -> None:
    """Failed trials on `axis`: at their x (trial number, binding value), on the x axis itself (they have
    no value), so that a trial or a category that only failed is not an empty spot."""
    if xs:
        axis.plot(xs, [0] * len(xs), "v", color="tab:red", linestyle="none", label=FAILED_LABEL,
                  transform=axis.get_xaxis_transform(), clip_on=False, zorder=3)


def _shown(axis) -> Dict[str, Any]:
    """What a panel shows: its title, x scale, x tick labels, its x range and points per state."""
    axis.figure.canvas.draw()
    labels = {state.lower() for state in STATES} | {FAILED_LABEL}
    points = {line.get_label(): len(line.get_xdata()) for line in axis.get_lines()
              if line.get_label() in labels}
    return {"title": axis.get_title(), "xscale": axis.get_xscale(),
            "xticks": [label.get_text() for label in axis.get_xticklabels()],
            "xlim": tuple(float(x) for x in axis.get_xlim()),
            "points": {("failed" if label == FAILED_LABEL else label): n for label, n in points.items()}}


def report(sweep_dir: str, output: Optional[str] = None) -> Tuple[str, str]:
    """(table, png path) of the sweep in `sweep_dir`.

    Args:
        sweep_dir: the sweep dir (local: the study's journal, the record, the workers' slots, the trial logs).
        output: where the PNG goes (default: `report.png` in the sweep dir).
    """
    text, trials, record, loaded = table(sweep_dir)
    output = output or os.path.join(sweep_dir, "report.png")
    plot(trials, record, output, space_of(loaded, trials, record))
    return text, output
