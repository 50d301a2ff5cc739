"""``benchmarks/server_load.py`` run small: 16 concurrent clients against a real server, no errors."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "server_load.py"


def test_percentile_is_nearest_rank() -> None:
    load = _script()
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert (load.percentile(values, 0.5), load.percentile(values, 0.99), load.percentile(values, 1.0)) == (50.0, 99.0, 100.0)
    assert load.percentile([3.0], 0.99) == 3.0


@pytest.mark.slow
def test_load_script_runs_small(tmp_path: Path) -> None:
    report = _script().main(["--clients", "16", "--requests", "160", "--max-seconds", "60", "--out", str(tmp_path / "r.json")])
    assert report["clients"] == 16 and report["errors"] == 0 and report["answered"] == 160
    assert 0 < report["p50_ms"] <= report["p99_ms"] <= report["max_ms"]
    assert (tmp_path / "r.json").is_file()


def _script():  # noqa: ANN202 - the script's module
    spec = importlib.util.spec_from_file_location("server_load", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
