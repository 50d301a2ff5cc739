"""The retrieval layer: the :class:`~prorag.retrieval.base.Retriever` contract and its implementations:
BM25 (bm25s, the default), dense (sentence-transformers + FAISS), index folders of either kind, and
the same contract over HTTP in the Search-R1 wire format (``server`` / ``client``).
May import core and data only (``tests/test_layers.py``).
"""

from prorag.retrieval.base import Hit, Retriever, format_documents

__all__ = ["Hit", "Retriever", "format_documents"]
