"""prorag: retrieval-augmented reasoning agents trained with process supervision.

The package is laid out by concept (see the README's architecture section):
``prorag.data`` (records, JSONL io, benchmark loaders, corpora, the built-in world),
``prorag.retrieval`` (the Retriever contract, BM25, dense, HTTP server and client),
``prorag.metrics`` (answer and retrieval metrics), and ``prorag.cli`` (the command line).
"""

__version__ = "0.1.0"
