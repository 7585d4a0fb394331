"""Errors that reach the user as one line: the file, what is wrong, what to do."""

from __future__ import annotations


class Nsys2CommError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, what: str, *, path: str | None = None, hint: str | None = None):
        self.path, self.what, self.hint = path, what, hint
        super().__init__(self.line())

    def line(self) -> str:
        head = f"{self.path}: {self.what}" if self.path else self.what
        return f"{head} ({self.hint})" if self.hint else head


class InputError(Nsys2CommError):
    """A trace or database that cannot be read as given."""


class UsageError(Nsys2CommError):
    exit_code = 2
