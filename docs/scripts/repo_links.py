"""MkDocs hook: links from a page to a repository file outside ``docs/`` (``../results/x.json``) work and are checked.

MkDocs only knows the files under ``docs/``; a link that leaves it is reported as not found. This
hook copies every such target that exists into the site under ``_repo/`` (as a plain file, a
Markdown one too) and points the link there, so the built site is self-contained; a target that
does not exist is a warning, hence an error under ``mkdocs build --strict``. Inline links, images
and reference definitions count; external URLs, anchors and links inside ``docs/`` are MkDocs' own
business.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.repo_links")

#: Where copied repository files land in the site.
PREFIX = "_repo"
#: ``](target)`` / ``](target "title")`` of inline links and images, and ``[id]: target`` definitions.
LINK = re.compile(r"(?P<head>\]\(\s*<?|^\s{0,3}\[[^\]]+\]:\s*<?)(?P<target>[^)\s>]+)", re.MULTILINE)
EXTERNAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//|#)")


class RepoFile(File):
    """A repository file copied into the site as is: never a page, even when it is Markdown."""

    def is_documentation_page(self) -> bool:
        return False


def _repo_target(page_src_uri: str, target: str, docs_dir: Path, root: Path) -> tuple[str, str] | None:
    """``(path relative to the repository root, fragment)`` when ``target``, read from the page
    ``page_src_uri``, leaves ``docs_dir`` but stays in the repository; None otherwise."""
    if EXTERNAL.match(target):
        return None
    path, _, fragment = target.partition("#")
    resolved = (docs_dir / posixpath.dirname(page_src_uri) / path).resolve()
    if resolved.is_relative_to(docs_dir.resolve()) or not resolved.is_relative_to(root):
        return None
    return resolved.relative_to(root).as_posix(), fragment


def _roots(config: MkDocsConfig) -> tuple[Path, Path]:
    return Path(config.docs_dir), Path(config.config_file_path).resolve().parent


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    """Add every existing repository file a page links to as ``_repo/PATH``."""
    docs_dir, root = _roots(config)
    wanted: set[str] = set()
    for f in files.documentation_pages():
        if f.abs_src_path is None:  # a page another plugin generated: no source to read
            continue
        for m in LINK.finditer(Path(f.abs_src_path).read_text(encoding="utf-8")):
            hit = _repo_target(f.src_uri, m["target"], docs_dir, root)
            if hit is not None and (root / hit[0]).is_file():
                wanted.add(hit[0])
    for rel in sorted(wanted):
        files.append(RepoFile.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(root / rel)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **kwargs: Any) -> str:
    """Point links to repository files at their copies; warn about those that do not exist."""
    docs_dir, root = _roots(config)

    def rewrite(m: re.Match[str]) -> str:
        hit = _repo_target(page.file.src_uri, m["target"], docs_dir, root)
        if hit is None:
            return m[0]
        rel, fragment = hit
        if not (root / rel).is_file():
            log.warning("%s links to %r: no such file in the repository", page.file.src_uri, m["target"])
            return m[0]
        new = posixpath.relpath(f"{PREFIX}/{rel}", posixpath.dirname(page.file.src_uri) or ".")
        return m["head"] + new + (f"#{fragment}" if fragment else "")

    return LINK.sub(rewrite, markdown)
