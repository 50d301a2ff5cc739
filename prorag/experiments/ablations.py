"""The paper's ablations on a pipeline run folder (``prorag ablate``).

* ``table2``: every system of the config over its seeds (the pipeline itself), with the
  paired t-test of each against full ProRAG (Table 2).
* ``beta``: process-supervised RL from pi_rft with beta in {0, 0.1, 0.3, 0.5, 0.7, 0.9}, once per
  seed, evaluated on test (Table 3; the paper finds an inverted U peaking at 0.3).
* ``topk``: the full ProRAG policy evaluated with 1, 3 and 5 documents per retrieval
  (Figure 5). The policy is trained with the config's ``top_k``; only the evaluation changes,
  which measures how the trained reader uses more or fewer documents.

Each variant is one more stage of the same run folder (``stages/NAME.json`` markers), so an
ablation reuses SFT, the PRM and RFT, resumes after a kill, and its results are merged into
``results.json`` (``beta_sweep``, ``topk``) for the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from prorag.core.metrics import mean_and_spread
from prorag.data.jsonl import read_json, write_json
from prorag.evaluation.harness import compare_predictions
from prorag.experiments.pipeline import (
    PipelineConfig,
    Run,
    resolve,
    results_table,
    rl_config,
    rl_run_name,
    run_pipeline,
    system_eval_config,
)

BETAS: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
TOP_KS: tuple[int, ...] = (1, 3, 5)
Ablation = Literal["table2", "beta", "topk"]


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
    from prorag.evaluation.harness import evaluate_files
    from prorag.stages.rl import train_rl

    cfg = run.config
    ev = system_eval_config(cfg, "prorag")
    out: dict[str, Any] = {}
    for beta in BETAS:
        rows = []
        for seed in cfg.seeds:
            name = sweep_variant(run, beta, seed)
            rl_cfg = rl_config(run, "rft", process=beta > 0, beta=beta, seed=seed)
            run.stage(f"rl-{name}", rl_cfg, lambda c=rl_cfg, n=name: train_rl(c, run.path("rl", n)))
            ev_dir = run.path("eval", name)
            run.stage(
                f"eval-{name}",
                ev,
                lambda n=name, d=ev_dir: evaluate_files(
                    str(run.path("rl", n, "policy")), run.path("splits", "test.jsonl"), str(run.path("index")), d, ev
                ),
            )
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
    from prorag.evaluation.harness import evaluate_files

    cfg = run.config
    policy = str(run.path("rl", rl_run_name("prorag", cfg.seeds[0]), "policy"))
    out: dict[str, Any] = {}
    for k in TOP_KS:
        ev = replace(cfg.eval, rollout=replace(cfg.eval.rollout, top_k=k))
        d = run.path("eval", f"prorag-top{k}")
        run.stage(
            f"eval-prorag-top{k}",
            ev,
            lambda e=ev, d=d: evaluate_files(policy, run.path("splits", "test.jsonl"), str(run.path("index")), d, e),
        )
        out[str(k)] = summarise_variant([read_json(d / "metrics.json")])
        progress(f"top-{k}: EM {out[str(k)]['em']:.3f} F1 {out[str(k)]['f1']:.3f}")
    return out


def run_ablation(
    config: PipelineConfig, run_dir: str | Path, what: Ablation | str, *, progress: Callable[[str], None] = print
) -> str:
    """Run one ablation in ``run_dir`` (the pipeline first, skipping what is done) and merge its
    numbers into ``results.json``; returns a table for the terminal."""
    results = run_pipeline(config, run_dir, progress=progress)
    if what == "table2":
        lines = [results_table(results), "", "paired t-test against full ProRAG (per-question EM / F1):"]
        for name, row in results.get("significance", {}).items():
            lines.append(f"  {name:<14} EM p={row['p_value']:.4f} (t={row['t']:.2f})  F1 p={row['f1']['p_value']:.4f}")
        return "\n".join(lines)
    run = Run(Path(run_dir), resolve(config), progress)
    if what == "beta":
        results["beta_sweep"] = beta_sweep(run, progress)
        rows = results["beta_sweep"]
        text = "\n".join(
            f"beta {b:>4}: EM {r['em']:.3f}±{r['em_std']:.3f}  F1 {r['f1']:.3f}±{r['f1_std']:.3f}" for b, r in rows.items()
        )
    elif what == "topk":
        results["topk"] = topk_sweep(run, progress)
        text = "\n".join(f"top-{k}: EM {r['em']:.3f}  F1 {r['f1']:.3f}" for k, r in results["topk"].items())
    else:
        raise ValueError(f"unknown ablation {what!r}; expected table2, beta or topk")
    # Merge with what earlier ablations wrote.
    path = Path(run_dir) / "results.json"
    write_json(path, results)
    if config.report:
        from prorag.experiments.report.build import write_report

        write_report(Path(run_dir))
    return text


__all__ = [
    "BETAS",
    "TOP_KS",
    "beta_sweep",
    "run_ablation",
    "significance",
    "summarise_variant",
    "sweep_variant",
    "topk_sweep",
]
