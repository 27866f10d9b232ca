"""Interleaved timing and one-JSON-line-per-figure output, shared by the figures.

Each figure script runs its variants round-robin, so that load from other
processes on the machine falls on all of them alike, and reports medians: a
ratio or a difference is taken between the variants' median times, which a
burst of load in one round does not move. The order changes every round so
that each variant follows every other equally often (`balanced_orders`), and
a pause after each variant's call lets its background work finish before the
next variant's clock starts (`SETTLE_S`).

orbit's Controller prints a line per loop on stdout; a figure calls
`claim_stdout()` first, so that those lines go to stderr and stdout carries
only the JSON lines of `emit`.
"""

import json
import random
import statistics
import sys
import time
from typing import Callable, Dict, Iterable, List, Optional, TypeVar

T = TypeVar("T")

_out = sys.stdout


def claim_stdout() -> None:
    """Sends everything but `emit` to stderr."""
    global _out
    _out = sys.stdout
    sys.stdout = sys.stderr


def emit(figure: str, **fields) -> None:
    """Prints one result as a JSON line on the real stdout."""
    record = {"figure": figure, **{k: _round(v) for k, v in fields.items()}}
    print(json.dumps(record), file=_out, flush=True)


def _round(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


SETTLE_S = 0.05
"""The untimed pause after each timed call. Without it the next variant pays for
the last one's background threads (its prefetch refilling, TensorFlow's pools
spinning down). ctl's MLP loop over the mean of three copies of `raw_fused`:
median 0.937 (0.92-0.99) over five processes without the pause, 0.990
(0.97-1.01) over four with it, in a scratch run; the full run after it, on a host
at about half its usual speed, did not show it (2026-11-25e, `bench/results/2026-11-25e-throughput.json`)."""


def balanced_orders(count: int) -> List[List[int]]:
    """Orders of `count` variants in which each follows every other equally often.

    A Williams design: the first order is 0, 1, n-1, 2, n-2, ...; the others
    add 1, 2, ... to it (mod n); for an odd count the reversed orders follow.
    Rotating one order instead gives every variant the same predecessor in
    every round, and whatever that one leaves behind falls on it alone.
    """
    first, low, high = [0], 1, count - 1
    while len(first) < count:
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    orders = [[(index + shift) % count for index in first] for shift in range(count)]
    return orders + [order[::-1] for order in orders] if count % 2 else orders


def add_balanced_flags(parser, rounds: int) -> None:
    """The flags of a figure that builds its variants in balanced, shuffled orders:
    `--rounds`, `--workloads`, `--instances` and `--seed` (see `draw_seed`)."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--workloads", default="mlp,cnn")
    parser.add_argument("--instances", type=int, default=2,
                        help="builds of each variant, in balanced order (build_balanced)")
    parser.add_argument("--seed", type=int, default=None,
                        help="the variants' places in the build and round orders (measure.shuffled); "
                             "default: drawn anew, reported as order_seed")


def start(parser):
    """Parses a figure's flags and claims stdout: `(args, seed)`, the seed `args.seed` or drawn."""
    args = parser.parse_args()
    seed = draw_seed(args.seed)
    claim_stdout()
    return args, seed


def draw_seed(given: Optional[int] = None) -> int:
    """`given`, or a seed for `shuffled` new in every process (a figure reports it as `order_seed`)."""
    return random.SystemRandom().randrange(2**31) if given is None else given


def shuffled(names: Iterable[str], seed: Optional[int], purpose: str) -> List[str]:
    """`names` in an order drawn from `seed` and `purpose` (`None`: as given).

    Which variant gets which place in the build order and in the rounds'
    orders moves its speed by itself, the same way in every process run from
    one fixed order: of six builds of one `raw_fused` loop sharing a model,
    the fourth was the slowest in 14 of 15 processes, by up to 20% (MLP,
    2026-11-25i, with and without Python's garbage collector; not seen in a
    run of 36 variants, six loops crossed with six iterators). A figure that
    draws the places anew in each process (`draw_seed`) hands that effect to
    a different variant each time, and the median of several processes
    averages it out instead of charging it to one variant run after run.
    """
    names = list(names)
    if seed is not None:
        random.Random(f"{seed}:{purpose}").shuffle(names)
    return names


def interleave(variants: Dict[str, Callable[[], None]], rounds: int,
               cpu: Dict[str, List[float]] = None,
               settle_s: float = SETTLE_S, seed: Optional[int] = None) -> Dict[str, List[float]]:
    """Times each variant's callable once per round, in the orders of `balanced_orders`.

    `seed`: which variant takes which index of those orders (`shuffled`);
    `None`: the variants' own order.

    Returns the wall times in seconds, per variant, in round order; if `cpu`
    is given, appends this process's CPU time (all threads) to `cpu[name]`,
    including what its background threads use during the pause after its call.
    CPU time is far less disturbed by other processes than wall time.
    """
    names = shuffled(variants, seed, "rounds")
    orders = balanced_orders(len(names))
    times = {name: [] for name in variants}
    for name in names if cpu is not None else ():
        cpu.setdefault(name, [])
    time.sleep(settle_s)
    for r in range(rounds):
        for name in (names[index] for index in orders[r % len(orders)]):
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[name]()
            times[name].append(time.perf_counter() - start)
            time.sleep(settle_s)
            if cpu is not None:
                cpu[name].append(time.process_time() - start_cpu)
    return times


def build_balanced(builders: Dict[str, Callable[[], T]], instances: int,
                   seed: Optional[int] = None) -> Dict[str, List[T]]:
    """Each variant built `instances` times, the build order reversed on every pass.

    `seed`: the first pass's order (`shuffled`); `None`: the builders' own order.

    Where in the build order an object was made moves its speed: four identical
    `raw_fused` loops built one after the other in one process ran up to 3% apart,
    the first built the fastest, in run after run (MLP, 2026-11-24). Building
    each variant on alternate passes forward and backward spreads that bias over
    every variant alike instead of handing it to the first one.
    """
    names = shuffled(builders, seed, "builds")
    built: Dict[str, List[T]] = {name: [] for name in builders}
    for index in range(instances):
        for name in names if index % 2 == 0 else reversed(names):
            built[name].append(builders[name]())
    return built


def median(values: List[float]) -> float:
    return float(statistics.median(values))


def ratio(numerator: List[float], denominator: List[float]) -> float:
    """median(numerator) / median(denominator)."""
    return median(numerator) / median(denominator)


def difference(minuend: List[float], subtrahend: List[float]) -> float:
    """median(minuend) - median(subtrahend)."""
    return median(minuend) - median(subtrahend)


def emit_throughput(figure: str, times, cpu, steps: int, target: float, skip=(),
                    ctl_fields=None, targeted=("ctl",), reference=None, **fields) -> None:
    """One line per variant: steps/s and its ratios to "raw", "raw_fused" and `reference` (wall, CPU).

    The lines of the `targeted` variants (ctl's settings) get the target, on
    their ratio to `reference` (default: "raw_fused", the best loop one writes
    by hand, when that variant was measured, else "raw"); ctl's line also gets
    `ctl_fields`. Variants in `skip` are measured but get no line.
    """
    reference = reference or ("raw_fused" if "raw_fused" in times else "raw")
    for name in (n for n in times if n not in skip):
        line = dict(variant=name, steps_per_sec=steps / median(times[name]),
                    ratio_to_raw=ratio(times["raw"], times[name]),
                    cpu_ratio_to_raw=ratio(cpu["raw"], cpu[name]))
        for other in dict.fromkeys(("raw_fused", reference)):  # In this order, once each.
            if other in times and other != "raw":
                line.update({f"ratio_to_{other}": ratio(times[other], times[name]),
                             f"cpu_ratio_to_{other}": ratio(cpu[other], cpu[name])})
        if name in targeted:
            line.update(target=f"ratio_to_{reference} >= {target}",
                        met=ratio(times[reference], times[name]) >= target,
                        met_in_cpu_time=ratio(cpu[reference], cpu[name]) >= target,
                        **((ctl_fields or {}) if name == "ctl" else {}))
        emit(figure, **line, **fields)
