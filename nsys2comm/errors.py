"""Errors that reach the user as one line: the file, what is wrong, what to do."""

from __future__ import annotations

import errno
import re

# C0 and C1 controls, DEL included: a file name holding a newline, \r or an ANSI escape must not split the one line
# or colour the terminal
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with control characters written as escapes (``\\n``, ``\\x1b``), for a line on a terminal;
    ``lines``: newlines kept (a message that quotes DuckDB's LINE and caret lines), every other control escaped."""
    rx = _CONTROL_BUT_NEWLINE if lines else _CONTROL
    return rx.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), str(text))


class Nsys2CommError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, what: str, *, path: str | None = None, hint: str | None = None):
        self.path, self.what, self.hint = path, what, hint
        super().__init__(self.line())

    def line(self) -> str:
        # the path is the user's (fully escaped); the message is ours, and may quote DuckDB's lines
        what = printable(self.what, lines=True)
        head = f"{printable(self.path)}: {what}" if self.path else what
        return f"{head} ({printable(self.hint, lines=True)})" if self.hint else head

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


# What the operating system refuses, as the user's kind of error: the target, what is wrong, what to do.
_OS_REFUSALS = {
    errno.ENOSPC: ("the disk is full", "free space or write to another disk; nothing of this file was kept"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space or write to another disk; nothing of this file was kept"),
    errno.EROFS: ("is on a read-only file system", "write the database or job directory to a writable place"),
    errno.EACCES: ("permission denied", "write where you have permission, or ask for it"),
    errno.EPERM: ("operation not permitted", "write where you have permission, or ask for it"),
}
_DUCKDB_OS = [(re.compile(p), code) for p, code in ((r"No space left on device", errno.ENOSPC),
                                                     (r"Disk quota exceeded", errno.EDQUOT),
                                                     (r"Read-only file system", errno.EROFS),
                                                     (r"Permission denied", errno.EACCES))]
_QUOTED_PATH = re.compile(r'(?:file|directory) \\?"([^"\\]+)\\?"|\'(/[^\']+)\'')


def as_user_error(e: BaseException, path: str | None = None) -> InputError | None:
    """An OS refusal (full disk, read-only file system, permissions), raised as such or inside a DuckDB error, as
    a one-line InputError naming its target; None for anything else."""
    code = getattr(e, "errno", None) if isinstance(e, OSError) else None
    target = getattr(e, "filename", None) if isinstance(e, OSError) else None
    if code not in _OS_REFUSALS:
        code = next((c for rx, c in _DUCKDB_OS if rx.search(str(e))), None)
        if code is None:
            return None
        m = _QUOTED_PATH.search(str(e))
        target = (m.group(1) or m.group(2)) if m else None
    what, hint = _OS_REFUSALS[code]
    return InputError(what, path=path or _target_of(target), hint=hint)


def _target_of(name) -> str | None:
    """The file a user named, for a temp or log file written beside it (a part's .NAME.tmp, a database's .wal)."""
    if not name:
        return None
    name = str(name)
    head, _, base = name.rpartition("/")
    if base.startswith(".") and base.endswith(".tmp"):
        return head or name
    return name[: -len(".wal")] if name.endswith(".wal") else name
