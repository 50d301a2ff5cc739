"""Lexical BM25 retrieval over passages, with bm25s.

* bm25s's own tokenisation, lowercased, English stopwords removed, **no stemmer**: an optional
  native stemmer's version would change tokens and scores across machines. Titles are indexed with
  the text.
* One sub-index per partition plus one over everything: a partition (one parallel world) is scored
  with its own document frequencies, as a corpus of its own, unseen by other partitions.
* A batch is tokenised once, grouped by partition, one batched ``retrieve`` per group.
* A query with no indexed term gets no hits, and 0-score hits are dropped (their order is arbitrary noise).
* Files are bm25s's format (``.npy`` with ``allow_pickle=False``, JSON) plus ``passages.jsonl`` and
  ``bm25.json``; nothing is pickled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from prorag.core.errors import DataError
from prorag.data.jsonl import read_json, write_json
from prorag.data.records import Passage
from prorag.retrieval.base import Hit, check_search_args
from prorag.retrieval.partitions import PartitionedIndex, PartitionedPassages

# bm25s pins its logger at DEBUG, which prints a line per sub-index built whatever the
# application's logging level; let the application's configuration decide instead.
logging.getLogger("bm25s").setLevel(logging.NOTSET)

#: Settings file of a BM25 index folder (tokeniser, BM25 parameters, sub-index folders).
SETTINGS_FILE = "bm25.json"
#: Tokeniser settings; stored in the index and checked on load, since queries must be
#: tokenised exactly as the passages were.
TOKENIZER: dict[str, Any] = {"lower": True, "stopwords": "en", "stemmer": None, "token_pattern": r"(?u)\b\w\w+\b"}


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """Tokenise a batch with the index's fixed settings (see the module docstring)."""
    return bm25s.tokenize(
        list(texts),
        lower=TOKENIZER["lower"],
        token_pattern=TOKENIZER["token_pattern"],
        stopwords=TOKENIZER["stopwords"],
        stemmer=None,
        return_ids=False,
        show_progress=False,
    )


#: The files of a bm25s sub-index folder, in the order bm25s reads them.
SUBINDEX_FILES = ("params.index.json", "vocab.index.json", "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy")
#: What to do about a damaged index file.
REBUILD = "the index is damaged, rebuild it with `prorag index`"


def _load_subindex(folder: Path) -> bm25s.BM25:
    """bm25s's load of one sub-index folder (arrays with ``allow_pickle=False``). bm25s's errors
    name no file (``Unterminated string starting at: line 1 column 1521``), so on a failure each
    file is read on its own to find the damaged one, and that one is named; only a failure no
    single file explains names the folder."""
    try:
        return bm25s.BM25.load(folder, allow_pickle=False, load_corpus=False, show_progress=False)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, EOFError) as e:
        where, what = _damaged_subindex_file(folder) or (str(folder), f"{type(e).__name__}: {e}")
        raise DataError(where, f"{' '.join(what.split())}; {REBUILD}") from None


def _damaged_subindex_file(folder: Path) -> tuple[str, str] | None:
    """The first file of :data:`SUBINDEX_FILES` in ``folder`` that does not read as what it should
    be (a JSON object, a numpy array without pickle), and what is wrong with it."""
    for name in SUBINDEX_FILES:
        path = folder / name
        try:
            if path.suffix == ".json":
                value = json.loads(path.read_bytes().decode("utf-8"))
                if not isinstance(value, dict):
                    return str(path), f"expected a JSON object, got {type(value).__name__}"
            else:
                np.load(path, allow_pickle=False)
        except FileNotFoundError:
            return str(path), "no such file"
        except UnicodeDecodeError:
            return str(path), "not UTF-8 text"
        except (OSError, ValueError, EOFError) as e:
            return str(path), str(e) or type(e).__name__
    return None


#: Threads for bm25s's batched retrieve. Sequential: bm25s's numpy scorer holds the GIL for
#: most of each query, and on 2 cores its thread pool measured slower than one thread. Pass
#: ``n_threads`` to try more on bigger machines.
DEFAULT_THREADS = 0


class BM25Retriever(PartitionedIndex):
    """BM25 over a list of passages (see the module docstring for the choices made)."""

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        n_threads: int | None = None,
        source: str = "corpus",
    ) -> None:
        """Index ``passages``: one sub-index over all of them and one per partition. ``source``
        (the corpus file) names them in errors."""
        if not passages:
            raise DataError(source, "no passages to index")
        self.corpus = PartitionedPassages(passages)
        self.k1, self.b = k1, b
        self.n_threads = DEFAULT_THREADS if n_threads is None else n_threads
        tokens = tokenize([p.contents for p in self.corpus.passages])
        self._indexes: dict[str | None, bm25s.BM25] = {None: self._build(tokens, source)}
        for name, rows in self.corpus.rows.items():
            self._indexes[name] = self._build([tokens[r] for r in rows], f"{source}: partition {name!r}")

    def _build(self, tokens: list[list[str]], what: str) -> bm25s.BM25:
        if not any(tokens):  # bm25s fails with "max() arg is an empty sequence"
            raise DataError(what, "no passage has an indexable word (only punctuation or stop words): nothing to search")
        index = bm25s.BM25(k1=self.k1, b=self.b, method="lucene", backend="numpy")
        index.index(tokens, show_progress=False)
        return index

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        """Top-``k`` passages of each query (fewer when fewer passages share a term with it)."""
        parts = check_search_args(queries, k, partitions)
        groups = self.corpus.group(parts)
        tokens = tokenize(queries)
        results: list[list[Hit]] = [[] for _ in queries]
        for name, positions in groups.items():
            self._search_group(name, positions, tokens, k, results)
        return results

    def _search_group(
        self, name: str | None, positions: list[int], tokens: list[list[str]], k: int, results: list[list[Hit]]
    ) -> None:
        """Search the queries at ``positions`` in one sub-index with a single batched call."""
        index = self._indexes[name]
        # Token ids in this sub-index's vocabulary; a query with none of them has no hits.
        active = [(qi, ids) for qi in positions if (ids := index.get_tokens_ids(tokens[qi]))]
        if not active:
            return
        k = min(k, int(index.scores["num_docs"]))
        # numpy top-k, always: bm25s's "auto" picks JAX whenever it is installed, and JAX takes
        # most of a GPU's memory the moment it starts (a policy training on that GPU then runs out).
        docs, scores = index.retrieve(
            [ids for _, ids in active],
            k=k,
            show_progress=False,
            n_threads=self.n_threads,
            return_as="tuple",
            backend_selection="numpy",
        )
        for (qi, _), doc_row, score_row in zip(active, docs.tolist(), scores.tolist(), strict=True):
            results[qi] = [h for h in self.corpus.hits(name, doc_row, score_row) if h.score > 0]

    def settings(self) -> dict[str, Any]:
        """What the index manifest records about this retriever."""
        return {"k1": self.k1, "b": self.b, "method": "lucene", "tokenizer": TOKENIZER}

    def save(self, directory: str | Path) -> None:
        """Write passages, one bm25s folder per sub-index, and ``bm25.json`` (last)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.corpus.save(directory)
        subindexes = []
        for i, (name, index) in enumerate(self._indexes.items()):
            rel = "bm25/all" if name is None else f"bm25/part{i:05d}"
            index.save(directory / rel, allow_pickle=False, show_progress=False)
            subindexes.append({"partition": name, "path": rel})
        write_json(directory / SETTINGS_FILE, {**self.settings(), "subindexes": subindexes})

    @classmethod
    def load(cls, directory: str | Path, *, n_threads: int | None = None) -> BM25Retriever:
        """Load what :meth:`save` wrote (arrays read with ``allow_pickle=False``)."""
        directory = Path(directory)
        settings = read_json(directory / SETTINGS_FILE)
        if settings.get("tokenizer") != TOKENIZER:
            raise DataError(
                str(directory / SETTINGS_FILE),
                f"index was tokenised with {settings.get('tokenizer')}, this version tokenises with {TOKENIZER}: rebuild the index",
            )
        self = cls.__new__(cls)
        self.corpus = PartitionedPassages.load(directory)
        self.k1, self.b = float(settings["k1"]), float(settings["b"])
        self.n_threads = DEFAULT_THREADS if n_threads is None else n_threads
        self._indexes = {sub["partition"]: _load_subindex(directory / sub["path"]) for sub in settings["subindexes"]}
        self._check_loaded(directory)
        return self

    def _check_loaded(self, directory: Path) -> None:
        """The sub-indexes must cover exactly the passages' partitions, with matching sizes."""
        expected = {None: len(self.corpus), **{n: len(r) for n, r in self.corpus.rows.items()}}
        found = {name: int(index.scores["num_docs"]) for name, index in self._indexes.items()}
        if found != expected:
            raise DataError(str(directory), "BM25 sub-indexes do not match passages.jsonl: the index is corrupt, rebuild it")
