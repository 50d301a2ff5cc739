"""Running a study driver as a user runs it: ``python -m research.drivers.NAME`` from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = ROOT / "research" / "drivers"


def run_driver(name: str, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``research/drivers/NAME.py`` run with ``args`` from the repository root, one torch thread."""
    return subprocess.run(
        [sys.executable, "-m", f"research.drivers.{name}", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
