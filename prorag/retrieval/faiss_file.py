"""A dense index whose vectors are a FAISS file built elsewhere (FlashRAG's and Search-R1's e5 index of wiki-18).

* Imported, never re-encoded: the FAISS file and the corpus are linked into the index folder (a
  hard link, else a symbolic one; never copied), beside the byte offsets of the corpus's passages
  (:mod:`~prorag.retrieval.passage_file`). Row ``i`` of the index is passage ``i`` of the corpus, so
  their counts must agree.
* Read memory-mapped and read-only where FAISS can (``IO_FLAG_MMAP_IFC``: flat and HNSW storage),
  else into memory. Inner-product indexes only: an L2 index ranks best-last by our scores.
* Queries are embedded by prorag's dense encoder (:class:`~prorag.retrieval.dense.DenseRetriever`:
  a sentence-transformers model, L2-normalised; e5-base-v2 pools by mean, as the index builders
  did). Its name, prefixes and dimension are recorded; an encoder whose dimension is not the
  index's is refused at import, before anything is encoded.
* Without prefixes given, a model whose name contains ``e5`` gets E5's (``"query: "`` /
  ``"passage: "``), as FlashRAG's and Search-R1's builders and servers prefix by that name.
* Search-R1's and FlashRAG's ``contents`` keep the title in quotes on the first line; so do the hits.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import safetensors.numpy

from prorag.core.errors import DataError
from prorag.data.jsonl import read_json, write_json
from prorag.data.safetensors_files import load_numpy
from prorag.retrieval.dense import DEFAULT_MODEL, SETTINGS_FILE, DenseRetriever, faiss, resolve_model  # faiss: logs quieted
from prorag.retrieval.partitions import PASSAGES_FILE, PartitionedPassages
from prorag.retrieval.passage_file import PassageFile, scan_passages

#: The imported FAISS file, inside the index folder.
FAISS_FILE = "faiss.index"
#: Where each passage of ``passages.jsonl`` starts (int64, one per passage plus the end).
OFFSETS_FILE = "passages.offsets.safetensors"
#: E5's query and passage prefixes.
E5_PREFIXES = ("query: ", "passage: ")

log = logging.getLogger(__name__)


def default_prefixes(model: str | None, query_prefix: str | None, passage_prefix: str | None) -> tuple[str, str]:
    """The prefixes an index built elsewhere was encoded with: those given, else E5's for a model named
    ``*e5*`` (the rule of FlashRAG's and Search-R1's encoders), else none."""
    e5 = model is not None and "e5" in model.lower()
    return (
        query_prefix if query_prefix is not None else E5_PREFIXES[0] if e5 else "",
        passage_prefix if passage_prefix is not None else E5_PREFIXES[1] if e5 else "",
    )


def read_faiss(path: str | os.PathLike[str]) -> tuple[Any, bool]:
    """The FAISS index at ``path`` and whether it was read with FAISS's memory-mapping flag (which maps
    flat and HNSW storage); an L2 index is refused."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), "no such file")
    flags = getattr(faiss, "IO_FLAG_MMAP_IFC", 0) | faiss.IO_FLAG_READ_ONLY
    try:
        index, mapped = faiss.read_index(str(path), flags), bool(flags & ~faiss.IO_FLAG_READ_ONLY)
    except RuntimeError:  # an index type FAISS cannot map (IVF lists, older FAISS)
        try:
            index, mapped = faiss.read_index(str(path)), False
        except RuntimeError as e:
            raise DataError(str(path), f"not a FAISS index FAISS can read ({str(e).splitlines()[0]})") from None
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise DataError(
            str(path),
            f"FAISS metric {index.metric_type}, not inner product (METRIC_INNER_PRODUCT = 0): scores would rank backwards",
        )
    return index, mapped


def encoder_dimension(model: str | None) -> int:
    """The dimension of the sentence-transformers model ``model`` (loaded, nothing encoded)."""
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(resolve_model(model))
    # sentence-transformers 5.2 renamed get_sentence_embedding_dimension (the old name warns)
    dim = (getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension)()
    if dim is None:
        raise DataError(str(model), "the encoder does not say its embedding dimension")
    return int(dim)


def import_faiss(
    faiss_path: str | os.PathLike[str],
    corpus_path: str | os.PathLike[str],
    out: Path,
    *,
    model: str | None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
) -> FaissFileRetriever:
    """Fill the new, empty folder ``out`` with an index over the FAISS file and its corpus (the
    manifest is the caller's); return it loaded. Cheapest checks first: the index, the encoder's
    dimension, then one pass over the corpus."""
    faiss_path, corpus_path = Path(faiss_path), Path(corpus_path)
    index, _ = read_faiss(faiss_path)
    dim = encoder_dimension(model)
    if dim != index.d:
        raise DataError(
            str(faiss_path),
            f"holds vectors of dimension {index.d}, but the encoder {model or DEFAULT_MODEL} gives {dim}: name the encoder the index was built with (--model)",
        )
    offsets, size = scan_passages(corpus_path)
    if len(offsets) - 1 != index.ntotal:
        raise DataError(
            str(corpus_path),
            f"has {len(offsets) - 1} passages, but {faiss_path} holds {index.ntotal} vectors: row i of the index must be passage i of this corpus",
        )
    del index
    links = {FAISS_FILE: _link(faiss_path, out / FAISS_FILE), PASSAGES_FILE: _link(corpus_path, out / PASSAGES_FILE)}
    (out / OFFSETS_FILE).write_bytes(safetensors.numpy.save({"offsets": offsets}))
    queries, passages = default_prefixes(model, query_prefix, passage_prefix)
    settings = {
        "model": model or DEFAULT_MODEL,
        "query_prefix": queries,
        "passage_prefix": passages,
        "dim": dim,
        "normalized": True,
        "metric": "inner_product",
        "faiss": FAISS_FILE,
        "faiss_source": str(faiss_path.resolve()),
        "corpus_source": str(corpus_path.resolve()),
        "corpus_bytes": size,
        "links": links,
    }
    write_json(out / SETTINGS_FILE, settings)
    return FaissFileRetriever.load(out)


def _link(source: Path, target: Path) -> str:
    """Put ``source`` at ``target`` without copying it: a hard link, else (another file system, or one
    without hard links) a symbolic link to its absolute path; return which."""
    try:
        os.link(source, target)
        return "hard"
    except OSError:
        target.symlink_to(source.resolve())
        log.warning("%s is a symbolic link to %s (no hard link possible): moving that file breaks the index", target, source)
        return "symbolic"


class FaissFileRetriever(DenseRetriever):
    """:class:`DenseRetriever`'s search over a FAISS file and a lazily read corpus (no partitions)."""

    def __init__(
        self, index: Any, passages: PassageFile, settings: dict[str, Any], *, mapped: bool, batch_size: int = 64
    ) -> None:
        """Built by :meth:`load`. Not :meth:`DenseRetriever.__init__`: nothing is encoded or copied."""
        if index.ntotal != len(passages):
            raise DataError(str(passages.path), f"has {len(passages)} passages, the FAISS index {index.ntotal} vectors")
        self.corpus = PartitionedPassages.unpartitioned(passages)
        self.model = settings["model"]
        self.query_prefix, self.passage_prefix = settings["query_prefix"], settings["passage_prefix"]
        self.batch_size = batch_size
        self._encoder = None
        self._encoder_lock = threading.Lock()
        self.dim = int(index.d)
        self._indexes = {None: index}
        self._settings = dict(settings)
        self.mapped = mapped

    def settings(self) -> dict[str, Any]:
        return dict(self._settings)

    def save(self, directory: str | Path) -> None:
        raise ValueError("an imported FAISS index is not re-saved: import it again with `prorag index --faiss`")

    @classmethod
    def load(cls, directory: str | Path) -> FaissFileRetriever:
        """Open what :func:`import_faiss` wrote: the FAISS file memory-mapped where possible."""
        directory = Path(directory)
        settings = read_json(directory / SETTINGS_FILE)
        index, mapped = read_faiss(directory / settings["faiss"])
        if index.d != settings["dim"]:
            raise DataError(
                str(directory / settings["faiss"]), f"dimension {index.d}, the index recorded {settings['dim']}: import it again"
            )
        offsets = load_numpy(directory / OFFSETS_FILE, remedy="import the index again with `prorag index --faiss`")["offsets"]
        return cls(index, PassageFile(directory / PASSAGES_FILE, offsets, settings["corpus_bytes"]), settings, mapped=mapped)
