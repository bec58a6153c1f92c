"""What the command line prints: traces, rollout summaries and errors, with untrusted text kept as text."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ps_agent.protocol import parse_action

console = Console()
errors = Console(stderr=True, soft_wrap=True)  # paths in messages stay whole

_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def plain(text: object, style: str = "") -> Text:
    """Untrusted text (a question, model output, a title) as printed: no rich markup, and control
    characters (ESC, …) and lone surrogates shown as escapes instead of reaching the terminal."""
    return Text(_UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], str(text)), style=style)


def print_trace(result: dict[str, Any]) -> None:
    """A readable trace: turns, search rounds as trees of parallel branches, the answer and stats."""
    trajectory, stats = result["trajectory"], result["stats"]
    console.print(Panel(plain(trajectory["question"]), title="question", expand=False))
    rounds = iter(trajectory["search_rounds"])
    for call in trajectory["llm_calls"]:
        action = parse_action(call["completion"], trajectory["mode"])  # type: ignore[arg-type]
        header = Text(f"turn {call['turn']} · {call['action']} · {call['latency_s']:.1f} s  ", style="dim")
        if action.think:
            console.print(header + plain(action.think, "italic"))
        else:
            console.print(header + plain(call["completion"].strip()[:300]))
        if call["action"] == "invalid":
            console.print(Text("  invalid action: ", style="yellow") + plain(call["error"]))
        if call["action"] == "search":
            record = next(rounds, None)
            if record is None:
                continue
            tree = Tree(
                Text(f"search round {record['round']}", style="bold") + f" · {len(record['searched'])} in parallel"
            )
            for res in record["results"]:
                label = plain(res["sub_query"], "cyan") + Text(f" ({res['latency_s'] * 1000:.0f} ms)", "dim")
                branch = tree.add(label)
                if res["error"]:
                    branch.add(Text("failed: ", style="red") + plain(res["error"], "red"))
                for passage in res["passages"]:
                    branch.add(plain(passage["title"]))
            if record["capped_from"]:
                tree.add(Text(f"capped: {record['capped_from']} sub-queries asked", style="yellow"))
            console.print(tree)
    console.print(Panel(plain(result["answer"] or "(no answer)"), title="answer", expand=False, border_style="green"))
    console.print(
        f"[dim]{stats['llm_calls']} LLM calls · {stats['search_rounds']} search round"
        f"{'' if stats['search_rounds'] == 1 else 's'} · "
        f"{stats['sub_queries']} sub-queries · decomposed={stats['decomposed']} · "
        f"forced_answer={stats['forced_answer']} · {stats['latency_s']:.1f} s[/dim]"
    )


def print_rollouts(summary: dict[str, Any], latest: list[dict[str, Any]]) -> None:
    """A training run's rollout summary as a table, then its ``latest`` rollouts one per line."""
    table = Table(title=f"{summary['rollouts']} rollouts over {summary['steps']} steps")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    for name, value in summary["rewards"].items():
        table.add_row(f"reward/{name}", f"{value:+.3f}")
    for name in (
        "format_valid",
        "forced_answer",
        "search_rounds",
        "over_search",
        "under_search",
        "think_words",
        "zero_std_groups",
    ):
        # zero_std_groups: none without groups of two or more rollouts; think_words: none without think blocks
        if summary.get(name) is not None:
            table.add_row(name, f"{summary[name]:.3f}")
    for cls, value in summary["decomposed_by_class"].items():
        table.add_row(f"decomposed/{cls}", f"{value:.3f}")
    for cls, value in summary.get("class_mix", {}).items():
        table.add_row(f"mix/{cls}", f"{value:.3f}")
    for cls, value in summary.get("split_advantage", {}).items():  # below 0: GRPO is teaching it to split less
        table.add_row(f"split − whole/{cls} (n={value['groups']})", f"{value['total']:+.3f}")
    console.print(table)
    for record in latest:
        total = record["rewards"]["total"]
        header = Text(f"step {record['step']} · {record['question_class']} · total {total:+.2f} ", style="dim")
        gold = plain(f" (gold {record['golden_answers']})")
        console.print(header + plain(record["question"]) + " → " + plain(repr(record["answer"]), "green") + gold)
        for r in record["timeline"]["search_rounds"]:
            console.print(Text("    search: ") + plain(" ## ".join(r["sub_queries"])))
