"""Every public callable of ctl explains its arguments in a Google-style `Args:` section,
the form the API reference (mkdocstrings) renders as a table of parameters.

Public: no part of the name starts with an underscore (the module's file and package
names, the enclosing classes, the function itself); `__init__` counts as the class's
constructor, whose arguments the class docstring (or `__init__`'s own) lists. A
dataclass's or NamedTuple's fields are its constructor's arguments. `self`, `cls` and
a bare `*` need no entry; `*args` and `**kwargs` do, under either spelling.
Functions nested in functions are not API and are not checked.

Read from the source with `ast` (nothing is imported), so the test is quick and needs
no TensorFlow.
"""

import ast
import os
import re
from typing import Iterator, List, Optional, Set, Tuple

from tests.support.env import ROOT

CTL = os.path.join(ROOT, "ctl")
SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?:")
IMPLICIT = {"self", "cls"}


def args_entries(docstring: Optional[str]) -> Optional[Set[str]]:
    """The parameter names an `Args:` section of `docstring` lists (None: no section).

    Args:
        docstring: a docstring as `ast.get_docstring` returns it (dedented).

    Returns:
        The names, `*` and `**` stripped, or None when the docstring has no `Args:`.
    """
    if not docstring:
        return None
    lines = docstring.expandtabs().splitlines()
    for i, line in enumerate(lines):
        match = SECTION.match(line)
        if not match:
            continue
        indent, names, entry_indent = len(match.group(1)), set(), None
        for body in lines[i + 1:]:
            if not body.strip():
                continue
            depth = len(body) - len(body.lstrip())
            if depth <= indent:
                break
            if entry_indent is None:
                entry_indent = depth
            if depth == entry_indent:
                entry = ENTRY.match(body.strip())
                if entry:
                    names.add(entry.group(1).lstrip("*"))
        return names
    return None


def _parameters(function: ast.FunctionDef) -> List[str]:
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    if arguments.vararg:
        names.append(arguments.vararg.arg)
    if arguments.kwarg:
        names.append(arguments.kwarg.arg)
    return [name for name in names if name not in IMPLICIT]


def _decorator_names(node) -> Set[str]:
    names = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        names.add(ast.unparse(target).split(".")[-1])
    return names


def _fields(cls: ast.ClassDef) -> Optional[List[str]]:
    """A dataclass's or NamedTuple's fields (its generated constructor's arguments), else None."""
    bases = {ast.unparse(base).split(".")[-1] for base in cls.bases}
    if "dataclass" not in _decorator_names(cls) and "NamedTuple" not in bases:
        return None
    fields = []
    for statement in cls.body:
        if isinstance(statement, ast.AnnAssign) \
                and isinstance(statement.target, ast.Name) \
                and "ClassVar" not in ast.unparse(statement.annotation) \
                and not statement.target.id.startswith("_"):
            call = statement.value
            if isinstance(call, ast.Call) and ast.unparse(call.func).split(".")[-1] == "field" and any(
                    k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in call.keywords):
                continue
            fields.append(statement.target.id)
    return fields


def _public(name: str) -> bool:
    return not name.startswith("_")


def _walk_class(path: str, qualname: str, cls: ast.ClassDef) -> Iterator[Tuple[str, List[str], Set[str]]]:
    """(where, missing names, stray names) for a class's constructor and public methods."""
    class_doc = ast.get_docstring(cls)
    init = next((s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and s.name == "__init__"), None)
    constructor = _parameters(init) if init else _fields(cls)
    if constructor:
        documented = args_entries(class_doc) or set()
        if init:
            documented |= args_entries(ast.get_docstring(init)) or set()
        yield (f"{path}:{cls.lineno} class {qualname}", [p for p in constructor if p not in documented],
               documented - set(constructor))
    for statement in cls.body:
        if isinstance(statement, ast.ClassDef) and _public(statement.name):
            yield from _walk_class(path, f"{qualname}.{statement.name}", statement)
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(statement.name):
            yield from _check_function(path, f"{qualname}.{statement.name}", statement)


def _check_function(path, qualname, function) -> Iterator[Tuple[str, List[str], Set[str]]]:
    parameters = _parameters(function)
    if not parameters:
        return
    if "setter" in _decorator_names(function) or "overload" in _decorator_names(function):
        return
    documented = args_entries(ast.get_docstring(function)) or set()
    yield (f"{path}:{function.lineno} def {qualname}", [p for p in parameters if p not in documented],
           documented - set(parameters))


def public_callables() -> Iterator[Tuple[str, List[str], Set[str]]]:
    """(where, missing names, stray names) for every public callable with parameters in ctl/.

    Returns:
        An iterator over every checked constructor, function and method; missing lists the
        parameters the `Args:` section leaves out, stray the entries naming no parameter.
    """
    for folder, dirs, files in os.walk(CTL):
        dirs[:] = sorted(d for d in dirs if _public(d))
        for name in sorted(files):
            if not name.endswith(".py") or (name.startswith("_") and not name.startswith("__")):
                continue
            full = os.path.join(folder, name)
            path = os.path.relpath(full, ROOT)
            with open(full) as f:
                tree = ast.parse(f.read())
            for statement in tree.body:
                if isinstance(statement, ast.ClassDef) and _public(statement.name):
                    yield from _walk_class(path, statement.name, statement)
                elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(statement.name):
                    yield from _check_function(path, statement.name, statement)


def test_the_checker_reads_google_style_args():
    doc = "Does a thing.\n\nArgs:\n    steps (int): how many.\n      More text: not an entry.\n" \
          "    *args: passed on.\n    **kwargs: passed on.\n\nReturns:\n    value: not an arg.\n"
    assert args_entries(doc) == {"steps", "args", "kwargs"}
    assert args_entries("One line.") is None
    source = ast.parse('def f(a, b=1, *, c):\n    """F.\n\n    Args:\n        a: x.\n        c: y.\n    """\n')
    assert [missing for _, missing, _ in _check_function("m.py", "f", source.body[0])] == [["b"]]


def test_every_public_callable_explains_each_argument_in_args():
    undocumented = [f"{where}: {', '.join(missing)}" for where, missing, _ in public_callables() if missing]
    assert not undocumented, (f"{len(undocumented)} public callables leave arguments out of `Args:`:\n"
                              + "\n".join(undocumented))


def test_no_args_entry_names_a_parameter_that_does_not_exist():
    stray = [f"{where}: {', '.join(sorted(names))}" for where, _, names in public_callables() if names]
    assert not stray, "`Args:` entries that name no parameter:\n" + "\n".join(stray)
