"""No import cycles: every module imports alone in a fresh interpreter, and the graph of module-level imports
between ``ps_agent`` and ``training`` modules has no cycle, none hidden by an import inside a function."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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
    ("ps_agent.retrieval.langchain", "ps_agent.retrieval"): "the package imports this adapter: PassageRetriever "
    "resolves its spec through the package's resolve_retriever at validation",
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


def named_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in a file: ``from a.b import c`` names ``a.b`` and ``a.b.c``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def misplaced_imports(root: Path) -> list[str]:
    """Imports across the lines a newcomer relies on: the library, the training code and the benchmarks never
    import ``tests``; no training module imports an entry script; a benchmark script imports no other script, only
    ``benchmarks.common``."""
    scripts = {p.stem for p in (root / "benchmarks").glob("*.py")} - {"common"}
    entry = {"training.run_grpo", "training.run_sft"}
    bad = []
    for path in sorted([*root.glob("ps_agent/**/*.py"), *root.glob("training/**/*.py"), *root.glob("benchmarks/*.py")]):
        where = path.relative_to(root)
        for line, name in named_imports(path):
            top, module = name.split(".")[0], ".".join(where.with_suffix("").parts)
            if (
                top == "tests"
                or (where.parts[0] == "training" and name in entry - {module})
                or (
                    where.parts[0] == "benchmarks"
                    and (top in scripts or name.split(".")[:2] in [["benchmarks", s] for s in scripts])
                )
            ):
                bad.append(f"{where}:{line} imports {name}")
    return bad


def test_no_library_imports_tests_and_no_script_imports_another():
    assert misplaced_imports(ROOT) == []


def test_the_misplaced_import_check_sees_each_kind(tmp_path):
    files = {"ps_agent": "from tests.conftest import x\n", "training": "from training import run_grpo\n",
             "benchmarks": "import paper_table\nfrom benchmarks.common import Run\n"}  # fmt: skip
    for folder, text in files.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text(text)
    (tmp_path / "benchmarks" / "paper_table.py").write_text("")
    (tmp_path / "benchmarks" / "common.py").write_text("")
    assert misplaced_imports(tmp_path) == [
        "benchmarks/a.py:1 imports paper_table",
        "ps_agent/a.py:1 imports tests.conftest",
        "ps_agent/a.py:1 imports tests.conftest.x",
        "training/a.py:1 imports training.run_grpo",
    ]


#: Run in one fresh interpreter: import the third-party libraries our modules use (torch, transformers, …: most
#: of an import's time), then fork a child per module that imports it first. Each child starts with none of our
#: modules imported, as a fresh interpreter would, without paying for torch again.
FORKED_IMPORTS = r"""
import importlib, json, os, sys, traceback
preload, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for library in preload:
    try:
        importlib.import_module(library)
    except Exception:
        pass  # a module that needs it fails on its own below, saying why
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("ps_agent", "training"))
assert not ours, f"a third-party import imported our modules: {ours}"
results = {}
for name in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code, message = 0, ""
        except BaseException:
            code, message = 1, traceback.format_exc()
        os.write(write, message.encode()[-20000:])
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    results[name] = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), message]
print(json.dumps(results))
"""


def third_party_imports() -> list[str]:
    """The top-level names of the libraries our modules import, stdlib and our own packages excluded."""
    names = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return sorted(names - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"})


@pytest.fixture(scope="module")
def fresh_imports() -> dict[str, tuple[int, str]]:
    """Each module imported first in a process of its own: (exit code, traceback)."""
    command = [sys.executable, "-c", FORKED_IMPORTS, json.dumps(third_party_imports()), json.dumps(list(MODULES))]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: tuple(result) for name, result in json.loads(done.stdout.splitlines()[-1]).items()}


@pytest.mark.slow  # a child per module, forked after torch and the rest are imported once
@pytest.mark.parametrize("name", list(MODULES))
def test_each_module_imports_first_in_a_fresh_interpreter(fresh_imports, name):
    code, error = fresh_imports[name]
    assert code == 0, error[-3000:]
