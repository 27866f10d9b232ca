"""`python -m ctl.report --model_dir=DIR`: a summary table and a PNG of the curves.

Reads the scalars of `<model_dir>/train` and `<model_dir>/eval` from their
TensorBoard event files (tensorboard's `EventAccumulator`), prints one row per
metric (last value, best value and its step, number of points), the last
step and the wall time the events span, and writes the training and eval
curves to `<model_dir>/report.png` (or `--output`). The best checkpoint's record
(ctl.comforts.best) is printed when there is one.

"Best" is the minimum for metrics named like a loss or an error (loss, error,
mae, mse, perplexity), else the maximum.
"""

import os
import sys
from typing import Dict, List, Tuple

from absl import app, flags, logging

from ctl.core.errors import EXIT_USER_ERROR, UserError
from ctl.core.model_dir import ModelDir

FLAGS = flags.FLAGS
SKIPPED_TAGS = ("steps_per_second",)
Curve = List[Tuple[int, float, float]]  # (step, wall time, value)


def read_scalars(summary_dir: str) -> Dict[str, Curve]:
    """Maps tag -> [(step, wall_time, value)] for every scalar under `summary_dir`."""
    from tensorboard.backend.event_processing import event_accumulator

    if not os.path.isdir(summary_dir):
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
            import tensorflow as tf

            value = tf.make_ndarray(event.tensor_proto)
            if value.size != 1 or value.dtype.kind not in "fiub":
                points = []
                break
            points.append((event.step, event.wall_time, float(value.reshape(()))))
        if points:
            curves[tag] = sorted(points)
    return curves


def lower_is_better(tag: str) -> bool:
    name = tag.lower()
    return any(word in name for word in ("loss", "error", "mae", "mse", "perplexity"))


def summarize(curves: Dict[str, Curve]) -> List[Tuple[str, float, float, int, int]]:
    """(tag, last, best, best step, points) for each tag, sorted by tag."""
    rows = []
    for tag, points in sorted(curves.items()):
        if tag in SKIPPED_TAGS or not points:
            continue
        pick = min if lower_is_better(tag) else max
        best_step, _, best = pick(points, key=lambda p: p[2])
        rows.append((tag, points[-1][2], best, best_step, len(points)))
    return rows


def table(model_dir: str, train: Dict[str, Curve], evals: Dict[str, Curve]) -> str:
    lines = [f"ctl report: {model_dir}"]
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
    from ctl.comforts.best import read_best

    record = read_best(model_dir)
    if record:
        lines.append(f"best checkpoint: {record['metric']} = {record['value']:.6g} at step "
                     f"{record['step']} ({record['path']})")
    return "\n".join(lines)


def plot(train: Dict[str, Curve], evals: Dict[str, Curve], path: str) -> None:
    """One panel per metric, train and eval curves together; written with Agg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = sorted((set(train) | set(evals)) - set(SKIPPED_TAGS))
    columns = min(3, max(len(tags), 1))
    rows = max(1, -(-len(tags) // columns))
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows),
                                squeeze=False)
    for axis, tag in zip(axes.flat, tags):
        for kind, curves, style in (("train", train, "-"), ("eval", evals, "o-")):
            if tag in curves:
                steps = [p[0] for p in curves[tag]]
                axis.plot(steps, [p[2] for p in curves[tag]], style, label=kind, markersize=3)
        axis.set_title(tag)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend()
    for axis in list(axes.flat)[len(tags):]:
        axis.axis("off")
    figure.tight_layout()
    temp = f"{path}.tmp-{os.getpid()}.png"
    figure.savefig(temp, dpi=100)
    plt.close(figure)
    os.replace(temp, path)


def report(model_dir: str, output: str = None) -> Tuple[str, str]:
    """Returns (table, png path) for `model_dir`; raises `UserError` if it has no summaries."""
    directory = ModelDir(model_dir)
    if not os.path.isdir(model_dir):
        raise UserError(f"--model_dir={model_dir} is not a directory; point it at a ctl run's "
                        "directory.")
    output = output or os.path.join(model_dir, "report.png")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent) or os.path.isdir(output):
        raise UserError(f"cannot write --output={output} ({parent} is not a directory"
                        f"{'' if not os.path.isdir(output) else '; it names a directory'}); "
                        "name a .png file in an existing directory.")
    train = read_scalars(directory.train_dir)
    evals = read_scalars(directory.eval_dir)
    if not train and not evals:
        raise UserError(f"--model_dir={model_dir} holds no TensorBoard scalars in train/ or "
                        "eval/; point it at a ctl run's directory.")
    try:
        plot(train, evals, output)
    except OSError as error:
        raise UserError(f"cannot write --output={output} ({error.strerror or error}); name a "
                        "file you can write.") from error
    return table(model_dir, train, evals), output


def main(argv):
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    try:
        text, path = report(FLAGS.model_dir, FLAGS.output)
    except UserError as error:
        _fail(str(error))
    print(text)
    print(f"curves: {path}")


def _fail(message: str) -> None:
    print(f"ctl.report: error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def _parse_flags(argv):
    try:
        return FLAGS(argv)
    except flags.Error as error:
        _fail(f"{error}. See --helpfull.")


if __name__ == "__main__":
    flags.DEFINE_string("model_dir", None, "The run's directory.")
    flags.DEFINE_string("output", None, "Where to write the PNG (default <model_dir>/report.png).")
    flags.mark_flag_as_required("model_dir")
    app.run(main, flags_parser=_parse_flags)
