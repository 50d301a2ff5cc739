"""docs/CLI.md is what the commands' own ``--help`` prints now (docs/scripts/gen_cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # renders the help of every command: imports every stage's config (torch, transformers)
def test_cli_reference_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, "docs/scripts/gen_cli.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
