"""The ``ps-agent`` command line."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

import httpx
import typer
from rich.text import Text

from ps_agent.configuration import AgentConfig, describe
from ps_agent.display import console, errors, plain, print_rollouts, print_trace
from ps_agent.graph import AgentError
from ps_agent.llms import EMBEDDED_MODEL
from ps_agent.retrieval.limits import ServerLimits

app = typer.Typer(help="ParallelSearch: LLM search agents that split questions into parallel sub-queries.")


@contextmanager
def user_errors() -> Iterator[None]:
    """A bad argument, file, spec or unreachable service met while a command runs is one line and exit 2 (flags
    that click checks itself fail as click's usage errors do, also with exit 2)."""
    try:
        yield
    except (ValueError, TypeError, OSError, AgentError, httpx.HTTPError) as exc:
        errors.print(Text.assemble(("error: ", "red"), plain(exc)))
        raise typer.Exit(2) from exc


LLM_HELP = (
    "LLM spec: qwen0.5b or smollm2 (that embedded base's trained policy of the mode; ps-agent policies lists them), "
    "qwen0.5b-base or smollm2-base (untrained), hf:PATH (model or adapter), vllm:URL or provider:model."
)

# the agent settings both `ask` and `eval` take, with AgentConfig's own help
ProtocolOption = Annotated[Literal["tags", "tools"], typer.Option(help=describe("protocol"))]
MaxTurnsOption = Annotated[int, typer.Option(help=describe("max_turns"))]
TopkOption = Annotated[int, typer.Option(help=describe("topk"))]
MaxNewTokensOption = Annotated[int, typer.Option(help=describe("max_new_tokens"))]
DemonstrationOption = Annotated[bool, typer.Option(help=describe("demonstration"))]


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")] = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("bm25s").setLevel(logging.INFO if verbose else logging.WARNING)  # it logs at DEBUG itself
    if not verbose:  # a model's "Loading weights" bar on every command (read when transformers is imported)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    llm: Annotated[
        str,
        typer.Option(help=LLM_HELP),
    ] = EMBEDDED_MODEL,
    corpus: Annotated[
        str | None, typer.Option(help="Corpus jsonl (Search-R1 form), or a built index folder; default: embedded.")
    ] = None,
    mode: Annotated[Literal["parallel", "sequential"], typer.Option(help=describe("mode"))] = AgentConfig.mode,
    protocol: ProtocolOption = AgentConfig.protocol,
    max_turns: MaxTurnsOption = AgentConfig.max_turns,
    topk: TopkOption = AgentConfig.topk,
    max_new_tokens: MaxNewTokensOption = AgentConfig.max_new_tokens,
    demonstration: DemonstrationOption = AgentConfig.demonstration,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full result as JSON.")] = False,
) -> None:
    """Answer QUESTION and show the trace: each turn, its parallel sub-queries and what they found."""
    from ps_agent.agent import ParallelSearchAgent

    with user_errors():
        agent = ParallelSearchAgent(
            llm=llm,
            retriever=corpus,
            mode=mode,
            protocol=protocol,
            max_turns=max_turns,
            topk=topk,
            max_new_tokens=max_new_tokens,
            demonstration=demonstration,
        )
        result = agent.invoke({"question": question})
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False, indent=2))
        return
    print_trace(result)


@app.command("eval")
def eval_command(
    data: Annotated[list[Path], typer.Option(help="Question jsonl (id, question, golden_answers, type); repeatable.")],
    out: Annotated[
        Path, typer.Option(help="Output folder: results/, runs.jsonl, summary.json, report.md, plots.png, report.html.")
    ],
    corpus: Annotated[
        str, typer.Option(help="Corpus jsonl for BM25; 'auto': corpus.jsonl beside each data file, else embedded.")
    ] = "auto",
    index: Annotated[
        Path | None, typer.Option(help="A folder built by `ps-agent index build` (instead of --corpus).")
    ] = None,
    retriever_url: Annotated[
        str | None, typer.Option(help="A Search-R1-protocol retrieval server, e.g. http://127.0.0.1:8000/retrieve.")
    ] = None,
    llm: Annotated[
        str,
        typer.Option(help=LLM_HELP),
    ] = EMBEDDED_MODEL,
    mode: Annotated[
        Literal["parallel", "sequential", "both"], typer.Option(help="parallel, sequential or both.")
    ] = "both",
    concurrency: Annotated[int, typer.Option(help="Questions run at once.")] = 4,
    limit: Annotated[int | None, typer.Option(help="Only the first N questions of each file.")] = None,
    part: Annotated[
        Literal["all", "train", "validation"],
        typer.Option(
            help="Which questions of each file: all, or one part of the shared data's train/validation split (the "
            "policies train on the train part: report on validation)."
        ),
    ] = "all",
    protocol: ProtocolOption = AgentConfig.protocol,
    max_turns: MaxTurnsOption = AgentConfig.max_turns,
    topk: TopkOption = AgentConfig.topk,
    max_new_tokens: MaxNewTokensOption = AgentConfig.max_new_tokens,
    demonstration: DemonstrationOption = AgentConfig.demonstration,
    strict: Annotated[bool, typer.Option(help="Stop at a bad data line instead of reporting and skipping it.")] = False,
    weights: Annotated[
        list[Path] | None,
        typer.Option(
            help="A weight file behind a served model, a vllm: server (repeatable): checksummed, so resuming into "
            "--out is refused where other weights answered."
        ),
    ] = None,
) -> None:
    """Run the agent over question files (resumable) and write the paper's tables and plots."""
    from ps_agent.eval import EvalFailed, EvalSettings, evaluate

    given = [
        name
        for name, value in (("--corpus", corpus != "auto"), ("--index", index), ("--retriever-url", retriever_url))
        if value
    ]
    if len(given) > 1:  # the one used would silently replace the other
        raise typer.BadParameter(f"give one of --corpus, --index and --retriever-url, not {' and '.join(given)}")
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} is a file: expected an output folder, new or to resume", param_hint="--out")
    if retriever_url is not None and not retriever_url.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"{retriever_url!r}: expected a server URL, e.g. http://127.0.0.1:8000/retrieve",
            param_hint="--retriever-url",
        )
    if index is not None:
        with user_errors():
            from ps_agent.retrieval import index_retriever

            index_retriever(str(index.resolve()))  # refuse a mismatched folder before any question runs
    with user_errors():
        settings = EvalSettings(
            llm=llm,
            retriever=str(index.resolve()) if index else retriever_url or corpus,
            modes=("parallel", "sequential") if mode == "both" else (mode,),
            concurrency=concurrency,
            limit=limit,
            part=part,
            strict=strict,
            weights=weights or (),
            agent={
                "protocol": protocol,
                "max_turns": max_turns,
                "topk": topk,
                "max_new_tokens": max_new_tokens,
                "demonstration": demonstration,
            },
        )
        try:
            evaluate(data, out, settings)
        except EvalFailed:  # every question failed: the report says why, then the one error line
            console.print(plain((out / "report.md").read_text()), soft_wrap=True)  # markdown lines kept whole
            raise
    console.print(plain((out / "report.md").read_text()), soft_wrap=True)  # markdown lines kept whole


@app.command()
def synth(
    out: Annotated[Path, typer.Option(help="Output folder for corpus.jsonl and questions.jsonl.")],
    seed: Annotated[int, typer.Option(help="Random seed: same seed, same bytes.")] = 0,
    entities: Annotated[int, typer.Option(help="Number of fictional entities (at least 40).")] = 200,
    per_family: Annotated[int, typer.Option(help="Questions per family setting (k or depth).")] = 3,
) -> None:
    """Generate a synthetic multi-hop world whose questions scale in width and depth."""
    from ps_agent.synthetic import generate

    with user_errors():
        corpus, questions = generate(seed, entities, out, per_family)
    console.print(f"wrote {corpus} and {questions}")


@app.command("serve-retriever")
def serve_retriever(
    index: Annotated[Path | None, typer.Option(help="A folder built by `ps-agent index build`.")] = None,
    kind: Annotated[
        str | None, typer.Option(help="Which of the folder's indexes: flat, hnsw, ivfpq, bm25 or hybrid.")
    ] = None,
    encoder: Annotated[
        str | None, typer.Option(help="Refuse the folder unless it was built with this encoder.")
    ] = None,
    dtype: Annotated[str, typer.Option(help="Query encoder dtype: auto, float32 or bfloat16.")] = "auto",
    corpus: Annotated[
        str, typer.Option(help="Without --index: a corpus jsonl served with BM25, or 'embedded'.")
    ] = "embedded",
    host: Annotated[str, typer.Option(help="Interface to bind; loopback unless told otherwise.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 8000,
    micro_batching: Annotated[bool, typer.Option(help="Gather the queries of concurrent requests.")] = True,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits for more queries.")] = 5.0,
    max_batch: Annotated[int, typer.Option(help="Queries per batch at most.")] = 256,
    max_in_flight: Annotated[
        int, typer.Option(help="Requests searched or waiting at once; more get a 503 with Retry-After.")
    ] = ServerLimits.max_in_flight,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body; larger gets a 413.")] = (
        ServerLimits.max_body_bytes
    ),
    read_timeout_s: Annotated[
        float, typer.Option(help="Seconds a request's headers and body may take to arrive; then it is closed.")
    ] = ServerLimits.read_timeout_s,
    max_connections: Annotated[
        int, typer.Option(help="Open connections; past it, the one reading its request longest is closed.")
    ] = ServerLimits.max_connections,
) -> None:
    """Serve an index (or a corpus with BM25) over Search-R1's retrieval protocol, with micro-batching."""
    # Idle OpenMP threads of torch and FAISS sleep instead of spinning, leaving the CPU to the event loop
    # (read when torch and faiss load, below); in development runs on 2 cores it raised queries/s at 64 clients.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from ps_agent.retrieval import resolve_retriever
    from ps_agent.retrieval.index import load_index
    from ps_agent.retrieval.server import create_app, listening_socket, serve

    ignored = [f"--{n}" for n, v in (("kind", kind), ("encoder", encoder), ("dtype", dtype != "auto")) if v]
    if index is None and ignored:
        raise typer.BadParameter(f"{' and '.join(ignored)} choose among an index folder's indexes: give --index DIR")
    with user_errors():
        limits = ServerLimits(
            max_wait_ms=max_wait_ms,
            max_batch=max_batch,
            micro_batching=micro_batching,
            max_in_flight=max_in_flight,
            max_body_bytes=max_body_bytes,
            read_timeout_s=read_timeout_s,
            max_connections=max_connections,
        )
        retriever = load_index(index, kind, encoder=encoder, dtype=dtype) if index else resolve_retriever(corpus)
        listening = listening_socket(host, port)  # a port in use: one line, before "serving at"
    errors.print(f"serving at http://{host}:{port}/retrieve (Ctrl-C stops)")
    serve(create_app(retriever, limits), limits, listening)


index_app = typer.Typer(help="Build and inspect retrieval indexes.")
app.add_typer(index_app, name="index")


@index_app.command("build")
def build_index_command(
    corpus: Annotated[
        str,
        typer.Option(help="Corpus: .jsonl (Search-R1), .parquet, a datasets folder, hf:NAME[:SPLIT] or 'embedded'."),
    ],
    out: Annotated[Path, typer.Option(help="The index folder (a rerun continues an interrupted build).")],
    index: Annotated[
        list[str], typer.Option(help="flat, hnsw, ivfpq or bm25; repeat for several (dense + bm25 serve hybrid).")
    ] = ["flat"],  # noqa: B006 (typer reads the default)
    encoder: Annotated[
        str, typer.Option(help="minilm (embedded), or an E5/sentence-transformers name or path.")
    ] = "minilm",
    batch_size: Annotated[int, typer.Option(help="Passages per encoder batch.")] = 32,
    device: Annotated[str | None, typer.Option(help="Encoder device (cpu, cuda); default: the best there is.")] = None,
    dtype: Annotated[
        str, typer.Option(help="Encoder dtype: auto (bfloat16 where the hardware has it), float32, bfloat16.")
    ] = "auto",
    shard_size: Annotated[int, typer.Option(help="Passages per embedding shard (the unit of resuming).")] = 10_000,
) -> None:
    """Build a retrieval index folder: passage store, sharded embeddings, FAISS/BM25 indexes, manifest."""
    from ps_agent.retrieval.index import build_index

    with user_errors():
        manifest = build_index(
            corpus,
            out,
            index,
            encoder,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            shard_size=shard_size,
            progress=True,
        )
    console.print(f"built {', '.join(manifest['index_types'])} over {manifest['count']} passages in {out}")


@index_app.command("info")
def index_info(folder: Annotated[Path, typer.Argument(help="An index folder.")]) -> None:
    """Print an index folder's manifest."""
    from ps_agent.retrieval.index import read_manifest

    with user_errors():
        console.print_json(json.dumps(read_manifest(folder)))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="An eval output folder (results/) or a training run folder.")],
    open_page: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
) -> None:
    """Write RUN_DIR/report.html: tables, plots and every trajectory, one file that works offline (and an eval
    folder's summary.json, report.md and plots.png, from the same results)."""
    import webbrowser

    from ps_agent.eval_report import report as eval_report
    from ps_agent.report import training_report

    with user_errors():
        if not run_dir.is_dir():
            raise ValueError(f"not a folder: {run_dir} (expected an eval output folder or a training run folder)")
        if any((run_dir / "results").glob("*.jsonl")):  # summary.json, report.md and the plots too, from one read
            eval_report(run_dir)
            path = run_dir / "report.html"
        elif any(run_dir.glob("trajectories*.jsonl")):
            path = training_report(run_dir)
        else:
            raise ValueError(
                f"{run_dir} has neither results/*.jsonl (an eval run) nor trajectories*.jsonl (a training run)"
            )
    console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    if open_page:
        webbrowser.open(path.resolve().as_uri())


@app.command()
def policies(as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False) -> None:
    """List the shipped policies: base, mode, training stage, whether each is the default, and its headline numbers."""
    from rich.table import Table

    from ps_agent.llms import shipped_policies

    with user_errors():
        rows = shipped_policies()
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table("name", "base", "mode", "stage", "default", "headline (model card)")
    for row in rows:
        headline = ", ".join(f"{k} {v}" for k, v in row["headline"].items())
        table.add_row(
            row["name"], row["base"], row["mode"], row["stage"] or "?", "yes" if row["default"] else "", headline
        )
    console.print(table)


trajectories = typer.Typer(help="Inspect the trajectory logs of a training run.")
app.add_typer(trajectories, name="trajectories")


@trajectories.command("show")
def show_trajectories(
    run_dir: Annotated[Path, typer.Argument(help="A training run's output folder.")],
    last: Annotated[int, typer.Option(min=1, help="How many of the latest rollouts to show.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Summarise a run's logged rollouts (rewards, decomposition by class, format) and show the latest."""
    from ps_agent.episodes import summarise_rollouts
    from ps_agent.trajectories import read_trajectories

    if not run_dir.is_dir():
        raise typer.BadParameter(f"not a folder: {run_dir} (expected a training run's output folder)")
    with user_errors():
        records = read_trajectories(run_dir)
        try:
            summary = summarise_rollouts(records)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # the keys every shape has, but not others
            raise ValueError(
                f"{run_dir}: a logged rollout is not in the shape training writes ({type(exc).__name__}: {exc}): "
                "expected the trajectory log lines of training/run_grpo.py"
            ) from None
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    if not records:
        console.print(f"no trajectories*.jsonl lines in {run_dir}")
        return
    print_rollouts(summary, records[-last:])


if __name__ == "__main__":
    app()
