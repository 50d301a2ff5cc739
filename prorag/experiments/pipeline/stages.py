"""The pipeline's stages, each a function of the :class:`~prorag.experiments.pipeline.run_folder.Run`.

World, index, splits, SFT and its trained baselines, MCTS, pairs, the PRM and its audit, RFT, RL
and the evaluation of every system: each reads and writes fixed paths of the run folder and hands
its stage config, completed with those paths, to the stage's entry point in :mod:`prorag.stages`.
:func:`rl_config` builds every RL run of a run folder, the systems' and the ablations' alike, so
that a variant that is a system has the system's fingerprint and reuses its run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from prorag.data.jsonl import write_json
from prorag.data.records import read_records
from prorag.evaluation.eval_config import EvalConfig
from prorag.experiments.pipeline.config import RL_SYSTEMS, PipelineConfig
from prorag.experiments.pipeline.run_folder import Run, eval_dir_name, rl_run_name
from prorag.experiments.pipeline.splits import plan_splits, write_records
from prorag.stages.rl import RLConfig
from prorag.stages.rl.config import SFTReplayConfig


def _data_files(run: Run) -> dict[str, Path]:
    d = run.config.data
    if d.world is not None:
        w = run.path("world")
        files = {name: w / f"{name}.jsonl" for name in ("train", "dev", "test", "corpus")}
        return files | ({"rl": w / "rl.jsonl"} if d.rl_worlds else {})
    missing = [name for name in ("train_file", "test_file", "corpus_file") if not getattr(d, name)]
    if missing:
        raise ValueError(f"data: without a built-in world (data.world: null), set {', '.join('data.' + m for m in missing)}")
    files = {"train": Path(d.train_file), "test": Path(d.test_file), "corpus": Path(d.corpus_file)}  # type: ignore[arg-type]
    files["dev"] = Path(d.dev_file) if d.dev_file else files["test"]
    return files


def stage_world(run: Run) -> None:
    from prorag.data.world import build_world
    from prorag.data.world.generator import SIZES

    d = run.config.data
    if d.world is None:
        return
    if d.world not in SIZES:
        raise ValueError(f"data.world: unknown size {d.world!r}; expected one of {sorted(SIZES)} or null")
    size = replace(SIZES[d.world], passages=d.passages, rl_worlds=d.rl_worlds, rl_questions_per_world=d.rl_questions_per_world)
    run.stage(
        "world",
        {
            "size": d.world,
            "seed": d.world_seed,
            "passages": d.passages,
            "rl_worlds": d.rl_worlds,
            "rl_questions_per_world": d.rl_questions_per_world,
        },
        lambda: build_world(run.path("world"), d.world_seed, size),
    )


def stage_index(run: Run, files: dict[str, Path]) -> None:
    from prorag.retrieval.index import build_index, import_faiss_index

    ix = run.config.index

    def make() -> dict[str, Any]:
        prefixes = {"query_prefix": ix.query_prefix, "passage_prefix": ix.passage_prefix}
        if ix.faiss is not None:  # a FAISS index built elsewhere: imported, the corpus not encoded
            return import_faiss_index(ix.faiss, files["corpus"], run.path("index"), model=ix.model, **prefixes)
        return build_index(files["corpus"], run.path("index"), kind=ix.kind, model=ix.model, **prefixes)

    run.stage("index", asdict(ix), make)


def stage_splits(run: Run, files: dict[str, Path]) -> None:
    cfg = run.config

    def make() -> None:
        has_dev = files["dev"] != files["test"]
        test = read_records(files["test"])
        splits = plan_splits(
            read_records(files["train"]),
            read_records(files["dev"]) if has_dev else None,
            test,
            cfg.data,
            cfg.seed,
            rl=read_records(files["rl"]) if "rl" in files else None,
        )
        out = run.path("splits")
        for name, records in splits.records.items():
            write_records(out / f"{name}.jsonl", records)
        write_json(out / "manifest.json", splits.manifest)
        run.progress("splits: " + json.dumps(splits.manifest["counts"]))

    run.stage("splits", {"data": asdict(cfg.data), "seed": cfg.seed}, make)


def stage_sft(run: Run, files: dict[str, Path]) -> None:
    """Gold trajectories of the SFT questions, then pi_sft and the trained baselines."""
    from prorag.stages.sft import train_sft
    from prorag.stages.sft_data import build_sft_data

    cfg = run.config
    index = str(run.path("index"))
    trajectories = run.path("sft_data", "trajectories.jsonl")
    run.stage(
        "sft_data",
        cfg.sft_data,
        lambda: build_sft_data(run.path("splits", "sft.jsonl"), trajectories, cfg.sft_data, index=index),
    )
    base = replace(
        cfg.sft,
        world_dir=str(run.path("world")) if cfg.data.world is not None else cfg.sft.world_dir,
        train_file=str(trajectories),
        records_file=str(run.path("splits", "sft.jsonl")),
        eval_file=str(run.path("splits", "dev.jsonl")),
        index=index,
    )
    targets = [("sft", "prorag")] + [(s, s) for s in ("naive", "standard-rag") if s in cfg.systems]
    for name, target in targets:
        sft_cfg = replace(base, target=target)  # type: ignore[arg-type]
        run.stage(f"train-{name}", sft_cfg, lambda c=sft_cfg, n=name: train_sft(c, run.path("policies", n)))


def stage_prm(run: Run) -> None:
    """MCTS trees of pool questions from pi_sft, judged sibling pairs, the PRM, and the ``dpo`` baseline when listed."""
    from prorag.stages.mcts import read_trees, run_mcts_files
    from prorag.stages.pairs import extract_pairs, make_judge
    from prorag.stages.prm import train_prm

    cfg = run.config
    policy = str(run.path("policies", "sft", "policy"))
    index = str(run.path("index"))
    run.stage(
        "mcts",
        cfg.mcts,
        lambda: run_mcts_files(policy, run.path("splits", "mcts.jsonl"), index, run.path("mcts"), cfg.mcts, device=run.device),
    )
    pairs = run.path("pairs", "pairs.jsonl")

    def judge() -> None:
        summary = extract_pairs(read_trees(run.path("mcts")), pairs, cfg.pairs, judge=make_judge(cfg.pairs))
        write_json(run.path("pairs", "summary.json"), asdict(summary))

    run.stage("pairs", cfg.pairs, judge)
    run.stage("prm", cfg.prm, lambda: train_prm(replace(cfg.prm, pairs_file=str(pairs), init=policy), run.path("prm")))
    run.stage("prm-audit", {"top_k": cfg.top_k, "seed": cfg.seed}, lambda: audit_prm(run))
    if "dpo" in cfg.systems:
        from prorag.stages.dpo import train_dpo

        dpo_cfg = replace(cfg.dpo, pairs_file=str(pairs), init=policy)
        run.stage("dpo", cfg.dpo, lambda: train_dpo(dpo_cfg, run.path("policies", "dpo")))


def audit_prm(run: Run, samples: int = 2) -> dict[str, float]:
    """How the PRM ranks valid against invalid steps (oracle labels) of fresh pi_sft samples on
    the dev questions, which neither SFT, MCTS nor the PRM saw; written to ``prm/audit.json``."""
    from prorag.retrieval.index import open_retriever
    from prorag.stages.prm import fresh_sample_audit, write_prm_summary
    from prorag.supervision.reward_model import ProcessRewardModel

    audit = fresh_sample_audit(
        ProcessRewardModel.load(run.path("prm", "prm"), device=run.device),
        run.path("policies", "sft", "policy"),
        read_records(run.path("splits", "dev.jsonl")),
        open_retriever(str(run.path("index"))),
        samples=samples,
        top_k=run.config.top_k,
        seed=run.config.seed,
        device=run.device,
    )
    write_json(run.path("prm", "audit.json"), audit)
    run.progress("PRM on fresh SFT samples: " + json.dumps({k: round(v, 3) for k, v in audit.items()}))
    source = {
        "policy": "policies/sft/policy",
        "data": "splits/dev.jsonl",
        "samples": samples,
        "seed": run.config.seed,
        "file": "audit.json",
    }
    verdict = write_prm_summary(run.path("prm"), audit, audit_source=source)
    run.progress(f"PRM beats the init policy's likelihood on all three checks: {verdict['beats_all']} (prm/summary.json)")
    return audit


def stage_rft(run: Run) -> None:
    from prorag.stages.rft import run_rft_files

    cfg = run.config
    if not {"rft", "grpo", "prorag"} & set(cfg.systems):
        return
    run.stage(
        "rft",
        cfg.rft,
        lambda: run_rft_files(
            str(run.path("policies", "sft", "policy")),
            str(run.path("prm", "prm")),
            run.path("splits", "rft.jsonl"),
            str(run.path("index")),
            run.path("policies", "rft"),
            cfg.rft,
            device=run.device,
        ),
    )


def rl_config(run: Run, init: str, *, process: bool, beta: float, seed: int) -> RLConfig:
    """The config of one RL run of the run folder: from ``policies/INIT`` (``sft`` or ``rft``), on
    the RL split, with the PRM's step rewards weighted by ``beta`` when ``process`` (else the
    outcome reward alone, beta 0: the GRPO baseline). The systems and the beta ablation both
    build their runs here, so a variant that is a system has the system's fingerprint."""
    return replace(
        run.config.rl,
        policy=str(run.path("policies", init, "policy")),
        prm=str(run.path("prm", "prm")) if process else None,
        train_file=str(run.path("splits", "rl.jsonl")),
        index=str(run.path("index")),
        process_reward="prm" if process else "none",
        beta=beta if process else 0.0,
        seed=seed,
        # With question_filter, the arms of one seed share one screening (same policy, same seed).
        screening_file=str(run.path("rl", f"screening-{init}-seed{seed}.jsonl"))
        if run.config.rl.question_filter != "none"
        else run.config.rl.screening_file,
        eval_file=rl_dev_file(run, run.config.rl),
        sft_replay=rl_replay(run, run.config.rl),
    )


def rl_dev_file(run: Run, rl: RLConfig) -> str | None:
    """The dev file of ``rl``'s held-out curve (``eval_every``): the config's, else the run's dev
    split; none without the curve."""
    return rl.eval_file or (str(run.path("splits", "dev.jsonl")) if rl.eval_every else None)


def rl_replay(run: Run, rl: RLConfig) -> SFTReplayConfig:
    """``rl.sft_replay`` with its file filled in: the config's, else (with ``coef`` > 0) the run's
    SFT trajectories, whose worlds no RL, dev or test question shares."""
    if rl.sft_replay.file or rl.sft_replay.coef == 0:
        return rl.sft_replay
    return replace(rl.sft_replay, file=str(run.path("sft_data", "trajectories.jsonl")))


def stage_rl(run: Run) -> None:
    from prorag.stages.rl import train_rl

    cfg = run.config
    for system, (init, process) in RL_SYSTEMS.items():
        if system not in cfg.systems:
            continue
        for seed in cfg.seeds:
            rl_cfg = rl_config(run, init, process=process, beta=cfg.rl.beta, seed=seed)
            name = rl_run_name(system, seed)
            run.stage(f"rl-{name}", rl_cfg, lambda c=rl_cfg, n=name: train_rl(c, run.path("rl", n)))


def _policy_of(run: Run, system: str, seed: int) -> str:
    if system in RL_SYSTEMS:
        return str(run.path("rl", rl_run_name(system, seed), "policy"))
    return str(run.path("policies", system, "policy"))


def system_eval_config(cfg: PipelineConfig, system: str) -> EvalConfig:
    """The evaluation settings of ``system`` (the two one-shot baselines answer in their own way)."""
    return replace(cfg.eval, baseline=system if system in ("naive", "standard-rag") else None)  # type: ignore[arg-type]


def stage_eval(run: Run) -> None:
    """Every system on the test split (RL systems once per seed), then the PRM scores of the
    trajectories for the report's viewer."""
    from prorag.evaluation.runner import evaluate_files

    cfg = run.config
    test = run.path("splits", "test.jsonl")
    index = str(run.path("index"))
    for system in cfg.systems:
        seeds: list[int | None] = list(cfg.seeds) if system in RL_SYSTEMS else [None]
        for seed in seeds:
            ev = system_eval_config(cfg, system)
            name = eval_dir_name(system, seed)
            policy = _policy_of(run, system, seed if seed is not None else cfg.seeds[0])
            run.stage(
                f"eval-{name}",
                ev,
                lambda p=policy, e=ev, n=name: evaluate_files(p, test, index, run.path("eval", n), e, device=run.device),
            )
