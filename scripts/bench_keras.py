"""Keras checkpoints: the Python loop users start from against `isorun run`.

Run by scripts/bench (after the SavedModel tables), or alone:

  python scripts/bench_keras.py --isorun target/release/isorun --work target/bench/keras \\
      [--models 40] [--markdown BENCHMARKS.md]

Makes N `.keras` checkpoints of the zoo's MLP (32 -> 256 -> 256 -> 10, seeds
0..N-1, input "x") once, then times, one after another:

- python loop: for each file keras.models.load_model, predict, del,
  keras.backend.clear_session(), gc.collect() (peak memory: its ru_maxrss);
- isorun first run: an empty export cache (exports included);
- isorun second run: the same cache (no export, no Python);
- isorun on the same models as SavedModels (the cache's entries).

isorun's peak memory is the supervisor's own (VmHWM, polled), its workers
and export processes being separate, short-lived processes. Appends a
"Keras files" section to --markdown (or prints it).
"""

import argparse
import json
import os
import subprocess
import sys
import time

LOOP = r"""
import gc, glob, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np, keras
x = np.load(sys.argv[2])["x"]
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.keras"))):
    model = keras.models.load_model(f)
    model.predict(x, verbose=0)
    del model
    keras.backend.clear_session()
    gc.collect()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

MAKE = r"""
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np, keras
folder, n = sys.argv[1], int(sys.argv[2])
os.makedirs(folder, exist_ok=True)
for seed in range(n):
    # One training run's checkpoints: the same layer names in every file.
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    x = keras.Input((32,), name="x")
    h = keras.layers.Dense(256, activation="relu")(x)
    h = keras.layers.Dense(256, activation="relu")(h)
    y = keras.layers.Dense(10, name="logits")(h)
    keras.Model(x, y).save(os.path.join(folder, f"ckpt_{seed:02d}.keras"))
np.savez(os.path.join(os.path.dirname(folder), "inputs.npz"), x=np.random.default_rng(0).standard_normal((8, 32)).astype("float32"))
"""


def vm_hwm(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def timed(cmd, poll_memory):
    began = time.monotonic()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while child.poll() is None:
        if poll_memory:
            peak = max(peak, vm_hwm(child.pid) or 0)
        time.sleep(0.02)
    out, err = child.communicate()
    wall = time.monotonic() - began
    if child.returncode != 0:
        sys.exit(f"bench_keras: {cmd[0]} failed ({child.returncode}):\n{err[-2000:]}")
    return wall, peak, out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isorun", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--work", required=True)
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=1, help="isorun's -j (default 1)")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    work = os.path.abspath(args.work)
    # "ckpts-run": one run's checkpoints (the same layer names); older work folders had other names per file.
    ckpts = os.path.join(work, "ckpts-run")
    inputs = os.path.join(work, "inputs.npz")
    if len([f for f in os.listdir(ckpts) if f.endswith(".keras")] if os.path.isdir(ckpts) else []) != args.models:
        subprocess.run([args.python, "-c", MAKE, ckpts, str(args.models)], check=True)
    cache = os.path.join(work, "cache")
    subprocess.run([args.isorun, "cache", "clear", "--keras-cache", cache], check=True, capture_output=True)

    rows = []
    wall, _, out = timed([args.python, "-c", LOOP, ckpts, inputs], poll_memory=False)
    rows.append(("python loop (load_model, predict, del, clear_session, gc.collect)", wall, int(out.split()[-1])))
    run = [args.isorun, "run", ckpts, "--inputs", inputs, "--json", "-q", "--python", args.python, "--keras-cache", cache,
           "-j", str(args.jobs)]
    wall, peak, out = timed(run, poll_memory=True)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert all(r["status"] == "ok" for r in records) and len(records) == args.models, out[-2000:]
    assert not any(r["export"]["cached"] for r in records)
    rows.append((f"isorun run -j {args.jobs}, first run (exports included)", wall, peak))
    graphs = {}
    for r in records:
        graphs.setdefault(r["export"].get("graph", "traced"), []).append(r["export"]["ms"])
    export_ms = {g: sorted(ms)[len(ms) // 2] for g, ms in graphs.items()}
    print(json.dumps({"export_ms_median": export_ms, "files": {g: len(ms) for g, ms in graphs.items()}}), file=sys.stderr)
    wall, peak, out = timed(run, poll_memory=True)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert all(r["export"]["cached"] for r in records), out[-2000:]
    rows.append((f"isorun run -j {args.jobs}, second run (from the cache)", wall, peak))
    saved = os.path.join(work, "saved")
    os.makedirs(saved, exist_ok=True)
    for entry in os.listdir(cache):
        model = os.path.join(cache, entry, "saved_model")
        link = os.path.join(saved, entry)
        if os.path.isdir(model) and not os.path.exists(link):
            os.symlink(model, link)
    wall, peak, _ = timed([args.isorun, "run", saved, "--inputs", inputs, "--json", "-q", "-j", str(args.jobs)], poll_memory=True)
    rows.append(("isorun run on the same models as SavedModels", wall, peak))

    loop = rows[0][1]
    lines = [
        "",
        "## Keras files",
        "",
        f"{args.models} `.keras` checkpoints of the zoo's MLP (32 → 256 → 256 → 10), input `x` [8, 32], one run of each way "
        f"(`scripts/bench_keras.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Peak memory: the Python loop's own "
        "process; for isorun, the supervisor's (workers and export processes are separate and short-lived).",
        "",
        "| way | wall (s) | time ÷ python loop | peak memory (MiB) |",
        "|---|---:|---:|---:|",
    ]
    for name, wall, peak in rows:
        lines.append(f"| {name} | {wall:.2f} | {wall / loop:.2f}× | {peak / 2**20:.0f} |")
    lines += ["", "Export time per file (`export.ms` of the records, median): "
              + ", ".join(f"{g} {ms} ms ({len(graphs[g])} files)" for g, ms in sorted(export_ms.items()))]
    lines += [
        "",
        "Targets: the first run no slower than the Python loop, the second as fast as the same models as "
        "SavedModels. What bounds the first run: each export process imports TensorFlow (seconds, once per "
        "process: one per slot), and `ExportArchive.write_out` (tracing and saving) costs about twice a "
        "`predict` per file, on the same cores the workers use; exports and runs overlap (a file's unit starts "
        "once its SavedModel is in the cache). The second run hashes each file and finds its export: no Python "
        "starts.",
    ]
    text = "\n".join(lines) + "\n"
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
