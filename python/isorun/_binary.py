"""Where the `isorun` executable is, and how the API's keyword options become
its command-line flags. The API is a thin layer over the binary: nothing
here imports TensorFlow or loads a model."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path
from typing import Any, List, Mapping

from .errors import IsorunNotFound

#: Set to a path to use that `isorun` binary instead of the installed one.
ENV_BINARY = "ISORUN_BINARY"


def executable() -> str:
    """The `isorun` binary: `$ISORUN_BINARY`, else the one this package was
    installed with (the environment's scripts folder, where pip puts the
    wheel's binaries, `isorun-worker` beside it), else `isorun` on `PATH`."""
    asked = os.environ.get(ENV_BINARY)
    if asked:
        if not os.access(asked, os.X_OK):
            raise IsorunNotFound(f"{ENV_BINARY}={asked}: not an executable file")
        return asked
    candidates = []
    for scheme in (None, f"{os.name}_user"):
        try:
            scripts = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if scripts:
            candidates.append(Path(scripts) / "isorun")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("isorun")
    if on_path:
        return on_path
    looked = ", ".join(str(c) for c in candidates)
    raise IsorunNotFound(
        f"the isorun binary is not installed here (looked in {looked} and on PATH); "
        f"reinstall the wheel (pip install isorun) or set {ENV_BINARY}"
    )


def flag_name(option: str) -> str:
    """`memory_limit` -> `--memory-limit`: the API's keywords are the CLI's
    option names with `_` for `-`."""
    if not option or not option.replace("_", "").isalnum():
        raise TypeError(f"{option!r} is not an isorun option name")
    return "--" + option.replace("_", "-")


def option_flags(options: Mapping[str, Any]) -> List[str]:
    """Keyword options as flags: `True` is a bare flag, `False` and `None`
    leave the flag out, a list or tuple repeats it, anything else is its
    `str()` (paths, numbers, sizes such as `"2G"`)."""
    flags: List[str] = []
    for option, value in options.items():
        name = flag_name(option)
        if value is None or value is False:
            continue
        if value is True:
            flags.append(name)
        elif isinstance(value, (list, tuple)):
            for item in value:
                flags.append(f"{name}={os.fspath(item) if isinstance(item, os.PathLike) else item}")
        else:
            text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
            flags.append(f"{name}={text}")
    return flags
