"""Does a PRM beat the init policy's own step likelihood? Four PRM arms on one tiny-world run.

Builds the quick demo's world, splits, pi_sft, MCTS trees and oracle pairs (with pointwise labels)
in ``RUN`` (stages resume), samples two fresh pi_sft trajectories per dev question once, then trains
each arm on the same pairs and writes its ``summary.json`` (:func:`~prorag.stages.prm.likelihood_verdict`):
``likelihood`` (the quick demo's PRM), ``head_eq4`` (the paper's head, Eq. 4 alone), ``head_pointwise``
(Eq. 4 + the pointwise cross-entropy) and ``head_pointwise_small`` (the same on a fresh ``small``
backbone, larger than the tiny policy). A quality measurement, not a speed one; results in docs/LOG.md.

    python -m research.drivers.prm_arms RUN [--sft-steps 300] [--sft-batch 16] [--arm NAME ...]
    python -m research.drivers.prm_arms RUN --config configs/pipelines/arms_demo.yaml   # on a finished pipeline run
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.trajectory import Trajectory
from prorag.core.config import load_config
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import read_records
from prorag.experiments.pipeline import (
    PipelineConfig,
    Run,
    _data_files,
    demo_config_file,
    resolve,
    stage_index,
    stage_sft,
    stage_splits,
    stage_world,
)
from prorag.models.checkpoints import load_policy
from prorag.retrieval.index import open_retriever
from prorag.stages.mcts import read_trees, run_mcts_files
from prorag.stages.pairs import extract_pairs
from prorag.stages.prm import SampledLikelihood, step_ranking_audit, train_prm, write_prm_summary
from prorag.supervision.reward_model import ProcessRewardModel

HEAD = {"kind": "head", "validation_fraction": 0.0, "learning_rate": 1e-3, "epochs": 3, "eval_steps": 10}
ARMS = {
    "likelihood": {},
    "head_eq4": HEAD | {"pointwise_weight": 0.0},
    "head_pointwise": HEAD,
    "head_pointwise_small": HEAD | {"backbone_size": "small", "learning_rate": 5e-4},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--sft-batch", type=int, default=16)
    ap.add_argument("--arm", action="append", choices=sorted(ARMS))
    ap.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a pipeline config whose run folder RUN already is (its SFT, MCTS and pairs are reused as they are); "
        "default: the quick demo, shrunk by --sft-steps/--sft-batch",
    )
    args = ap.parse_args()
    if args.config is not None:
        run = Run(args.run_dir, resolve(load_config(args.config, PipelineConfig)), print)
    else:
        cfg = load_config(demo_config_file(quick=True), PipelineConfig)
        data = replace(cfg.data, dev_questions=30, test_questions=30, mcts_questions=24)
        sft = replace(cfg.sft, max_steps=args.sft_steps, per_device_batch_size=args.sft_batch, save_steps=1000, eval_samples=0)
        run = Run(args.run_dir, resolve(replace(cfg, data=data, sft=sft, systems=["rft"])), print)
    cfg = run.config
    run.dir.mkdir(parents=True, exist_ok=True)
    files = _data_files(run)
    stage_world(run)
    stage_index(run, files)
    stage_splits(run, files)
    stage_sft(run, files)
    policy, index = str(run.path("policies", "sft", "policy")), str(run.path("index"))
    run.stage(
        "mcts", cfg.mcts, lambda: run_mcts_files(policy, run.path("splits", "mcts.jsonl"), index, run.path("mcts"), cfg.mcts)
    )
    pairs = run.path("pairs", "pairs.jsonl")
    run.stage("pairs", cfg.pairs, lambda: print(extract_pairs(read_trees(run.path("mcts")), pairs, cfg.pairs).describe()))

    records = [r for r in read_records(run.path("splits", "dev.jsonl")) for _ in range(2)]
    cached = run.path("audit_samples.jsonl")  # JSON, never a pickle
    if cached.exists():
        trajectories = [Trajectory.from_dict(d) for d in read_jsonl(cached)]
    else:
        model, tokenizer = load_policy(policy)
        engine = RolloutEngine(model, tokenizer, open_retriever(index), RolloutConfig(top_k=cfg.top_k))
        trajectories = engine.rollout(records, seed=cfg.seed)
        write_jsonl(cached, [t.to_dict() for t in trajectories])
    baseline = step_ranking_audit(SampledLikelihood(), trajectories, records)
    print("fresh samples ranked by pi_sft's likelihood:", json.dumps(baseline))
    for name in args.arm or list(ARMS):
        out = run.path("arms", name)
        t0 = time.perf_counter()
        train_prm(replace(cfg.prm, **ARMS[name], pairs_file=str(pairs), init=policy, seed=cfg.seed), out)
        audit = step_ranking_audit(ProcessRewardModel.load(out / "prm"), trajectories, records)
        audit["policy_likelihood_auc"] = baseline["auc"]
        print(name, f"{time.perf_counter() - t0:.0f}s", json.dumps(write_prm_summary(out, audit)))


if __name__ == "__main__":
    main()
