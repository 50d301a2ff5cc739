"""Griffe extension: the doctest examples of the package's docstrings shown as code blocks.

The docstrings hold bare ``>>>`` examples (run by doctest), which Markdown would read as prose:
``[1, 2]`` after ``[x for x in y]`` even looks like a reference link. Each run of lines from a
``>>>`` line to the next blank line becomes a fenced ``pycon`` block at the same indentation; text
already inside a fence is left alone. Loaded by mkdocstrings through ``mkdocs.yml``.
"""

from __future__ import annotations

from typing import Any

import griffe

FENCE = "```"


def fence_doctests(text: str) -> str:
    """``text`` with every doctest example (``>>>`` up to a blank line) inside a ``pycon`` fence."""
    out: list[str] = []
    in_fence = in_example = False
    indent = ""
    for line in text.split("\n"):
        stripped = line.strip()
        if in_example and not stripped:
            out.append(indent + FENCE)
            in_example = False
        elif not in_example and stripped.startswith(FENCE):
            in_fence = not in_fence
        elif not in_fence and not in_example and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + FENCE + "pycon")
            in_example = True
        out.append(line)
    if in_example:
        out.append(indent + FENCE)
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fence the doctest examples of every object's docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
