"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

#: The real benchmark files (read-only), in the shared folder beside the repository.
BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    """Folder of the real benchmark files; the tests that need it skip when it is absent."""
    if not BENCHMARKS_DIR.is_dir():
        pytest.skip(f"shared benchmark data not found at {BENCHMARKS_DIR}")
    return BENCHMARKS_DIR
