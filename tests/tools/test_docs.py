"""The documentation: its ```python blocks run on the CPU, and every public name has a reference entry.

A block runs unless the line above it says why not, ``<!-- skip: needs a GPU -->``; a
``<!-- setup: NAME -->`` line names what it assumes (tests/docs_setup.py; ``loop`` by default).
Each page's blocks run in order in one namespace, in a fresh process, as a reader pastes them.
A block whose code or setup imports an optional framework that is not installed (``jax``, ``lightning``,
``asyncthrottle.lightning``, ...) is skipped, with the module it needs as the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from docs_setup import SETUPS
from once import once

import asyncthrottle
from asyncthrottle._aliases import MOVED

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [*sorted(DOCS.glob("*.md")), README]
# The README's two commands: the repository's contract (.ci/run runs the second as it is).
MAIN_JOB = "python3 -m venv .venv && .venv/bin/pip install -e '.[examples]' && .venv/bin/python examples/mnist.py"
TESTS = "python3 -m venv .venv && .venv/bin/pip install -e '.[test,examples,jax,plot]' && .venv/bin/python -m pytest"
API_PAGES = sorted((DOCS / "api").glob("*.md"))
# Modules users import by name, each rendered whole (its __all__) in the API reference.
API_MODULES = [
    "asyncthrottle.backends.memory", "asyncthrottle.framework", "asyncthrottle.jax", "asyncthrottle.lightning",
    "asyncthrottle.parts.syncaudit", "asyncthrottle.plot", "asyncthrottle.testing", "asyncthrottle.testing.procdevice",
    "asyncthrottle.testing.simulated", "asyncthrottle.transformers",
]
# The public modules whose import needs an optional framework (a block importing one skips without it).
FRAMEWORKS = {
    "asyncthrottle.jax": "jax", "asyncthrottle.lightning": "lightning", "asyncthrottle.plot": "matplotlib",
    "asyncthrottle.transformers": "transformers",
}
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.M)
MAX_SKIPPED = 12  # keep the list of blocks that do not run honest and short
_FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
_MARK = re.compile(r"<!-- (skip|setup): *(.*?) *-->")
_RUNNER = """
import json, sys, traceback
results = {}
for page, todo in json.load(open(sys.argv[1])).items():
    ns = {"__name__": "__main__"}  # one namespace per page, as a reader pastes its blocks in order
    try:
        for label, setup, code in todo:
            exec(compile(setup, "tests/docs_setup.py[" + label + "]", "exec"), ns)
            exec(compile(code, label, "exec"), ns)
        results[page] = None
    except BaseException:
        results[page] = traceback.format_exc()
json.dump(results, open(sys.argv[2], "w"))
"""

@dataclass
class Block:
    label: str  # page:line
    code: str
    setup: str
    skip: str | None


def blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, with the skip reason or setup named on the lines just above each."""
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        above = text[: match.start()].rstrip().rsplit("\n", 2)[-2:]
        marks = {m.group(1): m.group(2) for m in map(_MARK.search, above) if m}
        code = textwrap.dedent("\n".join(s[len(match.group(1)):] for s in match.group(2).split("\n")))
        found.append(Block(f"{page.relative_to(ROOT)}:{line}", code, marks.get("setup", "loop"), marks.get("skip")))
    return found


def missing(block: Block) -> list[str]:
    """The modules that the block or its setup imports and that are not installed here."""
    imported = {a or b for a, b in _IMPORT.findall(SETUPS.get(block.setup, "") + "\n" + block.code)}
    needed = {FRAMEWORKS.get(name, name.split(".")[0]) for name in imported if not name.startswith(".")}
    return sorted(name for name in needed if importlib.util.find_spec(name) is None)


def _runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.skip is None and not missing(b)]


def _unrunnable(page: Path) -> list[str]:
    """Why the page's blocks that need a framework that is not installed do not run."""
    return [f"{b.label} needs {', '.join(missing(b))}" for b in blocks(page) if b.skip is None and missing(b)]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """Every page's runnable blocks, run in one fresh process (one import of torch for all pages), once a
    session: the pages' tests on every pytest-xdist worker read its results."""
    todo = {p.name: [(b.label, SETUPS[b.setup], b.code) for b in _runnable(p)] for p in PAGES if _runnable(p)}

    def run(cwd: Path) -> tuple[int, str, dict[str, str | None] | None]:
        (cwd / "blocks.json").write_text(json.dumps(todo))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": "ignore"}
        done = subprocess.run([sys.executable, "-c", _RUNNER, "blocks.json", "results.json"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=540)
        results = json.loads((cwd / "results.json").read_text()) if done.returncode == 0 else None
        return done.returncode, done.stderr[-3000:], results

    code, err, results = once(tmp_path_factory, ("docs blocks", todo), run)
    assert code == 0 and results is not None, err
    return results


# the first test's setup runs every page's blocks in one process: beside two busy loops and other
# work that took more than the default 120 s
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", [p for p in PAGES if _runnable(p) or _unrunnable(p)], ids=lambda p: p.name)
def test_the_pages_python_blocks_run(page: Path, ran: dict[str, str | None]) -> None:
    if _runnable(page):
        assert ran[page.name] is None, ran[page.name]
    if _unrunnable(page):
        pytest.skip(f"not installed: {'; '.join(_unrunnable(page))} (the page's other blocks ran)")


def test_a_block_that_needs_a_missing_framework_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "lightning" else find_spec(name))
    assert missing(Block("x.md:1", "from asyncthrottle.lightning import ThrottleCallback", "loop", None)) == [
        "lightning"]
    assert missing(Block("x.md:1", "x = 1", "lightning", None)) == ["lightning"]
    assert missing(Block("x.md:1", "import asyncthrottle as at\nfrom asyncthrottle.testing import FakeDevice",
                         "loop", None)) == []
    frameworks = DOCS / "frameworks.md"
    assert next(b.label for b in blocks(frameworks) if b.setup == "lightning") in _unrunnable(frameworks)[0]
    assert _runnable(frameworks)  # the page's other blocks still run


def test_blocks_that_do_not_run_say_why_and_are_few() -> None:
    skipped = [b for page in PAGES for b in blocks(page) if b.skip is not None]
    assert all(b.skip for b in skipped), [b.label for b in skipped if not b.skip]
    assert len(skipped) <= MAX_SKIPPED, [f"{b.label}: {b.skip}" for b in skipped]
    unknown = [b.label for page in PAGES for b in blocks(page) if b.setup not in SETUPS]
    assert not unknown, f"setups not in tests/docs_setup.py: {unknown}"


def _directives() -> set[str]:
    return {name for page in API_PAGES for name in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)}


def _entries(name: str) -> set[str]:
    """The paths a reference entry for ``asyncthrottle.<name>`` may use: its own, or where it is defined."""
    obj = getattr(asyncthrottle, name)
    return {f"asyncthrottle.{name}", f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"}


def test_every_public_name_has_a_reference_entry() -> None:
    missing = [name for name in asyncthrottle.__all__ if not _entries(name) & _directives()]
    assert not missing + [name for name in API_MODULES if name not in _directives()]


def test_every_module_the_docs_import_is_in_the_reference() -> None:
    text = "\n".join(b.code for page in PAGES for b in blocks(page))
    imported = set(re.findall(r"^\s*from (asyncthrottle\.[\w.]+) import", text, re.M))
    # A public home kept at an old path (asyncthrottle.memory) is rendered at its module's path.
    homes = {f"asyncthrottle.{old}": f"asyncthrottle.{new}" for old, (new, deprecated) in MOVED.items()}
    assert not [name for name in imported if homes.get(name, name) not in _directives()], imported
    deprecated = [name for name in imported if MOVED.get(name.removeprefix("asyncthrottle."), ("", False))[1]]
    assert not deprecated, f"the docs import deprecated paths: {deprecated}"


def test_the_reference_renders_each_modules_all() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^\s+filters: public$", config, re.M)  # griffe's "public" is __all__ where it exists
    assert re.search(r"^\s+docstring_style: google$", config, re.M)


def test_the_readme_is_short_and_links_to_every_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    links = set(re.findall(r"\]\(([^)#\s]+)", text))
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert nav and not [page for page in nav if f"docs/{page}" not in links]
    assert not [link for link in links if "://" not in link and not (ROOT / link).exists()]


def test_the_readme_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert MAIN_JOB in text and TESTS in text
    assert "mkdocs build --strict" in text and "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()


def test_ci_runs_the_readmes_test_command_as_it_is() -> None:
    assert TESTS in (ROOT / ".ci" / "run").read_text()


def test_the_options_table_names_every_throttle_keyword() -> None:
    import inspect

    text = (DOCS / "depth-rule.md").read_text()
    table = text[text.index("The options, all keyword-only"):]
    rows = "\n".join(line for line in table.splitlines()[:40] if line.startswith("| `"))
    listed = set(re.findall(r"`(\w+)=`", rows))
    keywords = set(inspect.signature(asyncthrottle.Throttle).parameters) - {"depth"}  # depth: the first argument
    keywords |= set(inspect.signature(asyncthrottle.Throttle.wrap).parameters) - {"self", "iterable"}  # to=, progress=
    assert not keywords - listed, f"Throttle keywords missing from depth-rule.md's table: {sorted(keywords - listed)}"
    assert not listed - keywords, f"the table lists what Throttle does not take: {sorted(listed - keywords)}"
