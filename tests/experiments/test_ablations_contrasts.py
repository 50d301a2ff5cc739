"""Primary contrasts and Holm-adjusted p-values (prorag.experiments.ablations.contrasts), by hand on small cases."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import prorag.experiments.ablations as ablations
from prorag.cli import app
from prorag.core.config import load_config
from prorag.experiments.ablations.contrasts import (
    check_primary,
    contrast_name,
    contrasts_of,
    default_primary,
    parse_contrast,
    primary_note,
    with_holm,
)
from prorag.experiments.compare import compare_arms
from prorag.experiments.pipeline import PipelineConfig, demo_config
from prorag.experiments.report.table import arms_note, process_tables
from tests.experiments.test_ablations import RecordingRun


def test_contrast_names_parse_and_refuse_what_is_ambiguous() -> None:
    assert contrast_name("prorag-oracle", "grpo") == "prorag-oracle - grpo"
    assert parse_contrast("prorag-oracle - grpo") == ("prorag-oracle", "grpo")
    assert parse_contrast("  prorag   -  grpo ") == ("prorag", "grpo")
    for bad in ("prorag-grpo", "prorag - ", "a - b - c", ""):
        with pytest.raises(ValueError, match="expected 'ARM - OTHER'"):
            parse_contrast(bad)


def test_the_default_is_each_arm_against_the_reference_but_the_controls() -> None:
    arms = list(ablations.PROCESS_ARMS)
    assert default_primary(arms, "grpo", ablations.CONTROLS) == [
        "prorag - grpo",
        "prorag-oracle - grpo",
        "prorag-oracle-first-error - grpo",
    ]
    assert contrasts_of(arms, "grpo", ablations.CONTROLS) == [
        *(f"{a} - grpo" for a in arms[1:]),
        "prorag - prorag-shuffled",
        "prorag-oracle-first-error - prorag-oracle-first-error-shuffled",
    ]
    # the family has no shuffled arms: the built-in control pairs test nothing there
    assert "dpo - grpo" in default_primary([*ablations.FAMILY_ARMS, "dpo"], "grpo", ablations.CONTROLS)
    assert default_primary(["a", "b"], "z", {}) == []  # no reference among the arms: nothing is tested against it


def test_check_primary_spells_each_once_and_refuses_untested_pairs() -> None:
    arms = list(ablations.PROCESS_ARMS)
    got = check_primary(["prorag  -  grpo", "prorag - prorag-shuffled", "prorag - grpo"], arms, "grpo", ablations.CONTROLS)
    assert got == ["prorag - grpo", "prorag - prorag-shuffled"]
    with pytest.raises(ValueError, match="'prorag-orcale' is not an arm"):
        check_primary(["prorag-orcale - grpo"], arms, "grpo", ablations.CONTROLS)
    with pytest.raises(ValueError, match="is not tested.*the contrasts tested are prorag - grpo"):
        check_primary(["prorag - prorag-oracle"], arms, "grpo", ablations.CONTROLS)
    with pytest.raises(ValueError, match="'grpo - prorag' is not tested"):  # the other way round
        check_primary(["grpo - prorag"], arms, "grpo", ablations.CONTROLS)


def _test(p: float, over_seeds: bool = False) -> dict[str, float]:
    return {"t": 1.0, "p_value": p, "mean_diff": 0.1, "n": 3} | ({"ci95": 0.2} if over_seeds else {})


#: Arms a, b, c and a's control s, tested against g: nominal p-values per test.
STATS: dict[str, dict[str, Any]] = {
    "g": {},
    "a": {
        "vs_g": _test(0.01),
        "vs_g_by_seed": _test(0.04, True),
        "control": "s",
        "vs_s": _test(0.03),
        "vs_s_by_seed": _test(0.2, True),
    },
    "b": {"vs_g": _test(0.04), "vs_g_by_seed": _test(0.01, True)},
    "c": {"vs_g": _test(0.005)},
    "s": {"vs_g": _test(0.03)},
}


def test_holm_runs_per_test_over_the_secondary_contrasts_and_among_the_primaries() -> None:
    out = with_holm(STATS, ["a - g"], "g")
    # per question, secondary: b 0.04, c 0.005, s 0.03, a - s 0.03. Sorted: 0.005 x 4 = 0.02, 0.03 x 3 = 0.09,
    # 0.03 x 2 = 0.06 -> 0.09 (running maximum), 0.04 x 1 -> 0.09.
    assert out["c"]["vs_g"]["p_holm"] == pytest.approx(0.02)
    assert [out[arm][key]["p_holm"] for arm, key in (("b", "vs_g"), ("s", "vs_g"), ("a", "vs_s"))] == pytest.approx([0.09] * 3)
    # over seeds, secondary: b 0.01 and a - s 0.2 only (m = 2): 0.02 and 0.2.
    assert out["b"]["vs_g_by_seed"]["p_holm"] == pytest.approx(0.02) and out["a"]["vs_s_by_seed"]["p_holm"] == pytest.approx(0.2)
    # the one primary contrast is a family of one: its p is its own
    assert out["a"]["vs_g"]["p_holm"] == 0.01 and out["a"]["vs_g_by_seed"]["p_holm"] == 0.04
    assert "p_holm" not in STATS["a"]["vs_g"]  # the input is left as it was
    # two primaries are adjusted among themselves: a 0.01 x 2 = 0.02, b 0.04 x 1 = 0.04; over seeds a 0.04 -> 0.04,
    # b 0.01 x 2 = 0.02. The secondaries per question are then c 0.005, s 0.03, a - s 0.03: 0.015, 0.06, 0.06.
    two = with_holm(STATS, ["a - g", "b - g"], "g")
    assert (two["a"]["vs_g"]["p_holm"], two["b"]["vs_g"]["p_holm"]) == (pytest.approx(0.02), pytest.approx(0.04))
    assert (two["a"]["vs_g_by_seed"]["p_holm"], two["b"]["vs_g_by_seed"]["p_holm"]) == (pytest.approx(0.04), pytest.approx(0.02))
    assert [two[a][k]["p_holm"] for a, k in (("c", "vs_g"), ("s", "vs_g"), ("a", "vs_s"))] == pytest.approx([0.015, 0.06, 0.06])


def test_the_report_names_the_primaries_and_prints_holm_beside_the_rest() -> None:
    assert primary_note(None) == ""
    assert primary_note([]).startswith("No primary contrast was named: every other contrast has its Holm-adjusted p")
    assert primary_note(["a - g"]).startswith("Primary contrast, named before the run: a - g (nominal p);")
    assert "a - g, b - g (nominal p, and Holm-adjusted among these 2)" in primary_note(["a - g", "b - g"])
    rows = {
        arm: {"per_seed": {"0": {}, "1": {}}, "em": 0.5, "em_ci95": 0.1, "f1": 0.5, "f1_ci95": 0.1} | row
        for arm, row in STATS.items()
    }
    stats = with_holm(
        {"grpo": rows.pop("g")} | {a: {k.replace("vs_g", "vs_grpo"): v for k, v in r.items()} for a, r in rows.items()},
        ["a - grpo"],
    )
    table = ablations.process_table(stats, primary=["a - grpo"])
    lines = table.splitlines()
    assert lines[0] == primary_note(["a - grpo"])
    [a_line] = [line for line in lines if line.startswith("a ")]
    assert "p=0.010  (over seeds" in a_line and "p=0.040)" in a_line and a_line.endswith("[primary]")
    [c_line] = [line for line in lines if line.startswith("c ")]
    assert "p=0.005, Holm 0.020" in c_line and "[primary]" not in c_line
    assert "  a vs s: dEM +10.0  p=0.030, Holm 0.090  (over seeds" in table
    # the same statistics without primaries (results from before they were declared): nominal p-values only
    assert "Holm" not in ablations.process_table(stats) and "primary" not in ablations.process_table(stats)
    # report.md / report.html: the note names them, the cells mark them and carry Holm
    ablation = {"arms": {}, "primary": ["a - grpo"], "stats": stats}
    [main, controls, *_] = process_tables(ablation)
    cells = {row[0]: row[5] for row in main[2]}
    assert cells["a"] == "+10.0 (p=0.010, primary)" and cells["c"] == "+10.0 (p=0.005, Holm 0.020)"
    assert controls[2] == [["a", "s", "+10.0 (p=0.030, Holm 0.090)", "+10.0 ± 20.0 (p=0.200, Holm 0.200)", "", ""]]
    assert arms_note("x.png", ["a - grpo"]).endswith(primary_note(["a - grpo"])) and "Primary" not in arms_note("x.png")
    [before, *_] = process_tables({"arms": {}, "stats": stats})  # no primary field (older results): as before
    assert {row[0]: row[5] for row in before[2]}["c"] == "+10.0 (p=0.005)"


def _evaluation(folder: Path, ems: list[int]) -> None:
    folder.mkdir(parents=True)
    rows = [{"id": f"q{i}", "em": float(em), "f1": float(em)} for i, em in enumerate(ems)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def study(tmp_path: Path) -> Path:
    # b is the reference; c answers exactly as b (so c - b has p 1), and is a's control.
    for arm, per_seed in {"a": ([1, 1, 0, 0], [1, 0, 1, 0]), "b": ([1, 0, 0, 0], [0, 0, 0, 0])}.items():
        for seed, ems in enumerate(per_seed):
            _evaluation(tmp_path / f"{arm}-s{seed}", ems)
    for seed in (0, 1):
        shutil.copytree(tmp_path / f"b-s{seed}", tmp_path / f"c-s{seed}")
    return tmp_path


def test_compare_reports_the_primary_and_holm_adjusts_the_others(study: Path) -> None:
    arms = {name: str(study / f"{name}-s{{seed}}") for name in ("b", "a", "c")}
    result = compare_arms(arms, [0, 1], controls={"a": "c"}, primary=["a - b"])
    assert result["primary"] == ["a - b"] and result["reference"] == "b"
    a, c = result["stats"]["a"], result["stats"]["c"]
    # a - b per question: p 0.057669 (see test_compare); the only primary, so Holm leaves it.
    assert a["vs_b"]["p_holm"] == a["vs_b"]["p_value"] == pytest.approx(0.057669, abs=1e-6)
    # secondary: c - b (no difference, p 1) and a - c (the same numbers as a - b): 2 x 0.057669 = 0.115338;
    # over seeds 2 x 0.204833 = 0.409666; runs unpaired 2 x 1/3.
    assert c["vs_b"]["p_value"] == 1.0 and c["vs_b"]["p_holm"] == 1.0
    assert a["vs_c"]["p_holm"] == pytest.approx(0.115338, abs=1e-6)
    assert a["vs_c_by_seed"]["p_holm"] == pytest.approx(0.409666, abs=1e-6)
    assert a["vs_c_runs"]["p_holm"] == pytest.approx(2 / 3)
    # default: each arm against the reference but the controls: a - b only (c is a's control)
    assert compare_arms(arms, [0, 1], controls={"a": "c"})["primary"] == ["a - b"]
    assert compare_arms(arms, [0, 1])["primary"] == ["a - b", "c - b"]
    with pytest.raises(ValueError, match="--primary: 'c - a' is not tested"):
        compare_arms(arms, [0, 1], controls={"a": "c"}, primary=["c - a"])


def test_compare_command_takes_primary_and_writes_it(study: Path) -> None:
    out = study / "compare.json"
    args = ["compare", *(w for n in ("b", "a", "c") for w in ("--arm", f"{n}={study}/{n}-s{{seed}}")), "--seeds", "0-1"]
    args += ["--control", "a=c", "--primary", "a - c", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Primary contrast, named before the run: a - c (nominal p)" in result.output
    assert "  a vs c [primary]: dEM +37.5  p=0.058  (over seeds +37.5 ± 158.8, p=0.205)" in result.output
    # now a - b is secondary, with c - b: 2 x 0.057669 per question
    assert "dEM +37.5  p=0.058, Holm 0.115  (over seeds +37.5 ± 158.8, p=0.205, Holm 0.410)" in result.output
    saved = json.loads(out.read_text())
    assert saved["primary"] == ["a - c"] and "--primary 'a - c'" in saved["command"]
    assert saved["stats"]["a"]["vs_b"]["p_holm"] == pytest.approx(0.115338, abs=1e-6)
    bad = CliRunner().invoke(app, [*args[:-4], "--primary", "a-b"])
    assert bad.exit_code != 0 and "expected 'ARM - OTHER'" in bad.output


def test_an_ablation_config_names_its_primaries_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "arms.yaml"
    config.write_text(yaml.safe_dump({"primary_contrasts": ["prorag - prorag-shuffled", "prorag-oracle - grpo"]}))
    loaded = load_config(config, PipelineConfig)
    assert ablations.ablation_arms(loaded, "process").primary == ("prorag - prorag-shuffled", "prorag-oracle - grpo")
    assert ablations.ablation_arms(demo_config(), "process").primary == (
        "prorag - grpo",
        "prorag-oracle - grpo",
        "prorag-oracle-first-error - grpo",
    )
    assert ablations.ablation_arms(replace(demo_config(), primary_contrasts=[]), "family").primary == ()

    def no_pipeline(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the pipeline ran before the primary contrasts were checked")

    monkeypatch.setattr(ablations.command, "run_pipeline", no_pipeline)
    with pytest.raises(ValueError, match="primary_contrasts: 'hiprag - grpo': 'hiprag' is not an arm"):
        ablations.run_ablation(replace(demo_config(), primary_contrasts=["hiprag - grpo"]), tmp_path, "process")


def test_the_arms_ablation_result_carries_its_primaries_and_holm(tmp_path: Path) -> None:
    cfg = replace(demo_config(), seeds=[0, 1], process_seeds=[0, 1])
    run = RecordingRun(tmp_path, cfg, progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    out = ablations.process_ablation(run, progress=lambda _: None, only=["grpo", "prorag", "prorag-shuffled"])
    # the default primaries whose two arms ran: prorag-oracle's did not run, and prorag-shuffled is a control
    assert out["primary"] == ["prorag - grpo"]
    tests = [(arm, key) for arm, row in out["stats"].items() for key in row if key.startswith("vs_")]
    assert {(arm, key.removesuffix("_runs").removesuffix("_by_seed")) for arm, key in tests} == {
        ("prorag", "vs_grpo"),
        ("prorag-shuffled", "vs_grpo"),
        ("prorag", "vs_prorag-shuffled"),
    }
    assert all("p_holm" in out["stats"][arm][key] for arm, key in tests)
    path = ablations.write_arms_results(tmp_path, out, "digest", "prorag ablate")
    assert json.loads(path.read_text())["primary"] == ["prorag - grpo"]
    declared = replace(cfg, primary_contrasts=["prorag - prorag-shuffled"])
    run = RecordingRun(tmp_path, declared, progress=lambda _: None)
    run.recorded = {}  # type: ignore[attr-defined]
    assert ablations.process_ablation(run, progress=lambda _: None, only=["grpo", "prorag"])["primary"] == []
