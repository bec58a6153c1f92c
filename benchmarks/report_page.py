"""How large and how fast is ``report.html`` for the shared eval (3,260 questions × 2 modes)?

    python benchmarks/report_page.py [--pool EVAL_DIR] [--pool-questions 6]

Timelines come from a real eval (``--pool``: an eval output folder; default: the embedded model on
``--pool-questions`` HotpotQA dev questions in both modes, half comparisons and half bridges, run here). Each
of the 3,260 questions of ``../shared/data/*/dev.jsonl`` × 2 modes gets its own id, question, answers and class,
and the timeline of a pool record of its mode (cycled), so the page has the shared eval's size with real model
text, sub-queries and passages. Measured in Debian's headless Chromium (Selenium): file size, time to load
the page and draw the first page of the list (the navigation's ``loadEventEnd``), to filter, and to draw a
trajectory; median of 3 loads.
Results: ``benchmarks/results/report_page.{json,md}``, and ``figures/report_page.png``: a screenshot of the pool's own
report (real questions with their own trajectories).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from benchmarks.common import RESULTS, figure  # noqa: E402
from ps_agent.eval import EvalSettings, dataset_name, evaluate  # noqa: E402
from ps_agent.eval_report import html_report, read_results  # noqa: E402
from ps_agent.questions import SHARED_DATA, question_class, read_jsonl  # noqa: E402
from ps_agent.trajectories import TrajectoryLog  # noqa: E402

# ms from navigation start to the end of the load event (the page's script has drawn the list by then), once known
LOADED = "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd > 0 ? n.loadEventEnd : null"


def pool_records(pool: Path | None, questions: int, work: Path) -> tuple[list[dict], Path]:
    """Real eval records with timelines, and their folder: ``pool`` (copied), or a fresh eval of HotpotQA dev
    questions, half comparisons and half bridges, by the embedded model."""
    folder = work / "pool"
    if pool is not None:
        shutil.copytree(pool / "results", folder / "results")
    else:
        rows = [json.loads(line) for line in (SHARED_DATA / "hotpotqa" / "dev.jsonl").read_text().splitlines()]
        chosen = [r for r in rows if r["type"] == "comparison"][: questions // 2]
        chosen += [r for r in rows if r["type"] == "bridge"][: questions - len(chosen)]
        data = work / "questions" / "hotpotqa" / "dev.jsonl"
        data.parent.mkdir(parents=True)
        data.write_text("".join(json.dumps(r) + "\n" for r in chosen))
        retriever = str(SHARED_DATA / "hotpotqa" / "corpus.jsonl")
        evaluate([data], folder, EvalSettings(llm="smollm2", retriever=retriever))
    records = [r for r in read_results(folder) if r["error"] is None and r.get("timeline")]
    if not records:
        raise SystemExit(f"no result lines with timelines in {pool}/results (expected a `ps-agent eval` folder)")
    return records, folder


def shared_eval(pool: list[dict], out: Path) -> int:
    """Write ``out/results`` for every shared dev question × mode, timelines cycled from ``pool``."""
    count = 0
    for path in sorted(SHARED_DATA.glob("*/dev.jsonl")):
        dataset = dataset_name(path)
        for mode in ("parallel", "sequential"):
            of_mode = [r for r in pool if r["mode"] == mode]
            log = TrajectoryLog(out / "results" / f"{dataset}.{mode}.jsonl")
            for i, row in enumerate(read_jsonl(path)):
                source = of_mode[i % len(of_mode)]
                log.append(
                    source
                    | {
                        "id": row["id"],
                        "dataset": dataset,
                        "question": row["question"],
                        "question_type": row["question_type"],
                        "question_class": question_class(row["question_type"]),
                        "golden_answers": row["golden_answers"],
                    }
                )
                count += 1
    return count


def chromium() -> webdriver.Chrome:
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1700"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def measure(page: Path) -> dict:
    """Load, filter and trajectory times (ms, median of 3 fresh loads)."""
    browser = chromium()
    loads, filters, trajectories = [], [], []
    try:
        for _ in range(3):
            browser.get(page.resolve().as_uri())
            loads.append(WebDriverWait(browser, 60).until(lambda b: b.execute_script(LOADED)))
            filters.append(
                browser.execute_script(
                    "const s = document.getElementById('filter-mode'); s.value = 'parallel';"
                    "const t = performance.now(); s.dispatchEvent(new Event('change')); return performance.now() - t"
                )
            )
            row = browser.find_element(By.CSS_SELECTOR, "#list tbody tr")
            start = browser.execute_script("return performance.now()")
            row.click()
            trajectories.append(browser.execute_script("return performance.now()") - start)
    finally:
        browser.quit()
    return {
        "load_ms": statistics.median(loads),
        "filter_ms": statistics.median(filters),
        "trajectory_ms": statistics.median(trajectories),
        "loads_ms": loads,
    }


def screenshot(page: Path, path: Path) -> None:
    """The page of the real pool eval with a decomposed parallel-mode question drawn beside its sequential run."""
    browser = chromium()
    try:
        browser.get(page.resolve().as_uri())
        row = browser.find_element(By.CSS_SELECTOR, "#list tbody tr")
        for candidate in browser.find_elements(By.CSS_SELECTOR, "#list tbody tr"):
            cells = [td.text for td in candidate.find_elements(By.TAG_NAME, "td")]
            if cells[1] == "parallel" and cells[6] == "✓":  # mode, decomposed
                row = candidate
                break
        row.click()
        browser.execute_script("document.getElementById('detail-title').scrollIntoView()")
        browser.save_screenshot(str(path))
    finally:
        browser.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=Path, help="an eval output folder whose timelines to reuse")
    parser.add_argument("--pool-questions", type=int, default=6)
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pool, pool_dir = pool_records(args.pool, args.pool_questions, work)
        screenshot(html_report(pool_dir), figure(RESULTS / "report_page"))
        questions = shared_eval(pool, work / "shared")
        built = time.time()
        page = html_report(work / "shared")
        build_s = time.time() - built
        timings = measure(page)
        result = {
            "command": "python " + " ".join(sys.argv),
            "machine": f"{platform.machine()}, {platform.platform()}, CPython {platform.python_version()}",
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "records": questions,
            "pool_records": len(pool),
            "size_mb": page.stat().st_size / 1e6,
            "build_s": build_s,
            **timings,
            "wall_s": time.time() - started,
        }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "report_page.json").write_text(json.dumps(result, indent=2) + "\n")
    verdict = "pass" if result["load_ms"] < 2000 and result["size_mb"] < 20 else "miss"
    (RESULTS / "report_page.md").write_text(
        "# report.html for the shared eval\n\n"
        f"`{result['command']}` on {result['machine']}, {result['date']}.\n\n"
        f"{questions} result lines (3,260 shared dev questions × 2 modes), timelines cycled from "
        f"{len(pool)} real eval records; headless Chromium (Selenium), median of 3 loads.\n\n"
        "| size (MB) | build (s) | load + first page (ms) | filter (ms) | draw a trajectory (ms) | target | result |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {result['size_mb']:.1f} | {build_s:.1f} | {result['load_ms']:.0f} | {result['filter_ms']:.0f} | "
        f"{result['trajectory_ms']:.0f} | < 20 MB, < 2 s | {verdict} |\n\n"
        f"![the report page of the {len(pool)} real eval records](figures/report_page.png)\n"
    )
    print((RESULTS / "report_page.md").read_text())


if __name__ == "__main__":
    main()
