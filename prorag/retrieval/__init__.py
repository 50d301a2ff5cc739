"""Retrieval: the :class:`~prorag.retrieval.base.Retriever` contract and its implementations.

* :mod:`prorag.retrieval.bm25`: lexical BM25 (bm25s), the default;
* :mod:`prorag.retrieval.dense`: sentence-transformers encoder + FAISS inner-product search;
* :mod:`prorag.retrieval.index`: build, save and load an index folder of either kind;
* :mod:`prorag.retrieval.server` / :mod:`prorag.retrieval.client`: the same contract over HTTP
  in the Search-R1 wire format.
"""

from prorag.retrieval.base import Hit, Retriever, format_documents

__all__ = ["Hit", "Retriever", "format_documents"]
