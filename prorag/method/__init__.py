"""The method layer: ProRAG's equations as small pure functions (docs/METHOD.md §2): the SFT and
PPO-clip losses, the search-tree rules, group-relative advantages and the ``rewards`` package.
May import core, data, retrieval, agent and models; never supervision, evaluation, stages,
experiments or cli (``tests/test_layers.py``).
"""
