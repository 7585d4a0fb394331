"""Errors that reach the user as one line: the file, what is wrong, what to do."""

from __future__ import annotations

import re

# C0 and C1 controls, DEL included: a file name holding a newline, \r or an ANSI escape must not split the one line
# or colour the terminal
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters written as escapes (``\\n``, ``\\x1b``), for a line on a terminal."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), str(text))


class Nsys2CommError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, what: str, *, path: str | None = None, hint: str | None = None):
        self.path, self.what, self.hint = path, what, hint
        super().__init__(self.line())

    def line(self) -> str:
        head = f"{printable(self.path)}: {printable(self.what)}" if self.path else printable(self.what)
        return f"{head} ({printable(self.hint)})" if self.hint else head

    def __reduce__(self):  # raised in a decoder process: arrives with its path and hint, not as one flat line
        return _rebuild, (type(self), self.__dict__)


def _rebuild(cls: type[Nsys2CommError], state: dict) -> Nsys2CommError:
    err = cls.__new__(cls)
    err.__dict__.update(state)
    Exception.__init__(err, err.line())
    return err


class InputError(Nsys2CommError):
    """A trace or database that cannot be read as given."""


class UsageError(Nsys2CommError):
    exit_code = 2


class UnknownQuery(UsageError):
    """A name that is no runnable catalog query; ``suggestions`` are close names."""

    def __init__(self, name: str, suggestions: list[str]):
        self.name, self.suggestions = name, suggestions
        super().__init__(f"no query named {name!r}",
                         hint=f"did you mean {' or '.join(suggestions)}?" if suggestions else None)


class HelperNotRunnable(UsageError):
    """A catalog macro that takes table names: it is called from SQL, not run on its own."""

    def __init__(self, name: str, required: list[str]):
        self.name = name
        args = ", ".join(required)
        super().__init__(f"{name} is a SQL helper taking table names ({args}), not a query to run on its own",
                         hint=f"call it in SQL: SELECT * FROM {name}({args})")
