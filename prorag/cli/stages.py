"""The stage commands: sft-data, sft, eval, mcts (and mcts-show), pairs, prm, prm-audit, dpo, rft, rl.

Each stage command is built from its config dataclass (:func:`~prorag.cli.options.config_command`):
``--config FILE``, repeatable ``--set KEY=VALUE`` over any field, and shortcut options that set
one field each (:data:`SHORTCUTS`), with the precedence defaults < file < shortcuts < ``--set``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from prorag.cli.options import (
    ConfigSource,
    IndexOption,
    LLMEndpoint,
    MaxStepsOption,
    PairsOption,
    PolicyOption,
    PRMOption,
    RecordsOption,
    RunDirOption,
    app,
    config_command,
    friendly_errors,
    llm_endpoint_options,
)

#: The one place the CLI names config fields: shortcut flag -> the field it sets, per command.
#: Written against the config redesign's names (SFTDataConfig.k -> ``top_k``; RL/MCTS rollout
#: settings under ``rollout.``; LoRA under ``lora.``); adjust here only if a field is renamed.
SHORTCUTS: dict[str, dict[str, str]] = {
    "sft-data": {"LLM options": "llm", "--teacher": "teacher", "-k": "top_k", "--limit": "limit"},
    "sft": {"--trajectories": "train_file", "--max-steps": "max_steps"},
    "eval": {
        "--limit": "limit",
        "--baseline": "baseline",
        "-k": "rollout.top_k",
        "--batch-size": "rollout.batch_size",
        "--max-actions": "rollout.max_actions",
        "--prompt-style": "rollout.prompt_style",
        "--seed": "rollout.seed",
        "--generator": "generator.kind",
        "served options": "generator.served",
        "--judge-config": "judge",
    },
    "mcts": {},
    "pairs": {"LLM options": "llm", "--judge": "judge", "--min-visits": "min_visits", "--pairs-per-set": "pairs_per_set"},
    "prm": {"--pairs": "pairs_file", "--init": "init", "--max-steps": "max_steps"},
    "dpo": {"--pairs": "pairs_file", "--init": "init", "--beta": "beta", "--max-steps": "max_steps"},
    "rft": {"--limit": "limit"},
    "rl": {
        "--policy": "policy",
        "--prm": "prm",
        "--data": "train_file",
        "--index": "index",
        "--process-reward": "process_reward",
        "--advantage": "advantage",
        "--beta": "beta",
        "--exclude": "exclude_ids_from",
        "--max-steps": "max_steps",
        "--seed": "seed",
    },
}


def stage_command(name: str, target: str, section: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """:func:`config_command` on the root app with this module's shortcut table for ``name``."""
    return config_command(app, name, target, section, SHORTCUTS[name])


def _check_limit(limit: int | None) -> None:
    """A ``--limit`` that is not a config field (mcts, prm-audit): >= 1, checked before any model
    loads (0 would mean everything to a slice, -1 all but the last record)."""
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1 (or left out: every record), got {limit}")


# ----------------------------------------------------------------------------- stage 1: SFT


@stage_command("sft-data", "prorag.stages.sft_data:SFTDataConfig", "sft_data")
@llm_endpoint_options
def sft_data(
    source: ConfigSource,
    endpoint: LLMEndpoint,
    data: Annotated[Path, typer.Option(help="Record file (FlashRAG JSONL); records without a gold decomposition are skipped.")],
    index: IndexOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Trajectory JSONL to append to (ids already in it are skipped).")],
    teacher: Annotated[str | None, typer.Option(help="Thoughts by: template (offline, the default) or llm.")] = None,
    k: Annotated[int | None, typer.Option("-k", help="Documents per retrieval (default 3).")] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N records of the file.")] = None,
) -> None:
    """Write a gold ProRAG trajectory for every record with a gold decomposition (stage 1's data).

    The <retrieval> blocks hold what the index returns for each hop's search keywords; a hop whose
    gold page is not retrieved is recorded in the row's missing_gold. Appends and resumes.
    """
    from prorag.stages.sft_data import build_sft_data

    cfg = source.load(
        {
            "LLM options": lambda c: endpoint.teacher_config(c.llm, "--teacher llm"),
            "--teacher": teacher,
            "-k": k,
            "--limit": limit,
        }
    )
    if endpoint.given and cfg.teacher != "llm":
        raise ValueError("--base-url, --model and the other LLM options only apply to --teacher llm")
    summary = build_sft_data(data, out, cfg, index=index)
    typer.echo(summary.describe(cfg.llm))
    typer.echo(f"-> {out}")


@stage_command("sft", "prorag.stages.sft_config:SFTConfig", "sft")
def sft(
    source: ConfigSource,
    run_dir: Annotated[Path, typer.Option(help="Run folder: checkpoints, metrics.jsonl, policy/ (resumes from it).")],
    trajectories: Annotated[Path | None, typer.Option(help="Training file (the config's train_file).")] = None,
    max_steps: MaxStepsOption = None,
) -> None:
    """Stage 1: supervised warm-up of the policy on gold trajectories with the format-aware loss.

    Writes RUN_DIR/policy (what `prorag eval --policy RUN_DIR` evaluates) and resumes from the
    last checkpoint in RUN_DIR.
    """
    from prorag.stages.sft import train_sft

    cfg = source.load({"--trajectories": trajectories, "--max-steps": max_steps})
    policy = train_sft(cfg, run_dir)
    typer.echo(f"wrote the SFT policy to {policy}")


# ----------------------------------------------------------------------------- evaluation


@stage_command("eval", "prorag.evaluation.eval_config:EvalConfig", "eval")
def eval_cmd(
    source: ConfigSource,
    policy: Annotated[
        str | None, typer.Option(help="Policy checkpoint folder, a training run folder (its policy/), or any HF causal LM.")
    ] = None,
    data: Annotated[Path | None, typer.Option(help="Record file (FlashRAG JSONL).")] = None,
    index: Annotated[
        str | None, typer.Option("--index", "-i", help="Index folder or http(s):// URL of a retrieval server.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (resumes if it holds predictions).")] = None,
    k: Annotated[int | None, typer.Option("-k", help="Documents per retrieval (default 3).")] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N records.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option(help="Evaluate a baseline instead of the ProRAG loop, by name (each described under `baseline` below)."),
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Questions per rollout batch (default 32).")] = None,
    max_actions: Annotated[int | None, typer.Option(help="Actions per trajectory (default 13, as at inference).")] = None,
    prompt_style: Annotated[
        str | None, typer.Option(help="plain or chat (default: chat if the tokenizer has a template).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (greedy decoding by default) (default 0).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: the model's).")] = None,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option(metavar="A B", help="Compare two predictions.jsonl files with a paired t-test per metric."),
    ] = None,
    generator: Annotated[
        str | None,
        typer.Option(help="engine (default), hf (--policy as a TextGenerator) or served (an OpenAI-compatible server)."),
    ] = None,
    base_url: Annotated[str | None, typer.Option(help="served: API root of the server (…/v1).")] = None,
    served_model: Annotated[str | None, typer.Option(help="served: the model name the server knows.")] = None,
    api: Annotated[str | None, typer.Option(help="served: completions or chat.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="served: environment variable of the API key (none: no key).")] = None,
    concurrency: Annotated[int | None, typer.Option(help="served: requests in flight at once.")] = None,
    judge_config: Annotated[
        Path | None, typer.Option(help="YAML of JudgeConfig fields: adds acc_l (LLM-judge accuracy) to metrics.json.")
    ] = None,
) -> None:
    """Evaluate a policy or baseline on a record file: predictions, trajectories and metrics.json.

    A generator baseline (iter-retgen, ircot, flare, search-o1) runs on --policy as a local HF model or,
    with --generator served, on an OpenAI-compatible server (vLLM, SGLang, an API). With
    --compare A.jsonl B.jsonl, print a paired t-test per metric instead.
    """
    import json

    from prorag.core.config import load_config
    from prorag.evaluation.harness import compare_predictions
    from prorag.evaluation.llm_judge import JudgeConfig
    from prorag.evaluation.runner import evaluate_files

    if compare is not None:
        result = compare_predictions(*compare)
        typer.echo(f"{'metric':<14}{'mean A':>9}{'mean B':>9}{'t':>9}{'p':>9}{'n':>6}")
        for name, row in result.items():
            typer.echo(f"{name:<14}{row['mean_a']:>9.4f}{row['mean_b']:>9.4f}{row['t']:>9.3f}{row['p_value']:>9.4f}{row['n']:>6}")
        return
    served = {"base_url": base_url, "model": served_model, "api": api, "api_key_env": api_key_env, "concurrency": concurrency}
    served = {key: value for key, value in served.items() if value is not None}
    options = {"--limit": limit, "--baseline": baseline, "-k": k, "--batch-size": batch_size, "--max-actions": max_actions}
    cfg = source.load(
        {
            **options,
            "--prompt-style": prompt_style,
            "--seed": seed,
            "--generator": generator,
            "served options": (lambda c: {**c.generator.served, **served}) if served else None,
            "--judge-config": (lambda _: load_config(judge_config, JudgeConfig)) if judge_config is not None else None,
        }
    )
    needs_policy = cfg.generator.kind != "served"
    required = (("--policy", policy if needs_policy else ""), ("--data", data), ("--index", index), ("--out", out))
    missing = [n for n, v in required if v is None]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (or use --compare A.jsonl B.jsonl)")
    metrics = evaluate_files(policy, data, index, out, cfg, device=device)  # type: ignore[arg-type]
    shown = {k: v for k, v in metrics.items() if k not in ("config", "retrieval_steps_distribution", "by_type", "by_hops")}
    typer.echo(json.dumps(shown, indent=2))
    typer.echo(f"wrote {out}/predictions.jsonl, trajectories.jsonl, metrics.json")


# ----------------------------------------------------------------------------- stage 2: MCTS and step pairs


@stage_command("mcts", "prorag.stages.mcts:MCTSConfig", "mcts")
def mcts(
    source: ConfigSource,
    run_dir: Annotated[
        Path, typer.Option(help="Run folder: config.json and trees.jsonl (resumes, skipping finished questions).")
    ],
    policy: Annotated[str | None, typer.Option(help="Policy checkpoint folder or training run folder (pi_sft).")] = None,
    data: Annotated[Path | None, typer.Option(help="Record file (FlashRAG JSONL).")] = None,
    index: Annotated[
        str | None, typer.Option("--index", "-i", help="Index folder or http(s):// URL of a retrieval server.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N records.")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: the model's).")] = None,
) -> None:
    """Stage 2: Monte Carlo tree search over reasoning steps, one tree per question, batched over questions.

    Trees are appended to RUN_DIR/trees.jsonl as each batch finishes; print them with `prorag mcts-show`.
    """
    from prorag.stages.mcts import run_mcts_files

    missing = [n for n, v in (("--policy", policy), ("--data", data), ("--index", index)) if v is None]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    _check_limit(limit)
    cfg = source.load()
    summary = run_mcts_files(policy, data, index, run_dir, cfg, limit=limit, device=device)  # type: ignore[arg-type]
    typer.echo(summary.describe())
    typer.echo(f"-> {run_dir}/trees.jsonl")


@app.command("mcts-show")
@friendly_errors
def mcts_show(
    trees: Annotated[Path, typer.Argument(help="MCTS run folder or trees.jsonl.")],
    question: Annotated[str | None, typer.Option(help="Only the tree of this question id.")] = None,
    max_depth: Annotated[int | None, typer.Option(help="Print down to this depth.")] = None,
    min_visits: Annotated[int, typer.Option(help="Leave out children visited fewer times.")] = 0,
) -> None:
    """Print search trees readably: per node its kind, N, Q, prior, value and action."""
    from prorag.method.search_tree import render_tree
    from prorag.stages.mcts import read_trees

    shown = [t for t in read_trees(trees) if question is None or t.id == question]
    if question is not None and not shown:
        raise ValueError(f"no tree for question {question!r} in {trees}")
    for t in shown:
        typer.echo(render_tree(t, max_depth=max_depth, min_visits=min_visits))
        typer.echo("")


@stage_command("pairs", "prorag.stages.pairs:PairsConfig", "pairs")
@llm_endpoint_options
def pairs(
    source: ConfigSource,
    endpoint: LLMEndpoint,
    trees: Annotated[Path, typer.Option(help="MCTS run folder or trees.jsonl.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Pairs JSONL to append to (sibling sets already paired are skipped).")],
    judge: Annotated[str | None, typer.Option(help="oracle (gold decompositions, offline; the default) or llm.")] = None,
    min_visits: Annotated[int | None, typer.Option(help="Siblings take part with at least this many visits (default 2).")] = None,
    pairs_per_set: Annotated[
        str | None,
        typer.Option(help="one: the judge's pair (the paper, the default); all: every valid x invalid sibling (oracle)."),
    ] = None,
    agreement: Annotated[
        int, typer.Option(help="With --judge llm: also judge the first N sibling sets with the oracle and report agreement.")
    ] = 0,
) -> None:
    """Stage 2: a judge labels one chosen and one rejected step among siblings of the search trees (pairs for the PRM).

    An LLM judge's replies are cached in OUT.llm_cache.jsonl unless --cache says otherwise.
    """
    import json
    from dataclasses import replace

    from prorag.stages.mcts import read_trees
    from prorag.stages.pairs import agreement_report, extract_pairs, make_judge
    from prorag.supervision.judge import OracleJudge

    cfg = source.load(
        {
            "LLM options": lambda c: endpoint.teacher_config(c.llm, "--judge llm", max_tokens=256),
            "--judge": judge,
            "--min-visits": min_visits,
            "--pairs-per-set": pairs_per_set,
        }
    )
    if endpoint.given and cfg.judge != "llm":
        raise ValueError("--base-url, --model and the other LLM options only apply to --judge llm")
    if agreement and cfg.judge != "llm":
        raise ValueError("--agreement compares the llm judge with the oracle: use it with --judge llm")
    if cfg.llm is not None and cfg.llm.cache_path is None:
        cfg = replace(cfg, llm=replace(cfg.llm, cache_path=str(out.with_name(out.name + ".llm_cache.jsonl"))))
    loaded = read_trees(trees)
    the_judge = make_judge(cfg)
    summary = extract_pairs(loaded, out, cfg, judge=the_judge)
    typer.echo(summary.describe())
    if agreement:
        report = agreement_report(loaded, the_judge, OracleJudge(), sample=agreement, min_visits=cfg.min_visits)
        typer.echo("agreement: " + json.dumps(report))
    typer.echo(f"-> {out}")


@stage_command("prm", "prorag.stages.prm.config:PRMConfig", "prm")
def prm(
    source: ConfigSource,
    pairs: PairsOption,
    init: Annotated[str, typer.Option(help="Policy to start from (pi_sft): checkpoint, SFT run folder or hub id.")],
    run_dir: Annotated[Path, typer.Option(help="Run folder: checkpoints, metrics.jsonl, prm/ (resumes from it).")],
    max_steps: MaxStepsOption = None,
) -> None:
    """Stage 2: train the process reward model on judged step pairs with the pairwise loss (Eq. 4).

    Writes RUN_DIR/prm (the scorer later stages load), logs the held-out pairwise accuracy to
    RUN_DIR/metrics.jsonl, and resumes from the last checkpoint in RUN_DIR.
    """
    from prorag.stages.prm import train_prm

    cfg = source.load({"--pairs": pairs, "--init": init, "--max-steps": max_steps})
    out = train_prm(cfg, run_dir)
    typer.echo(f"wrote the process reward model to {out}")


@app.command("prm-audit")
@friendly_errors
def prm_audit(
    prm: PRMOption,
    policy: PolicyOption,
    data: Annotated[Path, typer.Option(help="Records with gold decompositions (built-in world, MuSiQue) no stage trained on.")],
    index: IndexOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON file for the audit.")],
    samples: Annotated[
        int,
        typer.Option(help="Trajectories sampled per question (the within-question AUCs need 2 or more; RL's groups are 8)."),
    ] = 2,
    limit: Annotated[int | None, typer.Option(help="Only the first N records.")] = None,
    top_k: Annotated[int, typer.Option(help="Documents per search.")] = 3,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... for the policy and the PRM.")] = None,
    backend: Annotated[str, typer.Option(help="What samples the trajectories: hf (default) or vllm (rollout.backend).")] = "hf",
    gpu_memory_utilization: Annotated[
        float, typer.Option(help="backend vllm: vLLM's share of the GPU, beside the PRM (at most 0.8).")
    ] = 0.5,
    summary: Annotated[
        bool,
        typer.Option(
            help="Also rewrite the PRM run folder's summary.json verdict with this audit (and where it came from); "
            "--no-summary leaves the pipeline's verdict as it is."
        ),
    ] = True,
) -> None:
    """Stage 2 check: how well the PRM ranks valid above invalid steps of fresh trajectories.

    Samples fresh trajectories from pi_sft, labels every step with the oracle judge, and reports
    how the PRM ranks the valid against the invalid steps (ROC AUC, the share of each class above
    0), beside the policy's own step likelihood as a baseline."""
    import json

    from prorag.agent.backends import check_available
    from prorag.agent.rollout_config import RolloutConfig, VLLMSettings
    from prorag.data.jsonl import write_json
    from prorag.data.records import read_records
    from prorag.retrieval.index import open_retriever
    from prorag.stages.prm import fresh_sample_audit, write_prm_summary
    from prorag.supervision.reward_model import ProcessRewardModel, model_folder

    _check_limit(limit)
    rollout = RolloutConfig(top_k=top_k, backend=backend, vllm=VLLMSettings(gpu_memory_utilization=gpu_memory_utilization))
    check_available(rollout)
    records = read_records(data)[:limit] if limit is not None else read_records(data)
    scorer = ProcessRewardModel.load(prm, device=device)
    audit = fresh_sample_audit(
        scorer, policy, records, open_retriever(index), samples=samples, top_k=top_k, seed=seed, device=device, rollout=rollout
    )
    write_json(out, audit)
    typer.echo(json.dumps({k: round(v, 4) for k, v in audit.items()}))
    run = model_folder(prm).parent
    if summary and (run / "metrics.jsonl").is_file():  # a `prorag prm` run folder: its verdict gets the audit
        source = {"policy": str(policy), "data": str(data), "samples": samples, "limit": limit, "seed": seed, "file": str(out)}
        verdict = write_prm_summary(run, audit, audit_source=source)
        typer.echo(f"beats the init policy's likelihood on all three checks: {verdict['beats_all']} -> {run / 'summary.json'}")
    typer.echo(f"-> {out}")


@stage_command("dpo", "prorag.stages.dpo_config:DPOConfig", "dpo")
def dpo(
    source: ConfigSource,
    pairs: PairsOption,
    init: Annotated[str, typer.Option(help="Policy to start from and regularise towards (pi_sft): checkpoint or run folder.")],
    run_dir: Annotated[Path, typer.Option(help="Run folder: checkpoints, metrics.jsonl, policy/ (resumes from it).")],
    beta: Annotated[float | None, typer.Option(help="DPO's beta (the config's beta; 0.1).")] = None,
    max_steps: MaxStepsOption = None,
) -> None:
    """Baseline: ReasonRAG-style offline DPO of pi_sft on the judged sibling-step pairs (TRL's DPOTrainer).

    Writes RUN_DIR/policy (what `prorag eval --policy RUN_DIR` evaluates) and resumes from the last
    checkpoint in RUN_DIR.
    """
    from prorag.stages.dpo import train_dpo

    cfg = source.load({"--pairs": pairs, "--init": init, "--beta": beta, "--max-steps": max_steps})
    out = train_dpo(cfg, run_dir)
    typer.echo(f"wrote the DPO policy to {out}")


# ----------------------------------------------------------------------------- stage 3: RFT


@stage_command("rft", "prorag.stages.rft_config:RFTConfig", "rft")
def rft(
    source: ConfigSource,
    policy: PolicyOption,
    prm: PRMOption,
    data: RecordsOption,
    index: IndexOption,
    run_dir: RunDirOption,
    limit: Annotated[int | None, typer.Option(help="Only the first N questions (the config's limit).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... for the policy and the PRM.")] = None,
) -> None:
    """Stage 3: sample N trajectories per question from pi_sft, keep the correct ones, keep their
    actions the PRM scores above the threshold, and fine-tune pi_sft on them (pi_rft).

    --policy is pi_sft; the run folder gets samples.jsonl, kept.jsonl, rft_counts.json and policy/."""
    from prorag.data.jsonl import read_json
    from prorag.stages.rft import RFTCounts, run_rft_files

    cfg = source.load({"--limit": limit})
    out = run_rft_files(policy, prm, data, index, run_dir, cfg, device=device)
    typer.echo(RFTCounts(**read_json(run_dir / "rft_counts.json")).describe())
    typer.echo(f"wrote the RFT policy to {out}")


# ----------------------------------------------------------------------------- stage 4: RL


@stage_command("rl", "prorag.stages.rl.config:RLConfig", "rl")
def rl_cmd(
    source: ConfigSource,
    policy: PolicyOption,
    data: RecordsOption,
    index: IndexOption,
    run_dir: RunDirOption,
    prm: Annotated[
        str | None, typer.Option(help="Process reward model folder (prorag prm); not needed with --process-reward none.")
    ] = None,
    process_reward: Annotated[
        str | None,
        typer.Option(
            help="Step-reward source: prm (ProRAG), none (the outcome-only GRPO baseline), ... (each described under "
            "`process_reward` below)."
        ),
    ] = None,
    advantage: Annotated[
        str | None,
        typer.Option(help="Advantage estimator: dual (ProRAG), grpo, ... (each described under `advantage` below)."),
    ] = None,
    beta: Annotated[float | None, typer.Option(help="Weight of the process advantage (Eq. 8; 0.3).")] = None,
    exclude: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE", help="JSONL files whose question ids are dropped from --data (e.g. the SFT data); repeatable."
        ),
    ] = None,
    max_steps: MaxStepsOption = None,
    seed: Annotated[int | None, typer.Option(help="Seed (the config's seed).")] = None,
) -> None:
    """Stage 4: process-supervised GRPO with the dual-granularity advantage (pi_theta).

    --policy is pi_rft (pi_sft for 'w/o refinement'); --data the RL questions, disjoint from the
    SFT questions. The run folder gets checkpoints, metrics.jsonl, learning_curve.csv and policy/.

    With --process-reward none (or --beta 0) it is the paper's outcome-only GRPO baseline on the
    same machinery. Runs under `torchrun --nproc_per_node N -m prorag.cli rl ...` or `accelerate
    launch` (configs/launchers/accelerate_multi_gpu.yaml, configs/launchers/deepspeed_zero3.yaml) as well.
    """
    from prorag.stages.rl import train_rl

    options = {"--policy": policy, "--prm": prm, "--data": data, "--index": index, "--process-reward": process_reward}
    options["--advantage"] = advantage
    cfg = source.load({**options, "--beta": beta, "--exclude": exclude or None, "--max-steps": max_steps, "--seed": seed})
    out = train_rl(cfg, run_dir)
    typer.echo(f"wrote the RL policy to {out} (learning curve: {run_dir / 'learning_curve.csv'})")


__all__ = ["SHORTCUTS"]
