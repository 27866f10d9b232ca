"""BUILD.md's table of which tests carry each guarantee, made from docs/explanation/guarantees.md.

Each guarantee of that page (a `{#anchor}` line) cites its tests in a closed block after it
(`??? quote "Tests"`, its lines indented); the table
has a row per guarantee with those tests, in the page's order (`::name` is a test of the file
cited before it). tests/test_docs.py checks that BUILD.md holds the table this makes.
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
    """The Markdown table BUILD.md holds."""
    lines = ["| Guarantee (docs/explanation/guarantees.md) | Its tests |", "| --- | --- |"]
    lines += [f"| `#{anchor}` | {tests} |" for anchor, tests in rows()]
    return "\n".join(lines) + "\n"


def rewrite_build_md() -> None:
    """Puts `table()` in BUILD.md in place of the table there (after a change to guarantees.md)."""
    path = os.path.join(ROOT, "BUILD.md")
    with open(path) as f:
        text = f.read()
    start = text.index(table().split("\n", 1)[0])
    end = text.index("\n\n", start)
    with open(path, "w") as f:
        f.write(text[:start] + table().rstrip("\n") + text[end:])


if __name__ == "__main__":  # python -m tests.support.guarantee_table
    rewrite_build_md()
