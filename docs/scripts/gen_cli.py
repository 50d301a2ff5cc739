"""Write docs/CLI.md, the command reference, from the ``--help`` of every ``prorag`` command and subcommand.

Run from the repository root: ``python docs/scripts/gen_cli.py`` (``--check`` only reports whether
CLI.md is current; tests/docs/test_cli_reference.py runs that). The help is rendered in this process
the way a terminal shows it, made deterministic: 100 columns, no colour, program name ``prorag``,
trailing spaces removed, no ``PRORAG_PLUGINS`` (a user's plugins would add choices). The environment is
set before Typer is imported, since Typer reads it then.
Commands come in the order ``prorag --help`` lists them; hidden ones are left out.
"""

from __future__ import annotations

import os

os.environ.update({"TERMINAL_WIDTH": "100", "COLUMNS": "100", "_TYPER_FORCE_DISABLE_TERMINAL": "1", "NO_COLOR": "1"})
for _name in ("FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS", "TYPER_USE_RICH", "PRORAG_PLUGINS"):
    os.environ.pop(_name, None)

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "CLI.md"
REGENERATE = "python docs/scripts/gen_cli.py"


def command_paths() -> list[tuple[str, ...]]:
    """Every visible command and group below the root, as argument paths, depth first in listed order.

    Groups are recognised by their ``list_commands`` (Typer may ship its own copy of Click, so
    ``isinstance(cmd, click.Group)`` is not a test)."""
    import typer

    from prorag.cli import app

    root = typer.main.get_command(app)
    out: list[tuple[str, ...]] = []

    def walk(group: Any, path: tuple[str, ...], ctx: typer.Context) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            out.append((*path, name))
            if hasattr(cmd, "list_commands"):
                walk(cmd, (*path, name), typer.Context(cmd, info_name=name, parent=ctx))

    walk(root, (), typer.Context(root, info_name="prorag"))
    return out


def help_text(path: tuple[str, ...]) -> str:
    """``prorag PATH --help`` as printed, trailing spaces and blank edges removed."""
    from typer.testing import CliRunner

    from prorag.cli import app

    result = CliRunner().invoke(app, [*path, "--help"], prog_name="prorag", terminal_width=100)
    if result.exit_code != 0:
        raise RuntimeError(f"prorag {' '.join(path)} --help exited {result.exit_code}: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")


def render() -> str:
    """The whole of docs/CLI.md."""
    paths = command_paths()
    toc = "\n".join(f"{'    ' * (len(p) - 1)}- [`prorag {' '.join(p)}`](#{'-'.join(('prorag', *p))})" for p in paths)
    sections = [f"## prorag\n\n```text\n{help_text(())}\n```"]
    sections += [f"{'#' * min(len(p) + 1, 3)} prorag {' '.join(p)}\n\n```text\n{help_text(p)}\n```" for p in paths]
    head = (
        "# Command line reference\n\n"
        f"<!-- Written by docs/scripts/gen_cli.py from the commands' own --help: run `{REGENERATE}` after changing a command. -->\n\n"
        "Every command's `--help`, as a 100-column terminal shows it. A command configured by a config class\n"
        "takes `--config FILE` and repeatable `--set KEY=VALUE` over every field listed under its Settings;\n"
        "`python -m prorag.cli` is the same program as `prorag`.\n\n"
        f"{toc}\n"
    )
    return head + "\n" + "\n\n".join(sections) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 if docs/CLI.md is not current; write nothing.")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"docs/CLI.md is not what the commands print now; run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the checkout's prorag, whatever is installed
    sys.exit(main())
