"""The ``prorag`` command line: one command per job, each with ``--help``.

Commands live by concern: :mod:`~prorag.cli.tools` (data, world, index, retrieval, models),
:mod:`~prorag.cli.stages` (one command per stage, built from its config) and
:mod:`~prorag.cli.experiments` (pipeline, demo, ablate, report); :mod:`~prorag.cli.options`
holds what they share. Heavy imports (torch, bm25s, FastAPI) happen inside the commands, so
``prorag --help`` is fast. Bad input ends a command with exit code 2 and a one-line message
(``-v`` shows debug logging and tracebacks). The root command loads the plugins
(:func:`~prorag.core.plugins.load_plugins`: ``--plugin``, ``PRORAG_PLUGINS``, entry points)
before any subcommand parses its options, so their registered names are valid choices, and
passes ``--plugin`` on to the processes a command starts.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Annotated

import typer

from prorag.cli import experiments, stages, tools
from prorag.cli.options import app, show_tracebacks
from prorag.core.plugins import PluginError, export_plugins, load_plugins


@app.callback()
def _setup(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and tracebacks.")] = False,
    plugin: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            metavar="MODULE",
            help="Import MODULE first (repeatable), so what it registers (a data format, a reward, ...) can be named;"
            " also PRORAG_PLUGINS=MOD1,MOD2 and entry points of group prorag.plugins.",
        ),
    ] = None,
) -> None:
    show_tracebacks(verbose)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        load_plugins(plugin or ())
        export_plugins(plugin or ())
    except PluginError as e:
        if verbose:
            traceback.print_exc(file=sys.stderr)
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None


def main() -> None:
    """The ``prorag`` entry point."""
    app()


__all__ = ["app", "experiments", "main", "stages", "tools"]
