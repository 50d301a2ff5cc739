"""`research/drivers/rl_interpolate.py` writes pi_rft plus a fraction of each RL run's update, and pi_rft plus
the mean of several runs' updates, and scores them against pi_rft and the runs. Tested on the hand-made
run folder of `test_rl_update_noise.py`, whose evaluations already exist (so no model runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from research.tests.drivers import run_driver
from research.tests.test_rl_seen_unseen import RL, TEST, write_eval
from research.tests.test_rl_update_noise import run_dir  # noqa: F401  (the fixture)


def test_half_steps_and_a_soup_are_written_and_scored(run_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = run_dir / "probes" / "interpolate"
    # a-s0 at half its step: right on r1 and r2 of the unseen set (pi_rft: r2), on q0 of test (pi_rft: q0, q1)
    write_eval(folder / "a-s0-a0.5-unseen", RL[2:5], {"r2", "r3"})
    write_eval(folder / "a-s0-a0.5-test", TEST, {"q0"})
    write_eval(folder / "a-s1-a0.5-unseen", RL[2:5], {"r2"})
    write_eval(folder / "a-s1-a0.5-test", TEST, {"q0", "q1", "q2"})
    write_eval(folder / "soup-both-unseen", RL[2:5], {"r2", "r3", "r4"})
    write_eval(folder / "soup-both-test", TEST, {"q0", "q1", "q2", "q3"})
    out = tmp_path / "out.json"
    args = [str(run_dir), "--runs", "a-s0", "a-s1", "--scale", "0.5", "--soup", "both=a-s0,a-s1", "--out", str(out)]
    done = run_driver("rl_interpolate", args)
    assert done.returncode == 0, done.stderr[-3000:]
    half = load_file(str(folder / "a-s0-a0.5" / "model.safetensors"))
    assert half["w"].tolist() == [1.5, 2.0, 3.0, 4.0] and half["b"].tolist() == [0.5]
    soup = load_file(str(folder / "soup-both" / "model.safetensors"))
    assert soup["w"].tolist() == [1.5, 2.5, 3.0, 4.0]
    data = json.loads(out.read_text())
    assert data["pi_rft"] == {"unseen": 33.33, "test": 50.0}
    s0 = data["runs"]["a-s0"]
    # the run itself: unseen 33.33 (r2), test 25 (q0); its half step: unseen 66.67, test 25
    assert s0["unseen"] == {
        "run": 33.33,
        "a0.5": 66.67,
        "gain_over_pi_rft": 33.33,
        "gain_over_run": 33.33,
        "run_over_pi_rft": 0.0,
    }
    assert s0["test"]["gain_over_pi_rft"] == -25.0 and s0["test"]["gain_over_run"] == 0.0
    s1 = data["runs"]["a-s1"]
    assert s1["test"]["gain_over_pi_rft"] == 25.0 and s1["test"]["gain_over_run"] == 25.0
    summary = data["summary"]["test"]["gain_over_pi_rft"]
    assert summary["mean"] == 0.0 and summary["positive"] == 1 and summary["n"] == 2
    both = data["soups"]["both"]
    assert both["runs"] == ["a-s0", "a-s1"]
    assert both["test"]["em"] == 100.0 and both["test"]["gain_over_pi_rft"] == 50.0
    assert both["test"]["members_mean"] == pytest.approx(37.5)  # a-s0 25, a-s1 50
    # per question against pi_rft (1100): differences 0, 0, 1, 1 -> t = 0.5 / (0.577 / 2) = 1.732, df 3
    assert both["test"]["p_per_question"] == pytest.approx(0.1817, abs=1e-3)


def test_a_scale_outside_0_1_and_a_one_run_soup_are_refused(run_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    done = run_driver("rl_interpolate", [str(run_dir), "--runs", "a-s0", "--scale", "1.5", "--out", str(tmp_path / "o")])
    assert done.returncode == 2 and "--scale must be in (0, 1)" in done.stderr
    done = run_driver("rl_interpolate", [str(run_dir), "--soup", "x=a-s0", "--out", str(tmp_path / "o")])
    assert done.returncode == 2 and "two runs or more" in done.stderr


def test_include_keeps_only_the_matching_tensors_of_each_update(run_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = run_dir / "probes" / "interpolate"
    for name in ("a-s0-a1-bias", "a-s1-a1-bias"):
        write_eval(folder / f"{name}-test", TEST, {"q0"})
    out = tmp_path / "out.json"
    args = [str(run_dir), "--runs", "a-s0", "a-s1", "--scale", "1", "--include", "bias=^b$", "--sets", "test", "--out", str(out)]
    done = run_driver("rl_interpolate", args)
    assert done.returncode == 0, done.stderr[-3000:]
    # a-s0 moved only w; restricted to b, its update is nothing: pi_rft's weights
    kept = load_file(str(folder / "a-s0-a1-bias" / "model.safetensors"))
    assert kept["w"].tolist() == [1.0, 2.0, 3.0, 4.0] and kept["b"].tolist() == [0.5]
    data = json.loads(out.read_text())
    assert data["include"] == {"label": "bias", "pattern": "^b$"}
    assert data["runs"]["a-s0"]["test"]["a1-bias"] == 25.0
    done = run_driver("rl_interpolate", [str(run_dir), "--runs", "a-s0", "--scale", "1", "--out", str(tmp_path / "o")])
    assert done.returncode == 2 and "or 1 with --include" in done.stderr
    args = [str(run_dir), "--runs", "a-s0", "--include", "x=nothing", "--sets", "test", "--out", str(tmp_path / "o")]
    done = run_driver("rl_interpolate", args)
    assert done.returncode != 0 and "no tensor name matches 'nothing'" in done.stderr
