"""The exceptions of the Python API. Only a call that cannot run at all
raises: a usage error (isorun's exit code 2, with isorun's own message) or
a missing binary. A model that fails, crashes or times out is a `Result`
with that status, never an exception."""

from __future__ import annotations

from typing import Optional


class IsorunError(Exception):
    """Something kept isorun from running, or it ended in a way it never
    should (its exit code and last words are in the message)."""

    def __init__(self, message: str, *, exit_code: Optional[int] = None, stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        #: isorun's exit code, when it ran.
        self.exit_code = exit_code
        #: Everything isorun wrote on stderr.
        self.stderr = stderr


class UsageError(IsorunError, ValueError):
    """isorun refused the arguments before running anything (exit code 2):
    a missing model folder, an unknown option, a bad input file, no
    libtensorflow. The message is isorun's."""


class IsorunNotFound(IsorunError, FileNotFoundError):
    """The `isorun` binary is not where the package was installed, nor on `PATH`."""


class NotPicklable(IsorunError, TypeError):
    """`isorun.map` cannot send the function or an item to a worker process:
    it does not pickle (an open file, a lock, a socket, a loaded model or a
    live session, in the function's closure or globals or as an item).
    Raised before any process starts. The message names the function or the
    item and what in it does not travel."""
