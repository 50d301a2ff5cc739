"""Typed access to the fields of one JSON item: the validation helpers every data format uses.

Each helper takes ``where`` (the item's place, ``file:line`` or ``file: item N (id=...)``) and
raises a :class:`~prorag.core.errors.DataError` there naming the field as the message shows it
(``paragraphs[3].title``), so every format reports a bad item the same way. ``bool`` never
passes for ``int``: JSON ``true`` is no paragraph index.
"""

from __future__ import annotations

from typing import Any

from prorag.core.errors import DataError

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    type(None): "null",
}
_JSON_TYPES = {
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    list: "a list",
    dict: "an object",
    type(None): "null",
}
_REQUIRED = object()


def json_type(value: Any) -> str:
    """How a message names the JSON type of ``value`` (``a number``, ``a list``, ...)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def get_field(
    obj: dict[str, Any],
    key: str,
    types: type | tuple[type, ...],
    where: str,
    *,
    name: str | None = None,
    default: Any = _REQUIRED,
) -> Any:
    """``obj[key]`` checked against ``types``.

    ``name`` is the field as the message shows it; ``default`` is returned for an absent
    optional field (without one, an absent field is an error).
    """
    name = name or key
    if key not in obj:
        if default is _REQUIRED:
            raise DataError(where, f"field '{name}' missing")
        return default
    value = obj[key]
    types_ = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types_) or (isinstance(value, bool) and bool not in types_):
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types_)
        raise DataError(where, f"field '{name}' must be {want}, got {json_type(value)}")
    return value


def str_list(obj: dict[str, Any], key: str, where: str, *, name: str | None = None) -> list[str]:
    """A list field whose members must all be strings."""
    name = name or key
    values = get_field(obj, key, list, where, name=name)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(where, f"field '{name}[{i}]' must be a string, got {json_type(v)}")
    return values


def item_id(item: dict[str, Any], where: str) -> str:
    """The item id, from ``id`` or HotpotQA/2Wiki's original ``_id`` (a number becomes its text)."""
    key = "_id" if "_id" in item else "id"
    if key not in item:
        raise DataError(where, "field 'id' (or '_id') missing")
    return str(get_field(item, key, (str, int), where))


def question_text(item: dict[str, Any], where: str) -> str:
    """The item's ``question``, stripped; an empty one is an error."""
    question = get_field(item, "question", str, where)
    if not question.strip():
        raise DataError(where, "field 'question' is empty")
    return question.strip()


__all__ = ["get_field", "item_id", "json_type", "question_text", "str_list"]
