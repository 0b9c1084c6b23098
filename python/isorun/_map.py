"""`isorun.map(fn, items)`: the user's own loop body, each call in a fresh
process forked from a warm Python zygote, with `run`'s supervision
(deadlines, memory limits, crashes as results, journal and resume, reports).

A thin client of `isorun map`: the supervisor owns every process. This side
only checks that the function and each item can travel (cloudpickle, before
any process starts), writes them into a private temporary folder, starts
one `isorun map --function-pickle ... --items-pickled ...` process and turns
its JSON records back into `MapResult`s, in item order, with each value
unpickled from the file the call's process wrote. Nothing here imports
NumPy or TensorFlow; cloudpickle is imported when `map` is called."""

from __future__ import annotations

import hashlib
import json
import operator
import os
import pickle
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _binary
from ._process import Stream, remove
from .errors import IsorunError, NotPicklable

PathLike = Union[str, "os.PathLike[str]"]

#: What travels by pickle: protocol 5 (out-of-band buffers, Python 3.8+).
PICKLE_PROTOCOL = 5
#: How much of an item's `repr` the records show.
REPR_CHARS = 200
#: The longest JSON text of an item that records show as JSON (a longer
#: one is shown by its shortened `repr`).
JSON_ITEM_CHARS = 4096

_NOT_GIVEN: Any = ...

_TRAVEL_HINT = (
    "each call runs in a fresh process that gets the function and its item by pickle, and an open file, "
    "a lock, a socket, a loaded model or a live session cannot cross: pass paths (or other plain data) "
    "and open or load them inside the function"
)


@dataclass(frozen=True)
class CallError:
    """Why a call did not end `ok`: isorun's error kind (`exception` for a
    Python exception, `value_too_large`, ...), the message (`ValueError:
    text` for an exception) and, for an exception, its Python traceback."""

    kind: str
    message: str
    traceback: Optional[str] = None


@dataclass(frozen=True, eq=False)
class MapResult:
    """One call of `isorun.map`, as isorun's record says it ended.

    `item` is the item as it was given (the object itself); `status` is
    `"ok"` or another of isorun's outcomes (`error`: the function raised,
    `crashed`: a signal ended the process, `timeout`, `memory_limit`,
    `not_run`: the run stopped before it, ...); `value` is what the
    function returned when it is ok; `record` is the whole JSON record."""

    item: Any
    status: str
    value: Any = None
    error: Optional[CallError] = None
    wall_ms: Optional[int] = None
    peak_rss_bytes: Optional[int] = None
    index: int = -1
    record: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Whether the call returned."""
        return self.status == "ok"


class MapRun(Stream[MapResult]):
    """A running `isorun map` whose results arrive in item order, each as
    soon as its call (and every call before it) has ended. Leaving early
    (`break`, an exception, `close()`, Ctrl-C, garbage collection, the
    interpreter's exit) stops isorun and every process below it, and
    removes the temporary folder holding the pickles."""

    def __init__(self, args: List[str], *, items: List[Any], values_dir: Path, cleanup: List[Path],
                 env: Mapping[str, str], keep_values: bool = False) -> None:
        self._items = items
        self._values_dir = values_dir
        self._keep_values = keep_values
        super().__init__(args, cleanup=cleanup, env=env, echo=True)

    def _result(self, record: Dict[str, Any]) -> MapResult:
        index = record.get("index")
        if not isinstance(index, int) or not 0 <= index < len(self._items):
            raise IsorunError(f"isorun map wrote a record for item index {index!r} of {len(self._items)}: {record}")
        item = self._items[index]
        # The caller holds the item through its result; the run holds it no longer.
        self._items[index] = None
        status = str(record.get("status", ""))
        error = _call_error(record.get("error"), status, record)
        value = None
        if status == "ok":
            try:
                value = self._value(record)
            except Exception as e:  # the value came back but does not load here
                status = "error"
                error = CallError("value_not_loadable",
                                  f"the function returned a {record.get('value_type', 'value')} that does not "
                                  f"unpickle in this process: {type(e).__name__}: {e}")
        return MapResult(
            item=item,
            status=status,
            value=value,
            error=error,
            wall_ms=record.get("wall_ms"),
            peak_rss_bytes=record.get("peak_rss_bytes"),
            index=index,
            record=record,
        )

    def _value(self, record: Dict[str, Any]) -> Any:
        """The pickled value the call's process wrote (read, then removed,
        unless a journal keeps it for a later resume), else the record's
        JSON value. A resumed item's value file is isorun's copy, in this
        run's folder, of the one its earlier run wrote."""
        named = record.get("value_file")
        if named:
            path = Path(named)
            if path.resolve().parent != self._values_dir.resolve():
                raise IsorunError(f"isorun map named a value file outside {self._values_dir}: {named}")
            try:
                with open(path, "rb") as f:
                    return pickle.load(f)
            finally:
                if not self._keep_values:
                    try:
                        path.unlink()
                    except OSError:
                        pass
        return record.get("value")


def _call_error(error: Any, status: str, record: Dict[str, Any]) -> Optional[CallError]:
    """The record's error; for a call that did not end `ok` and whose record
    names none, one saying the status (and the signal of a crash), so
    `r.error.message` is there for every result that is not ok."""
    if not isinstance(error, dict):
        if status == "ok":
            return None
        signal_name = record.get("signal")
        said = f"{status}: ended by {signal_name}" if signal_name else status
        return CallError(status, said)
    traceback = error.get("traceback")
    return CallError(str(error.get("kind", "")), str(error.get("message", "")),
                     str(traceback) if traceback is not None else None)


def map(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    jobs: Optional[int] = 1,
    timeout: Optional[float] = None,
    memory_limit: Union[int, str, None] = None,
    retries: int = 0,
    journal: Optional[PathLike] = None,
    resume: bool = False,
    report: Optional[PathLike] = None,
    junit: Optional[PathLike] = None,
    html: Optional[PathLike] = None,
    gpus: Union[str, int, Sequence[Union[int, str]], None] = None,
    preload: Union[str, Sequence[str], None] = None,
    sandbox: Union[str, bool] = _NOT_GIVEN,
    writable: Sequence[PathLike] = (),
    network: bool = False,
    value_cap: Union[int, str, None] = None,
    python: Optional[PathLike] = None,
    **options: Any,
) -> MapRun:
    """Call `fn(item)` for each item, each call in its own fresh process
    forked from a warm Python zygote, and yield a `MapResult` per item, in
    item order, as calls end. The process ends after its call, so the
    operating system takes back whatever the call leaked.

    `fn`: a module-level function, or a function, closure or lambda defined
    in `__main__` or a notebook (sent by value with its globals, by
    cloudpickle). `items`: any iterable of picklable objects (paths, numbers,
    NumPy arrays, ...). What cannot travel (an open file, a lock, a loaded
    model) raises `isorun.errors.NotPicklable` before any process starts:
    pass paths and load inside the function.

    `jobs` calls at once; `timeout` (seconds) and `memory_limit` (bytes, or
    `"8G"`) per call; `retries`, `journal`/`resume`, `report`/`junit`/`html`,
    `gpus` (`"0,1"`, `[0, 1]` or `"all"`: one device per worker), `preload`
    (modules the zygote imports before it forks; default: those the
    function refers to, for a function from `__main__`, else what its module
    imports), `sandbox` (`"off"` to turn it off), `writable` (folders the
    calls may write besides a private temp folder), `network` (let calls
    reach the network), `value_cap` (the largest value a call may return,
    default 1G), `python` (the interpreter; default this one) and every
    other keyword are `isorun map`'s options with `_` for `-`
    (`start_timeout=600`). A call that raises, crashes, runs past its
    deadline or its limit is a result with that status; the next item runs
    regardless. What calls print reaches this process's `sys.stderr` line
    by line as it comes. Leaving the loop, or Ctrl-C, stops everything.

    With `journal` and `resume=True`, items the journal holds (failed ones
    too) are not called again; an ok one's `.value` is the one it returned
    then, kept as pickles in `JOURNAL.values/` (a run without `resume`
    starts the journal and its values afresh). Resume matches each item by
    its pickle and the function by its pickle: a function from `__main__`
    or a notebook carries the globals and helpers it uses, so changing any
    of them reruns every item; a module-level function goes by name with
    its own source's SHA-256 (as the `isorun map` command matches it), so
    editing its body reruns every item, but editing a helper it calls does
    not (run without `resume`).

    >>> for r in isorun.map(evaluate, paths, jobs=2, timeout=600, memory_limit="8G"):
    ...     print(r.item, r.status, r.value if r.ok else r.error.message)
    """
    if not callable(fn):
        raise TypeError(f"isorun.map: fn must be callable, not {type(fn).__name__}")
    if isinstance(items, (str, bytes, os.PathLike)):
        raise TypeError(f"isorun.map: items must be an iterable of items, not one {type(items).__name__} "
                        f"({items!r}); give a list: [{items!r}]")
    for reserved in ("function_pickle", "items_pickled", "items_from", "values_dir", "json", "format"):
        if reserved in options:
            raise TypeError(f"isorun.map: {reserved}= is set by the API")
    try:
        import cloudpickle
    except ImportError as e:
        raise IsorunError("isorun.map needs cloudpickle to send the function to its worker processes: "
                          "pip install cloudpickle") from e
    binary = _binary.executable()
    name = function_name(fn)
    function_bytes = _function_pickle(fn, name, cloudpickle)
    listed = list(items)

    scratch = Path(tempfile.mkdtemp(prefix="isorun-map-"))
    cleanup = [scratch]
    try:
        function_file = scratch / "function.pkl"
        function_file.write_bytes(function_bytes)
        del function_bytes
        item_dir = scratch / "items"
        item_dir.mkdir()
        values_dir = _journal_values(journal, resume) if journal is not None else scratch / "values"
        values_dir.mkdir(exist_ok=True)
        items_from = scratch / "items.jsonl"
        with open(items_from, "w", encoding="utf-8") as lines:
            for index, item in enumerate(listed):
                path = item_dir / f"{index}.pkl"
                _item_pickle(item, index, path, cloudpickle)
                lines.write(json.dumps(_item_line(item, path)) + "\n")

        named: Dict[str, Any] = {
            "jobs": jobs,
            "timeout": timeout,
            "memory_limit": memory_limit,
            "retries": retries,
            "journal": journal,
            "resume": resume,
            "report": report,
            "junit": junit,
            "html": html,
            "gpus": _gpu_list(gpus),
            "preload": _preload(fn, preload),
            "sandbox": _sandbox(sandbox),
            "writable": [os.fspath(w) for w in writable] if not isinstance(writable, (str, os.PathLike))
            else [os.fspath(writable)],
            "network": network,
            "value_cap": value_cap,
            "python": os.fspath(python) if python is not None else sys.executable,
        }
        flags = _binary.option_flags({**named, **options})
        args = [binary, "map", "--json", f"--function-pickle={function_file}", "--items-pickled",
                f"--items-from={items_from}", f"--values-dir={values_dir}", *flags, "--", name]
        env = _environment(python)
    except BaseException:
        remove(cleanup)
        raise
    return MapRun(args, items=listed, values_dir=values_dir, cleanup=cleanup, env=env,
                  keep_values=journal is not None)


def _journal_values(journal: PathLike, resume: bool) -> Path:
    """This run's folder of value pickles when there is a journal: beside
    it (`JOURNAL.values/run-*`), kept after the run, since a resumed ok
    item gets its value from the file its journal record names (isorun
    copies it into the resuming run's folder; one that is gone runs
    again). Each run has a folder of its own: files are named by item
    index, and a resumed run whose items moved would otherwise overwrite
    an earlier value before it is copied. A run without `resume` starts
    the journal afresh, and so its values."""
    root = Path(os.path.abspath(os.fspath(journal)) + ".values")
    if not resume and root.is_dir():
        shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="run-", dir=root))


def function_name(fn: Callable[..., Any]) -> str:
    """`module:qualified.name`, the record's `function` (`__main__:evaluate`,
    `__main__:<lambda>`, `pkg.mod:Class.method`)."""
    module = getattr(fn, "__module__", None) or "__main__"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qualname}"


class _WithSource:
    """A function that goes by reference, pickled with its source's SHA-256
    beside it. isorun's journal knows the function by its pickle's bytes,
    and a function pickled by reference is only its name, so without this
    editing its body would let `resume=True` hand back what the old body
    returned. Unpickled, it is the function itself (`operator.getitem` of
    the pair, both standard library): no wrapper frame in tracebacks, and
    nothing of isorun needed in the worker."""

    def __init__(self, fn: Callable[..., Any], source_sha256: str) -> None:
        self.fn = fn
        self.source_sha256 = source_sha256

    def __reduce__(self) -> Tuple[Any, ...]:
        return operator.getitem, ((self.fn, self.source_sha256), 0)


def _by_reference(fn: Callable[..., Any], cloudpickle: Any) -> bool:
    """Whether cloudpickle pickles `fn` by its name only (a function its
    module's import gives back) rather than by value."""
    should = getattr(getattr(cloudpickle, "cloudpickle", None), "_should_pickle_by_reference", None)
    if should is not None:
        try:
            return bool(should(fn))
        except Exception:
            return False
    module = sys.modules.get(getattr(fn, "__module__", None) or "__main__")
    if module is None or module.__name__ == "__main__":
        return False
    found: Any = module
    for part in (getattr(fn, "__qualname__", None) or "<>").split("."):
        found = getattr(found, part, None)
    return found is fn


def _source_sha256(fn: Callable[..., Any]) -> Optional[str]:
    """The SHA-256 of the function's source, else of its module's file, as
    `isorun map` computes the identity of the function it imports; None
    when neither can be read."""
    import inspect

    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except Exception:
        pass
    try:
        with open(sys.modules[fn.__module__].__file__, "rb") as f:  # type: ignore[arg-type]
            return hashlib.sha256(f.read()).hexdigest()
    except Exception:
        return None


def _function_pickle(fn: Callable[..., Any], name: str, cloudpickle: Any) -> bytes:
    try:
        sent: Any = fn
        if _by_reference(fn, cloudpickle):
            source_sha256 = _source_sha256(fn)
            if source_sha256 is not None:
                sent = _WithSource(fn, source_sha256)
        return bytes(cloudpickle.dumps(sent, protocol=PICKLE_PROTOCOL))
    except Exception as e:
        culprit = _culprit(fn, cloudpickle)
        where = ""
        if culprit is not None:
            what, value, why = culprit
            where = f" through {what} (a {type(value).__module__}.{type(value).__qualname__})"
            e = why
        raise NotPicklable(f"isorun.map: the function {name} cannot be sent to its worker processes{where}: "
                           f"{type(e).__name__}: {e}; {_TRAVEL_HINT}") from e


def _culprit(fn: Callable[..., Any], cloudpickle: Any) -> Optional[Tuple[str, Any, BaseException]]:
    """The first value the function carries (a closure cell, a global its
    code names, a default) that does not pickle, with how it is reached."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    carried: List[Tuple[str, Any]] = []
    for cell_name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            carried.append((f"`{cell_name}` in its closure", cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    scope = getattr(fn, "__globals__", {}) or {}
    for global_name in sorted(_code_names(code)):
        if global_name in scope:
            carried.append((f"the global `{global_name}`", scope[global_name]))
    for default in getattr(fn, "__defaults__", None) or ():
        carried.append(("a default argument", default))
    for key, default in (getattr(fn, "__kwdefaults__", None) or {}).items():
        carried.append((f"the default of `{key}`", default))
    for what, value in carried:
        try:
            cloudpickle.dumps(value, protocol=PICKLE_PROTOCOL)
        except Exception as e:
            return what, value, e
    return None


def _code_names(code: types.CodeType) -> set:
    """The global names a code object and the code nested in it refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _item_pickle(item: Any, index: int, path: Path, cloudpickle: Any) -> None:
    """Pickles the item into `path`, written as it is pickled (a large array
    is not held twice in memory)."""
    try:
        with open(path, "wb") as f:
            cloudpickle.dump(item, f, protocol=PICKLE_PROTOCOL)
    except Exception as e:
        raise NotPicklable(f"isorun.map: item {index} ({_shown(item, 80)}) cannot be sent to a worker process: "
                           f"{type(e).__name__}: {e}; {_TRAVEL_HINT}") from e


def _item_line(item: Any, path: Path) -> Dict[str, Any]:
    """The item's `--items-pickled` line: its pickle's file, its `repr`, and,
    for an item that is plain JSON data, that JSON, which records then
    show as `"item"` (an int as `1`, not `"1"`)."""
    line: Dict[str, Any] = {"file": str(path), "repr": _shown(item)}
    if _is_json(item):
        text = json.dumps(item, allow_nan=False)
        if len(text) <= JSON_ITEM_CHARS:
            line["json"] = json.loads(text)
    return line


def _is_json(value: Any, depth: int = 0) -> bool:
    """Whether `value` is JSON data that comes back from JSON as it is:
    None, bool, int, a finite float, str, and lists and str-keyed dicts of
    those (not a tuple, which JSON would make a list)."""
    if depth > 32:
        return False
    if value is None or type(value) in (bool, int, str):
        return True
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if type(value) is list:
        return all(_is_json(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _is_json(v, depth + 1) for k, v in value.items())
    return False


def _shown(item: Any, chars: int = REPR_CHARS) -> str:
    """What the records show as `item`: a string as it is (a path), else
    its `repr`, shortened."""
    try:
        text = item if isinstance(item, str) else repr(item)
    except Exception:
        text = f"<{type(item).__qualname__}>"
    return text if len(text) <= chars else text[: chars - 3] + "..."


def _gpu_list(gpus: Any) -> Optional[str]:
    if gpus is None:
        return None
    if isinstance(gpus, (list, tuple)):
        return ",".join(str(g) for g in gpus)
    return str(gpus)


def _sandbox(sandbox: Any) -> Optional[str]:
    """`--sandbox`: left to isorun's default unless given; `False` is `off`."""
    if sandbox is _NOT_GIVEN or sandbox is None:
        return None
    if sandbox is True:
        return "strict"
    if sandbox is False:
        return "off"
    return str(sandbox)


def _preload(fn: Callable[..., Any], preload: Union[str, Sequence[str], None]) -> Optional[str]:
    """`--preload`: the caller's list; else, for a function from `__main__`
    (whose module the zygote cannot import), the modules the function
    refers to (directly, through the `__main__` functions it calls, and
    through its closure); else nothing, and isorun preloads what the
    function's module imports."""
    if preload is not None:
        return preload if isinstance(preload, str) else ",".join(preload)
    if getattr(fn, "__module__", None) != "__main__":
        return None
    found = _referenced_modules(fn)
    return ",".join(found) if found else None


def _referenced_modules(fn: Callable[..., Any]) -> List[str]:
    found: List[str] = []
    seen: set = set()

    def note(module: Optional[str]) -> None:
        if not module or module in found:
            return
        top = module.split(".")[0]
        if top in ("__main__", "builtins", "isorun") or top in sys.builtin_module_names:
            return
        found.append(module)

    def visit(value: Any) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, types.ModuleType):
            note(value.__name__)
        elif isinstance(value, types.FunctionType):
            if value.__module__ != "__main__":
                note(value.__module__)
                return
            scope = value.__globals__
            for global_name in _code_names(value.__code__):
                if global_name in scope:
                    visit(scope[global_name])
            for cell in value.__closure__ or ():
                try:
                    visit(cell.cell_contents)
                except ValueError:
                    pass
        elif isinstance(value, (type, types.BuiltinFunctionType)):
            note(getattr(value, "__module__", None))

    visit(fn)
    return found


def _environment(python: Optional[PathLike]) -> Dict[str, str]:
    """isorun's environment: this one, with this interpreter's own folders
    on `sys.path` (the script's folder, the working directory, a test's
    root: not the standard library or site-packages, which the
    interpreter finds itself) put first on `PYTHONPATH`, so the zygote
    imports the modules a function pickled by reference names. Another
    interpreter (`python=`) gets the environment as it is."""
    env = dict(os.environ)
    if python is not None:
        return env
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    ours: List[str] = []
    for entry in sys.path:
        folder = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(folder) or folder in ours:
            continue
        if any(folder == p or folder.startswith(p + os.sep) for p in prefixes):
            continue
        ours.append(folder)
    given = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(ours + [p for p in given if os.path.realpath(p) not in ours])
    return env
