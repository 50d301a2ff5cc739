"""Write the API reference: one page per subpackage of ``prorag`` (``docs/api/NAME.md``) and their nav entries.

Run from the repository root: ``python docs/scripts/gen_api.py`` (``--check`` only reports whether the
pages are current; tests/docs/test_api_pages.py runs that). A page is one mkdocstrings directive,
``::: prorag.NAME`` (its heading the page's title), whose ``show_submodules`` option renders every module of the subpackage, so moving
a module inside a subpackage needs no regeneration; adding, removing or renaming a subpackage does.
Pages are ordered by layer, lowest first, as ``tests/test_layers.py`` lists them (read, not imported;
a subpackage it does not name goes last), and the nav block between the markers of ``mkdocs.yml`` is
rewritten to match.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "prorag"
API_DIR = ROOT / "docs" / "api"
MKDOCS = ROOT / "mkdocs.yml"
BEGIN = "      # BEGIN API pages (written by docs/scripts/gen_api.py)"
END = "      # END API pages"
HEADER = "<!-- Written by docs/scripts/gen_api.py: run `python docs/scripts/gen_api.py` after adding a subpackage. -->"
REGENERATE = "python docs/scripts/gen_api.py"


def subpackages() -> list[str]:
    """The top-level subpackages of ``prorag`` (folders with an ``__init__.py``), in layer order."""
    names = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    order = layer_order()
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def layer_order() -> list[str]:
    """Subpackage names in the order of ``LAYERS`` in tests/test_layers.py; empty when it has none.

    Read with :mod:`ast` so the script imports neither the tests nor the package."""
    path = ROOT / "tests" / "test_layers.py"
    if not path.exists():
        return []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "LAYERS" and node.value is not None:
            layers = ast.literal_eval(node.value)
            return [name.split(".", 1)[1] for layer in layers for name in layer if name.startswith("prorag.")]
    return []


def summary(name: str) -> str:
    """The first sentence of a subpackage's docstring, on one line: up to a full stop followed by a
    capital letter (so that "e.g. the" does not end it), within the first paragraph."""
    doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text(encoding="utf-8"))) or ""
    return re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(doc.split("\n\n")[0].split()), maxsplit=1)[0]


def page(name: str) -> str:
    """The page of one subpackage."""
    return f"{HEADER}\n\n::: prorag.{name}\n"


def index(names: list[str]) -> str:
    """The API reference's first page: the package root's docstring and one line per subpackage."""
    rows = "\n".join(f"- [`prorag.{n}`]({n}.md): {summary(n)}" for n in names)
    return (
        f"{HEADER}\n\n# API reference\n\n"
        "Generated from the docstrings. The subpackages are layers, lowest first: a module imports only\n"
        "from its own layer and those above it in this list ([Architecture](../ARCHITECTURE.md)).\n\n"
        f"{rows}\n\n::: prorag\n    options:\n      show_submodules: false\n      heading_level: 2\n"
    )


def nav_block(names: list[str]) -> str:
    """The lines of mkdocs.yml between the markers (markers included)."""
    return "\n".join([BEGIN, *(f"      - prorag.{n}: api/{n}.md" for n in names), END])


def expected() -> dict[Path, str]:
    """Every file the script writes, with its content."""
    names = subpackages()
    files = {API_DIR / f"{n}.md": page(n) for n in names}
    files[API_DIR / "index.md"] = index(names)
    text = MKDOCS.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    if BEGIN not in text or END not in rest:
        raise SystemExit(f"mkdocs.yml lacks the markers {BEGIN.strip()!r} ... {END.strip()!r}")
    tail = rest.partition(END)[2]
    files[MKDOCS] = head + nav_block(names) + tail
    return files


def stale() -> list[str]:
    """What differs from :func:`expected`: files to write and pages of subpackages that are gone."""
    want = expected()
    out = [str(p.relative_to(ROOT)) for p, text in want.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    out += [f"{p.relative_to(ROOT)} (no such subpackage)" for p in sorted(API_DIR.glob("*.md")) if p not in want]
    return out


def write() -> None:
    """Write the pages and the nav block; delete pages of subpackages that no longer exist."""
    want = expected()
    API_DIR.mkdir(parents=True, exist_ok=True)
    for p in API_DIR.glob("*.md"):
        if p not in want:
            p.unlink()
    for p, text in want.items():
        p.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 if the pages are not current; write nothing.")
    if parser.parse_args().check:
        out = stale()
        if out:
            print(f"stale API reference: {', '.join(out)}; run `{REGENERATE}`", file=sys.stderr)
        return 1 if out else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
