"""`python -m isorun ...`: the `isorun` binary with the same arguments, and
two commands of its own that fill the cache folders workers fall back on
when the environment has no such package (downloaded with pip, never
installed or imported), as the scripts of the same names do in a clone:
`fetch-libtensorflow` (libtensorflow_cc.so.2 and
libtensorflow_framework.so.2 from the `tensorflow-cpu` wheel) and
`fetch-onnxruntime` (libonnxruntime.so.1.N from the `onnxruntime` wheel)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, List, Optional

from . import _binary

#: The version the worker is built against (engine/src/locate.rs TENSORFLOW_VERSION).
TENSORFLOW_VERSION = "2.21.0"
LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")
#: The ONNX Runtime scripts/fetch-onnxruntime fetches (engine/src/locate.rs ONNXRUNTIME_VERSION).
ONNXRUNTIME_VERSION = "1.32.0"


def _cache(env: str, folder: str) -> Path:
    """$<env>, else ${XDG_CACHE_HOME:-~/.cache}/isorun/<folder>."""
    asked = os.environ.get(env)
    if asked:
        return Path(asked)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "isorun" / folder


def cache_dir() -> Path:
    """The folder isorun looks in: $ISORUN_LIBTENSORFLOW_DIR, else
    ${XDG_CACHE_HOME:-~/.cache}/isorun/libtensorflow-<version>-cpu."""
    return _cache("ISORUN_LIBTENSORFLOW_DIR", f"libtensorflow-{TENSORFLOW_VERSION}-cpu")


def onnxruntime_cache_dir() -> Path:
    """The folder isorun looks in last: $ISORUN_ONNXRUNTIME_DIR, else
    ${XDG_CACHE_HOME:-~/.cache}/isorun/onnxruntime-<version>."""
    return _cache("ISORUN_ONNXRUNTIME_DIR", f"onnxruntime-{ONNXRUNTIME_VERSION}")


def _fetch(what: str, target: Path, requirement: str, size: str, pip_args: List[str],
           extract: Callable[[zipfile.ZipFile, Path], Optional[str]], marker: str) -> int:
    """Downloads the wheel `requirement` with pip into a temporary folder
    beside `target`, lets `extract` copy what is kept into a new folder
    (returning why it could not), writes the `.complete` marker last and
    renames the folder into place: a folder without its marker is never used."""
    if (target / ".complete").is_file():
        print(f"isorun: {what} {(target / '.complete').read_text().strip()} already in {target}; nothing to do",
              file=sys.stderr)
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-tmp.", dir=target.parent) as tmp:
        print(f"isorun: downloading {requirement} from PyPI ({size})...", file=sys.stderr)
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    *pip_args, requirement, "-d", os.path.join(tmp, "wheel")]
        if subprocess.run(download).returncode != 0:
            print(f"isorun: pip could not download {requirement}: is PyPI reachable, and is there a wheel for this "
                  "machine?", file=sys.stderr)
            return 1
        wheels = sorted(Path(tmp, "wheel").glob("*.whl"))
        if not wheels:
            print(f"isorun: pip finished but left no wheel of {requirement}", file=sys.stderr)
            return 1
        lib = Path(tmp, "lib")
        lib.mkdir()
        with zipfile.ZipFile(wheels[0]) as wheel:
            why = extract(wheel, lib)
        if why is not None:
            print(f"isorun: {wheels[0].name}: {why}", file=sys.stderr)
            return 1
        (lib / ".complete").write_text(marker + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.rename(lib, target)
    print(f"isorun: {what} {marker} ready in {target}", file=sys.stderr)
    return 0


def _copy(wheel: zipfile.ZipFile, name: str, to: Path, mode: int) -> None:
    with wheel.open(name) as src, open(to, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(to, mode)


def _extract_libtensorflow(wheel: zipfile.ZipFile, lib: Path) -> Optional[str]:
    for name in LIBRARIES:
        _copy(wheel, f"tensorflow/{name}", lib / name, 0o755)
    os.symlink("libtensorflow_cc.so.2", lib / "libtensorflow.so")
    os.symlink("libtensorflow_framework.so.2", lib / "libtensorflow_framework.so")
    return None


def _extract_onnxruntime(wheel: zipfile.ZipFile, lib: Path) -> Optional[str]:
    names = wheel.namelist()
    libraries = [n for n in names if re.fullmatch(r"onnxruntime/capi/libonnxruntime\.so\.1\.\d+(\.\d+)*", n)]
    if not libraries:
        return "holds no onnxruntime/capi/libonnxruntime.so.1.*"
    for name in libraries:
        _copy(wheel, name, lib / Path(name).name, 0o755)
    for name in ("onnxruntime/LICENSE", "onnxruntime/ThirdPartyNotices.txt"):
        if name in names:
            _copy(wheel, name, lib / Path(name).name, 0o644)
    return None


def fetch_libtensorflow() -> int:
    return _fetch("libtensorflow", cache_dir(), f"tensorflow-cpu=={TENSORFLOW_VERSION}", "about 270 MB",
                  ["--platform", "manylinux_2_27_x86_64", "--python-version", "3.11"], _extract_libtensorflow,
                  f"{TENSORFLOW_VERSION} cpu")


def fetch_onnxruntime() -> int:
    return _fetch("ONNX Runtime", onnxruntime_cache_dir(), f"onnxruntime=={ONNXRUNTIME_VERSION}", "about 28 MB", [],
                  _extract_onnxruntime, ONNXRUNTIME_VERSION)


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fetchers = {"fetch-libtensorflow": fetch_libtensorflow, "fetch-onnxruntime": fetch_onnxruntime}
    if args[:1] and args[0] in fetchers:
        if len(args) > 1:
            print(f"usage: python -m isorun {args[0]}", file=sys.stderr)
            return 2
        return fetchers[args[0]]()
    return subprocess.run([_binary.executable(), *args]).returncode


if __name__ == "__main__":
    sys.exit(main())
