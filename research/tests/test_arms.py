"""The arms file (`research/arms/rl_seed_runs.yaml`), its reader and the shell driver that runs its arms.

Each arm must be a valid RL config, its variants must differ from it by exactly what their names say
(a copy error in one list would otherwise run another arm under the name), and the shell driver must
hand `prorag rl` the arm's assignments: checked with a stand-in `prorag` that records its arguments."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from prorag.core.config import apply_overrides
from prorag.stages.rl import RLConfig
from research.analysis.arms import PREFIX, parse_arms, read_arms, rl_flags
from research.tests.drivers import DRIVERS, ROOT, run_driver

ARMS = read_arms()
REPLAY = {"rl.sft_replay.file=sft_data/trajectories.jsonl", "rl.sft_replay.coef=1.0", "rl.sft_replay.batch_size=16"}
TWO_PASSES = {"rl.max_steps=96", "rl.save_steps=48"}


def own(name: str) -> set[str]:
    return set(ARMS[name].own)


@pytest.mark.parametrize("name", sorted(ARMS))
def test_every_arm_is_a_valid_rl_config(name: str) -> None:
    config = apply_overrides(RLConfig(), [a[len(PREFIX) :] for a in ARMS[name].assignments])
    assert config.limit == 192 and config.question_filter == "none"


def test_each_variant_differs_from_its_arm_by_what_its_name_says() -> None:
    for name in ARMS:
        if name.endswith("-2pass"):
            assert own(name) == own(name.removesuffix("-2pass")) | TWO_PASSES, name
        elif name.endswith("+replay"):
            assert own(name) == own(name.removesuffix("+replay")) | REPLAY, name
        elif name.endswith("-shuffled"):
            swapped = {a.replace("-shuffled", "").replace("=shuffled", "=prm") for a in own(name)}
            assert swapped == own(name.removesuffix("-shuffled")), name
    assert own("replay-only") == own("outcome-grpo+replay") | {"rl.advantage=zero", "rl.replay_only=true"}
    assert {a.code for a in ARMS.values()} >= {"ngrpoptx2", "ptxonly2", "nofesgnptx2", "nofesgnshptx2"}


def test_the_reader_refuses_what_is_not_an_arm() -> None:
    with pytest.raises(ValueError, match="'beta=0' is not an rl.KEY=VALUE"):
        parse_arms({"arms": {"x": {"set": ["beta=0"]}}})
    with pytest.raises(ValueError, match="code 'c' is already arm 'x'"):
        parse_arms({"arms": {"x": {"set": ["rl.beta=0"], "code": "c"}, "y": {"set": ["rl.beta=1"], "code": "c"}}})
    with pytest.raises(ValueError, match="arm 'x': no assignments"):
        parse_arms({"arms": {"x": {"set": []}}})
    with pytest.raises(ValueError, match="optional 'what', 'code'"):
        parse_arms({"arms": {"x": {"set": ["rl.beta=0"], "sets": []}}})
    arm = parse_arms({"schedule": ["rl.limit=4"], "arms": {"x": {"set": ["rl.beta=0", "rl.limit=8"]}}})["x"]
    assert rl_flags(arm) == ["--set", "limit=4", "--set", "beta=0", "--set", "limit=8"]  # the arm's own last: it wins


def test_the_readme_maps_every_old_code_to_its_arm() -> None:
    done = run_driver("arms", ["list"])
    assert done.returncode == 0, done.stderr
    readme = (ROOT / "research" / "README.md").read_text()
    assert done.stdout.strip() in readme
    assert done.stdout.count("\n| `") == sum(a.code is not None for a in ARMS.values())


def test_an_old_code_is_refused_with_the_arm_it_became() -> None:
    done = run_driver("arms", ["flags", "nofesgnshptx2"])
    assert done.returncode == 2 and "old code of arm 'oracle-first-error-signed-shuffled+replay-2pass'" in done.stderr


FAKE_PRORAG = """#!/usr/bin/env bash
# A stand-in for prorag: records its arguments, writes what rl and eval leave behind.
printf '%s\\n' "$*" >> "$CALLS"
cmd=$1; shift
while [ $# -gt 0 ]; do
  case $1 in --run-dir) dir=$2; shift ;; --out) out=$2; shift ;; esac
  shift
done
if [ "$cmd" = rl ]; then
  mkdir -p "$dir/policy" "$dir/checkpoints/checkpoint-24" "$dir/checkpoints/checkpoint-48" "$dir/dev_eval"
  echo '{"best": {"step": 24}}' > "$dir/dev_eval/best.json"
else
  mkdir -p "$out" && echo '{}' > "$out/metrics.json"
fi
"""


def test_the_shell_driver_runs_each_arm_with_its_assignments(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "prorag"
    fake.parent.mkdir()
    fake.write_text(FAKE_PRORAG)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    run, calls = tmp_path / "run", tmp_path / "calls.txt"
    run.mkdir()
    env = {**os.environ, "PRORAG": str(fake), "CALLS": str(calls), "PYTHON": sys.executable}
    script = DRIVERS / "rl_seed_runs.sh"
    jobs = ["prm-first-error-signed:0", "frozen:1"]
    done = subprocess.run(
        ["bash", str(script), str(run), *jobs], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    rl = [line for line in lines if line.startswith("rl ")]
    assert len(rl) == 2 and "--run-dir probes/prm-first-error-signed-s0 --seed 0" in rl[0]
    assert rl[0].endswith(" ".join(rl_flags(ARMS["prm-first-error-signed"])))
    assert rl[1].endswith("--set learning_rate=0")
    evals = [line for line in lines if line.startswith("eval ")]  # the last step and dev's choice; none for frozen
    assert len(evals) == 2
    assert "checkpoints/checkpoint-48 " in evals[0] and "probes/test-prm-first-error-signed-s0-last" in evals[0]
    assert (
        "probes/prm-first-error-signed-s0/policy " in evals[1]
        and json.loads((run / "probes" / "test-prm-first-error-signed-s0-best" / "metrics.json").read_text()) == {}
    )

    calls.unlink()
    done = subprocess.run(
        ["bash", str(script), str(run), "frozen:2", "prmfesgn:0"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "old code of arm 'prm-first-error-signed'" in done.stderr
    assert not calls.exists(), "a bad job is refused before the first run starts"
