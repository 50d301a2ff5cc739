"""The installed package holds no research: the wheel has no ``research/`` or ``benchmarks/`` file, and
``prorag --help`` lists no research command. The wheel is built offline from a copy of the source
tree (setuptools writes ``build/`` and ``*.egg-info`` beside the sources it builds)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from research.tests.drivers import ROOT

#: What a checkout holds beside its sources (.gitignore's folders), left out of the copy.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".venv", ".ruff_cache", ".hypothesis"
)
#: Commands the studies once had in the CLI; none may come back.
RESEARCH_COMMANDS = ("update-split", "update-noise", "seen-unseen", "interpolate", "pool-studies", "seed-runs")


@pytest.mark.slow
def test_the_wheel_holds_the_package_and_no_research(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    command = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist")]
    done = subprocess.run(command, cwd=source, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("prorag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "prorag/cli/__init__.py" in names and any(n.startswith("prorag/experiments/") for n in names)
    assert {"prorag/experiments/configs/demo.yaml", "prorag/experiments/configs/demo_quick.yaml"} <= set(names)  # `prorag demo`
    tops = {name.split("/")[0] for name in names}
    assert "research" not in tops and "benchmarks" not in tops, sorted(tops)
    # no analysis is shipped: not at the places the studies' modules used to live, nor as a copy anywhere
    assert not {"prorag/experiments/update_noise.py", "prorag/experiments/update_split.py", "prorag/core/meta_analysis.py"} & set(
        names
    )
    analyses = {p.read_bytes() for p in (ROOT / "research" / "analysis").glob("*.py") if p.name != "__init__.py"}
    with zipfile.ZipFile(wheel) as archive:
        copies = [n for n in names if n.endswith(".py") and archive.read(n) in analyses]
    assert not copies, f"an analysis module is also in the package: {copies}"


def test_the_command_line_lists_no_research_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "prorag.cli", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pipeline" in done.stdout and "compare" in done.stdout  # the listing itself, not an error
    assert not [c for c in RESEARCH_COMMANDS if c in done.stdout], done.stdout
