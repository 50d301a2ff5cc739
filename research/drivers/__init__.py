"""The studies' driver scripts, run from the repository root as ``python -m research.drivers.<name>``."""
