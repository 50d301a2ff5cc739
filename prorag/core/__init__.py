"""The core layer: what every other layer uses: :class:`~prorag.core.errors.DataError`, typed configs
from YAML, the registry type and the answer/retrieval metrics (docs/METHOD.md §7).
Imports nothing from prorag outside core (``tests/test_layers.py``).
"""
