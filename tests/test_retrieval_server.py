"""The retrieval server, started for real on 127.0.0.1, exercised with Search-R1's JSON and with the client."""

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from ps_agent import ParallelSearchAgent
from ps_agent.processes import free_port, served
from ps_agent.retrieval.base import Passage
from ps_agent.retrieval.http import HTTPRetriever, RetrievalRejected
from ps_agent.retrieval.index import build_index
from ps_agent.retrieval.limits import protocol_for
from ps_agent.retrieval.server import ServerLimits, create_app
from ps_agent.testing import scripted_llm
from tests.test_retrieval import DOCS

PS_AGENT = str(Path(sys.executable).parent / "ps-agent")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                            for i, (t, x) in enumerate(DOCS.items())))  # fmt: skip
    return path


@contextlib.contextmanager
def retrieval_server(source, tmp_path, *flags) -> Iterator[str]:
    """``ps-agent serve-retriever`` over a corpus file (BM25) or a built index folder: its URL, for the block."""
    port = free_port()
    where = ["--index", str(source)] if source.is_dir() else ["--corpus", str(source)]
    command = [PS_AGENT, "serve-retriever", *where, "--port", str(port), *flags]
    with served(command, f"http://127.0.0.1:{port}/health", tmp_path / f"server-{port}.log"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server(corpus, tmp_path_factory):
    with retrieval_server(corpus, tmp_path_factory.mktemp("server"), "--max-wait-ms", "20") as url:
        yield url


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))


def test_search_r1_json(server):
    body = {"queries": ["Eiffel Tower completed", "amphitheatre in Rome"], "topk": 2, "return_scores": True}
    response = httpx.post(f"{server}/retrieve", json=body)
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == 2 and len(result[0]) <= 2
    assert result[0][0]["document"]["contents"].startswith('"Eiffel Tower"\n')
    assert isinstance(result[0][0]["score"], float)
    plain = httpx.post(f"{server}/retrieve", json=body | {"return_scores": False}).json()["result"]
    assert set(plain[1][0]) == {"id", "contents"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"queries": ["q"] * 5000, "topk": 3}, "at most 4096 items"),
        ({"queries": ["q"], "topk": 0}, "greater than or equal to 1"),
        ({"queries": ["q"], "topk": 1000}, "topk 1000 out of bounds"),
        ({"queries": ["q"], "topk": "3"}, "valid integer"),
        ({"queries": ["q"], "topk": True}, "valid integer"),
        ({"queries": ["q"], "return_scores": "yes"}, "valid boolean"),
        ({"queries": [3]}, "valid string"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message_and_the_server_keeps_serving(server, body, message):
    response = httpx.post(f"{server}/retrieve", json=body)
    assert 400 <= response.status_code < 500 and message in response.text
    assert httpx.post(f"{server}/retrieve", content=b"{not json").status_code == 422
    assert httpx.post(f"{server}/retrieve", json={"queries": ["Big Ben"], "topk": 1}).status_code == 200


POISON = b'{"queries": ["Big Ben \\ud800"], "topk": 1}'  # a lone surrogate: a str no tokenizer takes


def test_a_query_that_is_not_unicode_gets_a_422_and_the_client_is_told_not_to_retry(server):
    response = httpx.post(f"{server}/retrieve", content=POISON, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == (
        "Value error, query 0 holds '\\ud800' at character 8 (surrogates not allowed): expected text encodable as UTF-8"
    )
    client = HTTPRetriever(server)
    with pytest.raises(RetrievalRejected, match=r"422: body\.queries: Value error, query 0 holds"):
        asyncio.run(client.asearch(["Big Ben \ud800"], 1))
    with pytest.raises(RetrievalRejected, match=r"topk 1000 out of bounds: expected 1\.\.100"):
        asyncio.run(client.asearch(["Big Ben"], 1000))
    assert RetrievalRejected.transient is False


@pytest.mark.parametrize("suffix", ["", "/", "/retrieve", "/retrieve/"])
def test_the_client_reaches_the_server_whatever_the_urls_trailing_slash(server, suffix):
    """ ".../retrieve/" was kept as given: FastAPI answered 307, not followed, and every search failed."""
    (hits,) = asyncio.run(HTTPRetriever(server + suffix).asearch(["Big Ben"], 1))
    assert hits[0].title == "Big Ben"


def test_concurrent_requests_are_micro_batched(server):
    before_batches = metric(server, "retrieve_batches_total")
    before_requests = metric(server, "retrieve_requests_total")
    client = HTTPRetriever(server)

    async def burst():
        return await asyncio.gather(*(client.asearch([f"Colosseum Rome {i}"], 1) for i in range(16)))

    results = asyncio.run(burst())
    assert all(r[0][0].title == "Colosseum" for r in results)
    batches = metric(server, "retrieve_batches_total") - before_batches
    assert metric(server, "retrieve_requests_total") - before_requests == 16
    assert batches < 16, f"16 concurrent requests ran in {batches} batches"
    assert metric(server, "retrieve_batch_seconds_count") == metric(server, "retrieve_batches_total")


def test_without_micro_batching_each_request_is_its_own_batch(corpus, tmp_path):
    with retrieval_server(corpus, tmp_path, "--no-micro-batching") as url:
        client = HTTPRetriever(url)

        async def burst():
            return await asyncio.gather(*(client.asearch(["Big Ben", "Eiffel"], 1) for _ in range(8)))

        asyncio.run(burst())
        assert metric(url, "retrieve_batches_total") == 8


def test_the_client_closes_its_connections_when_its_loop_ends_or_on_aclose(server):
    retriever = HTTPRetriever(server)

    def open_fds_after(searches: int) -> int:
        for _ in range(searches):  # a new event loop each time, as per-call asyncio.run does
            assert asyncio.run(retriever.asearch(["Big Ben"], 1))[0][0].title == "Big Ben"
        return len(os.listdir("/proc/self/fd"))

    after_5 = open_fds_after(5)
    assert open_fds_after(40) <= after_5 + 2, "sockets leak with each event loop"

    async def scoped() -> tuple[int, int]:
        before = len(os.listdir("/proc/self/fd"))
        async with HTTPRetriever(server) as scoped_retriever:
            await scoped_retriever.asearch(["Big Ben"], 1)
        return before, len(os.listdir("/proc/self/fd"))

    before, after = asyncio.run(scoped())
    assert after == before


class FailsOnBoom:
    """Echoes each query as a passage, but a batch holding "boom" raises (a fault no request check foresees)."""

    async def asearch(self, queries, k):
        await asyncio.sleep(0.01)
        if any("boom" in q for q in queries):
            raise RuntimeError("the index cannot search 'boom'")
        return [[Passage(id="0", title=q, text="")] for q in queries]


@contextlib.asynccontextmanager
async def serving(app, limits: ServerLimits | None = None):
    """``app`` served by uvicorn on 127.0.0.1 in this event loop, with ``limits``' read deadline as in ``serve``."""
    port = free_port()
    http = protocol_for(limits or ServerLimits())
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off", http=http)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def test_a_batch_that_fails_is_searched_again_one_query_at_a_time():
    app = create_app(FailsOnBoom(), ServerLimits(max_wait_ms=200))

    async def burst():
        async with serving(app) as url, HTTPRetriever(url) as client:
            searches = [client.asearch([f"good {i}"], 1) for i in range(16)] + [client.asearch(["boom"], 1)]
            results = await asyncio.gather(*searches, return_exceptions=True)
            async with httpx.AsyncClient() as plain:  # not httpx.get: this loop is the server's
                metrics = (await plain.get(f"{url}/metrics")).text
            return results, float(re.search(r"^retrieve_batches_total (\S+)$", metrics, re.MULTILINE).group(1))

    (*good, bad), batches = asyncio.run(burst())
    assert [r[0][0].title for r in good] == [f"good {i}" for i in range(16)]
    assert isinstance(bad, RuntimeError) and not isinstance(bad, RetrievalRejected)  # a 500: worth a retry
    assert "500: search failed: RuntimeError: the index cannot search 'boom'" in str(bad)
    assert batches == 1 + 17, "one batch of 17, then each query alone"


class Gated:
    """Echoes each query as a passage once ``release`` is set; ``searching`` is set when a batch starts."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.searching = asyncio.Event()
        self.release = asyncio.Event()

    async def asearch(self, queries, k):
        self.batches.append(list(queries))
        self.searching.set()
        await self.release.wait()
        return [[Passage(id="0", title=q, text="")] for q in queries]


def test_a_client_that_disconnects_mid_batch_breaks_nothing():
    retriever = Gated()
    app = create_app(retriever, ServerLimits(max_batch=2, max_wait_ms=60_000))  # a batch starts when 2 queries wait

    async def scenario():
        async with serving(app) as url, HTTPRetriever(url) as client:
            hasty = asyncio.create_task(client.asearch(["hasty"], 1))
            patient = asyncio.create_task(client.asearch(["patient"], 1))
            await asyncio.wait_for(retriever.searching.wait(), 30)  # both requests' batch is being searched
            hasty.cancel()  # the client goes away: its connection is closed mid-batch
            with pytest.raises(asyncio.CancelledError):
                await hasty
            retriever.release.set()
            return await patient, await client.asearch(["later", "again"], 1)

    kept, later = asyncio.run(scenario())
    assert sorted(retriever.batches[0]) == ["hasty", "patient"]
    assert kept[0][0].title == "patient"
    assert [r[0].title for r in later] == ["later", "again"] and retriever.batches[1:] == [["later", "again"]]


def test_the_agent_answers_through_the_server(server):
    llm = scripted_llm("<search> Eiffel Tower ## Statue of Liberty </search>", "<answer> Statue of Liberty </answer>")
    out = ParallelSearchAgent(llm=llm, retriever=server).invoke("Which is older?")
    (record,) = out["trajectory"]["search_rounds"]
    assert [r["passages"][0]["title"] for r in record["results"]] == ["Eiffel Tower", "Statue of Liberty"]
    assert "Doc 1(Title: Statue of Liberty)" in out["trajectory"]["response"]


@pytest.fixture(scope="module")
def dense_folder(corpus, tmp_path_factory):
    """A built folder: Flat (real MiniLM + FAISS) and BM25."""
    folder = tmp_path_factory.mktemp("index") / "flat"
    build_index(corpus, folder, ["flat", "bm25"], progress=False)
    return folder


@pytest.fixture(scope="module")
def dense_server(dense_folder, tmp_path_factory):
    """The server over the folder's Flat index."""
    folder = tmp_path_factory.mktemp("dense")
    with retrieval_server(dense_folder, folder, "--kind", "flat", "--max-wait-ms", "20") as url:
        yield url


def test_a_dense_index_served_over_search_r1_json_merges_concurrent_requests(dense_server):
    body = {"queries": ["an iron tower in France", "a bell in a London clock"], "topk": 2, "return_scores": True}
    result = httpx.post(f"{dense_server}/retrieve", json=body).json()["result"]
    assert [r[0]["document"]["contents"].split("\n")[0] for r in result] == ['"Eiffel Tower"', '"Big Ben"']
    assert result[0][0]["score"] > result[0][1]["score"]
    before = metric(dense_server, "retrieve_batches_total")
    client = HTTPRetriever(dense_server)

    async def burst():
        return await asyncio.gather(*(client.asearch([f"ancient arena in Italy {i}"], 1) for i in range(16)))

    assert all(r[0][0].title == "Colosseum" for r in asyncio.run(burst()))
    assert metric(dense_server, "retrieve_batches_total") - before < 16


def test_a_query_that_is_not_unicode_fails_alone_not_the_batch_it_would_join(dense_server):
    async def burst():
        async with httpx.AsyncClient() as client:
            bad = client.post(f"{dense_server}/retrieve", content=POISON, headers={"Content-Type": "application/json"})
            good = [client.post(f"{dense_server}/retrieve", json={"queries": [f"clock {i}"]}) for i in range(16)]
            return await asyncio.gather(bad, *good)

    bad, *good = asyncio.run(burst())
    assert bad.status_code == 422 and "expected text encodable as UTF-8" in bad.text
    assert [r.status_code for r in good] == [200] * 16


def test_the_agent_answers_through_a_dense_index_server(dense_server):
    llm = scripted_llm("<search> iron tower Paris ## statue New York harbour </search>", "<answer> Statue </answer>")
    out = ParallelSearchAgent(llm=llm, retriever=dense_server).invoke("Which is older?")
    (record,) = out["trajectory"]["search_rounds"]
    assert [r["passages"][0]["title"] for r in record["results"]] == ["Eiffel Tower", "Statue of Liberty"]


def test_serving_an_index_with_another_encoder_or_damaged_is_refused(dense_folder, corpus, tmp_path):
    command = [PS_AGENT, "serve-retriever", "--index", str(dense_folder), "--encoder", "intfloat/e5-base-v2"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and "was built with encoder" in done.stderr
    folder = tmp_path / "bm25-only"
    build_index(corpus, folder, ["bm25"], progress=False)
    (folder / "manifest.json").write_text((folder / "manifest.json").read_text().replace('"count": 4', '"count": 5'))
    done = subprocess.run([PS_AGENT, "serve-retriever", "--index", str(folder)], capture_output=True, text=True)
    assert done.returncode == 2 and "passages.arrow holds 4 passages, the manifest 5" in done.stderr


def test_a_port_in_use_is_one_line_before_serving_starts(server, corpus):
    """uvicorn logged "[Errno 98] address already in use" after "serving at", and exited with its own status 3."""
    port = server.rsplit(":", 1)[1]
    done = subprocess.run(
        [PS_AGENT, "serve-retriever", "--corpus", str(corpus), "--port", port], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.strip().startswith("error: [Errno 98]"), done.stderr
    assert "serving at" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


# --- issue 27: a server that survives abusive clients ------------------------------------------------------------


def test_a_million_wrong_typed_items_get_a_short_4xx(server):
    body = json.dumps({"queries": [1] * 1_000_000})  # 3 MB: every item used to be validated and echoed
    reply = httpx.post(f"{server}/retrieve", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert reply.status_code == 422 and len(reply.content) < 2_000, reply.content[:300]
    assert reply.json()["detail"][0]["type"] == "too_long" and reply.json()["errors"] == 1
    many = httpx.post(f"{server}/retrieve", json={"queries": [1] * 1000}, timeout=60)  # under the cap: every item
    assert many.status_code == 422 and len(many.json()["detail"]) == 20 and many.json()["errors"] == 1000
    assert httpx.get(f"{server}/health").json()["limits"]["max_body_bytes"] == ServerLimits.max_body_bytes


def test_a_body_over_the_limit_gets_a_413():
    app = create_app(Gated(), ServerLimits(max_body_bytes=1_000))

    async def scenario():
        async with serving(app) as url, httpx.AsyncClient() as client:
            declared = await client.post(f"{url}/retrieve", json={"queries": ["x" * 2_000]})

            async def chunks():  # no Content-Length: the limit is counted as the body arrives
                for _ in range(4):
                    yield b" " * 400

            streamed = await client.post(
                f"{url}/retrieve", content=chunks(), headers={"content-type": "application/json"}
            )
            return declared, streamed

    declared, streamed = asyncio.run(scenario())
    assert declared.status_code == 413 and streamed.status_code == 413


def test_requests_past_the_in_flight_limit_get_a_503_with_retry_after():
    retriever = Gated()
    app = create_app(retriever, ServerLimits(max_in_flight=2, max_wait_ms=1))

    async def scenario():
        async with serving(app) as url, httpx.AsyncClient(timeout=30) as client:
            held = [asyncio.create_task(client.post(f"{url}/retrieve", json={"queries": [f"q{i}"]})) for i in range(2)]
            await asyncio.wait_for(retriever.searching.wait(), 30)
            while sum(len(batch) for batch in retriever.batches) < 2:
                await asyncio.sleep(0.01)
            refused = await client.post(f"{url}/retrieve", json={"queries": ["third"]})
            retriever.release.set()
            return refused, [await task for task in held]

    refused, held = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "at most 2" in refused.json()["detail"]
    assert [reply.status_code for reply in held] == [200, 200]


def test_slow_headers_and_bodies_are_closed_and_good_clients_are_served():
    limits = ServerLimits(read_timeout_s=0.5, max_connections=8, max_wait_ms=1, max_in_flight=2)  # fewer than slow
    app = create_app(FailsOnBoom(), limits)

    async def scenario():
        async with serving(app, limits) as url:
            port = int(url.rsplit(":", 1)[1])
            slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(12)]  # more than max_connections
            for i, (_, writer) in enumerate(slow):
                partial = b"POST /retrieve HTTP/1.1\r\nHost: x\r\n"
                if i % 2:  # headers whole, the body never finished
                    partial += b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
                writer.write(partial)
                await writer.drain()
            async with httpx.AsyncClient(timeout=30) as client:
                good = [await client.post(f"{url}/retrieve", json={"queries": [f"good {i}"]}) for i in range(5)]
            closed = 0
            for reader, _ in slow:  # every slow connection is closed by the server: read() sees the end
                closed += await asyncio.wait_for(reader.read(), 10) == b""
            return good, closed

    good, closed = asyncio.run(scenario())
    assert [reply.status_code for reply in good] == [200] * 5
    assert closed == 12


@pytest.mark.parametrize("limit", ["max_wait_ms", "read_timeout_s"])
def test_an_endless_limit_is_refused(limit):
    """``--max-wait-ms inf`` was taken: every request waited for ever, and SIGTERM no longer stopped the server."""
    with pytest.raises(ValueError, match=rf"ServerLimits.{limit} must be a finite number >=? 0, got inf"):
        ServerLimits(**{limit: float("inf")})


def test_search_r1s_own_client_is_answered_as_search_r1s_server_answers_it(server):
    """Search-R1 posts every rollout's query at once, with no error handling (``.json()['result']``): no queries
    on a turn where none searched, '' for ``<search></search>``, a rambling query, topk null, 400 queries, and a
    body without a Content-Type. Each was refused whole, and Search-R1 crashed on the missing 'result'."""
    url = f"{server}/retrieve"
    assert httpx.post(url, json={"queries": [], "topk": 3}).json() == {"result": []}
    result = httpx.post(url, json={"queries": ["Big Ben", "", "  ", "Big Ben " + "x" * 3000], "topk": 1}).json()
    assert [len(r) for r in result["result"]] == [1, 0, 0, 1]
    nulled = httpx.post(url, json={"queries": ["Big Ben"], "topk": None})  # the default, 3
    assert nulled.status_code == 200 and nulled.json()["result"][0][0]["contents"].startswith('"Big Ben"')
    many = httpx.post(url, json={"queries": ["Big Ben"] * 400, "topk": 1}, timeout=60).json()["result"]
    assert len(many) == 400
    untyped = httpx.post(url, content=json.dumps({"queries": ["Big Ben"], "topk": 1}), headers={"content-type": ""})
    assert untyped.status_code == 200 and untyped.json()["result"][0][0]["contents"].startswith('"Big Ben"')


class FailsOnBad:
    def __init__(self):
        self.calls = 0

    async def asearch(self, queries, k):
        self.calls += 1
        if "bad" in queries:
            raise RuntimeError("the backend chokes on 'bad'")
        return [[Passage(q, "T", "x", 1.0)] for q in queries]


def test_without_micro_batching_a_failed_request_is_not_searched_again_query_by_query():
    """Its other 49 queries were each searched alone after the request had failed, for no one."""
    retriever = FailsOnBad()
    with TestClient(create_app(retriever, ServerLimits(micro_batching=False, max_wait_ms=0))) as client:
        response = client.post("/retrieve", json={"queries": ["bad"] + [f"q{i}" for i in range(49)]})
    assert response.status_code == 500 and retriever.calls == 2  # the batch, then "bad" alone


class DepthDependentDouble:
    """Test double: a retriever whose top passages depend on how deep it is asked, as a hybrid index's do."""

    def __init__(self):
        self.calls = []

    async def asearch(self, queries, k):
        self.calls.append((list(queries), k))
        return [[Passage(f"{q}-{k}-{i}", "T", "x", 1.0) for i in range(k)] for q in queries]


def test_a_querys_passages_do_not_depend_on_the_topk_of_requests_batched_with_it():
    """A batch was searched at its largest topk: a topk=3 request got another top 3 beside a topk=50 one."""
    retriever = DepthDependentDouble()
    app = create_app(retriever, ServerLimits(max_batch=2, max_wait_ms=60_000))  # the two requests share a batch

    async def scenario():
        async with serving(app) as url, httpx.AsyncClient() as client:
            small, large = await asyncio.gather(
                client.post(f"{url}/retrieve", json={"queries": ["q"], "topk": 3}),
                client.post(f"{url}/retrieve", json={"queries": ["r"], "topk": 50}),
            )
            return small.json()["result"][0], large.json()["result"][0]

    small, large = asyncio.run(scenario())
    assert [d["id"] for d in small] == ["q-3-0", "q-3-1", "q-3-2"] and len(large) == 50
    assert sorted(k for _, k in retriever.calls) == [3, 50]


@pytest.mark.parametrize(
    "body",
    [b'[{"id": "1", "contents": "x"}]', b'{"result": [[{"document": {"id": "1", "contents": null}, "score": 1}]]}'],
    ids=["bare-documents", "contents-null"],
)
def test_the_client_keeps_a_urls_query_and_does_not_retry_a_200_that_is_not_search_r1s_json(body):
    """``/retrieve`` was appended after a URL's query string; a 200 of bare documents was retried as transient, and
    one whose contents were not text raised an ``AttributeError`` that named nothing expected."""
    import http.server
    import threading

    paths = []

    class NotSearchR1(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            paths.append(self.path)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotSearchR1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = HTTPRetriever(f"http://127.0.0.1:{server.server_address[1]}?token=abc")
        with pytest.raises(RetrievalRejected, match=r"answered 200 without Search-R1's JSON .*expected \{\"result\""):
            asyncio.run(client.asearch(["Big Ben"], 1))
    finally:
        server.shutdown()
        server.server_close()
    assert paths == ["/retrieve?token=abc"]
