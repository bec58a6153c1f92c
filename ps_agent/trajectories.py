"""Trajectory logs: one JSON line per rollout, written so a crash loses at most the line in flight."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ps_agent.episodes import STATS
from ps_agent.questions import rounds_needed
from ps_agent.rewards import COMPONENTS

logger = logging.getLogger(__name__)


class TrajectoryLog:
    """Append-only JSON lines: each record is one ``write`` of a whole line, then flushed to disk,
    so a crash loses at most the rollout in flight."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line, whole or not at all: a write that fails part-way (a full disk) is cut
        back to where it began, and the ``OSError`` raised. A record holding a NaN or an infinity is refused
        (``ValueError``): JSON has no such numbers, and the line would be skipped when read back."""
        try:
            line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode()
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc} in a record ({str(record)[:200]}): expected finite numbers") from None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                if os.write(fd, line) != len(line):
                    raise OSError(errno.ENOSPC, f"only part of a line could be written to {self.path}")
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _holds(record: dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        if not isinstance(record, dict) or part not in record:
            return False
        record = record[part]
    return True


def read_records(paths: Iterable[Path], required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The JSON objects of ``paths``' lines in order. A line that is not one (torn by a crash mid-write, nested
    past Python's limit, holding NaN, or lacking a ``required`` key: ``rewards.total`` is a key of its ``rewards``)
    is skipped with a warning naming its file and line."""
    records = []
    for path in paths:
        for number, line in enumerate(path.read_bytes().splitlines(), 1):  # a torn character spoils its line only
            try:
                record = json.loads(line, parse_constant=_no_constant)
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                logger.warning("skipping %s:%d: not a JSON object line (%s)", path, number, str(exc)[:80])
                continue
            if not (isinstance(record, dict) and all(_holds(record, key) for key in required)):
                logger.warning("skipping %s:%d: expected a JSON object with %s", path, number, ", ".join(required))
                continue
            records.append(record)
    return records


def forget_steps_from(run_dir: str | Path, step: int) -> int:
    """Drop the logged rollouts of ``step`` and later, which a run resumed from ``step``'s checkpoint redoes
    (and torn lines); each log is rewritten whole. Returns how many rollouts were dropped."""
    dropped = 0
    for path in sorted(Path(run_dir).glob("trajectories*.jsonl")):
        records = read_records([path])
        kept = [r for r in records if r["step"] < step]
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
        os.replace(partial, path)
        dropped += len(records) - len(kept)
    return dropped


def keep_previous_logs(run_dir: str | Path) -> Path | None:
    """Before a fresh (not resumed) run: move an earlier run's logs into ``previous-N/``, so this run's log
    holds its own rollouts once, and nothing is lost. Returns that folder, or None when there were none."""
    logs = sorted(Path(run_dir).glob("trajectories*.jsonl"))
    if not logs:
        return None
    earlier = [
        int(m.group(1)) for d in Path(run_dir).glob("previous-*") if (m := re.fullmatch(r"previous-(\d+)", d.name))
    ]
    number = 1 + max(earlier, default=0)  # past the highest: one deleted by hand leaves a gap, not a clash
    kept = Path(run_dir) / f"previous-{number}"
    kept.mkdir()
    for path in logs:
        os.replace(path, kept / path.name)
    return kept


#: what every logged rollout has, in each shape it was ever logged in (a line without them is skipped, named)
ROLLOUT_KEYS = ("step", "question_class", *(f"rewards.{k}" for k in (*COMPONENTS, "total")))


def read_trajectories(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every logged rollout of a run (all processes), as ``episodes.episode_record`` shapes it."""
    paths = sorted(Path(run_dir).glob("trajectories*.jsonl"))
    return [_current(r) for r in read_records(paths, required=ROLLOUT_KEYS)]


def _current(record: dict[str, Any]) -> dict[str, Any]:
    """A line logged before rollouts kept an eval's record (the agent's ``stats`` nested, the timeline's ``turns``
    and ``search_rounds`` at the top), or before records said how many rounds their question needs, in today's
    shape; other lines as they are."""
    line = dict(record)
    if "question_class" in line and "rounds_needed" not in line:  # an episode; a synthetic plan's length is lost
        line["rounds_needed"] = rounds_needed({"question_type": line.get("question_type")})
    if "stats" not in line or "timeline" in line:
        return line
    stats = line.pop("stats")
    line["timeline"] = {"turns": line.pop("turns", []), "search_rounds": line.pop("search_rounds", [])}
    return line | {k: stats[k] for k in STATS if k in stats}
