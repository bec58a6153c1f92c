"""Part 3: the retrieval server (``ps-agent serve-retriever``) under concurrent, poisoned and vanishing clients."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.attacks import PS_AGENT, Case, percentile
from ps_agent.processes import free_port, served


def write_corpus(path: Path, n: int) -> list[str]:
    """The first ``n`` embedded Wikipedia summaries as a Search-R1 corpus jsonl; returns their titles."""
    from ps_agent.retrieval.corpus import load_embedded_corpus

    passages = load_embedded_corpus()[:n]
    path.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages))
    return [p.title for p in passages]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def retrieval_server(corpus: Path, workdir: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """``ps-agent serve-retriever --corpus FILE`` as a subprocess (its BM25 cache in ``workdir``)."""
    port = free_port()
    env = os.environ | {"PS_AGENT_CACHE": str(workdir / "cache")}
    command = [PS_AGENT, "serve-retriever", "--corpus", str(corpus), "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with served(command, f"{url}/health", workdir / f"server-{port}.log", timeout_s=120, env=env) as process:
        yield process, url


POISON: dict[str, bytes] = {
    "lone surrogate": b'{"queries": ["Big Ben \\ud800"], "topk": 3}',
    "topk as string": b'{"queries": ["Big Ben"], "topk": "3"}',
    "topk out of bounds": b'{"queries": ["Big Ben"], "topk": 100000}',
    "query over 2000 chars": json.dumps({"queries": ["x" * 5000], "topk": 3}).encode(),
    "300 queries": json.dumps({"queries": ["q"] * 300, "topk": 3}).encode(),
    "1 MB query": json.dumps({"queries": ["y" * 1_000_000], "topk": 3}).encode(),
    "malformed JSON": b'{"queries": ["Big Ben"',
    "empty queries": b'{"queries": [], "topk": 3}',
    "queries not a list": b'{"queries": "Big Ben", "topk": 3}',
    "query not a string": b'{"queries": [3], "topk": 3}',
    "blank query": b'{"queries": ["   "], "topk": 3}',
}


async def load_server(url: str, titles: list[str], clients: int, seconds: float, seed: int) -> dict[str, Any]:
    """``clients`` concurrent loops for ``seconds``: 5% poisoned, 5% cancelled mid-flight, the rest good."""
    rng = random.Random(seed)
    tally: Counter = Counter()
    poison_status: dict[str, Counter] = {name: Counter() for name in POISON}
    errors: Counter = Counter()
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        deadline = time.monotonic() + seconds

        async def loop() -> None:
            while time.monotonic() < deadline:
                draw = rng.random()
                if draw < 0.05:
                    name = rng.choice(list(POISON))
                    try:
                        response = await client.post(f"{url}/retrieve", content=POISON[name], headers=headers)
                        poison_status[name][response.status_code] += 1
                    except httpx.HTTPError as exc:
                        poison_status[name][type(exc).__name__] += 1
                    continue
                queries = rng.sample(titles, rng.randint(1, 3))
                body = json.dumps({"queries": queries, "topk": 3, "return_scores": True})
                post = client.post(f"{url}/retrieve", content=body, headers=headers)
                if draw < 0.10:  # a client that goes away mid-request
                    try:
                        await asyncio.wait_for(post, rng.uniform(0.0005, 0.05))
                        tally["disconnect_too_late"] += 1
                    except TimeoutError:
                        tally["disconnected"] += 1
                    except httpx.HTTPError as exc:
                        errors[f"disconnect: {type(exc).__name__}"] += 1
                    continue
                start = time.perf_counter()
                try:
                    response = await post
                    ok = response.status_code == 200 and len(response.json()["result"]) == len(queries)
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    errors[type(exc).__name__] += 1
                    ok = False
                    response = None
                latencies.append(time.perf_counter() - start)
                tally["good"] += 1
                if not ok:
                    tally["good_failed"] += 1
                    if response is not None:
                        errors[f"status {response.status_code}: {response.text[:120]}"] += 1

        await asyncio.gather(*(loop() for _ in range(clients)))
    return {"tally": tally, "poison": poison_status, "errors": errors, "latencies": latencies}


def part3(args: argparse.Namespace, workdir: Path) -> list[Case]:
    corpus = workdir / "corpus.jsonl"
    titles = write_corpus(corpus, 2000)
    with retrieval_server(corpus, workdir) as (process, url):
        for _ in range(50):  # warm up
            httpx.post(f"{url}/retrieve", json={"queries": [random.choice(titles)], "topk": 3})
        rss_before = rss_mb(process.pid)
        start = time.perf_counter()
        load = asyncio.run(load_server(url, titles, args.clients, args.seconds, args.seed))
        wall = time.perf_counter() - start
        time.sleep(2)
        rss_after = rss_mb(process.pid)
        health = httpx.get(f"{url}/health", timeout=10).status_code
        after = httpx.post(f"{url}/retrieve", json={"queries": [titles[0]], "topk": 3}, timeout=10).status_code
    tally, poison = load["tally"], load["poison"]
    poisoned = sum(sum(c.values()) for c in poison.values())
    answered_422 = sum(c[422] for c in poison.values())
    answered_500 = sum(c[s] for c in poison.values() for s in c if isinstance(s, int) and s >= 500)
    lat = load["latencies"]
    common = {"clients": args.clients, "seconds": args.seconds, "corpus_passages": len(titles)}
    return [
        Case(3, f"server: good requests ({args.clients} clients, {args.seconds:g} s)", tally["good"],
             tally["good_failed"], wall, "0 failed", tally["good_failed"] == 0,
             common | {"requests_per_s": tally["good"] / wall, "p50_ms": 1000 * percentile(lat, 50),
                       "p99_ms": 1000 * percentile(lat, 99), "errors": dict(load["errors"]),
                       "health_after": health, "good_request_after": after}),
        Case(3, "server: poisoned requests → 422", poisoned, poisoned - answered_422, wall,
             "all 422, no 500", answered_422 == poisoned,
             {"answered_422": answered_422, "answered_5xx": answered_500,
              "by_kind": {k: {str(s): n for s, n in v.items()} for k, v in poison.items()}}),
        Case(3, "server: clients disconnecting mid-request", tally["disconnected"] + tally["disconnect_too_late"],
             0, wall, "server keeps serving (health 200 after)", health == 200 and after == 200,
             {"cancelled_in_flight": tally["disconnected"], "finished_before_cancel": tally["disconnect_too_late"]}),
        Case(3, "server: RSS before / after load (MB)", 1, 0, wall, "growth < 100 MB",
             rss_after - rss_before < 100, {"rss_before_mb": rss_before, "rss_after_mb": rss_after}),
    ]  # fmt: skip
