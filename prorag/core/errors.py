"""Exception types shared by the package.

``DataError`` is raised for any bad input file. Its message always starts with the place
(``file:line`` or ``file``) and then says which field is wrong and what was expected, so that
a user can fix the input without reading our code. ``ServiceUnavailableError`` is raised
when a service the run depends on (a retrieval server, an LLM endpoint) cannot be reached
after its retries; the command line reports both as one line.
"""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data: the message names the file, line and field, and what was expected."""

    def __init__(self, where: str, what: str) -> None:
        self.where = where
        self.what = what
        super().__init__(f"{where}: {what}")


class ServiceUnavailableError(ConnectionError):
    """A service the run depends on (retrieval server, LLM endpoint) failed after every retry."""


def decode_utf8(data: bytes, where: str, first_line: int = 1) -> str:
    """``data`` (the bytes of the file ``where`` from line ``first_line`` on) decoded as UTF-8.

    A binary file or one in another encoding is a :class:`DataError` naming ``file:line``,
    where Python's own ``UnicodeDecodeError`` names neither the file nor the line.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{where}:{line}",
            f"not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}): a binary file or another encoding?",
        ) from None
