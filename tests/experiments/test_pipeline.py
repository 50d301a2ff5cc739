"""The pipeline: config files, splits, stage markers, and resuming after a kill (at a stage
boundary and in the middle of a stage) to the same final metrics as an uninterrupted run."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from prorag.core.config import apply_overrides, load_config, used_settings
from prorag.data.jsonl import read_json, read_jsonl
from prorag.data.records import Record
from prorag.experiments.pipeline import (
    DataConfig,
    PipelineConfig,
    demo_config,
    demo_config_file,
    fingerprint,
    non_default_fields,
    plan_splits,
    question_key,
    share_counts,
    split_questions,
)

ROOT = Path(__file__).resolve().parents[2]

# A pipeline small enough for a test: the tiny world, the SFT policy and its two trained
# baselines (the stages after SFT are covered by their own tests and by the demo).
SMALL = {
    "data": {"world": "tiny", "sft_fraction": 0.5, "dev_questions": 6, "test_questions": 12},
    "top_k": 2,
    "sft": {
        "max_steps": 12,
        "per_device_batch_size": 4,
        "learning_rate": 3.0e-3,
        "save_steps": 4,
        "logging_steps": 4,
        "eval_samples": 4,
    },
    "eval": {"rollout": {"max_action_tokens": 24, "max_completion_tokens": 160, "batch_size": 16}},
    "systems": ["naive", "standard-rag", "sft"],
    "report": False,
}


def _write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _pipeline(config: Path, run_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "prorag.cli", "pipeline", "--config", str(config), "--run-dir", str(run_dir)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen[bytes]) -> str:
    out, _ = proc.communicate(timeout=600)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


def _final(run_dir: Path) -> dict:
    return {name: row["metrics"] for name, row in read_json(run_dir / "results.json")["systems"].items()}


def _kill_when(proc: subprocess.Popen[bytes], ready: callable, timeout: float = 300) -> None:
    start = time.monotonic()
    while not ready():
        assert proc.poll() is None, "the pipeline finished before it could be killed"
        assert time.monotonic() - start < timeout, "the kill point was never reached"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_split_is_seeded_and_disjoint() -> None:
    records = [Record(f"q{i}", f"question {i}?", ["a"], {}) for i in range(50)]
    sft, pool = split_questions(records, 0.6, seed=0)
    assert len(sft) == 30 and len(pool) == 20
    assert not {r.id for r in sft} & {r.id for r in pool}
    assert [r.id for r in split_questions(records, 0.6, seed=0)[0]] == [r.id for r in sft]
    assert [r.id for r in split_questions(records, 0.6, seed=1)[0]] != [r.id for r in sft]


def _world_records(worlds: int, per_world: int, prefix: str = "w") -> list[Record]:
    return [
        Record(f"{prefix}{w}-q{i}", f"Who is {prefix}{w} person {i}?", ["a"], {"partition": f"{prefix}{w}"})
        for w in range(worlds)
        for i in range(per_world)
    ]


def _assert_disjoint(records: dict[str, list[Record]]) -> None:
    names = sorted(records)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not {r.id for r in records[a]} & {r.id for r in records[b]}, (a, b)
            assert not {question_key(r.question) for r in records[a]} & {question_key(r.question) for r in records[b]}, (a, b)


def test_world_splits_hold_whole_worlds_out_for_rl_and_mcts() -> None:
    train = _world_records(10, 20)
    dev, test = _world_records(1, 5, "dev"), _world_records(1, 5, "test")
    # A training question that is also a test question (same text, other case and spacing) is dropped.
    train.append(Record("dup", "WHO is  test0 person 1?", ["a"], {"partition": "w0"}))
    data = DataConfig(world="tiny", sft_share=0.6, mcts_share=0.2, sft_fraction=0.5, mcts_questions=30, dev_questions=4)
    splits = plan_splits(train, dev, test, data, seed=0)
    r, m = splits.records, splits.manifest
    assert m["split"] == "worlds" and m["dropped_as_dev_or_test"] == 1
    # 10 worlds: 6 for SFT + RFT, 2 for MCTS, 2 for RL; SFT trains on half of the SFT worlds' 120 questions.
    assert m["counts"] == {"sft": 60, "rft": 60, "mcts": 30, "rl": 40, "dev": 4, "test": 5}
    _assert_disjoint(r)
    worlds = {name: {x.partition for x in rows} for name, rows in r.items()}
    assert worlds["rft"] <= worlds["sft"] and len(worlds["sft"]) == 6
    assert not worlds["rl"] & (worlds["sft"] | worlds["mcts"]) and not worlds["mcts"] & worlds["sft"]
    assert sorted(worlds["rl"]) == m["worlds"]["rl"] and sorted(worlds["mcts"]) == m["worlds"]["mcts"]
    # Same seed, same splits; another seed deals the worlds differently.
    again = plan_splits(train, dev, test, data, seed=0)
    assert {k: [x.id for x in v] for k, v in again.records.items()} == {k: [x.id for x in v] for k, v in r.items()}
    assert plan_splits(train, dev, test, data, seed=1).manifest["worlds"] != m["worlds"]


def test_world_splits_of_the_built_in_world(tmp_path: Path) -> None:
    from prorag.data.records import read_records
    from prorag.data.world import build_world

    build_world(tmp_path, 0, "tiny")
    files = {s: read_records(tmp_path / f"{s}.jsonl") for s in ("train", "dev", "test")}
    splits = plan_splits(files["train"], files["dev"], files["test"], DataConfig(world="tiny"), seed=0)
    _assert_disjoint(splits.records)
    sft_worlds = {r.partition for r in splits.records["sft"]}
    assert not sft_worlds & {r.partition for r in splits.records["rl"]}
    assert all(splits.records[s] for s in ("sft", "rft", "mcts", "rl"))


def test_question_splits_for_real_data_are_disjoint_and_carve_a_dev_split() -> None:
    train = [Record(f"q{i}", f"question {i}?", ["a"], {}) for i in range(100)]
    train.append(Record("q-copy", "Question 3?", ["a"], {}))  # the same question under another id
    test = [Record("t0", "question 99?", ["a"], {})]
    data = DataConfig(world=None, train_file="t", test_file="t", corpus_file="c", dev_questions=10, sft_fraction=0.5)
    splits = plan_splits(train, None, test, data, seed=0)
    assert splits.manifest["split"] == "questions" and splits.manifest["dropped_as_dev_or_test"] == 1
    _assert_disjoint(splits.records)
    assert len(splits.records["dev"]) >= 10 and sum(len(v) for v in splits.records.values()) == 101
    with pytest.raises(ValueError, match="metadata.partition"):
        plan_splits(train, None, test, replace(data, split="worlds"), seed=0)


def test_pool_split_keeps_the_old_layout() -> None:
    train = _world_records(4, 10)
    data = DataConfig(world="tiny", split="pool", sft_fraction=0.5, mcts_questions=5, rft_questions=8)
    r = plan_splits(train, None, _world_records(1, 3, "t"), data, seed=0).records
    assert [x.id for x in r["mcts"]] == [x.id for x in r["pool"][:5]] and [x.id for x in r["rl"]] == [x.id for x in r["pool"]]


def test_share_counts_give_every_split_a_unit() -> None:
    assert share_counts(20, 0.6, 0.2) == (12, 4, 4)
    assert share_counts(3, 0.6, 0.2) == (1, 1, 1)
    with pytest.raises(ValueError, match="cannot give"):
        share_counts(2, 0.6, 0.2)


#: ``asdict(demo_config(quick=...))`` as it was when the demo config was Python code, before it
#: became YAML: the demo's settings must not move with the files that hold them.
FROZEN_DEMO = Path(__file__).with_name("fixtures") / "demo_config_frozen.json"
#: Float fields that the Python config set with an int literal (``epochs=2``): read from YAML they
#: are floats (:func:`~prorag.core.config.load_config` converts an int for a float field), equal in
#: value and in fingerprint. Every other leaf keeps its type and value.
WIDENED_TO_FLOAT = {"prm.epochs", "rft.train.epochs"}

#: Fields added after the freeze, with the value the demo must leave them at (their defaults: off).
ADDED_SINCE = {
    "primary_contrasts": ("NoneType", None),
    "eval.over_long": ("str", "skip"),
    "sft_data.max_chars": ("int", 65_536),
    "index.faiss": ("NoneType", None),
    # the generation backend (issue 68): hf, with the vLLM block it does not read at its defaults
    **{
        f"{block}.{key}": value
        for block in ("eval.rollout", "mcts.rollout", "rft.rollout", "rl.rollout", "rl.outcome_reward.p2s.synthesis")
        for key, value in {
            "backend": ("str", "hf"),
            "vllm.tensor_parallel_size": ("int", 1),
            "vllm.gpu_memory_utilization": ("float", 0.3),
            "vllm.max_model_len": ("NoneType", None),
            "vllm.dtype": ("str", "auto"),
            "vllm.enforce_eager": ("bool", False),
            "vllm.enable_prefix_caching": ("bool", True),
        }.items()
    },
    "rl.vllm_mode": ("str", "colocate"),
    "rl.vllm_server_url": ("str", "http://127.0.0.1:8000"),
    "rl.vllm_sleep_mode": ("bool", False),
    "rl.packed_scoring": ("bool", False),
    "rl.packed_row_tokens": ("NoneType", None),
    "rl.logprob_chunk": ("NoneType", None),
}

#: Fields added after every synthetic marker below was written (issue 68's generation backend).
BACKEND_FIELDS = {"backend", "vllm", "vllm_mode", "vllm_server_url", "vllm_sleep_mode"}


def _leaves(value: Any, prefix: str = "") -> dict[str, tuple[str, Any]]:
    """Every leaf of nested mappings as ``dotted.key -> (type name, value)`` (a list is one leaf)."""
    if isinstance(value, dict):
        out: dict[str, tuple[str, Any]] = {}
        for key, inner in value.items():
            out |= _leaves(inner, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): (type(value).__name__, value)}


@pytest.mark.parametrize("quick", [False, True])
def test_the_demo_config_is_the_frozen_one_field_by_field(quick: bool) -> None:
    frozen = json.loads(FROZEN_DEMO.read_text(encoding="utf-8"))["quick" if quick else "full"]
    loaded = demo_config(quick=quick)
    now = _leaves(json.loads(json.dumps(dataclasses.asdict(loaded))))
    want = _leaves(frozen) | ADDED_SINCE
    assert sorted(now) == sorted(want)
    for key in WIDENED_TO_FLOAT:
        assert want[key][0] == "int" and now[key] == ("float", float(want[key][1])), key
    assert [(k, now[k], want[k]) for k in sorted(want) if now[k] != want[k] and k not in WIDENED_TO_FLOAT] == []
    # ... and so is every stage's fingerprint: a run folder started by an earlier `prorag demo` resumes.
    # (fields added since hold their old-behaviour values: without them the fingerprints are the frozen ones,
    # and a run folder's markers match through LATER_FIELDS)
    for part in ("data", "sft_data", "sft", "mcts", "pairs", "prm", "dpo", "rft", "rl", "eval"):
        now_part = dataclasses.asdict(getattr(loaded, part))
        for key in ADDED_SINCE:
            if key.startswith(part + "."):
                *path, leaf = key.split(".")[1:]
                blocks = [now_part]
                for name in path:
                    blocks.append(blocks[-1][name])
                del blocks[-1][leaf]
                for name, outer in zip(reversed(path), reversed(blocks[:-1]), strict=True):
                    if outer[name] == {}:  # a block whose every field came later (rollout.vllm)
                        del outer[name]
        assert fingerprint(now_part) == fingerprint(frozen[part]), part
    assert load_config(demo_config_file(quick), PipelineConfig) == loaded  # what `prorag pipeline --config FILE` runs


def test_the_quick_demo_yaml_holds_only_what_differs_from_the_full_one() -> None:
    """demo_quick.yaml names demo.yaml as its base and sets only keys whose value differs from it."""
    full = yaml.safe_load(demo_config_file(quick=False).read_text(encoding="utf-8"))
    quick = yaml.safe_load(demo_config_file(quick=True).read_text(encoding="utf-8"))
    assert quick.pop("base") == demo_config_file(quick=False).name
    full_config = _leaves(dataclasses.asdict(demo_config(quick=False)))
    overrides = _leaves(quick)
    assert overrides and [k for k, v in overrides.items() if full_config[k] == v] == []
    assert len(overrides) < len(_leaves(full)) / 2


def test_the_demo_yaml_files_are_package_data() -> None:
    """`prorag demo` reads its YAML from the package, so an installed wheel must ship it."""
    import fnmatch
    import tomllib

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    folder = ROOT / "prorag" / "experiments"
    for quick in (False, True):
        relative = demo_config_file(quick).relative_to(folder).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in package_data.get("prorag.experiments", [])), relative
    # ... and configs/ holds no second copy of them.
    assert [p for p in (ROOT / "configs").rglob("*.yaml") if p.name in ("demo.yaml", "demo_quick.yaml")] == []


def test_arms_yaml_shares_the_demo_stages_and_trains_rl_one_pass() -> None:
    """configs/pipelines/arms_demo.yaml (the process and family ablations): the demo's SFT schedule on the
    `small` model at its own learning rate, the demo's RFT and PRM stage settings (same
    fingerprints) on the `wide` world, its own MCTS budget, and an RL schedule of one pass over
    ``limit`` screened questions with a held-out curve."""
    arms, demo = load_config(ROOT / "configs" / "pipelines" / "arms_demo.yaml", PipelineConfig), demo_config()
    for part in ("rft", "prm", "pairs", "sft_data", "eval"):
        assert fingerprint(getattr(arms, part)) == fingerprint(getattr(demo, part)), part
    assert (arms.sft.model, arms.sft.learning_rate) == ("small", pytest.approx(2e-3))
    assert fingerprint(replace(arms.sft, model=demo.sft.model, learning_rate=demo.sft.learning_rate)) == fingerprint(demo.sft)
    assert arms.rl.question_filter == "mixed"
    assert (arms.data.world, demo.data.world) == ("wide", "demo") and arms.data.rft_questions == 705
    assert arms.data.split == "worlds" and (arms.mcts.simulations, arms.data.mcts_questions) == (12, 128)
    rl = arms.rl
    questions_per_batch = rl.per_device_batch_size // rl.group_size
    assert rl.max_steps // rl.num_iterations * questions_per_batch == rl.limit  # one pass, no repeat
    assert rl.eval_every > 0 and rl.outcome_reward.nu2 == pytest.approx(0.2) and arms.systems == ["sft", "rft"]
    # the KL arms: GRPO with a KL to pi_rft, and a step reward on top of it tested against it
    assert arms.extra_arms["grpo-kl"] == ["beta_kl=0.1"]
    assert arms.arm_controls["prorag-oracle-first-error-kl"] == "grpo-kl"
    # the early-stopping arms: policy/ is the dev-best evaluation's, on the run's dev split
    from prorag.experiments.ablations import ablation_arms

    early = ablation_arms(arms, "process")
    assert early.rl["grpo-early"] == ("select_policy=best_dev",)
    assert early.controls["prorag-oracle-first-error-early"] == "grpo-early"
    # the step term only where GRPO is silent, tested against the same term shuffled
    assert early.rl["prorag-oracle-first-error-silent"] == ("process_reward=oracle-first-error", "advantage=dual_silent")
    assert early.controls["prorag-oracle-first-error-silent"] == "prorag-oracle-first-error-silent-shuffled"
    # and its complement, the step term only where the outcomes disagree
    assert early.rl["prorag-oracle-first-error-informative"] == (
        "process_reward=oracle-first-error",
        "advantage=dual_informative",
    )
    assert early.controls["prorag-oracle-first-error-informative"] == "prorag-oracle-first-error-informative-shuffled"
    assert early.controls["prorag-oracle-first-error-signed"] == "prorag-oracle-first-error-signed-shuffled"
    # the learned PRM held on the outcome's sign, on every step and up to its first error
    assert early.rl["prorag-first-error-signed"] == ("process_reward=prm-first-error", "advantage=dual_signed")
    assert early.controls["prorag-first-error-signed"] == "prorag-first-error-signed-shuffled"
    assert early.controls["prorag-signed"] == "prorag-signed-shuffled"


def test_paper_yaml_loads_and_holds_the_paper_settings() -> None:
    cfg = load_config(ROOT / "configs" / "pipelines" / "paper.yaml", PipelineConfig)
    assert cfg.sft.model == "Qwen/Qwen3-8B" and cfg.sft.learning_rate == pytest.approx(2e-5)
    assert (cfg.mcts.simulations, cfg.mcts.num_candidates, cfg.mcts.max_depth) == (200, 5, 10)
    assert (cfg.mcts.c_puct, cfg.mcts.gamma) == (2.5, 0.99)
    assert (cfg.rl.group_size, cfg.rl.beta, cfg.rl.lora.enabled, cfg.rl.lora.r, cfg.rl.lora.alpha) == (8, 0.3, True, 16, 32)
    assert cfg.index.kind == "dense" and cfg.index.query_prefix == "query: " and cfg.top_k == 3
    assert cfg.index.model == "intfloat/e5-base-v2" and cfg.index.faiss == "data/e5_Flat.index"  # imported, not re-encoded


def test_marker_of_an_earlier_config_layout_is_refused(tmp_path: Path) -> None:
    """A stage marker without ``config_schema`` (or an older one) was fingerprinted over another
    layout of the configs: the stage is refused with what to do, not rerun or skipped."""
    from prorag.data.jsonl import write_json
    from prorag.experiments.pipeline import CONFIG_SCHEMA, Run

    run = Run(tmp_path, PipelineConfig(), progress=lambda _: None)
    calls: list[int] = []
    run.stage("sft", {"a": 1}, lambda: calls.append(1))
    marker = read_json(tmp_path / "stages" / "sft.json")
    assert marker["config_schema"] == CONFIG_SCHEMA == 2
    run.stage("sft", {"a": 1}, lambda: calls.append(2))  # the same layout and settings: skipped
    assert calls == [1]
    write_json(tmp_path / "stages" / "sft.json", {k: v for k, v in marker.items() if k != "config_schema"})
    with pytest.raises(ValueError, match="made by an earlier config layout.*use a new run folder, or delete"):
        run.stage("sft", {"a": 1}, lambda: calls.append(3))
    assert calls == [1]


def test_a_moved_run_folder_still_matches_its_markers(tmp_path: Path) -> None:
    """Settings that name files inside the run folder are fingerprinted relative to it: a run
    folder copied or moved elsewhere skips its finished stages, and a path outside the folder,
    or a changed setting, still counts. A marker written with absolute paths (before this rule)
    still matches where it was written."""
    import shutil

    from prorag.experiments.pipeline import Run, fingerprint

    first = tmp_path / "first"
    calls: list[str] = []

    def settings(run_dir: Path, lr: float = 1e-3) -> dict[str, object]:
        return {"train_file": str(run_dir / "sft_data" / "t.jsonl"), "lr": lr, "corpus": "/data/corpus.jsonl"}

    Run(first, PipelineConfig(), progress=lambda _: None).stage("sft", settings(first), lambda: calls.append("first"))
    moved = tmp_path / "elsewhere" / "moved"
    shutil.copytree(first, moved)
    run = Run(moved, PipelineConfig(), progress=lambda _: None)
    run.stage("sft", settings(moved), lambda: calls.append("moved"))
    assert calls == ["first"]
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("sft", settings(moved, lr=2e-3), lambda: calls.append("changed"))
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("sft", {**settings(moved), "corpus": "/data/other.jsonl"}, lambda: calls.append("corpus"))
    assert fingerprint(settings(first), root=first) == fingerprint(settings(moved), root=moved)
    assert fingerprint(settings(first)) != fingerprint(settings(moved))

    # A legacy marker: the absolute-path fingerprint, accepted in its own folder.
    legacy = tmp_path / "legacy"
    (legacy / "stages").mkdir(parents=True)
    marker = {"stage": "sft", "config_schema": 2, "fingerprint": fingerprint(settings(legacy)), "seconds": 1.0}
    (legacy / "stages" / "sft.json").write_text(json.dumps(marker), encoding="utf-8")
    Run(legacy, PipelineConfig(), progress=lambda _: None).stage("sft", settings(legacy), lambda: calls.append("legacy"))
    assert calls == ["first"]


def _write_marker(run_dir: Path, stage: str, settings: Any) -> None:
    """A stage marker as an earlier version wrote it: ``settings`` (plain data, as it hashed them)
    fingerprinted relative to ``run_dir``."""
    (run_dir / "stages").mkdir(exist_ok=True)
    marker = {"stage": stage, "config_schema": 2, "fingerprint": fingerprint(settings, root=run_dir), "seconds": 1.0}
    (run_dir / "stages" / f"{stage}.json").write_text(json.dumps(marker), encoding="utf-8")


def _without_keys(value: Any, names: set[str]) -> Any:
    """Plain config data with the fields ``names`` dropped at every depth (nested rollouts too)."""
    if isinstance(value, dict):
        return {k: _without_keys(v, names) for k, v in value.items() if k not in names}
    return value


#: RL's scoring settings added after the launch settings (``packed_scoring`` and its two companions).
PACKED = ("packed_scoring", "packed_row_tokens", "logprob_chunk")


def test_a_marker_from_before_a_later_setting_still_matches_while_it_keeps_its_old_value(tmp_path: Path) -> None:
    """An RL stage fingerprinted before ``question_filter`` existed is skipped while the new
    field keeps its old-behaviour value (``none``), and counts as changed with any other."""
    from prorag.core.config import LATER_FIELDS, without_later_fields
    from prorag.experiments.pipeline import Run
    from prorag.stages.rl import RLConfig

    assert LATER_FIELDS["question_filter"] == "none"
    config = RLConfig(learning_rate=2e-4)
    before = _without_keys(dataclasses.asdict(config), set(LATER_FIELDS))  # (BACKEND_FIELDS among them)
    assert without_later_fields(config) == before
    _write_marker(tmp_path, "rl-grpo-seed0", before)
    calls: list[str] = []
    run = Run(tmp_path, PipelineConfig(), progress=lambda _: None)
    run.stage("rl-grpo-seed0", config, lambda: calls.append("rerun"))
    assert calls == []
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("rl-grpo-seed0", dataclasses.replace(config, question_filter="mixed"), lambda: calls.append("mixed"))
    # A marker written after `question_filter` and `screening_file` existed and before
    # `screening_strata` (and the rollout settings added after it): it holds the first two, not the rest.
    between = _without_keys(
        dataclasses.asdict(config),
        {"screening_strata", "decode_graphs", "resume_early", "scoring_rows", "sample_streams", "compile_decode", *PACKED}
        | BACKEND_FIELDS,
    )
    assert list(LATER_FIELDS)[2] == "screening_strata" and without_later_fields(config, 2) == between
    assert without_later_fields(config) != between  # stripping every later field would miss it
    _write_marker(tmp_path, "rl-between", between)
    run.stage("rl-between", config, lambda: calls.append("rerun"))
    assert calls == []
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("rl-between", {**dataclasses.asdict(config), "screening_strata": "type"}, lambda: calls.append("strata"))


def test_a_marker_from_before_the_launch_settings_still_matches(tmp_path: Path) -> None:
    """Stages fingerprinted before ``decode_graphs``, ``resume_early`` (rollouts) and ``scoring_rows``
    (RL) existed are skipped with these at their defaults: a run folder made by the version before
    them resumes instead of redoing MCTS or RL. An MCTS stage made before ``sample_streams`` matches
    only with ``sample_streams: batch`` (how it sampled): today's default, row streams, draws other
    trees, so the finished stage counts as made with other settings."""
    from prorag.core.config import LATER_FIELDS
    from prorag.experiments.pipeline import Run
    from prorag.stages.mcts import MCTSConfig

    assert list(LATER_FIELDS)[3:5] == ["decode_graphs", "resume_early"] and LATER_FIELDS["sample_streams"] == "batch"
    config = MCTSConfig(sample_streams="batch")
    settings = dataclasses.asdict(config)
    before = _without_keys(settings, {"decode_graphs", "resume_early", "sample_streams", "compile_decode"} | BACKEND_FIELDS)
    assert before != settings
    _write_marker(tmp_path, "mcts", before)
    # A marker written after `decode_graphs` and before `resume_early`.
    between = _without_keys(settings, {"resume_early", "sample_streams", "compile_decode"} | BACKEND_FIELDS)
    _write_marker(tmp_path, "mcts-between", between)
    calls: list[str] = []
    run = Run(tmp_path, PipelineConfig(), progress=lambda _: None)
    run.stage("mcts", config, lambda: calls.append("rerun"))
    run.stage("mcts-between", config, lambda: calls.append("rerun"))
    assert calls == []
    barrier = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, resume_early=False))
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("mcts", barrier, lambda: calls.append("barrier"))
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("mcts", MCTSConfig(), lambda: calls.append("row streams"))
    from prorag.stages.rl import RLConfig

    rl = RLConfig(learning_rate=2e-4)
    old_rl = _without_keys(
        dataclasses.asdict(rl),
        {"decode_graphs", "resume_early", "scoring_rows", "sample_streams", "compile_decode", *PACKED} | BACKEND_FIELDS,
    )
    _write_marker(tmp_path, "rl-grpo-seed0", old_rl)
    run.stage("rl-grpo-seed0", rl, lambda: calls.append("rerun"))
    assert calls == []
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("rl-grpo-seed0", dataclasses.replace(rl, scoring_rows=16), lambda: calls.append("16"))


def test_a_later_field_of_p2s_keeps_the_markers_of_runs_that_do_not_use_p2s(tmp_path: Path) -> None:
    """``outcome_reward.p2s.sample_streams`` came after every RL marker: an outcome-only run made
    before it resumes whatever the field holds (the run never reads P2S's block), and a new marker
    of such a run does not hash it; a P2S run made before it matches only with ``batch`` (how its
    candidates were drawn)."""
    from prorag.experiments.pipeline import Run, fingerprint
    from prorag.stages.rl import RLConfig

    grpo = RLConfig(learning_rate=2e-4)
    assert grpo.outcome_reward.form != "p2s" and grpo.outcome_reward.p2s.sample_streams == "row"
    before = _without_keys(dataclasses.asdict(grpo), {"compile_decode", *PACKED} | BACKEND_FIELDS)  # which came after it
    del before["outcome_reward"]["p2s"]["sample_streams"]  # what the version before it wrote
    _write_marker(tmp_path, "rl-grpo-seed0", before)
    calls: list[str] = []
    run = Run(tmp_path, PipelineConfig(), progress=lambda _: None)
    run.stage("rl-grpo-seed0", grpo, lambda: calls.append("rerun"))
    run.stage("rl-grpo-seed0", apply_overrides(grpo, ["outcome_reward.p2s.sample_streams=batch"]), lambda: calls.append("batch"))
    assert calls == []
    with pytest.raises(ValueError, match="finished with other settings"):  # a field the run reads still counts
        run.stage("rl-grpo-seed0", dataclasses.replace(grpo, learning_rate=1e-4), lambda: calls.append("lr"))

    # A new marker of an outcome-only run: the same key whatever P2S's field holds.
    run.stage("rl-new", grpo, lambda: calls.append("new"))
    run.stage("rl-new", apply_overrides(grpo, ["outcome_reward.p2s.sample_streams=batch"]), lambda: calls.append("again"))
    assert calls == ["new"]
    written = json.loads((tmp_path / "stages" / "rl-new.json").read_text(encoding="utf-8"))["fingerprint"]
    keyed = used_settings(grpo)
    assert written == fingerprint(keyed, root=tmp_path) and "sample_streams" not in keyed["outcome_reward"]["p2s"]

    # A P2S run from before: its candidates came from one generator per call.
    p2s = apply_overrides(grpo, ["outcome_reward.form=p2s"])
    old_p2s = _without_keys(dataclasses.asdict(p2s), {"compile_decode", *PACKED} | BACKEND_FIELDS)
    del old_p2s["outcome_reward"]["p2s"]["sample_streams"]
    _write_marker(tmp_path, "rl-p2s-seed0", old_p2s)
    run.stage("rl-p2s-seed0", apply_overrides(p2s, ["outcome_reward.p2s.sample_streams=batch"]), lambda: calls.append("p2s"))
    assert calls == ["new"]
    with pytest.raises(ValueError, match="finished with other settings"):
        run.stage("rl-p2s-seed0", p2s, lambda: calls.append("row streams"))


def test_non_default_fields_round_trip() -> None:
    cfg = replace(demo_config(), seeds=[0, 1, 2])
    again = PipelineConfig(**{})  # defaults
    data = non_default_fields(cfg)
    assert data["seeds"] == [0, 1, 2] and "index" not in data
    from prorag.core.config import config_from_dict

    assert config_from_dict(PipelineConfig, data) == cfg != again


@pytest.mark.slow
def test_pipeline_resumes_after_kills_to_the_same_metrics(tmp_path: Path) -> None:
    config = _write_config(tmp_path / "small.yaml", SMALL)

    straight = tmp_path / "straight"
    log = _finish(_pipeline(config, straight))
    assert "[done] eval-sft" in log
    expected = _final(straight)
    assert set(expected) == {"naive", "standard-rag", "sft"}
    assert (straight / "pipeline_config.yaml").exists()

    # 1. Killed in the middle of SFT training (after its first checkpoint), then rerun.
    resumed = tmp_path / "resumed"
    proc = _pipeline(config, resumed)
    _kill_when(proc, lambda: any((resumed / "policies" / "sft" / "checkpoints").glob("checkpoint-*/trainer_state.json")))
    assert not (resumed / "stages" / "train-sft.json").exists()
    # 2. Killed at a stage boundary: right after the SFT policy's marker was written.
    proc = _pipeline(config, resumed)
    _kill_when(proc, lambda: (resumed / "stages" / "train-sft.json").exists())
    log = _finish(_pipeline(config, resumed))
    assert "[skip] train-sft" in log and "[skip] world" in log
    assert _final(resumed) == expected
    # Not only the metrics (near zero for so short a training): the same weights and the same
    # generated trajectories, token for token.
    from safetensors.torch import load_file

    a = load_file(straight / "policies" / "sft" / "policy" / "model.safetensors")
    b = load_file(resumed / "policies" / "sft" / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("sft", "standard-rag"):
        ta = [r["completion_ids"] for r in read_jsonl(straight / "eval" / name / "trajectories.jsonl")]
        tb = [r["completion_ids"] for r in read_jsonl(resumed / "eval" / name / "trajectories.jsonl")]
        assert ta == tb and any(ta)

    # A finished stage run again with other settings is refused, naming the stage.
    changed = _write_config(tmp_path / "changed.yaml", {**SMALL, "sft": {**SMALL["sft"], "learning_rate": 1.0e-3}})
    proc = _pipeline(changed, resumed)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2 and b"train-sft" in out


@pytest.mark.slow
def test_quick_demo_runs_end_to_end_and_prints_its_measured_table(tmp_path: Path) -> None:
    """``prorag demo --quick``: every stage on the built-in world, the table printed from the
    evaluations it ran (each row's numbers are those of its eval folder), and the report."""
    run = tmp_path / "demo"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "prorag.cli", "demo", "--quick", "--run-dir", str(run)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = read_json(run / "results.json")
    assert results["order"] == ["naive", "standard-rag", "sft", "rft", "rl-from-sft", "grpo", "prorag"]
    for row in results["systems"].values():
        measured = read_json(run / row["eval_dir"] / "metrics.json")
        assert row["metrics"]["em"] == measured["em"] and row["metrics"]["n"] == measured["n"] == 100
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith(row["label"]))
        assert f"{100 * measured['em']:.1f}" in line and f"{100 * measured['f1']:.1f}" in line
    for stage in ("train-sft", "mcts", "pairs", "prm", "rft", "rl-prorag-seed0", "rl-grpo-seed0", "eval-prorag-seed0"):
        assert (run / "stages" / f"{stage}.json").exists(), stage
    assert (run / "report.html").exists() and "(EM, n=100)" in (run / "report.md").read_text()  # t-tests vs ProRAG
    assert read_json(run / "policies" / "rft" / "rft_counts.json")["samples"] == 64 * 4


def test_rl_runs_of_one_seed_share_one_screening(tmp_path: Path) -> None:
    """With ``question_filter``, every RL run from one initial policy and seed (an ablation's arms)
    reads one screening file; another seed or policy has its own; without it none is set."""
    from prorag.experiments.pipeline import Run, rl_config
    from prorag.stages.rl.config import SFTReplayConfig

    base = PipelineConfig()
    run = Run(tmp_path, replace(base, rl=replace(base.rl, question_filter="mixed")), progress=lambda _: None)
    grpo = rl_config(run, "rft", process=False, beta=0.3, seed=2)
    prorag = rl_config(run, "rft", process=True, beta=0.3, seed=2)
    assert grpo.screening_file == prorag.screening_file == str(tmp_path / "rl" / "screening-rft-seed2.jsonl")
    assert rl_config(run, "rft", process=False, beta=0.3, seed=3).screening_file != grpo.screening_file
    assert rl_config(run, "sft", process=True, beta=0.3, seed=2).screening_file != grpo.screening_file
    plain = Run(tmp_path, base, progress=lambda _: None)
    assert rl_config(plain, "rft", process=False, beta=0.3, seed=2).screening_file is None
    # SFT replay without a file replays the run's own SFT trajectories
    assert rl_config(plain, "rft", process=False, beta=0.3, seed=2).sft_replay.file is None
    ptx = Run(tmp_path, replace(base, rl=replace(base.rl, sft_replay=SFTReplayConfig(coef=1.0))), progress=lambda _: None)
    assert rl_config(ptx, "rft", process=False, beta=0.3, seed=2).sft_replay.file == str(
        tmp_path / "sft_data" / "trajectories.jsonl"
    )


def test_smollm2_gpu_yaml_runs_the_demo_table_with_the_demo_settings_on_cuda() -> None:
    """configs/pipelines/smollm2_world_gpu.yaml: SmolLM2 (a checkpoint folder) through every stage of the demo's
    table on the demo world, on CUDA, with the settings the demo learned with (likelihood PRM, the
    PRM judging reasoning only) and small budgets (one H100, minutes)."""
    from prorag.experiments.pipeline import DEFAULT_SYSTEMS

    cfg = load_config(ROOT / "configs" / "pipelines" / "smollm2_world_gpu.yaml", PipelineConfig)
    demo = demo_config(quick=True)
    assert cfg.systems == list(DEFAULT_SYSTEMS) and cfg.device == "cuda" and cfg.sft.model == "runs/smollm2"
    assert (cfg.data.world, cfg.data.passages, cfg.data.split) == (demo.data.world, demo.data.passages, demo.data.split)
    assert (cfg.prm.kind, cfg.rft.prm_scope, cfg.rl.prm_scope, cfg.pairs) == ("likelihood", "reasoning", "reasoning", demo.pairs)
    assert cfg.sft.learning_rate == pytest.approx(1e-4) and cfg.rl.learning_rate == pytest.approx(1e-5)
    assert all(c.dtype == "float32" and c.bf16 == "auto" for c in (cfg.sft, cfg.prm, cfg.rft.train, cfg.rl))
    assert cfg.data.mcts_questions * cfg.mcts.simulations <= 16 * 16 and cfg.rl.max_steps <= 5
    assert 100 <= cfg.data.test_questions <= 200 and all(
        c.max_minutes is not None for c in (cfg.sft, cfg.prm, cfg.rft.train, cfg.rl)
    )


def test_device_is_resolved_and_refused_before_anything_is_written(tmp_path: Path) -> None:
    from prorag.experiments.pipeline import run_pipeline, stage_device

    assert stage_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    assert stage_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="not a torch device name"):
        stage_device("gpu-please")
    with pytest.raises(ValueError, match="device must be"):
        PipelineConfig(device=" ")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device"):
            run_pipeline(PipelineConfig(device="cuda"), tmp_path / "run", progress=lambda _: None)
        assert not (tmp_path / "run").exists()


def test_stages_that_place_their_models_get_the_configured_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MCTS, the PRM audit (policy and PRM), RFT and the evaluations run on
    ``device``; the stage functions are stubbed, so only the device each is handed is checked."""
    import prorag.evaluation.runner as runner
    import prorag.experiments.pipeline as pipeline
    import prorag.retrieval.index as index
    import prorag.stages.mcts as mcts
    import prorag.stages.pairs as pairs
    import prorag.stages.prm as prm
    import prorag.stages.rft as rft
    from prorag.supervision.reward_model import ProcessRewardModel

    seen: dict[str, str | None] = {}

    @dataclasses.dataclass
    class Summary:
        pairs: int = 0

    def note(name: str, device: str | None) -> None:
        seen[name] = device

    monkeypatch.setattr(mcts, "run_mcts_files", lambda *a, device=None, **k: note("mcts", device))
    monkeypatch.setattr(mcts, "read_trees", lambda _: [])
    monkeypatch.setattr(pairs, "extract_pairs", lambda *a, **k: Summary())
    monkeypatch.setattr(pairs, "make_judge", lambda _: None)
    monkeypatch.setattr(prm, "train_prm", lambda *a, **k: None)
    monkeypatch.setattr(ProcessRewardModel, "load", staticmethod(lambda path, device=None, **k: note("prm", device)))
    monkeypatch.setattr(prm, "fresh_sample_audit", lambda *a, device=None, **k: note("audit", device) or {"auc": 0.5})
    monkeypatch.setattr(prm, "write_prm_summary", lambda *a, **k: {"beats_all": False})
    monkeypatch.setattr(pipeline.stages, "read_records", lambda _: [])
    monkeypatch.setattr(index, "open_retriever", lambda _: None)
    monkeypatch.setattr(rft, "run_rft_files", lambda *a, device=None, **k: note("rft", device))
    monkeypatch.setattr(runner, "evaluate_files", lambda *a, device=None, **k: note("eval", device))

    cfg = pipeline.resolve(PipelineConfig(device="cpu:0", systems=["sft", "rft"]))
    run = pipeline.Run(tmp_path, cfg, progress=lambda _: None)
    pipeline.stage_prm(run)
    pipeline.stage_rft(run)
    pipeline.stage_eval(run)
    assert seen == dict.fromkeys(("mcts", "prm", "audit", "rft", "eval"), "cpu:0")


def test_rl_worlds_replace_the_rl_share_and_leave_every_other_split_as_it_was() -> None:
    train = _world_records(10, 20)
    dev, test = _world_records(1, 5, "dev"), _world_records(1, 5, "test")
    rl = _world_records(30, 1, "fresh")
    rl.append(Record("fresh-dup", "who is w3 person 2?", ["b"], {"partition": "fresh99"}))  # an SFT or MCTS text
    data = DataConfig(world="tiny", sft_share=0.6, mcts_share=0.2, sft_fraction=0.5, mcts_questions=30, dev_questions=4)
    without = plan_splits(train, dev, test, data, seed=0)
    with_rl = plan_splits(train, dev, test, replace(data, rl_worlds=31), seed=0, rl=rl)
    for name in ("sft", "rft", "mcts", "dev", "test"):
        assert [r.id for r in with_rl.records[name]] == [r.id for r in without.records[name]], name
    fresh = with_rl.records["rl"]
    kept_dup = "fresh-dup" in {r.id for r in fresh}
    assert len(fresh) == 30 + kept_dup and {r.partition for r in fresh} <= {f"fresh{i}" for i in [*range(30), 99]}
    # The duplicate is dropped only when its text is an SFT, RFT or MCTS question (it is w3's).
    in_other = question_key("who is w3 person 2?") in {
        question_key(r.question) for s in ("sft", "rft", "mcts") for r in without.records[s]
    }
    assert kept_dup != in_other
    assert with_rl.manifest["rl_worlds"] == {
        "questions": 31,
        "dropped_as_other_split": int(in_other),
        "unused_train_worlds": without.manifest["worlds"]["rl"],
    }
    assert with_rl.manifest["worlds"]["rl"] == sorted({r.partition for r in fresh})
    _assert_disjoint(with_rl.records)
    assert [r.id for r in plan_splits(train, dev, test, replace(data, rl_worlds=31), seed=0, rl=rl).records["rl"]] == [
        r.id for r in fresh
    ]
    assert len(plan_splits(train, dev, test, replace(data, rl_worlds=31, rl_questions=7), seed=0, rl=rl).records["rl"]) == 7
    with pytest.raises(ValueError, match="split: worlds"):
        plan_splits(train, dev, test, replace(data, split="questions"), seed=0, rl=rl)
    with pytest.raises(ValueError, match="rl_worlds needs a built-in world"):
        DataConfig(world=None, train_file="t", test_file="t", corpus_file="c", rl_worlds=3)
    with pytest.raises(ValueError, match="rl_questions_per_world"):
        DataConfig(world="tiny", rl_worlds=3, rl_questions_per_world=0)


def test_markers_written_before_rl_worlds_existed_still_match() -> None:
    """A run folder's splits marker hashed `data` without the two fields; at their defaults it matches."""
    from prorag.core.config import earlier_forms

    data = dataclasses.asdict(DataConfig(world="wide"))
    old = {k: v for k, v in data.items() if k not in ("rl_worlds", "rl_questions_per_world")}
    assert fingerprint(old) in {fingerprint(form) for form in earlier_forms(data)}
    changed = dataclasses.asdict(DataConfig(world="wide", rl_worlds=5))
    assert fingerprint(old) not in {fingerprint(form) for form in earlier_forms(changed)} | {fingerprint(changed)}


def test_the_pipeline_deals_rl_questions_from_the_rl_worlds(tmp_path: Path) -> None:
    """World, index and splits stages with `data.rl_worlds`: RL's split is the RL worlds' questions,
    the index searches their pages, and SFT's split is the one of a run without them."""
    from prorag.experiments.pipeline import Run, _data_files, stage_index, stage_splits, stage_world
    from prorag.retrieval.index import load_index

    def splits_of(run_dir: Path, **data: Any) -> dict[str, list[Record]]:
        cfg = replace(PipelineConfig(), data=replace(DataConfig(world="tiny"), **data))
        run = Run(run_dir, cfg, progress=lambda _: None)
        files = _data_files(run)
        stage_world(run)
        stage_index(run, files)
        stage_splits(run, files)
        return {s: list(read_jsonl(run.path("splits", f"{s}.jsonl"))) for s in ("sft", "rl")}

    plain = splits_of(tmp_path / "plain")
    fresh = splits_of(tmp_path / "fresh", rl_worlds=8)
    assert fresh["sft"] == plain["sft"]
    rl_worlds = {r["metadata"]["partition"] for r in fresh["rl"]}
    assert rl_worlds and rl_worlds <= {f"w{i:03d}" for i in range(5, 13)}
    record = fresh["rl"][0]
    world = record["metadata"]["partition"]
    hits = load_index(tmp_path / "fresh" / "index").search([record["question"]], k=3, partitions=[world])
    assert hits[0] and all(h.id.startswith(f"{world}/") for h in hits[0])
    manifest = read_json(tmp_path / "fresh" / "splits" / "manifest.json")
    assert manifest["worlds"]["rl"] == sorted(rl_worlds) and manifest["rl_worlds"]["unused_train_worlds"]


def test_the_index_stage_imports_a_faiss_index_instead_of_encoding(tmp_path: Path) -> None:
    """`index.faiss`: the corpus's FAISS index made elsewhere (here from prorag's own dense index of it)
    is imported, and searches as that index does; a BM25 kind with it is refused when the config is made."""
    import faiss

    from prorag.data.jsonl import write_jsonl
    from prorag.experiments.pipeline import Run, stage_index
    from prorag.experiments.pipeline.config import IndexConfig
    from prorag.retrieval.index import build_index, load_index, read_manifest

    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, ({"id": str(i), "contents": f"Page {i}\nPage {i} is about the number {i * 7}."} for i in range(12)))
    build_index(corpus, tmp_path / "own", kind="dense")
    own = load_index(tmp_path / "own")
    flat = faiss.index_factory(own.dim, "Flat", faiss.METRIC_INNER_PRODUCT)
    flat.add(own.embeddings)
    faiss.write_index(flat, str(tmp_path / "elsewhere.index"))

    cfg = replace(PipelineConfig(), index=IndexConfig(kind="dense", faiss=str(tmp_path / "elsewhere.index")))
    run = Run(tmp_path / "run", cfg, progress=lambda _: None)
    stage_index(run, {"corpus": corpus})
    assert "faiss" in read_manifest(run.path("index"))["settings"]
    queries = ["the number 35", "page 3"]
    theirs, ours = load_index(run.path("index")).search(queries, k=2), own.search(queries, k=2)
    assert [[h.id for h in hits] for hits in theirs] == [[h.id for h in hits] for hits in ours]
    assert [[h.score for h in hits] for hits in theirs] == [[pytest.approx(h.score, abs=1e-5) for h in hits] for hits in ours]
    stage_index(run, {"corpus": corpus})  # done: skipped, not imported again
    with pytest.raises(ValueError, match="index.faiss imports a dense index"):
        IndexConfig(faiss="x.index")
