"""Part 2: retriever faults in process and from a fault-injecting HTTP server double: every question completes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import random
import socket
import threading
import time
from collections import Counter
from typing import Any

from langchain_core.language_models.fake import FakeListLLM
from langchain_core.messages import AIMessage

from benchmarks.attacks import MAX_TURNS, Case, percentile
from ps_agent import ParallelSearchAgent, Passage
from ps_agent.testing import ToolCallingFakeChatModel

# persistent faults: the sub-query fails on every attempt and must be recorded in the trajectory
FAULTS = ["raise", "stall", "none", "empty_list", "nested_none", "string", "strings", "two_lists", "dict",
          "not_awaitable", "block_then_raise", "raise_in_call", "raise_cancelled"]  # fmt: skip
# faults the agent should absorb: a transient error (retried) and a loop-blocking search that does answer
RECOVERABLE = ["transient", "block_then_ok"]
HTTP_FAULTS = ["500", "stall", "malformed_json", "422", "wrong_schema", "drop_connection", "502_html", "429"]
TIMEOUT_S, BLOCK_S, STALL_S = 0.3, 0.1, 2.0


class FaultyRetrieverDouble:
    """Benchmark double: a retriever whose fault is named in the query (``... fault=KIND``)."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()

    def asearch(self, queries: list[str], k: int) -> Any:  # not async: "not_awaitable" returns a plain list
        fault = queries[0].rsplit("fault=", 1)[-1] if "fault=" in queries[0] else None
        if fault == "not_awaitable":
            return [[Passage("x", "x", "x")]]
        if fault == "raise_in_call":
            raise RuntimeError("raised before returning a coroutine")
        return self._asearch(queries, k, fault)

    async def _asearch(self, queries: list[str], k: int, fault: str | None) -> Any:
        self.seen[queries[0]] += 1
        good = [[Passage(f"{q}#{i}", f"T {q}", f"text {i}", 1.0) for i in range(k)] for q in queries]
        if fault == "raise":
            raise ConnectionError("backend down")
        if fault == "raise_cancelled":  # e.g. a client whose own internal task was cancelled
            raise asyncio.CancelledError("the backend's request task was cancelled")
        if fault == "stall":
            await asyncio.sleep(STALL_S)
        if fault in ("block_then_raise", "block_then_ok"):
            time.sleep(BLOCK_S)  # blocks the event loop, as a sync client inside an async method would
            if fault == "block_then_raise":
                raise RuntimeError("sync client failed")
        if fault == "transient" and self.seen[queries[0]] == 1:
            raise TimeoutError("first attempt fails")
        return {
            "none": None, "empty_list": [], "nested_none": [[None]], "string": "passages", "strings": [["a", "b"]],
            "two_lists": good * 2, "dict": {"result": good},
        }.get(fault, good)  # fmt: skip


class FaultyHTTPServerDouble:
    """Benchmark double: a Search-R1 ``/retrieve`` server on 127.0.0.1 whose fault is named in the query."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stalls

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                query = body["queries"][0]
                fault = query.rsplit("fault=", 1)[-1] if "fault=" in query else None
                if fault == "drop_connection":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "stall":
                    time.sleep(STALL_S)
                status, payload, kind = 200, None, "application/json"
                hits = [{"document": {"id": f"{q}#{i}", "contents": f'"T {q}"\ntext {i}'}, "score": 1.0}
                        for q in body["queries"] for i in range(body["topk"])]  # fmt: skip
                if fault in ("500", "422", "429"):
                    status, payload = int(fault), {"detail": f"injected {fault}"}
                elif fault == "malformed_json":
                    payload = '{"result": [[{"document": '
                elif fault == "wrong_schema":
                    payload = {"result": [[{"doc": {}}]]}
                elif fault == "502_html":
                    status, payload, kind = 502, "<html><body>Bad Gateway</body></html>", "text/html"
                else:
                    payload = {"result": [hits]}
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                with contextlib.suppress(OSError):  # the client timed out and went away
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 256  # the default listen backlog of 5 drops concurrent connects
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out and reset the connection: expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/retrieve"

    def __enter__(self) -> FaultyHTTPServerDouble:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def fault_plan(questions: int, faults: list[str], rate: float, seed: int, per_question: int = 3) -> list[list[str]]:
    """Sub-queries per question; ``rate`` of them carry a fault, the kinds in turn."""
    rng = random.Random(seed)
    slots = [(q, s) for q in range(questions) for s in range(per_question)]
    faulty = set(rng.sample(slots, round(rate * len(slots))))
    kinds = iter(faults * len(slots))
    return [
        [f"question {q} part {s}" + (f" fault={next(kinds)}" if (q, s) in faulty else "") for s in range(per_question)]
        for q in range(questions)
    ]


async def fault_runs(name: str, retriever: Any, plan: list[list[str]], gate_size: int) -> Case:
    """Each question searches its sub-queries (one round in parallel mode), then answers; check the record."""
    gate = asyncio.Semaphore(gate_size)
    settings = {"retriever": retriever, "search_timeout_s": TIMEOUT_S, "search_retries": 2, "search_backoff_s": 0.02,
                "max_turns": MAX_TURNS}  # fmt: skip
    tally: Counter = Counter()
    problems: list[str] = []
    by_kind: dict[str, Counter] = {}
    seconds: list[float] = []

    async def one(i: int, sub_queries: list[str]) -> None:
        protocol = "tags" if i % 2 == 0 else "tools"
        if protocol == "tags":
            llm: Any = FakeListLLM(responses=[f"<search> {' ## '.join(sub_queries)} </search>", "<answer> x </answer>"])
        else:
            calls = [{"name": "search", "args": {"query": q}, "id": f"c{j}", "type": "tool_call"}
                     for j, q in enumerate(sub_queries)]  # fmt: skip
            llm = ToolCallingFakeChatModel(messages=iter([AIMessage(content="", tool_calls=calls), AIMessage("x")]))
        async with gate:
            start = time.perf_counter()
            try:
                agent = ParallelSearchAgent(llm=llm, protocol=protocol, **settings)  # a model per run
                out = await asyncio.wait_for(agent.ainvoke({"question": f"q{i}"}), 60)
            except Exception as exc:
                tally["incomplete"] += 1
                problems.append(f"question {i} ({protocol}): {type(exc).__name__}: {str(exc)[:300]}")
                return
            finally:
                seconds.append(time.perf_counter() - start)
        tally["completed"] += 1
        results = {r["sub_query"]: r for rnd in out["trajectory"]["search_rounds"] for r in rnd["results"]}
        for query in sub_queries:
            kind = query.rsplit("fault=", 1)[-1] if "fault=" in query else "healthy"
            counts = by_kind.setdefault(kind, Counter())
            result = results.get(query)
            if result is None:
                counts["not_searched"] += 1
                problems.append(f"question {i}: {query!r} has no result record")
                continue
            expect_error = kind not in ("healthy", *RECOVERABLE)
            got_error = result["error"] is not None
            counts["recorded" if got_error else "clean"] += 1
            counts[f"attempts={result['attempts']}"] += 1
            if expect_error and not got_error:
                problems.append(f"question {i}: injected {kind} not recorded ({result})")
            if got_error and not expect_error:
                problems.append(f"question {i}: {kind} sub-query failed: {result['error']}")

    start = time.perf_counter()
    await asyncio.gather(*(one(i, sq) for i, sq in enumerate(plan)))
    wall = time.perf_counter() - start
    planned = sum(1 for p in plan for q in p if "fault=" in q and q.rsplit("fault=", 1)[-1] not in RECOVERABLE)
    injected = sum(c["recorded"] + c["clean"] for k, c in by_kind.items() if k not in ("healthy", *RECOVERABLE))
    recorded = sum(c["recorded"] for k, c in by_kind.items() if k not in ("healthy", *RECOVERABLE))
    collateral = sum(c["recorded"] for k, c in by_kind.items() if k in ("healthy", *RECOVERABLE))
    failures = tally["incomplete"] + (injected - recorded) + collateral
    return Case(
        part=2,
        case=name,
        tried=len(plan),
        failures=failures,
        seconds=wall,
        target="every question completes; recorded = injected; 0 healthy sub-queries failed",
        passed=failures == 0,
        details={
            "questions": len(plan),
            "completed": tally["completed"],
            "sub_queries": sum(len(p) for p in plan),
            "injected_faults": planned,
            "injected_in_completed_questions": injected,
            "recorded_failures": recorded,
            "healthy_or_recoverable_failed": collateral,
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "problems": problems[:8],
            "p99_s_per_question": percentile(seconds, 99),
            "search_timeout_s": TIMEOUT_S,
        },
    )


def part2(args: argparse.Namespace) -> list[Case]:
    plan = fault_plan(args.fault_questions, FAULTS + RECOVERABLE, 0.3, args.seed)
    cases = [asyncio.run(fault_runs("retriever faults (in process)", FaultyRetrieverDouble(), plan, args.gate))]
    with FaultyHTTPServerDouble() as server:
        plan = fault_plan(args.http_fault_questions, HTTP_FAULTS, 0.3, args.seed + 1)
        # 8 questions at once: this threaded double slows to ~1 s per request with ~100 keep-alive connections,
        # which would time healthy searches out (a limit of the double, not of the client)
        case = asyncio.run(fault_runs("HTTP faults (HTTPRetriever → fault server double)", server.url, plan, 8))
    attempts_422 = case.details["by_kind"].get("422", {})
    case.details["note_422"] = (
        "a 422 is RetrievalRejected (transient = False: 'not retried'); attempts per 422 sub-query: "
        f"{ {k: v for k, v in attempts_422.items() if k.startswith('attempts')} }"
    )
    cases.append(case)
    for c in cases:
        print(f"  {c.case}: {c.tried} questions, {c.failures} failures, {c.seconds:.1f} s", flush=True)
    return cases
