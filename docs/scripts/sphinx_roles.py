"""MkDocs hook: the package's Sphinx-style roles (``:func:`~prorag.x.f```) shown as code, linked when they resolve.

The docstrings are written for reading in the source, with Sphinx roles; Markdown renders a role
as ``:func:`` followed by a code span. This hook rewrites that HTML into an optional
cross-reference: a dotted name that the API reference documents becomes a link, any other name
(relative, or of another library) stays a code span, without a warning. A leading ``~`` shows the
last component only, as in Sphinx.
"""

from __future__ import annotations

import re
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.pages import Page

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):<code>(?P<tilde>~?)(?P<name>[\w.]+)</code>")


def on_page_content(html: str, page: Page, config: MkDocsConfig, **kwargs: Any) -> str:
    """Rewrite every role into an optional autorefs reference (resolved by mkdocs-autorefs later)."""

    def rewrite(m: re.Match[str]) -> str:
        name = m["name"].lstrip(".")
        shown = name.rsplit(".", 1)[-1] if m["tilde"] else m["name"]
        return f'<autoref identifier="{name}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(rewrite, html)
