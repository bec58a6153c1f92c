"""No import cycles: every module imports alone in a fresh interpreter, and the graph of module-level imports
between ``ps_agent`` and ``training`` modules has no cycle, none hidden by an import inside a function."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ps_agent", "training")

#: Imports of our own modules inside functions, each with why it is not at module level. A key names the
#: importing module and the imported one; ``*`` allows any import in that module.
LAZY = {
    ("ps_agent.cli", "*"): "a command loads what it runs (FAISS, the server, eval), so `ps-agent --help` starts fast",
    ("ps_agent.retrieval", "ps_agent.retrieval.index"): "FAISS and the encoders load only when an index folder is used",
}


def module_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


MODULES = module_files()


def ancestors(name: str) -> list[str]:
    """The packages that importing ``name`` runs first: ``a.b.c`` → ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def targets(node: ast.Import | ast.ImportFrom, importer: str) -> set[str]:
    """Our modules that an import statement in ``importer`` names."""
    if isinstance(node, ast.Import):
        named = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:  # relative: from the importer's package, up level - 1 packages
            package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
            package = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{package}.{base}" if base else package
        named = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names}
    return {name for name in named if name in MODULES}


def imports(name: str) -> tuple[set[str], list[tuple[int, str]]]:
    """The modules ``name`` imports when it is imported, and (line, module) of those it imports in functions."""
    module_level: set[str] = set()
    in_functions: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # never run
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found = targets(child, name)
                if in_function:
                    in_functions.extend((child.lineno, target) for target in sorted(found))
                else:  # and the packages around them, which run first, except the importer's own
                    around = {a for target in found for a in ancestors(target) if a in MODULES}
                    module_level.update(found, around - {name, *ancestors(name)})
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(MODULES[name].read_text(), str(MODULES[name])), in_function=False)
    return module_level, in_functions


def test_the_module_level_imports_of_our_modules_form_no_cycle():
    graph = {name: imports(name)[0] for name in MODULES}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        pytest.fail(f"import cycle: {' → '.join(error.args[1])}")


def test_our_modules_are_imported_inside_functions_only_for_a_listed_reason():
    unlisted = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
        for name in MODULES
        for line, target in imports(name)[1]
        if (name, target) not in LAZY and (name, "*") not in LAZY
    ]
    assert not unlisted, "import at module level, or list the reason in LAZY:\n" + "\n".join(unlisted)


def test_the_cycle_check_sees_a_cycle_and_a_hidden_import(tmp_path, monkeypatch):
    """The checks above can fail: a two-module cycle and an import inside a function are both found."""
    (tmp_path / "a.py").write_text("from ps_agent.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from ps_agent.a import y\n\n\nimport ps_agent.a\n")
    monkeypatch.setitem(MODULES, "ps_agent.a", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "ps_agent.b", tmp_path / "b.py")
    assert imports("ps_agent.b") == ({"ps_agent.a"}, [(2, "ps_agent.a")])
    with pytest.raises(CycleError):
        TopologicalSorter({name: imports(name)[0] for name in ("ps_agent.a", "ps_agent.b")}).prepare()


@pytest.fixture(scope="module")
def fresh_imports() -> dict[str, subprocess.CompletedProcess]:
    """Each module imported first in an interpreter of its own (a few at a time)."""

    def alone(name: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", f"import {name}"]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(MODULES, pool.map(alone, MODULES), strict=True))


@pytest.mark.slow  # an interpreter per module: about a minute of CPU
@pytest.mark.parametrize("name", list(MODULES))
def test_each_module_imports_first_in_a_fresh_interpreter(fresh_imports, name):
    done = fresh_imports[name]
    assert done.returncode == 0, done.stderr[-3000:]
