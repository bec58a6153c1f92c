"""The docs stay findable: the README is a front page, every relative link resolves, every benchmark is indexed."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_front_page():
    assert (ROOT / "README.md").stat().st_size <= 15_000


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    """A page's links to files of this repository (a moved or renamed file breaks them)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # commands in code blocks are not links
    targets = [t.split("#", 1)[0] for t in LINK.findall(text) if not t.startswith(("http://", "https://", "#"))]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name}: {missing}"


def test_the_benchmarks_index_names_every_script():
    index = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert [s for s in scripts if f"`{s}`" not in index and f"({s})" not in index] == []


def test_results_keep_one_current_set_at_the_top():
    """Issue 28: tables at the top, one set per benchmark script, their figures in figures/, older variants in
    archive/."""
    top = list((ROOT / "benchmarks" / "results").iterdir())
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    stems = {p.stem.removesuffix("_paper") for p in top if p.is_file()}
    assert stems <= scripts, f"results at the top that no benchmark script names: {sorted(stems - scripts)}"
    assert {p.name for p in top if p.is_dir()} == {"archive", "figures"}
    assert not [p.name for p in top if p.is_file() and p.suffix not in (".md", ".json")]  # figures in figures/
