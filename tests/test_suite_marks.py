"""The suite's two tiers hold: no test starts a process, a server or a browser without a mark that
keeps it out of the fast tier (`python -m pytest -m "not slow"`).

A test is marked by what it uses (conftest.KIND_BY_FIXTURE: it takes `app_server`, `browser`,
`twin_dir`, `real_scale_run` or `embedded_model`, itself or through another fixture) or by a mark of its own
(`pytestmark` or a decorator). What starts a process is read from the source (ast): a call into
subprocess or multiprocessing, os's process functions, `Popen`, any `launch(...)` (the app's
dgemma.app_process.launch, gradio's Blocks.launch, playwright's chromium.launch), `sync_playwright`, and
any function of tests/ or dgemma/ that makes such a call, followed through helpers and fixtures.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from conftest import KIND_BY_FIXTURE, SLOW_KINDS

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SLOW_MARKS = {"slow", *SLOW_KINDS}
PROCESS_MODULES = ("subprocess", "multiprocessing", "pty")
OS_PROCESS_CALLS = ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "spawn", "exec")
STARTER_NAMES = {"Popen", "launch", "sync_playwright", "async_playwright", "create_subprocess_exec",
                 "create_subprocess_shell", "ProcessPoolExecutor"}  # fmt: skip


def _dotted(node: ast.expr) -> list[str]:
    """`a.b.c` as ["a", "b", "c"]; [] for anything that is not a plain name chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The names of the `pytest.mark.NAME` (or `pytest.mark.NAME(...)`) among `decorators`."""
    names = set()
    for node in decorators:
        chain = _dotted(node.func if isinstance(node, ast.Call) else node)
        if chain[:2] == ["pytest", "mark"] and len(chain) == 3:
            names.add(chain[2])
    return names


@dataclass
class Source:
    """One module's top-level functions, fixtures, imports and module-wide marks."""

    path: Path
    name: str  # as imported: a tests/ module by its stem, a dgemma module dotted
    tree: ast.Module = field(init=False)

    def __post_init__(self) -> None:
        self.tree = ast.parse(self.path.read_text(encoding="utf-8"))

    @cached_property
    def functions(self) -> dict[str, ast.FunctionDef]:
        return {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    @cached_property
    def fixtures(self) -> set[str]:
        return {name for name, fn in self.functions.items()
                if any(_dotted(d.func if isinstance(d, ast.Call) else d)[-1:] == ["fixture"] for d in fn.decorator_list)}

    @cached_property
    def imports(self) -> dict[str, tuple[str, str | None]]:
        """Local name -> (module, attribute or None for the module itself)."""
        package = self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]
        found: dict[str, tuple[str, str | None]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found[alias.asname or alias.name.split(".")[0]] = (alias.name if alias.asname else alias.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                for alias in node.names:
                    found[alias.asname or alias.name] = (base, alias.name)
        return found

    @cached_property
    def module_marks(self) -> set[str]:
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
                values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                return _marks(values)
        return set()


class Suite:
    """The modules of tests/ (and those of dgemma/ they import), read on demand."""

    def __init__(self, test_files: list[Path]) -> None:
        self.sources = {p.stem: Source(p, p.stem) for p in test_files}
        self.conftest = self.sources.get("conftest")
        self._starts: dict[tuple[str, str], bool] = {}
        self._used_kinds: dict[tuple[str, str], bool] = {}

    def source(self, module: str) -> Source | None:
        if module not in self.sources and module.split(".")[0] == "dgemma":
            for path in (ROOT / (module.replace(".", "/") + ".py"), ROOT / module.replace(".", "/") / "__init__.py"):
                if path.is_file():
                    self.sources[module] = Source(path, module)
        return self.sources.get(module)

    def fixture(self, src: Source, name: str) -> tuple[Source, str] | None:
        """Where the fixture a test of `src` names `name` comes from (the module, then conftest)."""
        if name in src.fixtures:
            return src, name
        if name in src.imports and (target := self.resolve(*src.imports[name])) and name in target[0].fixtures:
            return target
        if self.conftest is not None and name in self.conftest.fixtures:
            return self.conftest, name
        return None

    def resolve(self, module: str, attribute: str | None) -> tuple[Source, str] | None:
        target = self.source(module) if attribute is not None else None
        return (target, attribute) if target is not None and attribute in target.functions else None

    def _starter_call(self, src: Source, call: ast.Call) -> bool | tuple[Source, str] | None:
        """True when `call` starts a process itself; the function it calls when that one may."""
        chain = _dotted(call.func)
        if not chain:  # a call on a call's result: `sync_playwright().start()`, `gr.Blocks().launch()`
            return isinstance(call.func, ast.Attribute) and call.func.attr in STARTER_NAMES
        head, last = chain[0], chain[-1]
        module = src.imports.get(head, (head, None))
        origin = module[0] if module[1] is None else f"{module[0]}.{module[1]}"
        if origin.split(".")[0] in PROCESS_MODULES and len(chain) + (module[1] is not None) >= 2:
            return True  # subprocess.run(...), multiprocessing.Process(...), from subprocess import run
        if origin == "os" and len(chain) == 2 and last.startswith(OS_PROCESS_CALLS):
            return True
        if last in STARTER_NAMES:
            return True
        if len(chain) == 1:
            if head in src.functions:
                return src, head
            if head in src.imports:
                return self.resolve(*src.imports[head])
        return None

    def starts(self, src: Source, name: str) -> bool:
        """Does calling `name` of `src` (or setting it up, for a fixture) start a process?"""
        key = (src.name, name)
        if key not in self._starts:
            self._starts[key] = False  # a recursive helper is followed once
            fn = src.functions[name]
            callees = [self._starter_call(src, c) for c in ast.walk(fn) if isinstance(c, ast.Call)]
            callees += [self.fixture(src, a.arg) for a in fn.args.args] if name in src.fixtures or name.startswith("test") else []
            self._starts[key] = any(c is True or (isinstance(c, tuple) and self.starts(*c)) for c in callees)
        return self._starts[key]

    def uses_a_kind(self, src: Source, name: str) -> bool:
        """Does `name` take a fixture of KIND_BY_FIXTURE, itself or through its fixtures?"""
        key = (src.name, name)
        if key not in self._used_kinds:
            self._used_kinds[key] = False
            args = [a.arg for a in src.functions[name].args.args]
            self._used_kinds[key] = any(a in KIND_BY_FIXTURE or ((f := self.fixture(src, a)) and self.uses_a_kind(*f))
                                        for a in args)
        return self._used_kinds[key]

    def marked(self, src: Source, name: str) -> bool:
        own = src.module_marks | _marks(src.functions[name].decorator_list)
        return bool(own & SLOW_MARKS) or self.uses_a_kind(src, name)

    def unmarked_starters(self) -> list[str]:
        """Each test (and conftest fixture) that starts a process, a server or chromium unmarked."""
        found = []
        for src in list(self.sources.values()):
            if src.path.parent != TESTS and src.name.split(".")[0] == "dgemma":
                continue
            is_conftest = src is self.conftest
            for name in src.functions:
                if not (name.startswith("test") and src.name.startswith("test")) and not (is_conftest and name in src.fixtures):
                    continue
                if self.starts(src, name) and not (name in KIND_BY_FIXTURE if is_conftest else self.marked(src, name)):
                    found.append(f"{src.path.name}::{name}")
        return sorted(found)


def suite_files() -> list[Path]:
    return sorted(TESTS.glob("*.py"))


def test_no_test_starts_a_process_a_server_or_chromium_without_a_slow_mark():
    found = Suite(suite_files()).unmarked_starters()
    assert not found, f"tests that start a process but would run in the fast tier (mark them, or take the fixture): {found}"


BAD_MODULE = '''
import subprocess

import pytest

from app_server import MODEL_ARGS, launch
from browser_page import launch_chromium


def run_cli():
    return subprocess.run(["true"])


@pytest.fixture
def own_app(tmp_path):
    return launch(MODEL_ARGS, tmp_path / "app.log")


def test_runs_a_cli_through_a_helper():
    run_cli()


def test_talks_to_an_app_of_its_own(own_app):
    assert own_app.url


def test_opens_chromium_itself():
    with launch_chromium():
        pass


@pytest.mark.server
def test_runs_a_cli_and_says_so():
    run_cli()


def test_uses_the_shared_app(app_server):
    subprocess.run(["true"])


def test_adds_in_process():
    assert 1 + 1 == 2
'''


def test_the_mark_rule_catches_a_module_that_starts_processes_unmarked(tmp_path):
    bad = tmp_path / "test_bad_tiers.py"
    bad.write_text(BAD_MODULE)
    found = Suite([*suite_files(), bad]).unmarked_starters()
    assert [f for f in found if f.startswith(bad.name)] == [
        "test_bad_tiers.py::test_opens_chromium_itself",
        "test_bad_tiers.py::test_runs_a_cli_through_a_helper",
        "test_bad_tiers.py::test_talks_to_an_app_of_its_own",
    ]
