"""`ctl.check_arguments`: the checks declared on a configurable's arguments (ctl.config.arguments).

Through gin, as a run meets them: a value that fails is a `UserError` naming the
binding, the value and what to bind (with the default), and the body never runs;
good values, defaults and the types an annotation allows go through. The shipped
experiments' checks, through `python -m ctl.run`: tests/test_bad_inputs.py.
"""

import math
from typing import Annotated, Callable, List, Optional, Union

import gin
import pytest

import ctl

built = []


@ctl.check_arguments
class Layers:
    def __init__(self, units: Annotated[int, ctl.Range(at_least=1)] = 8,
                 rate: Annotated[Union[float, Callable], ctl.Range(above=0, below=1)] = 0.5,
                 heads: Annotated[int, ctl.Check(lambda n: n % 2 == 0, "an even number")] = 2,
                 name: Optional[str] = None, names: Optional[List[str]] = None, anything=None):
        built.append(units)


@ctl.check_arguments
def size(width: Annotated[int, ctl.Range(at_least=1, at_most=4)], flag: bool = False):
    return width


@pytest.mark.parametrize("call, message", [
    (lambda: Layers(units=0), "Layers.units=0 is out of range; bind it to an integer >= 1 "
                              "(default: 8)."),
    (lambda: Layers(units=True), "Layers.units=True is a bool; bind it to an integer >= 1"),
    (lambda: Layers(units=2.0), "Layers.units=2.0 is a float; bind it to an integer >= 1"),
    (lambda: Layers(rate=1), "Layers.rate=1 is out of range; bind it to a number > 0 and < 1 "
                             "or a callable (default: 0.5)."),
    (lambda: Layers(rate=math.nan), "Layers.rate=nan is out of range"),
    (lambda: Layers(rate="fast"), "Layers.rate='fast' is a str; bind it to a number > 0 and < 1 "
                                  "or a callable"),
    (lambda: Layers(heads=3), "Layers.heads=3 is not an even number; bind it to an integer that "
                              "is an even number (default: 2)."),
    (lambda: Layers(name=3), "Layers.name=3 is an int; bind it to a string or None"),
    (lambda: Layers(names="ab"), "Layers.names='ab' is a str; bind it to a list or None (default: None)."),
    (lambda: size(5), "size.width=5 is out of range; bind it to an integer >= 1 and <= 4."),
    (lambda: size(1, flag=1), "size.flag=1 is an int; bind it to True or False (default: False)."),
])
def test_a_value_that_fails_is_one_line_naming_the_binding_and_the_fix(call, message):
    built.clear()
    with pytest.raises(ctl.UserError) as raised:
        call()
    assert str(raised.value).startswith(message)
    assert built == []  # Checked before the body runs.


def test_good_values_defaults_and_allowed_types_go_through():
    built.clear()
    Layers()
    Layers(units=3, rate=lambda step: 0.1, heads=4, name="x", names=["a"], anything=object())
    assert built == [8, 3] and size(4) == 4 and size(width=1, flag=True) == 1


def test_through_gin_the_error_is_the_first_line():
    configurable = gin.external_configurable(size, name="checked_size")
    gin.parse_config("checked_size.width = 0")
    try:
        with pytest.raises(ctl.UserError) as raised:
            configurable()
    finally:
        gin.clear_config()
    assert str(raised.value).splitlines()[0] == (
        "size.width=0 is out of range; bind it to an integer >= 1 and <= 4.")
