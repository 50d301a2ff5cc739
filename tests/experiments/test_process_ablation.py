"""``prorag ablate --what process``: the arms share pi_rft, questions, budget and seeds, GRPO and
ProRAG reuse the pipeline's runs, the statistics are hand-checked, and a tiny end-to-end run
writes the JSON, the report section and the console table."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import prorag.experiments.ablations as ablations
from prorag.cli import app
from prorag.core.config import load_config, used_settings
from prorag.data.jsonl import read_json, read_jsonl, write_json
from prorag.experiments.pipeline import PipelineConfig, demo_config, fingerprint, resolve, stage_eval, stage_rl
from prorag.experiments.report.table import process_tables
from tests.experiments.test_ablations import RecordingRun


def _rows(ems: list[float], types: list[str] | None = None) -> list[dict[str, Any]]:
    return [
        {"id": f"q{i}", "em": em, "f1": em, "hops": 2 if i < 2 else 3, **({"type": types[i]} if types else {})}
        for i, em in enumerate(ems)
    ]


def test_statistics_by_hand() -> None:
    # GRPO: seed EM 1/4 and 2/4; PRM: 3/4 and 4/4. Seed-averaged per-question EM: GRPO
    # (0.5, 0.5, 0.5, 0), PRM (1, 1, 1, 0.5): differences (0.5, 0.5, 0.5, 0.5) -> t = +inf, p = 0.
    preds = {
        "grpo": {0: _rows([1, 0, 0, 0]), 1: _rows([0, 1, 1, 0])},
        "prorag": {0: _rows([1, 1, 1, 0]), 1: _rows([1, 1, 1, 1])},
    }
    stats = ablations.process_statistics(preds)
    grpo, prm = stats["grpo"], stats["prorag"]
    assert grpo["per_seed"] == {"0": {"em": 0.25, "f1": 0.25}, "1": {"em": 0.5, "f1": 0.5}}
    # mean 0.375, s = 0.1767767, t_{0.975, 1} = 12.706205 -> half-width 12.706205 * 0.1767767 / sqrt(2) = 1.588276
    assert grpo["em"] == pytest.approx(0.375) and grpo["em_ci95"] == pytest.approx(1.588276, abs=1e-6)
    assert "vs_grpo" not in grpo
    assert prm["vs_grpo"]["mean_diff"] == pytest.approx(0.5) and prm["vs_grpo"]["p_value"] == 0.0
    assert math.isinf(prm["vs_grpo"]["t"]) and prm["vs_grpo"]["n"] == 4
    assert prm["by_hops"] == {"2": {"n": 2, "em": 1.0}, "3": {"n": 2, "em": 0.75}}
    assert "by_type" not in prm
    # over seeds: per-seed EM differences (0.5, 0.5), all equal -> t = +inf, p = 0 (the defined limit)
    assert prm["vs_grpo_by_seed"]["mean_diff"] == pytest.approx(0.5) and prm["vs_grpo_by_seed"]["n"] == 2
    assert prm["vs_grpo_by_seed"]["p_value"] == 0.0 and "vs_grpo_by_seed" not in grpo
    # the runs unpaired: per-seed EM {0.75, 1} against {0.25, 0.5}; of the 6 splits of the four values
    # 2 reach |difference| 0.5 -> exact permutation p = 1/3
    runs = prm["vs_grpo_runs"]
    assert (runs["mean_diff"], runs["p_value"], runs["exact"]) == (pytest.approx(0.5), pytest.approx(1 / 3), True)
    assert "vs_grpo_runs" not in grpo
    table = ablations.process_table(stats)
    assert "37.5 ± 158.8" in table and "dEM +50.0" in table and "runs unpaired p=0.333" in table
    [main, hops] = process_tables({"arms": ablations.PROCESS_ARMS, "stats": stats})
    assert main[1][-1] == "ΔEM vs GRPO, runs unpaired (permutation)"
    assert main[2][1] == [
        "prorag",
        "process_reward=prm",
        "2",
        "87.5 ± 158.8",
        "87.5 ± 158.8",
        "+50.0 (p=0, all 4 differences equal)",
        "+50.0 (p=0.333)",
    ]
    assert hops[1:] == (["Arm", "2", "3"], [["grpo", "50.0", "25.0"], ["prorag", "100.0", "75.0"]])


def test_searches_by_hops_by_hand() -> None:
    # Questions q0, q1 have 2 hops, q2, q3 have 3. GRPO searches (1, 2, 2, 3) with seed 0 and
    # (1, 2, 3, 3) with seed 1: per question 1, 2, 2.5, 3 -> 1.5 searches on 2 hops, 2.75 on 3.
    def searched(rows: list[dict[str, Any]], steps: list[int]) -> list[dict[str, Any]]:
        return [{**r, "retrieval_steps": n} for r, n in zip(rows, steps, strict=True)]

    preds = {
        "grpo": {0: searched(_rows([1, 0, 0, 0]), [1, 2, 2, 3]), 1: searched(_rows([0, 1, 1, 0]), [1, 2, 3, 3])},
        # a seed without retrieval steps in its rows: no searches for that arm
        "prorag": {0: searched(_rows([1, 1, 1, 0]), [2, 2, 3, 3]), 1: _rows([1, 1, 1, 1])},
    }
    stats = ablations.process_statistics(preds)
    assert stats["grpo"]["by_hops"] == {"2": {"n": 2, "em": 0.5, "searches": 1.5}, "3": {"n": 2, "em": 0.25, "searches": 2.75}}
    assert stats["prorag"]["by_hops"] == {"2": {"n": 2, "em": 1.0}, "3": {"n": 2, "em": 0.75}}
    *_, hops_em, searches = process_tables({"arms": ablations.PROCESS_ARMS, "stats": stats})
    assert hops_em[0] == "Test EM (%) by hops"
    assert searches[1:] == (["Arm", "2", "3"], [["grpo", "1.50", "2.75"], ["prorag", "", ""]])


def test_each_arm_is_tested_against_its_control_by_hand() -> None:
    # GRPO per-seed EM 1/4, 2/4, 1/4; the PRM arm 3/4, 3/4, 4/4; its control (the PRM's scores
    # shuffled) 2/4, 2/4, 2/4. Against the control, per seed: +0.25, +0.25, +0.5 -> mean 1/3,
    # s = 0.144338, t = (1/3) / (0.144338 / sqrt 3) = 4.0 on 2 df; p = 1 - t / sqrt(2 + t^2) = 0.057191.
    preds = {
        "grpo": {0: _rows([1, 0, 0, 0]), 1: _rows([0, 1, 1, 0]), 2: _rows([0, 0, 1, 0])},
        "prorag": {0: _rows([1, 1, 1, 0]), 1: _rows([1, 1, 0, 1]), 2: _rows([1, 1, 1, 1])},
        "prorag-shuffled": {0: _rows([1, 1, 0, 0]), 1: _rows([0, 1, 1, 0]), 2: _rows([1, 0, 1, 0])},
    }
    stats = ablations.process_statistics(preds, controls=ablations.CONTROLS)
    prm = stats["prorag"]
    assert prm["control"] == "prorag-shuffled" and "control" not in stats["prorag-shuffled"]
    test = prm["vs_prorag-shuffled_by_seed"]
    assert (test["n"], test["mean_diff"]) == (3, pytest.approx(1 / 3))
    assert test["t"] == pytest.approx(4.0) and test["p_value"] == pytest.approx(0.057191, abs=1e-6)
    # the differences' 95% CI: t_{0.975, 2} = 4.302653 times s / sqrt 3 = 0.083333 -> 0.358554
    assert test["ci95"] == pytest.approx(0.358554, abs=1e-6) and test["seeds"] == ["0", "1", "2"]
    # seed-averaged per question: PRM (1, 1, 2/3, 2/3), control (2/3, 2/3, 2/3, 0): differences
    # (1/3, 1/3, 0, 2/3) -> mean 1/3, s = 0.272166, t = 2.449490 on 3 df, p = 0.091721
    per_question = prm["vs_prorag-shuffled"]
    assert per_question["mean_diff"] == pytest.approx(1 / 3) and per_question["t"] == pytest.approx(2.449490, abs=1e-6)
    assert per_question["p_value"] == pytest.approx(0.091721, abs=1e-6)
    # unpaired: {0.75, 0.75, 1} against {0.5, 0.5, 0.5}: of the 20 splits only the two that part
    # them reach |difference| 1/3 -> p = 0.1
    assert prm["vs_prorag-shuffled_runs"]["p_value"] == pytest.approx(0.1)
    # the tests against GRPO are there as before, and nothing is tested without a control map
    assert prm["vs_grpo_by_seed"]["mean_diff"] == pytest.approx(0.5)
    assert "control" not in ablations.process_statistics(preds)["prorag"]
    table = ablations.process_table(stats)
    assert "prorag vs prorag-shuffled: dEM +33.3  p=0.092  (over seeds +33.3 ± 35.9, p=0.057)  (runs unpaired p=0.100)" in table
    [_, controls, *_] = process_tables({"arms": ablations.PROCESS_ARMS, "stats": stats})
    assert controls[0].startswith("Each arm against its control")
    assert controls[2] == [["prorag", "prorag-shuffled", "+33.3 (p=0.092)", "+33.3 ± 35.9 (p=0.057)", "+33.3 (p=0.100)", ""]]
    # without a control arm in the ablation the table is not there
    del preds["prorag-shuffled"]
    tables = process_tables(
        {"arms": ablations.PROCESS_ARMS, "stats": ablations.process_statistics(preds, controls=ablations.CONTROLS)}
    )
    assert not any(title.startswith("Each arm against its control") for title, *_ in tables)


def test_statistics_carry_the_yes_no_scores_per_seed() -> None:
    # Two yes/no questions (gold "no", "yes") and one entity question. Seed 0 answers "no" to
    # both (EM 1/2 on them, no-rate 1), seed 1 answers "yes" and an entity (EM 0, no-rate 0).
    def rows(answers: list[str]) -> list[dict[str, Any]]:
        golds = [["no"], ["yes"], ["Drovi"]]
        return [
            {"id": f"q{i}", "em": float(a == g[0]), "f1": float(a == g[0]), "prediction": a, "golden_answers": g}
            for i, (a, g) in enumerate(zip(answers, golds, strict=True))
        ]

    preds = {"grpo": {0: rows(["no", "no", "Drovi"]), 1: rows(["yes", "Kilen", "Drovi"])}}
    grpo = ablations.process_statistics(preds)["grpo"]
    assert grpo["per_seed"]["0"]["yes_no_no_rate"] == 1.0 and grpo["per_seed"]["1"]["yes_no_no_rate"] == 0.0
    assert grpo["per_seed"]["1"]["yes_no_answered_rate"] == 0.5
    assert grpo["yes_no_em"] == 0.25 and grpo["yes_no_constant_em"] == 0.5
    assert grpo["yes_no_no_rate"] == 0.5 and grpo["yes_no_answered_rate"] == 0.75
    behaviour = process_tables({"arms": ablations.PROCESS_ARMS, "stats": {"grpo": grpo}})[1]
    # the entity question is right in both seeds: EM on the others 100 in each
    assert behaviour[1][1:4] == ["Non-yes/no EM (%)", "Yes/no EM (%)", "Constant guess (%)"]
    assert behaviour[2][0][1:4] == ["100.0 ± 0.0", "25.0 ± 317.7", "50.0 ± 0.0"]


def test_the_test_on_the_non_yes_no_questions_by_hand() -> None:
    # One yes/no question and two entity ones. GRPO and the arm score the same total EM in every
    # seed, but the arm's comes from the entity questions: over seeds it gains there.
    golds = [["yes"], ["Drovi"], ["Kilen"]]

    def rows(answers: list[str]) -> list[dict[str, Any]]:
        return [
            {"id": f"q{i}", "em": float(a == g[0]), "f1": float(a == g[0]), "prediction": a, "golden_answers": g}
            for i, (a, g) in enumerate(zip(answers, golds, strict=True))
        ]

    preds = {
        # non-yes/no EM per seed: 0, 0.5, 0.5
        "grpo": {0: rows(["yes", "x", "x"]), 1: rows(["yes", "Drovi", "x"]), 2: rows(["yes", "x", "Kilen"])},
        # non-yes/no EM per seed: 0.5, 1, 1 -> differences 0.5, 0.5, 0.5: t = +inf, p = 0
        "prorag": {0: rows(["no", "Drovi", "x"]), 1: rows(["no", "Drovi", "Kilen"]), 2: rows(["no", "Drovi", "Kilen"])},
    }
    stats = ablations.process_statistics(preds)
    rest = stats["prorag"]["vs_grpo_non_yes_no_by_seed"]
    assert (rest["n"], rest["mean_diff"], rest["p_value"]) == (3, pytest.approx(0.5), 0.0)
    # total EM per seed: GRPO 1/3, 2/3, 2/3; the arm 1/3, 2/3, 2/3: no difference over seeds
    assert stats["prorag"]["vs_grpo_by_seed"]["mean_diff"] == pytest.approx(0.0)
    assert "vs_grpo_non_yes_no_by_seed" not in stats["grpo"]
    [main, *_] = process_tables({"arms": ablations.PROCESS_ARMS, "stats": stats})
    assert main[1][-1] == "ΔEM on non-yes/no vs GRPO (t over seeds)"
    assert [r[-1] for r in main[2]] == ["reference", "+50.0 ± 0.0 (p=0, all 3 differences equal)"]
    assert "non-yes/no dEM +50.0 p=0, all 3 differences equal" in ablations.process_table(stats)


def test_the_test_over_seeds_by_hand() -> None:
    # Per-seed EM: GRPO 0.25, 0.5, 0.25; PRM 0.5, 0.5, 0.75 -> differences 0.25, 0, 0.5: mean 0.25,
    # s = 0.25, t = 0.25 / (0.25 / sqrt 3) = 1.732051 on 2 df; p = 1 - t / sqrt(2 + t^2) = 0.225403.
    preds = {
        "grpo": {0: _rows([1, 0, 0, 0]), 1: _rows([0, 1, 1, 0]), 2: _rows([0, 0, 1, 0])},
        "prorag": {0: _rows([1, 1, 0, 0]), 1: _rows([1, 1, 0, 0]), 2: _rows([1, 1, 1, 0])},
    }
    stats = ablations.process_statistics(preds)["prorag"]
    test = stats["vs_grpo_by_seed"]
    assert (test["n"], test["mean_diff"]) == (3, pytest.approx(0.25))
    # unpaired: {0.5, 0.5, 0.75} against {0.25, 0.5, 0.25}; of the 20 splits of the six values those with
    # sum >= 1.75 or <= 1.0 reach |difference| 0.25: 3 (two 0.5s and the 0.75) + 3 (both 0.25s and a 0.5) -> p = 0.3
    assert stats["vs_grpo_runs"]["p_value"] == pytest.approx(0.3)
    assert test["t"] == pytest.approx(1.732051, abs=1e-6) and test["p_value"] == pytest.approx(0.225403, abs=1e-6)
    # the differences' 95% CI: t_{0.975, 2} = 4.302653 times 0.25 / sqrt 3 -> 0.621034
    assert test["ci95"] == pytest.approx(0.621034, abs=1e-6)
    assert "over seeds +25.0 ± 62.1, p=0.225" in ablations.process_table(ablations.process_statistics(preds))


def test_arms_differ_only_in_the_step_rewards_and_reuse_the_pipeline_runs(tmp_path: Path) -> None:
    cfg = replace(demo_config(), seeds=[0, 1], process_seeds=[0, 1])
    pipeline = RecordingRun(tmp_path, cfg, progress=lambda _: None)
    pipeline.recorded = {}  # type: ignore[attr-defined]
    stage_rl(pipeline)
    stage_eval(pipeline)
    run = RecordingRun(tmp_path, cfg, progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    out = ablations.process_ablation(run, progress=lambda _: None)
    for seed in (0, 1):
        for arm in ("grpo", "prorag"):  # the systems' own runs and evaluations: same settings
            for kind in ("rl", "eval"):
                name = f"{kind}-{arm}-seed{seed}"
                assert run.recorded[name] == pipeline.recorded[name], name  # type: ignore[attr-defined]
        configs = {arm: ablations.arm_config(run, assignments, seed) for arm, assignments in ablations.PROCESS_ARMS.items()}
        assert {c.process_reward for c in configs.values()} == {
            "none",
            "prm",
            "oracle",
            "oracle-first-error",
            "shuffled",
            "oracle-first-error-shuffled",
        }
        assert configs["grpo"].beta == 0.0 and configs["prorag-oracle"].beta == cfg.rl.beta
        base = {k: v for k, v in vars(configs["prorag"]).items() if k != "process_reward"}
        assert all({k: v for k, v in vars(c).items() if k != "process_reward"} == base for a, c in configs.items() if a != "grpo")
        assert len({c.seed for c in configs.values()}) == 1 and len({c.policy for c in configs.values()}) == 1
    assert set(out["stats"]) == set(ablations.PROCESS_ARMS) and out["seeds"] == [0, 1]
    assert out["curves"]["prorag-shuffled"] == [
        "rl/prorag-shuffled-seed0/metrics.jsonl",
        "rl/prorag-shuffled-seed1/metrics.jsonl",
    ]
    with pytest.raises(ValueError, match="at least 2 seeds"):
        ablations.process_ablation(run, progress=lambda _: None, seeds=[0])


def test_a_subset_of_arms_runs_only_those_in_the_registry_order(tmp_path: Path) -> None:
    cfg = replace(demo_config(), seeds=[0, 1], process_seeds=[0, 1])
    run = RecordingRun(tmp_path, cfg, progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    out = ablations.process_ablation(run, progress=lambda _: None, only=["prorag-shuffled", "grpo"])
    assert list(out["stats"]) == ["grpo", "prorag-shuffled"] and list(out["arms"]) == ["grpo", "prorag-shuffled"]
    trained = {name for name in run.recorded if name.startswith("rl-")}  # type: ignore[attr-defined]
    assert trained == {f"rl-{a}-seed{s}" for a in ("grpo", "prorag-shuffled") for s in (0, 1)}
    assert "vs_grpo_by_seed" in out["stats"]["prorag-shuffled"]
    with pytest.raises(ValueError, match=r"unknown arm\(s\) prorag-orcale; expected some of grpo, prorag, "):
        ablations.process_ablation(run, progress=lambda _: None, only=["grpo", "prorag-orcale"])
    with pytest.raises(ValueError, match="none given"):
        ablations.select_arms(ablations.PROCESS_ARMS, [])
    # the family's offline arm is selectable like an RL arm
    rl_arms, offline = ablations.select_arms(ablations.FAMILY_ARMS, ["dpo", "hiprag"], offline=ablations.FAMILY_OFFLINE)
    assert list(rl_arms) == ["hiprag"] and list(offline) == ["dpo"]


KL_ARMS = {"grpo-kl": ["beta_kl=0.1"], "ofe-kl": ["process_reward=oracle-first-error", "beta_kl=0.1"]}


def test_a_config_adds_arms_and_controls_without_code(tmp_path: Path) -> None:
    cfg = replace(demo_config(), seeds=[0, 1], process_seeds=[0, 1], extra_arms=KL_ARMS, arm_controls={"ofe-kl": "grpo-kl"})
    arms = ablations.ablation_arms(cfg, "process")
    assert list(arms.rl) == [*ablations.PROCESS_ARMS, "grpo-kl", "ofe-kl"] and arms.offline == {}
    assert arms.controls == {**ablations.CONTROLS, "ofe-kl": "grpo-kl"}
    assert ablations.PROCESS_ARMS.keys().isdisjoint(KL_ARMS)  # the registry itself is left alone
    family = ablations.ablation_arms(cfg, "family")
    assert list(family.rl)[-2:] == ["grpo-kl", "ofe-kl"] and list(family.offline) == ["dpo"]
    run = RecordingRun(tmp_path, cfg, progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    for seed, step in ((0, 12), (1, 0)):  # as if grpo-kl had stopped early on dev (select_policy=best_dev)
        write_json(run.path("rl", f"grpo-kl-seed{seed}", "dev_eval", "best.json"), {"best": {"step": step, "eval_em": 0.3}})
    out = ablations.process_ablation(run, progress=lambda _: None, only=["grpo", "grpo-kl", "ofe-kl"])
    assert list(out["stats"]) == ["grpo", "grpo-kl", "ofe-kl"] and out["arms"]["ofe-kl"] == KL_ARMS["ofe-kl"]
    assert [out["stats"]["grpo-kl"]["per_seed"][s]["selected_step"] for s in ("0", "1")] == [12, 0]
    assert out["stats"]["grpo-kl"]["selected_step"] == 6 and "selected_step" not in out["stats"]["grpo"]
    [behaviour] = [t for t in process_tables(out) if t[0].startswith("Behaviour")]
    column = behaviour[1].index("Dev-chosen RL step")
    # mean 6, s = 8.485281, half-width 12.706205 * 8.485281 / sqrt(2) = 76.24
    assert [row[column] for row in behaviour[2]] == ["", "6.00 ± 76.24", ""]
    trained = {name for name in run.recorded if name.startswith("rl-")}  # type: ignore[attr-defined]
    assert trained == {f"rl-{a}-seed{s}" for a in ("grpo", "grpo-kl", "ofe-kl") for s in (0, 1)}
    # an extra arm is built like a built-in one: a step-reward source turns on the config's beta
    kl, ofe = (ablations.arm_config(run, tuple(KL_ARMS[a]), 0) for a in ("grpo-kl", "ofe-kl"))
    assert (kl.process_reward, kl.beta, kl.beta_kl) == ("none", 0.0, 0.1)
    assert (ofe.process_reward, ofe.beta, ofe.beta_kl) == ("oracle-first-error", cfg.rl.beta, 0.1)
    assert out["stats"]["ofe-kl"]["control"] == "grpo-kl" and "vs_grpo-kl_by_seed" in out["stats"]["ofe-kl"]
    assert "vs_grpo_by_seed" in out["stats"]["grpo-kl"] and "control" not in out["stats"]["grpo-kl"]
    assert "ofe-kl vs grpo-kl: dEM" in ablations.process_table(out["stats"])
    # an arm may turn the dev curve on for itself (early stopping on dev): it reads the run's dev split
    assert cfg.rl.eval_every == 0 and kl.eval_file is None
    early = ablations.arm_config(run, ("select_policy=best_dev", "eval_every=12"), 0)
    assert early.select_policy == "best_dev" and early.eval_file == str(run.path("splits", "dev.jsonl"))
    # an arm with SFT replay and no file replays the run's SFT trajectories; a file of its own is kept
    assert not kl.sft_replay.enabled and kl.sft_replay.file is None
    ptx = ablations.arm_config(run, ("sft_replay.coef=1.0",), 0)
    assert (ptx.sft_replay.coef, ptx.sft_replay.file) == (1.0, str(run.path("sft_data", "trajectories.jsonl")))
    own = ablations.arm_config(run, ("sft_replay.coef=0.5", "sft_replay.file=mine.jsonl"), 0)
    assert own.sft_replay.file == "mine.jsonl"


@pytest.mark.parametrize(
    ("extra", "controls", "message"),
    [
        ({"grpo": ["beta_kl=0.1"]}, {}, r"extra_arms.grpo: the process ablation already has an arm 'grpo'"),
        ({"kl": ["btea_kl=0.1"]}, {}, r"extra_arms.kl: btea_kl=0.1.*beta_kl"),
        ({"kl": ["beta_kl=-1"]}, {}, r"extra_arms.kl: beta_kl=-1"),
        ({"a/b": []}, {}, r"arm name 'a/b'"),
        ({"s": ["beta_kl=0.1", "seed=3"]}, {}, r"extra_arms.s: seed=3: every arm starts from the same pi_rft"),
        (KL_ARMS, {"ofe-kl": "grpo-lk"}, r"arm_controls.ofe-kl: grpo-lk: unknown arm\(s\) grpo-lk; arms of the process"),
        (KL_ARMS, {"ofe-kl": "ofe-kl"}, r"cannot be its own control"),
        ({"early": ["select_policy=best_dev"]}, {}, r"extra_arms.early: .*select_policy='best_dev' needs dev evaluations"),
    ],
)
def test_a_bad_extra_arm_is_refused_before_the_pipeline_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, list[str]], controls: dict[str, str], message: str
) -> None:
    def no_pipeline(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the pipeline ran before the arms were checked")

    monkeypatch.setattr(ablations.command, "run_pipeline", no_pipeline)
    cfg = replace(demo_config(), extra_arms=extra, arm_controls=controls)
    with pytest.raises(ValueError, match=message):
        ablations.run_ablation(cfg, tmp_path, "process")


def test_extra_arms_come_from_yaml_and_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "arms.yaml"
    config.write_text(yaml.safe_dump({"extra_arms": KL_ARMS, "arm_controls": {"ofe-kl": "grpo-kl"}}), encoding="utf-8")
    loaded = load_config(config, PipelineConfig)
    assert loaded.extra_arms == KL_ARMS and loaded.arm_controls == {"ofe-kl": "grpo-kl"}
    result = CliRunner().invoke(
        app,
        ["ablate", "--run-dir", str(tmp_path), "--what", "process", "--set", "extra_arms={kl: [beta_kl=0.1]}", "--arms", "kl,k1"],
    )
    assert result.exit_code != 0 and "unknown arm(s) k1; expected some of grpo," in result.output
    assert "kl" in result.output.split("expected some of")[1]


def test_arms_are_checked_before_the_pipeline_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pipeline(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the pipeline ran before --arms was checked")

    monkeypatch.setattr(ablations.command, "run_pipeline", no_pipeline)
    with pytest.raises(ValueError, match="unknown arm"):
        ablations.run_ablation(demo_config(), tmp_path, "process", arms=["orcale"])
    with pytest.raises(ValueError, match="applies to --what process or family"):
        ablations.run_ablation(demo_config(), tmp_path, "beta", arms=["grpo"])
    result = CliRunner().invoke(app, ["ablate", "--run-dir", str(tmp_path), "--what", "family", "--arms", "grpo, dpoo"])
    assert result.exit_code != 0 and "unknown arm(s) dpoo" in result.output


def test_training_signals_by_hand(tmp_path: Path) -> None:
    # Two rollout steps (agreement logged) and one optimiser-only step (the second PPO iteration).
    log = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "eval_em": 0.25},
        {"step": 1, "step_time": 3.0, "groups_em_agree": 0.25, "groups_reward_agree": 0.0, "advantage_process_share": 0.2},
        {"step": 2, "step_time": 1.0},
        {"step": 3, "step_time": 5.0, "groups_em_agree": 0.5, "groups_reward_agree": 0.125, "advantage_process_share": 0.3},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ablations.training_signals(log) == pytest.approx(
        {
            "seconds_per_rl_step": 3.0,
            "groups_em_agree": 0.375,
            "groups_reward_agree": 0.0625,
            "advantage_process_share": 0.25,
            "advantage_silent_share": None,
        }
    )
    assert ablations.training_signals(tmp_path / "missing.jsonl") == dict.fromkeys(ablations.TRAINING_SIGNALS.values())
    stats = ablations.process_statistics(
        {"grpo": {0: _rows([1, 0, 0, 0]), 1: _rows([0, 1, 1, 0])}},
        extras={"grpo": {0: {"groups_em_agree": 0.25}, 1: {"groups_em_agree": 0.75}}},
    )
    behaviour = process_tables({"arms": ablations.PROCESS_ARMS, "stats": stats})[1]
    # mean 0.5, s = 0.353553, half-width 12.706205 * 0.353553 / sqrt(2) = 3.176551
    assert behaviour[1] == ["Arm", "Groups agreeing on EM (%)"] and behaviour[2] == [["grpo", "50.0 ± 317.7"]]


# The tiny world through SFT, MCTS, the PRM and RFT (the "rft" system), then the five arms.
TINY = {
    "data": {
        "world": "tiny",
        "sft_fraction": 0.5,
        "mcts_questions": 4,
        "rft_questions": 6,
        "dev_questions": 4,
        "test_questions": 8,
    },
    "top_k": 2,
    "sft": {
        "max_steps": 8,
        "per_device_batch_size": 4,
        "learning_rate": 3.0e-3,
        "save_steps": 8,
        "logging_steps": 4,
        "eval_samples": 2,
    },
    "mcts": {
        "simulations": 2,
        "num_candidates": 2,
        "max_depth": 3,
        "rollout": {"max_action_tokens": 24, "max_completion_tokens": 96},
    },
    "pairs": {"judge": "oracle", "min_visits": 1, "pairs_per_set": "all"},
    "prm": {"kind": "likelihood", "epochs": 1, "per_device_batch_size": 4, "if_no_pairs": "untrained", "save_steps": 50},
    "rft": {"samples_per_question": 2, "if_nothing_kept": "copy_policy", "train": {"epochs": 1, "per_device_batch_size": 4}},
    "rl": {
        "group_size": 2,
        "per_device_batch_size": 4,
        "max_steps": 2,
        "save_steps": 10,
        "learning_rate": 1.0e-3,
        "num_iterations": 2,
        "eval_every": 1,
        "rollout": {"max_action_tokens": 24, "max_actions": 3, "max_completion_tokens": 96},
    },
    "eval": {"rollout": {"max_action_tokens": 24, "max_completion_tokens": 96, "batch_size": 16}},
    "systems": ["rft"],
}


@pytest.mark.slow
def test_ablate_process_end_to_end_on_the_tiny_world(tmp_path: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "stream_control": True}), encoding="utf-8")
    run_dir, results = tmp_path / "run", tmp_path / "results"
    args = ["ablate", "--config", str(config), "--run-dir", str(run_dir), "--what", "process", "--seeds", "2"]
    args += ["--results-dir", str(results)]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/prorag", *args])  # what the console script sees
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output[-3000:]
    assert "prorag-shuffled" in result.output and "(reference)" in result.output
    assert "prorag-oracle-first-error vs prorag-oracle-first-error-shuffled: dEM" in result.output
    saved = read_json(run_dir / "ablations" / "process.json")
    assert saved["seeds"] == [0, 1] and set(saved["arms"]) == set(ablations.PROCESS_ARMS)
    assert all(set(row["per_seed"]) == {"0", "1"} for row in saved["stats"].values())
    # Beside EM, the oracle's verdicts on each arm's test steps are asked for (this tiny policy writes
    # no complete action in two RL steps: None, so no column; tests/evaluation/test_step_errors.py has values).
    assert set(ablations.STEP_VALIDITY_RATES) <= set(ablations.PROCESS_METRICS)
    measured = read_json(run_dir / "eval" / "grpo-seed0" / "metrics.json")
    assert all(rate in measured for rate in ablations.STEP_VALIDITY_RATES)
    assert {a: row["control"] for a, row in saved["stats"].items() if "control" in row} == ablations.CONTROLS
    # Named before the run (the default: each arm against GRPO but the controls), and said in every report.
    assert saved["primary"] == ["prorag - grpo", "prorag-oracle - grpo", "prorag-oracle-first-error - grpo"]
    assert all("p_holm" in saved["stats"]["prorag-shuffled"][k] for k in ("vs_grpo", "vs_grpo_by_seed", "vs_grpo_runs"))
    assert "Primary contrasts, named before the run: prorag - grpo, prorag-oracle - grpo" in result.output
    # The settings that decide what the runs do (a later field of an unused method block left out).
    assert saved["config_fingerprint"] == fingerprint(used_settings(resolve(load_config(config, PipelineConfig))))
    assert saved["command"].startswith("prorag ablate --config") and saved["command"].endswith(str(results))
    [copy] = results.glob("process_*.json")
    assert read_json(copy) == saved
    curve = [r for r in (run_dir / "rl" / "prorag-oracle-seed1" / "learning_curve.csv").read_text().splitlines()[1:]]
    assert [int(line.split(",")[0]) for line in curve] == [0, 1, 2]
    report = (run_dir / "report.md").read_text()
    assert "process ablation" in (run_dir / "report.html").read_text()
    assert "process ablation" in report and (run_dir / "plots" / "process_curves.png").is_file()
    assert "Each arm against its control" in report
    assert "Primary contrasts, named before the run: prorag - grpo" in report
    assert "process_ablation" in read_json(run_dir / "results.json")
    # The stream control: pi_rft at learning rate 0 on each seed's stream, through the real trainer (its
    # weights never move), no test evaluation; every RL arm's training EM paired with it batch by batch.
    for seed in (0, 1):
        frozen = [r for r in read_jsonl(run_dir / "rl" / f"frozen-seed{seed}" / "metrics.jsonl") if "kl_to_init" in r]
        assert frozen and all(r["kl_to_init"] == 0 for r in frozen)
        assert not (run_dir / "eval" / f"frozen-seed{seed}").exists()
    assert set(saved["stream"]["arms"]) == set(ablations.PROCESS_ARMS)
    assert all(set(row["per_seed"]) == {"0", "1"} for row in saved["stream"]["arms"].values())
    # two optimiser steps on one rollout batch (num_iterations 2): one batch to pair, whose row also holds a dev evaluation
    assert all(d["batches"] == 1 for row in saved["stream"]["arms"].values() for d in row["per_seed"].values())
    assert "training answer_em against frozen" in result.output and "Does RL learn?" in report
