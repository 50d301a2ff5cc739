"""The CPU benchmark scripts run at their smallest settings and keep their contracts.

A benchmark that nobody runs breaks silently when the code under it changes (the gold-steered model
of ``rollout.py`` did once, when a decode step started to run some rows only). Each script runs here
as a user runs it, from ``benchmarks/``, and its JSON must hold the numbers its README line quotes,
with the agreement checks that make the ratio meaningful (same tokens on both sides)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _finite_positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _rollout(out: dict[str, Any] | list[dict[str, Any]]) -> None:
    (row,) = out
    assert row["size"] == "tiny" and row["questions"] == 4
    assert row["greedy_agreement"] == 1.0, "the engine and the naive loop decoded different tokens"
    assert row["followed_gold"] == 1.0, "the gold-steered model left its script"
    assert _finite_positive(row["speedup"]) and row["logprob_drift"] < 1e-4


def _mcts(out: dict[str, Any]) -> None:
    assert _finite_positive(out["ratio"]) and _finite_positive(out["token_ratio"])


def _rl_step(out: dict[str, Any]) -> None:
    assert _finite_positive(out["ratio"])


def _decode_graphs(out: dict[str, Any]) -> None:
    assert out["device"] == "cpu" and out["batch"] == 4
    assert out["greedy_agreement"] == 1.0 and out["greedy_logprob_gap"] < 1e-4
    assert out["sampled_agreement"] == 1.0, "the static step sampled other tokens than the eager engine"
    # The step compiled whole samples what the uncompiled one does (float32: the same tokens).
    assert out["compiled_sampled_agreement"] == 1.0 and out["graphs-compiled"]["tokens"] == out["graphs"]["tokens"]
    assert out["finished"] is True, "the last write marks the file complete (each side's partial write says False)"


def _rl_step_gpu(out: dict[str, Any]) -> None:
    assert _finite_positive(out["speedup"])


def _sample_streams(out: dict[str, Any]) -> None:
    row, batch = out["rows"]
    assert row["streams"] == "row" and batch["streams"] == "batch" and _finite_positive(out["time_ratio"])
    assert row["same_with_barrier"] == 1.0 and row["same_at_twice_the_batch"] == 1.0, "row streams sampled other tokens"


def _ablate_workers(out: dict[str, Any]) -> None:
    assert out["runs"] == 2 and out["workers"] == 2 and _finite_positive(out["speedup"])
    # The sides' threads per run differ on most machines, so their floats may part on near-ties.
    assert 0.5 <= out["same_predictions"] <= 1.0


def _compile_norms(out: dict[str, Any]) -> None:
    assert out["compiled_norms"] > 0 and _finite_positive(out["compile_seconds"])
    assert _finite_positive(out["training"]["speedup"]) and _finite_positive(out["rollout"]["speedup"])
    # float32 rounding of the fused norm may flip a near-tie of a sampled token, rarely
    assert out["same_rollouts"] >= 0.5 and out["model_tokens"] > 0


def _served(out: dict[str, Any]) -> None:
    assert _finite_positive(out["ratio"]) and out["max_in_flight"] >= 1


#: script, its smallest arguments (``--out`` is added), and what its JSON must satisfy.
SCRIPTS: dict[str, tuple[list[str], Callable[[Any], None]]] = {
    "rollout.py": (["--batch", "4", "--questions", "4", "--sizes", "tiny", "--repeats", "1"], _rollout),
    "mcts.py": (["--trees", "2", "--sequential-trees", "1", "--simulations", "1"], _mcts),
    "rl_step.py": (["--questions", "1", "--group", "2", "--repeats", "1"], _rl_step),
    "decode_graphs.py": (
        ["--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--batch", "4", "--new-tokens", "8", "--repeats", "1"]
        + ["--sides", "graphs-barrier,graphs-compiled"],
        _decode_graphs,
    ),
    "rl_step_gpu.py": (
        ["--shape", "tiny", "--device", "cpu", "--prompts", "1", "--group", "2", "--new-tokens", "16", "--steps", "2"],
        _rl_step_gpu,
    ),
    "sample_streams.py": (
        ["--questions", "4", "--samples", "2", "--batch", "4", "--repeats", "1", "--max-action-tokens", "16"],
        _sample_streams,
    ),
    "ablate_workers.py": (["--seeds", "2", "--rl-steps", "1", "--arms", "grpo"], _ablate_workers),
    "served.py": (["--questions", "4", "--rounds", "1", "--latency", "0.01", "--concurrency", "2"], _served),
    "compile_norms.py": (["--rows", "2", "--length", "32", "--batch", "2", "--repeats", "1"], _compile_norms),
}


def _run(script: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, script, *args], cwd=BENCHMARKS, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_script_runs_small_and_writes_its_numbers(script: str, tmp_path: Path) -> None:
    args, check = SCRIPTS[script]
    out = tmp_path / "out.json"
    done = _run(script, [*args, "--out", str(out)])
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    check(json.loads(out.read_text()))


@pytest.mark.slow
def test_rl_step_packed_runs_small(tmp_path: Path) -> None:
    """``rl_step.py --packed``: padded against packed scoring, and both in rows of one: finite ratios,
    the batch's padding share, and no more packed slots than padded positions."""
    out = tmp_path / "out.json"
    args = ["--packed", "--packed-rows", "1", "--questions", "1", "--group", "2", "--repeats", "1", "--out", str(out)]
    done = _run("rl_step.py", args)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert sorted(data["steps"]) == ["packed", "packed, rows of 1", "padded", "padded, rows of 1"]
    assert all(_finite_positive(r["forwards_ratio"]) and _finite_positive(r["step_ratio"]) for r in data["ratios"].values())
    assert 0 <= data["padding_share"] < 1 and data["packed_slots"] <= data["steps"]["padded"]["positions"]
    assert "packed / padded: scoring forwards" in done.stdout


@pytest.mark.slow
def test_rl_step_profile_runs_small() -> None:
    """The profile prints its table (it writes no JSON): three sides, each with a finite total."""
    done = _run("rl_step_profile.py", ["--questions", "1", "--group", "2", "--repeats", "1", "--scoring-rows", "1"])
    assert done.returncode == 0, done.stderr[-3000:]
    total = next(line for line in done.stdout.splitlines() if line.startswith("total"))
    times = [float(x) for x in total.split()[1:]]
    assert len(times) == 3 and all(_finite_positive(t) for t in times)
