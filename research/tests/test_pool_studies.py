"""The pooling drivers run as a user runs them and read the committed results as the LOG quotes them.

Moved here with the drivers from ``tests/benchmarks/test_scripts.py``: ``pool_studies.py`` writes its JSON
from the committed results files alone, and ``pool_studies_data.py --check`` reproduces every quoted
cell (a results file that changes, or a key path that reads another arm, fails here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = ROOT / "research" / "drivers"


def _run(script: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(DRIVERS / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_pool_studies_writes_each_contrast_pooled(tmp_path: Path) -> None:
    out = tmp_path / "pooled.json"
    done = _run("pool_studies.py", ["--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    pooled = {(e["contrast"], e["metric"], e["step"], e["scope"]): e for e in data["pooled"]}
    ofe = pooled[("oracle-first-error vs grpo", "em", "last", "all")]
    assert len(ofe["studies"]) == 6 and ofe["random_effects"]["studies"] == 6
    assert pooled[("oracle-first-error vs grpo", "valid_subanswer", "last", "all")]["random_effects"]["studies"] == 3
    for name in ("random_effects", "fixed_effect"):
        low, high = ofe[name]["ci"]
        assert low < ofe[name]["mean"] < high
    # Random effects weigh the studies more evenly: its interval is never narrower than the fixed one's.
    assert all(e["random_effects"]["se"] >= e["fixed_effect"]["se"] for e in data["pooled"])
    # Build 8 at the dev-chosen step has no spread (dev chose pi_rft in every run): it is left out, not weighed.
    prmfe_dev = pooled[("learned prm to its first error vs its shuffled control", "em", "dev", "all")]
    assert [s["study"] for s in prmfe_dev["studies"]] == ["small, build 5", "small, build 7"]


def test_pooled_studies_inputs_match_the_quoted_cells() -> None:
    done = _run("pool_studies_data.py", ["--check"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " NO" not in done.stdout and "yes" in done.stdout
