"""Shipped and candidate policies on every validation question: one table that can tell them apart.

    python benchmarks/policy_table.py \
        --policy qwen-sft=qwen0.5b-parallelsearch:parallel --policy qwen-searchr1=qwen0.5b-searchr1:sequential \
        --policy smollm2-sft=smollm2-parallelsearch:parallel --policy qwen-base=qwen0.5b-base:parallel \
        --ours qwen-sft --baseline qwen-searchr1 [--device cuda] [--nq 200]

Each ``--policy NAME=SPEC:MODE`` is an LLM spec (an embedded ``NAME-base`` / ``-parallelsearch`` / ``-searchr1``,
or ``hf:PATH``) and the mode it runs in, greedy, in process, on ``--device`` (default: the GPU when torch sees one,
in bfloat16; else the CPU in float32), the concurrent questions' turns batched. Sets: every validation-part
question of HotpotQA, 2Wiki and MuSiQue (each in its own corpus), of Bamboogle and a seeded ``--nq`` sample of NQ
(no corpus of their own: the embedded Wikipedia summaries), and the held-out synthetic world
(``ps_agent.synthetic.HELD_OUT_SEED``). Never a train part. Writes ``OUT.md``/``OUT.json``: per policy, dataset and
question class, EM with a 95% bootstrap interval, F1, the split share, the share searched in two or more rounds,
LLM calls and seconds per question; then the paper's Table 3/2 layouts (``benchmarks.common.paper_tables``,
``OUT_paper.*``) with the paired bootstrap of ``--ours`` against ``--baseline``. Eval folders (resumable) go to
``--run-dir``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, Run, paper_tables, parse_policy, write_set  # noqa: E402
from ps_agent.configuration import BOUNDS  # noqa: E402
from ps_agent.episodes import aggregate  # noqa: E402
from ps_agent.eval import EvalSettings, evaluate  # noqa: E402
from ps_agent.llms import (  # noqa: E402
    embedded_base,
    embedded_model_path,
    policies_dir,
    release_text_policies,
    resolve_text_policy,
)
from ps_agent.questions import SHARED_DATA, question_class, read_split  # noqa: E402
from ps_agent.synthetic import HELD_OUT_SEED, generate  # noqa: E402
from ps_agent.trajectories import read_records  # noqa: E402

WITH_CORPUS = ("hotpotqa", "2wikimultihopqa", "musique")
EMBEDDED_CORPUS = ("bamboogle", "nq")


def validation_sets(
    out: Path, nq: int, classes: set[str] | None = None, names: set[str] | None = None, seed: int = 0
) -> dict[str, Path]:
    """Question files of the validation parts, each beside its corpus (or none: the embedded corpus), and the
    held-out synthetic world; only the sets ``names`` and the questions of ``classes`` (question classes) when
    given."""
    _, world = generate(HELD_OUT_SEED, 300, out / "synthetic-world", per_family=2)
    shared = {name: SHARED_DATA / name / "dev.jsonl" for name in WITH_CORPUS + EMBEDDED_CORPUS}
    sets = {}
    for name, dev in {"synthetic": world, **shared}.items():
        folder = dev.parent
        if names is not None and name not in names:
            continue
        if not dev.is_file():
            print(f"skipping {name}: {dev} is absent")
            continue
        records = [json.loads(line) for line in dev.read_text().splitlines()]
        records = records if name == "synthetic" else read_split(dev, "validation")
        records = [r for r in records if classes is None or question_class(r.get("type")) in classes]
        if not records:
            continue
        if name == "nq" and nq < len(records):
            records = random.Random(seed).sample(records, nq)
        corpus = folder / "corpus.jsonl"
        sets[name] = write_set(out / name, records, corpus if corpus.is_file() else None)
    return sets


def weight_files(spec: str) -> list[Path]:
    """The weight files behind an embedded spec or ``hf:`` folder, checksummed into each eval folder."""
    base = embedded_base(spec)
    folders = [embedded_model_path(base), policies_dir() / spec] if base else [Path(spec.removeprefix("hf:"))]
    names = ("model.safetensors", "adapter_model.safetensors")
    return [folder / name for folder in folders for name in names if (folder / name).is_file()]


def load_policy(spec: str, mode: str, device: str, concurrency: int):
    """The spec's in-process policy on ``device`` (bfloat16 on a GPU), batching the concurrent turns."""
    import torch

    policy = resolve_text_policy(spec, mode)
    policy.model.to(device=device, dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32)
    policy.expected = concurrency
    policy.batch_window_s = 0.5
    return policy


def record_devices(folder: Path, datasets: list[str], device: str) -> None:
    """Note which device answered ``datasets`` in a policy's eval folder: one folder may be filled on a GPU, then
    resumed on a CPU for other sets, and its seconds per question are comparable only within a device."""
    devices = recorded_devices(folder) | dict.fromkeys(datasets, device)
    (folder / "devices.json").write_text(json.dumps(devices, indent=1) + "\n")


def recorded_devices(folder: Path) -> dict[str, str]:
    """Per dataset, the device that answered it (``devices.json``; an older folder's one ``device.txt`` holds
    the device of every set it has results for)."""
    if (folder / "devices.json").is_file():
        return json.loads((folder / "devices.json").read_text())
    if not (folder / "device.txt").is_file():
        return {}
    device = (folder / "device.txt").read_text().strip()
    return {path.name.split(".")[0]: device for path in sorted((folder / "results").glob("*.jsonl"))}


def commands(folder: Path) -> list[str]:
    """The distinct commands that filled an eval folder, in order (``runs.jsonl``)."""
    made = []
    for record in read_records([folder / "runs.jsonl"]):
        script, _, flags = record["command"].partition(" ")
        command = f"python benchmarks/{Path(script).name} {flags}"
        made += [] if command in made else [command]
    return made


def rows(name: str, records: list[dict[str, Any]], bootstrap: int, rng: np.random.Generator) -> list[dict]:
    """Per dataset and question class (and ``all``), the policy's numbers (``episodes.aggregate``)."""
    out = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["dataset"], "all"), []).append(r)
        groups.setdefault((r["dataset"], r["question_class"]), []).append(r)
    for (dataset, cls), group in sorted(groups.items()):
        a = aggregate(group, bootstrap, rng)
        out.append({
            "policy": name, "dataset": dataset, "class": cls, "n": a["n"],
            "em": a["em"], "em_low": a["em_ci"][0], "em_high": a["em_ci"][1], "f1": a["f1"],
            "split": a["decomposition_ratio"], "two_rounds": a["two_rounds"], "llm_calls": a["turns"],
            "seconds": a["seconds_per_question"], "format_valid": a["format_valid"], "forced": a["forced_answer"],
        })  # fmt: skip
    return out


def markdown(table: list[dict], command: str, runs: dict[str, str], errors: dict[str, list[str]] | None = None) -> str:
    """The table page; ``errors``: per policy, the questions whose run ended in an error (left out of its rows)."""
    head = (
        "| policy | set | class | n | EM % [95% CI] | F1 % | split % | ≥2 rounds % | LLM calls | s/question "
        "| format % | forced % |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['policy']} | {r['dataset']} | {r['class']} | {r['n']} | {r['em']:.1f} [{r['em_low']:.1f}, "
        f"{r['em_high']:.1f}] | {r['f1']:.1f} | {r['split']:.0f} | {r['two_rounds']:.0f} | {r['llm_calls']:.2f} "
        f"| {r['seconds']:.1f} ({r['device']}) | {r['format_valid']:.0f} | {r['forced']:.0f} |"
        for r in table
    ]
    note = "Seconds per question are comparable only between rows run on the same device (in brackets)."
    made = "".join(f"- {name}: `{how}`\n" for name, how in runs.items())
    failed = "".join(f"- {name}: {error}\n" for name, listed in (errors or {}).items() for error in listed)
    if failed:
        failed = f"\nLeft out of the rows, questions whose run ended in an error:\n\n{failed}"
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
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--concurrency", type=int, default=None, help="questions at once (default 96 GPU, 16 CPU)")
    parser.add_argument("--nq", type=int, default=200, help="NQ validation questions (a seeded sample)")
    parser.add_argument("--limit", type=int, default=None, help="questions per set (a quick look)")
    parser.add_argument("--classes", help="only these question classes, e.g. parallelisable,hybrid")
    parser.add_argument("--sets", help="only these sets, e.g. hotpotqa,2wikimultihopqa (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--tables-only", action="store_true", help="no evaluation: tables of the runs in --run-dir")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "policy-table")
    parser.add_argument("--out", type=Path, default=RESULTS / "policy_table")
    args = parser.parse_args()
    concurrency = args.concurrency or (96 if args.device.startswith("cuda") else 16)
    policies = [parse_policy(p) for p in args.policy]
    started = time.time()
    classes = set(args.classes.split(",")) if args.classes else None
    names = set(args.sets.split(",")) if args.sets else None
    folder = args.run_dir / ("sets" if classes is None else f"sets-{'-'.join(sorted(classes))}")
    sets = {} if args.tables_only else validation_sets(folder, args.nq, classes, names)
    runs, table, made, errors = [], [], {}, {}
    rng = np.random.default_rng(0)
    for name, spec, mode in policies:
        if not args.tables_only:
            evaluate(list(sets.values()), args.run_dir / name, EvalSettings(
                llm=load_policy(spec, mode, args.device, concurrency),
                retriever="auto",
                modes=(mode,),
                concurrency=concurrency,
                limit=args.limit,
                # the longest run AgentConfig allows: on a 2-core CPU a batch of 16 questions takes minutes a turn,
                # and the agent's default of 600 s cut off a question of 4 turns and a forced answer (an eval
                # measures the policy, not the machine)
                agent={"max_new_tokens": args.max_new_tokens, "run_timeout_s": BOUNDS["run_timeout_s"][1]},
                weights=weight_files(spec),
            ))  # fmt: skip
            record_devices(args.run_dir / name, list(sets), args.device)
            release_text_policies()  # one loaded policy at a time
        run = Run(name, args.run_dir / name, mode)
        records, errors[name] = run.records(), run.errors()
        made[name] = "`, then `".join(commands(args.run_dir / name))
        devices = recorded_devices(args.run_dir / name)
        table += [
            row | {"device": devices.get(row["dataset"], "?")} for row in rows(name, records, args.bootstrap, rng)
        ]
        runs.append(run)
        print(f"{name}: {len(records)} questions, {(time.time() - started) / 60:.1f} min", flush=True)
    command = "python benchmarks/policy_table.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": command, "rows": table, "errors": errors}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(table, command, made, errors))
    compared = (args.ours, args.baseline) if args.ours and args.baseline else (None, None)
    paper_tables(runs, *compared, args.bootstrap, args.out.with_name(args.out.name + "_paper"))


if __name__ == "__main__":
    main()
