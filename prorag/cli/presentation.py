"""How ``prorag --help`` and each command's ``--help`` read, and that they come fast: commands in
the order a user meets them, one section per panel; help paragraphs that wrap instead of breaking
where the docstring broke; flags without a type; the allowed values of every option that has a
fixed set.

The help is click's plain text (the apps set ``rich_markup_mode=None``): typer's rich panels cost
about half a second to import and draw, and plain text reads the same through ``| grep``.
:class:`ProragGroup` is the root app's click group: it lists the commands of
:data:`COMMAND_PANELS` in that order (a plugin's command, unknown here, last, in its own section)
and tidies each command the first time it is looked up (:func:`tidy_command`), so every command,
however it was declared, reads the same. A config command adds the allowed values of its shortcut
options from the field each one sets (:func:`field_choices`) when its help is shown: plugins have
registered by then.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, get_args, get_origin

from typer.core import TyperGroup

#: Panel -> its commands, in the order a user meets them: the demo first, then the data and the
#: retrieval it runs on, the stages in pipeline order, the experiments that chain them.
COMMAND_PANELS: dict[str, tuple[str, ...]] = {
    "Start here": ("demo",),
    "Data and retrieval": ("world", "data", "corpus", "index", "retrieve", "serve-retriever", "models"),
    "Stages, in pipeline order": (
        "sft-data",
        "sft",
        "eval",
        "mcts",
        "mcts-show",
        "pairs",
        "prm",
        "prm-audit",
        "rft",
        "rl",
        "dpo",
    ),
    "Experiments": ("pipeline", "ablate", "compare", "table1", "report"),
}
#: The panel of a command :data:`COMMAND_PANELS` does not name (a plugin's).
OTHER_PANEL = "Other commands"


def command_order(names: list[str]) -> list[str]:
    """``names`` in :data:`COMMAND_PANELS`' order, the ones it does not name after them as given."""
    known = [name for panel in COMMAND_PANELS.values() for name in panel]
    return [n for n in known if n in names] + [n for n in names if n not in known]


def panel_of(name: str) -> str:
    """The help panel a command is listed in."""
    return next((panel for panel, names in COMMAND_PANELS.items() if name in names), OTHER_PANEL)


def unwrap(text: str | None) -> str | None:
    """Help text with each paragraph on one line: the help formatter then wraps it to the terminal,
    where a docstring's own line breaks would cut sentences in the middle. Paragraphs (blank lines)
    stay; a line that starts a list item (``*``, ``-``) or an indented block keeps its break, and
    its paragraph starts with click's no-rewrap marker (``\\b``) so the formatter keeps them too."""
    if not text:
        return text
    paragraphs = []
    for para in typing.cast(str, text).strip().split("\n\n"):
        lines = [line.rstrip() for line in para.split("\n")]
        out: list[str] = []
        for line in lines:
            keeps_break = line.lstrip().startswith(("* ", "- ")) or line.startswith("  ")
            if out and not keeps_break:
                out[-1] = f"{out[-1]} {line.strip()}"
            else:
                out.append(line.strip() if not line.startswith("  ") else line)
        paragraphs.append("\n".join(out) if len(out) == 1 else "\b\n" + "\n".join(out))
    return "\n\n".join(paragraphs)


def tidy_command(command: Any) -> Any:
    """Unwrap ``command``'s help, drop the type shown beside its flags (a flag takes no value), and
    put it in its panel; again for the commands of a sub-app. Idempotent."""
    if getattr(command, "_prorag_tidy", False):
        return command
    command.help = unwrap(command.help)
    command.short_help = unwrap(command.short_help)
    command.get_params = _flags_untyped(command.get_params)
    for sub in getattr(command, "commands", {}).values():  # a sub-app (data, corpus, models)
        tidy_command(sub)
    command._prorag_tidy = True  # type: ignore[attr-defined]
    return command


def _flags_untyped(get_params: Any) -> Any:
    """``get_params`` whose flags (``--help`` included: click adds it when asked) show no type."""

    def untyped(ctx: Any) -> list[Any]:
        params = get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False):
                param.metavar = ""
        return params

    return untyped


def field_choices(cls: type, path: str) -> list[str] | None:
    """The allowed values of the config field ``path`` (``rollout.prompt_style``) of dataclass
    ``cls``: its registry's names (``choices`` metadata), else the values of a ``Literal`` type;
    ``None`` for a field without a fixed set."""
    head, _, rest = path.partition(".")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if head not in fields:
        return None
    hints = typing.get_type_hints(cls)
    if rest:
        inner = hints.get(head)
        return field_choices(inner, rest) if dataclasses.is_dataclass(inner) else None
    registry = fields[head].metadata.get("choices")
    if registry is not None:
        return list(registry.names())
    return _literal_values(hints.get(head))


def _literal_values(tp: Any) -> list[str] | None:
    """The string values of a ``Literal`` type, also inside ``X | None``; ``None`` otherwise."""
    if get_origin(tp) is Literal:
        return [str(v) for v in get_args(tp)]
    literals = [a for a in get_args(tp) if get_origin(a) is Literal]
    return [str(v) for v in get_args(literals[0])] if len(literals) == 1 else None


def with_choices(help_text: str | None, choices: list[str]) -> str:
    """``help_text`` followed by the allowed values, unless it already names every one."""
    text = help_text or ""
    if all(f"{c}" in text for c in choices):
        return text
    return f"{text} Choices: {', '.join(choices)}.".strip()


def summary(command: Any) -> str:
    """The line a command is listed with: its ``short_help``, else the first paragraph of its help,
    whole (click's default stops at the first word ending in a period, "(Eq." included, and cuts
    at the terminal's width minus the longest name); past :data:`_SUMMARY` characters, cut at a
    word with "..."."""
    text = command.short_help or (command.help or "").split("\n\n")[0]
    words = " ".join(text.replace("\b", " ").split())
    if len(words) <= _SUMMARY:
        return words
    return words[:_SUMMARY].rsplit(" ", 1)[0] + "..."


#: Longest summary shown in a command list (characters).
_SUMMARY = 240


def command_rows(group: Any, ctx: Any) -> list[tuple[str, str, str]]:
    """``(panel, name, summary)`` of each visible command of ``group``, in its listing order;
    the names padded to one width, so that every panel's column starts at the same place."""
    rows = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        rows.append((panel_of(name), name, summary(command)))
    width = max((len(name) for _, name, _ in rows), default=0)
    return [(panel, name.ljust(width), text) for panel, name, text in rows]


class _AsGiven:
    """A group's own options' coercion: their values as click parsed them. typer (0.29) coerces
    every option value through a pydantic adapter built on first use; importing pydantic for the
    groups' ``--help`` flag and the root's ``--plugin`` (module names, nothing to convert) was a
    tenth of a second of every ``prorag COMMAND --help``. Follows typer's ``RuntimeParam.coerce``
    call; unused by a typer without it (click then converts, as before)."""

    @staticmethod
    def coerce(value: Any, *args: Any, **kwargs: Any) -> Any:
        return value


_AS_GIVEN = _AsGiven()


def taken_as_given(params: list[Any]) -> list[Any]:
    """``params`` with each flag and ``--plugin`` coerced by :class:`_AsGiven`: a group's own
    options, parsed before any sub-command, also on the way to a sub-command's ``--help``."""
    for param in params:
        if (getattr(param, "is_flag", False) or param.name == "plugin") and hasattr(param, "get_runtime_param"):
            param.get_runtime_param = lambda: _AS_GIVEN
    return params


class SubGroup(TyperGroup):
    """A sub-app's command group (``data``, ``corpus``, ``models``): commands with their whole
    first sentence; its ``--help`` flag taken as given (:func:`taken_as_given`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return taken_as_given(super().get_params(ctx))

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, text) for _, name, text in command_rows(self, ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class ProragGroup(TyperGroup):
    """The root command group: commands in :data:`COMMAND_PANELS`' order, one help section per
    panel, each command tidied; the root options taken as given (:func:`taken_as_given`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return taken_as_given(super().get_params(ctx))

    def list_commands(self, ctx: Any) -> list[str]:
        return command_order(list(self.commands))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        return tidy_command(command) if command is not None else None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        tidy_command(self)
        super().format_help(ctx, formatter)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = command_rows(self, ctx)
        for panel in [*COMMAND_PANELS, OTHER_PANEL]:
            listed = [(name, text) for in_panel, name, text in rows if in_panel == panel]
            if listed:
                with formatter.section(panel):
                    formatter.write_dl(listed)


__all__ = [
    "COMMAND_PANELS",
    "OTHER_PANEL",
    "ProragGroup",
    "SubGroup",
    "command_rows",
    "summary",
    "taken_as_given",
    "command_order",
    "field_choices",
    "panel_of",
    "tidy_command",
    "unwrap",
    "with_choices",
]
