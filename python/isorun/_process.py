"""One running `isorun` process whose JSON Lines records the API turns into
results: shared by `isorun.run`/`isorun.evaluate` (`Run`) and `isorun.map`
(`MapRun`), so both stop isorun, and every process below it, the same way
on a `break`, an exception, Ctrl-C, garbage collection or interpreter exit,
and both remove their temporary files then."""

from __future__ import annotations

import collections
import json
import shutil
import signal
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import IO, Any, Deque, Dict, Generic, Iterator, List, Mapping, Optional, TypeVar

from .errors import IsorunError, UsageError

#: How long a stopped run may take to end after SIGINT before it is killed.
STOP_GRACE_SECONDS = 10.0
#: How much of the end of isorun's stderr a stream keeps for its error
#: messages (`stderr`, `IsorunError.stderr`): the rest is passed on or dropped.
STDERR_TAIL_CHARS = 64 * 1024
#: The longest piece of a line passed on at once (a call may print a
#: long line without a newline).
STDERR_PIECE_CHARS = 64 * 1024

T = TypeVar("T")


class Stream(Iterator[T], Generic[T]):
    """A running `isorun` process whose records arrive in order, each turned
    into a result (`_result`) as soon as isorun writes it.

    Iterate over it, or use it as a context manager. Leaving early (`break`,
    an exception, `close()`, Ctrl-C) stops isorun, which stops its workers:
    no process is left behind. One nothing holds any more (after a `break`,
    or `del`) is stopped when it is collected, and one still running when
    Python exits is stopped then; `cleanup`'s paths are removed at that end.
    A usage error (exit code 2) raises `UsageError` from the first `next()`.

    isorun's stderr is read as it arrives; only its last STDERR_TAIL_CHARS
    are kept (for error messages). With `echo`, each line is also written to
    this process's `sys.stderr` as it comes (what the calls print, in a
    terminal or a notebook)."""

    def __init__(self, args: List[str], *, cleanup: List[Path], env: Optional[Mapping[str, str]] = None,
                 echo: bool = False) -> None:
        self.args = args
        self._stderr_chunks: Deque[str] = collections.deque()
        self._process: Optional[subprocess.Popen[str]] = None
        try:
            self._process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                errors="replace",
                bufsize=1,
                env=dict(env) if env is not None else None,
            )
        except BaseException:
            remove(cleanup)
            raise
        # Nothing below holds this object: the reader thread gets the pipe
        # and the list it fills, and the finalizer the process and the
        # temporaries. One nobody holds (a `break`, an exception, `del`)
        # is collected, and collecting it stops isorun.
        self._stderr_reader = threading.Thread(
            target=_read_stderr, args=(self._process.stderr, self._stderr_chunks, echo), daemon=True
        )
        self._stderr_reader.start()
        self._finalizer = weakref.finalize(self, _stop, self._process, self._stderr_reader, cleanup)

    @property
    def pid(self) -> Optional[int]:
        """The isorun process's id (its workers are its children)."""
        return self._process.pid if self._process else None

    @property
    def stderr(self) -> str:
        """The end of what isorun has written on stderr so far (warnings,
        notes, its error): its last STDERR_TAIL_CHARS characters."""
        return "".join(list(self._stderr_chunks))[-STDERR_TAIL_CHARS:]

    def __iter__(self) -> "Stream[T]":
        return self

    def __next__(self) -> T:
        if not self._finalizer.alive or self._process is None:
            raise StopIteration
        assert self._process.stdout is not None
        try:
            while True:
                line = self._process.stdout.readline()
                if not line:
                    self._end()
                    raise StopIteration
                line = line.strip()
                if not line.startswith("{"):
                    continue
                return self._result(json.loads(line))
        except StopIteration:
            raise
        except BaseException:
            # KeyboardInterrupt, or a record that cannot be read: stop isorun first.
            self.close()
            raise

    def _result(self, record: Dict[str, Any]) -> T:
        raise NotImplementedError

    def _end(self) -> None:
        """isorun closed its stdout: wait for it and judge its exit code."""
        assert self._process is not None
        code = self._process.wait()
        self._stderr_reader.join(timeout=5)
        self._finalizer()
        if code in (0, 1):
            return
        stderr = self.stderr
        said = last_error(stderr)
        if code == 2:
            raise UsageError(said or "isorun refused the arguments (exit code 2)", exit_code=code, stderr=stderr)
        if code in (130, 143, -signal.SIGINT, -signal.SIGTERM):
            raise KeyboardInterrupt(said or "isorun was interrupted")
        raise IsorunError(f"isorun ended with exit code {code}" + (f": {said}" if said else ""),
                          exit_code=code, stderr=stderr)

    def close(self) -> None:
        """Stop isorun (SIGINT, as Ctrl-C would; SIGKILL after a grace
        period) and wait for it; its workers end with it. Collecting it
        (nothing holds it after a `break`) does the same."""
        self._finalizer()

    def __enter__(self) -> "Stream[T]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_stderr(pipe: IO[str], chunks: Deque[str], echo: bool) -> None:
    """The stderr reader thread: reads what isorun writes, a line (or a
    STDERR_PIECE_CHARS piece of a long one) at a time, until EOF (every
    process holding the pipe has ended), then closes the pipe. Keeps the
    last STDERR_TAIL_CHARS in `chunks`; with `echo`, writes each line to
    `sys.stderr` (looked up each time: a notebook or pytest replaces it)."""
    kept = 0
    try:
        for piece in iter(lambda: pipe.readline(STDERR_PIECE_CHARS), ""):
            if echo:
                _echo(piece)
            chunks.append(piece)
            kept += len(piece)
            while kept - len(chunks[0]) >= STDERR_TAIL_CHARS:
                kept -= len(chunks.popleft())
    except (OSError, ValueError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _echo(text: str) -> None:
    """Writes isorun's stderr text on this process's stderr; a stderr that
    is gone or closed loses it, and the run goes on."""
    target = sys.stderr
    if target is None:
        return
    try:
        target.write(text)
        target.flush()
    except (OSError, ValueError):
        pass


def _stop(process: "subprocess.Popen[str]", stderr_reader: threading.Thread, cleanup: List[Path]) -> None:
    """A stream's end, run once (`weakref.finalize`): by `close()`, the run's
    last record, the stream being collected, or the interpreter's exit.

    SIGINT first, as Ctrl-C: isorun starts nothing new, sends its workers
    SIGTERM (SIGKILL after its own 2 s grace), records what did not run and
    exits. Our end of its stdout is closed, so a run with more records to
    write than a pipe holds is not blocked on a reader that has left. A
    supervisor still there after STOP_GRACE_SECONDS is killed; its workers
    and zygote die with it (PR_SET_PDEATHSIG). The stderr pipe is left to
    its reader thread: closing it here would wait on that thread's read."""
    try:
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
            if process.stdout is not None:
                try:
                    process.stdout.close()
                except OSError:
                    pass
            try:
                process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        elif process.stdout is not None:
            try:
                process.stdout.close()
            except OSError:
                pass
        if stderr_reader is not threading.current_thread():
            stderr_reader.join(timeout=1)
    finally:
        remove(cleanup)


def remove(paths: List[Path]) -> None:
    """Removes each path (a folder with what it holds), then empties the list."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except OSError:
                pass
    paths.clear()


def last_error(stderr: str) -> str:
    """isorun's `isorun: error: ...` line (or clap's `error: ...`) with the
    indented lines that follow it (a list, such as the inputs a signature
    takes), else its last line."""
    raw = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    for at in range(len(raw) - 1, -1, -1):
        for prefix in ("isorun: error: ", "error: "):
            if raw[at].strip().startswith(prefix):
                listed = []
                for line in raw[at + 1:]:
                    if not line.startswith("  "):
                        break
                    listed.append(line)
                return "\n".join([raw[at].strip()[len(prefix):]] + listed)
    return raw[-1].strip() if raw else ""
