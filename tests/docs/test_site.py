"""The documentation site builds with warnings as errors, and its API reference documents every module.

``mkdocs build --strict`` fails on a broken link or anchor, a page missing from the nav, a nav entry
without a page, a reference to an object that does not exist and a docstring mkdocstrings cannot
render; the inventory it writes (objects.inv) then names every public module of the package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def public_modules() -> set[str]:
    """``prorag.x.y`` of every module and package whose path has no part starting with ``_``."""
    out = set()
    for path in (ROOT / "prorag").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if not any(p.startswith("_") for p in parts):
            out.add(".".join(parts))
    return out


def inventory_modules(path: Path) -> set[str]:
    """The ``py:module`` entries of a Sphinx inventory (version 2: four header lines, then zlib)."""
    data = path.read_bytes()
    body = zlib.decompress(data.split(b"\n", 4)[4]).decode("utf-8")
    return {line.split(" ", 1)[0] for line in body.splitlines() if line.split(" ")[1:2] == ["py:module"]}


@pytest.mark.slow
def test_site_builds_strict_and_documents_every_module(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the material theme's banner about MkDocs 2
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-6000:]}"
    missing = sorted(public_modules() - inventory_modules(site / "objects.inv"))
    assert missing == [], f"modules without API documentation: {missing}; run `python docs/scripts/gen_api.py`"
    assert (site / "LOG" / "index.html").exists() and (site / "METHOD" / "index.html").exists()
