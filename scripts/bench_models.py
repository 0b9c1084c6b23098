"""The Python side of scripts/bench: the benchmark zoo and the Python ways.

Run by scripts/bench (through scripts/bench_run.py) under an interpreter with
tensorflow-cpu==2.21.0 and numpy. Subcommands:

  zoo DIR              make the benchmark zoo in DIR (reused when complete):
                         DIR/mlp40/m00..m39/   40 Keras MLPs 32-256-256-10, seeds 0..39
                         DIR/inputs.npz        x: float32 [8, 32]
                         DIR/big/dense380/     one Dense layer, ~95M float32 weights (~380 MB)
                         DIR/ipc/reduce_sum/   x: float32 [None] -> y = reduce_sum(x)
                         DIR/ipc_big.npz       x: float32 [67108864] (256 MiB)
                         DIR/ipc_tiny.npz      x: float32 [16]
                         DIR/mlp500/cNN/mXX    500 units: hard-linked copies of mlp40
                         DIR/ipc_1g.npy        float32 [268435456] (1 GiB), for `--input x=`
                         DIR/ipc_16.npy        float32 [16]
                       (the two .npy files are added to an existing zoo
                       when missing, so a zoo made before them is kept)
  loop INPUTS MODEL... load, call serving_default once, drop, in this one process
  pool INPUTS MODEL... the same, one task per model in a ProcessPoolExecutor
                       (max_workers=1, max_tasks_per_child=1, spawn context)
  memory MODEL         VmRSS of this process before loading MODEL, after loading
                       and running it, and after dropping it (JSON on stdout)
  memcopy              median time of copying 256 MiB with numpy (JSON on stdout)

Each of loop and pool prints `total <seconds> s <n> models` as its last line,
like `isorun-worker --in-process`; scripts/bench times the whole command.
"""

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import log  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Bump when the zoo's contents change, so an old cached zoo is rebuilt.
ZOO_VERSION = "isorun-bench-zoo 2"
N_MODELS = 40
N_UNITS_500 = 500
BIG_IN, BIG_OUT = 9728, 9766  # 9728 * 9766 + 9766 = 95.0M float32 = ~380 MB
IPC_ELEMENTS = 64 * 1024 * 1024  # float32: 256 MiB
NPY_BIG_ELEMENTS = 256 * 1024 * 1024  # float32: 1 GiB


# --------------------------------------------------------------------------
# The zoo
# --------------------------------------------------------------------------


def make_mlp(path, seed):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    x = tf.keras.Input(shape=(32,), dtype="float32", name="x")
    h = tf.keras.layers.Dense(256, activation="relu")(x)
    h = tf.keras.layers.Dense(256, activation="relu")(h)
    y = tf.keras.layers.Dense(10, name="y")(h)
    model = tf.keras.Model(x, y)
    model.export(path, verbose=False)
    tf.keras.backend.clear_session()


def make_big(path):
    """One dense layer, y = x @ w + b, with ~95M float32 weights (~380 MB).

    A tf.Module rather than Keras: Keras' model.export writes every variable
    twice (under `variables` and `_all_variables`), which would make this a
    760 MB model on disk.
    """
    import tensorflow as tf

    class Dense(tf.Module):
        def __init__(self):
            super().__init__()
            # Zeros: the figure is about memory, and zeros are made fast.
            self.w = tf.Variable(tf.zeros([BIG_IN, BIG_OUT]), name="w")
            self.b = tf.Variable(tf.zeros([BIG_OUT]), name="b")

        @tf.function(input_signature=[tf.TensorSpec([None, BIG_IN], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w) + self.b}

    module = Dense()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def make_ipc(path):
    import tensorflow as tf

    class Reduce(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            # A scalar output: the figure is about the input's way in.
            return {"y": tf.reduce_sum(x)}

    module = Reduce()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def link_tree(src, dst):
    """dst: a copy of src whose files are hard links (a distinct path, same bytes)."""
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.copytree(src, dst)


def write_npy(path, elements, fill):
    """A float32 [elements] .npy written in 64 MiB pieces (never the whole
    array in memory), under a temporary name renamed into place at the end,
    so a half-written file is never taken for a finished one."""
    import numpy as np

    tmp = path + ".tmp"
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(elements,))
    step = 16 * 1024 * 1024
    for start in range(0, elements, step):
        out[start:start + step] = fill
    out.flush()
    del out
    os.rename(tmp, path)


def npy_inputs(root):
    """The `.npy` inputs, added to a zoo idempotently (a zoo made before them stays)."""
    big = os.path.join(root, "ipc_1g.npy")
    if not os.path.exists(big):
        log("zoo: the 1 GiB .npy input (ipc_1g.npy)")
        write_npy(big, NPY_BIG_ELEMENTS, 0.5)
    tiny = os.path.join(root, "ipc_16.npy")
    if not os.path.exists(tiny):
        write_npy(tiny, 16, 1.0)


def zoo(args):
    import numpy as np

    root = os.path.abspath(args.dir)
    stamp = os.path.join(root, "COMPLETE")
    if os.path.exists(stamp) and open(stamp).read().strip() == ZOO_VERSION:
        log(f"zoo: reusing {root}")
        npy_inputs(root)
        return 0
    log(f"zoo: making {root} (40 MLPs, a 380 MB model, an IPC model, 256 MiB input; a few minutes)")
    os.makedirs(os.path.dirname(root) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".bench-zoo-", dir=os.path.dirname(root) or ".")
    started = time.perf_counter()
    for i in range(N_MODELS):
        make_mlp(os.path.join(tmp, "mlp40", f"m{i:02d}"), seed=i)
        if (i + 1) % 10 == 0:
            log(f"zoo: {i + 1}/{N_MODELS} MLPs")
    rng = np.random.default_rng(0)
    np.savez(os.path.join(tmp, "inputs.npz"), x=rng.random((8, 32), dtype=np.float32))

    log("zoo: the 380 MB model")
    make_big(os.path.join(tmp, "big", "dense380"))
    np.savez(os.path.join(tmp, "big_inputs.npz"), x=np.zeros((1, BIG_IN), np.float32))

    log("zoo: the IPC model and its 256 MiB input")
    make_ipc(os.path.join(tmp, "ipc", "reduce_sum"))
    np.savez(os.path.join(tmp, "ipc_big.npz"), x=rng.random(IPC_ELEMENTS, dtype=np.float32))
    np.savez(os.path.join(tmp, "ipc_tiny.npz"), x=np.ones(16, np.float32))

    log("zoo: 500 units (hard-linked copies of the 40 MLPs)")
    copies = -(-N_UNITS_500 // N_MODELS)
    made = 0
    for c in range(copies):
        for i in range(N_MODELS):
            if made == N_UNITS_500:
                break
            link_tree(os.path.join(tmp, "mlp40", f"m{i:02d}"), os.path.join(tmp, "mlp500", f"c{c:02d}", f"m{i:02d}"))
            made += 1

    with open(os.path.join(tmp, "COMPLETE"), "w") as f:
        f.write(ZOO_VERSION + "\n")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.rename(tmp, root)
    npy_inputs(root)
    log(f"zoo: done in {time.perf_counter() - started:.0f} s")
    return 0


# --------------------------------------------------------------------------
# The Python ways
# --------------------------------------------------------------------------


def load_inputs(path):
    import numpy as np

    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


def run_one(model_dir, inputs_path):
    """Load one SavedModel, call serving_default once, drop everything."""
    import tensorflow as tf

    inputs = {k: tf.constant(v) for k, v in load_inputs(inputs_path).items()}
    model = tf.saved_model.load(model_dir)
    outputs = model.signatures["serving_default"](**inputs)
    shapes = {k: tuple(v.shape) for k, v in outputs.items()}
    del outputs, model, inputs
    tf.keras.backend.clear_session()
    gc.collect()
    return shapes


def loop(args):
    import tensorflow  # noqa: F401  (timed as part of the way, like the pool's imports)

    started = time.perf_counter()
    for model_dir in args.models:
        run_one(model_dir, args.inputs)
    print(f"total\t{time.perf_counter() - started:.3f} s\t{len(args.models)} models")
    return 0


def pool(args):
    import concurrent.futures
    import multiprocessing

    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1, mp_context=context) as ex:
        futures = [ex.submit(run_one, m, args.inputs) for m in args.models]
        for f in futures:
            f.result()
    print(f"total\t{time.perf_counter() - started:.3f} s\t{len(args.models)} models")
    return 0


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def memory(args):
    import numpy as np
    import tensorflow as tf

    # Warm TensorFlow up first (a tiny op), so "before" is a process that
    # has already paid for TensorFlow's own start, not for this model.
    tf.reduce_sum(tf.ones([4])).numpy()
    gc.collect()
    before = rss_bytes()
    model = tf.saved_model.load(args.model)
    fn = model.signatures["serving_default"]
    out = fn(x=tf.constant(np.zeros((1, BIG_IN), np.float32)))
    _ = {k: v.numpy().shape for k, v in out.items()}
    loaded = rss_bytes()
    del out, fn, model
    tf.keras.backend.clear_session()
    gc.collect()
    time.sleep(0.5)
    dropped = rss_bytes()
    print(json.dumps({"before": before, "loaded": loaded, "dropped": dropped}))
    return 0


def memcopy(args):
    import numpy as np

    src = np.random.default_rng(0).random(IPC_ELEMENTS, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in first: time the copy, not page faults
    fresh, warm = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        warm.append(time.perf_counter() - t)
        t = time.perf_counter()
        np.array(src, copy=True)  # into freshly mapped memory, page faults included
        fresh.append(time.perf_counter() - t)
    fresh.sort()
    warm.sort()
    print(json.dumps({"bytes": src.nbytes, "warm_s": warm, "fresh_s": fresh}))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("zoo")
    p.add_argument("dir")
    for name in ("loop", "pool"):
        p = sub.add_parser(name)
        p.add_argument("inputs")
        p.add_argument("models", nargs="+")
    p = sub.add_parser("memory")
    p.add_argument("model")
    p = sub.add_parser("memcopy")
    p.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    return {"zoo": zoo, "loop": loop, "pool": pool, "memory": memory, "memcopy": memcopy}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
