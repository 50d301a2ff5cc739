"""The paper's ablations on a pipeline run folder (``prorag ablate``).

* ``table2``: every system of the config over its seeds (the pipeline itself), with the
  paired t-test of each against full ProRAG (Table 2).
* ``beta``: process-supervised RL from pi_rft with beta in {0, 0.1, 0.3, 0.5, 0.7, 0.9}, once per
  seed, evaluated on test (Table 3; the paper finds an inverted U peaking at 0.3).
* ``topk``: the full ProRAG policy evaluated with 1, 3 and 5 documents per retrieval
  (Figure 5). The policy is trained with the config's ``top_k``; only the evaluation changes,
  which measures how the trained reader uses more or fewer documents.
* ``process``: where the step rewards come from (:data:`PROCESS_ARMS`: outcome-only GRPO, the
  learned PRM, the oracle, the oracle up to a trajectory's first error, and the controls of the PRM
  and of the latter, their step rewards shuffled within each group), RL from the same pi_rft on the
  same questions and budget, ``process_seeds`` seeds per arm (a seed gives the same rollout streams
  in every arm); mean ± 95% CI over seeds, paired tests against GRPO and against each arm's
  control (:data:`CONTROLS`), EM by
  question type and hop count, held-out-EM learning curves (with ``rl.eval_every``). Written to
  ``ablations/process.json`` (and, asked, ``RESULTS/process_DATE.json``).
* ``family``: the process-reward family on the one trainer (:data:`FAMILY_ARMS`: GRPO, ProRAG with
  the learned PRM and with the oracle, HiPRAG, CP-Search, P2S; offline DPO from pi_sft), the same
  statistics as ``process`` plus cover-EM, format validity, searches, over- and under-search rates
  and seconds per RL step.
  Written to ``ablations/family.json`` (and ``RESULTS/family_DATE.json``).

An arm is a list of ``rl.*`` assignments (``--set`` syntax) on top of outcome-only GRPO from pi_rft,
so a new method joins a comparison with one line and its arm reads as the command that runs it. A
config adds arms without code (``extra_arms``, and ``arm_controls`` for what each is tested against
beside GRPO; :func:`ablation_arms`), e.g. GRPO with a KL to pi_rft and a step reward on top of it.
With ``stream_control: true`` the arms ablations also run pi_rft at learning rate 0 on each seed's
question stream (:mod:`prorag.experiments.stream_control`) and report each RL arm's training EM
against it: whether the schedule learns at all, before any arm is compared with another.

Each variant is one more stage of the same run folder (``stages/NAME.json`` markers), so an
ablation reuses SFT, the PRM and RFT, resumes after a kill, and its results are merged into
``results.json`` (``beta_sweep``, ``topk``) for the report.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from prorag.core.config import apply_overrides, parse_assignment, used_settings
from prorag.core.metrics import yes_no_scores
from prorag.core.statistics import mean_and_ci, mean_and_spread, p_value_text, paired_t_test, permutation_test
from prorag.data.jsonl import read_json, read_jsonl, write_json
from prorag.evaluation.harness import compare_predictions
from prorag.evaluation.step_errors import STEP_VALIDITY_RATES
from prorag.experiments.pipeline import (
    PipelineConfig,
    Run,
    fingerprint,
    resolve,
    results_table,
    rl_config,
    rl_dev_file,
    rl_replay,
    rl_run_name,
    run_pipeline,
    system_eval_config,
)
from prorag.experiments.stream_control import FROZEN_ARM, FROZEN_ASSIGNMENTS, stream_statistics, stream_table
from prorag.stages.rl import dev_selection

BETAS: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
TOP_KS: tuple[int, ...] = (1, 3, 5)
#: An arm: ``rl.*`` assignments (``--set`` syntax, the ``rl.`` prefix left out) applied to
#: outcome-only GRPO from pi_rft; a ``process_reward`` other than ``none`` also turns on the
#: config's beta and the PRM path (:func:`arm_config`).
Arm = tuple[str, ...]
#: The arms of the process ablation. ``grpo`` and ``prorag`` are the pipeline's systems (their
#: runs are reused).
PROCESS_ARMS: dict[str, Arm] = {
    "grpo": (),
    "prorag": ("process_reward=prm",),
    "prorag-oracle": ("process_reward=oracle",),
    "prorag-oracle-first-error": ("process_reward=oracle-first-error",),
    "prorag-shuffled": ("process_reward=shuffled",),
    "prorag-oracle-first-error-shuffled": ("process_reward=oracle-first-error-shuffled",),
}
#: An arm -> its control: the same step rewards permuted within each group, which keeps their
#: distribution and removes their information. Against GRPO an arm can gain from the bare extra
#: term in its advantage (docs/LOG.md, 2026-11-26); against its control, only from what the
#: rewards say about the steps. :func:`process_statistics` tests each arm against its control
#: when both ran.
CONTROLS: dict[str, str] = {
    "prorag": "prorag-shuffled",
    "prorag-oracle-first-error": "prorag-oracle-first-error-shuffled",
}
#: The arms of the family comparison (METHOD.md sections 2-5): each method's own rewards and
#: advantage, everything else (start policy, questions, budget, seeds) the same.
FAMILY_ARMS: dict[str, Arm] = {
    "grpo": (),
    "prorag": ("process_reward=prm",),
    "prorag-oracle": ("process_reward=oracle",),
    "hiprag": ("outcome_reward.form=hiprag",),
    "cpsearch": ("process_reward=cpsearch", "advantage=cpgrpo", "outcome_reward.form=f1_if_valid"),
    "p2s": ("outcome_reward.form=p2s",),
}
#: Per-seed evaluation metrics (``metrics.json``) the family comparison reports beside EM and F1.
FAMILY_METRICS: tuple[str, ...] = (
    "cover_em",
    "format_valid_rate",
    "mean_retrieval_steps",
    "searches_below_hops_rate",
    "over_search_rate",
    "under_search_rate",
    *STEP_VALIDITY_RATES,
)
#: Per-seed evaluation metrics the process ablation reports beside EM and F1: how often and how deep
#: each arm searches, and how many of its steps the oracle finds valid (step rewards are meant to
#: change the steps, so a change shows here first).
PROCESS_METRICS: tuple[str, ...] = ("format_valid_rate", "mean_retrieval_steps", "searches_below_hops_rate", *STEP_VALIDITY_RATES)
#: Per-seed values an arm is tested on against its reference and its control, paired over the seeds
#: both ran: ``(per-seed key, suffix of the vs_OTHER_SUFFIX result)``.
PAIRED_OVER_SEEDS: tuple[tuple[str, str], ...] = (
    ("em", "by_seed"),
    ("non_yes_no_em", "non_yes_no_by_seed"),
    *((rate, f"{rate}_by_seed") for rate in STEP_VALIDITY_RATES),
)
ABLATIONS: tuple[str, ...] = ("table2", "beta", "topk", "process", "family")
Ablation = Literal["table2", "beta", "topk", "process", "family"]


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


def evaluate_on_test(run: Run, name: str, policy: str, ev: Any) -> Path:
    """Stage ``eval-NAME``: ``policy`` on the test split with ``ev``; returns ``eval/NAME``."""
    from prorag.evaluation.runner import evaluate_files

    ev_dir = run.path("eval", name)
    run.stage(
        f"eval-{name}",
        ev,
        lambda: evaluate_files(policy, run.path("splits", "test.jsonl"), str(run.path("index")), ev_dir, ev, device=run.device),
    )
    return ev_dir


def train_rl_policy(run: Run, name: str, rl_cfg: Any) -> str:
    """Stage ``rl-NAME``: RL with ``rl_cfg`` into ``rl/NAME`` (skipped when done with the same
    settings, so an ablation reuses any run of the same name and config); returns its policy."""
    from prorag.stages.rl import train_rl

    run.stage(f"rl-{name}", rl_cfg, lambda: train_rl(rl_cfg, run.path("rl", name)))
    return str(run.path("rl", name, "policy"))


def train_and_test(run: Run, name: str, rl_cfg: Any, ev: Any) -> Path:
    """:func:`train_rl_policy`, then :func:`evaluate_on_test` of its policy; returns ``eval/NAME``."""
    return evaluate_on_test(run, name, train_rl_policy(run, name, rl_cfg), ev)


def dpo_policy(run: Run, seed: int) -> str:
    """The family's ``dpo`` arm: offline DPO of pi_sft on the run's judged MCTS pairs with the
    config's ``dpo`` settings and ``seed`` (stage ``dpo-seedS``, ``policies/dpo-seedS``). It is
    the ReasonRAG-style baseline: process supervision without RL, from pi_sft as in the paper."""
    from prorag.stages.dpo import train_dpo

    cfg = replace(
        run.config.dpo,
        pairs_file=str(run.path("pairs", "pairs.jsonl")),
        init=str(run.path("policies", "sft", "policy")),
        seed=seed,
    )
    out = run.path("policies", f"dpo-seed{seed}")
    run.stage(f"dpo-seed{seed}", cfg, lambda: train_dpo(cfg, out))
    return str(out / "policy")


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


def arm_config(run: Run, arm: Arm, seed: int) -> Any:
    """The RL config of one arm and seed: the pipeline's (:func:`rl_config` from pi_rft) with the
    arm's assignments. An arm with a step-reward source starts from the ProRAG system's config
    (the config's beta, the PRM), one without from the GRPO system's, so the ``grpo`` and
    ``prorag`` arms have exactly those systems' fingerprints and reuse their runs."""
    source = next((a.split("=", 1)[1] for a in arm if a.startswith("process_reward=")), "none")
    cfg = rl_config(run, "rft", process=source != "none", beta=run.config.rl.beta, seed=seed)
    cfg = apply_overrides(cfg, arm, where=f"arm {' '.join(arm) or '(grpo)'}")
    # An arm that turns the dev curve on (e.g. for select_policy=best_dev) reads the dev split too.
    return replace(cfg, eval_file=rl_dev_file(run, cfg), sft_replay=rl_replay(run, cfg))


def _group_means(
    scores: Mapping[str, float], key_of: Mapping[str, str], searches: Mapping[str, float] | None = None
) -> dict[str, dict[str, float]]:
    """Mean of per-question ``scores`` in each group of ``key_of`` (question id -> group), and of
    per-question ``searches`` (``searches``, where every question of the group has one)."""
    groups: dict[str, list[str]] = {}
    for qid in scores:
        if qid in key_of:
            groups.setdefault(key_of[qid], []).append(qid)
    out: dict[str, dict[str, float]] = {}
    for key, qids in sorted(groups.items()):
        out[key] = {"n": len(qids), "em": sum(scores[q] for q in qids) / len(qids)}
        if searches is not None and all(q in searches for q in qids):
            out[key]["searches"] = sum(searches[q] for q in qids) / len(qids)
    return out


def _seed_averaged(em_by_seed: Mapping[str, Mapping[str, float]], seeds: Sequence[str]) -> dict[str, float]:
    """Per-question EM averaged over ``seeds`` (the questions every one of those seeds answered)."""
    questions = set.intersection(*(set(em_by_seed[s]) for s in seeds))
    return {q: sum(em_by_seed[s][q] for s in seeds) / len(seeds) for q in questions}


def _versus(
    stats: Mapping[str, Any], em_by_seed: Mapping[str, Mapping[str, Mapping[str, float]]], arm: str, other: str
) -> dict[str, dict[str, Any]]:
    """The tests of ``arm`` against ``other`` under ``vs_OTHER*`` keys (see :func:`process_statistics`).

    The per-question test averages each arm over the seeds both ran: where one arm has seeds the
    other lacks (a study that finished its arms unevenly), averaging each over its own seeds would
    pair a question's score under some rollout streams with its score under others."""
    out: dict[str, dict[str, Any]] = {}
    common = sorted(em_by_seed[arm].keys() & em_by_seed[other].keys())
    mine, theirs = (_seed_averaged(em_by_seed[a], common or sorted(em_by_seed[a])) for a in (arm, other))
    shared = sorted(mine.keys() & theirs.keys())
    out[f"vs_{other}"] = asdict(paired_t_test([mine[q] for q in shared], [theirs[q] for q in shared]))
    # Over the seeds both have: EM, EM on the questions whose answer has to be found (not yes/no),
    # where a gain is not a gain in the answer's form, and the oracle's step-validity rates, where
    # step rewards show first (PAIRED_OVER_SEEDS).
    for metric, suffix in PAIRED_OVER_SEEDS:
        pair = [stats[a]["per_seed"] for a in (arm, other)]
        both = sorted(s for s in pair[0].keys() & pair[1].keys() if all(metric in p[s] for p in pair))
        if len(both) >= 2:
            values = [[p[s][metric] for s in both] for p in pair]
            # The paired difference's own 95% CI (t over the seeds' differences): what a reader
            # quotes as "+x ± y EM", beside the test's p-value.
            _, ci95 = mean_and_ci(a - b for a, b in zip(*values, strict=True))
            out[f"vs_{other}_{suffix}"] = asdict(paired_t_test(*values)) | {"ci95": ci95, "seeds": both}
    # The runs as two sets, unpaired: runs whose float paths part within a few steps share a
    # seed in name only (docs/LOG.md, 2026-11-25), so this test does not lean on the pairing.
    runs = [[v["em"] for v in stats[a]["per_seed"].values()] for a in (arm, other)]
    if min(map(len, runs)) >= 2:
        out[f"vs_{other}_runs"] = asdict(permutation_test(*runs))
    return out


def process_statistics(
    predictions: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    reference: str = "grpo",
    extras: Mapping[str, Mapping[int, Mapping[str, float | None]]] | None = None,
    controls: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An arms ablation's numbers from each arm's per-seed prediction rows (``predictions.jsonl``).

    Per arm: per-seed EM/F1, their mean ± 95% CI over seeds (:func:`mean_and_ci`), EM by question
    ``type`` and ``hops`` (of the seed-averaged per-question EM) and, for every arm but
    ``reference``, a paired t-test of seed-averaged per-question EM against it (over the questions
    both have, each averaged over the seeds both ran). Averaging over seeds first takes the seed
    noise out of each question's score.
    That test treats the questions as the sample and so ignores how much a whole run varies with
    its seed, which is the larger noise here (one seed that collapses moves every question), so
    each arm also gets ``vs_REFERENCE_by_seed``: a paired t-test of per-seed EM over the seeds both
    have (the same seed gives both arms the same rollout streams), the test to read first, with the
    differences' 95% CI (``ci95``) and the seeds it pairs (``seeds``), and
    ``vs_REFERENCE_non_yes_no_by_seed``, the same on the EM of the questions that are not yes/no,
    ``vs_REFERENCE_valid_search_rate_by_seed`` (and sub-answers, answers) the same on the oracle's
    step-validity rates where the evaluations measured them (:data:`PAIRED_OVER_SEEDS`), and
    ``vs_REFERENCE_runs``, an exact permutation test of the two arms' per-seed EM as unpaired sets
    (:func:`permutation_test`; the same seed's runs part within a few RL steps, so the pairing may
    buy nothing).
    ``extras[arm][seed]`` adds per-seed scalars (``None``: not measured) with their mean and CI, as
    do the yes/no scores of the rows (:func:`yes_no_scores`): an arm can gain EM there by saying
    one word more often, which ``yes_no_constant_em`` puts in proportion.
    ``controls`` (arm -> its control arm, e.g. :data:`CONTROLS`) adds the same tests against the
    arm's control, under ``vs_CONTROL*`` keys, and names it under ``control``, where both ran."""
    out: dict[str, Any] = {}
    em_by_seed: dict[str, dict[str, dict[str, float]]] = {}
    for arm, by_seed in predictions.items():
        per_seed = {
            str(s): {m: sum(float(r[m]) for r in rows) / len(rows) for m in ("em", "f1")}
            | (yes_no_scores((r.get("prediction"), r["golden_answers"]) for r in rows if "golden_answers" in r) or {})
            for s, rows in by_seed.items()
        }
        for seed, values in (extras or {}).get(arm, {}).items():
            per_seed.setdefault(str(seed), {}).update({k: v for k, v in values.items() if v is not None})
        em, em_ci = mean_and_ci(v["em"] for v in per_seed.values())
        f1, f1_ci = mean_and_ci(v["f1"] for v in per_seed.values())
        scores: dict[str, list[float]] = {}
        steps: dict[str, list[float]] = {}
        meta: dict[str, dict[str, str]] = {"type": {}, "hops": {}}
        for rows in by_seed.values():
            for r in rows:
                scores.setdefault(str(r["id"]), []).append(float(r["em"]))
                if "retrieval_steps" in r:
                    steps.setdefault(str(r["id"]), []).append(float(r["retrieval_steps"]))
                for key in meta:
                    if key in r:
                        meta[key][str(r["id"])] = str(r[key])
        em_by_seed[arm] = {str(s): {str(r["id"]): float(r["em"]) for r in rows} for s, rows in by_seed.items()}
        averaged = {q: sum(v) / len(v) for q, v in scores.items()}
        searches = {q: sum(v) / len(v) for q, v in steps.items() if len(v) == len(scores[q])}
        out[arm] = {"per_seed": per_seed, "em": em, "em_ci95": em_ci, "f1": f1, "f1_ci95": f1_ci}
        for key in sorted({k for v in per_seed.values() for k in v} - {"em", "f1"}):
            values = [v[key] for v in per_seed.values() if key in v]
            out[arm][key], out[arm][f"{key}_ci95"] = mean_and_ci(values) if len(values) > 1 else (values[0], 0.0)
        out[arm] |= {f"by_{key}": _group_means(averaged, meta[key], searches) for key in meta if meta[key]}
    for arm in out:
        if arm != reference and reference in em_by_seed:
            out[arm] |= _versus(out, em_by_seed, arm, reference)
        control = (controls or {}).get(arm)
        if control in out:
            out[arm]["control"] = control
            out[arm] |= _versus(out, em_by_seed, arm, control)
    return out


def _versus_text(row: Mapping[str, Any], other: str) -> str:
    """One arm's tests against ``other`` as console text ("" where none ran)."""
    test, by_seed = row.get(f"vs_{other}"), row.get(f"vs_{other}_by_seed")
    runs, rest = row.get(f"vs_{other}_runs"), row.get(f"vs_{other}_non_yes_no_by_seed")
    text = f"dEM {100 * test['mean_diff']:+.1f}  p={p_value_text(test)}" if test else ""
    text += (
        f"  (over seeds {100 * by_seed['mean_diff']:+.1f} ± {100 * by_seed['ci95']:.1f}, p={p_value_text(by_seed)})"
        if by_seed
        else ""
    )
    text += f"  (runs unpaired p={runs['p_value']:.3f})" if runs else ""
    text += f"  non-yes/no dEM {100 * rest['mean_diff']:+.1f} p={p_value_text(rest)}" if rest else ""
    steps = [row[key] for rate in STEP_VALIDITY_RATES if (key := f"vs_{other}_{rate}_by_seed") in row]
    if len(steps) == len(STEP_VALIDITY_RATES):
        diffs = "/".join(f"{100 * test['mean_diff']:+.1f}" for test in steps)
        p_values = "/".join(f"{test['p_value']:.2f}" for test in steps)
        text += f"  valid search/sub-answer/answer {diffs} pts (p={p_values}, {steps[0]['n']} seeds)"
    return text


def process_table(stats: Mapping[str, Any], reference: str = "grpo") -> str:
    """The console table of :func:`process_statistics`: EM and F1 (%) mean ± 95% CI, and the
    paired test against ``reference``; then each arm against its control, where both ran."""
    lines = [f"{'arm':<16} {'seeds':>5}  {'EM (%)':>14}  {'F1 (%)':>14}  vs {reference} (seed-averaged per-question EM)"]
    for arm, row in stats.items():
        lines.append(
            f"{arm:<16} {len(row['per_seed']):>5}  {100 * row['em']:>6.1f} ± {100 * row['em_ci95']:<5.1f}"
            f"  {100 * row['f1']:>6.1f} ± {100 * row['f1_ci95']:<5.1f}  {_versus_text(row, reference) or '(reference)'}"
        )
    controlled = [(arm, row) for arm, row in stats.items() if "control" in row]
    if controlled:
        lines.append("against its control (built in: the same step rewards shuffled within each group):")
        lines += [f"  {arm} vs {row['control']}: {_versus_text(row, row['control'])}" for arm, row in controlled]
    return "\n".join(lines)


#: Training-log means an arms table reports: ``metrics.jsonl`` key -> the stats key.
TRAINING_SIGNALS: dict[str, str] = {
    "step_time": "seconds_per_rl_step",
    "groups_em_agree": "groups_em_agree",
    "groups_reward_agree": "groups_reward_agree",
    "advantage_process_share": "advantage_process_share",
    "advantage_silent_share": "advantage_silent_share",
}


def training_signals(metrics_file: Path) -> dict[str, float | None]:
    """Means over an RL run's ``metrics.jsonl`` of :data:`TRAINING_SIGNALS` (``None`` where never
    logged, e.g. an offline arm): the wall time of one optimiser step, and the share of rollout
    groups whose samples all agree on EM, or all get one outcome reward. The last two are how
    much outcome signal an arm had: a group whose outcome rewards all agree has zero outcome
    advantage, so only a step reward can teach on it, and the gap between the two counts the
    groups that agree on the answer but whose outcome rewards still differ (its format terms).
    Then what the arm's advantages were made of (:func:`~prorag.method.advantages.advantage_composition`):
    the share of their size the step rewards add to outcome GRPO's, and the share that falls on
    the groups GRPO is silent on (both 0 for GRPO)."""
    rows = list(read_jsonl(metrics_file)) if metrics_file.exists() else []
    out: dict[str, float | None] = {}
    for key, name in TRAINING_SIGNALS.items():
        values = [float(r[key]) for r in rows if key in r]
        out[name] = sum(values) / len(values) if values else None
    return out


#: The family's arms trained without RL: name -> ``fn(run, seed)`` -> policy folder.
FAMILY_OFFLINE: dict[str, Callable[[Run, int], str]] = {"dpo": dpo_policy}


#: RL fields an arm may not set: what the comparison holds the same in every arm (the start
#: policy, the questions, the index, the seed that fixes the rollout streams).
HELD_FIXED: tuple[str, ...] = ("policy", "train_file", "index", "seed")


@dataclass(frozen=True)
class ArmSet:
    """The arms of one ablation: RL arms (name -> assignments), offline arms (name -> ``fn(run,
    seed)`` -> policy folder) and the pairs tested beside GRPO (arm -> its control)."""

    rl: dict[str, Arm]
    offline: dict[str, Callable[[Run, int], str]]
    controls: dict[str, str]


def ablation_arms(config: PipelineConfig, what: str) -> ArmSet:
    """The arms of ``what`` (``process`` or ``family``): the registry's (:data:`PROCESS_ARMS`, or
    :data:`FAMILY_ARMS` and :data:`FAMILY_OFFLINE`), then the config's ``extra_arms`` in their
    order, with :data:`CONTROLS` and the config's ``arm_controls``.

    Everything is checked here, before an ablation runs for hours: an extra arm may not reuse a
    built-in name (its runs would be taken for the built-in arm's), its assignments must set
    ``rl.*`` fields to values the RL config accepts, and a control pair must name two arms."""
    if what not in ("process", "family"):
        raise ValueError(f"arms belong to --what process or family, not {what!r}")
    rl: dict[str, Arm] = dict(PROCESS_ARMS if what == "process" else FAMILY_ARMS)
    offline = {} if what == "process" else dict(FAMILY_OFFLINE)
    for name, assignments in config.extra_arms.items():
        if name == FROZEN_ARM:
            raise ValueError(
                f"extra_arms.{name}: the name is the stream control's (`stream_control: true` runs it); give yours another name"
            )
        if name in rl or name in offline:
            raise ValueError(
                f"extra_arms.{name}: the {what} ablation already has an arm {name!r} "
                f"({' '.join(rl.get(name, ('offline',))) or 'outcome-only GRPO'}); give yours another name"
            )
        if not name or any(c in name for c in "/ ,"):
            raise ValueError(
                f"extra_arms: arm name {name!r} must be non-empty, without '/', ',' or spaces (it names run folders)"
            )
        arm = tuple(assignments)
        fixed = [a for a in arm if parse_assignment(a)[0].split(".")[0] in HELD_FIXED]
        if fixed:
            raise ValueError(
                f"extra_arms.{name}: {', '.join(fixed)}: every arm starts from the same pi_rft with the same RL "
                f"questions, index and seeds, so {', '.join(HELD_FIXED)} cannot be set per arm"
            )
        apply_overrides(config.rl, arm, where=f"extra_arms.{name}:")
        rl[name] = arm
    controls = dict(CONTROLS)
    known = [*rl, *offline]
    for arm, control in config.arm_controls.items():
        unknown = [a for a in (arm, control) if a not in known]
        if unknown or arm == control:
            why = f"unknown arm(s) {', '.join(unknown)}" if unknown else "an arm cannot be its own control"
            raise ValueError(f"arm_controls.{arm}: {control}: {why}; arms of the {what} ablation: {', '.join(known)}")
        controls[arm] = control
    return ArmSet(rl, offline, controls)


def select_arms(
    arms: Mapping[str, Arm],
    names: Sequence[str],
    label: str = "ablation",
    offline: Mapping[str, Callable[[Run, int], str]] | None = None,
) -> tuple[dict[str, Arm], dict[str, Callable[[Run, int], str]]]:
    """The RL and offline arms named in ``names``, in the registry's order (so a table's rows
    keep their usual order however the names were typed). A subset lets one run the arms a
    question needs, or spread them over machines; the reference arm (``grpo``) is the one
    every other arm is tested against, so leaving it out leaves the tables without tests."""
    offline = dict(offline or {})
    unknown = [n for n in names if n not in arms and n not in offline]
    if unknown or not names:
        known = ", ".join([*arms, *offline])
        raise ValueError(
            f"--arms of the {label}: unknown arm(s) {', '.join(unknown) or '(none given)'}; expected some of {known}"
        )
    return {a: v for a, v in arms.items() if a in names}, {a: v for a, v in offline.items() if a in names}


def read_evaluation(folder: Path, metrics: Sequence[str] = ()) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """One evaluation folder (``prorag eval --out``) as an arm's seed: its prediction rows, and the
    ``metrics`` its ``metrics.json`` holds, ``None`` where not measured (no over-search without
    re-asking; no ``metrics.json`` at all where only the predictions were kept)."""
    rows = list(read_jsonl(folder / "predictions.jsonl"))
    measured = read_json(folder / "metrics.json") if (folder / "metrics.json").is_file() else {}
    return rows, {m: measured.get(m) for m in metrics}


def arms_ablation(
    run: Run,
    arms: Mapping[str, Arm],
    progress: Callable[[str], None],
    seeds: Sequence[int] | None = None,
    metrics: Sequence[str] = (),
    label: str = "ablation",
    over_search: bool = False,
    offline: Mapping[str, Callable[[Run, int], str]] | None = None,
    only: Sequence[str] | None = None,
    controls: Mapping[str, str] = CONTROLS,
    train_only: bool = False,
) -> dict[str, Any]:
    """Train and evaluate every arm (those named in ``only``, when given) for each seed
    (``process_seeds`` unless given), then :func:`process_statistics` with the evaluation's
    ``metrics`` and the training log's :func:`training_signals` as extras; ``curves`` names each
    arm's ``metrics.jsonl`` per seed (held-out EM with ``eval_every``).
    ``over_search`` turns on the evaluation's re-asking of sub-queries (``over_search_rate``).
    ``offline`` arms are trained without RL (``fn(run, seed)`` -> policy folder) and tested alike;
    ``controls`` (arm -> control) are tested where both ran. ``train_only``: the runs and their
    evaluations, no statistics (a worker's share, :mod:`prorag.experiments.workers`; any number
    of seeds); returns ``{}``."""
    cfg = run.config
    seeds = list(seeds if seeds is not None else cfg.process_seeds)
    if len(seeds) < 2 and not train_only:
        raise ValueError(f"the {label} needs at least 2 seeds per arm (a 95% CI over seeds), got {seeds}")
    if only is not None:
        arms, offline = select_arms(arms, only, label, offline)
    ev = replace(system_eval_config(cfg, "prorag"), over_search=over_search or cfg.eval.over_search)
    # Every arm as ``train(seed) -> policy folder``: RL arms by their assignments, offline ones as given.
    trainers: dict[str, Callable[[int], str]] = {
        arm: lambda seed, arm=arm, a=assignments: train_rl_policy(run, rl_run_name(arm, seed), arm_config(run, a, seed))
        for arm, assignments in arms.items()
    } | {arm: lambda seed, train=train: train(run, seed) for arm, train in (offline or {}).items()}
    predictions: dict[str, dict[int, list[dict[str, Any]]]] = {}
    extras: dict[str, dict[int, dict[str, float | None]]] = {}
    for arm, train in trainers.items():
        predictions[arm], extras[arm] = {}, {}
        for seed in seeds:
            name = rl_run_name(arm, seed)
            ev_dir = evaluate_on_test(run, name, train(seed), ev)
            if train_only:
                continue
            predictions[arm][seed], extras[arm][seed] = read_evaluation(ev_dir, metrics)
            extras[arm][seed] |= training_signals(run.path("rl", name, "metrics.jsonl"))
            # The step whose weights were evaluated, for an arm that stops early on dev (select_policy).
            chosen = dev_selection(run.path("rl", name))
            extras[arm][seed]["selected_step"] = chosen["step"] if chosen else None
        progress(f"{label}: {arm} done ({len(seeds)} seeds)")
    if cfg.stream_control:  # pi_rft on each seed's stream: trained at learning rate 0, never evaluated on test
        for seed in seeds:
            train_rl_policy(run, rl_run_name(FROZEN_ARM, seed), arm_config(run, FROZEN_ASSIGNMENTS, seed))
        progress(f"{label}: {FROZEN_ARM} (stream control) done ({len(seeds)} seeds)")
    if train_only:
        return {}
    result = {
        "arms": {arm: list(a) for arm, a in arms.items()} | {arm: ["offline"] for arm in offline or {}},
        "seeds": seeds,
        "stats": process_statistics(predictions, extras=extras, controls=controls),
        "curves": {arm: [f"rl/{rl_run_name(arm, s)}/metrics.jsonl" for s in seeds] for arm in arms},
    }
    if cfg.stream_control:
        metrics = {arm: {s: run.path("rl", rl_run_name(arm, s), "metrics.jsonl") for s in seeds} for arm in arms}
        frozen = {s: run.path("rl", rl_run_name(FROZEN_ARM, s), "metrics.jsonl") for s in seeds}
        result["stream"] = stream_statistics(metrics, frozen)
    return result


def process_ablation(
    run: Run,
    progress: Callable[[str], None],
    seeds: Sequence[int] | None = None,
    only: Sequence[str] | None = None,
    train_only: bool = False,
) -> dict[str, Any]:
    """:func:`arms_ablation` over :data:`PROCESS_ARMS` (where the step rewards come from) and the
    config's extra arms (:func:`ablation_arms`) with :data:`PROCESS_METRICS`."""
    arms = ablation_arms(run.config, "process")
    return arms_ablation(
        run,
        arms.rl,
        progress,
        seeds,
        PROCESS_METRICS,
        label="process ablation",
        only=only,
        controls=arms.controls,
        train_only=train_only,
    )


def family_ablation(
    run: Run,
    progress: Callable[[str], None],
    seeds: Sequence[int] | None = None,
    only: Sequence[str] | None = None,
    train_only: bool = False,
) -> dict[str, Any]:
    """:func:`arms_ablation` over :data:`FAMILY_ARMS` and the config's extra arms
    (:func:`ablation_arms`) with :data:`FAMILY_METRICS` (the methods compared)."""
    arms = ablation_arms(run.config, "family")
    return arms_ablation(
        run,
        arms.rl,
        progress,
        seeds,
        FAMILY_METRICS,
        label="family comparison",
        over_search=True,
        offline=arms.offline,
        only=only,
        controls=arms.controls,
        train_only=train_only,
    )


def worker_main(argv: Sequence[str] | None = None) -> None:
    """One worker of ``prorag ablate --workers N`` (:mod:`prorag.experiments.workers` starts it):
    the runs and evaluations of some seeds of an ablation, no statistics."""
    import argparse

    import torch

    from prorag.core.config import load_config

    parser = argparse.ArgumentParser(
        prog="prorag-ablation-worker",
        description="One worker of `prorag ablate --workers N` (started by it; see prorag.experiments.workers).",
    )
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True, help="the run's resolved PipelineConfig (YAML)")
    parser.add_argument("--what", choices=("process", "family"), required=True)
    parser.add_argument("--seeds", required=True, help="comma-separated")
    parser.add_argument("--threads", type=int, required=True, help="torch CPU threads")
    parser.add_argument("--arms", default=None, help="comma-separated; default all")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    def say(message: str) -> None:
        print(message, flush=True)

    run = Run(args.run_dir, resolve(load_config(args.config, PipelineConfig)), say)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    arms = [a for a in args.arms.split(",") if a] if args.arms else None
    ablation = process_ablation if args.what == "process" else family_ablation
    ablation(run, say, seeds, arms, train_only=True)


def write_arms_results(
    run_dir: Path,
    result: Mapping[str, Any],
    digest: str,
    command: str,
    results_dir: Path | None = None,
    name: str = "process",
) -> Path:
    """``RUN/ablations/NAME.json`` (the ablation, the pipeline config's fingerprint, the command
    line), copied to ``results_dir/NAME_DATE.json`` when given; returns the run folder's file."""
    path = Path(run_dir) / "ablations" / f"{name}.json"
    payload = {**result, "config_fingerprint": digest, "command": command}
    write_json(path, payload)
    if results_dir is not None:
        write_json(Path(results_dir) / f"{name}_{datetime.date.today().isoformat()}.json", payload)
    return path


def run_ablation(
    config: PipelineConfig,
    run_dir: str | Path,
    what: Ablation | str,
    *,
    progress: Callable[[str], None] = print,
    seeds: Sequence[int] | None = None,
    results_dir: Path | None = None,
    command: str = "",
    arms: Sequence[str] | None = None,
    workers: int = 1,
) -> str:
    """Run one ablation in ``run_dir`` (the pipeline first, skipping what is done) and merge its
    numbers into ``results.json``; returns a table for the terminal. ``seeds``, ``results_dir``,
    ``command``, ``arms`` (a subset, :func:`select_arms`) and ``workers`` (the seeds spread over
    that many processes, :func:`~prorag.experiments.workers.run_in_workers`) are the arms
    ablations' (:func:`process_ablation`, :func:`family_ablation`, :func:`write_arms_results`)."""
    # The arms are checked before the pipeline runs, not after hours of it.
    if what in ("process", "family"):
        known = ablation_arms(config, what)
        rl_arms, offline_arms = (
            (known.rl, known.offline) if arms is None else select_arms(known.rl, arms, f"{what} ablation", known.offline)
        )
    elif arms is not None:
        raise ValueError(f"--arms applies to --what process or family, not {what!r}")
    if workers < 1 or (workers > 1 and what not in ("process", "family")):
        raise ValueError(f"--workers must be 1, or more with --what process or family; got {workers} with {what!r}")
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
    elif what in ("process", "family"):
        ablation = process_ablation if what == "process" else family_ablation
        if workers > 1:
            from prorag.experiments.workers import run_in_workers

            # The workers train and evaluate every run; the pass below finds them done and reads them.
            todo = seeds if seeds is not None else run.config.process_seeds
            run_in_workers(run, what, todo, [*rl_arms, *offline_arms], workers, progress)
        results[f"{what}_ablation"] = ablation(run, progress, seeds, arms)
        where = write_arms_results(
            Path(run_dir), results[f"{what}_ablation"], fingerprint(used_settings(run.config)), command, results_dir, what
        )
        text = process_table(results[f"{what}_ablation"]["stats"])
        if "stream" in results[f"{what}_ablation"]:
            text += "\n" + stream_table(results[f"{what}_ablation"]["stream"])
        text += f"\n-> {where}"
    else:
        raise ValueError(f"unknown ablation {what!r}; expected one of {', '.join(ABLATIONS)}")
    # Merge with what earlier ablations wrote.
    path = Path(run_dir) / "results.json"
    write_json(path, results)
    if config.report:
        from prorag.experiments.report.build import write_report

        write_report(Path(run_dir))
    return text


__all__ = [
    "ABLATIONS",
    "ArmSet",
    "BETAS",
    "CONTROLS",
    "FAMILY_ARMS",
    "FAMILY_METRICS",
    "FAMILY_OFFLINE",
    "HELD_FIXED",
    "PROCESS_ARMS",
    "PROCESS_METRICS",
    "TOP_KS",
    "ablation_arms",
    "arm_config",
    "arms_ablation",
    "beta_sweep",
    "dpo_policy",
    "family_ablation",
    "process_ablation",
    "process_statistics",
    "process_table",
    "select_arms",
    "run_ablation",
    "significance",
    "summarise_variant",
    "sweep_variant",
    "evaluate_on_test",
    "topk_sweep",
    "training_signals",
    "train_and_test",
    "train_rl_policy",
    "worker_main",
    "write_arms_results",
]
