"""The import-on-first-use stand-ins (prorag/core/lazy_modules.py)."""

from __future__ import annotations

import sys

import pytest

from prorag.core.lazy_modules import LazyModule, lazy_exports, lazy_module


def test_lazy_module_imports_on_first_attribute_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    mod = lazy_module("colorsys")
    assert isinstance(mod, LazyModule) and "colorsys" not in sys.modules and "not imported" in repr(mod)
    assert mod.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert "colorsys" in sys.modules and "imported" in repr(mod)


def test_lazy_module_of_a_missing_module_fails_when_used() -> None:
    mod = lazy_module("prorag_no_such_module")
    with pytest.raises(ModuleNotFoundError):
        mod.anything  # noqa: B018


def test_lazy_exports_import_the_named_module_only() -> None:
    getattr_, dir_ = lazy_exports("pkg", {"dumps": "json", "sqrt": "math"})
    assert getattr_("sqrt")(9.0) == 3.0
    assert dir_() == ["dumps", "sqrt"]
    with pytest.raises(AttributeError, match="'pkg' has no attribute 'loads'"):
        getattr_("loads")


def test_stage_packages_import_their_config_without_the_trainer() -> None:
    """``prorag.stages.rl.config`` alone: the package's trainer modules are imported only when named."""
    import subprocess

    code = "import sys, prorag.stages.rl.config as c; print(int('prorag.stages.rl.trainer' in sys.modules), int('torch' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "0"]
    from prorag.stages.rl import RLConfig, train_rl

    assert RLConfig.__module__ == "prorag.stages.rl.config" and callable(train_rl)
