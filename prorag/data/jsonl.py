"""Streaming, atomic JSONL (and JSON) io.

Three rules every stage relies on:

* reading streams line by line and reports a bad line as ``file:line: what is wrong``;
* writing a whole file is atomic: rows go to a temporary file in the same folder, which is
  fsynced and then renamed over the target, so a crash never leaves a half-written file
  that a later stage would mistake for a finished one;
* appending (for outputs produced item by item, which a stage resumes after a crash)
  flushes after every row, and :func:`read_jsonl` with ``tolerate_truncated_tail=True``
  ignores a last line cut off by a kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from prorag.core.errors import DataError, decode_utf8

PathLike = str | os.PathLike[str]


def read_jsonl(path: PathLike, *, tolerate_truncated_tail: bool = False) -> Iterator[dict[str, Any]]:
    """Yield one JSON object per non-blank line of ``path`` (see :func:`read_jsonl_numbered`)."""
    for _, obj in read_jsonl_numbered(path, tolerate_truncated_tail=tolerate_truncated_tail):
        yield obj


def read_jsonl_numbered(path: PathLike, *, tolerate_truncated_tail: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of ``path``.

    Raises :class:`DataError` naming ``file:line`` for invalid JSON or a value that is not an
    object. With ``tolerate_truncated_tail`` a final line without its newline that does not
    parse is skipped (the signature of an append interrupted by a kill).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), "no such file")
    with path.open("rb") as f:
        lineno = 0
        for raw in f:
            lineno += 1
            line = decode_utf8(raw, str(path), lineno)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                if tolerate_truncated_tail and not line.endswith("\n"):
                    return
                raise DataError(f"{path}:{lineno}", f"invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{lineno}", f"expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def read_json(path: PathLike) -> Any:
    """Read a whole JSON document, reporting a parse error with its line and column."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), "no such file")
    text = decode_utf8(path.read_bytes(), str(path))
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}", f"invalid JSON ({e.msg} at column {e.colno})") from None


def create_temp_beside(path: Path) -> tuple[int, str]:
    """A new empty file ``.NAME.XXXXXXXX.tmp`` beside ``path``, open for writing: its descriptor and
    path. Created with mode 0666 less the umask (usually 0644), as ``open`` would create ``path``
    itself, unlike ``tempfile.mkstemp``'s 0600, which the rename would carry over to the result
    and hide it from other users (a retrieval server run by another account)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file beside {path}")


@contextlib.contextmanager
def atomic_writer(path: PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success fsync it and rename it over ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(str(path), "is a folder; expected the path of a file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp_beside(path)
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, **({} if binary else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def dumps(obj: Any) -> str:
    """One JSON line: UTF-8 kept readable, no trailing newline."""
    return json.dumps(obj, ensure_ascii=False)


def write_jsonl(path: PathLike, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` to ``path`` atomically; return how many were written."""
    n = 0
    with atomic_writer(path) as f:
        for row in rows:
            f.write(dumps(row))
            f.write("\n")
            n += 1
    return n


def write_json(path: PathLike, obj: Any) -> None:
    """Write one JSON document atomically, indented for people."""
    with atomic_writer(path) as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


class JsonlAppender:
    """Append rows to a JSONL file, flushing after each one (outputs that a stage resumes).

    If the file ends in a partial line (a previous writer was killed mid-row) that line is
    cut off first, so the file stays valid JSONL.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_partial_last_line(self.path)
        self._f: IO[str] = self.path.open("a", encoding="utf-8")

    def append(self, row: dict[str, Any]) -> None:
        self._f.write(dumps(row) + "\n")
        self._f.flush()

    def extend(self, rows: Sequence[dict[str, Any]]) -> None:
        """Append several rows in one write and one flush (rows that belong together, such as
        the pairs of one sibling set, are all there or, after a kill, mostly cut together)."""
        if rows:
            self._f.write("".join(dumps(row) + "\n" for row in rows))
            self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_partial_last_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        data = f.seek(0) or f.read()
        cut = data.rfind(b"\n") + 1
        f.truncate(cut)
