"""The suite's own order (tests/conftest.py): the longest tests first, each named as it is."""

import ast
import os

from tests.conftest import LONGEST_FIRST
from tests.support.env import ROOT


def test_each_test_the_longest_first_list_names_exists():
    """A renamed or removed test left in `LONGEST_FIRST` would leave its entry matching nothing, and
    the test it stood for, under its new name, at its place in the collection again."""
    missing = []
    for entry in LONGEST_FIRST:
        path, name = entry.split("::")
        name = name.split("[")[0]
        try:
            with open(os.path.join(ROOT, path)) as f:
                tree = ast.parse(f.read())
        except OSError:
            missing.append(entry)
            continue
        if name not in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}:
            missing.append(entry)
    assert not missing, f"tests/conftest.py LONGEST_FIRST names tests that do not exist: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid
        self.name = nodeid.split("::")[-1]
        self.originalname = self.name.split("[")[0]


def test_the_longest_tests_come_first_in_the_lists_order_and_the_others_as_collected():
    from tests.conftest import pytest_collection_modifyitems

    first, second = LONGEST_FIRST[0], LONGEST_FIRST[1]
    function = next(e for e in LONGEST_FIRST if "[" not in e and e not in (first, second))
    collected = ["tests/test_a.py::test_x", f"{second}", "tests/test_a.py::test_y[1]", f"{function}[b]",
                 f"{first}", "tests/test_a.py::test_y[0]", f"{function}[a]"]
    items = [_Item(nodeid) for nodeid in collected]
    pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [
        first, second, f"{function}[b]", f"{function}[a]", "tests/test_a.py::test_x",
        "tests/test_a.py::test_y[1]", "tests/test_a.py::test_y[0]"]
