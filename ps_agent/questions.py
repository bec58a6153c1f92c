"""Question files in the shared jsonl form (``id, question, golden_answers, type``), validated row by row.

Shared by training (TRL rows) and evaluation; a bad row is an error that names its file and line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ps_agent.text import lone_surrogates

logger = logging.getLogger(__name__)

#: the shared benchmark data (HotpotQA, 2Wiki, MuSiQue, Bamboogle, NQ and their corpora): ``../shared/data`` beside
#: the repository, read in place (``read_split`` keeps its train part apart from the rest)
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

QuestionClass = Literal["parallelisable", "sequential", "hybrid", "single-hop"]


@dataclass(frozen=True)
class ClassRule:
    """How a question class is searched: ``split`` into parallel sub-queries in one round (or kept whole),
    in at least ``min_rounds`` rounds; ``types``: the dataset ``type`` values of the class."""

    split: bool
    min_rounds: int
    types: tuple[str, ...]


#: The question classes, the paper's central idea, in one table: each dataset ``type`` (HotpotQA, 2Wiki, MuSiQue,
#: the synthetic world) belongs to one class, and the class says how it should be searched. ``hybrid`` is our
#: addition to the paper's three classes: independent chains (2Wiki ``bridge_comparison``, the synthetic hybrids),
#: decomposed *and* searched in at least two rounds. A missing type is single-hop (NQ, Bamboogle). The rewards,
#: the gold episodes, the training mixes and the benchmarks ask this table; adding a class is one row.
CLASS_RULES: dict[QuestionClass, ClassRule] = {
    "parallelisable": ClassRule(split=True, min_rounds=1, types=("comparison",)),
    "sequential": ClassRule(
        split=False,
        min_rounds=2,
        types=("bridge", "compositional", "inference", "2hop", "3hop1", "3hop2", "4hop1", "4hop2", "4hop3"),
    ),
    "hybrid": ClassRule(split=True, min_rounds=2, types=("bridge_comparison", "hybrid")),
    "single-hop": ClassRule(split=False, min_rounds=1, types=("single", "single-hop")),
}
QUESTION_CLASSES: tuple[QuestionClass, ...] = tuple(CLASS_RULES)
#: Dataset ``type`` → question class.
TYPE_CLASSES: dict[str, QuestionClass] = {t: name for name, rule in CLASS_RULES.items() for t in rule.types}
KNOWN_TYPES = frozenset(TYPE_CLASSES)


def question_class(question_type: str | None) -> QuestionClass:
    """The class of a dataset ``type`` through ``TYPE_CLASSES``; none (or ``"none"``) is single-hop."""
    if not question_type or question_type.lower() == "none":
        return "single-hop"
    try:
        return TYPE_CLASSES[question_type]
    except KeyError:
        raise ValueError(
            f"unknown question type {question_type!r}: expected none (single-hop) or one of {sorted(TYPE_CLASSES)}"
        ) from None


def should_decompose(question_type: str | None) -> bool:
    """Whether the right behaviour splits the question (its class's ``split``: parallelisable and hybrid)."""
    return CLASS_RULES[question_class(question_type)].split


def min_rounds(question_type: str | None) -> int:
    """The fewest search rounds the question's class needs (two for chains)."""
    return CLASS_RULES[question_class(question_type)].min_rounds


def plan_rounds(plan: Sequence[Sequence[Any]], mode: str) -> list[list[Any]]:
    """A plan's search rounds as ``mode`` searches them: each round's steps at once in parallel mode, one step a
    round in sequential mode (the teacher's turns, the gold's turn budget and the synthetic oracle agree)."""
    return [list(steps) for steps in plan] if mode == "parallel" else [[step] for steps in plan for step in steps]


def rounds_needed(row: Mapping[str, Any]) -> int:
    """How many search rounds a question needs when each round searches all its independent sub-queries at
    once (parallel mode's ideal): the length of the row's plan where it has one (``optimal_rounds``, the
    synthetic worlds), else the hop count its type names (MuSiQue's ``3hop1``), else its class's ``min_rounds``
    (the chains of HotpotQA and 2Wiki are two hops). Fewer rounds is under-search, more is over-search."""
    if row.get("optimal_rounds") is not None:
        return int(row["optimal_rounds"])
    hops = re.match(r"(\d)hop", row.get("question_type") or "")
    return int(hops.group(1)) if hops else min_rounds(row.get("question_type"))


def split_share(class_fractions: Mapping[str, float]) -> float:
    """The share of a mix (class → fraction or count) whose classes should be split."""
    total = sum(class_fractions.values())
    split = sum(share for name, share in class_fractions.items() if CLASS_RULES[name].split)  # type: ignore[index]
    return split / total if total else 0.0


def class_shares(question_types: Iterable[str | None]) -> dict[QuestionClass, float]:
    """The share of each question class (all of them, 0 where absent) among these question types."""
    counts = Counter(question_class(t) for t in question_types)
    total = sum(counts.values())
    return {c: counts[c] / total if total else 0.0 for c in QUESTION_CLASSES}


def yes_no(answers: Sequence[str]) -> str | None:
    """``"yes"`` or ``"no"`` for a question answered so (its first gold answer), else None."""
    answer = answers[0].strip().lower() if answers else ""
    return answer if answer in ("yes", "no") else None


class DataError(ValueError):
    """A question row that cannot be trained on; the message names the row."""


#: the type of a benchmark's questions where its files give none: Bamboogle's are 2-hop compositions (Press et al.,
#: 2022), which Search-R1 and ParallelSearch count among the multi-hop sets, not single-hop ones like NQ's
DATASET_TYPES = {"bamboogle": "compositional"}


def to_row(
    raw: Any, where: str, known_types: frozenset[str] = KNOWN_TYPES, default_type: str | None = None
) -> dict[str, Any]:
    """Validate one question record and shape it as a TRL row (``default_type``: its type where it gives none)."""
    if not isinstance(raw, Mapping):
        raise DataError(f"{where}: expected a JSON object with question and golden_answers, got {type(raw).__name__}")
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: missing or empty 'question' (expected a non-empty string)")
    golden = raw.get("golden_answers")
    if isinstance(golden, str) and golden.strip().startswith("[") and golden.strip().endswith("]"):
        raise DataError(  # a list written out as text (a CSV or pandas export) would match no answer
            f"{where}: 'golden_answers' is a string spelling a list ({golden!r:.80}); expected a JSON list of strings"
        )
    if isinstance(golden, str):
        golden = [golden]
    if not isinstance(golden, list) or not golden or not all(isinstance(g, str) and g.strip() for g in golden):
        raise DataError(f"{where}: missing or empty 'golden_answers' (expected a non-empty list of strings)")
    question_type = raw.get("type")
    metadata = raw.get("metadata")
    if question_type is None and isinstance(metadata, Mapping):  # FlashRAG's rows keep it there
        question_type = metadata.get("type")
    if question_type in (None, "", "none"):
        question_type = default_type
    elif not isinstance(question_type, str) or question_type not in known_types:
        raise DataError(
            f"{where}: unknown question type {question_type!r}; expected none or no type (single-hop) or one of "
            f"{sorted(known_types)}"
        )
    row = {
        "question": question.strip(),
        "golden_answers": [g.strip() for g in golden],
        "question_type": question_type,
        "id": where if raw.get("id") is None else str(raw["id"]),
    }
    rounds = raw.get("optimal_rounds")
    if rounds is not None:  # the length of a synthetic question's plan
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise DataError(f"{where}: 'optimal_rounds' must be a positive integer, got {rounds!r}")
        row["optimal_rounds"] = rounds
    corpus = raw.get("corpus")
    if corpus is not None:  # the corpus this question is searched in (training mixes of several corpora)
        if not isinstance(corpus, str) or not corpus.strip():
            raise DataError(f"{where}: 'corpus' must be a corpus jsonl path, got {corpus!r}")
        row["corpus"] = corpus
    for text in (row["question"], *row["golden_answers"], row["id"]):
        if found := lone_surrogates(text):  # JSON spells them ("\ud800"): no results file or tokenizer takes one
            raise DataError(
                f"{where}: {found[0]!a} is not valid Unicode (a lone surrogate); expected text UTF-8 can encode"
            )
    return row


def content_id(row: dict[str, Any]) -> str:
    """The id of a question row that has none: a hash of its question, answers and type. It does not depend
    on how the file's path is spelled or where the line sits, and an edited question gets a new id."""
    content = json.dumps([row["question"], row["golden_answers"], row["question_type"]], ensure_ascii=False)
    return "sha1-" + hashlib.sha1(content.encode("utf-8")).hexdigest()[:16]


def read_jsonl(
    path: str | Path, known_types: frozenset[str] = KNOWN_TYPES, problems: list[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of a question jsonl file; a bad line is an error naming its file and line, or, when a
    ``problems`` list is given, is recorded there (with a warning) and skipped.

    A row without an id gets ``content_id`` (``#2``, ``#3``… on repeats of the same question)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"question file not found: {path} (expected jsonl lines of id, question, golden_answers, type)")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    repeats: Counter[str] = Counter()
    first_line: dict[str, str] = {}  # explicit id → the line that gave it
    with path.open("rb") as lines:
        for number, data in enumerate(lines, 1):
            where = f"{path}:{number}"
            try:
                try:
                    line = data.decode("utf-8-sig" if number == 1 else "utf-8")  # an editor's BOM before line 1
                except UnicodeDecodeError as exc:
                    raise DataError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
                if not line.strip():
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{where}: not JSON ({exc})") from exc
                row = to_row(raw, where, known_types, DATASET_TYPES.get(dataset_name(path)))
                if raw.get("id") is not None and first_line.setdefault(row["id"], where) != where:
                    raise DataError(  # results are kept by id: one of the two would never be reported
                        f"{where}: id {row['id']!r} is also that of {first_line[row['id']]}; expected ids unique "
                        "in a file"
                    )
                if "corpus" in row:  # relative to the question file
                    row["corpus"] = str((path.parent / row["corpus"]).resolve())
            except DataError as exc:
                if problems is None:
                    raise
                logger.warning("skipped %s", exc)
                skipped.append(str(exc))
                continue
            if raw.get("id") is None:
                key = content_id(row)
                repeats[key] += 1
                row["id"] = key if repeats[key] == 1 else f"{key}#{repeats[key]}"
            rows.append(row)
    if problems is not None:
        problems.extend(skipped)
    if not rows:
        raise DataError(
            f"no questions in {path}: all {len(skipped)} lines are bad, the first: {skipped[0]}"
            if skipped
            else f"question file is empty: {path} (expected jsonl lines of id, question, golden_answers, type)"
        )
    return rows


#: The share of every shared dev file held out for validation; the rest is the train part.
VALIDATION_FRACTION = 0.3
#: which questions of a file a run takes: all, or one part of the split (``split_part``)
PARTS = ("all", "train", "validation")


def dataset_name(path: Path) -> str:
    """The name a question file is reported under: ``../shared/data/hotpotqa/dev.jsonl`` → ``hotpotqa``;
    ``x/questions.jsonl`` → ``x``."""
    return path.parent.name if path.stem in ("dev", "test", "train", "questions") else path.stem


def split_part(question_id: str, validation_fraction: float = VALIDATION_FRACTION) -> str:
    """``"train"`` or ``"validation"`` for a question id: a stable hash, so a question never changes part
    and every tool (gold trajectories, training, benchmarks) agrees on the split."""
    bucket = int(hashlib.sha1(str(question_id).encode("utf-8")).hexdigest()[:8], 16) / 16**8
    return "validation" if bucket < validation_fraction else "train"


_REPEAT_RE = re.compile(r"(sha1-[0-9a-f]{16})#\d+")


def row_part(row: Mapping[str, Any]) -> str:
    """A question row's part of the split: its id's (``split_part``), a repeat of an id-less question (``#2``,
    ``#3``: ``read_jsonl``) in its first copy's part, so that no question is trained on and validated on."""
    repeat = _REPEAT_RE.fullmatch(str(row["id"]))
    return split_part(repeat.group(1) if repeat else row["id"])


#: which split ``row_parts`` makes, recorded in each eval folder: one filled under another is not resumed under this
#: one (``id-hash``, before shared hops were held out, validated on 3 MuSiQue questions this one holds out)
SPLIT = "id-hash, shared hops held out"
#: a MuSiQue id names the sub-questions it composes: ``3hop1__401538_132457_51423``
_HOPS_RE = re.compile(r"\d+hop\d*__(\d+(?:_\d+)+)")


def hops(question_id: str) -> frozenset[str]:
    """The sub-question (hop) ids a composed question's id names (MuSiQue's), else none."""
    match = _HOPS_RE.fullmatch(str(question_id))
    return frozenset(match.group(1).split("_")) if match else frozenset()


def row_parts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each row's part of the split (``row_part``), where a validation question that shares a hop with a train
    question (two MuSiQue questions composed over one sub-question: the train one teaches the validation one's
    bridge or answer) is ``held-out`` instead: validated on, it would score what was trained on. The train part
    stays as ``row_part`` has it."""
    parts = [row_part(row) for row in rows]
    trained = frozenset().union(*(hops(row["id"]) for row, part in zip(rows, parts, strict=True) if part == "train"))
    return [
        "held-out" if part == "validation" and hops(row["id"]) & trained else part
        for row, part in zip(rows, parts, strict=True)
    ]


def read_split(path: str | Path, part: str) -> list[dict[str, Any]]:
    """The raw records of one part (``train`` or ``validation``: ``row_parts``) of a shared jsonl file, in file
    order."""
    if part not in ("train", "validation"):
        raise ValueError(f"part must be 'train' or 'validation', got {part!r}")
    rows = read_jsonl(path)  # each line checked, and an id-less one given its content id, as evaluation reads it
    with Path(path).open(encoding="utf-8-sig") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    return [record for record, row_part_ in zip(records, row_parts(rows), strict=True) if row_part_ == part]
