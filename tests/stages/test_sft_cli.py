"""``prorag sft``: a YAML config, training that resumes, and ``prorag eval --policy RUN_DIR``; the
real-data path (MuSiQue records -> BM25 -> ``sft-data`` -> two SFT steps); and one process against
two under ``torchrun`` (same steps, same weights). The helpers that launch the command line in
processes and compare two runs serve the RL stage's test too."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from prorag.agent.gold import gold_hops, render_gold
from prorag.agent.schema import i_traj, parse_trajectory
from prorag.cli import app
from prorag.data.jsonl import JsonlAppender, read_jsonl, write_jsonl
from prorag.data.records import read_records
from prorag.models.checkpoints import load_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.index import build_index
from prorag.stages.sft import load_trajectories

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def step_metrics(run: Path) -> list[dict[str, Any]]:
    """The per-step training logs of a run folder (rows with a ``loss``)."""
    return [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]


def loss_steps(run: Path) -> list[int]:
    rows = step_metrics(run)
    assert all(math.isfinite(r["loss"]) for r in rows)
    return [r["step"] for r in rows]


def write_yaml(path: Path, fields: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.mark.slow
def test_sft_command_trains_resumes_and_its_run_dir_evaluates(tmp_path: Path, tiny_world: Path, world_tokenizer: Any) -> None:
    index, traj, run = tmp_path / "index", tmp_path / "traj.jsonl", tmp_path / "run"
    build_index(tiny_world / "corpus.jsonl", index, kind="bm25")
    made = runner.invoke(
        app, ["sft-data", "--data", str(tiny_world / "train.jsonl"), "--index", str(index), "--out", str(traj), "--limit", "16"]
    )
    assert made.exit_code == 0, made.output
    fields = {
        "model": "tiny", "world_dir": str(tiny_world), "train_file": str(tmp_path / "replaced.jsonl"),
        "records_file": str(tiny_world / "train.jsonl"), "index": str(index), "learning_rate": "3e-3",
        "per_device_batch_size": 4, "max_steps": 50, "save_steps": 2, "logging_steps": 1, "eval_fraction": 0.1,
        "eval_samples": 2, "eval_batch_size": 2, "max_length": 512, "warmup_ratio": 0.0,
    }  # fmt: skip
    config = write_yaml(tmp_path / "sft.yaml", fields)
    base = ["sft", "--config", str(config), "--run-dir", str(run), "--trajectories", str(traj)]

    result = runner.invoke(app, [*base, "--max-steps", "2"])
    assert result.exit_code == 0, result.output
    assert (run / "policy" / "config.json").is_file() and loss_steps(run) == [1, 2]
    resolved = json.loads((run / "sft_config.json").read_text())
    assert resolved["train_file"] == str(traj) and resolved["max_steps"] == 2 and resolved["learning_rate"] == 3e-3
    final = list(read_jsonl(run / "metrics.jsonl"))[-1]
    assert final["eval_samples"] == 2 and 0.0 <= final["format_valid_rate"] <= 1.0
    _, tok = load_policy(str(run / "policy"))
    assert tok.get_vocab() == world_tokenizer.get_vocab()  # the world tokenizer, trained from world_dir

    # Resume in the same run folder with more steps: training continues at step 3.
    result = runner.invoke(app, [*base, "--max-steps", "3"])
    assert result.exit_code == 0, result.output
    assert loss_steps(run) == [1, 2, 3]
    state = json.loads((run / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3

    # A kill while checkpoint-4 was written (only its configs) after steps 4 and 5 were logged: the
    # rerun warns, resumes from checkpoint-3 and logs each step once.
    partial = run / "checkpoints" / "checkpoint-4"
    partial.mkdir()
    for name in ("config.json", "generation_config.json"):
        (partial / name).write_text("{}")
    with JsonlAppender(run / "metrics.jsonl") as extra:
        extra.append({"step": 4, "loss": 9.9})
        extra.append({"step": 5, "loss": 9.9})
    result = runner.invoke(app, [*base, "--max-steps", "4"])
    assert result.exit_code == 0, result.output
    assert loss_steps(run) == [1, 2, 3, 4] and 9.9 not in [r.get("loss") for r in read_jsonl(run / "metrics.jsonl")]
    assert json.loads((partial / "trainer_state.json").read_text())["global_step"] == 4  # rewritten, complete

    # `prorag eval --policy RUN_DIR` evaluates the run's final policy.
    out = tmp_path / "eval"
    ev = [
        "eval",
        "--data",
        str(tiny_world / "test.jsonl"),
        "--index",
        str(index),
        "--limit",
        "2",
        "--max-actions",
        "3",
        "--batch-size",
        "2",
    ]
    result = runner.invoke(app, [*ev, "--policy", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "metrics.json").read_text())["n"] == 2
    (tmp_path / "unfinished" / "checkpoints").mkdir(parents=True)
    result = runner.invoke(app, [*ev, "--policy", str(tmp_path / "unfinished"), "--out", str(tmp_path / "eval2")])
    assert result.exit_code == 2 and "without a final policy" in result.output

    # Config errors end with exit code 2 and one line naming the file, line and key.
    bad = write_yaml(tmp_path / "bad.yaml", fields | {"learning_rat": 0.1})
    result = runner.invoke(app, ["sft", "--config", str(bad), "--run-dir", str(tmp_path / "r2")])
    assert result.exit_code == 2 and f"{bad}:" in result.output and "unknown key 'learning_rat'" in result.output
    no_records = write_yaml(tmp_path / "nr.yaml", fields | {"records_file": str(tmp_path / "none.jsonl")})
    result = runner.invoke(
        app, ["sft", "--config", str(no_records), "--run-dir", str(tmp_path / "r3"), "--trajectories", str(traj)]
    )
    assert result.exit_code == 2 and "none.jsonl" in result.output
    no_tok = write_yaml(tmp_path / "nt.yaml", {k: v for k, v in fields.items() if k != "world_dir"})
    result = runner.invoke(app, ["sft", "--config", str(no_tok), "--run-dir", str(tmp_path / "r4"), "--trajectories", str(traj)])
    assert result.exit_code == 2 and "needs a tokenizer" in result.output


@pytest.mark.slow
def test_musique_records_to_trajectories_to_two_sft_steps(tmp_path: Path, benchmarks_dir: Path, world_tokenizer: Any) -> None:
    """The real-data path: MuSiQue records, BM25 over their paragraphs, template trajectories, SFT."""
    from prorag.data.benchmarks import load_benchmark
    from prorag.data.corpus import build_corpus

    src = benchmarks_dir / "musique" / "musique_ans_dev_200.jsonl"
    subset = tmp_path / "musique_5.jsonl"
    subset.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:5]), encoding="utf-8")
    records = load_benchmark(subset, "musique").records
    assert len(records) == 5 and all(gold_hops(r) for r in records)
    write_jsonl(tmp_path / "records.jsonl", (r.to_dict() for r in records))
    passages = build_corpus([subset]).passages
    write_jsonl(tmp_path / "corpus.jsonl", (p.to_dict() for p in passages))
    build_index(tmp_path / "corpus.jsonl", tmp_path / "index", kind="bm25")

    traj = tmp_path / "traj.jsonl"
    args = [
        "sft-data",
        "--data",
        str(tmp_path / "records.jsonl"),
        "--index",
        str(tmp_path / "index"),
        "--out",
        str(traj),
        "-k",
        "3",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    n_hops = sum(len(gold_hops(r)) for r in records)
    assert f"wrote 5 trajectories ({n_hops} hops)" in result.output
    trajs, _ = load_trajectories(traj)
    corpus_ids = {p.id for p in passages}
    for t, r in zip(trajs, records, strict=True):
        assert t.id == r.id and i_traj(t.text, strict=True) == 1
        hops = gold_hops(r)
        assert [x["query"] for x in t.retrievals] == [h.query for h in hops]
        assert all(len(x["doc_ids"]) == 3 and set(x["doc_ids"]) <= corpus_ids for x in t.retrievals)
        # MuSiQue's gold paragraph ids are the corpus ids, so a miss is a real miss.
        assert t.missing_gold == [i for i, (h, x) in enumerate(zip(hops, t.retrievals)) if not set(h.doc_ids) & set(x["doc_ids"])]
        assert all(">>" not in a.content for a in parse_trajectory(t.text).actions)  # keywords in plain words
    n_missing = sum(len(t.missing_gold) for t in trajs)
    assert f"gold page not retrieved: {n_missing} hops" in result.output

    world_tokenizer.save_pretrained(tmp_path / "tokenizer")
    config = write_yaml(
        tmp_path / "sft.yaml",
        {
            "model": "tiny", "tokenizer": str(tmp_path / "tokenizer"), "train_file": str(traj), "max_steps": 2,
            "per_device_batch_size": 2, "learning_rate": 1.0e-3, "max_length": 768, "overlong": "truncate",
            "eval_fraction": 0.0, "eval_samples": 0, "logging_steps": 1, "save_steps": 2,
        },
    )  # fmt: skip
    result = runner.invoke(app, ["sft", "--config", str(config), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert loss_steps(tmp_path / "run") == [1, 2]
    assert (tmp_path / "run" / "policy" / "model.safetensors").is_file()


# ----------------------------------------------------------------------------- several processes


def run_cli(args: Sequence[str], *, processes: int, port: int, timeout: int = 300) -> None:
    """``python -m prorag.cli ARGS`` (one process), or the same under ``torchrun
    --nproc_per_node N`` on the CPU (gloo, rendezvous on ``port``); one torch thread each."""
    launch = [sys.executable, "-m", "prorag.cli"]
    if processes > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        launch += ["--master_port", str(port), "-m", "prorag.cli"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([*launch, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_training(
    one: Path, two: Path, init: Mapping[str, torch.Tensor], keys: Sequence[str], *, weight_atol: float
) -> None:
    """Two runs of the same settings on different process layouts trained alike: every logged
    step has the same ``keys`` (relative 1e-3), and the final weights differ by at most
    ``weight_atol`` (and by 1e-3 of how far they moved from ``init``), while the median weight
    moved from ``init`` by more than 10 times ``weight_atol``: a different batch, sample or
    normalisation moves weights by about the learning rate and breaks it."""
    rows_one, rows_two = step_metrics(one), step_metrics(two)
    assert [r["step"] for r in rows_one] == [r["step"] for r in rows_two] and rows_one
    for a, b in zip(rows_one, rows_two, strict=True):
        for key in keys:
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), (a["step"], key, a[key], b[key])
    from safetensors.torch import load_file

    wa, wb = (load_file(run / "policy" / "model.safetensors") for run in (one, two))
    assert wa.keys() == wb.keys()
    moved = torch.cat([(wa[k] - init[k]).flatten() for k in wa])
    gap = torch.cat([(wa[k] - wb[k]).flatten() for k in wa])
    assert gap.abs().max() <= weight_atol, f"final weights differ by {gap.abs().max():.2e}"
    assert gap.norm() <= 1e-3 * moved.norm(), f"relative gap {gap.norm() / moved.norm():.2e}"
    assert moved.abs().median() > 10 * weight_atol, f"the weights barely moved ({moved.abs().median():.2e})"


@pytest.mark.slow
def test_one_and_two_processes_train_alike(
    tmp_path: Path, tiny_world: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever
) -> None:
    """`prorag sft` on one process (4 examples per device) and under `torchrun --nproc_per_node 2`
    (2 per device), both with gradient accumulation 2: 8 examples per optimiser step either way.
    The steps see the same examples (``group_by_length`` on: over these 56 examples, length
    groups of one process's batch would order them differently on 2 processes), the format-aware
    loss is normalised over both processes, and the weights end up equal to float noise."""
    records = read_records(tiny_world / "train.jsonl")[:56]
    traj = tmp_path / "traj.jsonl"
    write_jsonl(traj, (g.to_dict() for g in render_gold(records, tiny_retriever, k=3)))
    world_tokenizer.save_pretrained(tmp_path / "tokenizer")
    fields = {
        "model": "tiny", "tokenizer": str(tmp_path / "tokenizer"), "train_file": str(traj), "max_steps": 3,
        "gradient_accumulation_steps": 2, "group_by_length": True, "learning_rate": 3.0e-3, "warmup_ratio": 0.0,
        "max_length": 1024, "eval_fraction": 0.0, "eval_samples": 0, "logging_steps": 1, "save_steps": 100,
    }  # fmt: skip
    runs = {}
    for n in (1, 2):
        config = write_yaml(tmp_path / f"sft{n}.yaml", fields | {"per_device_batch_size": 4 // n})
        runs[n] = tmp_path / f"run{n}"
        run_cli(["sft", "--config", str(config), "--run-dir", str(runs[n])], processes=n, port=29533)
    assert [r["step"] for r in step_metrics(runs[2])] == [1, 2, 3]  # written once (by the main process)
    init = make_tiny_model(world_tokenizer).state_dict()  # SFTConfig.seed 0: the runs' initial weights
    keys = ("loss", "grad_norm", "mean_token_accuracy", "num_tokens", "learning_rate")
    assert_same_training(runs[1], runs[2], init, keys, weight_atol=1e-4)
