"""prorag: retrieval-augmented reasoning agents trained with process supervision (ProRAG and kin).

Packages are layers, each importing only from those before it (``tests/test_layers.py``):
``core`` (errors, config, registry, metrics) < ``data`` < ``retrieval`` < ``agent`` (trajectory
format, prompts, rollout engine, gold trajectories) < ``models`` < ``method`` (losses, search tree,
advantages, rewards) < ``supervision`` (judges, PRM, LLM teacher) < ``evaluation`` < ``stages``
(SFT, MCTS, pairs, PRM, RFT, RL) < ``experiments`` (pipeline, ablations, report) < ``cli``.
The method is specified in docs/METHOD.md; what it does at CPU scale is in docs/RESULTS.md.
"""

import os

# `datasets` (through TRL) imports JAX when it is installed, and JAX then takes 75% of the GPU's
# memory at start-up, and PyTorch then runs out of memory in the MCTS's first batch. prorag never
# runs JAX on the GPU; a user who sets the variable keeps their value.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

__version__ = "0.1.0"
