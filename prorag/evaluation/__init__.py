"""The evaluation layer: the harness that runs a policy or a baseline over records and scores it
(``harness``), and the naive and standard-RAG baselines with their training examples (``baselines``).
May import core .. supervision; never stages, experiments or cli (``tests/test_layers.py``).
"""
