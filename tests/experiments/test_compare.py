"""Arms compared from evaluation folders (``prorag compare``), by hand on tiny prediction files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prorag.cli import app
from prorag.experiments.ablations import process_table
from prorag.experiments.compare import compare_arms, evaluation_folder, parse_pairs, parse_seeds


def _evaluation(folder: Path, ems: list[int], metrics: dict[str, float] | None = None) -> None:
    folder.mkdir(parents=True)
    rows = [{"id": f"q{i}", "em": float(em), "f1": float(em), "hops": 2} for i, em in enumerate(ems)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture
def study(tmp_path: Path) -> Path:
    # Arm a: seeds 0-2; arm b: seeds 0-1 (its seed 2 never finished).
    # The oracle's step-validity rates as `prorag eval` writes them to metrics.json (b's seed 1 has none).
    rates = {"valid_subanswer_rate": 0.5, "valid_answer_rate": 0.25}
    _evaluation(tmp_path / "a-s0", [1, 1, 0, 0], {"valid_search_rate": 0.5, **rates})
    _evaluation(tmp_path / "a-s1", [1, 0, 1, 0], {"valid_search_rate": 0.7, **rates})
    _evaluation(tmp_path / "a-s2", [1, 1, 1, 1], {"valid_search_rate": 0.6, **rates})
    _evaluation(tmp_path / "b-s0", [1, 0, 0, 0], {"valid_search_rate": 0.4, **rates})
    _evaluation(tmp_path / "b-s1", [0, 0, 0, 0])
    return tmp_path


def test_parse_seeds_and_pairs() -> None:
    assert parse_seeds("0-2,5") == [0, 1, 2, 5]
    assert parse_seeds("3") == [3] and parse_seeds("0-2, 1") == [0, 1, 2]
    for bad in ("a", "4-2", "0-", ""):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)
    assert parse_pairs(["grpo=runs/g-s{seed}", "prm = runs/p-s{seed}"], "--arm") == {
        "grpo": "runs/g-s{seed}",
        "prm": "runs/p-s{seed}",
    }
    for bad in (["grpo"], ["=x"], ["grpo="], ["g=x", "g=y"]):
        with pytest.raises(ValueError, match="--arm"):
            parse_pairs(bad, "--arm")
    assert evaluation_folder("runs/t-s{seed}/predictions.jsonl", 4) == Path("runs/t-s4")


def test_uneven_seeds_pair_only_the_seeds_both_arms_ran(study: Path) -> None:
    result = compare_arms({"a": str(study / "a-s{seed}"), "b": str(study / "b-s{seed}")}, [0, 1, 2], controls={"a": "b"})
    assert result["seeds"] == {"a": [0, 1, 2], "b": [0, 1]} and result["missing"] == {"b": [2]}
    a = result["stats"]["a"]
    assert a["em"] == pytest.approx(2 / 3) and a["valid_search_rate"] == pytest.approx(0.6)
    # over seeds 0 and 1: differences 0.25 and 0.5 -> mean 0.375, s = 0.176777, t = 3.0 on 1 df,
    # p = 1 - 2 atan(3) / pi = 0.204833; 95% CI 12.706205 * 0.125 = 1.588276
    by_seed = a["vs_b_by_seed"]
    assert (by_seed["mean_diff"], by_seed["t"]) == (pytest.approx(0.375), pytest.approx(3.0))
    assert by_seed["p_value"] == pytest.approx(0.204833, abs=1e-6) and by_seed["ci95"] == pytest.approx(1.588276, abs=1e-6)
    assert by_seed["seeds"] == ["0", "1"]
    # per question, each arm averaged over seeds 0 and 1 only: a (1, 1/2, 1/2, 0), b (1/2, 0, 0, 0):
    # differences (1/2, 1/2, 1/2, 0) -> mean 0.375, t = 3.0 on 3 df, p = 0.057669. (Averaging a over
    # its three seeds would give a mean difference of 0.541667.)
    per_question = a["vs_b"]
    assert per_question["mean_diff"] == pytest.approx(0.375) and per_question["t"] == pytest.approx(3.0)
    assert per_question["p_value"] == pytest.approx(0.057669, abs=1e-6)
    assert a["control"] == "b" and result["reference"] == "a"
    # step validity is paired over the seeds both measured: seed 0 only here, too few for a test
    assert "vs_b_valid_search_rate_by_seed" not in a and result["stats"]["b"]["valid_search_rate"] == pytest.approx(0.4)


def test_step_validity_is_paired_over_seeds(study: Path) -> None:
    (study / "b-s1" / "metrics.json").write_text(
        json.dumps({"valid_search_rate": 0.6, "valid_subanswer_rate": 0.5, "valid_answer_rate": 0.25})
    )
    arms = {"a": str(study / "a-s{seed}"), "b": str(study / "b-s{seed}")}
    stats = compare_arms(arms, [0, 1], reference="b")["stats"]["a"]
    # valid searches a (0.5, 0.7), b (0.4, 0.6): differences 0.1 and 0.1 -> no spread, p = 0
    searches = stats["vs_b_valid_search_rate_by_seed"]
    assert (searches["mean_diff"], searches["p_value"], searches["ci95"]) == (pytest.approx(0.1), 0.0, pytest.approx(0.0))
    assert stats["vs_b_valid_answer_rate_by_seed"]["mean_diff"] == 0.0
    table = process_table(compare_arms(arms, [0, 1], reference="b")["stats"], "b")
    assert "valid search/sub-answer/answer +10.0/+0.0/+0.0 pts (p=0.00/1.00/1.00, 2 seeds)" in table


def test_compare_refuses_what_it_cannot_compare(study: Path) -> None:
    arms = {"a": str(study / "a-s{seed}"), "b": str(study / "b-s{seed}")}
    with pytest.raises(ValueError, match=r"--arm b: 1 of seeds \[1, 2\]"):
        compare_arms(arms, [1, 2])
    with pytest.raises(ValueError, match="has no {seed}"):
        compare_arms({**arms, "c": str(study / "a-s0")}, [0, 1])
    with pytest.raises(ValueError, match="--reference 'z'"):
        compare_arms(arms, [0, 1], reference="z")
    with pytest.raises(ValueError, match="--control a=z: 'z' is not an arm"):
        compare_arms(arms, [0, 1], controls={"a": "z"})
    with pytest.raises(ValueError, match="at least two arms"):
        compare_arms({"a": arms["a"]}, [0, 1])


def test_compare_command_prints_the_table_and_writes_json(study: Path) -> None:
    runner = CliRunner()
    out = study / "compare.json"
    args = ["compare", "--arm", f"b={study}/b-s{{seed}}", "--arm", f"a={study}/a-s{{seed}}", "--seeds", "0-2"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "a: no evaluation" not in result.output and "b: no evaluation for seeds 2 (left out)" in result.output
    assert "vs b (seed-averaged per-question EM)" in result.output  # the first arm is the reference
    assert "(over seeds +37.5 ± 158.8, p=0.205)" in result.output
    saved = json.loads(out.read_text())
    assert saved["reference"] == "b" and saved["command"].startswith("prorag compare --arm")
    bad = runner.invoke(app, [*args[:-1], "0,x"])
    assert bad.exit_code == 2 and "--seeds: 'x' is not a seed" in bad.output
