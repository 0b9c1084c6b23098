"""`python -m isorun ...`: the `isorun` binary with the same arguments, and
one command of its own, `fetch-libtensorflow`, which fills the cache
folder workers fall back on when the environment has no TensorFlow package:
libtensorflow_cc.so.2 and libtensorflow_framework.so.2 from the
`tensorflow-cpu` wheel on PyPI (downloaded with pip, never installed or
imported), as `scripts/fetch-libtensorflow` does in a clone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List, Optional

from . import _binary

#: The version the worker is built against (engine/src/locate.rs TENSORFLOW_VERSION).
TENSORFLOW_VERSION = "2.21.0"
LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")


def cache_dir() -> Path:
    """The folder isorun looks in: $ISORUN_LIBTENSORFLOW_DIR, else
    ${XDG_CACHE_HOME:-~/.cache}/isorun/libtensorflow-<version>-cpu."""
    asked = os.environ.get("ISORUN_LIBTENSORFLOW_DIR")
    if asked:
        return Path(asked)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "isorun" / f"libtensorflow-{TENSORFLOW_VERSION}-cpu"


def fetch_libtensorflow() -> int:
    target = cache_dir()
    marker = target / ".complete"
    if marker.is_file():
        print(f"isorun: libtensorflow {marker.read_text().strip()} already in {target}; nothing to do", file=sys.stderr)
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".libtensorflow-tmp.", dir=target.parent) as tmp:
        print(f"isorun: downloading tensorflow-cpu=={TENSORFLOW_VERSION} from PyPI (about 270 MB)...", file=sys.stderr)
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_27_x86_64", "--python-version", "3.11",
                    f"tensorflow-cpu=={TENSORFLOW_VERSION}", "-d", os.path.join(tmp, "wheel")]
        if subprocess.run(download).returncode != 0:
            print("isorun: pip could not download tensorflow-cpu: is PyPI reachable?", file=sys.stderr)
            return 1
        wheels = sorted(Path(tmp, "wheel").glob("tensorflow_cpu-*.whl"))
        if not wheels:
            print("isorun: pip finished but left no tensorflow_cpu wheel", file=sys.stderr)
            return 1
        lib = Path(tmp, "lib")
        lib.mkdir()
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in LIBRARIES:
                with wheel.open(f"tensorflow/{name}") as src, open(lib / name, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.chmod(lib / name, 0o755)
        os.symlink("libtensorflow_cc.so.2", lib / "libtensorflow.so")
        os.symlink("libtensorflow_framework.so.2", lib / "libtensorflow_framework.so")
        (lib / ".complete").write_text(f"{TENSORFLOW_VERSION} cpu\n")
        if target.exists():
            shutil.rmtree(target)
        os.rename(lib, target)
    print(f"isorun: libtensorflow {TENSORFLOW_VERSION} (cpu) ready in {target}", file=sys.stderr)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["fetch-libtensorflow"]:
        if len(args) > 1:
            print("usage: python -m isorun fetch-libtensorflow", file=sys.stderr)
            return 2
        return fetch_libtensorflow()
    return subprocess.run([_binary.executable(), *args]).returncode


if __name__ == "__main__":
    sys.exit(main())
