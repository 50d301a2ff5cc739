"""Exception types shared by the package.

``DataError`` is raised for any bad input file. Its message always starts with the place
(``file:line`` or ``file``) and then says which field is wrong and what was expected, so that
a user can fix the input without reading our code.
"""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data: the message names the file, line and field, and what was expected."""

    def __init__(self, where: str, what: str) -> None:
        self.where = where
        self.what = what
        super().__init__(f"{where}: {what}")
