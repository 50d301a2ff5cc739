"""The API pages and the nav entries of docs/api/ are what docs/scripts/gen_api.py writes now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_api_pages_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, "docs/scripts/gen_api.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_every_subpackage_has_a_page() -> None:
    packages = {p.parent.name for p in (ROOT / "prorag").glob("*/__init__.py")}
    pages = {p.stem for p in (ROOT / "docs" / "api").glob("*.md")} - {"index"}
    assert pages == packages, "run `python docs/scripts/gen_api.py`"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert [n for n in sorted(packages) if f"api/{n}.md" not in nav] == []
