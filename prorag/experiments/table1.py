"""The paper's Table 1 on one harness (``prorag table1``): systems × benchmarks on one retriever and one model.

Every cell is one evaluation in ``RUN/cells/SYSTEM/BENCHMARK/`` (the harness's ``predictions.jsonl``,
``trajectories.jsonl``, ``metrics.json``): a trained policy runs on the rollout engine
(:func:`~prorag.evaluation.harness.evaluate`), a baseline of :data:`~prorag.evaluation.baselines.EVAL_BASELINES`
on the engine (naive, standard-rag with ``generator.kind: engine``) or on a TextGenerator
(``evaluate_generator``: a local HF model or a served one). A cell resumes from its predictions and is
skipped once its ``metrics.json`` covers every question, so an interrupted run goes on where it stopped.

Then ``RUN/table1.json`` and ``RUN/table1.md``: EM and F1 per cell (with ROUGE-1 F1, searches and tokens
per question, and ``acc_l`` when a judge is set), the average over benchmarks (unweighted, as the
paper's "Avg." column), and a paired t-test of the best system by average EM against the next one on
the pooled per-question EM of every benchmark.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prorag.core.config import setting
from prorag.core.registry import unknown_name
from prorag.core.statistics import paired_t_test
from prorag.data.benchmarks import FORMATS, load_benchmark
from prorag.data.jsonl import atomic_writer, read_json, read_jsonl, write_json, write_jsonl
from prorag.data.records import Record, read_records
from prorag.evaluation.baselines import EVAL_BASELINES
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig, GeneratorConfig
from prorag.evaluation.llm_judge import JudgeConfig
from prorag.evaluation.runner import uses_generator
from prorag.retrieval.base import Retriever

Progress = Callable[[str], None]


@dataclass
class BenchmarkSpec:
    """One benchmark column: its file, the schema it is written in, how many questions."""

    path: str = setting("", help="The benchmark file (FlashRAG JSONL or its published schema); $VARS expanded.")
    format: str = setting("flashrag", help=f"Its schema: one of {', '.join(FORMATS)}.")
    limit: int | None = setting(None, help="Only the first N questions (default: the table's limit).")

    def __post_init__(self) -> None:
        self.path = os.path.expandvars(self.path)  # configs name the shared data as ${PRORAG_SHARED}/...
        formats = list(FORMATS)
        if self.format not in formats:
            raise ValueError(f"BenchmarkSpec.format: {unknown_name('benchmark format', self.format, formats)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"a benchmark's limit must be >= 1 (or null), got {self.limit}")


@dataclass
class SystemSpec:
    """One row: a baseline by name, or a trained policy folder, with its label."""

    label: str = setting("", help="Row label (default: the baseline's name or the policy folder's name).")
    baseline: str | None = setting(None, help="A baseline in EVAL_BASELINES (naive, standard-rag, iter-retgen, ...).")
    policy: str | None = setting(None, help="A trained policy: checkpoint folder or training run folder (engine harness).")

    def __post_init__(self) -> None:
        if (self.baseline is None) == (self.policy is None):
            raise ValueError(f"a system needs exactly one of baseline or policy, got {dataclasses.asdict(self)}")
        if self.baseline is not None:
            EVAL_BASELINES.check(self.baseline, "SystemSpec.baseline")
        if not self.label:
            self.label = self.baseline or Path(str(self.policy)).name


@dataclass
class Table1Config:
    """``prorag table1``: the benchmarks, the retriever, the model, the systems."""

    benchmarks: dict[str, BenchmarkSpec] = setting(factory=dict, help="Column name -> {path, format, limit}.")
    limit: int | None = setting(None, help="Questions per benchmark unless the benchmark sets its own limit.")
    index: str = setting("", help="Index folder or http(s):// URL of a retrieval server (built from `corpus` if missing).")
    corpus: list[str] = setting(
        factory=list,
        help="Files (globs and $VARS allowed) pooled into RUN/corpus.jsonl as `prorag corpus build` does, and indexed into `index` "
        "when that folder does not exist yet.",
    )
    index_kind: Literal["bm25", "dense"] = setting("bm25", help="Kind of the index built from `corpus`.")
    model: str | None = setting(None, help="Local HF model for the baselines (engine or hf generator): folder or hub id.")
    generator: GeneratorConfig = setting(factory=GeneratorConfig, help="What the baselines generate with (engine, hf, served).")
    rollout: EvalRolloutConfig = setting(
        factory=lambda: EvalRolloutConfig(batch_size=8), help="The engine's settings; rollout.top_k is the table's top-k."
    )
    systems: list[SystemSpec] = setting(factory=list, help="Rows: [{baseline: naive}, {label: ProRAG, policy: runs/rl}, ...].")
    judge: JudgeConfig | None = setting(None, help="LLM judge: adds acc_l to every cell.")
    device: str | None = setting(None, help="Device of local models (default: cuda if available).")

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or null), got {self.limit}")

    def check(self) -> None:
        """What a run needs and a default config lacks (refused before anything loads)."""
        if not self.benchmarks:
            raise ValueError("table1 needs at least one benchmark (benchmarks: {name: {path, format}})")
        if not self.systems:
            raise ValueError("table1 needs at least one system (systems: [{baseline: naive}, ...])")
        if not self.index:
            raise ValueError("table1 needs an index (folder or URL)")
        labels = [s.label for s in self.systems]
        if len(set(labels)) != len(labels):
            raise ValueError(f"system labels must be distinct, got {labels}")
        for name, spec in self.benchmarks.items():
            if not Path(spec.path).is_file():
                unset = (
                    " (an environment variable in it is not set: e.g. export PRORAG_SHARED=../shared)" if "$" in spec.path else ""
                )
                raise FileNotFoundError(f"benchmark {name}: {spec.path} is not a file{unset}")

    def eval_config(self, system: SystemSpec) -> EvalConfig:
        """The harness's settings of one row."""
        return EvalConfig(baseline=system.baseline, rollout=self.rollout, generator=self.generator)


# ----------------------------------------------------------------------------- inputs


def read_benchmark(spec: BenchmarkSpec, default_limit: int | None) -> list[Record]:
    """The benchmark's records (FlashRAG JSONL read as records, other schemas by their loaders), limited."""
    records = read_records(spec.path) if spec.format == "flashrag" else load_benchmark(spec.path, spec.format).records
    limit = spec.limit if spec.limit is not None else default_limit
    return records[:limit] if limit is not None else records


def open_table_retriever(config: Table1Config, run_dir: Path, progress: Progress) -> Retriever:
    """The index, built first from the pooled ``corpus`` files when the folder does not exist."""
    from prorag.retrieval.index import build_index, open_retriever

    is_url = config.index.startswith(("http://", "https://"))
    if not is_url and not Path(config.index).exists():
        if not config.corpus:
            raise FileNotFoundError(f"index {config.index} does not exist and no corpus is given to build it from")
        from prorag.data.corpus import build_corpus

        patterns = [os.path.expandvars(p) for p in config.corpus]
        inputs = sorted({p for pattern in patterns for p in (glob.glob(pattern) or [pattern])})  # a miss is named by the reader
        built = build_corpus(inputs)
        corpus_path = run_dir / "corpus.jsonl"
        write_jsonl(corpus_path, (p.to_dict() for p in built.passages))
        progress(f"pooled {len(built.passages)} passages from {len(inputs)} files into {corpus_path}")
        info = build_index(corpus_path, config.index, kind=config.index_kind)
        progress(f"built a {config.index_kind} index of {info['num_passages']} passages at {config.index}")
    return open_retriever(config.index)


# ----------------------------------------------------------------------------- running the cells


def cell_dir(run_dir: Path, system: str, benchmark: str) -> Path:
    return run_dir / "cells" / system / benchmark


def _finished(out: Path, n: int) -> bool:
    """A cell whose metrics.json covers all ``n`` questions (resume skips it)."""
    path = out / "metrics.json"
    return path.is_file() and read_json(path).get("n") == n


class _Models:
    """Local models and generators, each loaded once for the whole table."""

    def __init__(self, device: str | None) -> None:
        self.device = device
        self._loaded: dict[tuple[str, str], Any] = {}

    def policy(self, path: str) -> tuple[Any, Any]:
        from prorag.models.checkpoints import load_policy

        key = ("policy", path)
        if key not in self._loaded:
            self._loaded[key] = load_policy(path, device=self.device)
        return self._loaded[key]  # type: ignore[no-any-return]

    def generator(self, config: GeneratorConfig, model: str | None) -> Any:
        key = ("generator", repr((config, model)))
        if key not in self._loaded:
            self._loaded[key] = config.build(model, device=self.device)
        return self._loaded[key]


def run_cell(
    config: Table1Config, system: SystemSpec, records: list[Record], retriever: Retriever, out: Path, models: _Models
) -> dict[str, Any]:
    """Evaluate one system on one benchmark into ``out`` (resuming), then judge it if a judge is set."""
    from prorag.evaluation.harness import evaluate  # the harness imports torch: not at import (--help)

    cfg = config.eval_config(system)
    if system.policy is not None:
        model, tokenizer = models.policy(system.policy)
        metrics = evaluate(model, tokenizer, records, retriever, out, cfg, progress=False)
    elif uses_generator(cfg):
        from prorag.evaluation.generator_eval import evaluate_generator

        generator = models.generator(config.generator, config.model)
        metrics = evaluate_generator(generator, records, retriever, out, cfg, progress=False)
    else:
        if config.model is None:
            raise ValueError(f"system {system.label}: the engine baselines need `model` (a local HF model)")
        model, tokenizer = models.policy(config.model)
        metrics = evaluate(model, tokenizer, records, retriever, out, cfg, progress=False)
    if config.judge is not None:
        from prorag.evaluation.llm_judge import add_acc_l

        metrics = add_acc_l(out, config.judge)
    return metrics


def engine_token_counts(out: Path) -> dict[str, float] | None:
    """Mean prompt and completion tokens per question of an engine cell, from its trajectories:
    completion = tokens the model wrote (``env_mask`` 1), prompt = the prompt plus the retrieved
    text inserted into the context (``env_mask`` 0), i.e. what a served model would read once."""
    path = out / "trajectories.jsonl"
    if not path.is_file():
        return None
    rows = list(read_jsonl(path, tolerate_truncated_tail=True))
    if not rows:
        return None
    written = [sum(r["env_mask"]) for r in rows]
    read = [len(r["prompt_ids"]) + len(r["env_mask"]) - w for r, w in zip(rows, written, strict=True)]
    return {"mean_prompt_tokens": sum(read) / len(rows), "mean_completion_tokens": sum(written) / len(rows)}


def cell_summary(out: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """The numbers one cell of the table shows."""
    searches = metrics.get("mean_searches", metrics.get("mean_retrieval_steps"))
    cell = {"n": metrics["n"], "em": metrics["em"], "f1": metrics["f1"], "rouge1_f1": metrics["rouge1_f1"]}
    cell["searches_per_question"] = searches
    tokens = {k: metrics[k] for k in ("mean_prompt_tokens", "mean_completion_tokens") if k in metrics}
    cell |= tokens or engine_token_counts(out) or {}
    for key in ("acc_l", "acc_l_unparsable"):
        if key in metrics:
            cell[key] = metrics[key]
    return cell


def per_question_em(out: Path, benchmark: str, ids: list[str]) -> dict[tuple[str, str], float]:
    """``(benchmark, id) -> EM`` of a cell's predictions, for the pooled paired test."""
    wanted = set(ids)
    rows = read_jsonl(out / "predictions.jsonl", tolerate_truncated_tail=True)
    return {(benchmark, r["id"]): float(r["em"]) for r in rows if r["id"] in wanted}


def significance(pooled: dict[str, dict[tuple[str, str], float]], averages: dict[str, dict[str, float]]) -> dict[str, Any] | None:
    """Paired t-test of the best system by average EM (then F1) against the next, on the per-question EM of
    every benchmark pooled (questions both answered); ``None`` with fewer than two systems."""
    order = sorted(averages, key=lambda s: (averages[s]["em"], averages[s].get("f1", 0.0)), reverse=True)  # F1 breaks ties
    if len(order) < 2:
        return None
    best, nxt = order[0], order[1]
    shared = sorted(pooled[best].keys() & pooled[nxt].keys())
    if len(shared) < 2:
        return {"best": best, "next": nxt, "metric": "em", "n": len(shared), "t": None, "p_value": None}
    test = paired_t_test([pooled[best][k] for k in shared], [pooled[nxt][k] for k in shared])
    return {
        "best": best,
        "next": nxt,
        "metric": "em",
        "n": test.n,
        "t": test.t,
        "p_value": test.p_value,
        "mean_diff": test.mean_diff,
    }


def run_table1(config: Table1Config, run_dir: str | Path, *, progress: Progress = print) -> dict[str, Any]:
    """Evaluate every system on every benchmark (resumable per cell) and write ``table1.json`` and ``table1.md``."""
    config.check()
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    data = {name: read_benchmark(spec, config.limit) for name, spec in config.benchmarks.items()}
    for name, records in data.items():
        if not records:
            raise ValueError(f"benchmark {name}: {config.benchmarks[name].path} has no questions")
    retriever = open_table_retriever(config, run, progress)
    models = _Models(config.device)
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    pooled: dict[str, dict[tuple[str, str], float]] = {}
    for system in config.systems:
        cells[system.label], pooled[system.label] = {}, {}
        for bench, records in data.items():
            out = cell_dir(run, system.label, bench)
            if _finished(out, len(records)) and (config.judge is None or "acc_l" in read_json(out / "metrics.json")):
                metrics = read_json(out / "metrics.json")
                progress(f"{system.label} / {bench}: done before (EM {metrics['em']:.3f})")
            else:
                metrics = run_cell(config, system, records, retriever, out, models)
                progress(f"{system.label} / {bench}: EM {metrics['em']:.3f} F1 {metrics['f1']:.3f} (n={metrics['n']})")
            cells[system.label][bench] = cell_summary(out, metrics)
            pooled[system.label] |= per_question_em(out, bench, [r.id for r in records])
    averages = {s: {m: sum(c[m] for c in row.values()) / len(row) for m in ("em", "f1", "rouge1_f1")} for s, row in cells.items()}
    result = {
        "benchmarks": {name: {**dataclasses.asdict(spec), "n": len(data[name])} for name, spec in config.benchmarks.items()},
        "systems": [dataclasses.asdict(s) for s in config.systems],
        "top_k": config.rollout.top_k,
        "index": config.index,
        "cells": cells,
        "average": averages,
        "significance": significance(pooled, averages),
        "config": dataclasses.asdict(config),
    }
    write_json(run / "table1.json", result)
    with atomic_writer(run / "table1.md") as f:
        f.write(table1_markdown(result) + "\n")
    return result


# ----------------------------------------------------------------------------- the table


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table1_markdown(result: dict[str, Any]) -> str:
    """Table 1 as Markdown: EM / F1 per benchmark (percent), the average, searches and tokens per
    question (mean over the benchmarks), and the significance line."""
    benches = list(result["benchmarks"])
    head = ["System", *(f"{b} EM / F1" for b in benches), "Avg. EM / F1", "Searches/q", "Tokens/q (in + out)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, row in result["cells"].items():
        avg = result["average"][system]
        searches = [c["searches_per_question"] for c in row.values() if c.get("searches_per_question") is not None]
        tokens = [c["mean_prompt_tokens"] + c["mean_completion_tokens"] for c in row.values() if "mean_prompt_tokens" in c]
        cells = [f"{_pct(row[b]['em'])} / {_pct(row[b]['f1'])}" for b in benches]
        lines.append(
            "| "
            + " | ".join(
                [
                    system,
                    *cells,
                    f"**{_pct(avg['em'])} / {_pct(avg['f1'])}**",
                    _num(sum(searches) / len(searches) if searches else None),
                    _num(sum(tokens) / len(tokens) if len(tokens) == len(row) else None, 0),
                ]
            )
            + " |"
        )
    n = ", ".join(f"{b} n={info['n']}" for b, info in result["benchmarks"].items())
    lines.append("")
    lines.append(f"EM and F1 in percent (SQuAD normalisation), top-{result['top_k']} retrieval from {result['index']}; {n}.")
    sig = result["significance"]
    if sig is not None and sig["p_value"] is not None:
        lines.append(
            f"Paired t-test on pooled per-question EM, {sig['best']} vs {sig['next']}: "
            f"mean difference {_pct(sig['mean_diff'])} points, t = {sig['t']:.3f}, p = {sig['p_value']:.4g} (n = {sig['n']})."
        )
    elif sig is not None:
        lines.append(f"Paired t-test {sig['best']} vs {sig['next']}: fewer than 2 shared questions (n = {sig['n']}).")
    return "\n".join(lines)
