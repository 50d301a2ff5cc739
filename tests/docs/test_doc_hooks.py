"""The site's hooks (docs/scripts/): doctest fences, Sphinx roles and links to repository files."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_scripts_{name}", ROOT / "docs" / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doctests_are_fenced_up_to_the_blank_line_and_fences_are_left_alone() -> None:
    fence = load("doctest_blocks").fence_doctests
    text = "Intro.\n\n>>> f(1)\n[1]\n\nAfter.\n\n```\n>>> kept\n```\n    >>> g()\n    2"
    assert fence(text) == (
        "Intro.\n\n```pycon\n>>> f(1)\n[1]\n```\n\nAfter.\n\n```\n>>> kept\n```\n    ```pycon\n    >>> g()\n    2\n    ```"
    )
    assert fence("No example.") == "No example."


def test_roles_become_optional_references() -> None:
    hook = load("sphinx_roles").on_page_content
    html = "see :func:<code>~prorag.core.config.load_config</code> and :mod:<code>.tags</code>, not <code>x</code>"
    assert hook(html, page=None, config=None) == (
        'see <autoref identifier="prorag.core.config.load_config" optional><code>load_config</code></autoref> and '
        '<autoref identifier="tags" optional><code>.tags</code></autoref>, not <code>x</code>'
    )


def fake_site(tmp_path: Path) -> SimpleNamespace:
    (tmp_path / "docs" / "api").mkdir(parents=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text("{}")
    (tmp_path / "mkdocs.yml").write_text("")
    return SimpleNamespace(docs_dir=str(tmp_path / "docs"), config_file_path=str(tmp_path / "mkdocs.yml"))


def page(src_uri: str) -> SimpleNamespace:
    return SimpleNamespace(file=SimpleNamespace(src_uri=src_uri))


def test_links_to_repository_files_point_at_their_copies(tmp_path: Path) -> None:
    hook = load("repo_links").on_page_markdown
    config = fake_site(tmp_path)
    md = "[r](../results/r.json#k) [d](LOG.md#x) [w](https://x.org/a) ![i](../results/r.json)\n[ref]: ../results/r.json"
    assert hook(md, page("RESULTS.md"), config) == (
        "[r](_repo/results/r.json#k) [d](LOG.md#x) [w](https://x.org/a) ![i](_repo/results/r.json)\n[ref]: _repo/results/r.json"
    )
    assert hook("[r](../../results/r.json)", page("api/x.md"), config) == "[r](../_repo/results/r.json)"


def test_a_link_to_a_missing_repository_file_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = load("repo_links").on_page_markdown
    with caplog.at_level(logging.WARNING):
        out = hook("[gone](../results/gone.json)", page("RESULTS.md"), fake_site(tmp_path))
    assert out == "[gone](../results/gone.json)"
    assert "no such file" in caplog.text


def test_linked_repository_files_are_added_as_plain_files(tmp_path: Path) -> None:
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files

    fake_site(tmp_path)
    (tmp_path / "README.md").write_text("# readme")
    (tmp_path / "docs" / "index.md").write_text("[r](../results/r.json) [m](../README.md) [gone](../nothing.txt)")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\n")
    config = load_config(config_file=str(tmp_path / "mkdocs.yml"))
    config.plugins._current_plugin = "repo_links"  # what MkDocs sets while it runs a hook
    files = load("repo_links").on_files(get_files(config), config)
    added = {f.src_uri: f for f in files if f.src_uri.startswith("_repo/")}
    assert sorted(added) == ["_repo/README.md", "_repo/results/r.json"]
    assert not any(f.is_documentation_page() for f in added.values())
    assert added["_repo/README.md"].dest_uri == "_repo/README.md"
