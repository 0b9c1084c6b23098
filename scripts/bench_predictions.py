"""`eval --predictions` overhead and `rescore` throughput on the eval bench.

Usage: python scripts/bench_predictions.py ISORUN ZOO_EVAL_DIR WORK_DIR [ROUNDS]

ZOO_EVAL_DIR is scripts/bench_eval.py's zoo (models/w064..w512, data.tfrecord
of 100,000 examples). Rounds alternate eval without and with --predictions
(-j 1, --spawn zygote, accuracy and log loss), then time `isorun rescore` of
the four files against pandas.read_parquet + scikit-learn computing the same
metrics. Not part of scripts/bench (yet): prints a JSON summary.
"""
import json, os, re, resource, shutil, subprocess, sys, time

isorun, zoo, work = sys.argv[1:4]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
models = [os.path.join(zoo, "models", m) for m in sorted(os.listdir(os.path.join(zoo, "models")))]
data = os.path.join(zoo, "data.tfrecord")
base = [isorun, "eval", *models, "--data", data, "--label", "label", "--metric", "accuracy",
        "--metric", "log_loss", "-j", "1", "--spawn", "zygote", "--json", "--summary"]


def timed(cmd):
    started = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{cmd}: exit {out.returncode}\n{out.stderr[-3000:]}")
    rss = int(re.search(r"MAXRSS (\d+)", out.stderr).group(1)) / 1024
    return wall, out.stdout, rss


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


plain, with_preds, ratios = [], [], []
preds = os.path.join(work, "preds")
for r in range(rounds):
    a, _, _ = timed(base)
    shutil.rmtree(preds, ignore_errors=True)
    b, out, _ = timed(base + ["--predictions", preds])
    plain.append(a), with_preds.append(b), ratios.append(b / a)
    print(f"round {r}: eval {a:.2f} s, with --predictions {b:.2f} s ({b / a:.3f}x)", file=sys.stderr)
records = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
files = [r["predictions"] for r in records]
size = sum(os.path.getsize(f) for f in files)

rescore_runs, rescore_rss = [], []
for r in range(rounds):
    wall, out, rss = timed([isorun, "rescore", *files, "--json"])
    rescore_runs.append(wall), rescore_rss.append(rss)
rescored = {json.loads(l)["model"]: json.loads(l)["metrics"] for l in out.splitlines() if l.startswith("{")}
evaluated = {r["model"]: r["metrics"] for r in records}
assert rescored == evaluated, (rescored, evaluated)

started = time.perf_counter()
import numpy as np, pandas as pd
from sklearn.metrics import accuracy_score, log_loss
imported = time.perf_counter() - started
python_runs = []
for r in range(rounds):
    started = time.perf_counter()
    got = {}
    for f in files:
        df = pd.read_parquet(f)
        probs = np.stack(df[[c for c in df.columns if c.startswith("output:")][0]].to_numpy())
        labels = df["label"].to_numpy()
        got[f] = (accuracy_score(labels, probs.argmax(axis=1)), log_loss(labels, probs, labels=list(range(probs.shape[1]))))
    python_runs.append(time.perf_counter() - started)
py_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
examples = 100_000 * len(files)
print(json.dumps({
    "eval_s": plain, "eval_predictions_s": with_preds, "overhead_median_ratio": median(ratios),
    "eval_median_s": median(plain), "eval_predictions_median_s": median(with_preds),
    "predictions_bytes": size,
    "rescore_s": rescore_runs, "rescore_median_s": median(rescore_runs),
    "rescore_examples_per_s": examples / median(rescore_runs), "rescore_peak_rss_mib": max(rescore_rss),
    "python_import_s": imported, "python_s": python_runs, "python_median_s": median(python_runs),
    "python_examples_per_s": examples / median(python_runs), "python_peak_rss_mib": py_rss,
    "rescore_equals_eval": True,
}, indent=1))
