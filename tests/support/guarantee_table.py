"""Which tests carry each guarantee, as one table, made from docs/explanation/guarantees.md.

Each guarantee of that page (a `{#anchor}` line) cites its tests in a closed block after it
(`??? quote "Tests"`, its lines indented); the table
has a row per guarantee with those tests, in the page's order (`::name` is a test of the file
cited before it). `python -m tests.support.guarantee_table` prints it; tests/test_docs.py checks that
every guarantee cites a test.
"""

import os
import re
from typing import List, Tuple

from tests.support.env import ROOT

GUARANTEES = os.path.join(ROOT, "docs", "explanation", "guarantees.md")
_GUARANTEE = re.compile(r"\{#([\w-]+)\}(.*?)(?=\n\*\*|\n## |\Z)", re.S)
_TESTS = re.compile(r'\n\?\?\? quote "Tests"\n((?:    .*\n?)+)')


def rows() -> List[Tuple[str, str]]:
    """(anchor, its tests as the page cites them) for each guarantee, in the page's order."""
    with open(GUARANTEES) as f:
        text = f.read()
    found = []
    for match in _GUARANTEE.finditer(text):
        tests = _TESTS.search(match.group(2))
        cited = [c for c in re.findall(r"`([^`]+)`", tests.group(1)) if c.startswith(("tests/", "::"))] \
            if tests else []
        found.append((match.group(1), ", ".join(f"`{c}`" for c in cited) or "none"))
    return found


def table() -> str:
    """The Markdown table: a row per guarantee, its anchor and its tests."""
    lines = ["| Guarantee (docs/explanation/guarantees.md) | Its tests |", "| --- | --- |"]
    lines += [f"| `#{anchor}` | {tests} |" for anchor, tests in rows()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m tests.support.guarantee_table
    print(table(), end="")
