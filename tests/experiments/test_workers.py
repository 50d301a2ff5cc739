"""``prorag ablate --workers N``: seeds dealt to worker processes, their threads and GPUs, a failed
worker named with its log, the config they read back, and a tiny ablation whose workers give the
same runs as one process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import prorag.experiments.workers as workers
from prorag.cli import app
from prorag.core.config import load_config
from prorag.data.jsonl import read_json, read_jsonl
from prorag.experiments.ablations import run_ablation
from prorag.experiments.pipeline import PipelineConfig, resolve, run_pipeline, write_resolved_config
from tests.experiments.test_process_ablation import TINY

REPO = Path(__file__).resolve().parents[2]


def test_seeds_are_dealt_round_robin_and_no_worker_is_left_without_one() -> None:
    assert workers.seed_shards([0, 1, 2, 3, 4], 2) == [[0, 2, 4], [1, 3]]
    assert workers.seed_shards([0, 1, 2, 3, 4], 3) == [[0, 3], [1, 4], [2]]
    assert workers.seed_shards([7, 9], 8) == [[7], [9]]
    assert workers.seed_shards([0, 1], 1) == [[0, 1]]
    with pytest.raises(ValueError, match="workers must be >= 1"):
        workers.seed_shards([0, 1], 0)


def test_each_worker_gets_its_share_of_the_cores_and_one_gpu() -> None:
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "16"}
    env = workers.worker_env(1, 4, base, cores=16, gpus=0)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["PATH"]) == ("4", "4", "/bin")
    assert "CUDA_VISIBLE_DEVICES" not in env and base["OMP_NUM_THREADS"] == "16"  # the parent's env is not changed
    assert workers.worker_env(0, 4, base, cores=2, gpus=0)["OMP_NUM_THREADS"] == "1"
    # GPUs dealt round-robin, in the parent's own numbering when it was given some.
    assert [workers.worker_env(i, 3, base, cores=16, gpus=2)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["0", "1", "0"]
    given = base | {"CUDA_VISIBLE_DEVICES": "3, 5"}
    assert [workers.worker_env(i, 2, given, cores=16, gpus=2)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["3", "5"]


def test_a_worker_runs_this_module_with_its_seeds_and_arms(tmp_path: Path) -> None:
    cmd = workers.worker_command(tmp_path / "run", tmp_path / "c.yaml", "family", [1, 3], ["grpo", "dpo"], 2)
    assert cmd[:3] == [sys.executable, "-c", workers.WORKER_ENTRY]
    assert cmd[cmd.index("--seeds") + 1] == "1,3" and cmd[cmd.index("--arms") + 1] == "grpo,dpo"
    assert cmd[cmd.index("--what") + 1] == "family" and cmd[cmd.index("--threads") + 1] == "2"
    assert "--arms" not in workers.worker_command(tmp_path, tmp_path / "c.yaml", "process", [0], None, 1)


def _worker(tmp_path: Path, index: int, code: str) -> workers.Worker:
    log = tmp_path / f"w{index}.log"
    with log.open("wb") as f:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT)
    return workers.Worker(index, [index], process, log)


def test_a_failed_worker_is_named_with_its_log_after_the_others_finish(tmp_path: Path) -> None:
    done = tmp_path / "done"
    ok = _worker(tmp_path, 0, f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(done)!r}).touch()")
    bad = _worker(tmp_path, 1, "import sys; print('step 3 of 5\\rstep 4 of 5'); print('boom: no such policy'); sys.exit(3)")
    with pytest.raises(RuntimeError) as err:
        workers.supervise([ok, bad], finished=lambda: int(done.exists()), total=1, poll_seconds=0.05)
    message = str(err.value)
    assert "worker 1 (seeds 1) exited with code 3" in message and str(bad.log) in message
    assert "boom: no such policy" in message and "step 4 of 5" in message and "step 3 of 5" not in message
    assert "worker 0" not in message and "run the same command again" in message
    assert done.exists() and ok.process.returncode == 0  # the other worker was let finish


def test_workers_that_all_succeed_return_quietly(tmp_path: Path) -> None:
    both = [_worker(tmp_path, i, "pass") for i in range(2)]
    workers.supervise(both, finished=lambda: 2, total=2, poll_seconds=0.05)
    assert [w.process.returncode for w in both] == [0, 0]


def test_the_workers_read_back_the_parents_config_exactly(tmp_path: Path) -> None:
    resolved = resolve(load_config(REPO / "configs" / "pipelines" / "arms_demo.yaml", PipelineConfig))
    write_resolved_config(resolved, tmp_path / "c.yaml")
    assert resolve(load_config(tmp_path / "c.yaml", PipelineConfig)) == resolved


@pytest.mark.parametrize(("what", "count"), [("beta", 2), ("process", 0)])
def test_workers_are_refused_where_they_do_not_apply(tmp_path: Path, what: str, count: int) -> None:
    with pytest.raises(ValueError, match="--workers must be 1, or more with --what process or family"):
        run_ablation(PipelineConfig(), tmp_path / "run", what, workers=count)
    assert not (tmp_path / "run").exists()  # refused before the pipeline starts


@pytest.mark.slow
def test_two_workers_give_the_runs_of_one_process(tmp_path: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny world's pipeline once, copied; two arms x two seeds in one process (one thread) and
    in two workers (one thread each): the same predictions, and each worker ran its own seed."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    alone, split = tmp_path / "alone", tmp_path / "split"
    run_pipeline(load_config(config, PipelineConfig), alone, progress=lambda _: None)
    shutil.copytree(alone, split)
    monkeypatch.setattr(workers, "available_cores", lambda: 2)  # one thread per worker, as in this process
    common = ["ablate", "--config", str(config), "--what", "process", "--seeds", "2", "--arms", "grpo,prorag-oracle-first-error"]
    one = CliRunner().invoke(app, [*common, "--run-dir", str(alone)])
    assert one.exit_code == 0, one.output[-3000:]
    two = CliRunner().invoke(app, [*common, "--run-dir", str(split), "--workers", "2"])
    assert two.exit_code == 0, two.output[-3000:]
    assert "worker 0: seeds 0, 1 threads" in two.output and "worker 1: seeds 1, 1 threads" in two.output
    # The parent's own pass found every run done.
    assert "[skip] rl-grpo-seed1" in two.output and "[run ] rl-" not in two.output
    logs = split / "ablations" / "workers"
    log0, log1 = ((logs / f"process-worker{i}.log").read_text() for i in range(2))
    assert "[run ] rl-grpo-seed0" in log0 and "[run ] rl-prorag-oracle-first-error-seed0" in log0
    assert "seed1" not in log0 and "[run ] rl-grpo-seed1" in log1 and "seed0" not in log1
    for name in ("grpo-seed0", "grpo-seed1", "prorag-oracle-first-error-seed0", "prorag-oracle-first-error-seed1"):
        a = [r["prediction"] for r in read_jsonl(alone / "eval" / name / "predictions.jsonl")]
        b = [r["prediction"] for r in read_jsonl(split / "eval" / name / "predictions.jsonl")]
        assert a == b, name
    # Everything but the wall time of an RL step, which two processes side by side do not share.
    assert _untimed(read_json(alone / "ablations" / "process.json")["stats"]) == _untimed(
        read_json(split / "ablations" / "process.json")["stats"]
    )


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not k.startswith("seconds_per_rl_step")}
    return value
