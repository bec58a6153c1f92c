"""Retrieval at scale: index builds, retrieval quality, and the server under concurrent load.

    python benchmarks/retrieval.py [--parts build,encoder,quality,server] [--data ../shared/data] [--seconds 10]

Reads the corpora and questions in ``../shared/data`` (never copied here); builds index folders under
``~/.cache/ps_agent/benchmarks/`` (``PS_AGENT_CACHE`` overrides); writes
``benchmarks/results/retrieval.json`` and ``retrieval.md``.

- build: for hotpotqa and 2wikimultihopqa corpora, the time of each stage (passage store, MiniLM
  encoding, each FAISS type, BM25), passages/s, and index bytes per passage, projected to 21M passages.
- encoder: MiniLM in float32 vs bfloat16 side by side (passages/s, one query vs a batch of 64, cosine).
- quality: recall@3/5/10 of the supporting passages on the dev questions, BM25 vs dense (Flat) vs hybrid
  (RRF), searching the full question, and searching each supporting title as its own sub-query
  (the entity sub-query a decomposing agent issues; the datasets carry no gold sub-questions); BM25 with
  its title field beside BM25 over the passage alone (``title_weight=0``), here and on the embedded corpus,
  where each of 1,000 sampled titles is searched for its own article.
- server: ``ps-agent serve-retriever --index`` (Flat, MiniLM) in its own process; 1/16/64/256 clients
  each sending one-query requests back to back for ``--seconds``; queries/s and p50/p99 latency with
  micro-batching on and off (off = each request encoded and searched alone, as Search-R1's server does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402

from ps_agent.cache import cache_dir  # noqa: E402
from ps_agent.processes import served  # noqa: E402
from ps_agent.questions import SHARED_DATA  # noqa: E402
from ps_agent.retrieval import BM25Retriever  # noqa: E402
from ps_agent.retrieval.corpus import load_embedded_corpus  # noqa: E402
from ps_agent.retrieval.dense import HybridRetriever  # noqa: E402
from ps_agent.retrieval.encoders import load_encoder  # noqa: E402
from ps_agent.retrieval.index import build_index, load_index  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PS_AGENT = str(Path(sys.executable).parent / "ps-agent")
DATASETS = ("hotpotqa", "2wikimultihopqa")
TYPES = ("flat", "hnsw", "ivfpq", "bm25")
TARGET_PASSAGES = 21_000_000
KS = (3, 5, 10)


def index_folder(dataset: str, kind: str) -> Path:
    return cache_dir() / "benchmarks" / f"{dataset}-{kind}"


def folder_bytes(folder: Path, patterns: list[str]) -> int:
    return sum(p.stat().st_size for pattern in patterns for p in folder.glob(pattern) if p.is_file())


def bench_build(data: Path) -> dict:
    """Each stage timed alone: one folder per index type; the dense ones reuse one folder's embeddings."""
    results = {}
    for dataset in DATASETS:
        corpus = data / dataset / "corpus.jsonl"
        row: dict = {}
        for kind in TYPES:
            folder = index_folder(dataset, kind)
            if (folder / "manifest.json").exists():
                row[kind] = json.loads((folder / "timing.json").read_text())
                continue
            if kind in ("hnsw", "ivfpq"):  # reuse flat's store and embeddings: time only the index itself
                folder.mkdir(parents=True, exist_ok=True)
                flat = index_folder(dataset, "flat")
                for name in ("build.json", "passages.arrow"):
                    shutil.copy(flat / name, folder / name)
                shutil.copytree(flat / "embeddings", folder / "embeddings", dirs_exist_ok=True)
            start = time.perf_counter()
            manifest = build_index(corpus, folder, [kind], progress=True)
            seconds = time.perf_counter() - start
            index_files = ["bm25/*"] if kind == "bm25" else [f"{kind}.faiss"]
            timing = {
                "passages": manifest["count"],
                "seconds": round(seconds, 2),
                "passages_per_s": round(manifest["count"] / seconds, 1),
                "index_bytes": folder_bytes(folder, index_files),
                "store_bytes": folder_bytes(folder, ["passages.arrow"]),
                "embedding_bytes": folder_bytes(folder, ["embeddings/*.npy"]) if kind == "flat" else 0,
                "params": manifest["params"].get(kind, {}),
                "encoder_dtype": manifest.get("encoder_dtype"),
                "includes": "store + encoding + index" if kind == "flat" else "index only (flat's embeddings)"
                if kind != "bm25" else "store + tokenising + index",
            }  # fmt: skip
            timing["bytes_per_passage"] = round(timing["index_bytes"] / manifest["count"], 1)
            timing["projected_21M"] = {
                "hours": round(TARGET_PASSAGES / timing["passages_per_s"] / 3600, 1),
                "index_gb": round(timing["bytes_per_passage"] * TARGET_PASSAGES / 1e9, 1),
                "store_gb": round(timing["store_bytes"] / manifest["count"] * TARGET_PASSAGES / 1e9, 1),
            }
            (folder / "timing.json").write_text(json.dumps(timing, indent=2))
            row[kind] = timing
        results[dataset] = row
    return results


def bench_encoder(data: Path, passages: int = 1024, repeats: int = 3) -> dict:
    """MiniLM in float32 vs bfloat16, side by side: passages/s, query latency alone and in a batch of 64,
    and how close the bfloat16 embeddings are to the float32 ones (cosine)."""
    lines = (data / "hotpotqa" / "corpus.jsonl").open()
    texts = [json.loads(next(lines))["contents"] for _ in range(passages)]
    queries = [json.loads(line)["question"] for line in (data / "hotpotqa" / "dev.jsonl").open() if line.strip()][:64]
    results: dict = {}
    vectors = {}
    for dtype in ("float32", "bfloat16"):
        encoder = load_encoder("minilm", dtype=dtype)
        encoder.encode_queries(queries)  # warm-up
        start = time.perf_counter()
        vectors[dtype] = encoder.encode_passages(texts)
        passages_s = len(texts) / (time.perf_counter() - start)
        one = min(_seconds(lambda e=encoder, q=q: e.encode_queries([q])) for q in queries[: repeats * 4])
        batch = min(_seconds(lambda e=encoder: e.encode_queries(queries)) for _ in range(repeats))
        results[dtype] = {
            "passages_per_s": round(passages_s, 1),
            "one_query_ms": round(one * 1000, 1),
            "batch_of_64_ms": round(batch * 1000, 1),
            "batching_gain": round(64 * one / batch, 2),
        }
    cosine = (vectors["float32"] * vectors["bfloat16"]).sum(axis=1)
    results["cosine_bf16_vs_fp32"] = {"mean": round(float(cosine.mean()), 5), "min": round(float(cosine.min()), 5)}
    results["bf16_speedup_passages"] = round(
        results["bfloat16"]["passages_per_s"] / results["float32"]["passages_per_s"], 2
    )
    return results


def _seconds(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def bench_quality(data: Path) -> dict:
    results = {}
    for dataset in DATASETS:
        questions = [json.loads(line) for line in (data / dataset / "dev.jsonl").open() if line.strip()]
        questions = [q for q in questions if q.get("supporting_doc_ids")]
        bm25, dense = load_index(index_folder(dataset, "bm25")), load_index(index_folder(dataset, "flat"))
        passage_only = BM25Retriever(bm25.passages, title_weight=0)
        retrievers = {
            "bm25, passage only": passage_only,
            "bm25": bm25,
            "dense": dense,
            "hybrid": HybridRetriever([bm25, dense]),
        }
        title_of = {passage.id: passage.title for passage in bm25.passages}
        golds = [set(q["supporting_doc_ids"]) for q in questions]
        pairs = [(n, d) for n, q in enumerate(questions) for d in q["supporting_doc_ids"]]
        row: dict = {"questions": len(questions), "sub_queries": len(pairs)}
        for name, retriever in retrievers.items():
            start = time.perf_counter()
            full = asyncio.run(retriever.asearch([q["question"] for q in questions], max(KS)))
            sub = asyncio.run(retriever.asearch([title_of[d] for _, d in pairs], max(KS)))
            row[name] = {"seconds": round(time.perf_counter() - start, 1)}
            for k in KS:
                full_found = [gold & {p.id for p in hits[:k]} for gold, hits in zip(golds, full, strict=True)]
                sub_found: list[set[str]] = [set() for _ in questions]
                for (n, d), hits in zip(pairs, sub, strict=True):
                    if d in {p.id for p in hits[:k]}:
                        sub_found[n].add(d)
                for how, found in (("full_question", full_found), ("sub_query", sub_found)):
                    row[name][f"{how}_recall@{k}"] = round(
                        float(np.mean([len(f) / len(g) for f, g in zip(found, golds, strict=True)])), 3
                    )
                    row[name][f"{how}_all_found@{k}"] = round(
                        float(np.mean([f == g for f, g in zip(found, golds, strict=True)])), 3
                    )
        results[dataset] = row
    results["embedded"] = bench_titles()
    return results


def bench_titles(n: int = 1000, seed: int = 0) -> dict:
    """Each of ``n`` sampled embedded-corpus titles searched alone: is its own article first, in the top 3?"""
    passages = load_embedded_corpus()
    sample = np.random.default_rng(seed).choice(len(passages), size=n, replace=False)
    row: dict = {"passages": len(passages), "titles": n}
    for name, weight in (("bm25, passage only", 0.0), ("bm25", 1.0)):
        hits = BM25Retriever(passages, title_weight=weight).search([passages[i].title for i in sample], 3)
        ids = [[p.id for p in found] for found in hits]
        row[name] = {
            "hit@1": round(float(np.mean([f[:1] == [passages[i].id] for f, i in zip(ids, sample, strict=True)])), 3),
            "hit@3": round(float(np.mean([passages[i].id in f for f, i in zip(ids, sample, strict=True)])), 3),
        }
    return row


async def load(url: str, queries: list[str], clients: int, seconds: float, warmup_s: float = 5.0) -> dict:
    """``clients`` loops, each sending one-query requests back to back; latencies after the warm-up.
    aiohttp, not httpx: on 2 shared cores the load generator's own CPU would otherwise cap the server."""
    latencies: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        start = time.perf_counter()
        measure_from, stop_at = start + warmup_s, start + warmup_s + seconds

        async def one_client(c: int) -> None:
            nonlocal errors
            i = c
            while (now := time.perf_counter()) < stop_at:
                body = {"queries": [queries[i % len(queries)]], "topk": 3, "return_scores": True}
                async with session.post(f"{url}/retrieve", json=body) as response:
                    await response.read()
                    ok = response.status == 200
                if not ok:
                    errors += 1
                elif now >= measure_from:
                    latencies.append(time.perf_counter() - now)
                i += clients

        await asyncio.gather(*(one_client(c) for c in range(clients)))
    return {
        "clients": clients,
        "requests": len(latencies),
        "queries_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 1),
        "p99_ms": round(float(np.percentile(latencies, 99)) * 1000, 1),
        "errors": errors,
    }


@contextlib.contextmanager
def serve(folder: Path, port: int, *flags: str) -> Iterator[str]:
    """``ps-agent serve-retriever`` over the folder's Flat index: its URL once it answers ``/health``, for the
    block."""
    command = [PS_AGENT, "serve-retriever", "--index", str(folder), "--kind", "flat", "--port", str(port), *flags]
    url = f"http://127.0.0.1:{port}"
    with served(command, f"{url}/health", cache_dir() / f"retrieval-server-{port}.log", timeout_s=120):
        yield url


def measure(url: str, queries: list[str], clients: int, seconds: float) -> dict:
    before = _batch_totals(httpx.get(f"{url}/metrics").text)
    row = asyncio.run(load(url, queries, clients, seconds))
    after = _batch_totals(httpx.get(f"{url}/metrics").text)
    row["mean_batch_size"] = round((after[0] - before[0]) / max(1.0, after[1] - before[1]), 1)
    return row


def bench_server(data: Path, seconds: float, levels: list[int]) -> dict:
    folder = index_folder("hotpotqa", "flat")
    queries = [json.loads(line)["question"] for line in (data / "hotpotqa" / "dev.jsonl").open() if line.strip()]
    results: dict = {}
    for key, flags in (("micro_batching_on", ["--micro-batching"]), ("micro_batching_off", ["--no-micro-batching"])):
        with serve(folder, 8701, *flags) as url:
            results[key] = [measure(url, queries, clients, seconds) for clients in levels]
            print(key, results[key], flush=True)
    on = {r["clients"]: r for r in results["micro_batching_on"]}
    off = {r["clients"]: r for r in results["micro_batching_off"]}
    results["speedup_qps"] = {str(c): round(on[c]["queries_per_s"] / off[c]["queries_per_s"], 2) for c in on}
    results["max_batch_at_64_clients"] = []  # the latency/throughput knob, each on a fresh server
    for max_batch in (16, 32, 256):
        with serve(folder, 8702, "--max-batch", str(max_batch)) as url:
            row = measure(url, queries, 64, seconds) | {"max_batch": max_batch}
            print(row, flush=True)
            results["max_batch_at_64_clients"].append(row)
    return results


def _batch_totals(metrics: str) -> tuple[float, float]:
    """(queries, batches) so far, from the server's Prometheus batch-size histogram."""
    values = dict(line.split() for line in metrics.splitlines() if line.startswith("retrieve_batch_size_"))
    return float(values["retrieve_batch_size_sum"]), float(values["retrieve_batch_size_count"])


def markdown(results: dict) -> str:
    lines = ["# Retrieval at scale", "", f"Machine: {results['machine']}.", ""]
    lines += [f"- {part}: `{command}`" for part, command in results.get("commands", {}).items()] + [""]
    if "build" in results:
        lines += [
            "## Index builds (all-MiniLM-L6-v2, 384-d, encoder in bfloat16; projected linearly to 21M passages)",
            "",
            "| corpus | index | passages | what the time covers | passages/s | index bytes/passage "
            "| 21M: hours | 21M: index GB | 21M: store GB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for dataset, row in results["build"].items():
            for kind, t in row.items():
                p = t["projected_21M"]
                lines.append(
                    f"| {dataset} | {kind} | {t['passages']} | {t['includes']} | {t['passages_per_s']} "
                    f"| {t['bytes_per_passage']} | {p['hours']} | {p['index_gb']} | {p['store_gb']} |"
                )
        lines.append("")
    if "encoder" in results:
        enc = results["encoder"]
        lines += [
            "## Encoder: MiniLM in float32 vs bfloat16 (same run, 1,024 hotpotqa passages, 64 questions)",
            "",
            "| dtype | passages/s | one query ms | batch of 64 ms | batching gain (per query) |",
            "|---|---|---|---|---|",
        ]
        for dtype in ("float32", "bfloat16"):
            r = enc[dtype]
            lines.append(
                f"| {dtype} | {r['passages_per_s']} | {r['one_query_ms']} | {r['batch_of_64_ms']} "
                f"| {r['batching_gain']}× |"
            )
        cos = enc["cosine_bf16_vs_fp32"]
        lines += ["", f"bfloat16 vs float32 passage embeddings: cosine mean {cos['mean']}, min {cos['min']}.", ""]
    if "quality" in results:
        lines += [
            "## Recall of the supporting passages (dev questions, each benchmark's own corpus)",
            "",
            "`full`: the whole question searched once; `sub`: each supporting title searched as its own "
            "sub-query (top-k each). recall = share of supporting passages found; all = every one found.",
            "",
            "| dataset | retriever | full R@3 | full R@5 | full R@10 | full all@10 | sub R@3 | sub R@5 | sub R@10 "
            "| sub all@3 |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        quality = {d: row for d, row in results["quality"].items() if d != "embedded"}
        for dataset, row in quality.items():
            for name in ("bm25, passage only", "bm25", "dense", "hybrid"):
                r = row[name]
                lines.append(
                    f"| {dataset} ({row['questions']} q) | {name} | {r['full_question_recall@3']} "
                    f"| {r['full_question_recall@5']} | {r['full_question_recall@10']} "
                    f"| {r['full_question_all_found@10']} | {r['sub_query_recall@3']} | {r['sub_query_recall@5']} "
                    f"| {r['sub_query_recall@10']} | {r['sub_query_all_found@3']} |"
                )
        lines.append("")
        lines += [
            "`bm25` scores two fields, the passage and its title, summed (BM25F-style); `bm25, passage only` is the "
            "passage field alone (`title_weight=0`).",
            "",
        ]
        if "embedded" in results["quality"]:
            row = results["quality"]["embedded"]
            lines += [
                f"Embedded corpus ({row['passages']} lead summaries): each of {row['titles']} sampled titles searched "
                "alone; is its own article first, or in the top 3?",
                "",
                "| retriever | hit@1 | hit@3 |",
                "|---|---|---|",
            ]
            for name in ("bm25, passage only", "bm25"):
                lines.append(f"| {name} | {row[name]['hit@1']} | {row[name]['hit@3']} |")
            lines.append("")
    if "server" in results:
        server = results["server"]
        lines += [
            "## Server under load (Flat index over hotpotqa, MiniLM; one query per request, topk 3)",
            "",
            "| clients | on: q/s | on: p50 ms | on: p99 ms | on: mean batch | off: q/s | off: p50 ms | off: p99 ms "
            "| speed-up |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for on, off in zip(server["micro_batching_on"], server["micro_batching_off"], strict=True):
            lines.append(
                f"| {on['clients']} | {on['queries_per_s']} | {on['p50_ms']} | {on['p99_ms']} "
                f"| {on['mean_batch_size']} | {off['queries_per_s']} | {off['p50_ms']} | {off['p99_ms']} "
                f"| {server['speedup_qps'][str(on['clients'])]}× |"
            )
        lines += [
            "",
            "Micro-batching on, 64 clients, each `--max-batch` on a fresh server:",
            "",
            "| max batch | q/s | p50 ms | p99 ms | mean batch |",
            "|---|---|---|---|---|",
        ]
        for r in server.get("max_batch_at_64_clients", []):
            lines.append(
                f"| {r['max_batch']} | {r['queries_per_s']} | {r['p50_ms']} | {r['p99_ms']} | {r['mean_batch_size']} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="build,encoder,quality,server")
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds per load level (after 5 s of warm-up)"
    )
    parser.add_argument("--clients", default="1,16,64,256")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if not (args.data / "hotpotqa" / "corpus.jsonl").exists():
        sys.exit(f"no shared data at {args.data}: expected hotpotqa/ and 2wikimultihopqa/ with corpus.jsonl")
    out = RESULTS / "retrieval.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
    results.pop("command", None)
    for part in parts:  # parts of one file may come from different runs: each says how it was made
        results.setdefault("commands", {})[part] = f"python {' '.join(sys.argv)} ({time.strftime('%Y-%m-%d %H:%M')})"
    bench_build(args.data)  # every part needs the folders; cached after the first run
    if "build" in parts:
        results["build"] = bench_build(args.data)
    if "encoder" in parts:
        results["encoder"] = bench_encoder(args.data)
    if "quality" in parts:
        results["quality"] = bench_quality(args.data)
    if "server" in parts:
        results["server"] = bench_server(args.data, args.seconds, [int(c) for c in args.clients.split(",")])
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "retrieval.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
