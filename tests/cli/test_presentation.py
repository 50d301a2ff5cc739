"""How the help reads and how fast it comes (prorag/cli/presentation.py): no heavy import for any
``--help``, commands in the order a user meets them, flags without a type, choices listed,
docstring line breaks unwrapped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

from typer.testing import CliRunner

from prorag.cli import app
from prorag.cli.presentation import COMMAND_PANELS, command_order, field_choices, panel_of, unwrap, with_choices
from prorag.core.config import setting
from prorag.core.registry import Registry

runner = CliRunner()

#: What ``--help`` must not import: each takes from a tenth of a second (httpx) to seconds (torch).
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "httpx",
    "scipy",
    "bm25s",
    "fastapi",
    "uvicorn",
    "faiss",
    "datasets",
)

_HELP_SCRIPT = """
import json, sys
from typer.testing import CliRunner
from prorag.cli import app
from typer.main import get_command
group = get_command(app)
names = group.list_commands(None)
failed = [n for n in names if CliRunner().invoke(app, [n, "--help"]).exit_code != 0]
sub = [[n, s] for n in names for s in getattr(group.commands[n], "commands", {})]
failed += [f"{n} {s}" for n, s in sub if CliRunner().invoke(app, [n, s, "--help"]).exit_code != 0]
print(json.dumps({"commands": names, "failed": failed, "modules": sorted({m.split('.')[0] for m in sys.modules})}))
"""


def test_help_of_every_command_imports_no_heavy_package() -> None:
    """Every command's ``--help`` (and the sub-apps' commands') in one fresh process: none imports
    torch, transformers, TRL, httpx, scipy or the servers, which made ``prorag sft --help`` take 13 s."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", _HELP_SCRIPT], capture_output=True, text=True, check=True, env=env)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert not report["failed"], report["failed"]
    assert len(report["commands"]) >= 20
    assert [m for m in HEAVY if m in report["modules"]] == []


def test_commands_are_listed_in_the_order_a_user_meets_them() -> None:
    text = runner.invoke(app, ["--help"]).output
    rows = [line.split()[1] for line in text.splitlines() if line.startswith("│ ") and len(line.split()) > 1]
    positions = [rows.index(name) for name in ("demo", "world", "index", "sft", "rl", "pipeline", "report")]
    assert positions == sorted(positions)
    assert text.index("Start here") < text.index("Data and retrieval") < text.index("Stages") < text.index("Experiments")


def test_every_command_has_a_panel() -> None:
    """A new command must be placed in COMMAND_PANELS (else it lands in 'Other commands', meant for plugins)."""
    from typer.main import get_command

    names = get_command(app).list_commands(None)  # type: ignore[attr-defined]
    assert [n for n in names if panel_of(n) not in COMMAND_PANELS] == []


def test_command_order_puts_unknown_commands_last() -> None:
    assert command_order(["zz-plugin", "rl", "demo", "world"]) == ["demo", "world", "rl", "zz-plugin"]


def test_flags_show_no_type() -> None:
    for args in (["--help"], ["eval", "--help"], ["rl", "--help"], ["world", "--help"]):
        assert "<bool>" not in runner.invoke(app, args).output, args


def test_shortcut_options_list_their_choices() -> None:
    text = " ".join(runner.invoke(app, ["eval", "--help"], terminal_width=400).output.replace("│", " ").split())
    listed = text.split("Choices: ", 1)[1].split(".", 1)[0].split(", ")  # in registration order; a test's plugin may add one
    assert {"naive", "standard-rag", "iter-retgen", "ircot", "flare", "search-o1"} <= set(listed)


def test_unwrap_joins_lines_within_a_paragraph_only() -> None:
    doc = "First line\nends here.\n\nSecond para\n* item one\n* item two\n    code kept"
    assert unwrap(doc) == "First line ends here.\n\nSecond para\n* item one\n* item two\n    code kept"
    assert unwrap(None) is None


def test_help_paragraphs_are_not_cut_mid_sentence() -> None:
    text = runner.invoke(app, ["--help"], env={"COLUMNS": "300"}).output  # wide: a break left is the docstring's
    assert "with the tiny model, on the CPU, no network: prints the paper's Table 2" in text


_KINDS: Registry[object] = Registry("toy kind")
_KINDS.register("alpha", help="a")(object())
_KINDS.register("beta", help="b")(object())


@dataclass
class _Inner:
    style: Literal["plain", "chat"] | None = setting(None, help="style")


@dataclass
class _Toy:
    kind: str = setting("alpha", help="kind", choices=_KINDS)
    inner: _Inner = setting(factory=_Inner, help="inner")
    n: int = setting(1, help="count")


def test_field_choices_reads_registries_and_literals() -> None:
    assert field_choices(_Toy, "kind") == ["alpha", "beta"]
    assert field_choices(_Toy, "inner.style") == ["plain", "chat"]
    assert field_choices(_Toy, "n") is None
    assert field_choices(_Toy, "missing") is None


def test_with_choices_appends_only_what_the_help_does_not_name() -> None:
    assert with_choices("plain or chat.", ["plain", "chat"]) == "plain or chat."
    assert with_choices("A style.", ["plain", "chat"]) == "A style. Choices: plain, chat."
