"""require_extra: an optional dependency that is missing stops with one line naming the setting and the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prorag.cli.options import error_line
from prorag.core.extras import MissingExtraError, has_module, require_extra


def test_a_missing_module_names_the_setting_and_the_extra() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require_extra("prorag_no_such_module_xyz", "vllm", needed_by="rollout.backend: vllm", package="vLLM")
    assert str(caught.value) == "rollout.backend: vllm needs vLLM: pip install 'prorag[vllm]'"
    assert error_line(caught.value) == str(caught.value)  # the CLI shows it as this one line (exit 2)


def test_an_installed_module_passes_without_being_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "prorag_probe_extra.py").write_text("raise RuntimeError('imported')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    require_extra("prorag_probe_extra", "probe", needed_by="x: y")  # would raise if it imported the module
    assert "prorag_probe_extra" not in sys.modules


def test_the_package_name_defaults_to_the_module() -> None:
    with pytest.raises(MissingExtraError, match=r"^x: y needs prorag_absent_abc: pip install 'prorag\[abc\]'$"):
        require_extra("prorag_absent_abc", "abc", needed_by="x: y")


def test_a_submodule_of_a_missing_package_is_missing() -> None:
    assert not has_module("prorag_absent_pkg.sub")
    assert has_module("json")
