"""The beta ablation reuses the pipeline's GRPO and ProRAG runs: same stage names, same settings."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import prorag.experiments.ablations as ablations
from prorag.evaluation.harness import ANSWER_METRIC_NAMES
from prorag.experiments.pipeline import Run, demo_config, fingerprint, stage_eval, stage_rl


class RecordingRun(Run):
    """A run whose stages are recorded, not run; an evaluation writes the files the sweep reads."""

    def stage(self, name: str, settings: Any, fn: Any) -> None:
        self.recorded[name] = fingerprint(settings)  # type: ignore[attr-defined]
        if name.startswith("eval-"):
            out = self.path("eval", name.removeprefix("eval-"))
            out.mkdir(parents=True, exist_ok=True)
            (out / "metrics.json").write_text(
                json.dumps({"em": 0.5, "f1": 0.5, "format_valid_rate": 1.0, "mean_retrieval_steps": 2})
            )
            rows = [{"id": f"q{i}", **{m: float((i + len(m)) % 2) for m in ANSWER_METRIC_NAMES}} for i in range(4)]
            (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(tmp_path: Path, **changes: Any) -> RecordingRun:
    run = RecordingRun(tmp_path, replace(demo_config(), seeds=[0, 1], **changes), progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    return run


def test_beta_sweep_reuses_the_grpo_and_prorag_runs(tmp_path: Path) -> None:
    pipeline = _run(tmp_path / "a")
    stage_rl(pipeline)
    stage_eval(pipeline)
    sweep = _run(tmp_path / "a")  # the same folder, later: the ablation after the pipeline
    out = ablations.beta_sweep(sweep, progress=lambda _: None)
    assert set(out) == {f"{b:g}" for b in ablations.BETAS}
    names = set(sweep.recorded)  # type: ignore[attr-defined]
    for seed in (0, 1):
        for system in ("grpo", "prorag"):
            for kind in ("rl", "eval"):
                name = f"{kind}-{system}-seed{seed}"
                assert name in names, name
                # ... with the pipeline's settings: its finished stage is skipped, not refused.
                assert sweep.recorded[name] == pipeline.recorded[name], name  # type: ignore[attr-defined]
    assert "rl-beta0.5-seed1" in names and not any(n.startswith(("rl-beta0-", "rl-beta0.3-")) for n in names)
    assert "vs_0.3" in out["0"] and "vs_0.3" not in out["0.3"]


def test_without_those_systems_the_sweep_trains_its_own(tmp_path: Path) -> None:
    run = _run(tmp_path, systems=["sft", "rft"])
    assert ablations.sweep_variant(run, 0.0, 1) == "beta0-seed1"
    assert ablations.sweep_variant(run, 0.3, 0) == "beta0.3-seed0"
    assert ablations.sweep_variant(_run(tmp_path), 0.3, 0) == "prorag-seed0"
    assert ablations.sweep_variant(_run(tmp_path), 0.1, 0) == "beta0.1-seed0"
