"""Plugins: modules named by argument, by PRORAG_PLUGINS and by entry points, each imported once."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prorag.core.plugins import ENV_VAR, PluginError, export_plugins, load_plugins, plugins_from_env


def write_plugin(folder: Path, name: str, log: Path) -> None:
    """A plugin module whose import appends its name to ``log`` (so imports can be counted)."""
    (folder / f"{name}.py").write_text(
        f"from pathlib import Path\nwith Path({str(log)!r}).open('a') as f:\n    f.write({name!r} + '\\n')\n", encoding="utf-8"
    )


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for plugin modules; the modules named ``plug_*`` are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ENV_VAR, raising=False)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("plug_")]:
        del sys.modules[name]


def test_env_then_arguments_each_once(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = plugin_dir / "log.txt"
    for name in ("plug_a", "plug_b", "plug_c"):
        write_plugin(plugin_dir, name, log)
    monkeypatch.setenv(ENV_VAR, " plug_b , ,plug_a")
    assert plugins_from_env() == ["plug_b", "plug_a"]
    assert load_plugins(["plug_c", "plug_a"]) == ["plug_b", "plug_a", "plug_c"]
    assert load_plugins(["plug_c"]) == ["plug_b", "plug_a", "plug_c"]  # again: nothing imported twice
    assert log.read_text().split() == ["plug_b", "plug_a", "plug_c"]
    assert plugins_from_env() == ["plug_b", "plug_a"]  # loading changes no environment
    export_plugins(["plug_c", "plug_a", "plug_c"])
    assert plugins_from_env() == ["plug_b", "plug_a", "plug_c"]  # what a worker process started now loads


def test_entry_points(plugin_dir: Path) -> None:
    log = plugin_dir / "log.txt"
    write_plugin(plugin_dir, "plug_ep", log)
    dist = plugin_dir / "toyplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("[prorag.plugins]\ntoy = plug_ep\n", encoding="utf-8")
    assert load_plugins() == ["plug_ep"]
    assert log.read_text().split() == ["plug_ep"]


def test_a_missing_plugin_names_where_it_was_asked_for(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PluginError, match=r"plugin 'plug_missing' \(from --plugin\) failed to load: ModuleNotFoundError"):
        load_plugins(["plug_missing"])
    monkeypatch.setenv(ENV_VAR, "plug_broken")
    (plugin_dir / "plug_broken.py").write_text("raise ValueError('half written')\n", encoding="utf-8")
    with pytest.raises(PluginError, match=r"'plug_broken' \(from \$PRORAG_PLUGINS\) failed to load: ValueError: half written"):
        load_plugins()
