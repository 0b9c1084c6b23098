"""The seed's Python loop against the same loop through `isorun.run` (the
wheel's Python API), on the benchmark zoo's 40 MLPs: wall time of the whole
command and the Python process's memory (VmRSS after each model, VmHWM at
the end). Writes the "From Python" section of BENCHMARKS.md.

  python3 scripts/bench_wheel.py --python VENV/bin/python [--zoo DIR] [--rounds 3] [--output BENCHMARKS.md]

VENV holds the wheel (pip install ./, or scripts/test-wheel's
target/wheel-test/venv), tensorflow-cpu==2.21.0 and numpy. The zoo
(default ${XDG_CACHE_HOME:-~/.cache}/isorun/wheel-bench-zoo) is made on
first use with scripts/bench_models.py's make_mlp: the same 40 Keras MLPs
32-256-256-10 (seeds 0-39) and inputs.npz (x: float32 [8, 32]) as scripts/bench.
Not part of scripts/test.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
N_MODELS = 40
SECTION = "## From Python (the wheel)"

# Run under VENV's python: one way, JSON on the last line of stdout.
WAY = r'''
import gc, json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
way, inputs_path, models = sys.argv[1], sys.argv[2], sys.argv[3:]
import numpy as np
inputs = dict(np.load(inputs_path))
rss = []
if way == "loop":
    import tensorflow as tf
    for model_dir in models:
        model = tf.saved_model.load(model_dir)
        outputs = model.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
        y = outputs["output_0"].numpy()
        del outputs, model
        tf.keras.backend.clear_session()
        gc.collect()
        rss.append(status("VmRSS:"))
else:
    import isorun
    jobs = int(way.split("-j")[1])
    for result in isorun.run(models, inputs, jobs=jobs):
        assert result.ok, (result.model, result.status, result.error)
        y = result.outputs["output_0"]
        rss.append(status("VmRSS:"))
print(json.dumps({"rss": rss, "hwm": status("VmHWM:"), "tensorflow_imported": "tensorflow" in sys.modules}))
'''

WAYS = ["python loop", "isorun.run -j1", "isorun.run -j2"]


def make_zoo(python, zoo):
    marker = os.path.join(zoo, ".complete")
    if os.path.isfile(marker):
        return
    print(f"bench_wheel: making the zoo in {zoo}", file=sys.stderr)
    code = (
        "import os, sys, numpy as np\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import bench_models\n"
        f"zoo = {zoo!r}\n"
        f"for seed in range({N_MODELS}):\n"
        "    bench_models.make_mlp(os.path.join(zoo, 'mlp40', f'm{seed:02d}'), seed)\n"
        "np.savez(os.path.join(zoo, 'inputs.npz'), x=np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))\n"
        "open(os.path.join(zoo, '.complete'), 'w').write('40 MLPs\\n')\n"
    )
    subprocess.run([python, "-c", code], check=True)


def run_way(python, way, inputs, models):
    arg = "loop" if way == "python loop" else way.replace("isorun.run ", "api")
    started = time.perf_counter()
    ran = subprocess.run([python, "-c", WAY, arg, inputs, *models], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if ran.returncode != 0:
        sys.exit(f"bench_wheel: {way} failed:\n{ran.stderr[-3000:]}")
    measured = json.loads(ran.stdout.strip().splitlines()[-1])
    measured["wall"] = wall
    return measured


def mib(b):
    return b / (1 << 20)


def write(output, results, rounds, python):
    rows = []
    for way in WAYS:
        runs = results[way]
        walls = [r["wall"] for r in runs]
        first = statistics.median(r["rss"][0] for r in runs)
        last = statistics.median(r["rss"][-1] for r in runs)
        hwm = statistics.median(r["hwm"] for r in runs)
        slope = statistics.median((r["rss"][-1] - r["rss"][9]) / (len(r["rss"]) - 10) for r in runs)
        imported = any(r["tensorflow_imported"] for r in runs)
        rows.append((way, walls, first, last, hwm, slope, imported))
    loop_wall = statistics.median(results["python loop"][i]["wall"] for i in range(rounds))
    lines = [
        SECTION,
        "",
        f"Written by `python3 scripts/bench_wheel.py` ({rounds} rounds, the ways alternating; {python}). "
        "The seed's loop in one Python process (for each of the zoo's 40 MLPs: `tf.saved_model.load`, call "
        "`serving_default` once, `.numpy()`, `del`, `tf.keras.backend.clear_session()`, `gc.collect()`) against "
        "the same loop through the wheel's API (`for result in isorun.run(models, inputs, jobs=N)`, outputs read "
        "back as NumPy arrays). Wall time of the whole command, imports included; the Python process's VmRSS "
        "after the 1st and the 40th model, its growth per model from the 10th on, and its VmHWM at the end "
        "(medians over the rounds).",
        "",
        "| way | runs (s) | median (s) | × python loop's time | Python RSS after model 1 (MiB) | after model 40 (MiB) "
        "| growth per model (KiB) | Python peak (MiB) | TensorFlow imported |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for way, walls, first, last, hwm, slope, imported in rows:
        median = statistics.median(walls)
        lines.append(
            f"| {way} | {', '.join(f'{w:.2f}' for w in walls)} | {median:.2f} | {median / loop_wall:.2f}× | "
            f"{mib(first):.0f} | {mib(last):.0f} | {slope / 1024:.1f} | {mib(hwm):.0f} | {'yes' if imported else 'no'} |"
        )
    lines += [
        "",
        "Through `isorun.run` the Python process holds NumPy and the results only: nothing is loaded in it, so "
        "its memory stays where it started whatever the models weigh (each worker's memory is its own and goes "
        "back to the system when it exits; see the tables above).",
        "",
    ]
    text = "\n".join(lines)
    old = open(output).read() if os.path.exists(output) else ""
    if SECTION in old:
        start = old.index(SECTION)
        rest = old[start + len(SECTION):]
        following = re.search(r"^## ", rest, re.M)
        end = start + len(SECTION) + following.start() if following else len(old)
        new = old[:start] + text + ("\n" + old[end:] if following else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    with open(output, "w") as f:
        f.write(new)
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    parser.add_argument("--zoo", default=os.path.join(cache, "isorun", "wheel-bench-zoo"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(HERE, "..", "BENCHMARKS.md"))
    args = parser.parse_args()
    make_zoo(args.python, args.zoo)
    models = [os.path.join(args.zoo, "mlp40", f"m{i:02d}") for i in range(N_MODELS)]
    inputs = os.path.join(args.zoo, "inputs.npz")
    results = {way: [] for way in WAYS}
    for round_ in range(args.rounds):
        for way in WAYS:
            measured = run_way(args.python, way, inputs, models)
            results[way].append(measured)
            print(f"bench_wheel: round {round_ + 1} {way}: {measured['wall']:.2f} s, "
                  f"peak {mib(measured['hwm']):.0f} MiB", file=sys.stderr)
    write(args.output, results, args.rounds, os.path.basename(os.path.dirname(os.path.dirname(args.python))))


if __name__ == "__main__":
    main()
