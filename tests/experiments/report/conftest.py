"""The report tests' run folder, built once (:func:`run_dir`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.data.jsonl import write_json, write_jsonl
from prorag.data.records import read_records
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.harness import evaluate
from prorag.experiments.report.build import write_report
from prorag.experiments.report.step_scores import score_eval_trajectories
from prorag.retrieval.bm25 import BM25Retriever
from tests.experiments.report.hand_run import KindScorer, hand_system
from tests.fakes import ReplayLM


@pytest.fixture(scope="session")
def run_dir(
    tmp_path_factory: pytest.TempPathFactory, tiny_world: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever
) -> Path:
    """A pipeline run folder (contract 5) with three systems:

    * ``prorag``: evaluated by the real harness with a policy that replays gold trajectories,
      step scores from a fake PRM;
    * ``grpo``: hand-written trajectories (one hostile), two seeds and a t-test against prorag;
    * ``naive``: metrics only, no evaluation folder.
    """
    run = tmp_path_factory.mktemp("run")
    records = read_records(tiny_world / "test.jsonl")[:6]
    golds = render_gold(records, tiny_retriever, k=3)
    probe = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, tiny_retriever)
    targets = {tuple(probe.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments)[0] for g in golds}
    model = ReplayLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id)
    cfg = EvalConfig(rollout=EvalRolloutConfig(batch_size=6))
    full = evaluate(model, world_tokenizer, records, tiny_retriever, run / "eval" / "prorag", cfg, progress=False)
    score_eval_trajectories(KindScorer(), run / "eval" / "prorag", batch_size=4)
    grpo = hand_system(run / "eval" / "grpo", records)
    naive = {"em": 0.125, "f1": 0.25, "format_valid_rate": 1.0, "mean_retrieval_steps": 0.0, "n": 6}
    write_jsonl(
        run / "rl" / "prorag" / "metrics.jsonl",
        [{"step": s, "outcome_reward": 0.1 * s} for s in range(1, 6)] + [{"train_runtime": 3.0}],
    )
    write_jsonl(run / "rl" / "grpo" / "metrics.jsonl", [{"step": s, "outcome_reward": 0.05 * s} for s in range(1, 6)])
    results = {
        "systems": {
            "naive": {"label": "Naive generation", "metrics": naive},
            "grpo": {
                "label": "GRPO baseline",
                "eval_dir": "eval/grpo",
                "metrics": grpo,
                "seeds": {"0": grpo | {"em": 0.2}, "1": grpo | {"em": 0.4}},
                "per_question": "eval/grpo/predictions.jsonl",
            },
            "prorag": {
                "label": "ProRAG (full)",
                "eval_dir": "eval/prorag",
                "metrics": full,
                "per_question": "eval/prorag/predictions.jsonl",
            },
        },
        "order": ["naive", "grpo", "prorag"],
        "curves": {"prorag": "rl/prorag/metrics.jsonl", "grpo": "rl/grpo/metrics.jsonl", "missing": "rl/none/metrics.jsonl"},
        "beta_sweep": {"0.0": {"em": 0.3, "f1": 0.4, "em_std": 0.05, "f1_std": 0.02}, "0.3": {"em": 0.5, "f1": 0.6}},
        "significance": {"grpo": {"metric": "em", "t": -2.5, "p_value": 0.0412, "n": 6}},
        "wall_seconds": {"sft": 12.5, "rl": 125.0},
        "world": {"test_questions": 6, "passages": 42},
        "stages": {
            "rft": {
                "by_hops": {
                    "1": {"questions": 2, "samples": 8, "correct": 6, "trajectories_kept": 3},
                    "2": {"questions": 2, "samples": 8, "correct": 1, "trajectories_kept": 1},
                }
            }
        },
    }
    write_json(run / "results.json", results)
    write_report(run)
    return run
