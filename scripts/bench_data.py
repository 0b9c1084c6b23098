"""scripts/bench's data-formats row: `isorun eval` on one dataset stored as
Parquet, Arrow, JSON Lines and TFRecord, against the pyarrow loop Python users
write.

Run by scripts/bench (all of it, or `scripts/bench --data-only`) under the
bench's interpreter (tensorflow-cpu==2.21.0, numpy, pyarrow). Subcommands:

  zoo DIR [--quick]
                 make the data zoo in DIR/data (reused when complete):
                   DIR/data/model/            a Keras MLP 32 -> 128 -> 128 -> 10
                                              (softmax), `model.export`
                   DIR/data/data.parquet      ROWS examples: x list<float32> [32],
                                              label int64 (0..9); pyarrow, snappy,
                                              row groups of 1,048,576 rows (its default)
                   DIR/data/data.arrow        the same rows, Arrow IPC stream format
                                              (what Hugging Face `datasets` writes),
                                              record batches of 1,000 rows
                   DIR/data/data.jsonl        the same rows, one JSON object a line
                   DIR/data/data.tfrecord     the same rows as tf.Example
                 ROWS = 8,250,000 (a ~1 GiB Parquet file), 400,000 with --quick
  python DATA MODEL
                 the Python baseline, one process: `tf.saved_model.load`,
                 `pyarrow.parquet.ParquetFile(DATA).iter_batches(BATCH,
                 columns=["x", "label"])`, the list column's flat values
                 reshaped to [rows, 32] (no copy), the signature per batch,
                 accuracy and log loss in numpy; JSON on stdout (metrics,
                 timings, the process's VmHWM)
  bench ...      the driver: rounds alternating the Python loop and isorun on
                 each format, and the "Data formats" section of the Markdown

The driver uses only the standard library; `zoo` and `python` import TensorFlow.
"""

import argparse
import gc
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_eval  # noqa: E402  (the zoo's classifier, the samplers)
from benchlib import log, machine, publish  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Bump when the data zoo's contents change, so an old one is rebuilt.
DATA_ZOO_VERSION = "isorun-bench-data-zoo 1"
ROWS, QUICK_ROWS = 8_250_000, 400_000
FEATURES, CLASSES = bench_eval.FEATURES, bench_eval.CLASSES
BATCH = 1024
CHUNK = 131_072  # 8 chunks make one Parquet row group of 1,048,576 rows
MIB = 1024 * 1024
SECTION = "## Data formats"
FORMATS = (("parquet", "data.parquet"), ("arrow", "data.arrow"), ("jsonl", "data.jsonl"),
           ("tfrecord", "data.tfrecord"))

median = bench_eval.median
fmt = bench_eval.fmt


# --------------------------------------------------------------------------
# The zoo
# --------------------------------------------------------------------------


def chunks(rows, w):
    """The dataset in chunks of CHUNK rows, drawn from one seeded generator."""
    import numpy as np

    rng = np.random.default_rng(21)
    done = 0
    while done < rows:
        n = min(CHUNK, rows - done)
        x = rng.standard_normal((n, FEATURES), dtype=np.float32)
        logits = x @ w + rng.standard_normal((n, CLASSES)).astype(np.float32)
        yield x, np.argmax(logits, axis=1).astype(np.int64)
        done += n


def write_all(root, rows, w):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    schema = pa.schema([("x", pa.list_(pa.float32())), ("label", pa.int64())])

    def table(x, labels):
        offsets = pa.array(np.arange(0, (len(x) + 1) * FEATURES, FEATURES, dtype=np.int32))
        values = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))
        return pa.Table.from_arrays([values, pa.array(labels)], schema=schema)

    parquet = pq.ParquetWriter(os.path.join(root, "data.parquet"), schema, compression="snappy")
    arrow_sink = pa.OSFile(os.path.join(root, "data.arrow"), "wb")
    arrow = pa.ipc.new_stream(arrow_sink, schema)
    jsonl = open(os.path.join(root, "data.jsonl"), "w")
    tfrecord = tf.io.TFRecordWriter(os.path.join(root, "data.tfrecord"))
    pending = []
    for x, labels in chunks(rows, w):
        t = table(x, labels)
        pending.append(t)
        if len(pending) == 8:
            parquet.write_table(pa.concat_tables(pending), row_group_size=1_048_576)
            pending = []
        for batch in t.to_batches(max_chunksize=1000):
            arrow.write_batch(batch)
        # 9 significant digits give back the same float32.
        texts = np.char.mod("%.9g", x)
        for row, label in zip(texts, labels):
            jsonl.write('{"x": [' + ", ".join(row) + '], "label": ' + str(int(label)) + "}\n")
        for row, label in zip(x, labels):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }))
            tfrecord.write(example.SerializeToString())
    if pending:
        parquet.write_table(pa.concat_tables(pending), row_group_size=1_048_576)
    parquet.close()
    arrow.close()
    arrow_sink.close()
    jsonl.close()
    tfrecord.close()


def zoo(args):
    import numpy as np

    rows = QUICK_ROWS if args.quick else ROWS
    root = os.path.join(os.path.abspath(args.dir), "data-quick" if args.quick else "data")
    stamp = os.path.join(root, "COMPLETE")
    version = f"{DATA_ZOO_VERSION} rows={rows}"
    if os.path.exists(stamp) and open(stamp).read().strip() == version:
        log(f"data zoo: reusing {root}")
        return 0
    log(f"data zoo: making {root} ({rows:,} rows in 4 formats; several minutes)")
    os.makedirs(os.path.dirname(root), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".bench-data-zoo-", dir=os.path.dirname(root))
    started = time.perf_counter()
    w = np.random.default_rng(11).standard_normal((FEATURES, CLASSES)).astype(np.float32)
    train_x, train_labels = bench_eval.make_data(w, np.random.default_rng(13))
    bench_eval.make_classifier(os.path.join(tmp, "model"), 128, train_x[:30_000], train_labels[:30_000], seed=1)
    write_all(tmp, rows, w)
    with open(os.path.join(tmp, "COMPLETE"), "w") as f:
        f.write(version + "\n")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.rename(tmp, root)
    log(f"data zoo: done in {time.perf_counter() - started:.0f} s")
    return 0


# --------------------------------------------------------------------------
# The Python baseline
# --------------------------------------------------------------------------


def python_loop(args):
    import numpy as np
    import pyarrow.parquet as pq
    import tensorflow as tf

    eps = float(np.finfo(np.float32).eps)
    started = time.perf_counter()
    model = tf.saved_model.load(args.model)
    fn = model.signatures["serving_default"]
    load_s = time.perf_counter() - started
    n = correct = 0
    loss = 0.0
    model_s = 0.0
    for batch in pq.ParquetFile(args.data).iter_batches(batch_size=args.batch_size, columns=["x", "label"]):
        x = batch.column(0).flatten().to_numpy(zero_copy_only=True).reshape(-1, FEATURES)
        labels = batch.column(1).to_numpy()
        t = time.perf_counter()
        (probs,) = [v.numpy() for v in fn(x=tf.constant(x)).values()]
        model_s += time.perf_counter() - t
        correct += int((probs.argmax(axis=1) == labels).sum())
        q = probs[np.arange(len(labels)), labels].astype(np.float64)
        loss += float(-np.log(np.clip(q, eps, 1 - eps)).sum())
        n += len(labels)
    loop_s = time.perf_counter() - started
    del fn, model
    gc.collect()
    print(json.dumps({"examples": n, "accuracy": correct / n, "log_loss": loss / n, "load_s": load_s,
                      "loop_s": loop_s, "model_s": model_s, "vmhwm_bytes": bench_eval.vm_hwm()}))
    return 0


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------


class DataBench:
    def __init__(self, args):
        self.args = args
        self.repo = os.path.abspath(args.repo)
        self.isorun = os.path.join(self.repo, "target/release/isorun")
        self.root = os.path.join(os.path.abspath(args.zoo), "data-quick" if args.quick else "data")
        self.model = os.path.join(self.root, "model")
        self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self.results = {"quick": args.quick, "rounds_n": args.rounds, "rounds": [],
                        "sizes": {name: os.path.getsize(os.path.join(self.root, f)) for name, f in FORMATS}}

    def timed(self, cmd, what, sample=False):
        started = time.perf_counter()
        p = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        sampler = bench_eval.HwmSampler(p.pid) if sample else None
        if sampler:
            sampler.start()
        out, err = p.communicate()
        wall = time.perf_counter() - started
        if sampler:
            sampler.stop.set()
            sampler.join()
        if p.returncode != 0:
            raise SystemExit(f"bench: {what} failed with exit code {p.returncode}:\n{err[-3000:]}")
        return wall, out, err, (sampler.peak if sampler else None)

    def python(self):
        cmd = [sys.executable, os.path.abspath(__file__), "python", os.path.join(self.root, "data.parquet"),
               self.model, "--batch-size", str(BATCH)]
        wall, out, _, hwm = self.timed(cmd, "python loop", sample=True)
        m = json.loads(out.strip().splitlines()[-1])
        m.update(wall_s=wall, sampled_vmhwm_bytes=hwm)
        return m

    def isorun_eval(self, name, file):
        cmd = [self.isorun, "eval", self.model, "--data", os.path.join(self.root, file), "--label", "label",
               "--metric", "accuracy", "--metric", "log_loss", "--json", "--summary", "--batch-size", str(BATCH)]
        wall, out, err, hwm = self.timed(cmd, f"isorun eval {name}", sample=True)
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        records = [r for r in records if "model" in r]
        if len(records) != 1 or records[0].get("status") != "ok":
            raise SystemExit(f"bench: isorun eval {name}: {records}\n{err[-2000:]}")
        r = records[0]
        m = re.search(r"supervisor peak memory (\d+) MiB", err)
        return {"wall_s": wall, "examples": r.get("examples"), "accuracy": r["metrics"]["accuracy"],
                "log_loss": r["metrics"]["log_loss"], "supervisor_peak_mib": int(m.group(1)) if m else None,
                "supervisor_vmhwm_bytes": hwm, "unit_wall_ms": r.get("wall_ms"),
                "examples_per_second": r.get("examples_per_second"), "peak_rss_bytes": r.get("peak_rss_bytes")}

    def warm_up(self):
        log("data warm-up (not measured): page cache, libtensorflow, Python imports")
        for _, file in FORMATS:
            with open(os.path.join(self.root, file), "rb") as f:
                while f.read(1 << 24):
                    pass
        self.timed([sys.executable, "-c", "import tensorflow, pyarrow.parquet"], "warm-up python")
        self.timed([self.isorun, "eval", self.model, "--data", os.path.join(self.root, "data.parquet"),
                    "--label", "label", "--limit", "10000", "-q"], "warm-up isorun eval")

    def rounds(self):
        ways = {"python (pyarrow, parquet)": self.python}
        for name, file in FORMATS:
            ways[f"isorun {name}"] = (lambda n=name, f=file: self.isorun_eval(n, f))
        for r in range(self.args.rounds):
            round_ = {}
            for name, fn in ways.items():
                log(f"data round {r + 1}/{self.args.rounds}: {name} ...")
                round_[name] = fn()
                log(f"data round {r + 1}/{self.args.rounds}: {name}: {round_[name]['wall_s']:.2f} s")
            self.results["rounds"].append(round_)


def section(results, machine):
    rounds = results["rounds"]
    names = list(rounds[0].keys())
    python = names[0]
    out = []
    w = out.append
    rows = rounds[0][python]["examples"]
    w(f"{SECTION}\n")
    if results["quick"]:
        w(f"**A `--quick` smoke run: {rows:,} rows; not figures to quote.**\n")
    sizes = results["sizes"]
    w(f"`isorun eval` of one model over one dataset of {rows:,} examples stored four ways, against the pyarrow "
      f"loop a Python user writes for the Parquet file (written by `scripts/bench_data.py`; run with "
      f"`scripts/bench --data-only`, which rewrites only this section).\n")
    w(f"- machine: {machine['cpu']}, {machine['cores']} cores, {fmt(machine.get('memory_gib'), '.1f')} GiB; "
      f"kernel {machine['kernel']}; {machine['date']}; isorun commit `{machine['commit']}`")
    w(f"- the data-formats part took {results['elapsed_s'] / 60:.1f} min")
    w("- files: " + ", ".join(f"{name} {sizes[name] / MIB:,.0f} MiB" for name, _ in FORMATS) + "\n")
    w(f"The model: an MLP 32 → 128 → 128 → 10 (softmax) exported with `model.export`. The data: `x` "
      f"list<float32> of 32 values, `label` int64 in 0..9; Parquet by pyarrow (snappy, row groups of 1,048,576 "
      f"rows), Arrow as an IPC stream in record batches of 1,000 rows (the layout Hugging Face `datasets` "
      f"writes), JSON Lines with 9 significant digits (the same float32 values), TFRecord of `tf.Example`.\n")
    w(f"- **python**: one process: `tf.saved_model.load`, `pyarrow.parquet.ParquetFile.iter_batches({BATCH}, "
      "columns=[x, label])`, the list column's flat values reshaped to [rows, 32] without a copy, "
      "`serving_default` per batch, `.numpy()`, accuracy and log loss in numpy. Peak: its VmHWM.")
    w(f"- **isorun FORMAT**: `isorun eval model --data data.FORMAT --label label --metric accuracy --metric "
      f"log_loss --batch-size {BATCH} --json --summary`. Supervisor peak: `--summary`'s \"supervisor peak "
      "memory\" (its VmHWM also sampled from `/proc` every 20 ms); the worker's: the record's `peak_rss_bytes`.\n")
    w(f"The ways alternate, {results['rounds_n']} round(s); a figure is the median of the rounds, a ratio the "
      "median of per-round ratios. Wall time is the whole command.\n")
    w("| way | runs (s) | median (s) | ratio to python | examples/s end to end | peak memory (MiB) | "
      "worker peak RSS (MiB) |")
    w("|---|---|---:|---:|---:|---:|---:|")
    table = {}
    for name in names:
        runs = [r[name]["wall_s"] for r in rounds]
        ratio = median([r[name]["wall_s"] / r[python]["wall_s"] for r in rounds])
        if name == python:
            peak = f"{median([r[name]['vmhwm_bytes'] for r in rounds]) / MIB:,.0f} (Python)"
            worker = "–"
        else:
            peak = (f"{max(r[name]['supervisor_peak_mib'] or 0 for r in rounds)} (supervisor; VmHWM "
                    f"{max(r[name]['supervisor_vmhwm_bytes'] or 0 for r in rounds) / MIB:.1f})")
            worker = f"{median([r[name]['peak_rss_bytes'] or 0 for r in rounds]) / MIB:,.0f}"
        table[name] = {"median_s": median(runs), "ratio": ratio}
        w(f"| {name} | {', '.join(f'{x:.2f}' for x in runs)} | {median(runs):.2f} | {ratio:.2f}× | "
          f"{rows / median(runs):,.0f} | {peak} | {worker} |")
    w("")
    acc = max(abs(rounds[0][n]["accuracy"] - rounds[0][python]["accuracy"]) for n in names)
    ll = max(abs(rounds[0][n]["log_loss"] - rounds[0][python]["log_loss"]) / abs(rounds[0][python]["log_loss"])
             for n in names)
    w(f"**Same numbers.** Every way's accuracy and log loss against Python's: largest difference accuracy "
      f"{acc:.2g}, log loss {ll:.2g} relative (accuracy {rounds[0][python]['accuracy']:.6f}).\n")
    parquet = table["isorun parquet"]
    tfrecord = table["isorun tfrecord"]
    peaks = {n: max(r[n]["supervisor_peak_mib"] or 0 for r in rounds) for n in names if n != python}
    speed_met = parquet["ratio"] <= 0.5
    memory_met = max(peaks.values()) <= 100
    w(f"**Targets.** isorun on Parquet at least 2× faster than the pyarrow loop: "
      f"{'met' if speed_met else '**missed**'} ({1 / parquet['ratio']:.2f}× faster). Supervisor peak at most "
      f"100 MiB on every format: {'met' if memory_met else '**missed**'} (at most {max(peaks.values())} MiB). "
      f"Parquet against the same data as TFRecord: {tfrecord['median_s'] / parquet['median_s']:.2f}× faster.\n")
    results["target"] = {"speed_met": speed_met, "memory_met": memory_met,
                         "parquet_speedup": 1 / parquet["ratio"], "peak_mib": max(peaks.values())}
    notes = results.get("notes")
    if notes:
        w(notes.rstrip() + "\n")
    return "\n".join(out)


def bench(args):
    if args.only_write:
        with open(args.results) as f:
            results = json.load(f)
    else:
        started = time.perf_counter()
        b = DataBench(args)
        b.warm_up()
        b.rounds()
        results = b.results
        results["machine"] = machine(b.repo)
        results["elapsed_s"] = time.perf_counter() - started
    if args.notes and os.path.exists(args.notes):
        results["notes"] = open(args.notes).read()
    text = section(results, results["machine"])
    publish(args, results, text, SECTION, "data formats", "--data-only")
    log(f"wrote the data-formats section of {args.output} (raw measurements: {args.results})")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("zoo")
    p.add_argument("dir")
    p.add_argument("--quick", action="store_true")
    p = sub.add_parser("python")
    p.add_argument("data")
    p.add_argument("model")
    p.add_argument("--batch-size", type=int, default=BATCH)
    p = sub.add_parser("bench")
    p.add_argument("--repo", required=True)
    p.add_argument("--zoo", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help=f"1 round, {QUICK_ROWS:,} rows")
    p.add_argument("--output", required=True)
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--results", required=True)
    p.add_argument("--notes")
    p.add_argument("--only-write", action="store_true")
    args = parser.parse_args()
    return {"zoo": zoo, "python": python_loop, "bench": bench}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
