"""`research/drivers/rl_seen_unseen.py` splits a build's RL questions into the ones its runs trained on and
unseen ones of the same worlds, and scores every run's last checkpoint on both and on test against
pi_rft. Tested on a hand-made run folder whose evaluations already exist (so no model runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from research.analysis.run_folder import last_weights
from research.tests.drivers import run_driver

RL = [f"r{i}" for i in range(6)]
TEST = ["q0", "q1", "q2", "q3"]


def write_eval(folder: Path, ids: list[str], correct: set[str]) -> None:
    """An evaluation folder right exactly on ``correct`` (lines in reverse order: the script must
    put them back in the question file's order)."""
    folder.mkdir(parents=True)
    rows = [
        {"id": q, "prediction": "x", "golden_answers": ["x" if q in correct else "y"], "em": float(q in correct)} for q in ids
    ]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    (folder / "metrics.json").write_text(json.dumps({"em": len(correct) / len(ids)}))


def write_run(run: Path, name: str, seen: set[str], unseen: set[str], test: set[str], **config: object) -> None:
    folder = run / "probes" / name
    (folder / "policy").mkdir(parents=True)
    for step in (4, 12):  # the last is checkpoint-12, not the last in string order
        checkpoint = folder / "checkpoints" / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        save_file({"w": torch.zeros(1)}, str(checkpoint / "model.safetensors"))  # whole: a damaged one is skipped
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "rl_config.json").write_text(json.dumps({"question_filter": "none", "limit": 2, "exclude_ids_from": []} | config))
    write_eval(run / "probes" / "seen_unseen" / f"{name}-seen", RL[:2], seen)
    write_eval(run / "probes" / "seen_unseen" / f"{name}-unseen", RL[2:5], unseen)
    write_eval(run / "probes" / f"test-{name}-last", TEST, test)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "splits").mkdir(parents=True)
    (run / "splits" / "rl.jsonl").write_text("".join(json.dumps({"id": q, "question": q}) + "\n" for q in RL))
    (run / "splits" / "test.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in TEST))
    write_eval(run / "probes" / "seen_unseen" / "pi_rft-seen", RL[:2], {"r0"})
    write_eval(run / "probes" / "seen_unseen" / "pi_rft-unseen", RL[2:5], {"r2"})
    write_eval(run / "eval" / "rft", TEST, {"q0"})
    write_run(run, "a-s0", seen={"r0", "r1"}, unseen={"r3"}, test={"q0", "q1"})
    write_run(run, "a-s1", seen={"r0"}, unseen=set(), test=set())
    return run


def test_seen_unseen_and_test_gains_over_pi_rft_per_run_and_pooled(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = run_driver("rl_seen_unseen", [str(run_dir), "--arms", "a", "--seeds", "0-2", "--unseen", "3", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    written = run_dir / "probes" / "seen_unseen"
    assert [json.loads(line)["id"] for line in (written / "seen.jsonl").read_text().splitlines()] == ["r0", "r1"]
    assert [json.loads(line)["id"] for line in (written / "unseen.jsonl").read_text().splitlines()] == ["r2", "r3", "r4"]
    assert data["pi_rft"] == {"seen": 50.0, "unseen": 33.33, "test": 25.0}
    a0, a1 = data["runs"]["a-s0"], data["runs"]["a-s1"]
    assert a0["checkpoint"] == "checkpoint-12"
    assert (a0["seen_diff"], a0["unseen_diff"], a0["test_diff"], a0["seen_minus_unseen_diff"]) == (50.0, 0.0, 25.0, 50.0)
    assert (a1["seen_diff"], a1["unseen_diff"], a1["test_diff"], a1["seen_minus_unseen_diff"]) == (0.0, -33.33, -25.0, 33.33)
    pooled = data["all_runs"]
    assert pooled["runs"] == 2 and pooled["seen_diff"]["mean"] == 25.0 and pooled["seen_diff"]["positive"] == 1
    # two runs: t(0.975, 1) = 12.706, sd of (50, 0) = 35.36, half-width 12.7062 * 25.0 = 317.66
    assert pooled["seen_diff"]["ci95"] == pytest.approx(317.66, abs=0.01)
    # seen gain against unseen gain: differences 50.0 and 33.33, t = 41.67 / 8.33 = 5.0, df 1
    assert pooled["seen_vs_unseen_p"] == pytest.approx(0.1257, abs=1e-3)
    assert data["by_arm"]["a"] == pooled


def test_a_screened_run_is_refused_with_its_config_named(run_dir: Path, tmp_path: Path) -> None:
    write_run(run_dir, "b-s0", seen=set(), unseen=set(), test=set(), question_filter="mixed")
    done = run_driver(
        "rl_seen_unseen", [str(run_dir), "--arms", "a", "--seeds", "0", "--unseen", "3", "--out", str(tmp_path / "o")]
    )
    assert done.returncode != 0
    assert "b-s0/rl_config.json" in done.stderr and "'mixed'" in done.stderr


def test_too_few_rl_questions_for_the_unseen_set_is_an_error(run_dir: Path, tmp_path: Path) -> None:
    done = run_driver(
        "rl_seen_unseen", [str(run_dir), "--arms", "a", "--seeds", "0", "--unseen", "5", "--out", str(tmp_path / "o")]
    )
    assert done.returncode != 0
    assert "splits/rl.jsonl: 6 questions, fewer than limit 2 + unseen 5" in done.stderr


def test_a_lora_runs_last_weights_are_its_merged_policy_when_it_kept_the_last_step(run_dir: Path) -> None:
    """A LoRA run's checkpoints hold the adapter; its last weights as a model are policy/ (select_policy
    last), and a LoRA run that let dev choose policy/ has no merged last model to read."""
    run = run_dir / "probes" / "a-s0"
    assert last_weights(run) == run / "checkpoints" / "checkpoint-12"
    (run / "checkpoints" / "checkpoint-12" / "adapter_config.json").write_text("{}")
    config = json.loads((run / "rl_config.json").read_text())
    (run / "rl_config.json").write_text(json.dumps(config | {"select_policy": "last"}))
    assert last_weights(run) == run / "policy"
    (run / "rl_config.json").write_text(json.dumps(config | {"select_policy": "best_dev"}))
    with pytest.raises(ValueError, match="a LoRA adapter, and .*policy is not the last step"):
        last_weights(run)
