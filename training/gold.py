"""Gold trajectories: questions with a gold plan, played through the real agent graph by a teacher that
writes the plan's turns, kept as the exact token sequences a rollout produces.

    python training/gold.py --mode parallel --out runs/gold/parallel.jsonl

The teacher is a ``TextPolicy`` like any other: the graph renders the prompt, parses its turns, searches
the real retriever and renders the observations, and ``ps_agent.llms.tokens.token_sequences`` turns the
trajectory into prompt ids, completion ids and the environment mask — so a gold episode and an RL rollout
of the same text are the same tokens. An episode is kept only when every gold passage was actually retrieved;
every question and episode left out is counted by reason. The pieces, in the order data flows through them:
- ``training.plans``: the questions and their plans (synthetic worlds, the shared sets' train parts), each step
  with what its passage says; ``training.pairs``: comparisons paired from the train parts' gold passages;
- ``training.reading``: how a passage is read for a step (quotes, dates, values);
- ``training.turns``: the turns the teacher writes, with the check spelled out before each answer;
- this module: the episodes, the sets drawn from them and the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shlex
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `training` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ps_agent.agent import ParallelSearchAgent
from ps_agent.configuration import AgentConfig
from ps_agent.llms import model_path
from ps_agent.llms.tokens import token_sequences
from ps_agent.protocol import Mode
from ps_agent.questions import plan_rounds, question_class, yes_no
from ps_agent.runner import run_sync
from ps_agent.synthetic import TRAIN_SEEDS
from training.arguments import MAX_LENGTH, add_agent_arguments
from training.pairs import PAIR_KINDS, SOURCE_SUFFIX, paired_questions
from training.plans import (
    SHARED_SETS,
    WORLD_ENTITIES,
    WORLD_PER_FAMILY,
    GoldQuestion,
    GoldSet,
    ends_on_answer,
    gold_questions,
)
from training.reading import asks_same
from training.turns import (
    TeacherPolicy,
    answer_verdict,
    check_categories,
    check_chains,
    drop_undecided_comparisons,
    teacher_turns,
)

logger = logging.getLogger("gold")


def episode(
    q: GoldQuestion, out: dict[str, Any], mode: str, tokenizer: Any, max_new_tokens: int = AgentConfig.max_new_tokens
) -> dict[str, Any] | str:
    """A training episode from the graph's output, or why it is left out."""
    trajectory, stats = out["trajectory"], out["stats"]
    if stats["forced_answer"] or stats["invalid_turns"]:
        return "did not finish within max_turns"
    if any(call["completion_tokens"] > max_new_tokens for call in trajectory["llm_calls"]):
        return f"a turn longer than max_new_tokens={max_new_tokens} (the policy would be cut off)"
    retrieved = {p["id"] for r in trajectory["search_rounds"] for res in r["results"] for p in res["passages"]}
    if any(s["passage_id"] not in retrieved for r in q.plan for s in r):
        return "a gold passage was not retrieved"
    seq = token_sequences(trajectory, tokenizer)
    return {
        "id": q.id,
        "source": q.source,
        "question": q.question,
        "question_type": q.type,
        "question_class": q.question_class,
        "mode": mode,
        "prompt_ids": seq["prompt_ids"],
        "completion_ids": seq["completion_ids"],
        "env_mask": seq["env_mask"],
    }


def build_episodes(
    questions: Sequence[GoldQuestion],
    mode: Mode,
    tokenizer: Any,
    *,
    max_length: int = MAX_LENGTH,
    max_turns: int = 4,
    topk: int = 3,
    max_new_tokens: int = AgentConfig.max_new_tokens,
    seed: int = 0,
) -> tuple[list[dict[str, Any]], Counter]:
    """Gold episodes of ``questions`` in ``mode`` through the real graph, and the count of those left out
    by reason (too many turns for ``max_turns``, a gold passage not retrieved, a turn longer than the
    ``max_new_tokens`` the policy may write, longer than ``max_length``)."""
    rng = random.Random(seed)
    skipped: Counter = Counter()
    episodes: list[dict[str, Any]] = []
    by_corpus: dict[str, list[GoldQuestion]] = {}
    for q in questions:
        rounds = len(plan_rounds(q.plan, mode))
        if rounds + 1 > max_turns:
            skipped[f"needs {rounds} searches, more than max_turns={max_turns} allows"] += 1
        else:
            by_corpus.setdefault(q.corpus, []).append(q)
    for corpus, group in by_corpus.items():
        unique = {q.question: q for q in group}  # a repeated question text would share one teacher script
        skipped["repeated question text"] += len(group) - len(unique)
        group = list(unique.values())
        teacher = TeacherPolicy(tokenizer, {q.question: teacher_turns(q, mode, rng) for q in group})
        agent = ParallelSearchAgent(
            llm=teacher, retriever=corpus, mode=mode, max_turns=max_turns, topk=topk, max_new_tokens=max_new_tokens
        )
        outs = run_sync(_run(agent, [q.question for q in group]))  # also from Jupyter, whose loop is running
        for q, out in zip(group, outs, strict=True):
            ep = episode(q, out, mode, tokenizer, max_new_tokens)
            if isinstance(ep, str):
                skipped[ep] += 1
            elif len(ep["prompt_ids"]) + len(ep["completion_ids"]) > max_length:
                skipped[f"longer than max_length={max_length} tokens"] += 1
            else:
                episodes.append(ep)
    skipped = Counter({k: v for k, v in skipped.items() if v})
    return episodes, skipped


async def _run(agent: ParallelSearchAgent, questions: list[str], concurrency: int = 16) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)

    async def one(question: str) -> dict[str, Any]:
        async with gate:
            return await agent.ainvoke({"question": question})

    return await asyncio.gather(*(one(q) for q in questions))


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_agent_arguments(parser, ("mode", "max_turns", "topk", "max_new_tokens"))  # the agent's, as it runs them
    parser.add_argument("--out", type=Path, default=None, help="episodes jsonl (default runs/gold/MODE.jsonl)")
    parser.add_argument("--model", default="smollm2", help="the tokenizer's model: smollm2 or a model folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(TRAIN_SEEDS))
    parser.add_argument("--entities", type=int, default=WORLD_ENTITIES)
    parser.add_argument("--per-family", type=int, default=WORLD_PER_FAMILY)
    parser.add_argument("--shared", nargs="*", default=list(SHARED_SETS), help="shared sets whose train part to use")
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH, help="the longest episode kept, in tokens")
    parser.add_argument(
        "--ranked",
        action="store_true",
        help="the worlds of the next retrain: ranked mountains and lakes (a value stated as a rank, or only in the "
        "other entity's passage), and half the ranked and yes/no pairs searched by bare names and read as sentences "
        "(docs/results.md, 2026-11-27 and 2026-11-28: not in the shipped gold)",
    )
    parser.add_argument(
        "--categories",
        action="store_true",
        help='worlds with category comparisons too ("Which of A and B was a composer?", "What occupation did A '
        "and B share?\"), each read and checked before answering: the next retrain's (docs/results.md, 2026-11-30, "
        "second)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="N comparisons of each kind (born, died, film, same nationality, both an occupation, the profession, "
        "sport or nationality both share) paired from each shared set's train-part gold passages, over real leads "
        "(training/pairs.py); source NAME-pairs",
    )
    parser.add_argument(
        "--pair-kinds",
        type=lambda text: text.split(","),
        default=list(PAIR_KINDS),
        help=f"the kinds --pairs makes, comma-separated (default all: {','.join(PAIR_KINDS)})",
    )
    parser.add_argument(
        "--pairs-drawn",
        type=int,
        default=0,
        help="a continuation set: N of the --pairs episodes beside the others (capped by --per-source-class)",
    )
    parser.add_argument(
        "--per-source-class", type=int, default=None, help="keep at most N episodes of each (source, class)"
    )
    parser.add_argument(
        "--yes-no",
        type=int,
        default=0,
        help="a continuation set for a policy that says yes too often: N yes/no episodes, half answered yes and "
        "half no, each spelling out its check (real ones first), beside the others (capped by --per-source-class)",
    )
    parser.add_argument(
        "--categories-drawn",
        type=int,
        default=0,
        help="a continuation set for a policy that compares by numbers where the question asks for a category: N "
        "category comparisons that check before answering (real ones first; needs --categories), beside the others "
        "(capped by --per-source-class)",
    )
    parser.add_argument(
        "--checked-yes-no",
        action="store_true",
        help="leave out the yes/no episodes whose answer turn spells out no check (v5's gold held 20 of 38 real "
        "ones, most answered yes: they teach answering yes without reading); counted among the skipped",
    )
    parser.add_argument(
        "--checked-chains",
        action="store_true",
        help="a chain answered with the entity it searched last checks it against the question before answering "
        "(35 of the 54 such chains among HotpotQA's 280 train chains), or is left out where no check can be read; "
        "counted among the skipped questions",
    )
    parser.add_argument(
        "--both-no-share",
        type=float,
        default=None,
        help='at most this share of the made "Are A and B both X?" questions (synthetic worlds, --pairs) answered '
        "no, the others left out and counted among the skipped: the worlds and pairs answer half of them no, the "
        "train parts' real ones 1 in 18 (benchmarks/results/yes_no_rules.md); default: as made",
    )
    args = parser.parse_args(argv)
    if args.both_no_share is not None and not 0 <= args.both_no_share < 1:
        parser.error(f"--both-no-share {args.both_no_share}: expected a share from 0 up to, not including, 1")
    if args.yes_no < 0 or args.yes_no % 2:
        parser.error(f"--yes-no {args.yes_no}: expected an even count >= 0 (half answered yes, half no)")
    if args.categories_drawn < 0 or (args.categories_drawn and not args.categories):
        parser.error(f"--categories-drawn {args.categories_drawn}: expected a count >= 0, drawn from --categories")
    if set(args.pair_kinds) - set(PAIR_KINDS):
        parser.error(f"--pair-kinds {','.join(args.pair_kinds)}: expected some of {','.join(PAIR_KINDS)}")
    if args.pairs < 0 or args.pairs_drawn < 0 or (args.pairs_drawn and not args.pairs):
        parser.error(f"--pairs {args.pairs} --pairs-drawn {args.pairs_drawn}: expected counts >= 0, drawn from --pairs")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from transformers import AutoTokenizer

    out = args.out or Path("runs/gold") / f"{args.mode}.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(model_path(args.model))
    gold = gold_questions(
        args.seeds, args.entities, args.per_family, args.shared, out.parent, args.ranked, args.categories
    )
    for name in args.shared if args.pairs else ():
        paired = paired_questions(name, args.pairs, kinds=args.pair_kinds)
        gold.questions += paired.questions
        gold.skipped += paired.skipped
    drop_undecided_comparisons(gold)
    if args.both_no_share is not None:
        limit_both_no(gold, args.both_no_share)
    if args.categories:
        check_categories(gold)
    if args.checked_chains:
        check_chains(gold)
    episodes, skipped = build_episodes(
        gold.questions, args.mode, tokenizer, max_length=args.max_length, max_turns=args.max_turns, topk=args.topk,
        max_new_tokens=args.max_new_tokens,
    )  # fmt: skip
    built = len(episodes)
    by_id = {q.id: q for q in gold.questions}
    if args.checked_yes_no:
        kept = [ep for ep in episodes if not unchecked_yes_no(by_id[ep["id"]])]
        skipped["a yes/no answer with no check (--checked-yes-no)"] += len(episodes) - len(kept)
        episodes = kept
    draw = {"yes": args.yes_no // 2, "no": args.yes_no // 2} if args.yes_no else {}
    draw |= {"category": args.categories_drawn} if args.categories_drawn else {}
    draw |= {"pair": args.pairs_drawn} if args.pairs_drawn else {}
    if draw:
        selected = continuation_set(episodes, by_id, draw, args.per_source_class)
        skipped += left_out(episodes, selected, "not drawn into the continuation set")
        episodes = selected
    elif args.per_source_class:
        selected = capped(episodes, args.per_source_class)
        skipped += left_out(episodes, selected, f"beyond --per-source-class {args.per_source_class}")
        episodes = selected
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(ep) + "\n" for ep in episodes))
    options = {
        "command": shlex.join(["python", "training/gold.py", *(sys.argv[1:] if argv is None else argv)]),
        "tokenizer": Path(model_path(args.model)).name,  # run_sft.py refuses the episodes for another model
        "per_source_class": args.per_source_class,
        "yes_no_drawn": args.yes_no,
        "categories_drawn": args.categories_drawn,
        "pairs_drawn": args.pairs_drawn,
        "both_no_share": args.both_no_share,
    }
    report = summary(gold, episodes, skipped, built) | options
    out.with_suffix(".summary.json").write_text(json.dumps(report, indent=1) + "\n")
    logger.info("%s", json.dumps(report, indent=1))
    return out


def source_class(ep: Mapping[str, Any]) -> str:
    """An episode's group for the caps and the summary: ``"SOURCE, CLASS"``."""
    return f"{ep['source']}, {ep['question_class']}"


def capped(episodes: Sequence[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """At most ``n`` episodes of each (source, class), drawn by a seeded shuffle, then shuffled together."""
    shuffled = list(episodes)
    random.Random(seed).shuffle(shuffled)
    taken: Counter = Counter()
    kept = []
    for ep in shuffled:
        key = source_class(ep)
        if taken[key] < n:
            taken[key] += 1
            kept.append(ep)
    return kept


def limit_both_no(gold: GoldSet, share: float) -> None:
    """``gold.py --both-no-share``: of each made source's (``synthetic``, ``NAME-pairs``) "Are A and B both X?"
    questions, every one answered yes and, in order, only as many answered no as make ``share`` of them; the rest
    are left out, counted among the skipped. The made sources answer half of them no, by a value their passages
    state ("B occupation: engineer, no") or leave out; the real ones are mostly yes (17 of the 18 of HotpotQA's
    train part), a lead's first sentence naming few of its subject's properties. A policy trained on half no
    answers "not both" to real questions whose two values differ in words ("Armenian and Armenian-American")."""
    made = [q for q in gold.questions if q.source == "synthetic" or q.source.endswith(SOURCE_SUFFIX)]
    both = [q for q in made if yes_no(q.golden_answers) and not asks_same(q.question)]
    yes = Counter(q.source for q in both if yes_no(q.golden_answers) == "yes")
    allowed = Counter({source: int(n * share / (1 - share)) for source, n in yes.items()})
    dropped = set()
    for q in both:
        if yes_no(q.golden_answers) == "no":
            if allowed[q.source] > 0:
                allowed[q.source] -= 1
            else:
                dropped.add(id(q))
    gold.questions = [q for q in gold.questions if id(q) not in dropped]
    gold.skipped[f'a made "both" question answered no, beyond --both-no-share {share}'] += len(dropped)


def unchecked_yes_no(q: GoldQuestion) -> bool:
    """Whether ``q`` is answered yes or no with no check spelt out before the answer (``answer_verdict``)."""
    return yes_no(q.golden_answers) is not None and answer_verdict(q) is None


def drawn_kind(q: GoldQuestion) -> str | None:
    """What a continuation set draws ``q`` as: ``pair`` (of ``--pairs``), ``yes`` or ``no`` (a yes/no comparison
    that checks before answering), ``unchecked`` (one that does not), ``category`` (a comparison by a category that
    checks, of ``--categories``), or None."""
    if q.source.endswith(SOURCE_SUFFIX):
        return "pair"
    if answer := yes_no(q.golden_answers):
        return "unchecked" if unchecked_yes_no(q) else answer
    return "category" if len(q.plan[-1]) == 2 and "check" in q.plan[-1][0] else None


def left_out(episodes: Sequence[dict[str, Any]], kept: Sequence[dict[str, Any]], reason: str) -> Counter:
    """The built episodes a selection (``capped``, ``continuation_set``) left out, counted by source and class as
    ``"SOURCE, CLASS: REASON"``, for the summary's ``skipped_episodes``."""
    gone = Counter(map(source_class, episodes)) - Counter(map(source_class, kept))
    return Counter({f"{group}: {reason}": n for group, n in gone.items()})


def continuation_set(
    episodes: Sequence[dict[str, Any]],
    questions: Mapping[str, GoldQuestion],
    draw: Mapping[str, int],
    cap: int | None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``draw[kind]`` episodes of each kind drawn (``drawn_kind``: ``yes``, ``no``, ``category``, ``pair``), the
    shared sets' first, beside the other episodes (at most ``cap`` of each source and class when given), shuffled
    together: the set to go on training a policy on what it gets wrong (``run_sft.py --init_adapter``) while it
    rehearses what it knew. Drawing yes/no episodes never draws or keeps an unchecked one: it teaches answering
    without reading."""
    rng = random.Random(seed)
    kinds = {ep["id"]: drawn_kind(questions[ep["id"]]) for ep in episodes}
    left_out = set(draw) | ({"unchecked"} if {"yes", "no"} & set(draw) else set())
    others = [ep for ep in episodes if kinds[ep["id"]] not in left_out]
    kept = capped(others, cap, seed) if cap else others
    for kind, n in draw.items():
        pool = [ep for ep in episodes if kinds[ep["id"]] == kind]
        rng.shuffle(pool)
        pool.sort(key=lambda ep: ep["source"] == "synthetic")  # stable: the shared sets' first, each shuffled
        kept += pool[:n]
    rng.shuffle(kept)
    return kept


def summary(gold: GoldSet, episodes: Sequence[dict[str, Any]], skipped: Counter, built: int) -> dict[str, Any]:
    """What was built and kept, by source and class, and what was left out, by reason. ``built`` counts the
    episodes before any cap; ``gold_retrieved_fraction`` is the share of the episodes that ran whose every
    gold passage was retrieved; ``real_comparison_values_read`` counts the compared entities of the shared sets
    whose passage gave a date to quote, and those where a sentence sharing the question's words was added;
    ``real_yes_no`` counts the kept episodes of the shared sets answered yes and no, and those whose answer turn
    spells out a check (a policy taught mostly unchecked yeses learns to say yes); ``yes_no`` counts every kept
    episode answered yes and no; ``real_ends_on_answer`` counts the kept chains of the shared sets that answer with
    the entity they searched last, and those whose answer turn checks it against the question (``check_chains``);
    ``category_checks`` counts by source the kept comparisons by a category whose answer turn checks it
    (``check_categories``)."""
    planned = len(gold.questions)
    by_id = {q.id: q for q in gold.questions}
    real_yes_no: Counter = Counter({"yes": 0, "no": 0, "with_check": 0})
    ends_on_answer_counts: Counter = Counter({"chains": 0, "checked": 0})
    answered = Counter(yes_no(by_id[e["id"]].golden_answers) for e in episodes)
    for q in (by_id[e["id"]] for e in episodes if e["source"] != "synthetic"):
        if answer := yes_no(q.golden_answers):
            real_yes_no[answer] += 1
            real_yes_no["with_check"] += answer_verdict(q) is not None
        if ends_on_answer(q):
            ends_on_answer_counts["chains"] += 1
            ends_on_answer_counts["checked"] += "check" in q.plan[-1][0]
    kept = [by_id[e["id"]] for e in episodes]
    ran = built + skipped["a gold passage was not retrieved"]
    compared = [
        s
        for q in gold.questions
        if q.source != "synthetic" and question_class(q.type) == "parallelisable"
        for s in q.plan[0]
    ]
    tokens = [len(e["prompt_ids"]) + len(e["completion_ids"]) for e in episodes]
    return {
        "questions_with_plan": planned,
        "episodes_built": built,
        "built_fraction": round(built / planned, 4) if planned else 0.0,
        "gold_retrieved_fraction": round(built / ran, 4) if ran else 0.0,
        "episodes": len(episodes),
        "by_source": dict(Counter(e["source"] for e in episodes)),
        "by_class": dict(Counter(e["question_class"] for e in episodes)),
        "by_source_class": dict(Counter(map(source_class, episodes))),
        "tokens": sum(tokens),
        "trained_tokens": sum(sum(e["env_mask"]) for e in episodes),
        "max_tokens": max(tokens, default=0),
        "real_comparison_values_read": {  # a date quoted from the passage, not a sentence (see add_findings)
            "read": sum(bool(s.get("value_read")) for s in compared),
            "asked_sentence": sum(bool(s.get("asked_sentence")) for s in compared),
            "entities": len(compared),
        },
        "real_yes_no": dict(real_yes_no),
        "real_ends_on_answer": dict(ends_on_answer_counts),
        "yes_no": {"yes": answered["yes"], "no": answered["no"]},
        "category_checks": dict(Counter(q.source for q in kept if drawn_kind(q) == "category")),
        "skipped_questions": dict(gold.skipped),  # before any episode ran: no plan, or an unchecked chain
        "skipped_episodes": dict(skipped),
    }


if __name__ == "__main__":
    main()
