"""scripts/bench's evaluation row: `isorun eval` against the Python loop users write.

Run by scripts/bench (all of it, or `scripts/bench --eval-only`) under the
bench's interpreter (tensorflow-cpu==2.21.0, numpy). Subcommands:

  zoo DIR        make the evaluation zoo in DIR/eval (reused when complete):
                   DIR/eval/models/w064..w512/  4 Keras MLPs 32 -> W -> W -> 10
                                                (softmax), W = 64, 128, 256, 512,
                                                trained 2 epochs, `model.export`
                   DIR/eval/data.tfrecord       100,000 tf.Example: x float_list
                                                [32], label int64 (0..9)
  python DATA MODEL...
                 the Python baseline, one process: for each model
                 `tf.saved_model.load`, `tf.data.TFRecordDataset(DATA)
                 .map(parse, AUTOTUNE).batch(256).prefetch(AUTOTUNE)`, the
                 signature per batch, accuracy and log loss streamed in
                 numpy, then `del`, `clear_session()`, `gc.collect()`; JSON on
                 stdout (metrics, timings, the process's VmHWM)
  bench ...      the driver: rounds alternating Python / isorun -j 1 /
                 isorun -j 2, a batch-size sweep, and the "Evaluation"
                 section of the Markdown (see `bench --help`)

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
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_host  # noqa: E402
from benchlib import children_cpu, log, machine, machine_busy, publish  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Bump when the evaluation zoo's contents change, so an old one is rebuilt.
EVAL_ZOO_VERSION = "isorun-bench-eval-zoo 2"
WIDTHS = (64, 128, 256, 512)
N_EXAMPLES = 100_000
FEATURES, CLASSES = 32, 10
BATCH = 256
# The careful Python loop's batch (whole batches parsed at once), and isorun's beside it.
BIG_BATCH = 1024
VECTORISED = f"python vectorised ({BIG_BATCH})"
QUICK_LIMIT = 20_000
MIB = 1024 * 1024
SECTION = "## Evaluation"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(x, spec, suffix=""):
    return "–" if x is None else f"{x:{spec}}{suffix}"


# --------------------------------------------------------------------------
# The zoo
# --------------------------------------------------------------------------


def make_data(w, rng):
    """x ~ N(0, 1), label = argmax(x @ w + noise): learnable, not trivially."""
    import numpy as np

    x = rng.standard_normal((N_EXAMPLES, FEATURES), dtype=np.float32)
    logits = x @ w + rng.standard_normal((N_EXAMPLES, CLASSES)).astype(np.float32)
    return x, np.argmax(logits, axis=1).astype(np.int64)


def write_tfrecord(path, x, labels):
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as writer:
        for row, label in zip(x, labels):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }))
            writer.write(example.SerializeToString())


def make_classifier(path, width, x, labels, seed):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    inp = tf.keras.Input(shape=(FEATURES,), dtype="float32", name="x")
    h = tf.keras.layers.Dense(width, activation="relu")(inp)
    h = tf.keras.layers.Dense(width, activation="relu")(h)
    out = tf.keras.layers.Dense(CLASSES, activation="softmax", name="probabilities")(h)
    model = tf.keras.Model(inp, out)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, labels, batch_size=256, epochs=2, verbose=0)
    model.export(path, verbose=False)
    tf.keras.backend.clear_session()


def zoo(args):
    import numpy as np

    root = os.path.join(os.path.abspath(args.dir), "eval")
    stamp = os.path.join(root, "COMPLETE")
    if os.path.exists(stamp) and open(stamp).read().strip() == EVAL_ZOO_VERSION:
        log(f"eval zoo: reusing {root}")
        return 0
    log(f"eval zoo: making {root} (4 classifiers, a 100,000-example TFRecord; a minute or two)")
    os.makedirs(os.path.dirname(root), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".bench-eval-zoo-", dir=os.path.dirname(root))
    started = time.perf_counter()
    w = np.random.default_rng(11).standard_normal((FEATURES, CLASSES)).astype(np.float32)
    x, labels = make_data(w, np.random.default_rng(12))
    write_tfrecord(os.path.join(tmp, "data.tfrecord"), x, labels)
    log(f"eval zoo: data.tfrecord written ({time.perf_counter() - started:.0f} s)")
    # Trained on a fresh draw from the same distribution, not on the test set.
    train_x, train_labels = make_data(w, np.random.default_rng(13))
    for i, width in enumerate(WIDTHS):
        make_classifier(os.path.join(tmp, "models", f"w{width:03d}"), width, train_x[:30_000],
                        train_labels[:30_000], seed=i)
    with open(os.path.join(tmp, "COMPLETE"), "w") as f:
        f.write(EVAL_ZOO_VERSION + "\n")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.rename(tmp, root)
    log(f"eval zoo: done in {time.perf_counter() - started:.0f} s")
    return 0


# --------------------------------------------------------------------------
# The Python baseline
# --------------------------------------------------------------------------


def vm_hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def percentiles(latencies):
    """p50, p90, p99 (nearest rank) after the first, warm-up batch: isorun's definition."""
    warm = sorted(latencies[1:] if len(latencies) > 1 else latencies)
    if not warm:
        return None
    rank = lambda p: warm[min(len(warm), max(1, math.ceil(p * len(warm)))) - 1]  # noqa: E731
    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99)}


def python_eval(args):
    import numpy as np
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([FEATURES], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        return tf.io.parse_single_example(record, spec)

    # sklearn's log_loss clips with the machine epsilon of the predictions' dtype.
    eps = float(np.finfo(np.float32).eps)
    started = time.perf_counter()
    models = []
    for model_dir in args.models:
        t0 = time.perf_counter()
        model = tf.saved_model.load(model_dir)
        fn = model.signatures["serving_default"]
        load_s = time.perf_counter() - t0
        ds = tf.data.TFRecordDataset(args.data)
        if args.limit:
            ds = ds.take(args.limit)
        if args.vectorised:
            # The careful loop: whole batches parsed at once, as Keras users are told to.
            ds = ds.batch(args.batch_size).map(lambda b: tf.io.parse_example(b, spec),
                                               num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
        else:
            ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(args.batch_size).prefetch(tf.data.AUTOTUNE)
        n = correct = 0
        loss = 0.0
        latencies = []
        for batch in ds:
            t = time.perf_counter()
            out = fn(x=batch["x"])
            (probs,) = [v.numpy() for v in out.values()]
            latencies.append((time.perf_counter() - t) * 1e3)
            labels = batch["label"].numpy()
            correct += int((probs.argmax(axis=1) == labels).sum())
            q = probs[np.arange(len(labels)), labels].astype(np.float64)
            loss += float(-np.log(np.clip(q, eps, 1 - eps)).sum())
            n += len(labels)
        wall_s = time.perf_counter() - t0
        models.append({
            "model": model_dir, "examples": n, "accuracy": correct / n, "log_loss": loss / n,
            "load_s": load_s, "wall_s": wall_s, "batches": len(latencies),
            "examples_per_second": n / (sum(latencies) / 1e3), "batch_latency_ms": percentiles(latencies),
        })
        del fn, model, ds, out
        tf.keras.backend.clear_session()
        gc.collect()
    print(json.dumps({"models": models, "loop_s": time.perf_counter() - started, "vmhwm_bytes": vm_hwm()}))
    return 0


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------


class HwmSampler(threading.Thread):
    """The highest VmHWM of a process read while it runs (every 20 ms)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return
            self.stop.wait(0.02)


class EvalBench:
    def __init__(self, args):
        self.args = args
        self.repo = os.path.abspath(args.repo)
        self.isorun = os.path.join(self.repo, "target/release/isorun")
        self.root = os.path.join(os.path.abspath(args.zoo), "eval")
        self.data = os.path.join(self.root, "data.tfrecord")
        models = os.path.join(self.root, "models")
        self.models = [os.path.join(models, m) for m in sorted(os.listdir(models))]
        self.limit = QUICK_LIMIT if args.quick else None
        self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self.results = {"quick": args.quick, "rounds_n": args.rounds, "limit": self.limit,
                        "models": [os.path.basename(m) for m in self.models], "rounds": [], "sweep": {},
                        "read_mb": []}
        # The files every way reads, read into the page cache before each
        # timed run (this host takes file pages back within a minute).
        self.warm = bench_host.way_files(sys.executable, self.repo, self.isorun) + [self.data, models]

    def timed(self, cmd, what, sample=False):
        """Runs cmd; returns (wall s, stdout, stderr, sampled VmHWM, own CPU s, other processes' cores)."""
        bench_host.warm(self.warm)
        read0 = bench_host.disk_read_bytes()
        cpu0, busy0 = children_cpu(), machine_busy()
        started = time.perf_counter()
        p = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        sampler = HwmSampler(p.pid) if sample else None
        if sampler:
            sampler.start()
        out, err = p.communicate()
        wall = time.perf_counter() - started
        if sampler:
            sampler.stop.set()
            sampler.join()
        own = children_cpu() - cpu0
        others = max(0.0, machine_busy() - busy0 - own) / wall
        self.results["read_mb"].append((bench_host.disk_read_bytes() - read0) / 1e6)
        if p.returncode != 0:
            raise SystemExit(f"bench: {what} failed with exit code {p.returncode}:\n{err[-3000:]}")
        return wall, out, err, (sampler.peak if sampler else None), own, others

    def python(self, vectorised=False, batch_size=BATCH):
        cmd = [sys.executable, os.path.abspath(__file__), "python", self.data, *self.models,
               "--batch-size", str(batch_size)] + (["--vectorised"] if vectorised else [])
        if self.limit:
            cmd += ["--limit", str(self.limit)]
        wall, out, _, _, own, others = self.timed(cmd, "python eval")
        m = json.loads(out.strip().splitlines()[-1])
        m.update(wall_s=wall, own_cpu_s=own, others_cores=others)
        return m

    def isorun_eval(self, jobs, batch_size=BATCH):
        cmd = [self.isorun, "eval", *self.models, "--data", self.data, "--label", "label",
               "--metric", "accuracy", "--metric", "log_loss", "-j", str(jobs), "--json", "--summary",
               "--batch-size", str(batch_size)]
        if self.limit:
            cmd += ["--limit", str(self.limit)]
        wall, out, err, hwm, own, others = self.timed(cmd, f"isorun eval -j {jobs}", sample=True)
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        records = [r for r in records if "model" in r]
        bad = [r for r in records if r.get("status") != "ok"]
        if bad or len(records) != len(self.models):
            raise SystemExit(f"bench: isorun eval -j {jobs}: {len(records)} records, not ok: {bad}\n{err[-2000:]}")
        m = re.search(r"supervisor peak memory (\d+) MiB", err)
        return {
            "wall_s": wall, "own_cpu_s": own, "others_cores": others,
            "supervisor_peak_mib": int(m.group(1)) if m else None, "supervisor_vmhwm_bytes": hwm,
            "models": [{
                "model": r["model"], "examples": r.get("examples"),
                "accuracy": r["metrics"]["accuracy"], "log_loss": r["metrics"]["log_loss"],
                **{k: r.get(k) for k in ("wall_ms", "load_ms", "run_ms", "user_ms", "sys_ms", "peak_rss_bytes",
                                         "examples_per_second", "batch_latency_ms", "worker_start")},
            } for r in sorted(records, key=lambda r: r["model"])],
        }

    def warm_up(self):
        log("eval warm-up (not measured): page cache, libtensorflow, Python imports")
        self.timed([self.isorun, "eval", self.models[0], "--data", self.data, "--label", "label", "--limit", "2560",
                    "-q"], "warm-up isorun eval")
        self.timed([sys.executable, "-c", "import tensorflow"], "warm-up python")
        with open(self.data, "rb") as f:
            while f.read(1 << 24):
                pass

    def rounds(self):
        ways = {"python": self.python, "isorun -j 1": lambda: self.isorun_eval(1),
                "isorun -j 2": lambda: self.isorun_eval(2),
                VECTORISED: lambda: self.python(vectorised=True, batch_size=BIG_BATCH),
                f"isorun -j 1 --batch-size {BIG_BATCH}": lambda: self.isorun_eval(1, batch_size=BIG_BATCH),
                f"isorun -j 2 --batch-size {BIG_BATCH}": lambda: self.isorun_eval(2, batch_size=BIG_BATCH)}
        for r in range(self.args.rounds):
            round_ = {}
            for name, fn in ways.items():
                log(f"eval round {r + 1}/{self.args.rounds}: {name} ({len(self.models)} models) ...")
                round_[name] = fn()
                log(f"eval round {r + 1}/{self.args.rounds}: {name}: {round_[name]['wall_s']:.2f} s")
            for size in (BATCH, BIG_BATCH):
                log(f"eval round {r + 1}/{self.args.rounds}: the in-process floor at batch {size} ...")
                round_[f"floor {size}"], round_[f"floor process {size}"] = self.floor(size)
            self.results["rounds"].append(round_)

    def floor(self, batch_size):
        """The in-process Rust floor per model: `isorun-worker --in-process --batch B --repeat R MODEL`
        loads the model and runs its signature 1 + R times on a decoded batch of B rows in one process
        (R + 1 = the batches of the data): the same load and runs as an eval unit, with no process, no
        IPC, no reading and no scoring."""
        examples = self.limit or N_EXAMPLES
        runs = math.ceil(examples / batch_size)
        worker = os.path.join(self.repo, "target/release/isorun-worker")
        out, process = {}, {}
        for model in self.models:
            wall, text, _, _, _, _ = self.timed([worker, "--in-process", "--batch", str(batch_size), "--repeat",
                                                 str(runs - 1), model], "isorun-worker --in-process")
            # The floor process's whole life (libtensorflow loaded, the model
            # loaded and run, exit): the fair floor of an exec'd unit.
            process[os.path.basename(model)] = wall
            total = re.search(r"\tload ([\d.]+) ms\ttotal ([\d.]+) ms$", text, re.M)
            repeat = re.search(r"\trepeat \d+ runs\t([\d.]+) s", text, re.M)
            if not total or not repeat:
                raise SystemExit(f"bench: no floor lines from isorun-worker --in-process:\n{text[-2000:]}")
            out[os.path.basename(model)] = float(total.group(2)) / 1e3 + float(repeat.group(1))
        return out, process

    def phases(self):
        """Where an eval unit's time goes: one more isorun eval -j 1 per batch size
        with `--report`, whose records carry each unit's `phases_ms` (not timed)."""
        for size in (BATCH, BIG_BATCH):
            log(f"eval phases: isorun -j 1 --batch-size {size} --report ...")
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [self.isorun, "eval", *self.models, "--data", self.data, "--label", "label", "--metric",
                       "accuracy", "--metric", "log_loss", "-j", "1", "--json", "--batch-size", str(size),
                       "--report", os.path.join(tmp, "report.json")]
                if self.limit:
                    cmd += ["--limit", str(self.limit)]
                _, out, _, _, _, _ = self.timed(cmd, "isorun eval --report")
            records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            self.results.setdefault("phases", {})[str(size)] = [
                {"model": r["model"], "wall_ms": r["wall_ms"], "worker_start": r.get("worker_start"),
                 "phases_ms": r.get("phases_ms") or {}} for r in records if "model" in r]

    def sweep(self):
        """Where the time goes: isorun -j 1 at other batch sizes (one run each)."""
        for size in (1024, 4096):
            log(f"eval batch-size sweep: isorun -j 1 --batch-size {size} ...")
            m = self.isorun_eval(1, batch_size=size)
            self.results["sweep"][str(size)] = m
            log(f"eval batch-size sweep: --batch-size {size}: {m['wall_s']:.2f} s")


def analyse(results):
    rounds = results["rounds"]
    names = [n for n in rounds[0].keys() if not n.startswith("floor ")]
    rows = []
    for name in names:
        runs = [r[name]["wall_s"] for r in rounds]
        row = {"way": name, "runs": runs, "median_s": median(runs),
               "ratio": median([r[name]["wall_s"] / r["python"]["wall_s"] for r in rounds]),
               "own_cpu_s": median([r[name].get("own_cpu_s") for r in rounds]),
               "others_cores": median([r[name].get("others_cores") for r in rounds])}
        if name.startswith("python"):
            row["python_peak_mib"] = median([r[name]["vmhwm_bytes"] for r in rounds]) / MIB
        else:
            row["supervisor_peak_mib"] = max(r[name]["supervisor_peak_mib"] or 0 for r in rounds)
            row["supervisor_vmhwm_mib"] = max(r[name]["supervisor_vmhwm_bytes"] or 0 for r in rounds) / MIB
            row["worker_peak_mib"] = median([m["peak_rss_bytes"] for r in rounds for m in r[name]["models"]]) / MIB
            row["worker_peak_max_mib"] = max(m["peak_rss_bytes"] for r in rounds for m in r[name]["models"]) / MIB
        examples = sum(m["examples"] for m in rounds[0][name]["models"])
        row["examples"] = examples
        row["end_to_end_eps"] = examples / row["median_s"]
        rows.append(row)
    per_model = {}
    for name in names:
        for i, model in enumerate(results["models"]):
            ms = [r[name]["models"][i] for r in rounds]
            per_model.setdefault(model, {})[name] = {
                "examples_per_second": median([m["examples_per_second"] for m in ms]),
                **{p: median([m["batch_latency_ms"][p] for m in ms]) for p in ("p50", "p90", "p99")},
                "accuracy": ms[0]["accuracy"], "log_loss": ms[0]["log_loss"],
                "wall_s": median([m["wall_s"] if "wall_s" in m else m["wall_ms"] / 1e3 for m in ms]),
                "load_s": median([m["load_s"] if "load_s" in m else (m["load_ms"] or 0) / 1e3 for m in ms]),
                "run_s": median([m["run_ms"] / 1e3 for m in ms]) if "run_ms" in ms[0] else None,
            }
    return rows, per_model


def agreement(per_model):
    """The largest differences between Python's and isorun's metrics, over models."""
    acc = max(abs(v["python"]["accuracy"] - v["isorun -j 1"]["accuracy"]) for v in per_model.values())
    ll = max(abs(v["python"]["log_loss"] - v["isorun -j 1"]["log_loss"]) / max(abs(v["python"]["log_loss"]), 1e-12)
             for v in per_model.values())
    return acc, ll


def phases_table(w, results):
    """Each unit's wall time split into its phases (`phases_ms` of `--report`)."""
    phases = results.get("phases")
    if not phases:
        return
    w("**Where an eval unit's time goes** (#25 §2): one more `isorun eval -j 1 --report` run per batch size; each "
      "unit's `phases_ms`, as a share of its `wall_ms`. *start*: spawn, the worker's hello (libtensorflow loaded "
      "when exec'd) and its sandbox; *load* and *model*: the worker's load and its signature runs (timed in the "
      "worker); *IPC*: the batches' round trips less the model's runs; *parsing*: the unit waiting for the next "
      "decoded batch (records are parsed on a thread beside it, so this is the parsing the worker could not hide); "
      "*metrics*: scoring each batch's outputs; *exit*: until the worker is reaped; *other*: the rest. Beside "
      "them, not a part of the unit's time: *decoded beside*, the parsing the prefetch thread did while the worker "
      "ran (`phases_ms.data_decode`; 0 where the unit replayed the batches an earlier unit of the run decoded: "
      "a dataset under 256 MiB decoded is read once per run).\n")
    w("| model | batch | worker | wall (ms) | start | load | model | IPC | parsing | metrics | exit | other "
      "| decoded beside |")
    w("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    shares = {}
    for size, records in phases.items():
        for r in records:
            p, wall = r["phases_ms"], r["wall_ms"] or 1
            start = sum(p.get(k) or 0 for k in ("spawn", "hello", "sandbox", "spare_wait"))
            cells = {"start": start, "load": p.get("load") or 0, "model": p.get("run") or 0, "IPC": p.get("ipc") or 0,
                     "parsing": p.get("data") or 0, "metrics": p.get("score") or 0, "exit": p.get("exit") or 0,
                     "other": p.get("other") or 0}
            if r["worker_start"] != "exec":
                for k, v in cells.items():
                    shares.setdefault(k, []).append(v / wall)
            w(f"| {r['model']} | {size} | {r['worker_start'] or '–'} | {wall:.0f} | "
              + " | ".join(f"{100 * v / wall:.0f}%" for v in cells.values())
              + f" | {(p.get('data_decode') or 0):.0f} ms |")
    if shares:
        w("\nForked units, median share of the unit: " + ", ".join(f"{k} {100 * median(v):.0f}%"
                                                                   for k, v in shares.items())
          + ". The run's first unit decodes the data on its prefetch thread (its *parsing* is what the worker "
            "could not hide); the later units replay its batches (#44 §2: decoded once per run).\n")


def floor_table(w, results):
    """Each model's isorun -j 1 unit (wall_ms: worker start to end) against the in-process floor."""
    rounds = results["rounds"]
    if f"floor {BATCH}" not in rounds[0]:
        return None
    w("**Per model against the in-process floor** (#25: within 1.5×). The floor: `isorun-worker --in-process "
      "--batch B --repeat R MODEL`, the model loaded and its signature run once per batch of the data on decoded "
      "zeros of B rows in one process (no worker process, IPC, reading or scoring); isorun: the unit's `wall_ms` "
      "in `isorun eval -j 1` (its worker's start, sandbox, load, every batch's round trip, reading and scoring, "
      "exit). A run's first unit is exec'd while the zygote starts (the default; waiting for the zygote instead "
      "made the whole run slower): its worker loads libtensorflow itself, so its floor is the floor process's "
      "whole wall time (libtensorflow loaded, the model loaded and run, exit); a forked unit's is the in-process "
      "figure. Medians over the rounds.\n")
    w("| model | batch | worker | floor (s) | isorun unit (s) | ratio |")
    w("|---|---:|---|---:|---:|---:|")
    ratios, forked_ratios, exec_ratios = [], [], []
    for size, way in ((BATCH, "isorun -j 1"), (BIG_BATCH, f"isorun -j 1 --batch-size {BIG_BATCH}")):
        if way not in rounds[0]:
            continue
        for i, model in enumerate(results["models"]):
            def fair(r):
                exec_d = r[way]["models"][i].get("worker_start") == "exec" and f"floor process {size}" in r
                return r[f"floor process {size}"][model] if exec_d else r[f"floor {size}"][model]
            starts = sorted({r[way]["models"][i].get("worker_start") or "?" for r in rounds})
            floor = median([fair(r) for r in rounds])
            unit = median([r[way]["models"][i]["wall_ms"] / 1e3 for r in rounds])
            per_round = median([r[way]["models"][i]["wall_ms"] / 1e3 / fair(r) for r in rounds])
            ratios.append(per_round)
            (exec_ratios if "exec" in starts else forked_ratios).append(per_round)
            w(f"| {model} | {size} | {', '.join(starts)} | {floor:.2f} | {unit:.2f} | {per_round:.2f}× |")
    worst = max(ratios)
    w(f"\n**Target: each model's unit within 1.5× of the floor: {'met' if worst <= 1.5 else '**missed**'}** "
      f"(median {median(ratios):.2f}×, worst {worst:.2f}×).\n")

    def verdict(what, rs):
        if not rs:
            return None
        span = f"{min(rs):.2f}–{max(rs):.2f}×" if len(rs) > 1 else f"{rs[0]:.2f}×"
        return f"{what}: {'met' if max(rs) <= 1.15 else 'missed'} ({span})"
    parts = [v for v in (verdict("Forked units within 1.15× of their floors", forked_ratios),
                         verdict("The run's first, exec'd unit within 1.15× of its floor", exec_ratios)) if v]
    w(f"**Target (#44 §2)**: {'. '.join(parts)}.\n")
    results["target_floor"] = {"target": "eval unit ≤ 1.5× the in-process floor", "met": worst <= 1.5,
                               "measured": worst}
    return ratios


def section(results, machine):
    rows, per_model = analyse(results)
    by = {r["way"]: r for r in rows}
    examples = results["limit"] or N_EXAMPLES
    out = []
    w = out.append
    w(f"{SECTION}\n")
    if results["quick"]:
        w(f"**A `--quick` smoke run: 1 round, {examples:,} examples; not figures to quote.**\n")
    w(f"`isorun eval` against the loop Python users write, over {len(results['models'])} Keras classifiers and one "
      f"TFRecord of {examples:,} `tf.Example`s (written by `scripts/bench_eval.py`; run with "
      f"`scripts/bench --eval-only`, which rewrites only this section).\n")
    w(f"- machine: {machine['cpu']}, {machine['cores']} cores, {fmt(machine.get('memory_gib'), '.1f')} GiB; "
      f"kernel {machine['kernel']}; {machine['date']}; isorun commit `{machine['commit']}`")
    others = [r[n].get("others_cores") for r in results["rounds"] for n in r]
    others = [x for x in others if x is not None]
    if others:
        w(f"- other processes used a median of {median(others):.2f} cores (at most {max(others):.2f}) during "
          f"the timed runs (`/proc/stat`, this bench excluded)"
          + (" — the machine was shared; read medians and side-by-side ratios" if median(others) > 0.25 else ""))
    line = bench_host.reads_line(results.get("read_mb"), "the models, the data")
    if line:
        w(line)
    w(f"- the evaluation part took {results['elapsed_s'] / 60:.1f} min\n")
    w(f"The zoo (`$ISORUN_BENCH_ZOO/eval`, made once): MLPs 32 → W → W → 10 (softmax) for W = "
      f"{', '.join(str(x) for x in WIDTHS)}, trained 2 epochs on 30,000 examples of the same distribution "
      "and exported with `model.export` (input `x` float32 [None, 32], output probabilities [None, 10]); "
      f"`data.tfrecord`: {N_EXAMPLES:,} examples, `x` float_list [32], `label` int64 in 0..9 (17.8 MB).\n")
    w("- **python**: one process: for each model `tf.saved_model.load`, "
      "`tf.data.TFRecordDataset(data).map(parse_single_example, num_parallel_calls=AUTOTUNE).batch(256)"
      ".prefetch(AUTOTUNE)`, `serving_default` per batch, `.numpy()`, accuracy and log loss summed in numpy "
      "(clipped like scikit-learn), then `del`, `tf.keras.backend.clear_session()`, `gc.collect()`. Peak: the "
      "process's VmHWM at its end.")
    w(f"- **{VECTORISED}**: the careful loop: the same, but `TFRecordDataset(data).batch({BIG_BATCH})"
      ".map(lambda b: tf.io.parse_example(b, spec), num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)`: "
      f"whole batches parsed at once; beside it isorun with `--batch-size {BIG_BATCH}`.")
    w("- **isorun -j N**: `isorun eval MODELS --data data.tfrecord --label label --metric accuracy --metric "
      "log_loss -j N --json --summary` (batch size 256, the default spawn mode: the first worker exec'd while the zygote starts, the rest forked; at -j 1 each into a spare warmed up beside the unit before it, at -j 2 (the slots fill the 2 CPUs, so no spares by default) fresh). Supervisor peak: `--summary`'s "
      "\"supervisor peak memory\" (its VmHWM also sampled from `/proc` every 20 ms); worker peak: each record's "
      "`peak_rss_bytes` (`ru_maxrss`).")
    w(f"\nThe ways alternate (python, -j 1, -j 2, python, …), {results['rounds_n']} round(s); a figure is the "
      "median of the rounds, a ratio the median of per-round ratios. Wall time is the whole command (imports, "
      "library loading, every model's load included).\n")
    w("| way | runs (s) | median (s) | ratio to python | examples/s end to end | CPU it used (s) | "
      "Python peak (MiB) | supervisor peak (MiB) | worker peak RSS, median / max (MiB) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        w(f"| {r['way']} | {', '.join(f'{x:.2f}' for x in r['runs'])} | {r['median_s']:.2f} | {r['ratio']:.2f}× | "
          f"{r['end_to_end_eps']:,.0f} | {fmt(r['own_cpu_s'], '.1f')} | {fmt(r.get('python_peak_mib'), '.0f')} | "
          + (f"{r['supervisor_peak_mib']} (VmHWM {r['supervisor_vmhwm_mib']:.1f}) | "
             f"{r['worker_peak_mib']:.0f} / {r['worker_peak_max_mib']:.0f} |" if "supervisor_peak_mib" in r else "– | – |"))
    w(f"\n(Examples end to end: {len(results['models'])} models × {examples:,} examples over the command's wall time.)\n")

    acc, ll = agreement(per_model)
    w(f"**Same numbers.** Python's and isorun's metrics per model (largest difference over the models: accuracy "
      f"{acc:.2g}, log loss {ll:.2g} relative):\n")
    w("| model | accuracy python | accuracy isorun | log loss python | log loss isorun |")
    w("|---|---:|---:|---:|---:|")
    for model, v in per_model.items():
        w(f"| {model} | {v['python']['accuracy']:.6f} | {v['isorun -j 1']['accuracy']:.6f} | "
          f"{v['python']['log_loss']:.6f} | {v['isorun -j 1']['log_loss']:.6f} |")
    w("")
    w("**Per model** (medians over the rounds). examples/s is over the batches' time (request sent to outputs "
      "back; isorun's `examples_per_second`, Python's the signature call plus `.numpy()`), load and reading "
      "excluded; per-batch latency p50/p90/p99 in ms after the first (warm-up) batch; model wall: isorun's unit "
      "`wall_ms` (worker start to end), Python's load + the whole dataset loop.\n")
    w("| model | way | examples/s | p50 (ms) | p90 (ms) | p99 (ms) | model wall (s) | load (s) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|")
    for model, v in per_model.items():
        for name, m in v.items():
            w(f"| {model} | {name} | {m['examples_per_second']:,.0f} | {m['p50']:.2f} | {m['p90']:.2f} | "
              f"{m['p99']:.2f} | {m['wall_s']:.2f} | {m['load_s']:.2f} |")
    w("")
    sweep = results.get("sweep") or {}
    if sweep:
        base = by["isorun -j 1"]["median_s"]
        w("**Batch size** (isorun -j 1, one run each beside the 256 median):\n")
        w("| --batch-size | wall (s) | examples/s, median over models | p50 per batch (ms), median |")
        w("|---:|---:|---:|---:|")
        j1 = [m for r in results["rounds"] for m in r["isorun -j 1"]["models"]]
        w(f"| 256 | {base:.2f} | {median([m['examples_per_second'] for m in j1]):,.0f} | "
          f"{median([m['batch_latency_ms']['p50'] for m in j1]):.2f} |")
        for size, m in sweep.items():
            w(f"| {size} | {m['wall_s']:.2f} | {median([x['examples_per_second'] for x in m['models']]):,.0f} | "
              f"{median([x['batch_latency_ms']['p50'] for x in m['models']]):.2f} |")
        w("")
    floor_rows = floor_table(w, results)
    phases_table(w, results)
    bounds(w, results, by)
    ratio = by["isorun -j 1"]["ratio"]
    met = ratio <= 0.5
    w(f"**Target: isorun `-j 1` at most 0.5× Python's time: {'met' if met else '**missed**'}** "
      f"({ratio:.2f}×; `-j 2` {by['isorun -j 2']['ratio']:.2f}×).\n")
    results["target"] = {"target": "isorun eval -j 1 ≤ 0.5× Python's time", "met": met, "measured": ratio}
    if VECTORISED in by:
        rounds = results["rounds"]
        for jobs in (1, 2):
            name = f"isorun -j {jobs} --batch-size {BIG_BATCH}"
            vs = median([r[name]["wall_s"] / r[VECTORISED]["wall_s"] for r in rounds])
            if jobs == 1:
                met_v = vs <= 0.10
                floors = [sum(r[f"floor {BIG_BATCH}"].values()) / r[VECTORISED]["wall_s"] for r in rounds
                          if f"floor {BIG_BATCH}" in r]
                results["target_vectorised"] = {"target": "isorun eval -j 1 ≤ 0.10× the vectorised loop",
                                                "met": met_v, "measured": vs}
                w(f"**Target (#25): isorun `-j 1` at batch {BIG_BATCH} at most 0.10× the vectorised Python loop's "
                  f"time: {'met' if met_v else '**missed**'}** ({vs:.2f}×)."
                  + (f" Its bound: the in-process floors of the {len(results['models'])} models alone (load and "
                     f"run on decoded batches, no process, IPC, reading or scoring) add up to "
                     f"{median(floors):.2f}× the vectorised loop's time." if floors else ""))
                w(f"\n**Target (#44 §2): isorun `-j 1` at batch {BIG_BATCH} at most 0.14× the vectorised loop's "
                  f"time: {'met' if vs <= 0.14 else '**missed**'}** ({vs:.2f}×"
                  + (f"; isorun is {vs / median(floors):.2f}× the sum of its models' floors, which alone are "
                     f"{median(floors):.2f}× the loop on this machine" if floors else "") + ").")
            else:
                w(f"`-j 2` at batch {BIG_BATCH}: {vs:.2f}× the vectorised loop.\n")
    notes = results.get("notes")
    if notes:
        w(notes.rstrip() + "\n")
    return "\n".join(out)


def bounds(w, results, by):
    """Where each way's time goes, from the measurements."""
    rounds = results["rounds"]
    n = len(results["models"])
    py_wall = median([r["python"]["wall_s"] for r in rounds])
    py_loop = median([r["python"]["loop_s"] for r in rounds])
    py_models = [m for r in rounds for m in r["python"]["models"]]
    py_batch = median([m["examples"] / m["examples_per_second"] for m in py_models])
    py_model = median([m["wall_s"] for m in py_models])
    py_load = median([m["load_s"] for m in py_models])
    j1 = [m for r in rounds for m in r["isorun -j 1"]["models"]]
    iso_wall = by["isorun -j 1"]["median_s"]
    unit = median([m["wall_ms"] / 1e3 for m in j1])
    load = median([(m["load_ms"] or 0) / 1e3 for m in j1])
    batch = median([m["examples"] / m["examples_per_second"] for m in j1])
    run = median([(m["run_ms"] or 0) / 1e3 for m in j1])
    units = median([sum(m["wall_ms"] for m in r["isorun -j 1"]["models"]) / 1e3 for r in rounds])
    w("**What bounds it.** "
      f"*Python* ({py_wall:.1f} s): {py_wall - py_loop:.1f} s pass before the first model (the interpreter "
      f"and `import tensorflow`), {py_loop:.1f} s in the loop over {n} models: per model (median) {py_model:.2f} s, "
      f"of which {py_load:.2f} s `tf.saved_model.load` and {py_batch:.2f} s in the signature calls and "
      f"`.numpy()`; the rest, {py_model - py_load - py_batch:.2f} s, is waiting on `tf.data` (parsing "
      "`tf.Example`s one by one, batching) and the numpy scoring, in Python between batches. "
      f"*isorun -j 1* ({iso_wall:.1f} s): the {n} units take {units:.1f} s together, the rest is the "
      f"supervisor's start, the zygote's (loading libtensorflow) and reading the first example to check the "
      f"data. A unit (median) {unit:.2f} s: {load:.2f} s loading the model in the worker, {batch:.2f} s in "
      f"batches (request sent to outputs back), of which the worker's own run time is {run:.2f} s (timed in "
      f"microseconds per batch) and the rest sending the batch, the outputs' way back and their checks; the remaining {max(0.0, unit - load - batch):.2f} s is the worker's "
      "start and waiting on the supervisor's reader (a prefetch thread parsing the next batch while the worker "
      "runs this one) and scoring. Both ways run the same TensorFlow kernels on the same batches (the metrics "
      "agree); isorun is faster because it never imports TensorFlow's Python package (a C API worker forked "
      "from a zygote that has loaded libtensorflow), parses records in Rust on a thread beside the worker "
      "rather than one `tf.Example` at a time through `tf.data`, and scores in the supervisor with no Python "
      "between batches. "
      + (f"-j 2 ({by['isorun -j 2']['median_s']:.1f} s) gains little: the machine has "
         f"{results['machine']['cores']} cores, shared with other work, and much of the run is fixed costs "
         "(the supervisor's and zygotes' start, loading each model).\n" if by["isorun -j 2"]["median_s"] > 0.75 * iso_wall else "\n"))


def bench(args):
    if args.only_write:
        with open(args.results) as f:
            results = json.load(f)
    else:
        started = time.perf_counter()
        b = EvalBench(args)
        b.warm_up()
        b.rounds()
        if not args.quick:
            b.sweep()
        b.phases()
        results = b.results
        results["machine"] = machine(b.repo)
        results["elapsed_s"] = time.perf_counter() - started
    if args.notes and os.path.exists(args.notes):
        results["notes"] = open(args.notes).read()
    text = section(results, results["machine"])
    publish(args, results, text, SECTION, "evaluation", "--eval-only")
    log(f"wrote the evaluation section of {args.output} (raw measurements: {args.results}); "
        f"target {'met' if results['target']['met'] else 'missed'}: -j 1 at {results['target']['measured']:.2f}× Python")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("zoo")
    p.add_argument("dir")
    p = sub.add_parser("python")
    p.add_argument("data")
    p.add_argument("models", nargs="+")
    p.add_argument("--limit", type=int)
    p.add_argument("--batch-size", type=int, default=BATCH)
    p.add_argument("--vectorised", action="store_true",
                   help="batch the records first, then parse each batch at once (tf.io.parse_example)")
    p = sub.add_parser("bench")
    p.add_argument("--repo", required=True)
    p.add_argument("--zoo", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help=f"1 round, the first {QUICK_LIMIT:,} examples, no sweep")
    p.add_argument("--output", required=True, help="the Markdown whose Evaluation section is (re)written")
    p.add_argument("--standalone", action="store_true", help="write only the Evaluation section to --output")
    p.add_argument("--results", required=True, help="raw measurements, JSON")
    p.add_argument("--notes", help="a Markdown file appended to the section (analysis written by hand)")
    p.add_argument("--only-write", action="store_true", help="rewrite the section from --results, measure nothing")
    args = parser.parse_args()
    return {"zoo": zoo, "python": python_eval, "bench": bench}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
