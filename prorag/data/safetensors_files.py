"""Reading safetensors files: every read in the package goes through here.

A file is checked before the library touches it: its 8-byte header length, its JSON header,
and its tensors' byte ranges, which must tile the data exactly up to the end of the file (so a
file cut short by a kill or a full disk is caught by its size alone, without reading the
weights). A damaged file is a :class:`~prorag.core.errors.DataError` naming the file, what is
wrong and what to do (the caller's ``remedy``), where the library says ``header too large`` or
``incomplete metadata`` and names nothing. :func:`damage` and :func:`folder_damage` give the
same verdict without raising, for a caller that skips a damaged file (a checkpoint) rather
than stopping. Loading a folder with ``from_pretrained`` is preceded by :func:`check_folder`.
The libraries (numpy's or torch's side of ``safetensors``) are imported only when loading.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

from prorag.core.errors import DataError

PathLike = str | os.PathLike[str]

#: The library's own limit on a header's size; a larger length field is garbage.
MAX_HEADER_BYTES = 100_000_000
#: Bytes per element of the dtypes whose tensors have a whole number of bytes (sub-byte ones
#: such as ``F4`` are not size-checked).
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}  # fmt: skip
#: What to do about a damaged file when the caller does not say.
DEFAULT_REMEDY = "restore the file or write it again"
#: Where a damaged file most likely came from, said in every message.
CAUSE = "cut short by a kill or a full disk, or not a safetensors file"


def damage(path: PathLike) -> str | None:
    """Why the safetensors file ``path`` cannot be loaded (missing, truncated, garbage), or
    ``None`` when its layout is sound."""
    return _inspect(Path(path))[1]


def check_file(path: PathLike, remedy: str = DEFAULT_REMEDY) -> None:
    """Raise a :class:`DataError` naming ``path``, what is wrong and ``remedy`` unless the file is
    a sound safetensors file."""
    problem = damage(path)
    if problem is not None:
        raise DataError(str(path), f"damaged safetensors file: {problem} ({CAUSE}); {remedy}")


def load_numpy(path: PathLike, remedy: str = DEFAULT_REMEDY) -> dict[str, Any]:
    """The tensors of ``path`` as numpy arrays, after :func:`check_file`."""
    import safetensors.numpy

    return _load(path, remedy, safetensors.numpy.load_file)


def load_torch(path: PathLike, remedy: str = DEFAULT_REMEDY, device: str = "cpu") -> dict[str, Any]:
    """The tensors of ``path`` as torch tensors on ``device``, after :func:`check_file`."""
    import safetensors.torch

    return _load(path, remedy, lambda p: safetensors.torch.load_file(p, device=device))


def _load(path: PathLike, remedy: str, load: Any) -> dict[str, Any]:
    """``load(path)`` after :func:`check_file`; an error the library still finds (a header whose
    layout is sound but whose contents it refuses) names the file too."""
    from safetensors import SafetensorError

    check_file(path, remedy)
    try:
        return load(str(path))
    except SafetensorError as e:
        raise DataError(str(path), f"damaged safetensors file: {' '.join(str(e).split())} ({CAUSE}); {remedy}") from None


def folder_damage(folder: PathLike) -> str | None:
    """Why the weights in ``folder`` cannot be loaded, or ``None``: every ``*.safetensors`` file
    must be sound, and every shard a ``*.safetensors.index.json`` names must exist (and be sound).
    The reason starts with the file's name."""
    folder = Path(folder)
    files = set(folder.glob("*.safetensors"))
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            shards = {folder / name for name in weight_map.values()}
        except (OSError, ValueError, AttributeError) as e:
            return f"{index.name}: unreadable shard index ({type(e).__name__})"
        files |= shards
    for file in sorted(files):
        problem = damage(file)
        if problem is not None:
            return f"{file.name}: {problem}"
    return None


def check_folder(folder: PathLike, remedy: str = DEFAULT_REMEDY) -> None:
    """What to call before ``from_pretrained(folder)``: a :class:`DataError` naming the damaged
    weights file (see :func:`folder_damage`); nothing for a sound folder or a path that is not a
    folder (a hub id)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    problem = folder_damage(folder)
    if problem is not None:
        name, _, what = problem.partition(": ")
        raise DataError(str(folder / name), f"damaged safetensors file: {what} ({CAUSE}); {remedy}")


def _inspect(path: Path) -> tuple[dict[str, Any], str | None]:
    """The header of ``path`` and ``None``, or what is wrong with the file's layout."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return {}, f"{size} bytes, shorter than the 8-byte header length"
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                return {}, f"header length {length} does not fit in the file's {size} bytes"
            raw = f.read(length)
    except FileNotFoundError:
        return {}, "no such file"
    except OSError as e:
        return {}, f"unreadable ({e.strerror or e})"
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}, "the header is not JSON"
    if not isinstance(header, dict):
        return {}, "the header is not a JSON object"
    problem = _layout_problem(header, size - 8 - length)
    return (header, None) if problem is None else ({}, problem)


def _layout_problem(header: dict[str, Any], data_bytes: int) -> str | None:
    """What is wrong with the tensors' byte ranges: they must tile ``[0, data_bytes)`` in order,
    each as long as its dtype and shape say. The library's own rule, checked here so that a
    truncated file is named before it is opened."""
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"tensor {name!r} has no valid data_offsets"
        begin, end = offsets
        width, shape = DTYPE_BYTES.get(entry.get("dtype")), entry.get("shape")
        if width is not None and isinstance(shape, list) and end - begin != width * math.prod(shape):
            return f"tensor {name!r} spans {end - begin} bytes, its dtype and shape need {width * math.prod(shape)}"
        ranges.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(ranges):
        if begin != position or end < begin:
            return f"tensor {name!r} starts at byte {begin} of the data, expected {position}"
        position = end
    if position != data_bytes:
        return f"the header needs {position} bytes of tensor data, the file holds {data_bytes}"
    return None
