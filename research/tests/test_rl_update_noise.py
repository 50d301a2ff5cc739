"""`research/drivers/rl_update_noise.py` writes the mirrored and the permuted update of each RL run as
policies, reads their evaluations and splits every change into its linear and quadratic parts.
Tested on a hand-made run folder with real (tiny) safetensors and a real AdamW state, whose
evaluations already exist (so no model runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from research.tests.drivers import run_driver
from research.tests.test_rl_seen_unseen import RL, TEST, write_eval

INITIAL = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0]), "b": torch.tensor([0.5])}


def write_checkpoint(run: Path, name: str, weights: dict[str, torch.Tensor]) -> None:
    folder = run / "probes" / name
    (folder / "policy").mkdir(parents=True)
    checkpoint = folder / "checkpoints" / "checkpoint-12"
    checkpoint.mkdir(parents=True)
    save_file(weights, str(checkpoint / "model.safetensors"))
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 12}))
    params = [torch.nn.Parameter(t.clone()) for t in weights.values()]
    optimiser = torch.optim.AdamW(params, lr=1e-3)
    for _ in range(3):  # a constant gradient: |m_hat| / sqrt(v_hat) = 1
        for p in params:
            p.grad = torch.ones_like(p)
        optimiser.step()
    torch.save(optimiser.state_dict(), checkpoint / "optimizer.pt")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "splits").mkdir(parents=True)
    (run / "splits" / "test.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in TEST))
    policy = run / "policies" / "rft" / "policy"
    policy.mkdir(parents=True)
    save_file(INITIAL, str(policy / "model.safetensors"))
    (policy / "config.json").write_text("{}")
    seen_unseen = run / "probes" / "seen_unseen"
    seen_unseen.mkdir(parents=True)
    (seen_unseen / "seen.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in RL[:2]))
    (seen_unseen / "unseen.jsonl").write_text("".join(json.dumps({"id": q}) + "\n" for q in RL[2:5]))
    write_eval(seen_unseen / "pi_rft-seen", RL[:2], {"r0"})
    write_eval(seen_unseen / "pi_rft-unseen", RL[2:5], {"r2"})
    write_eval(run / "eval" / "rft", TEST, {"q0", "q1"})
    write_checkpoint(run, "a-s0", {"w": torch.tensor([2.0, 2.0, 3.0, 4.0]), "b": torch.tensor([0.5])})
    write_checkpoint(run, "a-s1", {"w": torch.tensor([1.0, 3.0, 3.0, 4.0]), "b": torch.tensor([0.5])})
    # a-s0: +delta gains a seen question, loses a test one; -delta loses the seen question pi_rft had
    write_eval(seen_unseen / "a-s0-seen", RL[:2], {"r0", "r1"})
    write_eval(seen_unseen / "a-s0-unseen", RL[2:5], {"r2"})
    write_eval(run / "probes" / "test-a-s0-last", TEST, {"q0"})
    noise = run / "probes" / "update_noise"
    write_eval(noise / "a-s0-minus-seen", RL[:2], set())
    write_eval(noise / "a-s0-minus-unseen", RL[2:5], {"r2"})
    write_eval(noise / "a-s0-minus-test", TEST, {"q0"})
    for name in ("a-s0-perm0", "a-s1-minus", "a-s1-perm0"):
        write_eval(noise / f"{name}-seen", RL[:2], {"r0"})
        write_eval(noise / f"{name}-unseen", RL[2:5], {"r2"})
        write_eval(noise / f"{name}-test", TEST, {"q0", "q1"})
    write_eval(seen_unseen / "a-s1-seen", RL[:2], {"r0"})
    write_eval(seen_unseen / "a-s1-unseen", RL[2:5], set())
    write_eval(run / "probes" / "test-a-s1-last", TEST, {"q0", "q1"})
    return run


def test_mirrored_and_permuted_updates_are_written_and_split(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = run_driver("rl_update_noise", [str(run_dir), "--runs", "a-s0", "a-s1", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    noise = run_dir / "probes" / "update_noise"
    minus = load_file(str(noise / "a-s0-minus" / "model.safetensors"))
    assert minus["w"].tolist() == [0.0, 2.0, 3.0, 4.0] and minus["b"].tolist() == [0.5]
    assert (noise / "a-s0-minus" / "config.json").read_text() == "{}"
    permuted = load_file(str(noise / "a-s1-perm0" / "model.safetensors"))
    moved = (permuted["w"] - INITIAL["w"]).tolist()
    assert sorted(moved) == [0.0, 0.0, 0.0, 1.0]  # the one step of +1 lands on some weight
    assert not list(noise.glob("*.tmp"))

    assert data["pi_rft"] == {"seen": 50.0, "unseen": 33.33, "test": 50.0}
    s0 = data["runs"]["a-s0"]
    assert s0["delta_rms"] == pytest.approx(0.4472, abs=1e-4)  # sqrt(1 / 5)
    assert s0["adam"]["step"] == 3 and s0["adam"]["mean_abs_m_over_sqrt_v"] == pytest.approx(1.0, abs=1e-4)
    # seen: base 50, +d 100, -d 0: all linear
    assert (s0["seen"]["change"], s0["seen"]["linear"], s0["seen"]["quadratic"]) == (50.0, 50.0, 0.0)
    # test: base 50, +d 25, -d 25: all quadratic
    assert (s0["test"]["change"], s0["test"]["linear"], s0["test"]["quadratic"]) == (-25.0, 0.0, -25.0)
    assert s0["test"]["permuted"] == [50.0] and s0["test"]["permuted_change"] == 0.0
    s1 = data["runs"]["a-s1"]
    # unseen: base 33.33, +d 0, -d 33.33: linear -16.67, quadratic -16.67
    assert s1["unseen"]["linear"] == pytest.approx(-16.67, abs=0.01)
    assert s1["unseen"]["quadratic"] == pytest.approx(-16.67, abs=0.01)
    # the two updates move different weights: orthogonal
    assert data["cosines"] == {"a-s0 a-s1": 0.0}
    assert data["summary"]["cosine_other_seeds"] == 0.0 and data["summary"]["cosine_same_seed"] is None
    assert data["summary"]["seen_linear"]["mean"] == 25.0


def test_a_run_folder_without_the_seen_unseen_sets_is_refused(run_dir: Path, tmp_path: Path) -> None:
    (run_dir / "probes" / "seen_unseen" / "unseen.jsonl").unlink()
    done = run_driver("rl_update_noise", [str(run_dir), "--runs", "a-s0", "--out", str(tmp_path / "o.json")])
    assert done.returncode != 0
    assert "unseen.jsonl: missing (run research/drivers/rl_seen_unseen.py" in done.stderr


def test_run_names_must_carry_a_seed(run_dir: Path, tmp_path: Path) -> None:
    done = run_driver("rl_update_noise", [str(run_dir), "--runs", "outcome-grpo", "--out", str(tmp_path / "o.json")])
    assert done.returncode == 2 and "expected ARM-sSEED names" in done.stderr
