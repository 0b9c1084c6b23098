"""ONNX models: isorun against its in-process floor and Python's onnxruntime
loop, and what each keeps in memory (issue 41 §3).

Run by scripts/bench (`--onnx-only`, and in a full run), or alone, with a
Python that has onnxruntime, onnx and numpy:

  python scripts/bench_onnx.py --isorun target/release/isorun \\
      --worker target/release/isorun-worker [--rounds 3] [--quick] [--markdown BENCHMARKS.md]

Everything is made at bench time in a temporary folder (deleted after):

- speed: 40 small MLPs (32 -> 256 -> 256 -> 10 float32, each with its own
  weights; a symbolic batch dimension) made with `onnx.helper`, run at
  batch 32 three ways, alternating within each round, each timed as its
  whole command: `isorun run DIR --inputs x.npz -j 1 --report` (the report
  turns on each unit's `phases_ms`), the in-process floor `isorun-worker
  --in-process --batch 32 --onnxruntime LIB` (one process, the worker's own
  ONNX Runtime calls, one session created and released per model), and a
  Python loop (`import onnxruntime`, then `InferenceSession`, `run` on zero
  inputs, `del`, `gc.collect()` per model);
- memory: one ~300 MB model (a MatMul by one [8192, 9216] float32
  initializer) created, run once and released 20 times in one Python
  process (VmRSS after each, from /proc/self/status), against `isorun run`
  of 20 hard links of the file at -j 1: the supervisor's peak (its VmHWM,
  polled from /proc while it runs), each worker's `peak_rss_bytes` from its
  record, and whether any process isorun started is alive after it exits.

All three ways use one library: the `onnxruntime` package of this Python
(`onnxruntime/capi/libonnxruntime.so.1.*`), given to isorun as
ISORUN_ONNXRUNTIME_DIR and to the floor as --onnxruntime.

Rewrites the "ONNX models" section of --markdown (or prints it).
"""

import argparse
import gc
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import logger, machine, vm  # noqa: E402
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SECTION = "## ONNX models"
WAYS = ("isorun", "floor", "python")
WAY_NAMES = {
    "isorun": "`isorun run DIR --inputs x.npz -j 1`",
    "floor": "floor: `isorun-worker --in-process --batch 32 --onnxruntime LIB` (one process)",
    "python": "Python loop: `onnxruntime.InferenceSession`, `run`, `del`, `gc.collect()` per model",
}
BATCH = 32
BIG_ROWS, BIG_COLS = 8192, 9216  # 302 MB of float32

PYTHON_LOOP = r"""
import gc, sys, time
started = time.time()
import numpy as np
import onnxruntime as ort
imported = time.time() - started
paths = sys.argv[2:]
batch = int(sys.argv[1])
for path in paths:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([d if isinstance(d, int) else batch for d in i.shape], np.float32)
             for i in session.get_inputs()}
    session.run(None, feeds)
    del session
    gc.collect()
print(f"import {imported:.3f}")
"""

PYTHON_MEMORY = r"""
import gc, json, sys
import numpy as np
import onnxruntime as ort

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

path, times = sys.argv[1], int(sys.argv[2])
out = {"before": rss(), "after": []}
for _ in range(times):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in session.get_inputs()}
    session.run(None, feeds)
    del session, feeds
    gc.collect()
    out["after"].append(rss())
print(json.dumps(out))
"""


log = logger("bench_onnx")


def library():
    """This Python's onnxruntime library (the one its InferenceSession uses)."""
    import onnxruntime

    capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    found = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so.1.*")))
    if not found:
        raise SystemExit(f"bench_onnx: no libonnxruntime.so.1.* in {capi}")
    return found[-1], onnxruntime.__version__


def make_mlps(folder, count):
    """`count` MLPs 32 -> 256 -> 256 -> 10 (float32, symbolic batch), each
    with its own weights; and x.npz of BATCH rows for isorun."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    sizes = [32, 256, 256, 10]
    paths = []
    for k in range(count):
        inits, nodes, last = [], [], "x"
        for layer, (a, b) in enumerate(zip(sizes, sizes[1:])):
            w, bias = f"w{layer}", f"b{layer}"
            inits += [numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), w),
                      numpy_helper.from_array(rng.standard_normal(b).astype(np.float32) * 0.1, bias)]
            out = "y" if layer == len(sizes) - 2 else f"h{layer}"
            nodes += [helper.make_node("MatMul", [last, w], [f"m{layer}"]),
                      helper.make_node("Add", [f"m{layer}", bias], [out if out == "y" else f"a{layer}"])]
            if out != "y":
                nodes.append(helper.make_node("Relu", [f"a{layer}"], [out]))
            last = out
        graph = helper.make_graph(nodes, f"mlp{k:02d}",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench_onnx")
        model.ir_version = 8
        onnx.checker.check_model(model)
        path = os.path.join(folder, f"mlp{k:02d}.onnx")
        onnx.save(model, path)
        paths.append(path)
    np.savez(os.path.join(os.path.dirname(folder), "x.npz"), x=np.zeros((BATCH, 32), np.float32))
    return paths


def make_big(folder):
    """One model of ~300 MB: y = x @ W, W one [BIG_ROWS, BIG_COLS] float32 initializer."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(1).standard_normal((BIG_ROWS, BIG_COLS), dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, BIG_ROWS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, BIG_COLS])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench_onnx")
    model.ir_version = 8
    path = os.path.join(folder, "big.onnx")
    onnx.save(model, path)
    del model, graph, w
    gc.collect()
    np.savez(os.path.join(folder, "x-big.npz"), x=np.zeros((1, BIG_ROWS), np.float32))
    return path


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_seconds():
    """User + system CPU of every waited-for child so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, env=None, what=""):
    load, cpu0, t0 = loadavg(), cpu_seconds(), time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    if p.returncode != 0:
        raise SystemExit(f"bench_onnx: {what or cmd[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "load_before": load}, p.stdout


class Watch(threading.Thread):
    """Polls a process: its VmHWM, and every process under it (their pids)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done, self.pids = pid, 0, False, set()

    def run(self):
        while not self.done:
            hwm = vm(self.pid, "VmHWM")
            if hwm:
                self.peak = max(self.peak, hwm)
            family = {self.pid}
            parents = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/stat") as f:
                            stat = f.read()
                    except OSError:
                        continue
                    parents[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
            grew = True
            while grew:
                grew = False
                for pid, ppid in parents.items():
                    if ppid in family and pid not in family:
                        family.add(pid)
                        grew = True
            self.pids |= family - {self.pid}
            time.sleep(0.02)


def speed(args, lib, env, work):
    folder = os.path.join(work, "mlps")
    os.makedirs(folder)
    paths = make_mlps(folder, args.models)
    inputs = os.path.join(work, "x.npz")
    runs = {w: [] for w in WAYS}
    phases = []
    for r in range(args.rounds):
        order = WAYS if r % 2 == 0 else tuple(reversed(WAYS))
        for w in order:
            log(f"round {r + 1}/{args.rounds}: {w} ...")
            if w == "isorun":
                report = os.path.join(work, "report.json")
                res, out = timed([args.isorun, "run", folder, "--inputs", inputs, "-j", "1", "--json",
                                  "--report", report], env, "isorun run")
                records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
                bad = [x for x in records if x.get("status") != "ok"]
                if len(records) != len(paths) or bad:
                    raise SystemExit(f"bench_onnx: isorun ran {len(records)} of {len(paths)} models ok: {bad[:1]}")
                phases.append([{"model": x["model"], "wall_ms": x["wall_ms"], "worker_start": x.get("worker_start"),
                                "cpu_ms": (x.get("user_ms") or 0) + (x.get("sys_ms") or 0),
                                "phases_ms": x.get("phases_ms") or {}} for x in records])
            elif w == "floor":
                res, out = timed([args.worker, "--in-process", "--batch", str(BATCH), "--onnxruntime", lib, *paths],
                                 env, "isorun-worker --in-process")
                units = [float(line.split("\t")[2].split()[1]) for line in out.splitlines()
                         if line.startswith("/") and "\ttotal " in line]
                res["first_ms"], res["rest_median_ms"] = units[0], statistics.median(units[1:])
                opened = [line for line in out.splitlines() if "\topen " in line]
                res["open_ms"] = float(opened[0].split("\t")[1].split()[1]) if opened else None
            else:
                res, out = timed([sys.executable, "-c", PYTHON_LOOP, str(BATCH), *paths], env, "the Python loop")
                res["import_s"] = float(out.split()[-1])
            log(f"  {res['wall_s']:.2f} s")
            runs[w].append(res)
    runs["cpu_split"] = cpu_split(args, env, folder, inputs, len(paths))
    return runs, phases


def proc_stat(pid):
    """(ppid, own CPU s, reaped children's CPU s, comm) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick,
            text[text.find("(") + 1:text.rfind(")")])


def cpu_split(args, env, folder, inputs, count):
    """Where isorun's CPU goes, from one more (untimed) run polled from
    /proc: the supervisor's own, the zygote's own and its forked workers'
    (reaped by the zygote), and the rest (exec'd workers)."""
    log("where the CPU goes: one more isorun run, polled (not timed) ...")
    proc = subprocess.Popen([args.isorun, "run", folder, "--inputs", inputs, "-j", "1", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    supervisor = zygote = None
    while proc.poll() is None:
        supervisor = proc_stat(proc.pid) or supervisor
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = proc_stat(int(entry))
                # The zygote: the isorun-worker child of isorun whose children are reaped by it.
                if st and st[0] == proc.pid and st[3] == "isorun-worker" and (zygote is None or st[2] >= zygote[2]):
                    zygote = st
        time.sleep(0.01)
    if not supervisor or not zygote:
        return None
    return {"models": count, "supervisor_s": supervisor[1], "children_s": supervisor[2], "zygote_s": zygote[1],
            "forked_s": zygote[2]}


def memory(args, lib, env, work):
    log("memory: making the ~300 MB model ...")
    path = make_big(work)
    size = os.path.getsize(path)
    log(f"memory: Python, {args.times} sessions in one process ...")
    p = subprocess.run([sys.executable, "-c", PYTHON_MEMORY, path, str(args.times)], capture_output=True, text=True,
                       env=env)
    if p.returncode != 0:
        raise SystemExit(f"bench_onnx: the Python memory loop failed:\n{p.stderr[-3000:]}")
    python = json.loads(p.stdout.strip().splitlines()[-1])
    folder = os.path.join(work, "big")
    os.makedirs(folder)
    for k in range(args.times):
        os.link(path, os.path.join(folder, f"big{k:02d}.onnx"))
    log(f"memory: isorun run of {args.times} links at -j 1 ...")
    t0 = time.perf_counter()
    proc = subprocess.Popen([args.isorun, "run", folder, "--inputs", os.path.join(work, "x-big.npz"), "-j", "1",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watch = Watch(proc.pid)
    watch.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    watch.done = True
    watch.join()
    if proc.returncode != 0:
        failed = [line for line in out.splitlines() if '"status":"ok"' not in line]
        raise SystemExit(f"bench_onnx: isorun run (memory) failed ({proc.returncode}):\n{err[-3000:]}"
                         f"\n{chr(10).join(failed)[-3000:]}")
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    time.sleep(1)
    alive = [pid for pid in watch.pids if os.path.exists(f"/proc/{pid}")]
    return {
        "model_bytes": size,
        "python": python,
        "isorun": {"wall_s": wall, "supervisor_hwm": watch.peak, "processes_seen": len(watch.pids),
                   "alive_after": len(alive), "ok": sum(x.get("status") == "ok" for x in records),
                   "units": len(records), "worker_peaks": [x.get("peak_rss_bytes") for x in records],
                   "worker_starts": sorted({x.get("worker_start") or "?" for x in records})},
    }


def bench(args):
    started = time.time()
    lib, version = library()
    # Telemetry off in every way, as isorun's workers have it: ONNX Runtime
    # 1.32 otherwise opens a database and starts a thread per environment.
    env = dict(os.environ, ISORUN_ONNXRUNTIME_DIR=os.path.dirname(lib), ORT_LOGGING_LEVEL="3",
               ORT_DISABLE_TELEMETRY="1")
    results = {"machine": machine(os.path.dirname(HERE)), "library": lib, "onnxruntime": version,
               "models": args.models, "rounds": args.rounds, "times": args.times}
    log(f"library {lib} (onnxruntime {version}); {args.models} MLPs, {args.rounds} round(s)")
    with tempfile.TemporaryDirectory(prefix="isorun-bench-onnx-") as work:
        results["runs"], results["phases"] = speed(args, lib, env, work)
        if not args.no_memory:
            results["memory"] = memory(args, lib, env, work)
    results["minutes"] = (time.time() - started) / 60
    if args.results:
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "w") as f:
            json.dump(results, f, indent=1)
    return publish(args, results)


def publish(args, results):
    text = markdown(results)
    if args.markdown:
        sys.path.insert(0, HERE)
        from benchlib import splice

        splice(args.markdown, SECTION, text, after="## `isorun.map`: your own Python loop")
    print(text)
    return 0


def render(args):
    with open(args.results) as f:
        return publish(args, json.load(f))


# What earlier runs of this bench measured, on the same loaded machine,
# before the changes that moved the figures (kept here: a run rewrites the section).
HISTORY = (
    "**Earlier runs of this bench** (on the AMD EPYC machine of that day, loaded by other work; the commits "
    "named are of a history later folded into `bccc098`): at `32c3e84` (09:49 UTC, load 1.7): "
    "isorun 0.92 s, **3.80×** the floor (0.24 s), **3.85×** the Python "
    "loop. Before spares preloaded ONNX models "
    "(`84362fe`; since then a unit's spare opens ONNX Runtime and makes its environment and session after "
    "its own fork, while the unit before it runs, so `load` on the unit's path is 0 and `spare_wait` is what is "
    "left of it): isorun 4.33 s, **8.76×** the floor, `load` 60 ms per unit. Before workers started with "
    "`ORT_DISABLE_TELEMETRY=1` (`cdf9df4`, 07:38 UTC; every way then had ONNX Runtime's telemetry on, a "
    "SQLite database and a thread per environment): isorun 1.97 s, **5.48×** the floor (0.37 s), wall 26.0 ms "
    "per unit with `spare_wait` 16.0 ms and `exit` 11.4 ms. Before sessions stopped spinning between runs "
    "(`c5ca583`, 09:34 UTC; ONNX Runtime's pool threads spun after the run on the CPU the supervisor and the "
    "next spare needed): isorun 1.05 s, **4.12×** the floor (0.26 s), wall 17.0 ms per unit with `ipc` 3.9 ms, "
    "each worker's CPU 30 ms."
)


def markdown(results):
    med = statistics.median
    runs, m = dict(results["runs"]), results["machine"]
    split = runs.pop("cpu_split", None)
    n = results["models"]
    loads = [r["load_before"] for v in runs.values() for r in v]
    ratio = lambda a, b: med([x["wall_s"] / y["wall_s"] for x, y in zip(runs[a], runs[b])])  # noqa: E731
    lines = [
        SECTION, "",
        f"`scripts/bench_onnx.py` (run by `scripts/bench --onnx-only`; machine: {m['cores']} cores ({m['cpu']}), "
        f"kernel {m['kernel']}, Python {m['python']}, onnxruntime {results['onnxruntime']}, {m['date']}, commit "
        f"`{m['commit']}`; {results['rounds']} alternating round(s), {results['minutes']:.1f} min). All ways open "
        f"one library: `{os.path.basename(results['library'])}` of the Python `onnxruntime` package, with "
        "`ORT_DISABLE_TELEMETRY=1` (isorun's workers' default; ONNX Runtime's telemetry otherwise opens a "
        "database and starts a thread in every process). "
        f"**Machine load**: load average median "
        f"{med(loads):.1f} (from {min(loads):.1f} to {max(loads):.1f}) on {m['cores']} cores at the start of each "
        "timed way" + (" (other work ran beside the bench), so the walls are noisy; the ratios, of ways run side by "
                       "side in one round, are what to read." if med(loads) >= 1.0 else
                       " (a quiet machine: the bench's own processes)."),
        "",
        f"### {n} small MLPs at `-j 1`", "",
        f"{n} models of 32 -> 256 -> 256 -> 10 float32 (each its own weights, a symbolic batch), made with "
        f"`onnx.helper` at bench time, each run once on zeros of batch {BATCH}; each way timed as its whole "
        "command (process start, imports and the library's opening included).", "",
        "| way | wall (s), median | each round (s) | CPU (s), median | × the floor (median of per-round ratios) |",
        "|---|---:|---|---:|---:|",
    ]
    for w in WAYS:
        walls = [r["wall_s"] for r in runs[w]]
        cpus = [r["cpu_s"] for r in runs[w]]
        lines.append(f"| {WAY_NAMES[w]} | {med(walls):.2f} | {', '.join(f'{x:.2f}' for x in walls)} | "
                     f"{med(cpus):.2f} | {ratio(w, 'floor'):.2f}× |")
    r_floor, r_python = ratio("isorun", "floor"), ratio("isorun", "python")
    floor = runs["floor"]
    py_import = med([r["import_s"] for r in runs["python"]])
    lines += ["", f"**Target (issue 41 §3)**: {n} ONNX MLPs at `-j 1` within 1.3× of the in-process floor: "
              f"{r_floor:.2f}× ({'met' if r_floor <= 1.3 else 'missed'}).", "",
              f"isorun ÷ the Python loop (no target; side by side): **{r_python:.2f}×**.", "", HISTORY, ""]
    # Where isorun's time per unit goes.
    units = [u for rnd in results["phases"] for u in rnd]
    keys = []
    for u in units:
        for k, v in u["phases_ms"].items():
            if isinstance(v, (int, float)) and k not in keys:
                keys.append(k)
    walls = [u["wall_ms"] for u in units]

    def phase(key):
        have = [u["phases_ms"][key] for u in units if isinstance(u["phases_ms"].get(key), (int, float))]
        return f"{key} {med(have):.1f}" + ("" if len(have) == len(units) else f" ({len(have)})")

    starts = sorted({u.get("worker_start") or "?" for u in units})
    lines += [f"Where an isorun unit's time goes (`phases_ms` of its records, `--report`; medians over "
              f"{len(units)} units of all rounds, worker start: {', '.join(starts)}; each phase over the units "
              f"that have it, their number in brackets where not all): wall {med(walls):.1f} ms per unit; "
              + ", ".join(phase(k) for k in keys)
              + f" ms; each worker's CPU (the record's user + system) {med([u.get('cpu_ms') or 0 for u in units]):.0f} ms. "
              + (f"The floor opened the library alone (`dlopen`, what a zygote could do before it forks) in "
                 f"{med([r['open_ms'] for r in floor if r.get('open_ms') is not None]):.1f} ms; "
                 + "its first model" if any(r.get("open_ms") is not None for r in floor) else "The floor's first model")
              + " (environment made) took "
              f"{med([r['first_ms'] for r in floor]):.1f} ms and each later one {med([r['rest_median_ms'] for r in floor]):.2f} ms "
              f"(medians); the Python loop's `import onnxruntime, numpy` {py_import:.2f} s.", ""]
    lines += [bound_text(results, r_floor, units), ""]
    if split:
        c = split["models"]
        lines += [f"Where isorun's CPU goes (one more run of the {c} models, untimed, its processes' CPU read from "
                  f"/proc just before it exits): the supervisor's own {split['supervisor_s']:.2f} s, the zygote's own "
                  f"{split['zygote_s']:.2f} s ({split['zygote_s'] / c * 1e3:.0f} ms per model: a fork of a process "
                  f"with libtensorflow mapped, and the next spare's preparation), the workers it forked "
                  f"{split['forked_s']:.2f} s ({split['forked_s'] / c * 1e3:.0f} ms per model over their whole lives, "
                  "the records' user + system being the part up to the answer), the rest (the first, exec'd worker) "
                  f"{max(split['children_s'] - split['zygote_s'] - split['forked_s'], 0):.2f} s.", ""]
    mem = results.get("memory")
    if mem:
        py, iso = mem["python"], mem["isorun"]
        after = py["after"]
        mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
        peaks = [p for p in iso["worker_peaks"] if p]
        lines += [
            f"### A {mem['model_bytes'] / 1e6:.0f} MB model created and released {len(after)} times", "",
            f"One MatMul by a [{BIG_ROWS}, {BIG_COLS}] float32 initializer, made at bench time and deleted after. "
            f"**Python** (one process: `InferenceSession`, `run` once, `del`, `gc.collect()`, VmRSS after each): "
            f"{mib(py['before'])} after the imports, {mib(after[0])} after the first release, {mib(after[-1])} "
            f"after the {len(after)}th (most {mib(max(after))}): it grew **{mib(after[-1] - py['before'])}** over "
            f"the imports and {mib(after[-1] - after[0])} from the first release to the last; per release: "
            + ", ".join(f"{a / 2**20:.0f}" for a in after) + " MiB. "
            f"**isorun** (`isorun run` of {iso['units']} hard links of the file, `-j 1`, {iso['ok']} ok, worker "
            f"start {', '.join(iso['worker_starts'])}): the supervisor's peak RSS (VmHWM) **{mib(iso['supervisor_hwm'])}**; "
            f"each worker's peak {mib(min(peaks)) if peaks else '?'} to {mib(max(peaks)) if peaks else '?'} "
            f"(records' `peak_rss_bytes`), and of the {iso['processes_seen']} processes seen under isorun while it "
            f"ran (workers, the zygote) **{iso['alive_after']}** were alive a second after it exited: every "
            "byte a model took went back with its process.", "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def bound_text(results, r_floor, units):
    med = statistics.median
    n = results["models"]
    floor, iso = results["runs"]["floor"], results["runs"]["isorun"]
    gap = med([a["wall_s"] - b["wall_s"] for a, b in zip(iso, floor)])
    cpu_gap = med([a["cpu_s"] - b["cpu_s"] for a, b in zip(iso, floor)])
    load = med([u["phases_ms"].get("load") or 0 for u in units])
    rest = med([r["rest_median_ms"] for r in floor])
    exit_ms = med([u["phases_ms"].get("exit") or 0 for u in units])
    worker_cpu = med([u.get("cpu_ms") or 0 for u in units])
    return (f"**What bounds it**: isorun's wall minus the floor's is {gap:.2f} s over {n} models "
            f"({gap / n * 1e3:.0f} ms per model), its CPU minus the floor's {cpu_gap:.2f} s "
            f"({cpu_gap / n * 1e3:.0f} ms per model). The floor opens ONNX Runtime's library and makes its "
            f"environment once, then creates a session in {rest:.2f} ms; each isorun unit is a fresh worker whose "
            f"`load` ({load:.1f} ms median) makes ONNX Runtime's environment again (its fork rule: no environment "
            f"before the fork, so no zygote can hold one) before its session, then exits (`exit`, {exit_ms:.1f} ms: "
            "the worker's threads and mappings, libtensorflow's from the zygote included, torn down and reaped). "
            f"Of the {cpu_gap / n * 1e3:.0f} ms of CPU per model, the worker's own record counts {worker_cpu:.0f} ms; "
            "the rest (the worker's life before and after its answer, the zygote's forks) is split below. Opening "
            "the library is a few ms of that, so a zygote that "
            "opened it before forking would save little; the environment and the process per model are the cost "
            "of isolation here, and on 2 cores every CPU millisecond of it that the next spare's preparation "
            "cannot hide shows in the wall. "
            + ("The target is missed by that per-unit cost, not by the models (each runs in "
               f"{med([u['phases_ms'].get('run') or 0 for u in units]):.1f} ms)."
               if r_floor > 1.3 else "The floor's one-time costs are of the same order, so the target holds."))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")
    b = sub.add_parser("bench", help="measure and write the section")
    b.add_argument("--isorun", default="target/release/isorun")
    b.add_argument("--worker", default="target/release/isorun-worker")
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--models", type=int, default=40)
    b.add_argument("--times", type=int, default=20, help="sessions of the ~300 MB model")
    b.add_argument("--quick", action="store_true", help="1 round, 10 models, 5 sessions of the big model")
    b.add_argument("--no-memory", action="store_true", help="skip the ~300 MB model")
    b.add_argument("--results", default="target/bench/results-onnx.json")
    b.add_argument("--markdown")
    r = sub.add_parser("render", help="the section again from a results file")
    r.add_argument("--results", default="target/bench/results-onnx.json")
    r.add_argument("--markdown")
    args = p.parse_args()
    if args.command == "render":
        return render(args)
    if args.command != "bench":
        p.print_help()
        return 2
    if args.quick:
        args.rounds, args.models, args.times = 1, 10, 5
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
