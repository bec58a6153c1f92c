"""A CPU decode step of the embedded policies by batch size, with the linear weights as ``nn.Linear`` keeps them
([out, in], read transposed by the matmul) and stored transposed ([in, out], the same values and shapes), side by
side in one run.

    python benchmarks/decode_batch.py [--models qwen0.5b smollm2] [--batches 1 2 3 4 8] [--tokens 32] [--threads 1]

Each policy is the trained parallel adapter merged into its base (what ``ps-agent ask`` loads), float32, greedy,
``--tokens`` decoded tokens after a prompt of about 190, EOS ignored, on ``--threads`` threads (``make test`` gives
each of its workers one). It asks: how many concurrent runs make a batch worth generating together (a suite's
tests, an eval's ``--concurrency``), and what the weights' layout costs a decode step. The greedy tokens of the two
layouts are compared. Writes ``benchmarks/results/decode_batch.{json,md}``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, save  # noqa: E402

PROMPT = "Which river is longer, the Niger River or the Paraná River? Think step by step, then answer. " * 8


def step_seconds(model, ids, batch: int, tokens: int) -> tuple[float, list]:
    """Seconds per decode step of ``batch`` copies of ``ids`` (the prefill's share taken out), and the tokens."""
    import torch

    x = ids.repeat(batch, 1)
    mask = torch.ones_like(x)
    timings = []
    for new in (1, tokens + 1):  # the prefill and its first token, then ``tokens`` more
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=0)  # fmt: skip
        timings.append(time.perf_counter() - started)
    return (timings[1] - timings[0]) / tokens, out[:, ids.shape[1] :].tolist()


def transposed(model) -> None:
    """Every ``nn.Linear`` weight stored [in, out] in memory, its shape and values unchanged."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.data = module.weight.data.t().contiguous().t()


def measure(args: argparse.Namespace) -> list[dict]:
    import torch

    from ps_agent.llms import load_adapter_model, policies_dir

    torch.set_num_threads(args.threads)
    rows = []
    for base in args.models:
        model, tokenizer = load_adapter_model(policies_dir() / f"{base}-parallelsearch")
        ids = torch.tensor([tokenizer(PROMPT).input_ids])
        tokens = {}
        for layout in ("[out, in]", "[in, out]"):
            if layout == "[in, out]":
                transposed(model)
            for batch in args.batches:
                seconds, tokens[layout, batch] = step_seconds(model, ids, batch, args.tokens)
                rows.append({"model": base, "layout": layout, "batch": batch, "step_s": round(seconds, 4),
                             "tokens_per_s": round(batch / seconds, 2)})  # fmt: skip
                print(rows[-1], flush=True)
        for batch in args.batches:
            same = tokens["[out, in]", batch] == tokens["[in, out]", batch]
            for row in rows:
                if row["model"] == base and row["batch"] == batch:
                    row["same_tokens_as_out_in"] = same
        del model
    return rows


def page(rows: list[dict], args: argparse.Namespace, command: str) -> str:
    alone = {(r["model"], r["layout"]): r["step_s"] for r in rows if r["batch"] == 1}
    kept = {(r["model"], r["batch"]): r["step_s"] for r in rows if r["layout"] == "[out, in]"}
    lines = [
        f"| {r['model']} | {r['layout']} | {r['batch']} | {r['step_s'] * 1000:.0f} | {r['tokens_per_s']:.1f} "
        f"| {r['step_s'] / alone[r['model'], r['layout']]:.2f} | {kept[r['model'], r['batch']] / r['step_s']:.2f} "
        f"| {'yes' if r['same_tokens_as_out_in'] else 'no'} |"
        for r in rows
    ]
    return (
        "# A CPU decode step by batch size and weight layout\n\n"
        f"`{command}`\n\n"
        f"Float32, greedy, {args.tokens} decoded tokens a row after a prompt of about 190, {args.threads} thread(s). "
        f"{args.note}\n\n"
        "| model | weights | batch | ms a step | tokens/s | step vs batch 1 | speed-up vs [out, in] | same tokens |\n"
        "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["qwen0.5b", "smollm2"], help="embedded bases")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 3, 4, 8])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="decode_batch")
    parser.add_argument("--note", default="", help="what else ran on the machine, for the page")
    args = parser.parse_args()
    command = shlex.join(["python", "benchmarks/decode_batch.py", *sys.argv[1:]])
    rows = measure(args)
    save(RESULTS / args.name, {"command": command, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
         page(rows, args, command))  # fmt: skip


if __name__ == "__main__":
    main()
