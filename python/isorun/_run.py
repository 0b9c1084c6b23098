"""`isorun.run` and `isorun.evaluate`: one `isorun run --json` (or `isorun
eval --json`) process per call, its JSON records read line by line as units
finish, each turned into a `Result` with the outputs read back from the
run's `--output-dir` as NumPy arrays. The Python process never loads a model
or TensorFlow, so its memory stays flat however many models go through."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import _binary
from ._process import Stream, last_error
from .errors import IsorunError, UsageError

PathLike = Union[str, "os.PathLike[str]"]
#: Inputs: a path (an `.npz`, a `.json` object), or a mapping from input
#: name to a NumPy array (or anything `numpy.asarray` takes) or to a path of
#: an `.npy`/`.json` file.
Inputs = Union[PathLike, Mapping[str, Any], None]


@dataclass(frozen=True)
class ModelError:
    """Why a unit did not end `ok`: isorun's error kind and message."""

    kind: str
    message: str


@dataclass(frozen=True)
class Result:
    """One model's unit, as isorun's JSON record says it ended.

    `status` is `"ok"` or one of isorun's other outcomes (`error`,
    `crashed`, `timeout`, `memory_limit`, `mismatch`, `not_run`, ...);
    `outputs` holds the signature's outputs as NumPy arrays when it is ok.
    `record` is the whole JSON record, for the keys not lifted out here."""

    model: str
    path: str
    status: str
    outputs: Dict[str, Any] = field(default_factory=dict)
    error: Optional[ModelError] = None
    wall_ms: Optional[int] = None
    load_ms: Optional[int] = None
    run_ms: Optional[int] = None
    peak_rss_bytes: Optional[int] = None
    #: `isorun.evaluate` only: the metrics and how many examples were scored.
    metrics: Optional[Dict[str, Any]] = None
    examples: Optional[int] = None
    record: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Whether the unit ended `ok`."""
        return self.status == "ok"


class Run(Stream[Result]):
    """A running `isorun` process whose results arrive in model order, each
    as soon as its unit (and every unit before it) has finished.

    Iterate over it, or use it as a context manager. Leaving early (`break`,
    an exception, `close()`, Ctrl-C) stops isorun, which stops its workers:
    no process is left behind. A Run nothing holds any more (after a
    `break`, or `del run`) is stopped when it is collected, and one still
    running when Python exits is stopped then. A usage error (exit code 2)
    raises `UsageError` from the first `next()`."""

    def __init__(self, args: List[str], *, output_dir: Optional[Path], keep_outputs: bool,
                 cleanup: List[Path]) -> None:
        self._output_dir = output_dir
        self._keep_outputs = keep_outputs
        super().__init__(args, cleanup=cleanup)

    def _result(self, record: Dict[str, Any]) -> Result:
        outputs: Dict[str, Any] = {}
        model = str(record.get("model", ""))
        if record.get("status") == "ok" and self._output_dir is not None:
            outputs = _read_outputs(self._output_dir / model, record.get("outputs") or {})
            if not self._keep_outputs:
                shutil.rmtree(self._output_dir / model, ignore_errors=True)
        error = record.get("error")
        return Result(
            model=model,
            path=str(record.get("path", "")),
            status=str(record.get("status", "")),
            outputs=outputs,
            error=ModelError(str(error.get("kind", "")), str(error.get("message", ""))) if isinstance(error, dict) else None,
            wall_ms=record.get("wall_ms"),
            load_ms=record.get("load_ms"),
            run_ms=record.get("run_ms"),
            peak_rss_bytes=record.get("peak_rss_bytes"),
            metrics=record.get("metrics"),
            examples=record.get("examples"),
            record=record,
        )


def _read_outputs(folder: Path, described: Mapping[str, Any]) -> Dict[str, Any]:
    import numpy as np

    outputs: Dict[str, Any] = {}
    for name in described:
        path = folder / f"{name}.npy"
        if path.is_file():
            outputs[name] = np.load(path, allow_pickle=False)
    return outputs


def _models(models: Union[PathLike, Iterable[PathLike]]) -> List[str]:
    if isinstance(models, (str, os.PathLike)):
        models = [models]
    listed = [os.fspath(m) for m in models]
    if not listed:
        raise UsageError("no models: give at least one SavedModel folder (or a folder of them)")
    return listed


def _input_flags(inputs: Inputs, scratch: Path) -> List[str]:
    """`--inputs FILE` for a path; for a mapping, `--input NAME=PATH` for
    each path and one temporary `.npz` for the arrays."""
    if inputs is None:
        return []
    if isinstance(inputs, (str, os.PathLike)):
        return [f"--inputs={os.fspath(inputs)}"]
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs: expected a path or a mapping from input name to array or path, not {type(inputs).__name__}")
    flags: List[str] = []
    arrays: Dict[str, Any] = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"inputs: input names are non-empty strings, not {name!r}")
        if isinstance(value, (str, os.PathLike)):
            flags.append(f"--input={name}={os.fspath(value)}")
        else:
            arrays[name] = value
    if arrays:
        import numpy as np

        npz = scratch / "inputs.npz"
        np.savez(npz, **{name: np.asarray(value) for name, value in arrays.items()})
        flags.append(f"--inputs={npz}")
    return flags


def _start(command: str, models: Union[PathLike, Iterable[PathLike]], inputs: Inputs, named: Dict[str, Any],
           options: Dict[str, Any]) -> Run:
    binary = _binary.executable()
    model_args = _models(models)
    for reserved in ("json", "format", "inputs", "input"):
        if reserved in options:
            raise TypeError(f"{reserved}=: the API sets it; give inputs with inputs=")
    output_dir = options.pop("output_dir", None)
    keep_outputs = output_dir is not None
    scratch = Path(tempfile.mkdtemp(prefix="isorun-py-"))
    try:
        flags = _input_flags(inputs, scratch)
        # `run` yields each model's outputs, read back from --output-dir;
        # `eval` yields metrics, and writes outputs only when asked (a model
        # with a string or scalar head, such as `classes`, would otherwise
        # fail every unit writing outputs nobody wanted).
        if output_dir is None and command == "run":
            output_dir = scratch / "outputs"
        if output_dir is not None:
            flags.append(f"--output-dir={os.fspath(output_dir)}")
        flags += _binary.option_flags({**named, **options})
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    args = [binary, command, "--json", *flags, "--", *model_args]
    reads = Path(output_dir) if output_dir is not None and command == "run" else None
    return Run(args, output_dir=reads, keep_outputs=keep_outputs, cleanup=[scratch])


def run(
    models: Union[PathLike, Iterable[PathLike]],
    inputs: Inputs = None,
    *,
    signature: Optional[str] = None,
    jobs: Optional[int] = None,
    timeout: Optional[float] = None,
    memory_limit: Union[int, str, None] = None,
    **options: Any,
) -> Run:
    """Run each model once, each in its own sandboxed worker process, and
    yield a `Result` per model, in model order, as units finish.

    `models`: SavedModel folders, or folders searched for them (as `isorun
    run MODEL...`). `inputs`: a path to an `.npz` (or `.json`), or a mapping
    from input name to a NumPy array or to a path. `signature`, `jobs`,
    `timeout` (seconds), `memory_limit` (bytes, or `"2G"`) and every other
    keyword are `isorun run`'s options with `_` for `-` (`retries=2`,
    `batch_size=64`, `spawn="exec"`, `sandbox="off"`, `output_dir=...` to
    keep the `.npy` files). Arrays are cast to the signature's dtypes as
    Keras's `predict` does (`np.ones((1, 4))`, float64, becomes float32;
    `Result.record["cast"]` says so; `strict_dtypes=True` refuses). A model
    that fails is a `Result` whose status says how; a usage error raises
    `UsageError`.

    >>> for result in isorun.run(["models/"], {"x": np.ones((8, 32), np.float32)}):
    ...     print(result.model, result.status, result.outputs.get("y"))
    """
    named = {"signature": signature, "jobs": jobs, "timeout": timeout, "memory_limit": memory_limit}
    return _start("run", models, inputs, named, dict(options))


def evaluate(
    models: Union[PathLike, Iterable[PathLike]],
    *,
    data: Union[PathLike, Sequence[PathLike]],
    label: str,
    metrics: Optional[Sequence[str]] = None,
    signature: Optional[str] = None,
    jobs: Optional[int] = None,
    timeout: Optional[float] = None,
    memory_limit: Union[int, str, None] = None,
    **options: Any,
) -> Run:
    """Evaluate each model on a labelled dataset (`isorun eval`): TFRecord
    files of `tf.Example`, `.npz` files, CSV, folders or globs of them.
    Yields a `Result` per model whose `metrics` holds the metric values and
    `examples` how many examples were scored. Options as for `run`
    (`batch_size=256`, `limit=1000`, `slice=["country"]`, `threshold=[...]`)."""
    data_list = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    named: Dict[str, Any] = {
        "data": [os.fspath(d) for d in data_list],
        "label": label,
        "metric": list(metrics) if metrics else None,
        "signature": signature,
        "jobs": jobs,
        "timeout": timeout,
        "memory_limit": memory_limit,
    }
    return _start("eval", models, None, named, dict(options))


def inspect(model: PathLike, *, all: bool = False, tags: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """A SavedModel's meta graphs and signatures (`isorun inspect --json`),
    read from its `saved_model.pb` without loading it."""
    args = [_binary.executable(), "inspect", "--json"]
    if all:
        args.append("--all")
    for tag in tags or []:
        args.append(f"--tag={tag}")
    args += ["--", os.fspath(model)]
    ran = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if ran.returncode == 2:
        raise UsageError(last_error(ran.stderr) or "isorun inspect refused the arguments", exit_code=2, stderr=ran.stderr)
    if ran.returncode != 0:
        raise IsorunError(f"isorun inspect ended with exit code {ran.returncode}: {last_error(ran.stderr)}",
                          exit_code=ran.returncode, stderr=ran.stderr)
    parsed: Dict[str, Any] = json.loads(ran.stdout)
    return parsed
