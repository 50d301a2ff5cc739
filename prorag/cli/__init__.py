"""The ``prorag`` command line: one command per job, each with ``--help``.

Commands live by concern: :mod:`~prorag.cli.tools` (data, world, index, retrieval, models),
:mod:`~prorag.cli.stages` (one command per stage, built from its config) and
:mod:`~prorag.cli.experiments` (pipeline, demo, ablate, report); :mod:`~prorag.cli.options`
holds what they share. Heavy imports (torch, bm25s, FastAPI) happen inside the commands, so
``prorag --help`` is fast. Bad input ends a command with exit code 2 and a one-line message
(``-v`` shows debug logging and tracebacks).
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from prorag.cli import experiments, stages, tools
from prorag.cli.options import app, show_tracebacks


@app.callback()
def _setup(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and tracebacks.")] = False) -> None:
    show_tracebacks(verbose)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from prorag.core.plugins import load_plugins

    load_plugins()  # PRORAG_PLUGINS and the prorag.plugins entry points: their methods register before any config is read


def main() -> None:
    """The ``prorag`` entry point."""
    app()


__all__ = ["app", "experiments", "main", "stages", "tools"]
