#!/usr/bin/env python3
"""Five real architectures as new `.keras` files (#25 §1b): the first run a
night pays against the seed's Keras loop, and where an export's time goes.

  scripts/bench_keras_apps.py --isorun target/release/isorun --python PY --work DIR [--markdown BENCHMARKS.md]

Makes (once, in DIR/apps) MobileNetV3Small, EfficientNetB0, ResNet50,
ConvNeXtTiny and DenseNet121 from `keras.applications` (`weights=None`, the
input named `x`, 224×224×3) saved as `.keras`, and DIR/inputs.npz (x: two
images). Then, one round:
  - the seed's loop: one process, for each file `load_model`, `predict`,
    `del`, `clear_session()`, `gc.collect()`;
  - `isorun run apps/ --inputs inputs.npz` with an empty Keras cache, -j 1 and
    -j 2 (exports included), and once more from the cache;
  - each file exported alone in a fresh Python process with the exporter's
    calls, timed step by step: interpreter and `import tensorflow, keras`,
    `load_model`, tracing (`ExportArchive.add_endpoint`), writing
    (`write_out`); and the worker's load and run of the export (the cached
    run's records).
Rewrites the "Keras applications" section of --markdown. Not part of scripts/test.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import statistics
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_host  # noqa: E402
from benchlib import logger, splice  # noqa: E402

log = logger("bench_keras_apps")

MODELS = ["MobileNetV3Small", "EfficientNetB0", "ResNet50", "ConvNeXtTiny", "DenseNet121"]
SECTION = "## Keras applications: five real architectures"

MAKE = r'''
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import keras
out, names = sys.argv[1], sys.argv[2:]
os.makedirs(out, exist_ok=True)
for name in names:
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(weights=None, input_tensor=keras.Input((224, 224, 3), name="x"))
    model.save(os.path.join(out, name.lower() + ".keras"))
    keras.backend.clear_session()
np.savez(os.path.join(os.path.dirname(out), "inputs.npz"),
         x=np.random.default_rng(0).standard_normal((2, 224, 224, 3), dtype=np.float32))
'''

LOOP = r'''
import gc, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import keras
folder, inputs, expected = sys.argv[1], sys.argv[2], sys.argv[3]
x = np.load(inputs)["x"]
for name in sorted(os.listdir(folder)):
    model = keras.models.load_model(os.path.join(folder, name), compile=False)
    np.save(os.path.join(expected, name + ".npy"), model.predict(x, verbose=0))
    del model
    keras.backend.clear_session()
    gc.collect()
with open("/proc/self/status") as f:
    print([int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:")][0])
'''

STEPS = r'''
import json, os, sys, time
started = float(sys.argv[3])
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
import keras
t = {"import": time.time() - started}
t0 = time.perf_counter()
model = keras.models.load_model(sys.argv[1], compile=False, safe_mode=True)
t["load_model"] = time.perf_counter() - t0
specs = [tf.TensorSpec(shape=tuple(i.shape), dtype=i.dtype, name="x") for i in model.inputs]
def serve(x):
    return {"y": model(x, training=False)}
import numpy as np
from tensorflow.python.framework import convert_to_constants as cc
from tensorflow.core.protobuf import saved_model_pb2
t0 = time.perf_counter()
concrete = tf.function(serve).get_concrete_function(*specs)
t["trace"] = time.perf_counter() - t0
t0 = time.perf_counter()
data = cc._FunctionConverterDataInEager(func=concrete, lower_control_flow=True, aggressive_inlining=False)
graph_def, _ = cc._replace_variables_by_constants(converter_data=data)
t["freeze"] = time.perf_counter() - t0
with concrete.graph.as_default():
    signature = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def(
        {"x": concrete.inputs[0]}, {"y": concrete.outputs[0]})
t0 = time.perf_counter()
probe = np.random.default_rng(0).random((1,) + tuple(specs[0].shape)[1:]).astype(np.float32)
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
expected = concrete(tf.constant(probe))["y"].numpy()
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
t["probe"] = time.perf_counter() - t0
t0 = time.perf_counter()
graph = tf.Graph()
with graph.as_default():
    tf.graph_util.import_graph_def(graph_def, name="")
config = tf.compat.v1.ConfigProto()
config.graph_options.rewrite_options.disable_meta_optimizer = True
with tf.compat.v1.Session(graph=graph, config=config) as session:
    got = session.run(graph.get_tensor_by_name(concrete.outputs[0].name),
                      {graph.get_tensor_by_name(concrete.inputs[0].name): probe})
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)
t["session_check"] = time.perf_counter() - t0
t0 = time.perf_counter()
saved = saved_model_pb2.SavedModel(saved_model_schema_version=1)
meta = saved.meta_graphs.add()
meta.meta_info_def.tags.append("serve")
meta.graph_def.CopyFrom(graph_def)
meta.signature_def["serving_default"].CopyFrom(signature)
os.makedirs(os.path.join(sys.argv[2] + "-frozen", "variables"))
with open(os.path.join(sys.argv[2] + "-frozen", "saved_model.pb"), "wb") as f:
    f.write(saved.SerializeToString())
t["write"] = time.perf_counter() - t0
t0 = time.perf_counter()
archive = keras.export.ExportArchive()
archive.track(model)
archive.add_endpoint(name="serving_default", fn=serve, input_signature=specs)
archive.write_out(sys.argv[2], verbose=False)
t["archive"] = time.perf_counter() - t0
print(json.dumps(t))
'''


CPU, READS = {}, {}
# The files every way reads, read into the page cache before each timed run
# (set in main; scripts/bench_host.py says why).
WARM = []


def timed(cmd, env=None, cpu_key=None):
    """Runs cmd, after reading WARM into the page cache; its wall time and
    stdout. With cpu_key, also notes the CPU time (user + system) of its
    whole process tree (every process in it is reaped by its parent, so the
    children's usage counts them all) and the bytes it read from disk."""
    bench_host.warm(WARM)
    read = bench_host.disk_read_bytes()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"bench_keras_apps: {cmd[:3]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    if cpu_key:
        CPU.setdefault(cpu_key, []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        READS.setdefault(cpu_key, []).append(bench_host.disk_read_bytes() - read)
    return wall, p.stdout


def max_abs_diff(outputs, expected, names):
    """The largest difference between isorun's output and `model.predict`'s
    over the five files (each has one output)."""
    worst = 0.0
    for name in names:
        written = [f for f in os.listdir(os.path.join(outputs, name)) if f.endswith(".npy")]
        if len(written) != 1:
            raise SystemExit(f"bench_keras_apps: {name}: expected one output, isorun wrote {written}")
        got, want = np.load(os.path.join(outputs, name, written[0])), np.load(os.path.join(expected, name + ".npy"))
        if got.shape != want.shape:
            raise SystemExit(f"bench_keras_apps: {name}: shape {got.shape} != predict's {want.shape}")
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    return worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--isorun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--markdown")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = os.path.abspath(args.work)
    apps, inputs = os.path.join(work, "apps"), os.path.join(work, "inputs.npz")
    if len([f for f in os.listdir(apps) if f.endswith(".keras")] if os.path.isdir(apps) else []) != len(MODELS):
        log("making the five models (a few minutes)")
        subprocess.run([args.python, "-c", MAKE, apps, *MODELS], check=True)
    sizes = {f: os.path.getsize(os.path.join(apps, f)) for f in sorted(os.listdir(apps))}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    results = {"sizes": sizes}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    WARM.extend(bench_host.way_files(args.python, repo, args.isorun) + [apps, inputs])

    cache = os.path.join(work, "cache")
    expected = os.path.join(work, "expected")
    os.makedirs(expected, exist_ok=True)
    walls = {"loop_s": [], "first_j1_s": [], "first_j2_s": []}
    # Rounds alternate the ways, so that a slow minute of this shared
    # machine falls on all of them; the table gives each way's median.
    for round_ in range(args.rounds):
        log(f"round {round_ + 1}: the seed's Keras loop ...")
        walls["loop_s"].append(timed([args.python, "-c", LOOP, apps, inputs, expected], env, "loop_s")[0])
        for jobs in (1, 2):
            subprocess.run([args.isorun, "cache", "clear", "--keras-cache", cache], check=True, capture_output=True)
            outputs = os.path.join(work, f"out-j{jobs}")
            shutil.rmtree(outputs, ignore_errors=True)
            log(f"round {round_ + 1}: isorun run -j {jobs}, first run ...")
            wall, out = timed([args.isorun, "run", apps, "--inputs", inputs, "--json", "-q", "--python", args.python,
                               "--keras-cache", cache, "-j", str(jobs), "-vv", "--output-dir", outputs], env,
                              f"first_j{jobs}_s")
            records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            bad = [r for r in records if r.get("status") != "ok"]
            if bad or len(records) != len(MODELS):
                raise SystemExit(f"bench_keras_apps: not ok: {bad}")
            walls[f"first_j{jobs}_s"].append(wall)
            results[f"first_j{jobs}_export_ms"] = {r["model"]: r["export"]["ms"] for r in records}
            results[f"first_j{jobs}_graph"] = {r["model"]: r["export"]["graph"] for r in records}
            results[f"first_j{jobs}_check"] = {r["model"]: [r["export"].get("check"), r["export"].get("check_ms")]
                                               for r in records}
            results["max_abs_diff"] = max_abs_diff(outputs, expected, sorted(sizes))
    results.update({key: statistics.median(values) for key, values in walls.items()})
    results["rounds"] = walls
    results["cpu_s"] = {key: statistics.median(values) for key, values in CPU.items()}
    results["read_mb"] = {key: statistics.median(values) / 1e6 for key, values in READS.items()}
    log("isorun run -j 1 from the cache ...")
    wall, out = timed([args.isorun, "run", apps, "--inputs", inputs, "--json", "-q", "--python", args.python,
                       "--keras-cache", cache, "-j", "1", "-vv"], env)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    results["cached_s"] = wall
    results["worker"] = {r["model"]: {"load_ms": r.get("load_ms"), "run_ms": r.get("run_ms"), "wall_ms": r.get("wall_ms")}
                         for r in records}
    steps = {}
    for name in sorted(sizes):
        out_dir = os.path.join(work, "steps", name)
        shutil.rmtree(out_dir, ignore_errors=True)
        shutil.rmtree(out_dir + "-frozen", ignore_errors=True)
        log(f"export steps of {name} in a fresh process ...")
        wall, out = timed([args.python, "-c", STEPS, os.path.join(apps, name), out_dir, repr(time.time())], env)
        steps[name] = dict(json.loads(out.strip().splitlines()[-1]), wall=wall)
    results["steps"] = steps
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    text = section(results)
    print(text)
    if args.markdown:
        splice(args.markdown, SECTION, text, after=None)


def section(r):
    loop = r["loop_s"]
    rounds = len(r["rounds"]["loop_s"])
    lines = [SECTION, "",
             "`keras.applications` MobileNetV3Small, EfficientNetB0, ResNet50, ConvNeXtTiny and DenseNet121 "
             "(`weights=None`, saved as `.keras`), one input of 2×224×224×3; medians of "
             f"{rounds} alternating rounds (`scripts/bench_keras_apps.py`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 2 cores). "
             f"{bench_host.warmed('the models', sentence=True)}; *read from disk* is what the run still read "
             "(/proc/diskstats).", "",
             "| way | wall (s), median | each round (s) | ÷ the Keras loop | CPU (s), median | cores busy "
             "| read from disk (MB), median |",
             "|---|---:|---|---:|---:|---:|---:|",
             "| the seed's Keras loop (`load_model`, `predict`, `del`, `clear_session`, `gc.collect`) | "
             f"{loop:.1f} | {', '.join(f'{w:.1f}' for w in r['rounds']['loop_s'])} | 1.00× | "
             f"{r['cpu_s']['loop_s']:.1f} | {r['cpu_s']['loop_s'] / loop:.2f} | {r['read_mb']['loop_s']:.0f} |"]
    for key, name in (("first_j1_s", "isorun run -j 1, first run (exports included)"),
                      ("first_j2_s", "isorun run -j 2, first run")):
        lines.append(f"| {name} | {r[key]:.1f} | {', '.join(f'{w:.1f}' for w in r['rounds'][key])} | "
                     f"{r[key] / loop:.2f}× | {r['cpu_s'][key]:.1f} | {r['cpu_s'][key] / r[key]:.2f} | "
                     f"{r['read_mb'][key]:.0f} |")
    lines.append(f"| isorun run -j 1, from the cache | {r['cached_s']:.1f} | one round | {r['cached_s'] / loop:.2f}× "
                 "| | | |")
    graphs = sorted(set(r.get("first_j1_graph", {}).values()))
    lines += ["", f"Every file's export was `{'`, `'.join(graphs)}`; isorun's outputs differ from `model.predict`'s "
              f"by at most {r['max_abs_diff']:.1e} (largest absolute difference over the five, last round).", "",
              "**Where an export's time goes**: each file exported alone, step by step, in a fresh Python process: "
              "interpreter start and `import tensorflow, keras`, `load_model`, then the frozen way isorun takes "
              "(tracing the serving function once; folding the variables into constants; the traced function run "
              "once on the probe row; writing `saved_model.pb`); the session check the export process no longer "
              "runs for `run` and `eval` (importing the frozen graph and running it on the probe in a session: "
              "`pipe` still does) against the same check in the unit's worker (`export.check_ms` of the -j 1 "
              "first run: the probe as the worker's first request, the graph's load included); and, "
              "for comparison, Keras's `ExportArchive` (`track`, `add_endpoint`, `write_out`: what every file "
              "cost before #25); beside them the export's time in isorun's first run (`export.ms`, -j 1, last "
              "round) and the worker's load and run of the SavedModel (from the cached run).", "",
              "| file | MB | import (s) | load_model (s) | trace (s) | freeze (s) | probe (s) | write (s) | "
              "session check (s) | check in the worker (s) | ExportArchive (s) | export in isorun -j 1 (s) | "
              "worker load (s) | worker run (s) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in r["steps"].items():
        w = r["worker"].get(name, {})
        e = r["first_j1_export_ms"].get(name)
        check_ms = (r.get("first_j1_check", {}).get(name) or [None, None])[1]
        in_worker = f"{check_ms / 1e3:.2f}" if check_ms is not None else "–"
        lines.append(f"| {name} | {r['sizes'][name] / 1e6:.0f} | {s['import']:.1f} | {s['load_model']:.1f} | "
                     f"{s['trace']:.1f} | {s['freeze']:.1f} | {s['probe']:.2f} | {s['write']:.1f} | "
                     f"{s['session_check']:.1f} | {in_worker} | "
                     f"{s['archive']:.1f} | {e / 1e3 if e else float('nan'):.1f} | "
                     f"{(w.get('load_ms') or 0) / 1e3:.2f} | {(w.get('run_ms') or 0) / 1e3:.2f} |")
    total = {k: sum(s.get(k, 0) for s in r["steps"].values())
             for k in ("import", "load_model", "trace", "freeze", "probe", "write", "session_check", "archive")}
    lines += ["", "Summed over the five: " + ", ".join(f"{k} {v:.1f} s" for k, v in total.items()) + ".", ""]
    j1, j2 = r["first_j1_s"] / loop, r["first_j2_s"] / loop
    cpu2 = r["cpu_s"]["first_j2_s"]
    frozen_steps = total["freeze"] + total["probe"] + total["write"]
    lines.append(f"**What bounds -j 2**: it is CPU-bound ({cpu2:.1f} CPU-s, {cpu2 / r['first_j2_s']:.2f} of the 2 "
                 f"cores busy), so it cannot take less than {cpu2 / 2:.1f} s ({cpu2 / 2 / loop:.2f}×) without "
                 f"spending less CPU. Against the Keras loop's {r['cpu_s']['loop_s']:.1f} CPU-s, the extra is the "
                 "second export process's `import tensorflow, keras` (each process imports once, ~4–5 s), the "
                 f"frozen way's steps the loop does not take (freeze, probe and write: {frozen_steps:.1f} s over the "
                 "five) and the workers' loads and runs (the probe's among them); 0.7× needs at most "
                 f"{0.7 * loop * 2:.1f} CPU-s at both cores busy.\n")
    lines.append(f"**Targets**: first run -j 1 ≤ 1.0× the loop: {'met' if j1 <= 1.0 else '**missed**'} ({j1:.2f}×); "
                 f"-j 2 ≤ 0.7×: {'met' if j2 <= 0.7 else '**missed**'} ({j2:.2f}×).\n")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
