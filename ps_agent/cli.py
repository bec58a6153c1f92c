"""The ``ps-agent`` command line."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ps_agent.protocol import parse_action

app = typer.Typer(help="ParallelSearch: LLM search agents that split questions into parallel sub-queries.")
console = Console()
errors = Console(stderr=True)


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")] = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    llm: Annotated[str, typer.Option(help="LLM spec: smollm2, hf:PATH, vllm:URL or provider:model.")] = "smollm2",
    corpus: Annotated[str | None, typer.Option(help="Corpus jsonl (Search-R1 form); default: embedded.")] = None,
    mode: Annotated[
        str, typer.Option(help="parallel (##-separated sub-queries) or sequential (Search-R1).")
    ] = "parallel",
    protocol: Annotated[str, typer.Option(help="tags (text protocol) or tools (native tool calling).")] = "tags",
    max_turns: Annotated[int, typer.Option(help="Turns that may search before a forced answer.")] = 4,
    topk: Annotated[int, typer.Option(help="Passages per sub-query.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full result as JSON.")] = False,
) -> None:
    """Answer QUESTION and show the trace: each turn, its parallel sub-queries and what they found."""
    from ps_agent.agent import ParallelSearchAgent

    try:
        agent = ParallelSearchAgent(
            llm=llm, retriever=corpus, mode=mode, protocol=protocol, max_turns=max_turns, topk=topk
        )
        result = agent.invoke({"question": question})
    except (ValueError, TypeError, FileNotFoundError) as exc:
        errors.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False, indent=2))
        return
    print_trace(result)


def print_trace(result: dict[str, Any]) -> None:
    """A readable trace: turns, search rounds as trees of parallel branches, the answer and stats."""
    trajectory, stats = result["trajectory"], result["stats"]
    console.print(Panel(trajectory["question"], title="question", expand=False))
    rounds = iter(trajectory["search_rounds"])
    for call in trajectory["llm_calls"]:
        action = parse_action(call["completion"], trajectory["mode"])  # type: ignore[arg-type]
        header = f"turn {call['turn']} · {call['action']} · {call['latency_s']:.1f} s"
        if action.think:
            console.print(f"[dim]{header}[/dim]  [italic]{action.think}[/italic]")
        else:
            console.print(f"[dim]{header}[/dim]  {Text(call['completion'].strip()[:300])}")
        if call["action"] == "invalid":
            console.print(f"  [yellow]invalid action:[/yellow] {call['error']}")
        if call["action"] == "search":
            record = next(rounds, None)
            if record is None:
                continue
            tree = Tree(f"[bold]search round {record['round']}[/bold] · {len(record['searched'])} in parallel")
            for res in record["results"]:
                branch = tree.add(f"[cyan]{res['sub_query']}[/cyan] [dim]({res['latency_s'] * 1000:.0f} ms)[/dim]")
                if res["error"]:
                    branch.add(f"[red]failed: {res['error']}[/red]")
                for passage in res["passages"]:
                    branch.add(passage["title"])
            if record["capped_from"]:
                tree.add(f"[yellow]capped: {record['capped_from']} sub-queries asked[/yellow]")
            console.print(tree)
    console.print(Panel(Text(result["answer"] or "(no answer)"), title="answer", expand=False, border_style="green"))
    console.print(
        f"[dim]{stats['llm_calls']} LLM calls · {stats['search_rounds']} search rounds · "
        f"{stats['sub_queries']} sub-queries · decomposed={stats['decomposed']} · "
        f"forced_answer={stats['forced_answer']} · {stats['latency_s']:.1f} s[/dim]"
    )


trajectories = typer.Typer(help="Inspect the trajectory logs of a training run.")
app.add_typer(trajectories, name="trajectories")


@trajectories.command("show")
def show_trajectories(
    run_dir: Annotated[Path, typer.Argument(help="A training run's output folder.")],
    last: Annotated[int, typer.Option(help="How many of the latest rollouts to show.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Summarise a run's logged rollouts (rewards, decomposition by class, format) and show the latest."""
    from ps_agent.trajectories import read_trajectories, summarise

    if not run_dir.is_dir():
        errors.print(f"[red]error:[/red] not a folder: {run_dir} (expected a training run's output folder)")
        raise typer.Exit(2)
    records = read_trajectories(run_dir)
    summary = summarise(records)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    if not records:
        console.print(f"no trajectories*.jsonl lines in {run_dir}")
        return
    table = Table(title=f"{summary['rollouts']} rollouts over {summary['steps']} steps")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    for name, value in summary["rewards"].items():
        table.add_row(f"reward/{name}", f"{value:+.3f}")
    for name in ("format_valid", "forced_answer", "search_rounds"):
        table.add_row(name, f"{summary[name]:.3f}")
    for cls, value in summary["decomposed_by_class"].items():
        table.add_row(f"decomposed/{cls}", f"{value:.3f}")
    console.print(table)
    for record in records[-last:]:
        console.print(
            f"[dim]step {record['step']} · {record['question_class']} · total {record['rewards']['total']:+.2f}[/dim] "
            f"{record['question']} → [green]{record['answer']!r}[/green] (gold {record['golden_answers']})"
        )
        for r in record["search_rounds"]:
            console.print(f"    search: {' ## '.join(r['sub_queries'])}")


if __name__ == "__main__":
    app()
