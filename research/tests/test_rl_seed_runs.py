"""`research/drivers/rl_seed_runs.py` turns a build's run folder into its results file: per-run scores in the
schema `pool_studies_data.py` reads, per-question EM strings in one question order, and the arms
compared over seeds. Tested on a hand-made folder whose numbers are known."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from research.analysis.arms import read_arms
from research.analysis.results_file import cpu_model
from research.tests.drivers import DRIVERS, ROOT, run_driver

QUESTIONS = ["q0", "q1", "q2", "q3"]
GOLD = {"q0": "paris", "q1": "yes", "q2": "1926", "q3": "no"}


def pool_studies_data() -> ModuleType:
    """The pooling script's data module, from research/drivers/ or, before it moved, benchmarks/ (it is
    a script beside its results, loaded by path)."""
    path = next(p for p in (DRIVERS / "pool_studies_data.py", ROOT / "benchmarks" / "pool_studies_data.py") if p.is_file())
    spec = importlib.util.spec_from_file_location("pool_studies_data", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_eval(folder: Path, correct: set[str], *, valid_searches: int = 1) -> None:
    """An evaluation folder whose predictions are right exactly on ``correct`` (written in reverse
    order, so the collector has to put them back in the test file's order)."""
    folder.mkdir(parents=True)
    rows = []
    for q in reversed(QUESTIONS):
        right = q in correct
        rows.append(
            {
                "id": q,
                "prediction": GOLD[q] if right else "london",
                "golden_answers": [GOLD[q]],
                "em": float(right),
                "f1": float(right),
                "hops": 1 if q in ("q0", "q1") else 2,
                "judged_searches": 2,
                "valid_searches": valid_searches,
            }
        )
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    em = len(correct) / len(QUESTIONS)
    (folder / "metrics.json").write_text(json.dumps({"em": em, "f1": em, "format_valid_rate": 1.0}))


def write_run(probes: Path, arm: str, seed: int, last: set[str], best: set[str], chosen: int) -> None:
    run = probes / f"{arm}-s{seed}"
    (run / "dev_eval").mkdir(parents=True)
    evaluations = [{"step": s, "eval_em": 0.5 if s == chosen else 0.25, "eval_f1": 0.0} for s in (0, 12, 24)]
    best_entry = next(e for e in evaluations if e["step"] == chosen)
    (run / "dev_eval" / "best.json").write_text(json.dumps({"best": best_entry, "evaluations": evaluations}))
    rows = [{"step": s, "reward": float(s), "answer_em": 0.1} for s in range(1, 10)]
    rows.append({"step": 10, "reward": 10.0, "answer_em": 0.1, "eval_em": 0.5})  # the step's dev evaluation in its row
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_eval(probes / f"test-{arm}-s{seed}-last", last, valid_searches=2 if arm == "a" else 1)
    write_eval(probes / f"test-{arm}-s{seed}-best", best)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "splits").mkdir(parents=True)
    (run / "splits" / "test.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in QUESTIONS))
    write_eval(run / "eval" / "rft", {"q0"})
    probes = run / "probes"
    # arm a: right on q0, q1 (+ q2 in seed 1) at the last step; arm b: right on q0 only
    write_run(probes, "a", 0, {"q0", "q1"}, {"q0"}, chosen=12)
    write_run(probes, "a", 1, {"q0", "q1", "q2"}, {"q0"}, chosen=0)
    write_run(probes, "b", 0, {"q0"}, {"q0", "q3"}, chosen=24)
    write_run(probes, "b", 1, {"q0"}, {"q0"}, chosen=0)
    return run


def test_rl_seed_runs_writes_each_run_in_the_pooling_schema(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = run_driver("rl_seed_runs", [str(run_dir), "--arms", "a", "b", "--seeds", "0-1", "--control", "a=b", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["question_ids"] == QUESTIONS
    assert "torch " in data["libraries"] and "trl " in data["libraries"]
    assert data["seeds_by_arm"] == {"a": ["0", "1"], "b": ["0", "1"]}
    a0, a1 = data["runs"]["a"]["0"], data["runs"]["a"]["1"]
    assert a0["test_last"]["em"] == 0.5 and a1["test_last"]["em"] == 0.75
    assert a0["test_last"]["em_by_question"] == "1100" and a1["test_last"]["em_by_question"] == "1110"
    assert data["runs"]["b"]["0"]["test_best"]["em_by_question"] == "1001"
    assert a0["selected_step"] == 12 and a0["dev_em_by_step"] == {"0": 0.25, "12": 0.5, "24": 0.25}
    # first and last five training rows; step 10's row carries its dev evaluation and counts like the others
    assert a0["reward_first5"] == 3.0 and a0["reward_last5"] == 8.0 and a0["kl_to_init_first5"] is None
    assert a0["test_last"]["em_by_hops"] == {"1": {"n": 2, "em": 1.0}, "2": {"n": 2, "em": 0.0}}
    assert a0["test_last"]["yes_no_n"] == 2 and a0["test_last"]["yes_no_em"] == 0.5
    assert data["step_validity"]["a"]["0"] == {
        "judged_searches": 8,
        "valid_searches": 8,
        "judged_subanswers": 0,
        "valid_subanswers": 0,
        "judged_answers": 0,
        "valid_answers": 0,
    }
    assert data["step_validity"]["pi_rft"]["valid_searches"] == 4
    last = data["compare"]["last"]["stats"]["a"]["vs_b_by_seed"]
    assert [str(s) for s in last["seeds"]] == ["0", "1"]
    assert last["mean_diff"] == pytest.approx(0.375)  # seed 0: 0.50 - 0.25, seed 1: 0.75 - 0.25
    assert data["compare"]["best"]["stats"]["a"]["vs_b_by_seed"]["mean_diff"] == pytest.approx(-0.125)
    # the pooling script's schema reads the same numbers
    pooling = pool_studies_data()
    assert "runs" in pooling.FILE_SCHEMA.values()
    assert pooling.per_seed_em(data, "runs", "last", "a") == {0: 0.5, 1: 0.75}
    assert pooling.per_seed_em(data, "runs", "dev", "b") == {0: 0.5, 1: 0.25}


def test_rl_seed_runs_names_the_missing_question(run_dir: Path, tmp_path: Path) -> None:
    lines = (run_dir / "probes" / "test-a-s0-last" / "predictions.jsonl").read_text().splitlines()
    (run_dir / "probes" / "test-a-s0-last" / "predictions.jsonl").write_text("\n".join(lines[1:]) + "\n")
    done = run_driver("rl_seed_runs", [str(run_dir), "--arms", "a", "b", "--seeds", "0-1", "--out", str(tmp_path / "o.json")])
    assert done.returncode != 0
    assert "test-a-s0-last/predictions.jsonl" in done.stderr and "q3" in done.stderr


def test_rl_seed_runs_pairs_each_run_with_the_frozen_stream(run_dir: Path, tmp_path: Path) -> None:
    frozen = run_dir / "probes" / "frozen-s0"
    frozen.mkdir(parents=True)
    (frozen / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "answer_em": 0.2}) + "\n" for s in range(1, 11)))
    out = tmp_path / "results.json"
    args = [str(run_dir), "--arms", "a", "b", "--seeds", "0-1", "--stream-control", "frozen", "--out", str(out)]
    done = run_driver("rl_seed_runs", args)
    assert done.returncode == 0, done.stderr[-3000:]
    stream = json.loads(out.read_text())["stream"]
    assert stream["control"] == "frozen" and set(stream["runs"]) == {"a", "b"}
    assert set(stream["runs"]["a"]) == {"0"}  # seed 1 has no frozen run
    a0 = stream["runs"]["a"]["0"]
    assert a0["batches"] == 10 and a0["second_half_diff"] == pytest.approx(-0.1) and a0["second_half_p"] == 0.0
    assert "training EM, a seed 0 against frozen" in done.stdout


def test_a_run_that_kept_its_last_step_reads_its_dev_curve_from_its_log(run_dir: Path, tmp_path: Path) -> None:
    """The LoRA arm keeps its last step (no dev_eval/best.json; its -best evaluation is a copy of -last):
    the dev curve comes from metrics.jsonl and the selected step is the last evaluated one."""
    probes = run_dir / "probes"
    for seed in (0, 1):
        write_run(probes, "c", seed, {"q1"}, set(), chosen=0)
        (probes / f"c-s{seed}" / "dev_eval" / "best.json").unlink()
        rows = [{"step": 0, "eval_em": 0.2}, {"step": 1, "reward": 1.0}, {"step": 2, "eval_em": 0.3, "reward": 2.0}]
        (probes / f"c-s{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        shutil.rmtree(probes / f"test-c-s{seed}-best")
        shutil.copytree(probes / f"test-c-s{seed}-last", probes / f"test-c-s{seed}-best")  # as rl_seed_runs.sh copies it
    out = tmp_path / "results.json"
    done = run_driver("rl_seed_runs", [str(run_dir), "--arms", "a", "c", "--seeds", "0-1", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    c0 = json.loads(out.read_text())["runs"]["c"]["0"]
    assert c0["dev_em_by_step"] == {"0": 0.2, "2": 0.3} and c0["selected_step"] == 2
    assert c0["test_best"]["em_by_question"] == c0["test_last"]["em_by_question"] == "0100"
    assert c0["reward_last5"] == 1.5


def test_cpu_model_names_the_family_model_and_vector_width() -> None:
    """Two "AMD EPYC" machines gave other floats from one config and seed, so the name alone is not
    enough: the first processor's family, model, stepping and AVX-512 are read, the second's ignored."""
    first = (
        "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx2 avx512f\n"
    )
    second = "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Other\nflags\t\t: fpu\n"
    assert cpu_model(first + "\n" + second) == "AMD EPYC (cpu family 25, model 17, stepping 1, AVX-512)"
    assert cpu_model(second) == "Other (cpu family 6, model 85, no AVX-512)"


def test_an_arm_of_the_arms_file_is_written_with_its_assignments(run_dir: Path, tmp_path: Path) -> None:
    """A results file names what each arm ran: the arms file's assignments for an arm it names,
    nothing for a folder name it does not know (an earlier build's code, here ``a``)."""
    probes = run_dir / "probes"
    for seed in (0, 1):
        write_run(probes, "outcome-grpo", seed, {"q0"}, {"q0"}, chosen=0)
    out = tmp_path / "results.json"
    done = run_driver("rl_seed_runs", [str(run_dir), "--arms", "outcome-grpo", "a", "--seeds", "0-1", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert list(data["arms"]) == ["outcome-grpo"]
    assert data["arms"]["outcome-grpo"] == list(read_arms()["outcome-grpo"].assignments)
    assert "rl.process_reward=none" in data["arms"]["outcome-grpo"]
    assert data["runs"]["outcome-grpo"]["1"]["test_last"]["em_by_question"] == "1000"
