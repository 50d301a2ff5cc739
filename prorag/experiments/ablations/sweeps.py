"""The paper's sweeps on a pipeline run folder: beta (Table 3) and documents per retrieval (Figure 5).

``beta``: RL from pi_rft with each beta of :data:`BETAS`, once per seed, tested against beta 0.3 (the
paper's peak of an inverted U). ``topk``: the full ProRAG policy evaluated with 1, 3 and 5 documents;
the policy is trained with the config's ``top_k`` and only the evaluation changes. Points that are
pipeline systems (beta 0 is GRPO, the config's beta is ProRAG) reuse those runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from prorag.core.statistics import mean_and_spread
from prorag.data.jsonl import read_json
from prorag.evaluation.harness import compare_predictions
from prorag.experiments.ablations.runs import train_and_test
from prorag.experiments.pipeline import Run, rl_config, rl_run_name, system_eval_config

BETAS: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
TOP_KS: tuple[int, ...] = (1, 3, 5)


def summarise_variant(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean and spread over seeds of a variant's EM and F1 (``em``, ``em_std``, ``f1``, ...)."""
    out: dict[str, float] = {"seeds": float(len(rows))}
    for key in ("em", "f1", "format_valid_rate", "mean_retrieval_steps"):
        mean, spread = mean_and_spread(float(r[key]) for r in rows)
        out[key], out[f"{key}_std"] = mean, spread
    return out


def significance(reference: Path, other: Path, metric: str = "em") -> dict[str, float]:
    """Paired t-test of per-question ``metric`` of the ``reference`` eval folder against ``other``."""
    return compare_predictions(reference / "predictions.jsonl", other / "predictions.jsonl")[metric]


def sweep_variant(run: Run, beta: float, seed: int) -> str:
    """The name of the RL run (and of its test evaluation) of one point of the beta sweep.

    RL from pi_rft with beta 0 is the GRPO baseline system and with the config's beta the full
    ProRAG system: when those systems are in the run, their names are returned, so the sweep
    reuses their finished runs and evaluations (same settings, same stage fingerprints) instead
    of training them again. Any other beta is ``beta{B}-seed{S}``."""
    systems = run.config.systems
    if beta == 0.0 and "grpo" in systems:
        return rl_run_name("grpo", seed)
    if beta == run.config.rl.beta and "prorag" in systems:
        return rl_run_name("prorag", seed)
    return f"beta{beta:g}-seed{seed}"


def beta_sweep(run: Run, progress: Callable[[str], None]) -> dict[str, Any]:
    """RL from pi_rft with each beta of :data:`BETAS` and every seed; test EM/F1 per beta."""
    cfg = run.config
    ev = system_eval_config(cfg, "prorag")
    out: dict[str, Any] = {}
    for beta in BETAS:
        rows = []
        for seed in cfg.seeds:
            name = sweep_variant(run, beta, seed)
            ev_dir = train_and_test(run, name, rl_config(run, "rft", process=beta > 0, beta=beta, seed=seed), ev)
            rows.append(read_json(ev_dir / "metrics.json"))
        out[f"{beta:g}"] = summarise_variant(rows)
        progress(f"beta {beta:g}: EM {out[f'{beta:g}']['em']:.3f}±{out[f'{beta:g}']['em_std']:.3f}")
    ref = run.path("eval", sweep_variant(run, 0.3, cfg.seeds[0]))
    for beta in BETAS:
        if beta != 0.3:
            out[f"{beta:g}"]["vs_0.3"] = significance(ref, run.path("eval", sweep_variant(run, beta, cfg.seeds[0])))
    return out


def topk_sweep(run: Run, progress: Callable[[str], None]) -> dict[str, Any]:
    """The full ProRAG policy (first seed) evaluated with each top-k of :data:`TOP_KS`."""
    from prorag.evaluation.runner import evaluate_files

    cfg = run.config
    policy = str(run.path("rl", rl_run_name("prorag", cfg.seeds[0]), "policy"))
    out: dict[str, Any] = {}
    for k in TOP_KS:
        ev = replace(cfg.eval, rollout=replace(cfg.eval.rollout, top_k=k))
        d = run.path("eval", f"prorag-top{k}")
        run.stage(
            f"eval-prorag-top{k}",
            ev,
            lambda e=ev, d=d: evaluate_files(
                policy, run.path("splits", "test.jsonl"), str(run.path("index")), d, e, device=run.device
            ),
        )
        out[str(k)] = summarise_variant([read_json(d / "metrics.json")])
        progress(f"top-{k}: EM {out[str(k)]['em']:.3f} F1 {out[str(k)]['f1']:.3f}")
    return out
