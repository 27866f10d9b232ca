"""The docs: every snippet of README.md and docs/**/*.md runs or parses, every test and path they cite
exists, and the site builds in strict mode with every page in its navigation and reads right.

How a code block is checked follows its fence's language:

- `python`: run in a fresh process;
- `gin`: parsed by gin after `ctl.import_api()` registered ctl's configurables (`skip_unknown=False`: an
  unknown name or parameter fails), once the page's other blocks ran (its modules are written);
- `sh`: each `python -m ctl.run` command in it (also the one after `ctl.launch ... --`) goes through
  ctl's own parsers, whether the block runs or not: its flags through the absl flags `ctl/run.py`
  defines, its gin files and bindings through `ctl.config.gin_text` and `ctl.config.gin_config.parse` after the
  files' imports (tests/docs_commands.py, one process a page, forked from a warm one, after the page's
  files are written), so
  a renamed flag, configurable or parameter fails; `ctl.report` and `ctl.launch` flags are checked
  against what the programs define (`--helpxml` / `--help`); other commands (pip, tensorboard,
  kubectl) are not run;
- `yaml`: parsed, and a command list with `-m ctl.run` in it (a container's) checked as above;
- `json`: each line parsed;
- `text` (or no language): output shown to the reader, not run.

Outside the blocks, an inline code span that is a `python -m ctl.*` command with flags, or holds a
`--gin.` binding, is checked the same way (placeholders such as `...` and `NAME=VALUE` aside).

A page changes that with a marker, an HTML comment on the line before the fence (invisible on the site):

- `<!-- docs-test: file NAME -->`: the block is the file NAME (a module, a gin file, a script):
  written to the page's work dir, not run by itself (a gin file is still parsed);
- `<!-- docs-test: run -->`: an `sh` block whose `python ...` commands run, in order, and must exit 0;
- `<!-- docs-test: skip (REASON) -->`: not checked; the reason is required.

A page's blocks are checked in order in a work dir of its own, which holds links to the repository's
`configs/` and `experiments/`, so that commands read as if run from the repository's root and a block may
use the files earlier blocks wrote (the tutorial writes its data, its task and its gin file, then trains).

The built site is read back: no list rendered as a paragraph, no empty or cut table header, no
`docs/NAME.md` named without a link, and every public name of `ctl` and `ctl.hooks` and every method of
the hook protocol on the Python API page with its docstring.
"""

import ast
import concurrent.futures
import functools
import glob
import html as html_module
import importlib.util
import json
import os
import re
import select
import shlex
import subprocess
import sys
import tempfile
from typing import List, NamedTuple, Optional

import pytest

from tests.support.env import ROOT, ctl_env
from tests.support.processes import ctl_command
from tests.support.processes import run as run_command
from tests.support.reading import scalars

PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in
                               glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
MARKER = re.compile(r"^\s*<!-- docs-test: (file (?P<file>\S+)|run|skip \((?P<reason>[^)]+)\)) -->\s*$")
ANY_MARKER = re.compile(r"<!-- docs-test:")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
CTL_COMMAND = re.compile(r"(?:^|\s)(?:\S*/)?python3? -m (ctl\.(?:run|report|launch|train))\b")
RUN_TIMEOUT_S = 300
CLIS = ("ctl.run", "ctl.train", "ctl.report", "ctl.launch", "ctl.sweep")


class Block(NamedTuple):
    page: str
    line: int
    lang: str
    text: str
    marker: Optional[re.Match]

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> List[Block]:
    """The fenced code blocks of `page`, each with the marker on the line before it."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            if ANY_MARKER.search(lines[i]) and not MARKER.match(lines[i]):
                raise AssertionError(f"{page}:{i + 1}: malformed marker {lines[i].strip()!r}")
            i += 1
            continue
        indent = fence.group("indent")
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = "\n".join(line[len(indent):] for line in lines[i + 1:end]) + "\n"
        marker = MARKER.match(lines[i - 1]) if i else None
        found.append(Block(page, i + 1, fence.group("lang") or "text", body, marker))
        i = end + 1
    for block in found:
        if block.marker and block.marker.group(0).strip() == "<!-- docs-test: run -->":
            assert block.lang == "sh", f"{block.where()}: `run` marks an sh block"
    return found


def commands(text: str) -> List[str]:
    """The shell commands of a block: continuation lines joined (and lines inside an open quote),
    comments and blank lines dropped, `a && b` split."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found, pending = [], ""
    for line in joined.splitlines():
        line = (pending + " " + line.strip()).strip() if pending else line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            shlex.split(line, comments=True)
        except ValueError:  # A quote still open: the command goes on on the next line.
            pending = line
            continue
        pending = ""
        found += [part.strip() for part in line.split("&&") if part.strip()]
    assert not pending, f"a quote left open: {pending!r}"
    return found


@functools.lru_cache(maxsize=None)
def flag_specs():
    """The flags of ctl.run, ctl.report and ctl.launch (each program asked once, the three at a time)."""
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  os.path.join(ROOT, "tools", "docs_reference.py"))
    docs_reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_reference)
    with concurrent.futures.ThreadPoolExecutor(len(docs_reference.CLIS)) as pool:
        return dict(zip(docs_reference.CLIS, pool.map(docs_reference.flag_spec, docs_reference.CLIS)))


def check_flags(module: str, args: List[str], where: str, workdir: str, ctl_runs: List[dict]) -> None:
    """Every `--flag` of `args` is one `module` defines, with an allowed value. A `ctl.run` command
    (also the one after `ctl.launch ... --`) is added to `ctl_runs`, checked by ctl's own parsers
    (tests/docs_commands.py) once the page's files are written."""
    if module == "ctl.launch" and "--" in args:
        split = args.index("--")
        check_flags("ctl.run", args[split + 1:], where, workdir, ctl_runs)
        args = args[:split]
    if module == "ctl.run":
        ctl_runs.append({"where": where, "args": [_gin_file_found(arg, workdir) for arg in args]})
        return
    known = flag_specs()[module]
    for arg in args:
        if not arg.startswith("--"):
            continue
        name, _, value = arg[2:].partition("=")
        assert name in known, f"{where}: `python -m {module}` has no flag --{name}"
        assert not known[name] or value in known[name], (
            f"{where}: --{name}={value} is not one of {sorted(known[name])}")


def _gin_file_found(arg: str, workdir: str) -> str:
    """`--gin_file=PATH` as found: in the page's work dir, else in the repository (e.g. tests/*.gin)."""
    name, _, value = arg.partition("=")
    if name == "--gin_file" and "://" not in value and not os.path.exists(os.path.join(workdir, value)) \
            and os.path.exists(os.path.join(ROOT, value)):
        return f"--gin_file={os.path.join(ROOT, value)}"
    return arg


class CommandChecker:
    """`python -m tests.docs_commands --serve`: one warm process per test process, which forks a
    child per page (its imports paid once, not ~35 times)."""

    def __init__(self):
        self.errors = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen([sys.executable, "-m", "tests.docs_commands", "--serve"],
                                        cwd=ROOT, env=environment(ROOT), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.errors, text=True)

    def problems(self, ctl_runs: List[dict], workdir: str, page: str) -> List[str]:
        self.process.stdin.write(json.dumps({"workdir": workdir, "commands": ctl_runs}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], RUN_TIMEOUT_S)
        reply = self.process.stdout.readline() if ready else ""
        if not reply.strip():
            self.errors.seek(0)
            error = (f"{page}: tests.docs_commands did not answer in {RUN_TIMEOUT_S} s "
                     f"(status {self.process.poll()})\n{self.errors.read()[-3000:]}")
            self.close()
            self.__init__()  # A fresh one for the next page: no late answer read as its own.
            raise AssertionError(error)
        problems = json.loads(reply)
        assert isinstance(problems, list), f"{page}: tests.docs_commands failed\n{problems['error']}"
        return problems

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=60)
        self.errors.close()


@pytest.fixture(scope="session")
def command_checker():
    checker = CommandChecker()
    yield checker
    checker.close()


def check_ctl_runs(ctl_runs: List[dict], workdir: str, page: str, checker: CommandChecker) -> None:
    """The page's `python -m ctl.run` commands, parsed by ctl's flags and gin (a process a page,
    forked by `checker`)."""
    if not ctl_runs:
        return
    problems = checker.problems(ctl_runs, workdir, page)
    assert not problems, "commands ctl.run refuses:\n" + "\n".join(problems)


def environment(workdir: str):
    return ctl_env({"PYTHONPATH": os.pathsep.join([workdir, ROOT]), "TF_CPP_MIN_LOG_LEVEL": "2"})


def run(argv: List[str], where: str, workdir: str) -> None:
    done = subprocess.run(argv, cwd=workdir, env=environment(workdir), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, (f"{where}: {' '.join(argv)} exited {done.returncode}\n"
                                  f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def parse_gin(paths: List[str], where: str) -> None:
    """Parses each gin file with ctl's configurables registered, as `ctl.run` would (in this process:
    the test's working directory and `sys.path` are the page's work dir, so its modules import)."""
    import gin
    import ctl

    ctl.import_api()
    try:
        for path in paths:
            gin.clear_config()
            try:
                gin.parse_config_file(path, skip_unknown=False)
            except Exception as error:  # noqa: BLE001 - any failure is the block's.
                raise AssertionError(f"{where}: {os.path.basename(path)}: {error}") from error
    finally:
        gin.clear_config()


def check_block(block: Block, workdir: str, gin_files: List[str], ctl_runs: List[dict]) -> None:
    """Checks `block`; a gin file is only written and added to `gin_files`, parsed with the page's others;
    a `ctl.run` command is added to `ctl_runs`, checked once the page's files are written."""
    marker = block.marker
    kind = marker.group(0).split("docs-test: ")[1].split()[0] if marker else None
    if kind == "skip":
        return
    if kind == "file":
        path = os.path.join(workdir, marker.group("file"))
        with open(path, "w") as f:
            f.write(block.text)
        if block.lang == "gin":
            gin_files.append(path)
        return
    if block.lang == "python":
        run([sys.executable, "-c", block.text], block.where(), workdir)
    elif block.lang == "gin":
        path = os.path.join(workdir, f"_line_{block.line}.gin")
        with open(path, "w") as f:
            f.write(block.text)
        gin_files.append(path)
    elif block.lang == "yaml":
        import yaml
        for argv in _argv_lists(list(yaml.safe_load_all(block.text))):  # e.g. a container's command.
            start = argv.index("-m") + 1
            if start < len(argv) and argv[start] in CLIS:
                check_flags(argv[start], argv[start + 1:], block.where(), workdir, ctl_runs)
    elif block.lang == "json":  # A JSON document, or JSON lines.
        try:
            json.loads(block.text)
        except ValueError:
            for line in block.text.splitlines():
                if line.strip():
                    json.loads(line)
    elif block.lang in ("sh", "bash"):
        for command in commands(block.text):
            argv = shlex.split(command, comments=True)
            ctl = CTL_COMMAND.search(command)
            if ctl:  # Checked even when it runs: a block not marked `run` must be as right.
                start = argv.index(ctl.group(1)) + 1
                check_flags(ctl.group(1), _program_args(argv[start:]), block.where(), workdir, ctl_runs)
            if kind == "run" and argv and re.fullmatch(r"(\S*/)?python3?", argv[0]):
                run([sys.executable] + argv[1:], block.where(), workdir)


SHELL_OPERATOR = re.compile(r"^(&|;|\||\|\||\d?>.*|<.*)$")


def _program_args(args: List[str]) -> List[str]:
    """The arguments a program gets: up to the shell's `&`, `;`, `|` or a redirection."""
    end = next((i for i, arg in enumerate(args) if SHELL_OPERATOR.match(arg)), len(args))
    return args[:end]


def _argv_lists(value) -> List[List[str]]:
    """Every list of strings with `-m` in it, anywhere in a parsed YAML document."""
    if isinstance(value, dict):
        return [argv for item in value.values() for argv in _argv_lists(item)]
    if isinstance(value, list):
        if "-m" in value and all(isinstance(item, str) for item in value):
            return [value]
        return [argv for item in value for argv in _argv_lists(item)]
    return []


INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PLACEHOLDER = re.compile(r"\.\.\.|=VALUE\b|<[\w. ]+>")  # `...`, `NAME=VALUE`, `<ctl.run flags>`


def inline_commands(page: str) -> List[tuple]:
    """(line, argv) of each inline code span outside the fences that is a `python -m ctl.*` command or
    holds a `--gin.` binding, placeholders (`...`, `NAME=VALUE`, `<ctl.run flags>`) aside."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    found, fenced = [], False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line) or (fenced and line.strip() == "```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for span in INLINE_CODE.findall(line):
            if ("python -m ctl." in span or "--gin." in span or "--gin_bindings=" in span) \
                    and not PLACEHOLDER.search(span):
                found.append((number, shlex.split(span)))
    return found


def check_inline(page: str, workdir: str, ctl_runs: List[dict]) -> None:
    """A command in the text is checked as a block's; flags alone (`--gin.ctl.X.y=1`, or a `ctl.run`
    command without its `--mode`), as flags of `ctl.run` in a command of their own."""
    for number, argv in inline_commands(page):
        where = f"{page}:{number}"
        program = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None
        flags = [arg for arg in argv if arg.startswith("--")]
        if not flags:
            continue  # The program named, not a command (`python -m ctl.run` runs the modes ...).
        if program in CLIS and (program != "ctl.run" or any(f.startswith("--mode=") for f in flags)):
            start = argv.index("-m") + 2
            check_flags(program, argv[start:], where, workdir, ctl_runs)
        else:
            ctl_runs.append({"where": where, "fragment": True,
                             "args": ["--mode=train", "--model_dir=DIR", *flags]})


def the_main_job_reaches_98_percent(workdir: str) -> None:
    """The first run page's job is the README's main job, `configs/digits.gin` unchanged: evaluated
    every 500 steps to 2,000, the last at >= 0.98 held-out accuracy (README.md, "Shipped
    experiments"). Checked on the page's own run: the one run of the 2,000 steps in the suite."""
    accuracy = scalars(os.path.join(workdir, "runs", "digits", "eval"))["accuracy"]
    assert sorted(accuracy) == [500, 1000, 1500, 2000], accuracy
    assert accuracy[2000] >= 0.98, accuracy


# A page's check of what its runs wrote, once its blocks ran.
WHAT_THE_RUNS_MADE = {"docs/get-started/first-run.md": the_main_job_reaches_98_percent}


def test_every_guarantee_cites_the_tests_that_carry_it():
    """Each guarantee of docs/explanation/guarantees.md cites, in its closed **Tests** block, a test that fails
    when it breaks (that each cited test exists: `test_every_cited_test_exists`); BUILD.md points here, and
    `python -m tests.support.guarantee_table` prints them as one table."""
    from tests.support.guarantee_table import rows

    found = rows()
    assert len(found) >= 50, len(found)
    untested = [anchor for anchor, tests in found if tests == "none"]
    assert not untested, f"guarantees without a **Tests** block citing a test: {untested}"


def test_each_check_of_what_runs_made_is_of_a_page():
    assert set(WHAT_THE_RUNS_MADE) <= set(PAGES)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_snippet_runs(page, tmp_path, monkeypatch, command_checker):
    for name in ("configs", "experiments"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    gin_files, ctl_runs = [], []
    for block in blocks(page):
        check_block(block, str(tmp_path), gin_files, ctl_runs)
    check_inline(page, str(tmp_path), ctl_runs)
    check_ctl_runs(ctl_runs, str(tmp_path), page, command_checker)
    if page in WHAT_THE_RUNS_MADE:
        WHAT_THE_RUNS_MADE[page](str(tmp_path))
    if gin_files:
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        parse_gin(gin_files, page)


CODE_LINE_LIMIT = 84  # What a code block shows at 1280 px without scrolling sideways.


def test_code_blocks_fit_the_page():
    """A code block wider than the page's column scrolls sideways: wrap a command with `\\`, put a
    comment on the line above its code, cut a long output line (every block of every language)."""
    long = [f"{block.where()}: {len(line)} characters: {line[:60]}..."
            for page in PAGES for block in blocks(page)
            for line in block.text.splitlines() if len(line) > CODE_LINE_LIMIT]
    assert not long, "code lines to wrap:\n" + "\n".join(long)


def test_the_markers_are_understood():
    """A marker the runner does not know would silently skip its block."""
    for page in PAGES:
        blocks(page)  # Raises on a malformed marker.


CITED_TEST = re.compile(r"(tests/test_\w+\.py)?::(test_\w+)|(tests/test_\w+\.py)")


def test_every_cited_test_exists():
    """A sentence citing a test that is gone (or was never there) is a false claim."""
    missing = []
    for page in PAGES + ["BUILD.md"]:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        last_file = None
        for match in CITED_TEST.finditer(text):
            path = match.group(1) or match.group(3)
            if path:
                last_file = path
                if not os.path.exists(os.path.join(ROOT, path)):
                    missing.append(f"{page}: {path}")
                    continue
            if match.group(2):
                assert last_file, f"{page}: ::{match.group(2)} names no file before it"
                with open(os.path.join(ROOT, last_file)) as f:
                    if not re.search(rf"def {match.group(2)}\b", f.read()):
                        missing.append(f"{page}: {last_file}::{match.group(2)}")
    assert not missing, "cited tests that do not exist:\n" + "\n".join(missing)


CITED_PATH = re.compile(r"`((?:ctl|tests|bench|configs|experiments|tools|docs|\.ci)/[\w./*-]*[\w*/])(?:::\w+)?`")


def test_every_cited_path_exists():
    """A file or directory of the repository named in the docs (`ctl/model_dir/claims.py`, `configs/`,
    `bench/results/*.json`) is there: a renamed module leaves no sentence pointing at nothing."""
    missing = []
    for page in PAGES + ["BUILD.md"]:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for path in sorted(set(CITED_PATH.findall(text))):
            if not glob.glob(os.path.join(ROOT, path)):
                missing.append(f"{page}: {path}")
    assert not missing, "cited paths that do not exist:\n" + "\n".join(missing)


def nav_pages(nav) -> List[str]:
    pages = []
    for item in nav:
        value = list(item.values())[0] if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for the tests that read it (`mkdocs build --strict`).

    Not `-q`: it silences mkdocs' logger below ERROR, so no warning is ever counted and `--strict`
    fails on nothing. A warning (a broken link or anchor, which mkdocs.yml's `validation` makes
    warnings; a docstring griffe cannot parse) fails the build, and the message shows it."""
    site = tmp_path_factory.mktemp("site")
    done = run_command(ctl_command("build", "--strict", "-d", str(site), module="mkdocs"),
                       timeout=600)
    said = [line for line in (done.stderr + done.stdout).splitlines()
            if line.startswith(("WARNING", "ERROR", "Aborted"))]
    assert done.returncode == 0, "\n".join(said) or done.stderr[-4000:]
    return site


@pytest.mark.slow
@pytest.mark.xdist_group("docs_site")
def test_the_site_builds_strictly_and_every_page_is_in_the_navigation(site):
    import yaml

    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        config = yaml.load(f, Loader=yaml.BaseLoader)
    in_nav = set(nav_pages(config["nav"]))
    on_disk = {os.path.relpath(p, os.path.join(ROOT, "docs"))
               for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)}
    generated = {"reference/cli.md", "reference/gin.md", "reference/api.md"}
    assert on_disk | generated == in_nav, (
        f"not in the navigation: {sorted(on_disk | generated - in_nav)}; "
        f"in it but missing: {sorted(in_nav - on_disk - generated)}")
    # The built navigation links every page (what a reader can click), from the home page.
    with open(site / "index.html") as f:
        links = set(re.findall(r'class="md-nav__link[^"]*"[^>]*href="([^"#]+)"|href="([^"#]+)"[^>]*class="md-nav__link',
                               f.read()))
    hrefs = {os.path.normpath(a or b) for a, b in links}
    for page in in_nav:
        html = os.path.splitext(page)[0] + ".html"
        assert (site / html).exists(), f"{page} was not built"
        assert html in hrefs, f"{page} is not linked from the site's navigation"
    problems = [problem for path in sorted(glob.glob(str(site / "**" / "*.html"), recursive=True))
                for problem in rendering_problems(path)]
    assert not problems, "pages that render wrong:\n" + "\n".join(problems)
    with open(site / "reference" / "api.html") as f:
        missing = reference_gaps(f.read())
    assert not missing, "the Python API page lacks, or shows without a docstring:\n" + "\n".join(missing)


# What a page of the site shows a reader (its text outside the closed **Tests** of a guarantee) never holds: a
# test's id or path (the evidence stays, under **Tests**), a note on the load of the host that measured a figure,
# or a reference to BUILD.md (not on the site).
NOT_FOR_READERS = re.compile(r"(?:\btests/\w+\.py|::test_\w+|\bload(?: average)? \d|\bloaded (?:host|machine)"
                             r"|\bother jobs\b|BUILD\.md)")


def _shown_text(html: str) -> str:
    """A built page's text as a reader sees it: no closed `<details>` (a guarantee's tests), no script, no tag."""
    html = re.sub(r"<details\b(?![^>]*\bopen\b).*?</details>", " ", html, flags=re.S)
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return _text(html)


@pytest.mark.slow
@pytest.mark.xdist_group("docs_site")
def test_no_page_shows_test_ids_host_notes_or_build_md(site):
    found = []
    for path in sorted(glob.glob(str(site / "**" / "*.html"), recursive=True)):
        with open(path) as f:
            text = _shown_text(f.read())
        page = os.path.relpath(path, site)
        found += [f"{page}: ...{text[max(0, m.start() - 50):m.end() + 30]}..."
                  for m in NOT_FOR_READERS.finditer(text)
                  # The architecture page is the contributor's: the layout of the code and the checks that keep it.
                  if not (page == "explanation/architecture.html" and "test" in m.group())]
    assert not found, "text for maintainers on the site's pages:\n" + "\n".join(found)
    with open(site / "explanation" / "guarantees.html") as f:
        evidence = re.findall(r"<details\b.*?</details>", f.read(), flags=re.S)
    assert len(evidence) >= 50 and all("tests/test_" in block for block in evidence), len(evidence)


@pytest.mark.slow
@pytest.mark.xdist_group("docs_site")
def test_no_code_block_of_the_built_site_is_wider_than_the_page(site):
    """Every code block as built, generated ones too (BUILD.md's layout on the architecture page, docstrings on
    the API page), fits CODE_LINE_LIMIT characters: what a code block shows at 1280 px without scrolling sideways
    (measured in Chromium at 1280x800: scrollWidth against clientWidth of every `pre > code` and table)."""
    long = []
    for path in sorted(glob.glob(str(site / "**" / "*.html"), recursive=True)):
        with open(path) as f:
            for block in re.findall(r"<pre\b[^>]*>(.*?)</pre>", f.read(), flags=re.S):
                for line in html_module.unescape(re.sub(r"<[^>]+>", "", block)).splitlines():
                    if len(line) > CODE_LINE_LIMIT:
                        long.append(f"{os.path.relpath(path, site)}: {len(line)} characters: {line[:70]}...")
    assert not long, "code lines wider than the page:\n" + "\n".join(long)


# The extra of pyproject.toml a command needs, by what the command names (`python -m ctl.report` draws with
# matplotlib, the `report` extra; the digits configs read scikit-learn's data, the `experiments` extra).
EXTRA_NEEDED = {"ctl.report": "report", "ctl.sweep": "sweep", "configs/digits": "experiments"}
GET_STARTED = ["docs/get-started/install.md", "docs/get-started/first-run.md"]


def test_the_install_page_names_the_repository_and_installs_what_the_first_pages_run():
    """The install page says where the code comes from (its `git clone` names the repository that mkdocs.yml's
    `repo_url` and pyproject.toml's `[project.urls]` name), and its `pip install` brings every extra the
    commands of the first pages need."""
    import tomllib

    import yaml

    with open(os.path.join(ROOT, "docs", "get-started", "install.md")) as f:
        install = f.read()
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        repo_url = yaml.load(f, Loader=yaml.BaseLoader)["repo_url"]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    clone = re.search(r"^git clone (\S+)$", install, re.M)
    assert clone and clone.group(1).removesuffix(".git") == repo_url == project["urls"]["Repository"], (
        clone and clone.group(1), repo_url, project["urls"])
    installed = re.search(r"^pip install -e '\.\[([\w,]+)\]'$", install, re.M)
    assert installed, "the install page's pip install -e '.[EXTRAS]' line"
    extras = set(installed.group(1).split(","))
    assert extras <= set(project["optional-dependencies"]), extras
    needed = {f"{page}:{block.line}: {extra}" for page in GET_STARTED for block in blocks(page)
              if block.lang in ("sh", "bash") for command in commands(block.text)
              for name, extra in EXTRA_NEEDED.items() if name in command and extra not in extras}
    assert not needed, f"commands whose extra the install page does not install: {sorted(needed)}"


# What a reader types in the site's search box, and the page it must list first.
SEARCHES = {"gs://": "how-to/gcs.html", "gcs": "how-to/gcs.html", "bucket": "how-to/gcs.html",
            "sweep": "how-to/tune-hyperparameters.html", "hyperparameters": "how-to/tune-hyperparameters.html",
            "preemption": "how-to/preemptible-jobs.html", "exit status": "reference/exit-statuses.html",
            "Model Garden": "how-to/model-garden.html", "continuous_eval": "sidecar.html",
            "sidecar": "sidecar.html", "export": "comforts.html"}


@pytest.mark.slow
@pytest.mark.xdist_group("docs_site")
def test_the_site_search_lists_the_page_for_a_topic_first(site):
    """The built search index, ranked as mkdocs-material's search worker ranks it in a browser
    (tests/support/site_search.py): the how-to for a topic comes first, not a page that mentions it."""
    from tests.support.site_search import SiteSearch

    search = SiteSearch(str(site / "search" / "search_index.json"))
    # A page's `search: boost:` lifts it for every query it matches at all, answered there or not: pages rank
    # by their content (titles and text).
    boosted = sorted({doc["location"].split("#")[0] for doc in search.docs.values() if doc.get("boost", 1) != 1})
    assert not boosted, f"pages with a search boost: {boosted}"
    wrong = {query: search.pages(query)[:3] for query, page in SEARCHES.items()
             if search.pages(query)[:1] != [page]}
    assert not wrong, f"searches whose first page is not the topic's (query: first pages): {wrong}"


def _documented(html: str, heading: str) -> bool:
    """Whether the API page has an entry whose heading reads `heading` (e.g. `ctl.Task`, or a
    member's `on_eval_end` under its anchor) followed by a docstring (a paragraph of text)."""
    for entry in re.split(r'(?=<h\d id="[^"]*" class="doc doc-heading")', html)[1:]:
        head, _, body = entry.partition("</h")
        anchor = re.match(r'<h\d id="([^"]*)"', head).group(1)
        title = _text(re.sub(r"<a .*?</a>|<span class=\"doc doc-labels.*", "", head, flags=re.S))
        if heading in (title.split("(")[0].strip(), anchor):
            contents = body.split('class="doc doc-contents', 1)[-1]
            if re.search(r"<p>\s*\S", contents.split('class="doc doc-heading"')[0]):
                return True
    return False


def reference_gaps(html: str) -> List[str]:
    """Every public name of `ctl` and of `ctl.hooks`, and every method of the hook protocol, that
    the built API page does not show with a docstring."""
    import ctl
    import ctl.hooks
    from ctl.core import hook_protocol as hooks

    ctl.import_api()
    wanted = [f"ctl.{name}" for name in ctl.__all__ if name not in ("hooks",)]
    wanted += [f"ctl.hooks.{name}" for name in ctl.hooks.__all__]
    methods = [name for name in vars(hooks.HookProtocol) if not name.startswith("_")]
    missing = [f"HookProtocol lacks {name} (ctl.core.hook_protocol.HOOK_METHODS)"
               for name in hooks.HOOK_METHODS if name not in methods]
    wanted += [f"ctl.hooks.HookProtocol.{name}" for name in methods]
    return missing + [name for name in wanted if not _documented(html, name)]


LIST_AS_TEXT = re.compile(r"^(- |\* |\d+\. )|\n\s*(- |\* |1\. )")


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html).strip()


def rendering_problems(path: str) -> List[str]:
    """What reads wrong in one built page: a list rendered as a paragraph (a line of it starts with
    "- ", "* " or "1. "), a page named as `docs/NAME.md` without a link to it, an empty table header
    cell, or one holding a name cut in two (a code fragment ending in "." over a column of the rest)."""
    with open(path) as f:
        html = f.read()
    html = re.sub(r"<pre.*?</pre>", "", html, flags=re.S)  # Code blocks keep their text as written.
    where = os.path.basename(path)
    problems = []
    for paragraph in re.findall(r"<p>(.*?)</p>", html, re.S):
        text = re.sub(r"<[^>]+>", "", paragraph)
        if LIST_AS_TEXT.search(text.lstrip()):
            problems.append(f"{where}: a list rendered as a paragraph: {text.strip()[:80]!r}")
    text = re.sub(r"<a\b.*?</a>|<!--.*?-->", "", html, flags=re.S)
    for mention in sorted(set(re.findall(r"\bdocs/[\w./-]+\.md\b", text))):
        problems.append(f"{where}: {mention} is named but not linked")
    for cell in re.findall(r"<th[^>]*>(.*?)</th>", html, re.S):
        if not _text(cell):
            problems.append(f"{where}: an empty table header cell")
        elif re.fullmatch(r"\s*<code>[^<]*\.</code>\s*", cell):
            problems.append(f"{where}: a table header cell holds half a name: {_text(cell)!r}")
    return problems


def _hand_written(page: str) -> str:
    with open(os.path.join(ROOT, "docs", page)) as f:
        return f.read()


def test_every_exit_status_in_the_code_is_explained():
    """An `EXIT_*` constant added to ctl (the generated table lists it) needs a row saying what to do."""
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  os.path.join(ROOT, "tools", "docs_reference.py"))
    docs_reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_reference)
    explained = set(re.findall(r"^\| (\d+) \|", _hand_written("reference/exit-statuses.md"), re.M))
    constants = docs_reference.exit_constants()
    assert constants, "no EXIT_* constant found in ctl"
    missing = [f"{name} = {value} ({module})" for value, name, module in constants
               if str(value) not in explained]
    assert not missing, f"docs/reference/exit-statuses.md does not explain: {missing}"


def test_the_api_page_starts_with_an_overview_of_every_public_name():
    """The Python API page opens with what a run is made of (Task, Trainer, Experiment,
    run_experiment, hooks) and where each other public name fits: a name added to `ctl` needs its
    place there too (the alphabetical reference below it is generated)."""
    import ctl

    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  os.path.join(ROOT, "tools", "docs_reference.py"))
    docs_reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_reference)
    page = docs_reference.api_page()
    overview = page.split("## Every name, A to Z")[0]
    assert "## Overview" in overview and "::: " not in overview, overview[:300]
    table = overview.split("The rest, by use:")[0]
    for name in ("Task", "Trainer", "Experiment", "run_experiment", "hooks"):
        assert f"[`ctl.{name}`](#" in table, f"the overview's table lacks ctl.{name}"
    missing = [name for name in ctl.__all__ if f"[`ctl.{name}`](#" not in overview]
    assert not missing, f"public names the API page's overview does not place: {missing}"


def _model_dir_names_owned_above() -> set:
    """The `*_FILE`/`*_DIR` constants a module above `ctl.model_dir` defines and joins into a model
    dir (`ModelDir.file(NAME)` in that module): the names of the files each layer writes."""
    found = set()
    for dirpath, _, files in os.walk(os.path.join(ROOT, "ctl")):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name)) as f:
                tree = ast.parse(f.read())
            constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                         for t in n.targets if isinstance(t, ast.Name)
                         and re.fullmatch(r"[A-Z_]+_(FILE|DIR)", t.id)
                         and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
            joined = {a.id for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and n.func.attr == "file"
                      for a in n.args if isinstance(a, ast.Name)}
            found |= {constants[c] for c in joined & set(constants)}
    return found


def test_every_file_of_the_model_dir_is_in_the_reference():
    """A file `ctl.model_dir` names, or a layer above joins into a model dir, needs its row
    (who writes it, who reads it)."""
    from ctl import model_dir

    names = {value for name, value in vars(model_dir).items()
             if re.fullmatch(r"[A-Z_]+_(FILE|DIR)", name) and isinstance(value, str)}
    assert names, "no *_FILE or *_DIR constant in ctl.model_dir"
    above = _model_dir_names_owned_above()
    assert {"trainer.lock", "early_stopping.json", "best", "best.json", "export", "report.png"} <= above, above
    names |= above
    rows = _hand_written("reference/model-dir.md")
    missing = sorted(n for n in names if f"`{n}" not in rows and f"/{n}" not in rows)
    assert not missing, f"docs/reference/model-dir.md has no row for: {missing}"
