"""The training stages of ProRAG (docs/METHOD.md §2): ``sft``/``sft_data`` (stage 1), ``mcts``,
``pairs``, ``prm`` (stage 2), ``rft`` (stage 3), ``rl`` (stage 4), and ``training`` (what every
trainer shares). Each reads and writes plain files in one run folder, resumes after a crash and ends
with a folder that :func:`prorag.models.checkpoints.load_policy` (or the PRM loader) reads.
May import every layer below it (core .. evaluation), never experiments or cli (``tests/test_layers.py``).
"""
