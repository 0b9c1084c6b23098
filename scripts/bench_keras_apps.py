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
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_markdown import splice  # noqa: E402

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
folder, inputs = sys.argv[1], sys.argv[2]
x = np.load(inputs)["x"]
for name in sorted(os.listdir(folder)):
    model = keras.models.load_model(os.path.join(folder, name), compile=False)
    model.predict(x, verbose=0)
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
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
t0 = time.perf_counter()
concrete = tf.function(serve).get_concrete_function(*specs)
t["trace"] = time.perf_counter() - t0
t0 = time.perf_counter()
frozen = convert_variables_to_constants_v2(concrete)
graph_def = frozen.graph.as_graph_def()
t["freeze"] = time.perf_counter() - t0
t0 = time.perf_counter()
graph = tf.Graph()
with graph.as_default():
    tf.graph_util.import_graph_def(graph_def, name="")
    inputs = {"x": graph.get_tensor_by_name(frozen.inputs[0].name)}
    outputs = {"y": graph.get_tensor_by_name(frozen.outputs[0].name)}
    signature = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def(inputs, outputs)
    with tf.compat.v1.Session(graph=graph) as session:
        builder = tf.compat.v1.saved_model.Builder(sys.argv[2] + "-frozen")
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
t["write"] = time.perf_counter() - t0
t0 = time.perf_counter()
archive = keras.export.ExportArchive()
archive.track(model)
archive.add_endpoint(name="serving_default", fn=serve, input_signature=specs)
archive.write_out(sys.argv[2], verbose=False)
t["archive"] = time.perf_counter() - t0
print(json.dumps(t))
'''


def log(message):
    print(f"bench_keras_apps: {message}", file=sys.stderr, flush=True)


def timed(cmd, env=None):
    started = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if p.returncode != 0:
        raise SystemExit(f"bench_keras_apps: {cmd[:3]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall, p.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--isorun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    work = os.path.abspath(args.work)
    apps, inputs = os.path.join(work, "apps"), os.path.join(work, "inputs.npz")
    if len([f for f in os.listdir(apps) if f.endswith(".keras")] if os.path.isdir(apps) else []) != len(MODELS):
        log("making the five models (a few minutes)")
        subprocess.run([args.python, "-c", MAKE, apps, *MODELS], check=True)
    sizes = {f: os.path.getsize(os.path.join(apps, f)) for f in sorted(os.listdir(apps))}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    results = {"sizes": sizes}

    log("the seed's Keras loop ...")
    results["loop_s"], _ = timed([args.python, "-c", LOOP, apps, inputs], env)
    cache = os.path.join(work, "cache")
    for jobs in (1, 2):
        subprocess.run([args.isorun, "cache", "clear", "--keras-cache", cache], check=True, capture_output=True)
        log(f"isorun run -j {jobs}, first run ...")
        wall, out = timed([args.isorun, "run", apps, "--inputs", inputs, "--json", "-q", "--python", args.python,
                           "--keras-cache", cache, "-j", str(jobs), "-vv"], env)
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        bad = [r for r in records if r.get("status") != "ok"]
        if bad or len(records) != len(MODELS):
            raise SystemExit(f"bench_keras_apps: not ok: {bad}")
        results[f"first_j{jobs}_s"] = wall
        results[f"first_j{jobs}_export_ms"] = {r["model"]: r["export"]["ms"] for r in records}
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
    lines = [SECTION, "",
             "`keras.applications` MobileNetV3Small, EfficientNetB0, ResNet50, ConvNeXtTiny and DenseNet121 "
             "(`weights=None`, saved as `.keras`), one input of 2×224×224×3; one round of each way "
             f"(`scripts/bench_keras_apps.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 2 cores).", "",
             "| way | wall (s) | ÷ the Keras loop |", "|---|---:|---:|",
             f"| the seed's Keras loop (`load_model`, `predict`, `del`, `clear_session`, `gc.collect`) | {loop:.1f} | 1.00× |"]
    for key, name in (("first_j1_s", "isorun run -j 1, first run (exports included)"),
                      ("first_j2_s", "isorun run -j 2, first run"), ("cached_s", "isorun run -j 1, from the cache")):
        lines.append(f"| {name} | {r[key]:.1f} | {r[key] / loop:.2f}× |")
    lines += ["", "**Where an export's time goes**: each file exported alone by the exporter's calls in a fresh "
              "Python process: interpreter start and `import tensorflow, keras`, `load_model`, then the frozen way "
              "isorun takes (tracing the serving function once, folding the variables into constants, writing the "
              "SavedModel with the v1 builder) and, for comparison, Keras's `ExportArchive` (`track`, "
              "`add_endpoint`, `write_out`: what every file cost before); beside them the export's time in "
              "isorun's first run (`export.ms`, -j 1) and the worker's load and run of the SavedModel (from the "
              "cached run).", "",
              "| file | MB | import (s) | load_model (s) | trace (s) | freeze (s) | write (s) | ExportArchive (s) | export in isorun -j 1 (s) | worker load (s) | worker run (s) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in r["steps"].items():
        model = name
        w = r["worker"].get(model, {})
        e = r["first_j1_export_ms"].get(model)
        lines.append(f"| {name} | {r['sizes'][name] / 1e6:.0f} | {s['import']:.1f} | {s['load_model']:.1f} | "
                     f"{s['trace']:.1f} | {s.get('freeze', 0):.1f} | {s['write']:.1f} | {s.get('archive', 0):.1f} | "
                     f"{e / 1e3 if e else float('nan'):.1f} | "
                     f"{(w.get('load_ms') or 0) / 1e3:.2f} | {(w.get('run_ms') or 0) / 1e3:.2f} |")
    total = {k: sum(s.get(k, 0) for s in r["steps"].values())
             for k in ("import", "load_model", "trace", "freeze", "write", "archive")}
    lines += ["", "Summed over the five: " + ", ".join(f"{k} {v:.1f} s" for k, v in total.items()) + ".", ""]
    j1, j2 = r["first_j1_s"] / loop, r["first_j2_s"] / loop
    lines.append(f"**Targets: first run -j 1 ≤ 1.0× the loop: {'met' if j1 <= 1.0 else '**missed**'}** ({j1:.2f}×); "
                 f"**-j 2 ≤ 0.7×: {'met' if j2 <= 0.7 else '**missed**'}** ({j2:.2f}×).\n")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
