"""The whole method: pipeline, demo, ablate (built from ``PipelineConfig``), compare, table1 and report.

``pipeline`` and ``ablate`` take ``--config FILE`` and ``--set KEY=VALUE`` over any field of the
pipeline's config, stage sections included (``--set rl.beta=0.5``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from prorag.cli.options import ConfigSource, app, config_command, friendly_errors

PIPELINE_CONFIG = "prorag.experiments.pipeline.config:PipelineConfig"


@config_command(app, "pipeline", PIPELINE_CONFIG, "pipeline", {}, expand=False)
def pipeline_cmd(
    source: ConfigSource,
    run_dir: Annotated[Path, typer.Option(help="Run folder (resumes: finished stages are skipped).")],
) -> None:
    """Every stage in one run folder: data, index, SFT (+ baselines), MCTS, pairs, PRM, RFT, RL,
    evaluation of every system on test, results.json and the report. Resumes after a kill.

    Configs: configs/pipelines/paper.yaml, and the demo's prorag/experiments/configs/demo.yaml (what `prorag demo`
    runs); each stage section's fields are listed by that stage command's --help (e.g. `prorag rl --help`
    for rl.*).
    """
    from prorag.experiments.pipeline import results_table, run_pipeline

    results = run_pipeline(source.load(), run_dir, progress=typer.echo)
    typer.echo(results_table(results))
    typer.echo(f"-> {run_dir}/results.json, report.md, report.html")


@app.command("demo")
@friendly_errors
def demo_cmd(
    quick: Annotated[
        bool, typer.Option(help="Small budgets: about 10 minutes on 2 CPU cores (the full demo: about an hour).")
    ] = False,
    run_dir: Annotated[Path | None, typer.Option(help="Run folder (default: runs/demo or runs/demo-quick).")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: all cores).")] = None,
) -> None:
    """ProRAG's four stages on the built-in world with the tiny model, on the CPU, no network:
    prints the paper's Table 2 for this world and writes the report.

    Its settings: prorag/experiments/configs/demo.yaml (with --quick, demo_quick.yaml: smaller
    budgets over it)."""
    import torch

    from prorag.experiments.pipeline import demo_config, results_table, run_pipeline

    if threads:
        torch.set_num_threads(threads)
    out = run_dir or Path("runs/demo-quick" if quick else "runs/demo")
    started = time.perf_counter()
    results = run_pipeline(demo_config(quick=quick), out, progress=typer.echo)
    typer.echo("")
    typer.echo(f"Built-in world, test split ({results['systems'][results['order'][0]]['metrics']['n']} questions):")
    typer.echo(results_table(results))
    typer.echo(
        "EM: normalised exact match, F1: token F1 (SQuAD normalisation), Format-valid: trajectories that\n"
        "follow the step grammar (all in percent; not applicable to the one-shot baselines); Retrieval\n"
        f"steps: searches per question. RL rows: mean ± std over seeds {results['seeds']}."
    )
    typer.echo(f"wall time {time.perf_counter() - started:.0f}s; report: {out}/report.html")


@config_command(app, "ablate", PIPELINE_CONFIG, "pipeline", {}, expand=False)
def ablate_cmd(
    source: ConfigSource,
    run_dir: Annotated[Path, typer.Option(help="The pipeline's run folder (its SFT, PRM and RFT are reused).")],
    what: Annotated[
        str,
        typer.Option(
            help="table2 (all systems over the config's seeds), beta (Table 3), topk (Figure 5), process (GRPO, "
            "learned PRM, oracle, oracle up to the first error, and the shuffled controls of the PRM and of the "
            "latter, from the same pi_rft; mean ± 95% CI over seeds, tests against GRPO and each arm's control) or family "
            "(GRPO, ProRAG, ProRAG-oracle, HiPRAG, CP-Search, ...: each method's rewards on the one trainer)."
        ),
    ],
    seeds: Annotated[
        int | None, typer.Option(help="process, family: seeds 0..N-1 per arm (default: the config's process_seeds, 0..4).")
    ] = None,
    results_dir: Annotated[
        Path | None,
        typer.Option(help="process, family: also write RESULTS_DIR/WHAT_DATE.json (e.g. the repository's results/)."),
    ] = None,
    arms: Annotated[
        str | None,
        typer.Option(
            help="process, family: only these arms, comma-separated (e.g. grpo,prorag-oracle); default all. "
            "Keep grpo in: the other arms are tested against it."
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            help="process, family: run the seeds in N processes at once (each worker every arm of its seeds, with "
            "cores/N torch threads and, where GPUs are visible, one GPU; logs in RUN/ablations/workers/), then "
            "read them as usual. 1: one run after another."
        ),
    ] = 1,
) -> None:
    """The paper's ablations on the pipeline's run folder, with seeds and paired t-tests against full ProRAG
    (process and family: against outcome-only GRPO)."""
    import shlex
    import sys

    from prorag.experiments.ablations import ABLATIONS, run_ablation

    if what not in ABLATIONS:
        raise ValueError(f"--what must be one of {', '.join(ABLATIONS)}, got {what!r}")
    if seeds is not None and seeds < 2:
        raise ValueError(f"--seeds must be >= 2 (a confidence interval over seeds), got {seeds}")
    command = shlex.join(["prorag", *sys.argv[1:]])
    chosen = list(range(seeds)) if seeds is not None else None
    names = [a.strip() for a in arms.split(",") if a.strip()] if arms is not None else None
    typer.echo(
        run_ablation(
            source.load(),
            run_dir,
            what,
            progress=typer.echo,
            seeds=chosen,
            results_dir=results_dir,
            command=command,
            arms=names,
            workers=workers,
        )
    )


@app.command("compare")
@friendly_errors
def compare_cmd(
    arm: Annotated[
        list[str],
        typer.Option(
            metavar="NAME=PATTERN",
            help="NAME=PATTERN, repeated: an arm and its evaluation folders (`prorag eval --out`), with {seed} where the "
            "seed goes, e.g. grpo='runs/test-grpo-s{seed}'.",
        ),
    ],
    seeds: Annotated[str, typer.Option(help="Seeds to read: 0-4, 0,2,5 or 0-2,5 (ranges inclusive).")],
    reference: Annotated[str | None, typer.Option(help="The arm every other is tested against (default: the first).")] = None,
    control: Annotated[
        list[str] | None,
        typer.Option(
            metavar="ARM=CONTROL", help="ARM=CONTROL, repeated: also test ARM against CONTROL (e.g. its shuffled step rewards)."
        ),
    ] = None,
    primary: Annotated[
        list[str] | None,
        typer.Option(
            metavar="'ARM - OTHER'",
            help="'ARM - OTHER', repeated: a contrast named primary before the runs (OTHER: the reference or ARM's "
            "control), reported with its nominal p; every other test gets its Holm-adjusted p beside the nominal "
            "one. Default: each arm against the reference, but the controls.",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the statistics, arms, seeds and command as JSON here.")] = None,
) -> None:
    """Compare arms from their evaluation folders, one per seed: EM and F1 mean ± 95% CI over seeds.

    Each arm is tested against the reference (and its control) paired by seed and by seed-averaged
    question, as `prorag ablate --what process` does, for runs made one at a time."""
    import shlex

    from prorag.data.jsonl import write_json
    from prorag.experiments.ablations import process_table
    from prorag.experiments.compare import compare_arms, parse_pairs, parse_seeds

    result = compare_arms(
        parse_pairs(arm, "--arm"), parse_seeds(seeds), reference, parse_pairs(control or [], "--control"), primary=primary
    )
    for name, absent in result["missing"].items():
        typer.echo(f"{name}: no evaluation for seeds {', '.join(map(str, absent))} (left out)")
    typer.echo(process_table(result["stats"], reference=result["reference"], primary=result["primary"]))
    if out is not None:
        words = ["prorag", "compare", *(w for a in arm for w in ("--arm", a)), "--seeds", seeds]
        words += ["--reference", reference] if reference is not None else []
        words += [w for c in control or [] for w in ("--control", c)]
        words += [w for c in primary or [] for w in ("--primary", c)]
        write_json(out, {**result, "command": shlex.join([*words, "--out", str(out)])})
        typer.echo(f"-> {out}")


@config_command(app, "table1", "prorag.experiments.table1:Table1Config", "table1", {}, expand=False)
def table1_cmd(
    source: ConfigSource,
    run_dir: Annotated[Path, typer.Option(help="Run folder: cells/SYSTEM/BENCHMARK/, table1.json, table1.md (resumes).")],
) -> None:
    """The paper's Table 1: every system × benchmark on one retriever and one model, EM and F1 per cell,
    the average, searches and tokens per question, and a paired t-test of the best system against the next.

    Configs: configs/pipelines/table1_offline.yaml (SmolLM2, BM25 over the pooled benchmark corpus, CPU) and
    configs/pipelines/table1_paper.yaml (Qwen3-8B served by vLLM, E5 over wiki-18, top-3).
    """
    from prorag.experiments.table1 import run_table1, table1_markdown

    result = run_table1(source.load(), run_dir, progress=typer.echo)
    typer.echo(table1_markdown(result))
    typer.echo(f"-> {run_dir}/table1.json, table1.md")


@app.command("report")
@friendly_errors
def report_cmd(
    run_dir: Annotated[Path, typer.Option(help="Pipeline run folder (holds results.json and eval/NAME/).")],
    prm: Annotated[
        Path | None,
        typer.Option(help="Process reward model folder: first write each system's step_scores.jsonl (PRM score of every step)."),
    ] = None,
    viewer_limit: Annotated[int, typer.Option(help="Questions per system in the trajectory viewer.")] = 100,
    device: Annotated[str | None, typer.Option(help="Device of the PRM (default: cuda if available).")] = None,
) -> None:
    """Write report.md, a self-contained report.html and plots/*.png from a pipeline run folder."""
    from prorag.experiments.report.build import ReportConfig, write_report
    from prorag.experiments.report.results import eval_dir_of, load_results
    from prorag.experiments.report.step_scores import score_eval_trajectories

    if prm is not None:
        from prorag.supervision.reward_model import ProcessRewardModel

        scorer = ProcessRewardModel.load(prm, device=device)
        results = load_results(run_dir)
        for name in results["order"]:
            where = eval_dir_of(run_dir, results["systems"][name])
            if where is not None and (where / "trajectories.jsonl").is_file():
                typer.echo(f"scored {name}: {score_eval_trajectories(scorer, where)}")
    md, page = write_report(run_dir, ReportConfig(viewer_limit=viewer_limit))
    typer.echo(f"wrote {md} and {page}")


__all__: list[str] = []
