"""``report.html``: self-contained, model output escaped."""

from __future__ import annotations

import re
from pathlib import Path


def test_html_is_self_contained_and_escapes_model_output(run_dir: Path) -> None:
    page = (run_dir / "report.html").read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I), "no external resource"
    assert "<link" not in page and not re.search(r"<script[^>]+src", page)
    assert page.count('src="data:image/png;base64,') == 4
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page
    assert "who &lt;b&gt;is&lt;/b&gt; it" in page and "b &lt; c" in page
