"""Stage configs from YAML files: one typed dataclass per stage, every field settable.

:func:`load_config` reads a YAML mapping into a config dataclass and refuses, with a
:class:`~prorag.core.errors.DataError` naming ``file:line`` and the key, anything the dataclass would
not mean: an unknown key (the closest known name suggested), a value of the wrong type, a value its
own checks (``__post_init__``) reject. Types are checked against the annotations rather than
trusted, because PyYAML follows YAML 1.1, where ``3e-3`` (no dot) is a string: a float field
accepts an int or a numeric string (converted); every other mismatch is an error.

:func:`apply_overrides` sets fields from dotted ``key.sub=value`` assignments (``--set``), each
value read as YAML and checked the same way. A config that selects methods by name holds each such
method's own settings as a field named after it (``cpsearch.alpha``), added when the method
registers (:func:`method_settings`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from prorag.core.errors import DataError, decode_utf8
from prorag.core.lazy_modules import lazy_module
from prorag.core.registry import Entry, Registry

if TYPE_CHECKING:
    import yaml
else:
    yaml = lazy_module("yaml")  # read when a file or a --set value is parsed, not for --help

C = TypeVar("C")


class _Mismatch(Exception):
    """A value does not fit a type; the message says what was expected. ``deep``: the value has
    the right shape (a mapping for a nested config) but something inside it is wrong, which a
    union reports rather than its list of alternatives."""

    def __init__(self, message: str, deep: bool = False) -> None:
        super().__init__(message)
        self.deep = deep


def _describe(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def _float(value: Any) -> float | None:
    """``value`` as a float: a YAML int or float, or a string such as ``"3e-3"`` (YAML 1.1 reads
    an exponent without a dot as a string); ``None`` when it is none of these."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` checked against ``tp`` (and converted where YAML's typing is ambiguous)."""
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise _Mismatch("null")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        deep = None
        for arg in sorted(args, key=lambda a: a is float):  # exact types before float's string conversion
            try:
                return _coerce(value, arg)
            except _Mismatch as e:
                deep = deep or (e if e.deep else None)
        raise deep or _Mismatch(_describe(tp))
    if origin is Literal:
        if value in args and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in args)):
            return value
        raise _Mismatch(_describe(tp))
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise _Mismatch(_describe(tp))
        inner = args[0] if args else Any
        out = [_coerce(v, inner) for v in value]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise _Mismatch(_describe(tp))
        kt, vt = args or (Any, Any)
        return {_coerce(k, kt): _coerce(v, vt) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch("true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch("an integer")
    if tp is float:
        number = _float(value)
        if number is None:
            raise _Mismatch("a number")
        if math.isnan(number):  # YAML's .nan, "nan": no setting means it, and every comparison with it is False
            raise _Mismatch("a number, not NaN")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch("a string")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):  # already built (a command-line option's config)
            return value
        if isinstance(value, dict):  # a nested config (e.g. an LLM teacher's settings)
            try:
                return config_from_dict(tp, value, where=f"{tp.__name__} block")
            except DataError as e:
                raise _Mismatch(f"a valid {tp.__name__} ({e})", deep=True) from None
        raise _Mismatch(f"a mapping of {tp.__name__} fields")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Mismatch(_describe(tp))
    return value  # an annotation this checker does not know: trust the dataclass


def _key_lines(node: yaml.Node | None) -> dict[str, int]:
    """Line number (1-based) of each top-level key of a composed YAML mapping document."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def _refuse_duplicate_keys(node: yaml.Node | None, where: str) -> None:
    """A :class:`DataError` at ``where:line`` for a key given twice in one mapping, at any depth.

    PyYAML keeps the last of duplicate keys silently; a config whose ``learning_rate`` is set
    twice is far more likely a mistake than an override, so it is refused.
    """
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, where)
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[str, int] = {}
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            line = key.start_mark.line + 1
            if key.value in first:
                raise DataError(f"{where}:{line}", f"duplicate key '{key.value}' (first given on line {first[key.value]})")
            first[key.value] = line
        _refuse_duplicate_keys(value, where)


def _onto_default(f: dataclasses.Field[Any], value: Any) -> Any:
    """A mapping for a field whose default is a config dataclass, completed with that default's
    values: a YAML block that sets some fields keeps the stage's own defaults for the rest
    (``mcts: {rollout: {temperature: 1.1}}`` keeps MCTS's top-p 0.95), not the nested class's."""
    if not isinstance(value, dict) or f.default_factory is dataclasses.MISSING:
        return value
    base = f.default_factory()
    if not (dataclasses.is_dataclass(base) and not isinstance(base, type)):
        return value
    return {**{g.name: getattr(base, g.name) for g in dataclasses.fields(base) if g.init}, **value}


def config_from_dict(cls: type[C], data: dict[str, Any], where: str = "config", lines: dict[str, int] | None = None) -> C:
    """Build the dataclass ``cls`` from a mapping, checking every key and value (see the module doc).

    ``where`` names the source in errors (a file path), ``lines`` the line of each key.
    """
    kwargs = coerce_fields(cls, data, where, lines)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise DataError(where, str(e)) from None


def coerce_fields(cls: type, data: dict[str, Any], where: str = "config", lines: dict[str, int] | None = None) -> dict[str, Any]:
    """``data``'s values as the fields of dataclass ``cls`` take them, every key checked (an unknown
    one is refused with the closest field named) and every value coerced to its field's type, without
    building ``cls``: a partial block (``generator.served``: a few keys now, the rest from a file or
    at run time) is checked as early as a whole one."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    lines = lines or {}
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls) if f.init}
    fields = set(by_name)

    def at(key: str) -> str:
        return f"{where}:{lines[key]}" if key in lines else where

    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key not in fields:
            raise DataError(at(key), _unknown_key(key, cls, fields))
        try:
            kwargs[key] = _coerce(_onto_default(by_name[key], value), hints[key])
        except _Mismatch as e:
            raise DataError(at(key), f"field '{key}': expected {e}, got {type(value).__name__} {value!r}") from None
    return kwargs


def load_config(path: str | os.PathLike[str], cls: type[C]) -> C:
    """Read the YAML file ``path`` (a mapping of field names to values) into the dataclass ``cls``.

    Missing keys keep the dataclass defaults. An empty (or comments-only) file, a key given
    twice and text that is not UTF-8 are refused. Errors are
    :class:`~prorag.core.errors.DataError` naming ``file:line`` and the key. A file may name a
    base file it overrides (:data:`BASE_KEY`, see :func:`_config_mapping`).
    """
    p = Path(path)
    data, lines = _config_mapping(p, cls, ())
    return config_from_dict(cls, data, str(p), lines)


#: The top-level key of a config file that names the file it overrides (a path relative to it),
#: unless ``cls`` has a field of that name: ``base: demo.yaml`` then the keys that differ.
BASE_KEY = "base"


def _config_mapping(p: Path, cls: type, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, int]]:
    """The mapping of the YAML file ``p`` and the line of each of its top-level keys, composed onto
    its base file when it names one (:data:`BASE_KEY`): the base is read first (itself possibly
    composed) and must be a valid config on its own, so its errors name its own lines; then this
    file's keys are merged onto it, mappings key by key (a nested config sets only the fields it
    names), any other value replacing the base's. A base that leads back to ``p`` is refused."""
    if not p.is_file():
        raise DataError(str(p), "no such file")
    text = decode_utf8(p.read_bytes(), str(p))
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _refuse_duplicate_keys(node, str(p))
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise DataError(where, f"invalid YAML ({getattr(e, 'problem', None) or e})") from None
    if data is None:
        raise DataError(str(p), f"empty config: expected a mapping of {cls.__name__} fields")
    if not isinstance(data, dict):
        raise DataError(str(p), f"expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    lines = _key_lines(node)
    if BASE_KEY not in data or BASE_KEY in {f.name for f in dataclasses.fields(cls)}:
        return data, lines
    base = data.pop(BASE_KEY)
    where = f"{p}:{lines[BASE_KEY]}"
    if not isinstance(base, str) or not base:
        raise DataError(where, f"field '{BASE_KEY}': expected the path of a config file, got {base!r}")
    base_path = p.parent / base
    if base_path.resolve() in (*chain, p.resolve()):
        raise DataError(where, f"field '{BASE_KEY}': {base} leads back to {p}")
    base_data, base_lines = _config_mapping(base_path, cls, (*chain, p.resolve()))
    config_from_dict(cls, base_data, str(base_path), base_lines)
    return _merged(base_data, data), lines


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged onto ``base``: mappings key by key, any other value replacing the base's."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _unknown_key(key: str, cls: type, fields: set[str]) -> str:
    """The "unknown key" message, with the closest known field suggested (files and ``--set`` alike)."""
    close = difflib.get_close_matches(key, sorted(fields), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    if not close and getattr(cls, "__method_sections__", None) is not None:
        hint = " (a method's settings are known once its module is imported: --plugin or PRORAG_PLUGINS)"
    return f"unknown key '{key}' for {cls.__name__}{hint}"


def parse_assignment(text: str, where: str = "--set") -> tuple[str, Any]:
    """``"a.b=value"`` split into the dotted key and the value read as a YAML scalar or flow
    collection (``3e-3``, ``null``, ``[1, 2]``, ``{a: 1}``); an empty value is ``null`` as in YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise DataError(f"{where} {text}", "expected KEY=VALUE with a dotted field name, e.g. rl.beta=0.5")
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise DataError(f"{where} {text}", f"invalid YAML value ({getattr(e, 'problem', None) or e})") from None


def replace_field(config: C, key: str, value: Any, where: str) -> C:
    """``config`` with the (dotted, possibly nested) field ``key`` set to ``value``.

    The value is checked and converted like a YAML value; the config and every nested config on
    the path are rebuilt with :func:`dataclasses.replace`, so their ``__post_init__`` checks run.
    Dotted keys also reach into a mapping field (``generator.served.timeout_s=5`` sets one entry of
    ``served``) and into an optional nested config that is ``None``, built from its defaults first
    (``judge.max_tokens=8``); one with required fields must be set whole (``llm={base_url: ..., model: ...}``).
    """
    head, _, rest = key.partition(".")
    cls = type(config)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    if head not in fields:
        raise DataError(where, _unknown_key(head, cls, fields))
    if rest:
        hint = typing.get_type_hints(cls)[head]
        inner = getattr(config, head)
        if inner is None:
            inner = _unset_block(hint, f"field '{head}' of {cls.__name__}", where)
        if isinstance(inner, dict):
            try:
                new = _coerce(_with_entry(inner, rest, value, f"field '{head}' of {cls.__name__}", where), hint)
            except _Mismatch as e:
                raise DataError(where, f"field '{head}': expected {e}") from None
        elif dataclasses.is_dataclass(inner):
            new = replace_field(inner, rest, value, where)
        else:
            raise DataError(where, f"field '{head}' of {cls.__name__} has no sub-fields (it is {inner!r})")
    else:
        try:
            new = _coerce(value, typing.get_type_hints(cls)[head])
        except _Mismatch as e:
            raise DataError(where, f"field '{head}': expected {e}, got {type(value).__name__} {value!r}") from None
    try:
        return dataclasses.replace(config, **{head: new})  # type: ignore[type-var]
    except (TypeError, ValueError) as e:
        raise CheckFailed(where, str(e)) from None


def _unset_block(hint: Any, name: str, where: str) -> Any:
    """What a dotted key builds on when the optional field ``name`` (of type ``hint``) is None: its
    config class's defaults, or an empty mapping; a config with required fields must be set whole."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    for arg in args:
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            try:
                return arg()
            except (TypeError, ValueError):
                raise DataError(where, f"{name} is not set and has required fields: set it whole first") from None
        if arg is dict or typing.get_origin(arg) is dict:
            return {}
    raise DataError(where, f"{name} has no sub-fields (it is None)")


def _with_entry(mapping: dict[str, Any], key: str, value: Any, name: str, where: str) -> dict[str, Any]:
    """A copy of ``mapping`` with the dotted ``key`` set to ``value`` (missing levels created)."""
    head, _, rest = key.partition(".")
    out = dict(mapping)
    if not rest:
        out[head] = value
        return out
    inner = out.get(head, {})
    if not isinstance(inner, dict):
        raise DataError(where, f"entry '{head}' of {name} has no sub-fields (it is {inner!r})")
    out[head] = _with_entry(inner, rest, value, f"entry '{head}' of {name}", where)
    return out


class CheckFailed(DataError):
    """A value of the right type that the config's own checks (``__post_init__``) reject."""


def apply_overrides(config: C, assignments: Sequence[str], where: str = "--set") -> C:
    """A new ``config`` with the dotted ``key.sub=value`` assignments applied (later wins).

    Errors are :class:`~prorag.core.errors.DataError` naming the assignment (``--set rl.btea=1``):
    an unknown key with the closest field suggested, a value of the wrong type, a value the
    config's own checks reject. A check that relates two fields (``select_policy=best_dev`` needs
    ``eval_every``) does not depend on the order: an assignment its config rejects is tried again
    once the others are in, and only one still rejected then is an error.
    """
    parsed = [(text, *parse_assignment(text, where)) for text in assignments]
    last = {key: i for i, (_, key, _) in enumerate(parsed)}
    pending = [p for i, p in enumerate(parsed) if last[p[1]] == i]  # an overwritten value is never set
    while pending:
        rejected: list[tuple[str, str, Any]] = []
        first: CheckFailed | None = None
        for text, key, value in pending:
            try:
                config = replace_field(config, key, value, f"{where} {text}")
            except CheckFailed as e:
                rejected.append((text, key, value))
                first = first or e
        if len(rejected) == len(pending):
            assert first is not None
            raise first
        pending = rejected
    return config


def load_config_with_overrides(path: str | os.PathLike[str] | None, cls: type[C], assignments: Sequence[str] = ()) -> C:
    """``cls`` from the YAML file ``path`` (its defaults when ``path`` is None), then ``assignments``."""
    config = load_config(path, cls) if path is not None else cls()
    return apply_overrides(config, assignments)


def field_help(cls: type) -> list[tuple[str, str, str, str]]:
    """``(dotted name, type, default, help)`` of every field of the config dataclass ``cls``,
    nested config dataclasses walked into (``rollout.temperature``), for ``--help`` listings.
    A nested field's default is the one its parent's default gives it (MCTS's rollout
    temperature 0.9, not RolloutConfig's 1.0)."""
    return _field_rows(cls, _default_instance(cls), "")


def _default_instance(cls: type) -> Any:
    """``cls()`` when every field has a default, else ``None`` (defaults then read per field)."""
    try:
        return cls()
    except TypeError:
        return None


def _field_rows(cls: type, default: Any, prefix: str) -> list[tuple[str, str, str, str]]:
    hints = typing.get_type_hints(cls)
    rows: list[tuple[str, str, str, str]] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        name, tp = prefix + f.name, hints[f.name]
        value = getattr(default, f.name) if default is not None else f.default
        if dataclasses.is_dataclass(tp) and isinstance(tp, type) and dataclasses.is_dataclass(value):
            rows.append((name, tp.__name__, "", _help_text(f)))
            rows.extend(_field_rows(tp, value, name + "."))
            continue
        shown = "" if value is dataclasses.MISSING else repr(value)
        rows.append((name, _describe(tp), shown, _help_text(f)))
    return rows


def _help_text(f: dataclasses.Field[Any]) -> str:
    """A field's help, followed for a field that names a method (``choices``, a registry) by each
    registered name and its description, read when the help is shown: a plugin's methods included."""
    text = f.metadata.get("help", "")
    choices = f.metadata.get("choices")
    return f"{text} {choices.describe()}".strip() if choices is not None else text


#: Settings added after run folders existed, in the order they were added, each with the value
#: that does what the runs before it did: a stage marker or a screening row written before the field
#: existed still matches while the field keeps that value (any other value is a changed setting).
#: Three decide how work is launched: ``decode_graphs`` and ``resume_early`` (rollout) write the
#: trajectories the engine wrote before them where every row has its own stream (RL, its screening,
#: and RFT, MCTS and P2S's hinted candidates with ``sample_streams: row``; tests/agent/test_rollout.py,
#: test_decode_graphs.py). Where one generator serves a batch (``sample_streams: batch``) they change the
#: order in which rows take its draws: the same distribution, other samples (an RFT rebuild then
#: keeps a slightly different set of correct trajectories). RL's ``scoring_rows`` at ``None`` runs the one forward per micro-batch
#: that came before it (any number of rows gives the same loss and gradients up to float rounding,
#: tests/stages/test_rl.py, which RL then amplifies: a changed setting). ``sample_streams`` (RFT,
#: MCTS, ``outcome_reward.p2s``) at ``batch`` is how those stages sampled before it; an RL run that
#: does not use P2S matches its old markers whatever P2S's field holds (:data:`METHOD_BLOCKS`). ``compile_decode``
#: (rollout) at ``False`` runs the uncompiled decode step that came before it (the compiled one rounds otherwise).
#: ``over_long`` (eval) at ``skip`` and ``max_chars`` (sft-data) at 65536 only act on questions too long for the
#: policy or for SFT, on which the runs before them crashed or wrote rows SFT then dropped. RL's
#: ``packed_scoring`` at ``False``, ``packed_row_tokens`` and ``logprob_chunk`` at ``None`` score as before them
#: (the padded forwards, the full logits); packed or chunked scoring equals them up to float rounding only. ``backend`` (rollout)
#: at ``hf`` is the decode loop every earlier run used, and the ``vllm`` block (rollout) and RL's ``vllm_*`` fields at
#: their defaults are unread by it (the ``vllm`` value is ``asdict(VLLMSettings())``, which a test keeps equal).
#: ``faiss`` (index) at ``None`` encodes the corpus, as every index stage did before an index could be imported.
LATER_FIELDS: dict[str, Any] = {
    "question_filter": "none",
    "screening_file": None,
    "screening_strata": None,
    "decode_graphs": "auto",
    "resume_early": True,
    "scoring_rows": None,
    "rl_worlds": 0,
    "rl_questions_per_world": 1,
    "sample_streams": "batch",
    "compile_decode": False,
    "over_long": "skip",
    "max_chars": 65_536,
    "packed_scoring": False,
    "packed_row_tokens": None,
    "logprob_chunk": None,
    "backend": "hf",
    "vllm": {
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.3,
        "max_model_len": None,
        "dtype": "auto",
        "enforce_eager": False,
        "enable_prefix_caching": True,
    },
    "vllm_mode": "colocate",
    "vllm_server_url": "http://127.0.0.1:8000",
    "vllm_sleep_mode": False,
    "faiss": None,
}


#: Method blocks that one value of a sibling field switches on: ``{block: (field, value)}`` says the
#: nested config ``block`` is read only where the config holding it has ``field == value`` (P2S's
#: settings sit in every RL config's ``outcome_reward`` and only ``form: p2s`` reads them). A
#: :data:`LATER_FIELDS` setting inside a block the run does not use changes nothing the run does:
#: :func:`without_later_fields` drops it whatever its value, and :func:`used_settings` (what new
#: stage markers are keyed by) leaves it out, so adding a field to one method's block keeps every
#: other method's run folders.
METHOD_BLOCKS: dict[str, tuple[str, Any]] = {"p2s": ("form", "p2s")}


def _unused_block(config: dict[str, Any], key: str) -> bool:
    """Whether ``config[key]`` is a :data:`METHOD_BLOCKS` block that ``config`` does not switch on."""
    rule = METHOD_BLOCKS.get(key)
    return rule is not None and isinstance(config.get(key), dict) and rule[0] in config and config[rule[0]] != rule[1]


def _strip(value: Any, old: dict[str, Any], any_value: frozenset[str], inside_unused: bool = False) -> Any:
    """``value`` as plain data without the fields of ``old`` that hold their old value, and, inside
    an unused method block, without the fields named in ``any_value`` whatever they hold."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {
            k: _strip(v, old, any_value, inside_unused or _unused_block(value, k))
            for k, v in value.items()
            if not ((k in old and v == old[k]) or (inside_unused and k in any_value))
        }
    if isinstance(value, list | tuple):
        return [_strip(v, old, any_value, inside_unused) for v in value]
    return value


def without_later_fields(value: Any, since: int = 0) -> Any:
    """A config (dataclass or plain data, nested configs included) as plain data without the
    :data:`LATER_FIELDS` from the ``since``-th on that hold their old-behaviour value, or that sit in
    a method block the config does not use (:data:`METHOD_BLOCKS`): what it was before those fields
    existed (a marker written between two additions knows the earlier ones)."""
    later = dict(list(LATER_FIELDS.items())[since:])
    return _strip(value, later, frozenset(later))


def used_settings(value: Any) -> Any:
    """A config as plain data without the :data:`LATER_FIELDS` that sit in a method block it does not
    use (:data:`METHOD_BLOCKS`), whatever their value: the settings that decide what a run does, the
    form stage markers are keyed by, so that a later field of P2S's block does not make an
    outcome-only run's marker stale."""
    return _strip(value, {}, frozenset(LATER_FIELDS))


def earlier_forms(value: Any) -> list[Any]:
    """``value`` as plain data as each earlier version wrote it (after each addition of
    :data:`LATER_FIELDS`, newest first): what a fingerprint or key made then was made of."""
    return [without_later_fields(value, since) for since in reversed(range(len(LATER_FIELDS)))]


__all__ = [
    "LATER_FIELDS",
    "METHOD_BLOCKS",
    "CheckFailed",
    "coerce_fields",
    "apply_overrides",
    "config_from_dict",
    "earlier_forms",
    "field_help",
    "load_config",
    "load_config_with_overrides",
    "method_settings",
    "parse_assignment",
    "replace_field",
    "setting",
    "used_settings",
    "without_later_fields",
]


def setting(default: Any = dataclasses.MISSING, *, factory: Any = None, help: str, choices: Registry[Any] | None = None) -> Any:
    """A config field with its ``--help`` text (``beta: float = setting(0.3, help="...")``);
    ``factory`` builds a mutable or nested default. ``choices``: the registry a name-valued field
    picks from, whose names and descriptions :func:`field_help` appends to the text. Both live in
    the field's metadata, where :func:`field_help` and the command line read them."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# ----------------------------------------------------------------------------- the settings of registered methods


def method_settings(**selectors: Registry[Any]) -> Any:
    """Class decorator over a config dataclass whose fields select methods by name
    (``@method_settings(process_reward=STEP_REWARD_SOURCES)`` over :class:`~prorag.stages.rl.RLConfig`):
    every method registered in such a registry with its own settings class (``register(name,
    config=...)``) becomes a field of the method's name holding those settings, defaults first
    (``cpsearch: {alpha: 0.2, ...}``), now or when the method registers later (a plugin's).

    The field is an ordinary nested config to everything else: YAML, ``--set cpsearch.alpha=0.3``,
    ``--help`` (:func:`field_help`), :func:`dataclasses.asdict` (run folders' saved configs, stage
    fingerprints) and :func:`dataclasses.replace`. So adding a method edits no config class, and a
    config written before a method moved into its registry reads and dumps as it did. Every method
    of the registry has its section, selected or not (kept, unused): a plugin's section is in every
    dump while the plugin is loaded, so a stage marker written without it no longer matches. A
    method's name must be an identifier and not a field of the class."""

    def decorate(cls: type[C]) -> type[C]:
        missing = sorted(set(selectors) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
        if missing:
            raise TypeError(f"method_settings: {cls.__name__} has no field {missing} to select a method with")
        if "__method_sections__" not in cls.__dict__:
            cls.__method_sections__ = {}  # type: ignore[attr-defined]
            cls.__init__ = _init_with_sections(cls.__init__)  # type: ignore[misc]
            cls.__eq__ = _eq_by_fields  # type: ignore[assignment,method-assign]
            cls.__repr__ = _repr_by_fields  # type: ignore[assignment,method-assign]
        for selector, registry in selectors.items():
            registry.watch(functools.partial(_add_section, cls, selector, registry))
        return cls

    return decorate


def _add_section(cls: type, selector: str, registry: Registry[Any], name: str, entry: Entry) -> None:
    """Give ``cls`` the field ``name`` of type ``entry.config`` (a method registered with settings)."""
    sections: dict[str, tuple[str, type]] = cls.__method_sections__  # type: ignore[attr-defined]
    if entry.config is None or sections.get(name) == (selector, entry.config):
        return
    if name in sections and sections[name][0] != selector:
        clash = f"the settings of `{sections[name][0]}: {name}`"
        raise TypeError(f"{registry.what} {name!r} has settings, but {cls.__name__} already holds {clash}")
    if name not in sections and name in cls.__dataclass_fields__:  # type: ignore[attr-defined]
        raise TypeError(f"{registry.what} {name!r} has settings, but {cls.__name__} already has a field {name!r}")
    if not name.isidentifier():
        raise TypeError(f"{registry.what} {name!r} has settings: its name must be an identifier to name their section")
    help = f"Settings of `{selector}: {name}`" + (f": {entry.help.rstrip('.')}." if entry.help else ".")
    spec = dataclasses.field(default_factory=entry.config, metadata={"help": help})
    made = dataclasses.make_dataclass(f"{cls.__name__}_{name}", [(name, entry.config, spec)])
    cls.__dataclass_fields__[name] = made.__dataclass_fields__[name]  # type: ignore[attr-defined]
    cls.__annotations__[name] = entry.config  # read by typing.get_type_hints
    setattr(cls, name, _SectionDefault(name, entry.config))
    sections[name] = (selector, entry.config)


class _SectionDefault:
    """A section's class attribute: an instance made before its method registered reads the
    method's defaults (kept on the instance), as one made after would hold them."""

    def __init__(self, name: str, factory: type) -> None:
        self.name, self.factory = name, factory

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.factory()
        return value


def _init_with_sections(init: Any) -> Any:
    """The dataclass's ``__init__``, which knows the fields of the class as written, taking the
    sections as keywords too (set before ``__post_init__`` runs)."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name, (_, factory) in type(self).__method_sections__.items():
            given = kwargs.pop(name, dataclasses.MISSING)
            object.__setattr__(self, name, factory() if given is dataclasses.MISSING else given)
        init(self, *args, **kwargs)

    return __init__


def _eq_by_fields(self: Any, other: Any) -> Any:
    """The dataclass's ``__eq__`` over the fields the class has now (its sections included)."""
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = [f.name for f in dataclasses.fields(self) if f.compare]
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _repr_by_fields(self: Any) -> str:
    """The dataclass's ``__repr__`` over the fields the class has now (its sections included)."""
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{type(self).__qualname__}({shown})"
