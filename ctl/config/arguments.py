"""Checks declared on a configurable's arguments, next to them: an impossible value is a `UserError`.

A gin binding can set an argument to anything: `DigitsTask.hidden_units=0` would otherwise
reach Keras and end in its traceback, after the run started. `check_arguments` checks every
call's values against the annotations of the parameters (the type, `Range`, `Check`), before
the body runs; a value that fails is one line naming the binding, the value and what to bind
instead, and `python -m ctl.run` exits 2 before anything is written. `check_arguments`'
docstring shows the annotations it reads.
"""

import dataclasses
import functools
import inspect
import math
import numbers
import types
import typing
from collections import abc
from typing import Any, Callable, Optional

from ctl.utils.errors import UserError


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds for a number: `at_least`/`at_most` inclusive, `above`/`below` exclusive.

    Args:
        at_least: the smallest value allowed (inclusive), or None.
        above: a value the argument must exceed (exclusive), or None.
        at_most: the largest value allowed (inclusive), or None.
        below: a value the argument must stay under (exclusive), or None.
    """

    at_least: Optional[float] = None
    above: Optional[float] = None
    at_most: Optional[float] = None
    below: Optional[float] = None

    def holds(self, value) -> bool:
        """Whether `value` is within the bounds (a value that is not a number is left to the type check).

        Args:
            value: the argument's value.
        """
        if not _is_real(value):
            return True  # Another type the annotation allows: not a number to bound.
        value = float(value)
        return not (math.isnan(value)
                    or self.at_least is not None and not value >= self.at_least
                    or self.above is not None and not value > self.above
                    or self.at_most is not None and not value <= self.at_most
                    or self.below is not None and not value < self.below)

    def describe(self) -> str:
        bounds = [(">=", self.at_least), (">", self.above), ("<=", self.at_most), ("<", self.below)]
        return " and ".join(f"{sign} {bound:g}" for sign, bound in bounds if bound is not None)


@dataclasses.dataclass(frozen=True)
class Check:
    """Any other condition on a value: `predicate(value)` is true; `requirement` says it in words.

    Args:
        predicate: a function of the value, true when the value is acceptable.
        requirement: the condition in words, for the error (e.g. `"a power of two"`).
    """

    predicate: Callable[[Any], bool]
    requirement: str

    def holds(self, value) -> bool:
        """Whether `predicate(value)` is true.

        Args:
            value: the argument's value.
        """
        return bool(self.predicate(value))

    def describe(self) -> str:
        return self.requirement


def check_arguments(target):
    """Checks every call's arguments against the annotations of `target` (a function or class).

    Apply it under `@gin.configurable` (gin then registers the checked
    callable). Raises `UserError` for the first argument that fails.

        @gin.configurable
        @ctl.check_arguments
        class DigitsTask(ctl.Task):
            def __init__(self, hidden_units: Annotated[int, ctl.Range(at_least=1)] = 128,
                         learning_rate: Annotated[float, ctl.Range(above=0)] = 1e-3,
                         data_dir: Optional[str] = None): ...

    What an annotation checks:

    - the type: `int` (not a bool), `float` (any real number: `1` will do), `bool`, `str`,
      `None`, a class, `Callable`, and `Union`/`Optional` of them (a generic such as
      `List[int]` checks its container);
    - `Range(at_least, above, at_most, below)`: bounds for a number (a value of another type
      the annotation allows, e.g. a learning-rate schedule, is not bounded); NaN is out of
      every range;
    - `Check(predicate, requirement)`: any other condition, and the words for it.

    A parameter without an annotation is not checked. A value that fails is one line naming
    the binding, the value and what to bind instead (with the default), e.g.
    "DigitsTask.hidden_units=0 is out of range; bind it to an integer >= 1 (default: 128)."

    Args:
        target: the function or class whose arguments' annotations (`Annotated[int, ctl.Range(at_least=1)]`) are
            checked.

    Returns:
        `target`, wrapped to check each call's arguments.

    Raises:
        UserError: (on a call) the first argument that fails its type, `Range` or `Check`.
    """
    function = target.__init__ if inspect.isclass(target) else target
    name = target.__name__
    signature = inspect.signature(function)
    hints = typing.get_type_hints(function, include_extras=True)
    rules = {parameter: _rule(hints[parameter]) for parameter in signature.parameters
             if parameter in hints and parameter != "return"}

    @functools.wraps(function)
    def checked(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for parameter, (kind, bounds) in rules.items():
            value = bound.arguments[parameter]
            problem = _problem(value, kind, bounds)
            if problem is not None:
                raise UserError(f"{name}.{parameter}={value!r} {problem}; bind it to "
                                f"{_requirement(kind, bounds)}{_default(signature, parameter)}.")
        return function(*args, **kwargs)

    if inspect.isclass(target):
        target.__init__ = checked
        return target
    return checked


def _problem(value, kind, bounds) -> Optional[str]:
    """What is wrong with `value`, or None."""
    if not _is_a(value, kind):
        return "is " + _article(type(value).__name__)
    for bound in bounds:
        if not bound.holds(value):
            return "is out of range" if isinstance(bound, Range) else f"is not {bound.describe()}"
    return None


def _rule(hint):
    """(the type, the bounds) an annotation declares."""
    if typing.get_origin(hint) is typing.Annotated:
        kind, *metadata = typing.get_args(hint)
        return kind, tuple(m for m in metadata if isinstance(m, (Range, Check)))
    return hint, ()


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_a(value, kind) -> bool:
    if kind is Any:
        return True
    if kind is None or kind is type(None):
        return value is None
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_is_a(value, member) for member in typing.get_args(kind))
    if kind is float:
        return _is_real(value)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is Callable or origin is abc.Callable:
        return callable(value)
    if isinstance(origin, type):
        return isinstance(value, origin)
    return isinstance(value, kind) if isinstance(kind, type) else True


_WORDS = {int: "an integer", float: "a number", bool: "True or False", str: "a string",
          type(None): "None"}


def _requirement(kind, bounds) -> str:
    """What to bind, in words: "an integer >= 1", "a number > 0 or a callable"."""
    origin = typing.get_origin(kind)
    members = typing.get_args(kind) if origin in (typing.Union, types.UnionType) else (kind,)
    ranges = " and ".join(bound.describe() for bound in bounds if isinstance(bound, Range))
    words = []
    for member in members:
        word = _WORDS.get(member)
        if word is None:
            word = ("a callable" if member is Callable or typing.get_origin(member) is abc.Callable
                    else _article(getattr(typing.get_origin(member) or member, "__name__",
                                          str(member))))
        words.append(f"{word} {ranges}" if ranges and member in (int, float) else word)
    checks = " and ".join(bound.describe() for bound in bounds if isinstance(bound, Check))
    return " or ".join(words) + (f" that is {checks}" if checks else "")


def _article(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _default(signature, parameter: str) -> str:
    default = signature.parameters[parameter].default
    return "" if default is inspect.Parameter.empty else f" (default: {default!r})"
