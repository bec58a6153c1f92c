"""Gold questions and their plans: the search rounds a teacher plays through the agent graph (``training/gold.py``).

Plans come from the synthetic worlds (every family, the plan written by the world) and from the train parts of the
shared HotpotQA, 2Wiki and MuSiQue files (derived from ``supporting_titles``: one round of the compared entities, a
chain's hops in order). Each step of a shared question carries its ``finding``, what its gold passage says for it
(``add_findings``, read with ``training.reading``); every question left without a plan is counted by reason.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ps_agent.questions import SHARED_DATA, question_class, read_split
from ps_agent.synthetic import TRAIN_SEEDS, generate
from training.reading import (
    asked_date,
    asked_direction,
    mentioned,
    normalised,
    passage_body,
    plain_title,
    quote,
    quote_for,
)

logger = logging.getLogger(__name__)


SHARED_SETS = ("hotpotqa", "2wikimultihopqa", "musique")


@dataclass
class GoldQuestion:
    """A question and its gold plan: search rounds of steps ``{"sub_question", "passage_id", "finding"}``
    (``finding``: what the step's passage says, when known). Steps carry more as the pipeline reads them:
    ``value_read``, ``asked_sentence`` and ``asked_finding`` (``add_findings``, real questions), ``check``
    (``turns.check_chains``), and ``entity``, ``value``, ``value_there``, ``superlative``, ``place``
    (``ps_agent.synthetic``'s plans; ``value`` is a ranked entity's number with its unit, or a yes/no attribute)."""

    id: str
    question: str
    golden_answers: list[str]
    type: str | None
    plan: list[list[dict[str, Any]]]
    source: str
    corpus: str

    @property
    def question_class(self) -> str:
        return question_class(self.type)


@dataclass
class GoldSet:
    """Questions with plans, and the questions left out, counted by reason."""

    questions: list[GoldQuestion] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)


#: The synthetic train worlds' sizes (``gold_questions``): a world's corpus is rebuilt from its seed and these.
WORLD_ENTITIES, WORLD_PER_FAMILY = 400, 6


def restore_corpora(rows: Sequence[dict[str, Any]]) -> None:
    """Check that every ``corpus`` the question rows name exists, before any model loads.

    A missing synthetic world (``.../synth-SEED/corpus.jsonl``, written by ``gold_questions`` and not committed) is
    generated again from its seed, and each row's question must be one of its questions; any other missing corpus
    is refused with the rows that name it."""
    by_corpus: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("corpus"):
            by_corpus.setdefault(str(row["corpus"]), []).append(row)
    for corpus, named in by_corpus.items():
        path = Path(corpus)
        if path.is_file():
            continue
        world = re.fullmatch(r"synth-(\d+)(-ranked)?(-categories)?", path.parent.name)
        if path.name != "corpus.jsonl" or world is None:
            raise FileNotFoundError(
                f"{len(named)} question row(s) (first: {named[0].get('id')!r}) name the corpus {corpus}, which is "
                "missing: expected a jsonl file of {'id', 'contents'} lines (rebuild it, or fix the rows' 'corpus')"
            )
        seed = int(world.group(1))
        ranked, categories = bool(world.group(2)), bool(world.group(3))
        _, questions_path = generate(seed, WORLD_ENTITIES, path.parent, WORLD_PER_FAMILY, ranked, categories)
        known = {json.loads(line)["question"] for line in questions_path.read_text().splitlines()}
        strangers = [row.get("id") for row in named if row["question"] not in known]
        if strangers:
            raise ValueError(
                f"rebuilt the synthetic world of seed {seed} ({WORLD_ENTITIES} entities) at {path.parent}, but "
                f"{len(strangers)} of the rows naming it are not its questions (first: {strangers[0]!r}): "
                "their world was generated with other sizes"
            )
        logger.info("rebuilt the synthetic world of seed %d at %s (it is generated, not committed)", seed, path.parent)


def synthetic_questions(
    seeds: Sequence[int], entities: int, per_family: int, out: Path, ranked: bool = False, categories: bool = False
) -> GoldSet:
    """Every family of the synthetic worlds of ``seeds`` (written under ``out``; ``ranked``: worlds with the ranked
    mountains and lakes, in ``synth-SEED-ranked``; ``categories``: with the category comparisons, ``…-categories``)."""
    gold = GoldSet()
    for seed in seeds:
        folder = out / f"synth-{seed}{'-ranked' if ranked else ''}{'-categories' if categories else ''}"
        corpus, path = generate(seed, entities, folder, per_family=per_family, ranked=ranked, categories=categories)
        for q in map(json.loads, path.read_text().splitlines()):
            gold.questions.append(
                GoldQuestion(
                    q["id"], q["question"], q["golden_answers"], q["type"], q["plan"], "synthetic", str(corpus)
                )
            )
    return gold


def _first_hop(titles: list[str], question: str, passages: dict[str, str], ids: list[str]) -> str | None:
    """The title a two-hop chain starts from: the one the question names, or else the one whose passage
    names the other (the bridge entity); None when neither rule decides."""
    named = [t for t in titles if mentioned(t, question)]
    if len(named) == 1:
        return named[0]
    (a, b), (ia, ib) = titles, ids
    a_names_b, b_names_a = mentioned(b, passages.get(ia, "")), mentioned(a, passages.get(ib, ""))
    if a_names_b != b_names_a:
        return a if a_names_b else b
    return None


def plan_from_titles(record: dict[str, Any], passages: dict[str, str] | None = None) -> list[list[dict]] | str:
    """A plan from a shared record's ``supporting_titles``, or the reason there is none.

    comparison: one round searching both entities; bridge / compositional / inference: the entity the
    question names (or whose passage names the other), then the other; bridge_comparison: both named
    entities, then the two others; MuSiQue's nhop: its titles in hop order, one per round.
    ``passages``: corpus text by id, to order a chain whose question names neither or both titles, and to fill each
    step's ``finding`` with what its passage says (``add_findings``).
    """
    titles, ids = record.get("supporting_titles") or [], record.get("supporting_doc_ids") or []
    if not titles or len(titles) != len(ids):
        return "no supporting titles"
    if len(set(titles)) != len(titles):
        return "repeated supporting title"
    steps = {t: {"sub_question": t, "passage_id": i, "finding": None} for t, i in zip(titles, ids, strict=True)}
    plan = _ordered_plan(record, steps, passages or {})
    if isinstance(plan, list) and passages:
        if not _read_before(plan, record["question"], passages):
            return "a round's entity is named neither in the question nor in what was read before it"
        add_findings(plan, record, passages)
    return plan


def _read_before(plan: list[list[dict]], question: str, passages: dict[str, str]) -> bool:
    """Each round's entities are named in the question or in a passage of the round before: a chain the teacher
    searches by a name it never read teaches the policy to make its bridge entities up. Each is searched by what was
    read: a title's Wikipedia qualifier (``Malcolm St. Clair (filmmaker)``) only where the question or those
    passages say it, else the bare name (the policy cannot know the qualifier)."""
    read = ""
    for r, steps in enumerate(plan):
        if r:
            before = plan[r - 1]
            read = " ".join(passage_body(passages[s["passage_id"]]) for s in before if s["passage_id"] in passages)
        for step in steps:
            name = plain_title(step["sub_question"])
            if not (mentioned(name, read) or mentioned(name, question)):
                return False
            qualifiers = re.findall(r"\((.*?)\)", step["sub_question"])
            if any(not (mentioned(q, read) or mentioned(q, question)) for q in qualifiers):
                step["sub_question"] = name
    return True


def _ordered_plan(record: dict[str, Any], steps: dict[str, dict], passages: dict[str, str]) -> list[list[dict]] | str:
    titles, ids = record["supporting_titles"], record["supporting_doc_ids"]
    qtype, question = record.get("type"), record["question"]
    named = [t for t in titles if mentioned(t, question)]
    others = [t for t in titles if t not in named]
    kind = question_class(qtype) if qtype else None
    if qtype and qtype[0].isdigit() and qtype[1:4] == "hop":  # MuSiQue lists a chain's titles in hop order
        return [[steps[t]] for t in titles]
    if kind == "parallelisable":
        return [[steps[t] for t in titles]] if len(titles) == 2 else f"{qtype} without two supporting titles"
    if kind == "sequential":
        if len(titles) != 2:
            return f"{qtype} without two supporting titles"
        first = _first_hop(titles, question, passages, ids)
        if first is None:
            return "hop order not derivable (from the question or the passages)"
        return [[steps[first]], [steps[next(t for t in titles if t != first)]]]
    if kind == "hybrid":
        if len(titles) != 4 or len(named) != 2:
            return f"{qtype} without two named and two bridged titles"
        return [[steps[t] for t in named], [steps[t] for t in others]]
    return f"no plan for type {qtype!r}"


def _answer_in(record: dict[str, Any], passages: dict[str, str], steps: Sequence[dict[str, Any]]) -> bool:
    """Some gold answer is written in one of ``steps``' passages (yes/no answers always pass)."""
    answers = [normalised(a) for a in record["golden_answers"]]
    if any(a in ("yes", "no") for a in answers):
        return True
    text = " ".join(f" {normalised(passages[s['passage_id']])} " for s in steps)
    return any(a and f" {a} " in text for a in answers)


def passages_by_id(path: Path) -> dict[str, str]:
    """A corpus file's ``contents`` by id, refused when an id is on two lines: gold episodes find their evidence
    by id, and a second passage under a gold id (a decoy without the fact) would be read in its place."""
    passages: dict[str, str] = {}
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
                pid, contents = str(row["id"]), row["contents"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a corpus line ({exc}): expected {{'id', 'contents'}}") from exc
            if pid in passages:
                raise ValueError(
                    f"{path}:{number}: id {pid!r} is already on line {first_line[pid]}: expected one passage per id "
                    "(gold episodes find their evidence by id)"
                )
            passages[pid], first_line[pid] = contents, number
    return passages


def shared_questions(name: str, part: str = "train", root: Path = SHARED_DATA) -> GoldSet:
    """The ``part`` of a shared dev file, with plans derived from supporting titles."""
    gold = GoldSet()
    folder = root / name
    if not (folder / "dev.jsonl").is_file() or not (folder / "corpus.jsonl").is_file():
        gold.skipped[f"{name}: no dev.jsonl and corpus.jsonl in {folder}"] += 1
        return gold
    passages = passages_by_id(folder / "corpus.jsonl")
    for record in read_split(folder / "dev.jsonl", part):
        if any(i not in passages for i in record.get("supporting_doc_ids") or []):
            gold.skipped[f"{name}: a gold passage is missing from its corpus"] += 1
            continue
        plan = plan_from_titles(record, passages)
        if isinstance(plan, list) and len(plan) > 1:
            # a bridge-comparison answers with one of the compared entities (its first round), a chain with its last hop
            hybrid = question_class(record["type"]) == "hybrid"
            if not _answer_in(record, passages, plan[0] if hybrid else plan[-1]):
                plan = (
                    "the answer is not in the compared entities' passages"
                    if hybrid
                    else "the answer is not in the last hop's passages (hop order doubtful)"
                )
        if isinstance(plan, str):
            gold.skipped[f"{name}: {plan}"] += 1
            continue
        gold.questions.append(
            GoldQuestion(
                record["id"], record["question"], _as_written(record["golden_answers"], plan, passages),
                record["type"], plan, name, str(folder / "corpus.jsonl"),
            )
        )  # fmt: skip
    return gold


def _as_written(answers: list[str], plan: list[list[dict]], passages: dict[str, str]) -> list[str]:
    """The gold answers, the first as the plan's passages spell it where only its case differs: the teacher copies
    what it read (2Wiki writes its answers title-cased: "Boyd Merriman, 1St Baron Merriman")."""
    first = answers[0] if answers else ""
    text = " ".join(passages[s["passage_id"]] for r in plan for s in r if s["passage_id"] in passages)
    if not first or first.lower() in ("yes", "no") or first in text:
        return answers
    found = re.search(rf"(?<!\w){re.escape(first)}(?!\w)", text, re.IGNORECASE)
    return [found.group(0), *answers] if found else answers


def gold_questions(
    seeds: Sequence[int] = TRAIN_SEEDS, entities: int = WORLD_ENTITIES, per_family: int = WORLD_PER_FAMILY,
    shared: Sequence[str] = SHARED_SETS,
    work_dir: Path = Path("runs/gold"), ranked: bool = False, categories: bool = False,
) -> GoldSet:  # fmt: skip
    """The training questions: synthetic worlds of ``seeds`` (``ranked``: with ranked mountains and lakes;
    ``categories``: with the category comparisons) and the train parts of the ``shared`` sets."""
    gold = synthetic_questions(seeds, entities, per_family, work_dir, ranked, categories)
    for name in shared:
        part = shared_questions(name)
        gold.questions += part.questions
        gold.skipped += part.skipped
    return gold


def add_findings(plan: list[list[dict]], record: dict[str, Any], passages: dict[str, str]) -> None:
    """Fill each step's ``finding`` from its gold passage, so the teacher's think turns quote what was read:
    a hop → the sentence naming the next round's entity (the bridge); compared entities → the passage's first
    date when the question is about time (``value_read``), else its first sentence and the one that shares most
    of the question's words (``quote_for``); a last single hop → the sentence naming the answer, and where that hop
    searched the answer itself, what its passage says that the question asks for (``asked_finding``, for
    ``check_chains``)."""
    answer = (record.get("golden_answers") or [None])[0]
    # dates are what a comparison reads only when it asks which came first or last ("Which band released the most
    # albums?" is not about time, though it says "released"; "Which battle lasted longer?" is about durations)
    about_time = asked_direction(record["question"], True) is not None
    for r, steps in enumerate(plan):
        following = [plain_title(s["sub_question"]) for s in plan[r + 1]] if r + 1 < len(plan) else []
        for step in steps:
            contents = passages.get(step["passage_id"])
            if contents is None:
                continue
            if following:
                named = [name for name in following if mentioned(name, passage_body(contents))]
                step["finding"] = quote(contents, named[0] if named else None)
            elif len(steps) > 1:
                date = asked_date(contents, record["question"]) if about_time else None
                step["finding"] = date or quote_for(contents, record["question"], step["sub_question"])
                step["value_read"] = date is not None
                step["asked_sentence"] = date is None and step["finding"] != quote(contents)
            else:
                step["finding"] = quote(contents, answer)
                if r and _searched_answer(step, record.get("golden_answers") or []):
                    # the chain ends on the entity it answers with: what its passage says that the question asks
                    # for, which ``check_chains`` quotes in place of the finding to check the answer against
                    spent = " ".join(f"{s['sub_question']} {s['finding'] or ''}" for hop in plan[:r] for s in hop)
                    step["asked_finding"] = quote_for(contents, record["question"], f"{step['sub_question']} {spent}")


def ends_on_answer(q: GoldQuestion) -> bool:
    """A chain whose last hop searches the entity it answers with."""
    last = q.plan[-1]
    return len(q.plan) > 1 and len(last) == 1 and _searched_answer(last[0], q.golden_answers)


def _searched_answer(step: dict[str, Any], answers: Sequence[str]) -> bool:
    """The step searches the answer itself: its title, without a parenthesised qualifier, is one of the golden
    answers (MuSiQue's "Jessie Woodrow Wilson Sayre" is its second)."""
    title = normalised(plain_title(step["sub_question"]))
    return any(answer and title == normalised(answer) for answer in answers)
