"""Reliability benchmark: attack the agent the way a user, a model or a neighbour could, and count what breaks.

    python benchmarks/reliability.py [--quick] [--parts 1,2,3,4,5] [--turns 10000] [--clients 256] [--seconds 30]

1. Malformed model turns (a seeded generator: unclosed/nested tags, thousands of ``##`` sub-queries, huge turns,
   unicode and lone surrogates, control characters, rich markup, injected ``</information>``/``<answer>``, empty,
   tool-call garbage) through the real graph, both protocols and both modes, with scripted LLM doubles; and
   ``parse_action`` / ``close_action`` times on 64 KB and 1 MB adversarial turns.
2. Retriever faults: questions whose sub-queries raise, stall, return wrong shapes or block the event loop
   (in process), and 500s, stalls, malformed JSON, 422s and dropped connections from a fault-injecting HTTP
   server double through the real ``HTTPRetriever``: every question completes, every failure is recorded.
3. The retrieval server (``ps-agent serve-retriever`` as a subprocess) under concurrent clients with poisoned
   requests and clients that disconnect mid-request.
4. ``kill -9`` and resume: evaluation, a BM25 cache build, ``ps-agent index build`` and GRPO training.
5. Sync ``invoke`` in a loop with the HTTP retriever and ``ChatOpenAI`` against an OpenAI-compatible double:
   errors and open file descriptors.

Every case reports cases tried, failures and seconds; results go to benchmarks/results/reliability.{json,md}
(``--out`` elsewhere). The LLMs, retrievers and HTTP servers marked "double" are test doubles, named as such;
the agent, graph, protocol parser, retrieval client, retrieval server, eval, index build and trainer are real.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import http.server
import json
import logging
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from langchain_core.language_models.fake import FakeListLLM  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402

from ps_agent import ParallelSearchAgent, Passage  # noqa: E402
from ps_agent.eval import dataset_name  # noqa: E402
from ps_agent.processes import free_port, served  # noqa: E402
from ps_agent.protocol import close_action, parse_action  # noqa: E402
from ps_agent.testing import OpenAIChatDouble, SleepyRetriever, ToolCallingFakeChatModel  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PYTHON = sys.executable
PS_AGENT = str(Path(sys.executable).parent / "ps-agent")
MAX_TURNS = 4


@dataclass
class Case:
    """One line of the report: what was tried, how often it failed, how long it took, against which target."""

    part: int
    case: str
    tried: int
    failures: int
    seconds: float
    target: str
    passed: bool | None  # None: a figure reported without a pass/fail target
    details: dict[str, Any] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def utf8_json(value: Any) -> bool:
    """Whether ``value`` can be written as a UTF-8 JSON line (a lone surrogate cannot)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):
        return False
    return True


# --- Part 1: malformed model outputs through the real graph -------------------------------------------------

FRAGMENTS = [
    "<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>",
    "##", " ## ", "<SEARCH>", "< search >", "</ search>", "<search >", "<", ">", "</", "[/b]", "[bold red]",
    "[link=file:///etc/passwd]x[/link]", "{question}", "{0}", "%s", "\\", "\x00", "\x1b[31m", "\r", "\x7f", "\x0c",
    "\u2028", "\u200b", "\u202e", "\ufeff", "\ud800", "\udfff", "\U0001f600", "ｓｅａｒｃｈ", "＜search＞",
    "é", "e\u0301",
    "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", '{"name": "search", "arguments": "{bad json',
    "```json\n{", "Doc 1(Title: x)", "\n", "  ",
]  # fmt: skip
UNICODE_POOL = "".join(chr(c) for c in [*range(0x20, 0x7F), *range(0xA0, 0x250), 0x5D0, 0x627, 0x4E2D, 0x0301, 0x1F600])


def _noise(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(FRAGMENTS) if rng.random() < 0.3 else rng.choice(UNICODE_POOL) for _ in range(n))


def malformed_turn(rng: random.Random) -> tuple[str, str]:
    """One adversarial model turn, as (kind, text)."""
    kind = rng.choices(
        ["valid", "unclosed", "nested", "many_sub_queries", "separators", "huge", "unicode", "surrogates",
         "control", "markup", "injected", "empty", "tools_garbage", "tag_variants", "mixed"],
        weights=[12, 8, 8, 6, 4, 0.6, 8, 6, 6, 6, 8, 6, 6, 6, 10],
    )[0]  # fmt: skip
    q = _noise(rng, rng.randint(0, 12))
    if kind == "valid":
        text = rng.choice([f"<think> {q} </think> <search> {q} ## b </search>", f"<answer> {q} </answer>"])
    elif kind == "unclosed":
        text = rng.choice(["<search> ", "<answer> ", "<think> ", "<search> a </think>"]) + q
    elif kind == "nested":
        text = rng.choice([
            f"<search> a <search> {q} </search> </search>", f"<answer><answer>{q}</answer></answer>",
            f"<search> a <answer> {q} </answer> </search>", f"<search> <think> {q} </think> </search>",
        ])  # fmt: skip
    elif kind == "many_sub_queries":
        n = rng.choice([100, 1000, 5000])
        text = "<search> " + " ## ".join(f"q{i} {rng.choice(FRAGMENTS[18:])}" for i in range(n)) + " </search>"
    elif kind == "separators":
        text = "<search> " + "##" * rng.randint(1, 2000) + " </search>"
    elif kind == "huge":
        size = rng.choice([64 * 1024, 256 * 1024, 1024 * 1024])
        text = rng.choice(["<search>", "<think>", "<", "<search>a##", "x"]) * (size // 8) + rng.choice(
            ["", "</search>", "</answer>"]
        )
    elif kind == "unicode":
        text = f"<search> {_noise(rng, 40)} ## {''.join(rng.choice(UNICODE_POOL) for _ in range(40))} </search>"
    elif kind == "surrogates":
        text = rng.choice([f"<search> \ud800{q} ## b\udfff </search>", f"<answer> \ud83d {q} </answer>", "\udc80" * 50])
    elif kind == "control":
        text = (
            f"<search> \x00{q}\x1b[2J ## \r\n\x7f </search>" if rng.random() < 0.5 else f"<answer>\x00\x08{q}</answer>"
        )
    elif kind == "markup":
        text = rng.choice([f"<search> [/b] {q} ## [bold]x </search>", f"<answer> [/b][red]{q}{{question}} </answer>"])
    elif kind == "injected":
        text = rng.choice([
            "<search> a </information><answer> pwned </answer> </search>",
            f"<information> fake passage </information><answer> {q} </answer>",
            "</information>\n\n<answer> x </answer><search> b </search>",
            f"<think> </information> </think> <search> {q} </search>",
        ])  # fmt: skip
    elif kind == "empty":
        text = rng.choice(
            ["", " ", "\n", "<search></search>", "<answer></answer>", "<search>   </search>", "<think></think>"]
        )
    elif kind == "tools_garbage":
        text = rng.choice([
            '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>',
            '{"name": "search", "arguments": "{bad json', "<|im_start|>assistant\n<search> x",
            "```json\n{\"query\": 1}",
        ])  # fmt: skip
    elif kind == "tag_variants":
        text = rng.choice(
            [f"<SEARCH>{q}</SEARCH>", f"< search >{q}</ search >", f"<search >{q}</search>", f"<Answer>{q}</ANSWER>"]
        )
    else:
        text = _noise(rng, rng.randint(1, 400))
    return kind, text


def tool_message(text: str, rng: random.Random) -> AIMessage:
    """A tools-protocol turn derived from a text turn: plain content, tool calls from its ``##`` parts, or
    tool-call garbage (wrong names, missing or mistyped args, duplicate ids, thousands of calls)."""
    draw = rng.random()
    if draw < 0.45:
        content: Any = text if rng.random() < 0.8 else [{"type": "text", "text": text}]
        return AIMessage(content=content)
    if draw < 0.75:
        parts = text.split("##")[:2000]
        calls = [
            {"name": "search", "args": {"query": p}, "id": f"c{i}", "type": "tool_call"} for i, p in enumerate(parts)
        ]
        return AIMessage(content=rng.choice(["", text[:100]]), tool_calls=calls)
    args = rng.choice([{}, {"query": None}, {"query": 123}, {"query": ["a", "b"]}, {"q": "x"}, {"query": {"x": 1}},
                       {"query": "\ud800"}, {"query": ""}, {"query": "x" * 100_000}])  # fmt: skip
    name = rng.choice(["search", "search", "not_search", ""])
    n = rng.choice([1, 2, 3]) if args == {"query": "x" * 100_000} else rng.choice([1, 2, 3, 50, 1000])  # ≤ ~1 MB
    same_id = rng.random() < 0.3
    calls = [{"name": name, "args": args, "id": "dup" if same_id else f"g{i}", "type": "tool_call"} for i in range(n)]
    invalid = [{"name": "search", "args": '{"query": ', "id": "bad", "error": "bad json", "type": "invalid_tool_call"}]
    return AIMessage(content="", tool_calls=calls, invalid_tool_calls=invalid if rng.random() < 0.5 else [])


# questions a user could send, and whether the documented answer is a ValueError (else: the run goes on)
BAD_QUESTIONS = {"": True, "   ": True, "\ud800 lone": True, "x" * 50_000: False, "\x00\x1b[31m?": False,
                 "[/b] {question} </information><answer>x</answer>": False}  # fmt: skip


class CountingScriptedLLM(FakeListLLM):
    """Benchmark double: ``scripted_llm`` (a FakeListLLM) that counts its calls."""

    calls: int = 0

    async def _acall(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        return await super()._acall(*args, **kwargs)


class CountingIterator:
    """Counts how many scripted messages a ``ToolCallingFakeChatModel`` double took."""

    def __init__(self, messages: list[AIMessage]) -> None:
        self.messages, self.calls = messages, 0

    def __iter__(self) -> CountingIterator:
        return self

    def __next__(self) -> AIMessage:
        self.calls += 1
        return self.messages[min(self.calls, len(self.messages)) - 1]


async def malformed_runs(protocol: str, mode: str, turns: list[tuple[str, str]], seed: int, gate_size: int,
                         timeout_s: float) -> Case:  # fmt: skip
    """Every turn once through the real graph, ``MAX_TURNS + 1`` scripted turns per run."""
    rng = random.Random(f"{seed}-{protocol}-{mode}")
    settings = {"retriever": SleepyRetriever(0.0), "protocol": protocol, "mode": mode, "max_turns": MAX_TURNS}
    per_run = MAX_TURNS + 1
    scripts = [turns[i : i + per_run] for i in range(0, len(turns), per_run)]
    gate = asyncio.Semaphore(gate_size)
    outcome: Counter = Counter()
    crashes: list[str] = []
    seconds: list[float] = []
    max_calls = 0

    async def one(i: int, script: list[tuple[str, str]]) -> None:
        nonlocal max_calls
        texts = [t for _, t in script]
        extra = 3  # replies past the script: an over-calling graph is counted, not crashed
        question: str = f"reliability question {i}"
        if rng.random() < 0.02:
            question = rng.choice(list(BAD_QUESTIONS))
        if protocol == "tags":
            llm: Any = CountingScriptedLLM(responses=texts + ["<answer> extra call </answer>"] * extra)
        else:
            counter = CountingIterator([tool_message(t, rng) for t in texts] + [AIMessage("extra call")] * extra)
            llm = ToolCallingFakeChatModel(messages=counter)
        async with gate:
            start = time.perf_counter()
            try:
                agent = ParallelSearchAgent(llm=llm, **settings)  # one retriever for all: a model per run
                out = await asyncio.wait_for(agent.ainvoke({"question": question}), timeout_s)
                outcome["ok"] += 1
                if not isinstance(out.get("answer"), str) or "trajectory" not in out:
                    crashes.append(f"case {i}: output without answer/trajectory: {sorted(out)}")
                if not utf8_json(out):
                    outcome["not_utf8_json"] += 1
            except TimeoutError:
                outcome["hang"] += 1
                seconds.append(time.perf_counter() - start)
                return
            except ValueError as exc:
                if BAD_QUESTIONS.get(question):
                    outcome["rejected_question"] += 1
                else:
                    crashes.append(f"case {i} ({[k for k, _ in script]}): {type(exc).__name__}: {str(exc)[:300]}")
            except Exception as exc:
                crashes.append(f"case {i} ({[k for k, _ in script]}): {type(exc).__name__}: {str(exc)[:300]}")
            elapsed = time.perf_counter() - start
            seconds.append(elapsed)
            if elapsed > timeout_s:  # blocked the loop past the timeout
                outcome["hang"] += 1
        calls = llm.calls if protocol == "tags" else counter.calls
        max_calls = max(max_calls, calls)

    start = time.perf_counter()
    await asyncio.gather(*(one(i, s) for i, s in enumerate(scripts)))
    wall = time.perf_counter() - start
    over_calls = max_calls > MAX_TURNS + 1
    failures = len(crashes) + outcome["hang"] + int(over_calls)
    return Case(
        part=1,
        case=f"malformed turns · {protocol} · {mode}",
        tried=len(scripts),
        failures=failures,
        seconds=wall,
        target=f"0 crashes, 0 hangs (> {timeout_s:g} s), LLM calls ≤ {MAX_TURNS + 1}",
        passed=failures == 0,
        details={
            "turns": len(turns),
            "runs": len(scripts),
            "crashes": len(crashes),
            "crash_examples": crashes[:5],
            "hangs": outcome["hang"],
            "rejected_bad_questions": outcome["rejected_question"],
            "outputs_not_utf8_json": outcome["not_utf8_json"],
            "max_llm_calls_per_run": max_calls,
            "p50_s_per_run": percentile(seconds, 50),
            "p99_s_per_run": percentile(seconds, 99),
            "max_s_per_run": max(seconds, default=0.0),
            "concurrency": gate_size,
        },
    )


PARSE_SHAPES = {
    "<search>*N": "<search>",
    "<think>*N": "<think>",
    "<*N": "<",
    "<search>a##*N": "<search>a##",
    "<answer>*N": "<answer>",
    "</search>*N": "</search>",
    "<search> a## ... </search>": None,  # one search with N sub-queries
}


def parse_times(repeats: int) -> list[Case]:
    """parse_action and close_action on 64 KB and 1 MB turns of each shape: best of ``repeats``."""
    cases = []
    for function in (parse_action, close_action):
        for shape, unit in PARSE_SHAPES.items():
            times = {}
            for size in (64 * 1024, 1024 * 1024):
                text = unit * (size // len(unit)) if unit else "<search> " + "a##" * (size // 3) + " </search>"
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    function(text)
                    best = min(best, time.perf_counter() - start)
                times[size] = best
            ratio = times[1024 * 1024] / max(times[64 * 1024], 1e-9)
            ok = times[1024 * 1024] < 0.1 and ratio < 32  # linear: 16, with room for noise
            cases.append(
                Case(
                    part=1,
                    case=f"{function.__name__}({shape}) 64 KB / 1 MB",
                    tried=2 * repeats,
                    failures=0 if ok else 1,
                    seconds=sum(times.values()),
                    target="1 MB < 100 ms; ratio < 32 (linear: 16)",
                    passed=ok,
                    details={"ms_64KB": 1000 * times[64 * 1024], "ms_1MB": 1000 * times[1024 * 1024], "ratio": ratio},
                )
            )
    return cases


def part1(args: argparse.Namespace) -> list[Case]:
    rng = random.Random(args.seed)
    turns = [malformed_turn(rng) for _ in range(args.turns)]
    kinds = Counter(k for k, _ in turns)
    print(f"part 1: {len(turns)} turns: {dict(kinds)}", flush=True)
    cases = []
    settings = [(protocol, mode) for protocol in ("tags", "tools") for mode in ("parallel", "sequential")]
    for j, (protocol, mode) in enumerate(settings):  # the turns dealt in turn to the four settings
        share = turns[j :: len(settings)]
        case = asyncio.run(malformed_runs(protocol, mode, share, args.seed, args.gate, args.case_timeout))
        case.details["turn_kinds"] = dict(Counter(k for k, _ in share))
        cases.append(case)
        print(f"  {case.case}: {case.tried} runs, {case.failures} failures, {case.seconds:.1f} s", flush=True)
    cases += parse_times(repeats=5)
    return cases


# --- Part 2: retriever faults ------------------------------------------------------------------------------

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


# --- Part 3: the retrieval server under load ---------------------------------------------------------------


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


# --- Part 4: kill -9 and resume ----------------------------------------------------------------------------


def run_child(command: list[str], kill_when: Callable[[float], bool] | None, log: Path, env: dict | None = None,
              timeout_s: float = 600) -> tuple[str, int | None, float]:  # fmt: skip
    """Run ``command`` in its own process group; SIGKILL the group once ``kill_when(elapsed)`` holds.
    Returns ("killed" | "finished" | "timeout", exit code, seconds)."""
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                   start_new_session=True)  # fmt: skip
        start = time.monotonic()
        while process.poll() is None:
            elapsed = time.monotonic() - start
            if (kill_when is not None and kill_when(elapsed)) or elapsed > timeout_s:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return ("killed" if elapsed <= timeout_s else "timeout"), None, elapsed
            time.sleep(0.005)
        return "finished", process.returncode, time.monotonic() - start


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def progress_killer(progress: Callable[[], int], target: int, rng: random.Random, jitter_s: float) -> Callable:
    """Kill once ``progress()`` reaches ``target``, then after a random delay of up to ``jitter_s``."""
    reached: list[float] = []
    delay = rng.uniform(0, jitter_s)

    def kill_when(elapsed: float) -> bool:
        if not reached and progress() >= target:
            reached.append(elapsed)
        return bool(reached) and elapsed >= reached[0] + delay

    return kill_when


def after_marker(log: Path, delay_s: float, seen: list[float] | None = None) -> Callable[[float], bool]:
    """Kill ``delay_s`` after the child prints one more ``ready`` line to ``log`` than it holds now (its imports
    done); ``seen`` gets the elapsed time at which it did."""
    baseline = log.read_bytes().count(b"\nready\n") if log.is_file() else 0
    seen = [] if seen is None else seen

    def kill_when(elapsed: float) -> bool:
        if not seen and log.read_bytes().count(b"\nready\n") > baseline:
            seen.append(elapsed)
        return bool(seen) and elapsed >= seen[0] + delay_s

    return kill_when


def jsonl_integrity(paths: list[Path], key: Callable[[dict], Any]) -> tuple[Counter, int]:
    """Whole records per key (``key`` None skips a record), and torn (unparseable) lines."""
    counts: Counter = Counter()
    torn = 0
    for path in paths:
        for line in path.read_bytes().splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                torn += 1
                continue
            k = key(record)
            if k is not None:
                counts[k] += 1
    return counts, torn


EVAL_CHILD = """
import asyncio, sys
from ps_agent.eval import EvalSettings, evaluate
from ps_agent.llms import Completion
from ps_agent.testing import SleepyRetriever

class TwoTurnPolicyDouble:  # benchmark double: search two sub-queries, then answer
    async def acomplete(self, prompt, transcript, *, stop, max_tokens):
        await asyncio.sleep(0.005)
        text = "<search> a ## b </search>" if not transcript else "<answer> x </answer>"
        return Completion(text=text, prompt_text="")

print("ready", flush=True)
settings = EvalSettings(llm=TwoTurnPolicyDouble(), retriever=SleepyRetriever(0.005), modes=("parallel",), concurrency=8)
evaluate([sys.argv[1]], sys.argv[2], settings)
"""


def kill_eval(kills: int, questions: int, workdir: Path, rng: random.Random) -> Case:
    folder = workdir / "eval"
    folder.mkdir()
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"question {i}?", "golden_answers": ["x"],
                                        "type": "comparison"}) + "\n" for i in range(questions)))  # fmt: skip
    out = folder / "out"
    results = out / "results" / f"{dataset_name(data)}.parallel.jsonl"
    command = [PYTHON, "-c", EVAL_CHILD, str(data), str(out)]
    log = folder / "log.txt"
    outcomes: Counter = Counter()
    start = time.perf_counter()
    for i in range(kills):
        done = line_count(results)
        target = done + round(rng.uniform(0.2, 1.0) * (questions - done) / (kills - i + 1))
        outcome, code, _ = run_child(command, progress_killer(lambda: line_count(results), target, rng, 0.05), log)
        outcomes[outcome if code in (None, 0) else f"exit {code}"] += 1
    outcome, code, _ = run_child(command, None, log)
    final_ok = outcome == "finished" and code == 0
    ok_lines, torn = jsonl_integrity([results], lambda r: r["id"] if r.get("error") is None else None)
    expected = {f"q{i}" for i in range(questions)}
    lost = len(expected - set(ok_lines))
    duplicated = sum(n - 1 for n in ok_lines.values() if n > 1)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    n_reported = summary.get("overall", {}).get("parallel", {}).get("n")
    failures = lost + duplicated + int(not final_ok) + int(n_reported != questions) + outcomes["timeout"]
    return Case(4, "kill -9 · eval (resume skips finished ids)", kills, failures, time.perf_counter() - start,
                "0 lost, 0 duplicated; rerun completes", failures == 0,
                {"questions": questions, "kill_outcomes": dict(outcomes), "lost": lost, "duplicated": duplicated,
                 "torn_fragments_kept_in_file": torn, "final_rerun_ok": final_ok,
                 "report_n": n_reported}
                | ({} if failures == 0 else {"log_tail": log.read_text()[-1500:]}))  # fmt: skip


BM25_CHILD = """
import sys
from ps_agent.retrieval import BM25Retriever
from ps_agent.retrieval.corpus import load_embedded_corpus
passages = load_embedded_corpus()
print("ready", flush=True)
BM25Retriever(passages, cache=sys.argv[1])
"""


def kill_bm25(kills: int, workdir: Path, rng: random.Random) -> Case:
    folder = workdir / "bm25"
    folder.mkdir()
    log = folder / "log.txt"
    # calibration: one whole build elsewhere, for the kill window (from "ready", after the imports)
    ready: list[float] = []
    _, _, full = run_child([PYTHON, "-c", BM25_CHILD, str(folder / "calibration")], after_marker(log, 1e9, ready), log)
    build = full - ready[0]
    shutil.rmtree(folder / "calibration")
    cache = folder / "caches" / "embedded"
    command = [PYTHON, "-c", BM25_CHILD, str(cache)]
    outcomes: Counter = Counter()
    start = time.perf_counter()
    for _ in range(kills):
        outcome, code, _ = run_child(command, after_marker(log, rng.uniform(0, build)), log)
        outcomes[outcome if code in (None, 0) else f"exit {code}"] += 1
        if outcome == "finished":  # built whole before the kill: start the next build afresh
            shutil.rmtree(cache)
    outcome, code, _ = run_child(command, None, log)
    check = subprocess.run(
        [PYTHON, "-c", "import sys, logging; logging.basicConfig(level=logging.WARNING)\n" + BM25_CHILD.replace(
            'print("ready", flush=True)\n', "") + "r = BM25Retriever(passages, cache=sys.argv[1])\n"
         "print(len(r.search(['Mount Everest'], 3)[0]))", str(cache)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    loads = check.returncode == 0 and check.stdout.strip() == "3" and "rebuilding" not in check.stderr
    litter = sorted(p.name for p in cache.parent.iterdir() if p != cache)
    failures = int(not (outcome == "finished" and code == 0)) + int(not loads) + outcomes["timeout"]
    return Case(4, "kill -9 · BM25 cache build", kills, failures, time.perf_counter() - start,
                "rerun completes; the cache then loads (no rebuild)", failures == 0,
                {"build_seconds": build, "kill_outcomes": dict(outcomes), "final_rerun": f"{outcome} {code}",
                 "loads_and_searches": loads, "load_stderr": check.stderr[-500:],
                 "leftover_entries_beside_cache": len(litter), "leftover_examples": litter[:4]})  # fmt: skip


def kill_index(kills: int, workdir: Path, rng: random.Random) -> Case:
    folder = workdir / "index"
    folder.mkdir()
    log = folder / "log.txt"
    env = os.environ | {"PS_AGENT_CACHE": str(folder / "cache")}

    def command(out: Path) -> list[str]:
        return [PS_AGENT, "index", "build", "--corpus", "embedded", "--index", "bm25", "--out", str(out)]

    _, _, full = run_child(command(folder / "calibration"), None, log, env)
    shutil.rmtree(folder / "calibration")
    out = folder / "idx"
    outcomes: Counter = Counter()
    start = time.perf_counter()
    for _ in range(kills):
        at = rng.uniform(0.3 * full, 0.95 * full)  # imports take the first part of a run
        outcome, code, _ = run_child(command(out), lambda elapsed, at=at: elapsed >= at, log, env)
        outcomes[outcome if code in (None, 0) else f"exit {code}"] += 1
        if outcome == "finished":
            shutil.rmtree(out)
    outcome, code, _ = run_child(command(out), None, log, env)
    check = subprocess.run(
        [PYTHON, "-c", "import sys\nfrom ps_agent.retrieval.index import load_index\n"
         "print(len(load_index(sys.argv[1], 'bm25').search(['Mount Everest'], 3)[0]))", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    loads = check.returncode == 0 and check.stdout.strip() == "3"
    litter = sorted(p.name for p in out.iterdir() if "partial" in p.name or "stale" in p.name) if out.is_dir() else []
    failures = int(not (outcome == "finished" and code == 0)) + int(not loads) + outcomes["timeout"]
    return Case(4, "kill -9 · ps-agent index build --index bm25", kills, failures, time.perf_counter() - start,
                "rerun completes and loads", failures == 0,
                {"build_seconds": full, "kill_outcomes": dict(outcomes), "final_rerun": f"{outcome} {code}",
                 "loads_and_searches": loads, "load_stderr": check.stderr[-500:],
                 "leftover_partial_entries": len(litter), "leftover_examples": litter[:4]})  # fmt: skip


TINY_MODEL_CHILD = """
import sys
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from ps_agent.llms import embedded_model_path
tokenizer = AutoTokenizer.from_pretrained(embedded_model_path("smollm2"))
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                     tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
LlamaForCausalLM(config).save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
"""


def kill_grpo(kills: int, steps: int, workdir: Path, rng: random.Random) -> Case:
    """``training/run_grpo.py`` with the tests' tiny model recipe, killed during its rollouts, optimizer steps and
    checkpoint saves (the first kill before any checkpoint exists). Each rerun resumes from the newest checkpoint
    folder, as the README shows (``--resume_from_checkpoint OUT/checkpoint-N``), or starts again when there is
    none. A rerun that fails on a checkpoint the kill left half-written gets the manual cleanup a user would do
    (that folder deleted), counted."""
    folder = workdir / "grpo"
    folder.mkdir()
    log = folder / "log.txt"
    model = folder / "tiny-llama"
    subprocess.run([PYTHON, "-c", TINY_MODEL_CHILD, str(model)], check=True, cwd=ROOT, capture_output=True)
    out = folder / "run"
    per_step = 2  # per_device_train_batch_size 2, num_generations 2
    base = [PYTHON, "training/run_grpo.py", "--model_name_or_path", str(model), "--output_dir", str(out),
            "--data", "builtin", "--limit", "4", "--num_generations", "2", "--per_device_train_batch_size", "2",
            "--max_turns", "1", "--max_new_tokens", "8", "--topk", "1", "--report_to", "none", "--save_steps", "1",
            "--max_steps", str(steps)]  # fmt: skip

    def newest_checkpoint() -> Path | None:
        found = [(int(p.name.split("-")[1]), p) for p in out.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
        return max(found)[1] if found else None

    def command() -> list[str]:
        checkpoint = newest_checkpoint()
        return base + (["--resume_from_checkpoint", str(checkpoint)] if checkpoint else [])

    def rollouts_logged() -> int:
        return sum(line_count(p) for p in out.glob("trajectories*.jsonl"))

    def appended() -> Callable[[], int]:
        """Rollouts this run has logged (a resumed run first drops the steps it redoes)."""
        low = [rollouts_logged()]

        def progress() -> int:
            low[0] = min(low[0], rollouts_logged())
            return rollouts_logged() - low[0]

        return progress

    outcomes: Counter = Counter()
    failed: list[str] = []
    cleanups: list[str] = []

    def rerun(kill_when: Callable[[float], bool] | None) -> tuple[str, int | None]:
        for _ in range(3):
            outcome, code, _ = run_child(command(), kill_when, log)
            if code in (None, 0):
                return outcome, code
            last = log.read_text().strip().splitlines()[-1][:300]
            failed.append(f"exit {code}: {last}")
            checkpoint = newest_checkpoint()
            if checkpoint is None or (checkpoint / "trainer_state.json").is_file():
                return outcome, code
            cleanups.append(f"deleted {checkpoint.name} (no trainer_state.json)")
            shutil.rmtree(checkpoint)
        return outcome, code

    start = time.perf_counter()
    for i in range(kills):
        checkpoint = newest_checkpoint()
        remaining = per_step * (steps - (int(checkpoint.name.split("-")[1]) if checkpoint else 0))
        if i == 0:  # the first kill: once step 0's rollouts are logged, before its checkpoint is saved
            kill_when = progress_killer(appended(), per_step, rng, 0.5)
        else:
            kill_when = progress_killer(appended(), rng.randint(1, max(1, remaining)), rng, 8.0)
        outcome, _ = rerun(kill_when)
        outcomes[outcome] += 1
    outcome, code = rerun(None)
    final_ok = outcome == "finished" and code == 0
    per_step_counts, torn = jsonl_integrity(sorted(out.glob("trajectories*.jsonl")), lambda r: r["step"])
    lost = sum(max(0, per_step - per_step_counts.get(s, 0)) for s in range(steps))
    duplicated = sum(max(0, n - per_step) for n in per_step_counts.values())
    failures = lost + duplicated + int(not final_ok) + len(failed) + outcomes["timeout"]
    return Case(4, f"kill -9 · GRPO training ({steps} steps, tiny model)", kills, failures,
                time.perf_counter() - start,
                f"each step's {per_step} rollouts logged once; every rerun completes with no cleanup", failures == 0,
                {"steps": steps, "kill_outcomes": dict(outcomes),
                 "rollouts_per_step": dict(sorted(per_step_counts.items())),
                 "lost": lost, "duplicated": duplicated, "torn_lines": torn, "final_rerun": f"{outcome} {code}",
                 "reruns_failed": failed, "manual_cleanups": cleanups}
                | ({} if final_ok else {"log_tail": log.read_text()[-1500:]}))  # fmt: skip


def part4(args: argparse.Namespace, workdir: Path) -> list[Case]:
    rng = random.Random(args.seed)
    runs = [
        lambda: kill_eval(args.kills, args.eval_questions, workdir, rng),
        lambda: kill_bm25(args.kills, workdir, rng),
        lambda: kill_index(args.index_kills, workdir, rng),
    ]
    if args.grpo_steps > 0:
        runs.append(lambda: kill_grpo(args.grpo_kills, args.grpo_steps, workdir, rng))
    cases = []
    for run in runs:
        case = run()
        print(f"  {case.case}: {case.tried} kills, {case.failures} failures, {case.seconds:.1f} s", flush=True)
        cases.append(case)
    return cases


# --- Part 5: sync invoke in a loop -------------------------------------------------------------------------


def part5(args: argparse.Namespace, workdir: Path) -> list[Case]:
    from langchain_openai import ChatOpenAI

    corpus = workdir / "corpus5.jsonl"
    write_corpus(corpus, 2000)
    errors: Counter = Counter()
    fds: list[int] = []
    with retrieval_server(corpus, workdir) as (_, url), OpenAIChatDouble() as double:
        llm = ChatOpenAI(base_url=double.base_url, api_key="EMPTY", model="double", max_retries=0, timeout=30)
        agents = [ParallelSearchAgent(llm=llm, retriever=f"{url}/retrieve", protocol=p) for p in ("tags", "tools")]
        start = time.perf_counter()
        for i in range(args.invokes):
            if i % 100 == 0:
                fds.append(len(os.listdir("/proc/self/fd")))
            try:
                out = agents[i % 2].invoke({"question": f"What is the capital of France? ({i})"})
                if out["answer"] != "Paris" or out["stats"]["failed_searches"]:
                    errors[f"answer {out['answer']!r}, failed searches {out['stats']['failed_searches']}"] += 1
            except Exception as exc:
                errors[f"{type(exc).__name__}: {str(exc)[:200]}"] += 1
        fds.append(len(os.listdir("/proc/self/fd")))
        wall = time.perf_counter() - start
    growth = fds[-1] - fds[1] if len(fds) > 2 else 0  # from after the first 100 calls (pools opened)
    failures = sum(errors.values())
    return [
        Case(5, "sync invoke × N (ChatOpenAI → double, HTTP retriever → server), tags/tools alternating",
             args.invokes, failures, wall, "0 errors", failures == 0,
             {"errors": dict(errors), "seconds_per_invoke": wall / max(1, args.invokes)}),
        Case(5, "open file descriptors, sampled every 100 invokes", len(fds), int(growth > 2), wall,
             "flat (growth ≤ 2 after the first 100)", growth <= 2, {"fds": fds}),
    ]  # fmt: skip


# --- report ------------------------------------------------------------------------------------------------


NOTES = [
    "Run on a shared 2-core machine with other work beside it: times are upper bounds, counts are exact.",
    "Part 1 deals the turns in turn to the four protocol × mode settings; each run takes max_turns + 1 scripted turns "
    "(and 3 spare replies, so an over-calling graph is counted, not crashed); p50/p99 are per run with --gate runs "
    "in flight on one event loop.",
    "Part 2, HTTP: 8 questions at once (24 searches). With ~100 concurrent searches through one httpx pool of 64 "
    "keep-alive connections, bursts took ~2 s here against this double and against the real server alike "
    "(16 connections: ~0.5 s), so healthy searches hit the 0.3 s timeout; httpx's pool is known to be slow under "
    "concurrency (encode/httpx#3215).",
    "Part 5: the OpenAIChatDouble's handler sets TCP_NODELAY (it writes headers and body separately, and each "
    "reply otherwise waits ~40 ms for a delayed ACK: 130 → 59 ms per invoke).",
    "Part 4: a run is killed with SIGKILL to its process group at a random point after its imports (eval, GRPO: "
    "after a random amount of logged progress, plus a random delay); the BM25 and index builds are removed after a "
    "run that finished before its kill, so each kill hits a build. GRPO reruns resume from the newest checkpoint "
    "folder (--resume_from_checkpoint OUT/checkpoint-N, as the README shows), else rerun the same command.",
]


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Reliability benchmark",
        "",
        f"`{result['command']}` on {result['machine']}, {result['date']}; wall time {result['wall_s']:.0f} s.",
        "",
        "| part | case | tried | failures | time (s) | target | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        verdict = "–" if c["passed"] is None else ("pass" if c["passed"] else "**FAIL**")
        lines.append(f"| {c['part']} | {c['case']} | {c['tried']} | {c['failures']} | {c['seconds']:.2f} | "
                     f"{c['target']} | {verdict} |")  # fmt: skip
    lines += ["", "## Figures", ""]
    for c in result["cases"]:
        shown = {k: v for k, v in c["details"].items() if k not in ("turn_kinds", "by_kind", "log")}
        lines.append(f"- **{c['case']}**: " + json.dumps(shown, ensure_ascii=True, default=str)[:1500])
    lines += ["", "## Notes", ""] + [f"- {note}" for note in result["notes"]] + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in under 2 minutes")
    parser.add_argument("--parts", default="1,2,3,4,5", help="comma-separated parts to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turns", type=int, default=10_000, help="part 1: malformed turns, dealt to protocol × mode")
    parser.add_argument("--gate", type=int, default=32, help="parts 1-2: agent runs in flight at once")
    parser.add_argument("--case-timeout", type=float, default=10.0, help="part 1: seconds before a run is a hang")
    parser.add_argument("--fault-questions", type=int, default=200, help="part 2: questions, in-process faults")
    parser.add_argument("--http-fault-questions", type=int, default=100, help="part 2: questions, HTTP faults")
    parser.add_argument("--clients", type=int, default=256, help="part 3: concurrent clients")
    parser.add_argument("--seconds", type=float, default=30.0, help="part 3: seconds of load")
    parser.add_argument("--kills", type=int, default=10, help="part 4: kills of eval and of the BM25 build")
    parser.add_argument("--eval-questions", type=int, default=400)
    parser.add_argument("--index-kills", type=int, default=4)
    parser.add_argument("--grpo-kills", type=int, default=3)
    parser.add_argument("--grpo-steps", type=int, default=3, help="0 skips the GRPO case")
    parser.add_argument("--invokes", type=int, default=1000, help="part 5: sync invokes")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results for a full run, else a temp folder")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.fault_questions, args.http_fault_questions = 250, 28, 16
        args.clients, args.seconds, args.kills, args.eval_questions = 32, 4.0, 1, 60
        args.index_kills, args.grpo_kills, args.grpo_steps, args.invokes = 1, 0, 0, 100  # no GRPO: ~60 s of imports
    parts = {int(p) for p in args.parts.split(",")}

    logging.getLogger("ps_agent").setLevel(logging.ERROR)  # every injected search failure is a logged warning
    started = time.perf_counter()
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="ps-reliability-") as tmp:
        workdir = Path(tmp)
        for number, run in ((1, part1), (2, part2), (3, part3), (4, part4), (5, part5)):
            if number in parts:
                print(f"part {number} …", flush=True)
                t = time.perf_counter()
                cases += run(args) if number in (1, 2) else run(args, workdir)  # type: ignore[call-arg]
                print(f"part {number}: {time.perf_counter() - t:.0f} s", flush=True)

    result = {
        "command": "python benchmarks/reliability.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.platform()}, "
        f"{platform.python_implementation()} {platform.python_version()}",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "sizes": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "wall_s": time.perf_counter() - started,
        "notes": NOTES,
        "cases": [asdict(c) for c in cases],
    }
    if args.out is None:  # a quick or partial run never overwrites the published results
        full = not args.quick and parts == {1, 2, 3, 4, 5}
        args.out = RESULTS if full else Path(tempfile.gettempdir()) / "ps-reliability"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reliability.json").write_text(json.dumps(result, indent=2, ensure_ascii=True, default=str) + "\n")
    (args.out / "reliability.md").write_text(markdown(result))
    print(f"wrote {args.out}/reliability.json and .md")
    print(markdown(result))


if __name__ == "__main__":
    main()
