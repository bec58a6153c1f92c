"""Evaluation: run the agent over question files, append one result line per question, report.

Results go to ``OUT/results/{dataset}.{mode}.jsonl``; a rerun skips the ids already answered there (an id
whose latest line is an error runs again), so an interrupted or failed run resumes. ``report`` aggregates
each question's latest line per dataset, per question class (parallelisable / sequential / hybrid /
single-hop, from ``type`` through ``questions.CLASS_RULES``) and per mode (``eval_report.py``); ``provenance.py``
records what the answers came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import Progress

from ps_agent.agent import ParallelSearchAgent
from ps_agent.configuration import AgentConfig
from ps_agent.context import Context
from ps_agent.episodes import episode_record, error_record
from ps_agent.eval_report import report
from ps_agent.llms import EMBEDDED_MODEL
from ps_agent.policy_protocols import PROTOCOLS
from ps_agent.provenance import check_same_model, check_same_settings, provenance, recorded_run, writing_to
from ps_agent.questions import PARTS, dataset_name, read_jsonl, row_parts
from ps_agent.retrieval import CorpusError, resolve_retriever
from ps_agent.runner import run_sync
from ps_agent.trajectories import TrajectoryLog, read_records

logger = logging.getLogger(__name__)

MODES = ("parallel", "sequential")


@dataclass
class EvalSettings:
    """One evaluation: which model and corpus, which modes, how many questions at once."""

    llm: Any = EMBEDDED_MODEL
    retriever: Any = None
    modes: Sequence[str] = ("parallel", "sequential")
    concurrency: int = 4
    limit: int | None = None
    strict: bool = False
    agent: dict[str, Any] = field(default_factory=dict)  # other AgentConfig fields: max_turns, topk, …
    # which questions of each file: all, or one part of the shared files' split (``questions.row_parts``)
    part: str = "all"
    # the weight files behind an LLM object (a served model: its base and adapter), checksummed like the files an
    # LLM spec names, so a rerun into a folder answered by other weights is refused
    weights: Sequence[str | Path] = ()

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse settings that would hang or misbehave, before any question runs."""
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(
                f"concurrency must be an integer of at least 1 (questions at once), got {self.concurrency!r}"
            )
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(
                f"limit must be an integer of at least 1 (questions per file) or None (all), got {self.limit!r}"
            )
        if isinstance(self.modes, str) or not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must be a non-empty list of {' and '.join(MODES)}, got {self.modes!r}")
        if self.part not in PARTS:
            raise ValueError(f"part must be one of {', '.join(PARTS)}, got {self.part!r}")
        try:  # the agent's settings, before the output folder is written or the model loaded
            AgentConfig(**self.agent)
        except TypeError as exc:
            raise ValueError(f"agent settings: {exc}") from None
        if isinstance(self.weights, (str, Path)):
            raise ValueError(f"weights must be a list of weight files, got one path: {self.weights!r}")
        missing = [str(path) for path in self.weights if not Path(path).is_file()]
        if missing:
            raise ValueError(f"weights must name the model's weight files on this machine: no such file {missing}")


class WriteFailed(OSError):
    """A result line could not be written: the run stops, keeping every line written before."""


class EvalFailed(ValueError):
    """Every question a run tried failed: most likely the LLM or the retriever is misnamed or unreachable."""


def check_retriever(spec: Any) -> None:
    """Load a corpus, index or server spec before any question runs, so a typo in a path is one clear error
    instead of a failure per question (the load is cached: the agent reuses it)."""
    try:
        resolve_retriever(spec)
    except OSError as exc:
        raise CorpusError(f"cannot read corpus {spec}: {exc} (expected a readable corpus jsonl file)") from exc


def check_llm(llm: Any, mode: str, protocol: str) -> None:
    """Load the model an LLM spec names before any question runs, so a misnamed one is one clear error instead of
    a failure per question (the load is cached: the agent reuses it)."""
    PROTOCOLS[protocol].load(Context(llm=llm, mode=mode, protocol=protocol))


class SearchesFailed(RuntimeError):
    """Every search of a question failed: its answer was given without retrieval, and measures nothing."""


def check_searched(out: dict[str, Any]) -> None:
    """Raise ``SearchesFailed`` for a run in which every search failed (a retrieval server down or unreachable):
    the agent answers on, but an evaluation counts the question as an error, which a rerun retries."""
    failed = [x["error"] for r in out["trajectory"]["search_rounds"] for x in r["results"] if x["error"] is not None]
    if failed and len(failed) == out["stats"]["sub_queries"]:
        raise SearchesFailed(f"every search of the question failed ({len(failed)}), the first with {failed[0]}")


def corpus_for(path: Path, retriever: Any) -> Any:
    """``"auto"``: the ``corpus.jsonl`` beside a question file, else the embedded corpus."""
    if retriever != "auto":
        return retriever
    sibling = path.parent / "corpus.jsonl"
    return str(sibling) if sibling.is_file() else None


def eval_record(row: dict[str, Any], dataset: str, mode: str, record: dict[str, Any]) -> dict[str, Any]:
    """A result line: the episode's record (``episodes.episode_record`` or ``error_record``) under its dataset and
    mode."""
    return {"id": row["id"], "dataset": dataset, "mode": mode} | record


def finished_ids(path: Path) -> set[str]:
    """Ids whose latest line in a results file ran without error; an errored question (an outage, a path
    since fixed) and a torn last line run again."""
    latest = (
        {record["id"]: record for record in read_records([path], required=("id", "error"))} if path.is_file() else {}
    )
    return {question_id for question_id, record in latest.items() if record["error"] is None}


def _left(out_dir: Path, path: Path, rows: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """A file's questions not yet answered in ``mode`` in ``out_dir``."""
    done = finished_ids(out_dir / "results" / f"{dataset_name(path)}.{mode}.jsonl")
    return [row for row in rows if row["id"] not in done]


def end_torn_line(path: Path) -> None:
    """A crash mid-write leaves a last line without its newline: end it, so the next appended line is whole
    (the fragment stays, skipped when read, so nothing written is lost)."""
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb+") as file:
            file.seek(-1, os.SEEK_END)
            if file.read(1) != b"\n":
                file.write(b"\n")


async def _evaluate_file(
    path: Path,
    rows: list[dict[str, Any]],
    left: dict[str, list[dict[str, Any]]],
    settings: EvalSettings,
    out_dir: Path,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Run a file's questions not yet answered (``left``, by mode), in every mode; the records this run wrote."""
    dataset = dataset_name(path)
    written = []
    for mode in settings.modes:
        results = out_dir / "results" / f"{dataset}.{mode}.jsonl"
        todo = left[mode]
        task = progress.add_task(f"{dataset} · {mode}", total=len(rows), completed=len(rows) - len(todo))
        agent = ParallelSearchAgent(
            llm=settings.llm, retriever=corpus_for(path, settings.retriever), mode=mode, **settings.agent
        )
        end_torn_line(results)
        log = TrajectoryLog(results)
        gate = asyncio.Semaphore(settings.concurrency)
        jobs = [asyncio.ensure_future(_evaluate_one(agent, row, dataset, mode, gate, log)) for row in todo]
        try:
            for finished in asyncio.as_completed(jobs):
                written.append(await finished)
                progress.advance(task)
        except BaseException:  # a write failed (or the run was interrupted): no question goes on writing
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
    return written


async def _evaluate_one(
    agent: ParallelSearchAgent,
    row: dict[str, Any],
    dataset: str,
    mode: str,
    gate: asyncio.Semaphore,
    log: TrajectoryLog,
) -> dict[str, Any]:
    """Run one question and append its result line; a failure is recorded with its reason and the run goes on."""
    async with gate:
        started = time.time()
        try:
            out = await agent.ainvoke({"question": row["question"]})
            check_searched(out)
            record = eval_record(row, dataset, mode, episode_record(row, out))
        except Exception as exc:  # the model or the retriever failed: the question is an error line
            logger.warning("%s %s failed: %s", dataset, row["id"], exc)
            record = eval_record(row, dataset, mode, error_record(row, exc, time.time() - started))
        try:
            try:
                log.append(record)
            except ValueError as exc:  # not encodable (an answer with a lone surrogate): nothing was written
                record = eval_record(row, dataset, mode, error_record(row, exc, time.time() - started))
                log.append(record)
        except OSError as exc:  # the results file cannot be written (a full disk): nothing more can be kept
            raise WriteFailed(f"cannot write {log.path}: {exc.strerror or exc}") from exc
        return record


def _part(rows: list[dict[str, Any]], settings: EvalSettings) -> list[dict[str, Any]]:
    """The rows of ``settings.part`` (every row for ``all``), the first ``settings.limit`` of them."""
    if settings.part == "all":
        return rows[: settings.limit]
    return [row for row, part in zip(rows, row_parts(rows), strict=True) if part == settings.part][: settings.limit]


def evaluate(data: Sequence[str | Path], out_dir: str | Path, settings: EvalSettings) -> dict[str, Any]:
    """Run every question file in every mode (resumable), then write and return the report.

    Settings, question files and corpora are checked before any question runs. Raises ``EvalFailed``
    (after writing the report) when every question this run tried failed."""
    settings.check()
    out_dir = Path(out_dir)
    problems: list[str] = []
    files = [(Path(p), _part(read_jsonl(p, problems=None if settings.strict else problems), settings)) for p in data]
    for path, rows in files:
        if not rows:
            where = "" if settings.part == "all" else f" in the {settings.part} part"
            raise ValueError(
                f"{path} holds no question{where} to run: expected a question file with some"
                + (" (or --part all)" if where else "")
            )
    named: dict[str, Path] = {}
    for path, _ in files:
        other = named.setdefault(dataset_name(path), path.resolve())
        if other != path.resolve():  # one results file: the second's ids would be taken as the first's answered
            raise ValueError(
                f"{other} and {path} would both be reported as dataset {dataset_name(path)!r}: expected data files "
                "of distinct names (a dev/test/train/questions file takes its folder's name)"
            )
        check_retriever(corpus_for(path, settings.retriever))
    written: list[dict[str, Any]] = []

    async def run_all() -> None:
        # no stdout/stderr redirection: under Jupyter, a model's loading bar (tqdm, in a worker thread) written
        # through rich's redirect deadlocked the kernel
        with Progress(redirect_stdout=False, redirect_stderr=False) as progress:
            for path, rows in files:
                left = {mode: todo[path, mode] for mode in settings.modes}
                written.extend(await _evaluate_file(path, rows, left, settings, out_dir, progress))

    run = provenance(settings, [path for path, _ in files])
    with writing_to(out_dir):
        earlier = recorded_run(out_dir)
        check_same_model(out_dir, run["settings"]["llm"], run["model_sha1"], earlier)
        check_same_settings(out_dir, run, earlier)
        # each results file read once, under the folder's lock: what is left to run in each mode
        todo = {(path, mode): _left(out_dir, path, rows, mode) for path, rows in files for mode in settings.modes}
        for mode in settings.modes:
            if any(todo[path, mode] for path, _ in files):  # a finished rerun loads no model
                check_llm(settings.llm, mode, settings.agent.get("protocol", "tags"))
        TrajectoryLog(out_dir / "runs.jsonl").append(run)
        try:
            run_sync(run_all())  # also from Jupyter, whose event loop is already running
        except WriteFailed as exc:
            kept = len(read_records(sorted((out_dir / "results").glob("*.jsonl"))))
            with contextlib.suppress(OSError, ValueError):  # the report too may not fit: the answers are kept
                report(out_dir, problems)
            raise EvalFailed(
                f"{exc}; the {kept} result lines written so far are whole and kept (the report of them, if it fit, "
                f"is in {out_dir / 'report.md'}): free some space and run the same command again, it resumes"
            ) from exc
        summary = report(out_dir, problems)
    failed = [r for r in written if r["error"] is not None]
    if written and len(failed) == len(written):
        raise EvalFailed(
            f"all {len(written)} questions run failed, the first with {failed[0]['error']}; expected a reachable "
            f"LLM and retriever (each error is in {out_dir / 'results'}, the report in {out_dir / 'report.md'})"
        )
    return summary
