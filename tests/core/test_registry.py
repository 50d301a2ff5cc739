import sys
import types

import pytest

from prorag.core.registry import Registry


def test_register_and_get():
    reg: Registry[object] = Registry("estimator")

    @reg.register("a")
    def a() -> int:
        return 1

    assert reg.get("a") is a
    assert reg.names() == ["a"]
    assert "a" in reg and "b" not in reg


def test_unknown_name_lists_the_known_ones_and_suggests():
    reg: Registry[int] = Registry("estimator")
    reg.register("grpo")(1)
    reg.register("dual")(2)
    with pytest.raises(ValueError, match=r"unknown estimator 'grp'; expected one of \['grpo', 'dual'\]; did you mean 'grpo'"):
        reg.get("grp")


def test_taken_name_is_refused_unless_replaced():
    reg: Registry[int] = Registry("source")
    reg.register("x")(1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x")(2)
    reg.register("x", replace=True)(3)
    assert reg.get("x") == 3


def test_builtins_are_imported_on_first_lookup(tmp_path, monkeypatch):
    host = types.ModuleType("registry_test_host")
    host.REG = Registry("thing", builtins=("registry_test_plugin",))
    monkeypatch.setitem(sys.modules, "registry_test_host", host)
    (tmp_path / "registry_test_plugin.py").write_text(
        "import registry_test_host\nregistry_test_host.REG.register('from-plugin')(42)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert host.REG.get("from-plugin") == 42
    assert host.REG.names() == ["from-plugin"]
