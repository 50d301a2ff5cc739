"""prorag: retrieval-augmented reasoning agents trained with process supervision.

The package is laid out by concept (see the README's architecture section):
``prorag.data`` (records, JSONL io, benchmark loaders, corpora, the built-in world),
``prorag.retrieval`` (the Retriever contract, BM25, dense, HTTP server and client),
``prorag.core.metrics`` (answer and retrieval metrics), and ``prorag.cli`` (the command line).
"""

import os

# `datasets` (through TRL) imports JAX when it is installed, and JAX then takes 75% of the GPU's
# memory at start-up: seen on an H100 as an out-of-memory error in the MCTS's first batch with
# 16 GiB allocated by PyTorch. prorag never runs JAX on the GPU; a user who sets the variable keeps
# their value.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

__version__ = "0.1.0"
