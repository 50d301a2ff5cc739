"""How the help reads and how fast it comes (prorag/cli/presentation.py): no heavy import for any
``--help``, commands in the order a user meets them, one section per panel, flags without a type,
choices listed, docstring line breaks unwrapped, every config field under Settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from prorag.cli import app
from prorag.cli.presentation import (
    COMMAND_PANELS,
    ProragGroup,
    command_order,
    field_choices,
    panel_of,
    summary,
    taken_as_given,
    unwrap,
    with_choices,
)
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
    # a few hundredths of a second each, and nothing a help needs: typer coerces option values
    # through pydantic (the groups' own options are taken as given), typer's rich panels import
    # rich with markdown-it and pygments (the help is plain), the progress bars import asyncio
    "pydantic",
    "rich",
    "tqdm",
    "asyncio",
    "yaml",
    "numpy",
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


def _listed(text: str) -> list[str]:
    """The command names of a group's help: the rows of its sections, options excluded."""
    rows = [line for line in text.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    return [line.split()[0] for line in rows if not line.lstrip().startswith("-")]


def test_commands_are_listed_in_the_order_a_user_meets_them() -> None:
    text = runner.invoke(app, ["--help"]).output
    rows = _listed(text)
    positions = [rows.index(name) for name in ("demo", "world", "index", "sft", "rl", "pipeline", "report")]
    assert positions == sorted(positions)
    headings = [f"{panel}:" for panel in COMMAND_PANELS]
    assert all(h in text.splitlines() for h in headings), headings
    assert [text.index(h) for h in headings] == sorted(text.index(h) for h in headings)


def test_command_summaries_start_at_one_column_in_every_section() -> None:
    """One column for the summaries of every panel (each section measured alone would start its
    own), each summary the command's whole first paragraph: "(Eq. 4)" is no sentence end."""
    lines = runner.invoke(app, ["--help"], terminal_width=100).output.splitlines()
    names = set(get_command(app).list_commands(None))  # type: ignore[attr-defined]
    starts = {len(line) - len(line.split(None, 1)[1]) for line in lines if line.strip() and line.split()[0] in names}
    assert len(starts) == 1, starts
    assert "with the pairwise loss (Eq. 4). prm-audit" in " ".join(" ".join(lines).split())


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
    # a paragraph whose breaks stay starts with click's no-rewrap marker
    assert unwrap(doc) == "First line ends here.\n\n\b\nSecond para\n* item one\n* item two\n    code kept"
    assert unwrap(None) is None


def test_help_paragraphs_are_not_cut_mid_sentence() -> None:
    text = runner.invoke(app, ["demo", "--help"], terminal_width=300).output  # wide: a break left is the docstring's
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


def test_list_items_keep_their_lines_in_the_help() -> None:
    """A docstring's list survives click's rewrapping (the paragraph is marked no-rewrap)."""
    toy = typer.Typer(cls=ProragGroup, rich_markup_mode=None)

    @toy.command("toy")
    def _toy() -> None:
        """Do a thing.

        It writes:
        - one.jsonl
        - two.jsonl
        """

    @toy.command("other")
    def _other() -> None:
        """Another."""

    text = CliRunner().invoke(toy, ["toy", "--help"], terminal_width=100).output
    assert "It writes:\n  - one.jsonl\n  - two.jsonl" in text


def test_config_fields_are_listed_under_settings_one_row_each() -> None:
    text = runner.invoke(app, ["rl", "--help"], terminal_width=200).output
    settings = text.split("Settings (--set KEY=VALUE; KEY may start with 'rl.'):", 1)[1]
    assert "Precedence: defaults < --config file < shortcut options < --set." in settings
    rows = {line.split()[0]: line for line in settings.splitlines() if line.startswith("  ") and line.split()}
    assert "(float, default 1.0) Sampling temperature" in rows["rollout.temperature"]
    assert "(float, default 0.3)" in rows["beta"]


def test_summary_is_the_whole_first_paragraph_cut_at_a_word() -> None:
    class _Cmd:
        short_help = None
        help = "Train the PRM with the pairwise loss (Eq. 4).\nSecond line.\n\nDetails."

    assert summary(_Cmd) == "Train the PRM with the pairwise loss (Eq. 4). Second line."
    _Cmd.help = "word " * 100
    cut = summary(_Cmd)
    assert cut.endswith("word...") and len(cut) <= 243


def test_root_options_reach_the_sub_command_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's --plugin and -v are taken as given, not coerced by typer's pydantic adapters:
    the plugins are still loaded (and exported to the processes a command starts)."""
    monkeypatch.delenv("PRORAG_PLUGINS", raising=False)  # restored after the test: --plugin exports
    result = runner.invoke(app, ["-v", "--plugin", "json", "--plugin", "csv", "world", "--help"])
    assert result.exit_code == 0, result.output
    assert os.environ["PRORAG_PLUGINS"] == "json,csv"
    group = get_command(app)
    params = taken_as_given(group.get_params(typer.Context(group)))
    plugin = next(p for p in params if p.name == "plugin")
    if hasattr(plugin, "get_runtime_param"):  # typer >= 0.29
        assert plugin.get_runtime_param().coerce(("a", "b"), param=plugin, ctx=None) == ("a", "b")
