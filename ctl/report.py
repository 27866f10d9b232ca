"""`python -m ctl.report --model_dir=DIR`: a summary table and a PNG of the curves.

With several runs (`--model_dir=A --model_dir=B ...`, e.g. a sweep) it prints
one table, a row per run: the settings that differ between them (their
operative gin values, as in their HParams summaries) and the last value of
each eval metric; the PNG overlays their curves, a panel per metric
(`<common parent>/report.png`, or `--output`).

Reads the scalars of `<model_dir>/train` and `<model_dir>/eval` from their
TensorBoard event files (tensorboard's `EventAccumulator`), prints one row per
metric (last value, best value and its step, number of points), the last
step and the wall time the events span, and writes the training and eval
curves to `<model_dir>/report.png` (or `--output`). The best checkpoint's record
(ctl.hooks.best) is printed when there is one.

"Best" is the minimum for metrics named like a loss or an error (loss, error,
mae, mse, perplexity), else the maximum.

A sweep dir (`python -m ctl.sweep`'s `--sweep_dir`, as `--model_dir` or as the one
argument: `python -m ctl.report runs/digits_sweep`) gets `ctl.sweep.report`'s view:
its trials sorted by the objective, and a PNG of the optimization history and
of each binding against the objective.
"""

import os
from typing import Dict, List, Tuple

from ctl.utils import process_end

if __name__ == "__main__":  # First, so that it runs after every other exit handler.
    process_end.end_after_exit_handlers()

from absl import app, flags, logging

from ctl.utils.errors import UserError, exit_with_error, first_line, flags_parser

FLAGS = flags.FLAGS
SKIPPED_TAGS = ("steps_per_second",)
REPORT_FILE = "report.png"  # In the model dir (or beside the runs compared): the curves.
Curve = List[Tuple[int, float, float]]  # (step, wall time, value)


def read_scalars(summary_dir: str) -> Dict[str, Curve]:
    """Maps tag -> [(step, wall_time, value)] for every scalar under `summary_dir`.

    Args:
        summary_dir: a directory of TensorBoard event files (its subdirectories too).
    """
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator

    if not tf.io.gfile.isdir(summary_dir):
        return {}
    accumulator = event_accumulator.EventAccumulator(
        summary_dir, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    curves: Dict[str, Curve] = {}
    for tag in tags.get("scalars", []):
        curves[tag] = [(e.step, e.wall_time, float(e.value)) for e in accumulator.Scalars(tag)]
    for tag in tags.get("tensors", []):
        events = accumulator.Tensors(tag)
        points = []
        for event in events:
            value = tf.make_ndarray(event.tensor_proto)
            if value.size != 1 or value.dtype.kind not in "fiub":
                points = []
                break
            points.append((event.step, event.wall_time, float(value.reshape(()))))
        if points:
            curves[tag] = sorted(points)
    return curves


def lower_is_better(tag: str) -> bool:
    """Whether a smaller value of `tag` is better (a loss, an error).

    Args:
        tag: a scalar's tag.
    """
    name = tag.lower()
    return any(word in name for word in ("loss", "error", "mae", "mse", "perplexity"))


def summarize(curves: Dict[str, Curve]) -> List[Tuple[str, float, float, int, int]]:
    """(tag, last, best, best step, points) for each tag, sorted by tag.

    Args:
        curves: tag -> [(step, wall_time, value)].
    """
    rows = []
    for tag, points in sorted(curves.items()):
        if tag in SKIPPED_TAGS or not points:
            continue
        pick = min if lower_is_better(tag) else max
        best_step, _, best = pick(points, key=lambda p: p[2])
        rows.append((tag, points[-1][2], best, best_step, len(points)))
    return rows


def table(directory, train: Dict[str, Curve], evals: Dict[str, Curve]) -> str:
    """The summary of the run in `directory` (a `ctl.model_dir.ModelDir`).

    Args:
        directory: the run's model dir.
        train: the train curves by tag.
        evals: the eval curves by tag.
    """
    from ctl.hooks.best import best_record

    lines = [f"ctl report: {directory.path}"]
    everything = [p for curves in (train, evals) for c in curves.values() for p in c]
    if everything:
        last_step = max(p[0] for p in everything)
        seconds = max(p[1] for p in everything) - min(p[1] for p in everything)
        lines.append(f"steps: {last_step}   time: {seconds:.1f}s")
    header = f"{'':6} {'metric':24} {'last':>12} {'best':>12} {'at step':>8} {'points':>7}"
    lines += [header, "-" * len(header)]
    for kind, curves in (("train", train), ("eval", evals)):
        for tag, last, best, step, count in summarize(curves):
            lines.append(f"{kind:6} {tag:24} {last:12.6g} {best:12.6g} {step:8d} {count:7d}")
    record = best_record(directory)
    if record:
        lines.append(f"best checkpoint: {record['metric']} = {record['value']:.6g} at step "
                     f"{record['step']} ({record['path']})")
    return "\n".join(lines)


def plot(train: Dict[str, Curve], evals: Dict[str, Curve], path: str) -> None:
    """One panel per metric, train and eval curves together.

    Args:
        train: the train curves by tag.
        evals: the eval curves by tag.
        path: where the PNG goes.
    """
    tags = sorted((set(train) | set(evals)) - set(SKIPPED_TAGS))
    plot_panels([(tag, [(kind, curves[tag], style) for kind, curves, style in
                        (("train", train, "-"), ("eval", evals, "o-")) if tag in curves])
                 for tag in tags], path)


def plot_panels(panels, path: str) -> None:
    """Writes `[(title, [(label, curve, style), ...]), ...]` as a grid of panels (Agg), atomically
    (`path` may be in an object store).

    Args:
        panels: `[(title, [(label, curve, style), ...]), ...]`.
        path: where the PNG goes (local or in an object store).
    """
    from ctl.figures import pyplot, write_png

    plt = pyplot()

    columns = min(3, max(len(panels), 1))
    rows = max(1, -(-len(panels) // columns))
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows),
                                squeeze=False)
    for axis, (title, lines) in zip(axes.flat, panels):
        for label, points, style in lines:
            axis.plot([p[0] for p in points], [p[2] for p in points], style, label=label,
                      markersize=3)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    write_png(figure, path)


def report(model_dir: str, output: str = None) -> Tuple[str, str]:
    """Returns (table, png path) for `model_dir`; raises `UserError` if it has no summaries.

    Args:
        model_dir: the run's model dir.
        output: where the PNG goes (default: `report.png` in the model dir).
    """
    import tensorflow as tf  # Not for a bad flag.

    from ctl.model_dir import ModelDir

    directory = ModelDir(model_dir)
    if not tf.io.gfile.isdir(model_dir):
        raise UserError(f"--model_dir={model_dir} is not a directory; point it at a ctl run's "
                        "directory.")
    output = output or directory.file(REPORT_FILE)
    _check_output(output)
    train = read_scalars(directory.train_dir)
    evals = read_scalars(directory.eval_dir)
    if not train and not evals:
        raise UserError(f"--model_dir={model_dir} holds no TensorBoard scalars in train/ or "
                        "eval/; point it at a ctl run's directory.")
    try:
        plot(train, evals, output)
    except (OSError, tf.errors.OpError) as error:
        reason = getattr(error, "strerror", None) or first_line(error)
        raise UserError(f"cannot write --output={output} ({reason}); name a file you can write.") from error
    return table(directory, train, evals), output


def compare(model_dirs: List[str], output: str = None) -> Tuple[str, str]:
    """Returns (table, png path) for several runs; raises `UserError` if one has no summaries.

    Args:
        model_dirs: the runs' model dirs.
        output: where the PNG goes (default: `report.png` in the runs' common parent directory).
    """
    from ctl.config import gin_config as config
    from ctl.model_dir import ModelDir, read_text

    runs = []
    for model_dir in model_dirs:
        directory = ModelDir(model_dir)
        curves = {"train": read_scalars(directory.train_dir), "eval": read_scalars(directory.eval_dir)}
        if not curves["train"] and not curves["eval"]:
            raise UserError(f"--model_dir={model_dir} holds no TensorBoard scalars in train/ or "
                            "eval/; point it at a ctl run's directory.")
        text = read_text(directory.operative_config_file)
        settings = config.operative_values(text) if text is not None else {}
        runs.append((model_dir, settings, curves))
    names = [os.path.basename(os.path.normpath(d)) for d in model_dirs]
    if len(set(names)) < len(names):
        names = list(model_dirs)
    keys = sorted({key for _, settings, _ in runs for key in settings})
    differing = [key for key in keys if len({repr(s.get(key)) for _, s, _ in runs}) > 1]
    metrics = sorted({tag for _, _, c in runs for tag in c["eval"]} - set(SKIPPED_TAGS))
    header = ["run", *differing, *(f"eval/{tag}" for tag in metrics), "steps"]
    rows = []
    for name, (_, settings, curves) in zip(names, runs):
        last = {tag: points[-1][2] for tag, points in curves["eval"].items() if points}
        steps = max((p[0] for c in curves.values() for pts in c.values() for p in pts), default=0)
        rows.append([name, *(str(settings.get(key, "-")) for key in differing),
                     *(f"{last[tag]:.6g}" if tag in last else "-" for tag in metrics), str(steps)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [f"ctl report: {len(runs)} runs", "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("-" * len(lines[-1]))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    output = output or os.path.join(_common_parent(model_dirs), REPORT_FILE)  # Beside the runs.
    _check_output(output)
    plot_runs([(name, curves) for name, (_, _, curves) in zip(names, runs)], output)
    return "\n".join(lines), output


def _check_output(output: str) -> None:
    """Raises `UserError` unless `output` can be a file (its directory is there; in an
    object store, where directories are implied, that it names no directory)."""
    import tensorflow as tf

    from ctl.model_dir import is_object_store

    parent = os.path.dirname(output if "://" in output else os.path.abspath(output))
    missing = not is_object_store(output) and not tf.io.gfile.isdir(parent)
    if missing or tf.io.gfile.isdir(output):
        raise UserError(f"cannot write --output={output} ({parent} is not a directory"
                        f"{'' if missing else '; it names a directory'}); "
                        "name a .png file in an existing directory.")


def _common_parent(paths: List[str]) -> str:
    if any("://" in p for p in paths):
        parts = [p.rstrip("/").split("/") for p in paths]
        common = [names[0] for names in zip(*parts) if len(set(names)) == 1]
        return "/".join(common)
    return os.path.commonpath([os.path.abspath(p) for p in paths])


def plot_runs(runs, path: str) -> None:
    """One panel per eval metric and one for the train loss, every run's curve overlaid.

    Args:
        runs: `[(name, {"train": curves, "eval": curves})]`, one per run.
        path: where the PNG goes.
    """
    panels = [("eval", tag) for tag in sorted({t for _, c in runs for t in c["eval"]})
              if tag not in SKIPPED_TAGS] + [("train", "loss")]
    plot_panels([(f"{kind}/{tag}", [(name, curves[kind].get(tag, []),
                                     "o-" if kind == "eval" else "-") for name, curves in runs])
                 for kind, tag in panels], path)


def main(argv):
    """`python -m ctl.report`: prints the table and writes the PNG.

    Args:
        argv: absl's arguments: the program name, and a model dir given without `--model_dir`.
    """
    model_dirs = FLAGS.model_dir or argv[1:2]
    if len(argv) > 1 and (FLAGS.model_dir or len(argv) > 2):
        _fail(f"unexpected arguments {argv[1 + (not FLAGS.model_dir):]}")
    if not model_dirs:
        _fail("name a run's directory with --model_dir=DIR (or a sweep's: --model_dir=SWEEP_DIR).")
    # TensorFlow's C++ INFO lines: warnings and errors only (a value the user set wins).
    # Before TensorFlow's import, here, so that `import ctl.report` changes nothing.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    logging.set_verbosity(logging.WARNING)
    from ctl.utils import devices
    from ctl.sweep import report as sweep_report
    from ctl.sweep import sweep_dir

    devices.list_devices()  # Without the CUDA wheel's cuInit line on a host with no GPU.
    try:
        if len(model_dirs) == 1 and sweep_dir.is_sweep_dir(model_dirs[0]):
            text, path = sweep_report.report(model_dirs[0], FLAGS.output)
        elif len(model_dirs) > 1:
            text, path = compare(model_dirs, FLAGS.output)
        else:
            text, path = report(model_dirs[0], FLAGS.output)
    except UserError as error:
        _fail(str(error))
    print(text)
    print(f"curves: {path}")


def _fail(message: str) -> None:
    exit_with_error("ctl.report", message)


if __name__ == "__main__":
    flags.DEFINE_multi_string("model_dir", None, "The run's directory; repeat to compare runs; "
                              "or a sweep's directory.")
    flags.DEFINE_string("output", None, "Where to write the PNG (default <model_dir>/report.png; "
                        "for several runs, report.png in their common parent).")
    process_end.run(lambda: app.run(main, flags_parser=flags_parser("ctl.report", FLAGS)))
