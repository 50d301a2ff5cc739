"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The shared folder beside the repository (override with PRORAG_SHARED).
SHARED_DIR = Path(os.environ.get("PRORAG_SHARED", Path(__file__).resolve().parents[2] / "shared"))
#: The real benchmark files (read-only).
BENCHMARKS_DIR = SHARED_DIR / "data" / "benchmarks"


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    """Folder of the real benchmark files.

    These tests are core (they pin the loaders to the published schemas), so a missing folder
    is a failure with a clear message, never a silent skip.
    """
    if not BENCHMARKS_DIR.is_dir():
        pytest.fail(f"shared benchmark data not found at {BENCHMARKS_DIR}; set PRORAG_SHARED to the shared folder")
    return BENCHMARKS_DIR
