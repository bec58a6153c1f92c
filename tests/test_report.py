"""The HTML report, driven in a real headless Chromium: filters, parallel branches, both modes side by side,
untrusted text shown as text; the training-run page; `ps-agent report`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ps_agent.eval import EvalSettings, evaluate
from ps_agent.eval_report import read_results
from ps_agent.report import script_json, training_report
from ps_agent.synthetic import GoldPlanPolicy, generate

PS_AGENT = str(Path(sys.executable).parent / "ps-agent")
INJECTED = "<script>window.injected = 1</script><img src=x onerror=window.injected=2>"


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, headless, through its chromedriver (`make test` installs both where it can)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no chromium/chromedriver on PATH: `apt-get install chromium chromium-driver` (make test tries)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    session = webdriver.Chrome(service=Service(driver), options=options)
    yield session
    session.quit()


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """A real eval of a synthetic world in both modes by the gold-plan oracle (a model double), whose corpus
    holds a passage titled with markup that BM25 puts first for the first question's sub-queries."""
    tmp = tmp_path_factory.mktemp("report")
    corpus, questions = generate(seed=3, entities=60, out=tmp / "synth")
    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    bait = " ".join(step["sub_question"] for step in rows[0]["plan"][0])
    with corpus.open("a") as f:
        f.write(json.dumps({"id": "bait", "contents": f'"{INJECTED}"\n' + (bait + " ") * 5}) + "\n")
    out = tmp / "out"
    for mode in ("parallel", "sequential"):
        settings = EvalSettings(llm=GoldPlanPolicy(rows, mode), retriever=str(corpus), modes=(mode,))
        evaluate([questions], out, settings)
    return out, rows


def open_page(browser, path: Path) -> None:
    """Open the page and wait until its script has drawn it: under the full suite's load (three workers on two
    cores) the page once read no ``data-ready`` right after ``get`` (alone, the test passed three times in three).
    A script that fails never sets it, and the wait raises ``TimeoutException``."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(path.resolve().as_uri())
    WebDriverWait(browser, 60).until(lambda b: b.execute_script("return document.body.dataset.ready") == "true")


def choose(browser, select_id: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, select_id)).select_by_value(value)


def count(browser) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, "count").text


def test_script_json_cannot_end_its_script_block():
    data = {"passage": "</script><!-- <script>alert(1)</script> & more"}
    text = str(script_json(data))
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


def test_eval_page_filters_and_draws_each_round_as_parallel_branches(eval_run, browser):
    from selenium.webdriver.common.by import By

    out, rows = eval_run
    records, n = read_results(out), 2 * len(rows)
    assert len(records) == n and (out / "report.html").is_file()  # evaluate wrote the page
    open_page(browser, out / "report.html")
    assert count(browser) == f"{n} of {n}"
    choose(browser, "filter-mode", "parallel")
    assert count(browser) == f"{len(rows)} of {n}"
    decomposed = sum(r["decomposed"] for r in records if r["mode"] == "parallel")
    assert 0 < decomposed < len(rows)  # the world has parallelisable and sequential questions
    choose(browser, "flag-decomposed", "true")
    assert count(browser) == f"{decomposed} of {n}"
    choose(browser, "flag-decomposed", "")
    choose(browser, "filter-mode", "")
    split = next(r for r in records if r["mode"] == "parallel" and r["decomposed"])
    browser.find_element(By.CSS_SELECTOR, f'#list tr[data-key="synth/{split["id"]}"]').click()
    runs = browser.find_elements(By.CSS_SELECTOR, "#detail .run")
    assert [run.find_element(By.TAG_NAME, "h3").text for run in runs] == ["parallel mode", "sequential mode"]
    rounds = runs[0].find_elements(By.CSS_SELECTOR, ".round")
    assert len(rounds) == split["search_rounds"]
    first = split["timeline"]["search_rounds"][0]
    branches = rounds[0].find_elements(By.CSS_SELECTOR, ".branch .sub-query")
    assert [b.text for b in branches] == first["sub_queries"] and len(branches) > 1
    sequential = next(r for r in records if r["mode"] == "sequential" and r["id"] == split["id"])
    assert len(runs[1].find_elements(By.CSS_SELECTOR, ".round")) == sequential["search_rounds"] > len(rounds)
    browser.find_element(By.ID, "search").send_keys("no question has this text")
    assert count(browser) == f"0 of {n}"


def test_markup_in_a_passage_is_shown_as_text_and_never_runs(eval_run, browser):
    from selenium.webdriver.common.by import By

    out, rows = eval_run
    open_page(browser, out / "report.html")
    browser.find_element(By.CSS_SELECTOR, f'#list tr[data-key="synth/{rows[0]["id"]}"]').click()
    titles = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#detail .passage")]
    assert any(INJECTED in title for title in titles), titles
    assert browser.execute_script("return window.injected === undefined")
    assert browser.execute_script("return document.scripts.length") == 3  # the page's own: rows, config, code
    assert browser.execute_script("return document.querySelectorAll('#detail img').length") == 0


def rollout(step: int, cls: str, decomposed: bool, outcome: float) -> dict:
    return {
        "step": step,
        "id": f"q{step}-{cls}",
        "question": f"question of class {cls} <b>bold?</b>",
        "question_type": "comparison" if cls == "parallelisable" else "compositional",
        "question_class": cls,
        "golden_answers": ["a"],
        "answer": "a" if outcome else "b",
        "rewards": {"outcome": outcome, "decomposition": 0.2, "search_count": 0.0, "format": 0.1, "total": 1.3},
        "format_valid": True,
        "decomposed": decomposed,
        "turns": [
            {"turn": 1, "action": "search", "completion": "<search> x ## y </search>", "completion_tokens": 9},
            {"turn": 2, "action": "answer", "completion": "<answer> a </answer>", "completion_tokens": 5},
        ],
        "search_rounds": [
            {
                "sub_queries": ["x", "y"],
                "results": [
                    {"sub_query": q, "passages": [{"id": q, "title": q.upper(), "score": 1.0}], "error": None}
                    for q in ("x", "y")
                ],
            }
        ],
        "stats": {"llm_calls": 2, "search_rounds": 1, "forced_answer": False, "latency_s": 0.5},
    }


def test_training_run_page_shows_curves_and_rollouts_by_step(tmp_path, browser):
    from selenium.webdriver.common.by import By

    records = [
        rollout(s, c, c == "parallelisable", float(s)) for s in (0, 1, 2) for c in ("parallelisable", "sequential")
    ]
    (tmp_path / "trajectories-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    path = training_report(tmp_path)
    open_page(browser, path)
    assert count(browser) == "6 of 6"
    assert len(browser.find_elements(By.CSS_SELECTOR, "img")) == 1
    first = browser.find_element(By.CSS_SELECTOR, "#list tbody tr td")
    assert first.text == "2"  # the latest step first
    choose(browser, "filter-step", "1")
    assert count(browser) == "2 of 6"
    browser.find_element(By.CSS_SELECTOR, "#list tbody tr").click()
    assert [b.text for b in browser.find_elements(By.CSS_SELECTOR, "#detail .branch .sub-query")] == ["x", "y"]
    assert "<b>bold?</b>" in browser.find_element(By.CSS_SELECTOR, "#detail .question").text


def test_ps_agent_report_rebuilds_the_page_or_says_what_the_folder_lacks(eval_run, tmp_path):
    out, _ = eval_run
    (out / "report.html").unlink()
    for name in ("summary.json", "report.md"):  # rebuilt too: only the page was, so they told another run
        (out / name).write_text("stale")
    done = subprocess.run([PS_AGENT, "report", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / "report.html").stat().st_size > 10_000
    assert json.loads((out / "summary.json").read_text())["by_class"] and "stale" not in (out / "report.md").read_text()
    empty = subprocess.run([PS_AGENT, "report", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert empty.returncode == 2
    assert "neither results/*.jsonl" in empty.stderr and "trajectories*.jsonl" in empty.stderr


def test_ps_agent_report_skips_odd_result_lines_naming_them(eval_run, tmp_path):
    """Issue 27: odd lines gave a RecursionError or a KeyError, or exit 0 and a blank page on a NaN."""
    out, _ = eval_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    results = sorted((copy / "results").glob("*.jsonl"))[0]
    kept = len(read_results(copy, complete=True))  # what the report reads
    whole = {"dataset": "synth", "mode": "parallel", "question": "q", "question_class": "sequential",
             "golden_answers": [], "error": None, "em": 1.0}  # fmt: skip
    odd = ["[" * 100_000 + "]" * 100_000, '{"id": "x"}', '{"id": "y", "em": NaN}', "[1, 2]",
           json.dumps(whole | {"id": ["q"]}), json.dumps(whole | {"id": "z", "em": 1e999}),
           json.dumps(whole | {"id": "w", "rewards": [1]})]  # fmt: skip
    with results.open("a") as f:
        f.write("\n".join(odd) + "\n")
    numbered = len(results.read_text().splitlines())
    done = subprocess.run([PS_AGENT, "report", str(copy)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for line in range(numbered - 6, numbered - 2):  # the lines that are not result objects, by file and line
        assert f"{results}:{line}:" in done.stderr
    assert len(read_results(copy, complete=True)) == kept
    for path in (copy / "results").glob("*.jsonl"):  # nothing readable left: exit 2, saying so
        path.write_text("\n".join(odd) + "\n")
    empty = subprocess.run([PS_AGENT, "report", str(copy)], capture_output=True, text=True, timeout=300)
    assert empty.returncode == 2 and "holds no result line the report can read" in empty.stderr
