"""What every command shares: the Typer apps, the error handler, ``--config``/``--set`` and the LLM endpoint.

A stage command is declared with :func:`config_command`: it gets ``--config FILE`` and repeatable
``--set KEY=VALUE`` over its config dataclass, and a :class:`ConfigSource` that builds the config
with the precedence defaults < file < shortcut options < ``--set``. Its ``--help`` lists every
settable field (type, default, help), read from the dataclass only when help is asked for, so
``prorag --help`` imports no stage. The LLM endpoint options are declared once
(:func:`llm_endpoint_options`) and completed into an ``LLMTeacherConfig``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand

from prorag.cli.presentation import ProragGroup, SubGroup, field_choices, with_choices
from prorag.core.errors import DataError, ServiceUnavailableError

F = TypeVar("F", bound=Callable[..., Any])

#: The ``--index`` option of every command that retrieves.
IndexOption = Annotated[str, typer.Option("--index", "-i", help="Index folder or http(s):// URL of a retrieval server.")]
#: The options every stage command that reads a policy, a PRM or records, or writes a run folder, spells alike.
PolicyOption = Annotated[str, typer.Option(help="Policy: a checkpoint folder or a training run folder (its policy/).")]
PRMOption = Annotated[str, typer.Option(help="Process reward model folder (prorag prm) or its run folder.")]
RecordsOption = Annotated[Path, typer.Option(help="Record file (FlashRAG JSONL).")]
RunDirOption = Annotated[Path, typer.Option(help="Run folder of the stage's outputs; rerunning resumes from it.")]
MaxStepsOption = Annotated[int | None, typer.Option(help="Optimiser steps (the config's max_steps).")]
PairsOption = Annotated[Path, typer.Option(help="Step-pairs JSONL (`prorag pairs`).")]

app = typer.Typer(
    name="prorag",
    cls=ProragGroup,
    help="Train retrieval-augmented reasoning agents with process supervision (ProRAG).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: see prorag/cli/presentation.py
    context_settings={"max_content_width": 100},  # help as wide as the terminal, up to 100 columns
)
#: Each sub-app's settings: plain help (see prorag/cli/presentation.py), whole first sentences.
_SUB_APP: dict[str, Any] = {"cls": SubGroup, "no_args_is_help": True, "rich_markup_mode": None}
data_app = typer.Typer(help="Convert benchmark files to prorag records.", **_SUB_APP)
corpus_app = typer.Typer(help="Build retrieval corpora.", **_SUB_APP)
models_app = typer.Typer(help="Models: offline checkpoints.", **_SUB_APP)
app.add_typer(data_app, name="data")
app.add_typer(corpus_app, name="corpus")
app.add_typer(models_app, name="models")

PRECEDENCE = "defaults < --config file < shortcut options < --set"


def error_line(e: BaseException) -> str | None:
    """The one line an expected error is shown as, or ``None`` for a bug (left to raise).

    Expected: bad input (:class:`DataError`, ``ValueError``), a file the system refuses
    (``OSError`` with a file name: a missing file, a folder where a file was meant, an existing
    file where a folder was meant), an unreachable service (:class:`ServiceUnavailableError`:
    the retrieval server, an LLM endpoint), and text that is not UTF-8 (whose reader could not
    name the file; the readers of input files name it themselves). A library's message that
    spans several lines is joined into one.
    """
    text = _error_text(e)
    return " ".join(text.split()) if text is not None else None


def _error_text(e: BaseException) -> str | None:
    """The message of an expected error (see :func:`error_line`), ``None`` for any other."""
    if isinstance(e, UnicodeDecodeError):
        return f"input is not UTF-8 text ({e.reason} at byte {e.start})"
    if isinstance(e, OSError) and e.filename is not None:
        target = e.filename2 if e.filename2 is not None else e.filename
        return f"{target}: {e.strerror or e}"
    if isinstance(e, (DataError, ValueError, ServiceUnavailableError, FileNotFoundError)):
        return str(e)
    return None


#: Whether errors show their traceback (``prorag -v``); set by the app's callback on every run.
_TRACEBACKS = {"on": False}


def show_tracebacks(on: bool) -> None:
    """Make :func:`friendly_errors` print the traceback before its one line (``prorag -v``)."""
    _TRACEBACKS["on"] = on


def friendly_errors(fn: F) -> F:
    """The one error handler of every command: an expected error (:func:`error_line`) ends the
    command with exit code 2 and one line on stderr, after its traceback with ``prorag -v``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            line = error_line(e)
            if line is None:
                raise
            if _TRACEBACKS["on"]:
                traceback.print_exc(file=sys.stderr)
            typer.secho(f"error: {line}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def _inject(
    fn: Callable[..., Any], target: str, added: Sequence[inspect.Parameter], make: Callable[[dict[str, Any]], Any]
) -> Any:
    """``fn`` whose parameter ``target`` is replaced, for Typer, by the options ``added``; the wrapper
    calls ``make`` on their values and passes the result as ``target``. Typer reads the signature."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {p.name: kwargs.pop(p.name) for p in added if p.name in kwargs}
        return fn(*args, **{target: make(values)}, **kwargs)

    sig = inspect.signature(fn, eval_str=True)
    kept = [p for p in sig.parameters.values() if p.name != target]
    plain = [p for p in kept if p.default is inspect.Parameter.empty]
    defaulted = [p for p in kept if p.default is not inspect.Parameter.empty]
    wrapper.__signature__ = sig.replace(parameters=[*plain, *defaulted, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*kept, *added]}
    del wrapper.__wrapped__  # Typer must see the new signature, not fn's
    return wrapper


# ----------------------------------------------------------------------------- --config / --set


def _load_class(target: str) -> type:
    """``"module:Class"`` imported (stage modules are heavy, so only when a command runs or shows help)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _plain(value: Any) -> Any:
    """A typer option's value as the config field takes it: paths and enums as strings."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class ConfigSource:
    """Where a command's config comes from: its dataclass, a YAML file, ``--set`` assignments.

    ``section`` is the command's config name; a ``--set`` key may start with it (``rl.beta`` for
    ``prorag rl``), unless the config has a field of that name.
    """

    target: str
    section: str
    file: Path | None
    assignments: tuple[str, ...]
    shortcuts: Mapping[str, str]

    def load(self, options: Mapping[str, Any] | None = None) -> Any:
        """The config: defaults < file < ``options`` (shortcut flag -> value; None = not given; a
        callable gets the config so far) < ``--set``. Each shortcut flag names its field in
        :attr:`shortcuts`. A config whose ``rollout.backend`` is not installed is refused here
        (one line naming the extra), before the command does any work."""
        from prorag.core.config import apply_overrides, load_config, replace_field

        cls = _load_class(self.target)
        config = load_config(self.file, cls) if self.file is not None else cls()
        for flag, value in (options or {}).items():
            if callable(value):
                value = value(config)
            if value is not None:
                config = replace_field(config, self.shortcuts[flag], _plain(value), flag)
        config = apply_overrides(config, [self._strip_section(a, cls) for a in self.assignments])
        from prorag.agent.backends import check_available

        check_available(config)  # a backend whose package is missing stops here, before any work
        return config

    def _strip_section(self, assignment: str, cls: type) -> str:
        head, dot, rest = assignment.partition(".")
        names = {f.name for f in dataclasses.fields(cls)}
        return rest if dot and head == self.section and head not in names and "=" in rest else assignment


def field_rows(cls: type, expand: bool = True) -> list[tuple[str, str]]:
    """``(name, "(type, default D) help")`` per settable field of ``cls``
    (:func:`~prorag.core.config.field_help`); nested configs field by field (``rollout.top_k``)
    when ``expand``, else as one row each."""
    from prorag.core.config import field_help

    rows = field_help(cls)
    names = [name for name, *_ in rows]
    if expand:
        rows = [r for r in rows if not any(n.startswith(r[0] + ".") for n in names)]
    else:
        rows = [r for r in rows if "." not in r[0]]
    return [(name, f"({tp}, default {default or tp}) {text}".strip()) for name, tp, default, text in rows]


def _config_command_class(target: str, section: str, expand: bool, shortcuts: Mapping[str, str]) -> type[TyperCommand]:
    """A Typer command class whose epilog lists the config's fields, and whose shortcut options list
    the values their field allows (:func:`~prorag.cli.presentation.field_choices`), built when help
    is shown (after the plugins have registered theirs)."""

    class ConfigCommand(TyperCommand):
        def get_params(self, ctx: Any) -> list[Any]:
            params = super().get_params(ctx)
            if not getattr(self, "_choices_added", False):
                self._choices_added = True
                cls = _load_class(target)
                for param in params:
                    path = next((shortcuts[o] for o in getattr(param, "opts", ()) if o in shortcuts), None)
                    choices = field_choices(cls, path) if path else None
                    if choices:
                        param.help = with_choices(param.help, choices)
            return params

        def format_epilog(self, ctx: Any, formatter: Any) -> None:
            """The settings section: every field ``--set`` reaches, one row each, after the options."""
            with formatter.section(f"Settings (--set KEY=VALUE; KEY may start with '{section}.')"):
                formatter.write_text(f"Precedence: {PRECEDENCE}.")
                formatter.write_paragraph()
                formatter.write_dl(field_rows(_load_class(target), expand))

    return ConfigCommand


def config_command(
    typer_app: typer.Typer, name: str, target: str, section: str, shortcuts: Mapping[str, str], expand: bool = True
) -> Callable[[F], F]:
    """Register ``fn`` as the command ``name`` configured by the dataclass ``target`` (``"module:Class"``).

    ``fn`` takes a ``source: ConfigSource`` (and its own options); the command gains ``--config``
    and ``--set``. ``shortcuts`` maps each shortcut flag to the field it sets (one table per command).
    """
    added = [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[Path | None, typer.Option("--config", help=f"YAML file of {target.partition(':')[2]} fields.")],
        ),
        inspect.Parameter(
            "assignments",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                list[str] | None,
                typer.Option("--set", metavar="KEY=VALUE", help="Set a config field (YAML value), e.g. a.b=1; repeatable."),
            ],
        ),
    ]

    def make(values: dict[str, Any]) -> ConfigSource:
        return ConfigSource(target, section, values.get("config"), tuple(values.get("assignments") or ()), shortcuts)

    def register(fn: F) -> F:
        wrapped = _inject(friendly_errors(fn), "source", added, make)
        typer_app.command(name, cls=_config_command_class(target, section, expand, shortcuts))(wrapped)
        return fn

    return register


# ----------------------------------------------------------------------------- the LLM endpoint


@dataclasses.dataclass(frozen=True)
class LLMEndpoint:
    """The LLM endpoint options as given (None: not given), completed into an ``LLMTeacherConfig``."""

    given: Mapping[str, Any]

    def teacher_config(self, existing: Any, used_by: str, **fresh: Any) -> Any:
        """``existing`` (the file's ``llm`` block, or None) updated with the given options; ``fresh``
        are the command's own defaults for a block built from scratch. None when nothing is given."""
        from prorag.supervision.llm_teacher import LLMTeacherConfig

        if not self.given:
            return existing
        merged = {**(dataclasses.asdict(existing) if existing is not None else fresh), **self.given}
        missing = [flag for flag, key in (("--base-url", "base_url"), ("--model", "model")) if not merged.get(key)]
        if missing:
            raise ValueError(f"{used_by} needs {' and '.join(missing)}")
        return LLMTeacherConfig(**merged)


#: LLM option -> (LLMTeacherConfig field, type, help); every option defaults to the config's value.
_LLM_OPTIONS: dict[str, tuple[str, Any, str]] = {
    "base_url": ("base_url", str, "LLM: API root of an OpenAI-compatible server (…/v1)."),
    "model": ("model", str, "LLM: model name."),
    "api_key_env": ("api_key_env", str, "LLM: environment variable holding the API key (default OPENAI_API_KEY; none: no key)."),
    "concurrency": ("concurrency", int, "LLM: requests in flight at once (default 8)."),
    "max_retries": ("max_retries", int, "LLM: retries of one request (default 5)."),
    "timeout": ("timeout_s", float, "LLM: seconds for one request as a whole (default 60)."),
    "read_timeout": ("read_timeout_s", float, "LLM: longest silence once a reply has begun, a stalled server (default 30)."),
    "cache": ("cache_path", Path, "LLM: reply cache (default OUT.llm_cache.jsonl)."),
    "price_input": ("price_input_per_1k", float, "LLM: price of 1k prompt tokens (cost estimate)."),
    "price_output": ("price_output_per_1k", float, "LLM: price of 1k completion tokens (cost estimate)."),
}


def llm_endpoint_options(fn: F) -> F:
    """Give the command the LLM endpoint options (``--base-url --model --api-key-env ...``), passed
    to ``fn`` as one ``endpoint: LLMEndpoint``."""
    added = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[tp | None, typer.Option(help=text)]
        )
        for name, (_, tp, text) in _LLM_OPTIONS.items()
    ]

    def make(values: dict[str, Any]) -> LLMEndpoint:
        return LLMEndpoint({_LLM_OPTIONS[k][0]: _plain(v) for k, v in values.items() if v is not None})

    return _inject(fn, "endpoint", added, make)  # type: ignore[no-any-return]


__all__ = [
    "PRECEDENCE",
    "ConfigSource",
    "IndexOption",
    "LLMEndpoint",
    "app",
    "config_command",
    "corpus_app",
    "data_app",
    "error_line",
    "field_rows",
    "friendly_errors",
    "llm_endpoint_options",
    "models_app",
    "show_tracebacks",
]
