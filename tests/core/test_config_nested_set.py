"""Dotted ``--set`` into the blocks a config leaves empty or unset (issue 70): one setting of the
served endpoint or the judge without writing the whole block."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from prorag.core.config import apply_overrides, setting
from prorag.core.errors import DataError


def test_dotted_set_reaches_into_the_served_and_judge_blocks() -> None:
    from prorag.cli.options import ConfigSource
    from prorag.cli.stages import SHORTCUTS

    assignments = (
        "generator.kind=served",
        "generator.served.timeout_s=5",
        "generator.served.base_url=http://127.0.0.1:8000/v1",
        "judge.served.model=judge-7b",
        "judge.max_tokens=8",
        "eval.judge.served.api_key_env=null",
    )
    source = ConfigSource("prorag.evaluation.harness:EvalConfig", "eval", None, assignments, SHORTCUTS["eval"])
    cfg = source.load({"served options": lambda c: {**c.generator.served, "model": "m"}})
    assert cfg.generator.served == {"model": "m", "timeout_s": 5, "base_url": "http://127.0.0.1:8000/v1"}
    assert cfg.judge.served == {"model": "judge-7b", "api_key_env": None} and cfg.judge.max_tokens == 8
    assert cfg.generator.build().config.timeout_s == 5.0  # the block is still checked as a ServedConfig when built


@dataclass
class Endpoint:
    base_url: str = setting(help="Where.")
    retries: int = setting(3, help="How often.")


@dataclass
class Block:
    size: int = setting(2, help="How big.")

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"Block.size must be >= 1, got {self.size}")


@dataclass
class Outer:
    options: dict[str, int] = setting(factory=dict, help="Counts.")
    block: Block | None = setting(None, help="An optional block with defaults.")
    endpoint: Endpoint | None = setting(None, help="An optional block with a required field.")
    name: str | None = setting(None, help="A plain optional field.")


def test_dotted_keys_build_unset_blocks_and_check_what_they_can() -> None:
    cfg = apply_overrides(Outer(), ["options.a=1", "options.b=2", "block.size=5"])
    assert cfg.options == {"a": 1, "b": 2} and cfg.block == Block(size=5)
    with pytest.raises(DataError, match=r"--set options.a=x: field 'options': expected"):
        apply_overrides(Outer(), ["options.a=x"])
    with pytest.raises(DataError, match=r"--set block.size=0: Block.size must be >= 1"):
        apply_overrides(Outer(), ["block.size=0"])
    with pytest.raises(DataError, match=r"field 'endpoint' of Outer is not set and has required fields: set it whole"):
        apply_overrides(Outer(), ["endpoint.retries=1"])
    assert apply_overrides(Outer(), ["endpoint={base_url: u}", "endpoint.retries=1"]).endpoint == Endpoint("u", 1)
    with pytest.raises(DataError, match=r"field 'name' of Outer has no sub-fields"):
        apply_overrides(Outer(), ["name.x=1"])
    with pytest.raises(DataError, match=r"entry 'a' of field 'options' of Outer has no sub-fields"):
        apply_overrides(Outer(), ["options.a=1", "options.a.b=2"])
