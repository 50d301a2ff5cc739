"""Stage configs from YAML: every field settable, unknown keys and wrong types refused with file:line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from prorag.core.config import apply_overrides, config_from_dict, load_config
from prorag.core.errors import DataError
from prorag.stages.sft_config import SFTConfig
from prorag.stages.training_config import LoRAConfig

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_example_configs_load() -> None:
    cfg = load_config(REPO / "configs" / "stages" / "sft_world_tiny.yaml", SFTConfig)
    assert cfg.model == "tiny" and cfg.world_dir == "runs/world_tiny" and cfg.learning_rate == pytest.approx(3e-3)
    assert cfg.train_file and cfg.records_file and cfg.index and cfg.eval_file


@pytest.mark.parametrize(
    "name",
    sorted(p.name for p in (REPO / "configs" / "stages").glob("*.yaml") if p.name.startswith(("sft_", "mcts_", "rl_"))),
)
def test_every_stage_config_file_loads(name: str) -> None:
    """Each stage YAML in configs/ loads into its stage's dataclass (unknown keys would raise)."""
    from prorag.stages.mcts import MCTSConfig
    from prorag.stages.rl import RLConfig

    cls = {"sft": SFTConfig, "mcts": MCTSConfig, "rl": RLConfig}[name.split("_", 1)[0]]
    cfg = load_config(REPO / "configs" / "stages" / name, cls)
    assert isinstance(cfg, cls)
    if name == "mcts_musique_smollm2.yaml":
        assert (cfg.simulations, cfg.num_candidates, cfg.max_depth) == (16, 4, 8)


def test_values_are_typed(tmp_path: Path) -> None:
    text = """
learning_rate: 3e-3          # YAML 1.1 reads this as a string; the loader makes it a float
warmup_ratio: 0
epochs: 2
max_minutes: null
bf16: auto
fused_lm_head: false
tag_weights: {"</step>": 4}
lora:
  target_modules: [q_proj, v_proj]
report_to: none
"""
    cfg = load_config(write(tmp_path, text), SFTConfig)
    assert cfg.learning_rate == 3e-3 and isinstance(cfg.learning_rate, float)
    assert isinstance(cfg.warmup_ratio, float) and cfg.epochs == 2.0 and cfg.max_minutes is None
    assert cfg.bf16 == "auto" and cfg.fused_lm_head is False
    assert cfg.tag_weights == {"</step>": 4.0} and cfg.lora.target_modules == ["q_proj", "v_proj"] and cfg.lora.r == 16
    with pytest.raises(DataError, match="empty config: expected a mapping of SFTConfig fields"):
        load_config(write(tmp_path, ""), SFTConfig)


def test_every_field_is_settable(tmp_path: Path) -> None:
    """Each field, written back from a non-default config, loads to the same value."""
    changed = SFTConfig(
        model="small", target="naive", tokenizer="tok", world_dir="w", arch="qwen3", dtype="bfloat16", train_file="t.jsonl", index="idx",
        top_k=5, records_file="r.jsonl", eval_file="e.jsonl", eval_fraction=0.1, missing_gold="drop", prompt_style="chat",
        max_length=512, overlong="truncate", epochs=3.0, max_steps=7, max_minutes=1.5, per_device_batch_size=2,
        gradient_accumulation_steps=4, learning_rate=1e-4, lr_scheduler_type="cosine", warmup_ratio=0.1, weight_decay=0.01,
        max_grad_norm=0.5, group_by_length=True, gradient_checkpointing=True, cudnn_attention=True, compile_norms=True, fused_lm_head=True, weight_scheme="paper",
        control_lambda=4.0, tag_weights={"</answer>": 6.0}, reduction="sum",
        lora=LoRAConfig(enabled=True, r=8, alpha=16, dropout=0.1, target_modules=["q_proj"]), bf16=False, seed=3, save_steps=9, save_total_limit=None,
        logging_steps=2, eval_steps=4, eval_samples=5, eval_batch_size=6, report_to=["tensorboard"], dataloader_num_workers=1,
    )  # fmt: skip
    defaults = SFTConfig()
    untouched = [f.name for f in dataclasses.fields(SFTConfig) if getattr(changed, f.name) == getattr(defaults, f.name)]
    assert untouched == []  # the test really sets every field
    import yaml

    path = write(tmp_path, yaml.safe_dump(dataclasses.asdict(changed)))
    assert load_config(path, SFTConfig) == changed


@pytest.mark.parametrize(
    "text,where,message",
    [
        ("model: tiny\nlearning_rat: 0.1\n", ":2", "unknown key 'learning_rat' for SFTConfig; did you mean 'learning_rate'?"),
        ("top_k: 3\nmax_steps: many\n", ":2", "field 'max_steps': expected an integer, got str 'many'"),
        ("lora: yes please\n", ":1", "field 'lora': expected a mapping of LoRAConfig fields"),
        ("top_k: 2.5\n", ":1", "field 'top_k': expected an integer"),
        ("overlong: chop\n", ":1", "field 'overlong': expected 'drop' or 'truncate'"),
        ("tag_weights: [1, 2]\n", ":1", "field 'tag_weights'"),
        ("eval_fraction: 1.5\n", "", "eval_fraction must be in [0, 1)"),
        ("- model\n- tiny\n", "", "expected a mapping of SFTConfig fields, got list"),
        ("model: [tiny\n", ":2", "invalid YAML"),
    ],
)
def test_bad_configs_name_file_line_and_key(tmp_path: Path, text: str, where: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(DataError) as err:
        load_config(path, SFTConfig)
    assert str(err.value).startswith(f"{path}{where}: ") and message in str(err.value)


def test_missing_file_and_non_dataclass(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_config(tmp_path / "nope.yaml", SFTConfig)
    with pytest.raises(TypeError):
        config_from_dict(dict, {})


def test_nested_config_blocks(tmp_path: Path) -> None:
    """A config holding another config (the LLM teacher's settings in SFTDataConfig) reads it from a mapping."""
    from prorag.stages.sft_data import SFTDataConfig

    path = write(tmp_path, "teacher: llm\ntop_k: 5\nllm:\n  base_url: http://127.0.0.1:8000/v1\n  model: m\n  concurrency: 2\n")
    cfg = load_config(path, SFTDataConfig)
    assert cfg.top_k == 5 and cfg.llm is not None and (cfg.llm.model, cfg.llm.concurrency) == ("m", 2)
    bad = write(tmp_path, "teacher: llm\nllm:\n  base_url: http://127.0.0.1:8000/v1\n  model: m\n  concurrencyy: 2\n")
    with pytest.raises(DataError, match=r":2: field 'llm': expected a valid LLMTeacherConfig .*unknown key 'concurrencyy'"):
        load_config(bad, SFTDataConfig)


def test_apply_overrides_reads_yaml_values_and_checks_them() -> None:
    from prorag.core.config import apply_overrides, load_config_with_overrides
    from prorag.stages.rl import RLConfig

    cfg = apply_overrides(RLConfig(), ["beta=0.5", "learning_rate=3e-3", "exclude_ids_from=[a, b]", "limit=null", "beta=0.7"])
    assert (cfg.beta, cfg.learning_rate, cfg.exclude_ids_from, cfg.limit) == (0.7, 0.003, ["a", "b"], None)
    assert load_config_with_overrides(None, RLConfig, ["seed=3"]).seed == 3
    with pytest.raises(DataError, match=r"^--set btea=1: unknown key 'btea' for RLConfig; did you mean 'beta'\?$"):
        apply_overrides(RLConfig(), ["btea=1"])
    with pytest.raises(DataError, match=r"--set beta=x: field 'beta': expected a number"):
        apply_overrides(RLConfig(), ["beta=x"])
    with pytest.raises(DataError, match="KEY=VALUE"):
        apply_overrides(RLConfig(), ["beta"])


def test_a_check_across_two_fields_does_not_depend_on_the_assignments_order() -> None:
    from prorag.experiments.pipeline import PipelineConfig
    from prorag.stages.rl import RLConfig

    # select_policy=best_dev needs eval_every > 0: either order works, nested or not
    for order in (["select_policy=best_dev", "eval_every=12"], ["eval_every=12", "select_policy=best_dev"]):
        cfg = apply_overrides(RLConfig(), order)
        assert (cfg.select_policy, cfg.eval_every) == ("best_dev", 12)
    cfg = apply_overrides(PipelineConfig(), ["rl.select_policy=best_dev", "rl.eval_every=4"])
    assert (cfg.rl.select_policy, cfg.rl.eval_every) == ("best_dev", 4)
    # a value still rejected once the others are in is the error, named; later still wins
    with pytest.raises(DataError, match=r"^--set select_policy=best_dev: RLConfig.select_policy='best_dev' needs"):
        apply_overrides(RLConfig(), ["select_policy=best_dev", "beta=0.5"])
    with pytest.raises(DataError, match=r"--set select_policy=best_dev: .*needs dev evaluations"):
        apply_overrides(RLConfig(), ["eval_every=12", "select_policy=best_dev", "eval_every=0"])
    assert apply_overrides(RLConfig(), ["beta=-1", "beta=0.2"]).beta == 0.2, "an overwritten value is never set"


def stage_configs() -> list[type]:
    from prorag.agent.rollout_config import RolloutConfig
    from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
    from prorag.experiments.pipeline import DataConfig, IndexConfig, PipelineConfig
    from prorag.method.rewards.outcome import OutcomeRewardConfig
    from prorag.method.rewards.process import StepRewardConfig
    from prorag.stages.mcts import MCTSConfig
    from prorag.stages.pairs import PairsConfig
    from prorag.stages.prm import PRMConfig
    from prorag.stages.rft_config import RFTConfig
    from prorag.stages.rl import RLConfig
    from prorag.stages.sft_config import SFTTrainingConfig
    from prorag.stages.sft_data import SFTDataConfig
    from prorag.stages.training_config import TrainingConfig

    return [
        SFTConfig, SFTTrainingConfig, SFTDataConfig, MCTSConfig, PairsConfig, PRMConfig, RFTConfig, RLConfig, EvalConfig,
        EvalRolloutConfig, RolloutConfig, OutcomeRewardConfig, StepRewardConfig, DataConfig, IndexConfig, PipelineConfig,
        LoRAConfig, TrainingConfig,
    ]  # fmt: skip


@pytest.mark.parametrize("cls", stage_configs(), ids=lambda c: c.__name__)
def test_every_config_field_has_help(cls: type) -> None:
    missing = [f.name for f in dataclasses.fields(cls) if not str(f.metadata.get("help", "")).strip()]
    assert missing == []


def test_field_help_walks_nested_configs_with_the_parents_defaults() -> None:
    from prorag.core.config import field_help
    from prorag.stages.mcts import MCTSConfig

    rows = {name: (tp, default, text) for name, tp, default, text in field_help(MCTSConfig)}
    assert rows["simulations"][:2] == ("int", "200") and rows["simulations"][2]
    assert rows["rollout"][0] == "RolloutConfig" and rows["rollout.temperature"][:2] == ("float", "0.9")
    assert rows["rollout.batch_size"][1] == "160" and rows["rollout.prompt_style"][1] == "None"


def test_a_partial_nested_block_keeps_the_stages_defaults(tmp_path: Path) -> None:
    """``rollout: {temperature: 1.1}`` in MCTS changes the temperature only: top-p 0.95 and batch
    160 stay MCTS's, not RolloutConfig's 1.0 and 32."""
    from prorag.stages.mcts import MCTSConfig

    cfg = load_config(write(tmp_path, "rollout:\n  temperature: 1.1\n"), MCTSConfig)
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.batch_size, cfg.rollout.max_actions) == (1.1, 0.95, 160, 13)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_an_empty_config_is_refused_naming_the_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(DataError) as e:
        load_config(path, SFTConfig)
    assert str(e.value) == f"{path}: empty config: expected a mapping of SFTConfig fields"


def test_a_duplicate_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "max_steps: 3\nseed: 1\nmax_steps: 4\n")
    with pytest.raises(DataError) as e:
        load_config(path, SFTConfig)
    assert str(e.value) == f"{path}:3: duplicate key 'max_steps' (first given on line 1)"
    nested = write(tmp_path, "lora:\n  r: 8\n  r: 16\n")
    with pytest.raises(DataError, match=r"c\.yaml:3: duplicate key 'r' \(first given on line 2\)"):
        load_config(nested, SFTConfig)


def test_a_binary_config_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"seed: 1\nmodel: \xff\xfe\n")
    with pytest.raises(DataError) as e:
        load_config(path, SFTConfig)
    assert str(e.value).startswith(f"{path}:2: not UTF-8 text (byte 0xff at column 8)")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_steps", 0, "SFTConfig.max_steps must be -1 (train by epochs) or >= 1, got 0"),
        ("max_steps", -3, "SFTConfig.max_steps must be -1 (train by epochs) or >= 1, got -3"),
        ("save_steps", -5, "SFTConfig.save_steps must be >= 1, got -5"),
        ("logging_steps", 0, "SFTConfig.logging_steps must be >= 1, got 0"),
    ],
)
def test_step_counts_the_trainer_would_misread_are_refused(key: str, value: int, message: str) -> None:
    """From YAML, --set and Python alike (the check is the config's own)."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SFTConfig(**{key: value})
    with pytest.raises(DataError, match=f"--set {key}={value}"):
        apply_overrides(SFTConfig(), [f"{key}={value}"])
    assert SFTConfig(max_steps=-1).max_steps == -1 and SFTConfig(max_steps=1).max_steps == 1


def test_later_fields_in_an_unused_method_block_are_left_out_whatever_they_hold() -> None:
    """Hand-built plain data: ``p2s`` is used only under ``form: p2s`` (METHOD_BLOCKS). A later
    field there is dropped at any value (and at any depth of the block) where the block is unused;
    elsewhere, and in a used block, only at its old value."""
    from prorag.core.config import LATER_FIELDS, METHOD_BLOCKS, used_settings, without_later_fields

    assert METHOD_BLOCKS["p2s"] == ("form", "p2s") and LATER_FIELDS["sample_streams"] == "batch"
    block = {"k": 4, "sample_streams": "row", "synthesis": {"resume_early": False, "top_k": 3}}
    unused = {"form": "paper", "p2s": block, "sample_streams": "row"}
    assert used_settings(unused) == {"form": "paper", "p2s": {"k": 4, "synthesis": {"top_k": 3}}, "sample_streams": "row"}
    assert without_later_fields(unused) == used_settings(unused)  # "row" is not the old value outside the block
    used = {"form": "p2s", "p2s": block}
    assert used_settings(used) == used
    assert without_later_fields(used) == used  # neither later field holds its old value
    assert without_later_fields({"form": "p2s", "p2s": {"sample_streams": "batch"}}) == {"form": "p2s", "p2s": {}}
    # Fields added before the `since`-th are kept in an unused block too: a marker then held them.
    since = list(LATER_FIELDS).index("sample_streams")
    assert without_later_fields(unused, since) == {
        "form": "paper",
        "p2s": {"k": 4, "synthesis": block["synthesis"]},
        "sample_streams": "row",
    }
    # Without the switch beside it a block named like one is kept as it is.
    assert used_settings({"p2s": block}) == {"p2s": block}


@pytest.mark.parametrize("assignment", ["warmup_ratio=nan", "beta=.nan", "rollout.top_p=NaN", "learning_rate=nan"])
def test_nan_is_refused_for_every_float_setting(assignment: str) -> None:
    """A NaN passes every ``x < 0`` check (all comparisons with it are False): refused where values are read."""
    from prorag.stages.rl.config import RLConfig

    with pytest.raises(DataError, match="expected a number, not NaN"):
        apply_overrides(RLConfig(), [assignment])


def test_a_float_setting_still_reads_yaml_exponents_and_infinity() -> None:
    from prorag.stages.rl.config import RLConfig

    assert apply_overrides(RLConfig(), ["learning_rate=3e-6"]).learning_rate == 3e-6
    assert apply_overrides(RLConfig(), ["max_grad_norm=.inf"]).max_grad_norm == float("inf")
