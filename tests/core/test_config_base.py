"""A config file composed onto a base file (``base: FILE``): the base's settings, then the file's own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from prorag.core.config import load_config
from prorag.core.errors import DataError
from prorag.stages.sft_config import SFTConfig


@dataclasses.dataclass
class Inner:
    a: int = 1
    b: str = "x"


@dataclasses.dataclass
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)
    steps: int = 10
    tags: dict[str, int] = dataclasses.field(default_factory=dict)
    note: str | None = None


@dataclasses.dataclass
class WithBaseField:
    base: str = "field"


def files(tmp_path: Path, **texts: str) -> dict[str, Path]:
    out = {}
    for name, text in texts.items():
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


def test_a_file_overrides_its_base_key_by_key(tmp_path: Path) -> None:
    f = files(
        tmp_path,
        full="inner:\n  a: 2\n  b: y\nsteps: 20\ntags: {p: 1}\nnote: kept\n",
        quick="base: full.yaml\ninner:\n  a: 3\nsteps: 5\ntags: {q: 2}\nnote: null\n",
    )
    assert load_config(f["full"], Outer) == Outer(Inner(2, "y"), 20, {"p": 1}, "kept")
    # A nested mapping sets only what it names (inner.b stays the base's); a scalar replaces, null too.
    assert load_config(f["quick"], Outer) == Outer(Inner(3, "y"), 5, {"p": 1, "q": 2}, None)


def test_a_base_may_have_its_own_base_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    f = files(tmp_path, top="steps: 1\ninner: {b: z}\n")
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../top.yaml\nsteps: 2\n")
    f |= files(tmp_path, leaf="base: sub/mid.yaml\ninner: {a: 7}\n")
    assert load_config(f["leaf"], Outer) == Outer(Inner(7, "z"), 2)


def test_errors_name_the_file_and_line_that_holds_them(tmp_path: Path) -> None:
    f = files(tmp_path, bad_base="steps: 1\nstesp: 2\n", child="base: bad_base.yaml\nsteps: 3\n")
    with pytest.raises(DataError, match=r"bad_base\.yaml:2.*unknown key 'stesp'"):
        load_config(f["child"], Outer)
    f = files(tmp_path, good="steps: 1\n", child2="steps: 3\nbase: good.yaml\ninner: {c: 1}\n")
    with pytest.raises(DataError, match=r"child2\.yaml:3.*unknown key 'c'"):
        load_config(f["child2"], Outer)
    f = files(tmp_path, nobase="base: missing.yaml\n")
    with pytest.raises(DataError, match=r"missing\.yaml.*no such file"):
        load_config(f["nobase"], Outer)
    f = files(tmp_path, notpath="steps: 1\nbase: [a]\n")
    with pytest.raises(DataError, match=r"notpath\.yaml:2.*field 'base'"):
        load_config(f["notpath"], Outer)


def test_a_base_that_leads_back_is_refused(tmp_path: Path) -> None:
    f = files(tmp_path, one="base: two.yaml\nsteps: 1\n", two="base: one.yaml\nsteps: 2\n", me="base: me.yaml\n")
    with pytest.raises(DataError, match="leads back"):
        load_config(f["one"], Outer)
    with pytest.raises(DataError, match="leads back"):
        load_config(f["me"], Outer)


def test_a_config_with_a_field_named_base_reads_it_as_that_field(tmp_path: Path) -> None:
    f = files(tmp_path, c="base: other.yaml\n")
    assert load_config(f["c"], WithBaseField) == WithBaseField("other.yaml")
    # ... and a stage config has no such field: `base` composes.
    assert "base" not in {g.name for g in dataclasses.fields(SFTConfig)}
