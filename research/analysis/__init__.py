"""The studies' analyses, importable from the repository root as ``research.analysis.<module>``."""
