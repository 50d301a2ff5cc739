"""Index folders: build one from a corpus file, load one, or open any retriever by its spec.

An index folder holds ``passages.jsonl``, the files of its kind (``bm25.json`` and ``bm25/``,
or ``dense.json`` and ``embeddings.safetensors``) and the manifest ``index.json``. The
manifest is removed first and written last, atomically: a folder without it is an index
whose build was interrupted (or is still running), and :func:`load_index` refuses it
instead of serving half an index.

The retriever modules are imported lazily, so that opening a BM25 index never imports torch.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

import prorag
from prorag.core.errors import DataError
from prorag.data.jsonl import read_json, write_json
from prorag.data.records import read_passages
from prorag.retrieval.base import Retriever

MANIFEST = "index.json"
FORMAT_VERSION = 1
KINDS = ("bm25", "dense")

PathLike = str | os.PathLike[str]


def build_index(
    corpus_path: PathLike,
    out_dir: PathLike,
    *,
    kind: str = "bm25",
    model: str | None = None,
    query_prefix: str = "",
    passage_prefix: str = "",
    batch_size: int = 64,
) -> dict[str, Any]:
    """Index the corpus JSONL at ``corpus_path`` into ``out_dir``; return the manifest written.

    ``model``, the prefixes and ``batch_size`` are dense settings; giving a model or a prefix
    to a BM25 build is an error rather than silently ignored.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "bm25" and (model or query_prefix or passage_prefix):
        raise ValueError("--model, --query-prefix and --passage-prefix only apply to dense indexes")
    passages = read_passages(corpus_path)
    if not passages:
        raise DataError(str(corpus_path), "the corpus has no passages")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # until rebuilt, the folder is incomplete

    start = time.perf_counter()
    retriever: Any
    if kind == "bm25":
        from prorag.retrieval.bm25 import BM25Retriever

        retriever = BM25Retriever(passages, source=str(corpus_path))
    else:
        from prorag.retrieval.dense import DenseRetriever

        retriever = DenseRetriever(
            passages, model=model, query_prefix=query_prefix, passage_prefix=passage_prefix, batch_size=batch_size
        )
    retriever.save(out)
    info = {
        "kind": kind,
        "format_version": FORMAT_VERSION,
        "num_passages": retriever.num_passages,
        "num_partitions": len(retriever.partitions),
        "build_seconds": round(time.perf_counter() - start, 3),
        "corpus": str(corpus_path),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "prorag_version": prorag.__version__,
        "settings": retriever.settings(),
    }
    write_json(out / MANIFEST, info)
    return info


def read_manifest(index_dir: PathLike) -> dict[str, Any]:
    """The manifest of a complete index folder; a clear :class:`DataError` otherwise."""
    folder = Path(index_dir)
    if not folder.is_dir():
        raise DataError(str(folder), "no such index folder")
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        if any(folder.iterdir()):
            raise DataError(
                str(folder),
                f"incomplete index: {MANIFEST} is missing, so its build was interrupted or is still "
                "running; rebuild it with `prorag index`",
            )
        raise DataError(str(folder), f"not an index folder (empty, no {MANIFEST}); build one with `prorag index`")
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise DataError(str(manifest_path), "expected a JSON object")
    kind = manifest.get("kind")
    if kind not in KINDS:
        raise DataError(str(manifest_path), f"unknown index kind {kind!r}; expected one of {', '.join(KINDS)}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            str(manifest_path),
            f"index format version {manifest.get('format_version')!r}, this version reads {FORMAT_VERSION}: rebuild the index",
        )
    return manifest


def load_index(index_dir: PathLike) -> Retriever:
    """Load a complete index folder of any kind (see :func:`read_manifest` for the checks)."""
    manifest = read_manifest(index_dir)
    try:
        if manifest["kind"] == "bm25":
            from prorag.retrieval.bm25 import BM25Retriever

            return BM25Retriever.load(index_dir)
        from prorag.retrieval.dense import DenseRetriever

        return DenseRetriever.load(index_dir)
    except (FileNotFoundError, KeyError) as e:
        raise DataError(str(index_dir), f"corrupt {manifest['kind']} index ({e!r}); rebuild it") from None


def open_retriever(spec: str | PathLike) -> Retriever:
    """An ``http(s)://`` URL gives an :class:`~prorag.retrieval.client.HttpRetriever`; anything else is an index folder."""
    text = str(spec)
    if text.startswith(("http://", "https://")):
        from prorag.retrieval.client import HttpRetriever

        return HttpRetriever(text)
    return load_index(text)
