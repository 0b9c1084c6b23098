"""isorun from Python: run TensorFlow SavedModels each in its own short-lived,
sandboxed worker process, so the operating system gives their memory back.

A thin, typed layer over the `isorun` binary the wheel installs (with
`isorun-worker` beside it). It never imports TensorFlow and never loads a
model itself: `run` and `evaluate` start one `isorun` process and stream its
results back as `Result` objects, in model order, as units finish.

    import isorun, numpy as np

    for result in isorun.run(["models/"], {"x": np.ones((8, 32), np.float32)}, jobs=2):
        if result.ok:
            print(result.model, result.outputs["y"].shape, result.peak_rss_bytes)
        else:
            print(result.model, result.status, result.error.message)

Workers use the libtensorflow of this environment's `tensorflow` or
`tensorflow-cpu` 2.x package (`pip install tensorflow-cpu`), else the
cache that `python -m isorun fetch-libtensorflow` fills.

`map` runs the user's own function on each item the same way, each call in
a fresh process forked from a warm Python zygote:

    for r in isorun.map(evaluate, paths, jobs=2, timeout=600, memory_limit="8G"):
        print(r.item, r.status, r.value if r.ok else r.error.message)

`import isorun` imports neither TensorFlow nor NumPy.
"""

from ._map import CallError, MapResult, MapRun, map
from ._run import ModelError, Result, Run, evaluate, inspect, run
from .errors import IsorunError, IsorunNotFound, NotPicklable, UsageError

__all__ = [
    "CallError",
    "IsorunError",
    "IsorunNotFound",
    "MapResult",
    "MapRun",
    "ModelError",
    "NotPicklable",
    "Result",
    "Run",
    "UsageError",
    "evaluate",
    "inspect",
    "map",
    "run",
]
