"""The experiments layer: the whole method in one run folder (``pipeline``), the paper's ablations
(``ablations``) and the report a person reads (``report/``).
May import every layer but cli (``tests/test_layers.py``).
"""
