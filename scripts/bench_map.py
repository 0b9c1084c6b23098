"""`isorun.map` against the Python ways of running your own loop (issue #40 §4).

Run by scripts/bench (`--map-only`, and in a full run), or alone:

  python scripts/bench_map.py bench --isorun target/release/isorun --zoo DIR \\
      --keras-work target/bench/keras [--rounds 3] [--quick] [--markdown BENCHMARKS.md]

Two loop bodies, each written once below as a function of one item (a path)
and run four ways over the same items, alternating within each round
(loop, map -j 1, map -j 2, pool; the table gives medians):

- saved: the zoo's 40 SavedModels (scripts/bench_models.py zoo):
  `tf.saved_model.load`, call `serving_default` once on inputs.npz's `x`;
- keras: 40 `.keras` checkpoints (scripts/bench_keras.py makes them):
  `load_model`, `compile`, then `evaluate` on a small `tf.data` pipeline
  (256 examples in batches of 32) with `return_dict=True`.

The ways, each timed as its whole command (interpreter start and imports
included), as the other sections time theirs:

- loop: the seed's in-process loop, `fn(item)` then `del`,
  `tf.keras.backend.clear_session()`, `gc.collect()`;
- map -j 1, map -j 2: the same script shape with `isorun.map(fn, items,
  jobs=N)` (fn from `__main__`, sent by value; the zygote preloads what fn
  refers to: tensorflow, numpy);
- pool: `ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1,
  mp_context=spawn)`, one task per item; each task a fresh interpreter
  importing TensorFlow, so it runs on the first --pool-items items only and
  its time is extrapolated to all items (wall × items ÷ pool items; said
  in the table).

Where the time of a map call goes is measured from the Python side (the map
records carry no phases): the function's global FORK_CLOCK registers
`os.register_at_fork` hooks when it is unpickled in the zygote (before the
fork: in the zygote; after it: in the child), each item travels as
`(Stamp(), path, Stamp())` whose `__setstate__` notes when unpickling began
and ended, the function notes its entry and exit, and its value's
`__reduce__` notes when the child began pickling it; the caller notes when
each result reached it. All are CLOCK_REALTIME (`time.time()`), comparable
across processes. The in-process loop calls the same function (the stamps
cost microseconds).

Memory: a caller that imports only isorun maps a trivial function over
--memory-items (500) items: its VmRSS after a 10-item warm-up map against
after the 500; the supervisor's peak is the isorun process's VmHWM (polled
from /proc while it runs); the machine's MemAvailable before and after
(other engineers' processes move it too: said with the figure).

Rewrites the "`isorun.map`: your own Python loop" section of --markdown
(or prints it); its **Target** lines reach "Every target at a glance"
through scripts/bench_glance.py.
"""

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import logger, splice, vm  # noqa: E402

log = logger("bench_map")

SECTION = "## `isorun.map`: your own Python loop"
WAYS = ("loop", "map1", "map2", "pool")
# Once, in the first round: isorun.map -j 1 without JE_ARROW_MALLOC_CONF (see bench()).
FALLBACK = "map1-fallback"
WAY_NAMES = {
    "loop": "the seed's in-process loop (fn, del, clear_session, gc.collect)",
    "map1": "isorun.map(fn, items, jobs=1)",
    "map2": "isorun.map(fn, items, jobs=2)",
    "pool": "ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1, spawn)",
    FALLBACK: "isorun.map(fn, items, jobs=1) without `JE_ARROW_MALLOC_CONF=background_thread:false` (first round)",
}
# Ways run on the first --pool-items items, their time extrapolated to all.
SUBSET = ("pool", FALLBACK)

# --------------------------------------------------------------------------
# The user's script: imports, the loop bodies, the stamps
# --------------------------------------------------------------------------

tf = None
np = None
INPUTS = None  # the saved kind's input, set by way()


def _imports():
    """The user's `import numpy as np, tensorflow as tf` (module globals,
    so that the loop bodies refer to them as a script's do)."""
    global tf, np
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy
    import tensorflow

    np, tf = numpy, tensorflow


class ForkClock:
    """When the zygote forked this process: hooks registered when this
    object is unpickled (in the zygote, with the function)."""

    def __init__(self):
        self.before = self.after = None

    def __getstate__(self):
        return {"registered": True}

    def __setstate__(self, state):
        self.before = self.after = None
        os.register_at_fork(before=self._before, after_in_child=self._after)

    def _before(self):
        self.before = time.time()

    def _after(self):
        self.after = time.time()


FORK_CLOCK = ForkClock()


class Stamp:
    """Notes when it was unpickled."""

    def __init__(self):
        self.t = None

    def __getstate__(self):
        return {"t": None}

    def __setstate__(self, state):
        self.t = time.time()


class Timed:
    """The function's value and its stamps; pickles as a plain dict with the
    time its pickling began (no class of this script is needed to load it)."""

    def __init__(self, value, stamps):
        self.value, self.stamps = value, stamps

    def __reduce__(self):
        return (dict, ([("value", self.value), ("stamps", dict(self.stamps, pickled=time.time()))],))

    def as_dict(self):
        return {"value": self.value, "stamps": dict(self.stamps)}


def _unwrap(item):
    """The path, and the unpickling stamps when the item came as
    (Stamp, path, Stamp)."""
    if isinstance(item, tuple):
        begin, path, end = item
        return path, {"unpickle_begin": begin.t, "unpickle_end": end.t}
    return item, {}


def _stamped(entry, unpickled, value):
    return Timed(value, dict(unpickled, entry=entry, exit=time.time(), before_fork=FORK_CLOCK.before,
                             after_fork=FORK_CLOCK.after, pid=os.getpid()))


def saved_call(item):
    """The zoo's loop body: load a SavedModel, call it once."""
    entry = time.time()
    path, unpickled = _unwrap(item)
    with np.load(INPUTS) as npz:
        x = tf.constant(npz["x"])
    model = tf.saved_model.load(path)
    outputs = model.signatures["serving_default"](x=x)
    shapes = {k: list(v.shape) for k, v in outputs.items()}
    return _stamped(entry, unpickled, shapes)


def my_dataset():
    """The user's tf.data pipeline: 256 examples of 32 features, batches of 32."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 32)).astype("float32")
    y = rng.integers(0, 10, 256)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32)


def keras_call(item):
    """The Keras loop body: load_model, compile, evaluate on my_dataset()."""
    entry = time.time()
    path, unpickled = _unwrap(item)
    model = tf.keras.models.load_model(path)
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    metrics = model.evaluate(my_dataset(), verbose=0, return_dict=True)
    return _stamped(entry, unpickled, {k: float(v) for k, v in metrics.items()})


FUNCTIONS = {"saved": saved_call, "keras": keras_call}


def trivial(x):
    return x + 1, os.getpid()


def _pool_task(kind, inputs, path):
    """The pool's task: the spawned interpreter imports TensorFlow, then the
    same loop body (its values come back as dicts)."""
    global INPUTS
    if tf is None:
        _imports()
    INPUTS = inputs
    return FUNCTIONS[kind](path).as_dict()


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class SupervisorWatch(threading.Thread):
    """Polls the VmHWM of this process's `isorun` children (the supervisor)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.done, self.seen = 0, False, 0

    def run(self):
        me = os.getpid()
        while not self.done:
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                comm = stat[stat.find("(") + 1:stat.rfind(")")]
                ppid = int(stat[stat.rfind(")") + 2:].split()[1])
                if ppid == me and comm == "isorun":
                    hwm = vm(pid, "VmHWM")
                    if hwm:
                        self.peak, self.seen = max(self.peak, hwm), self.seen + 1
            time.sleep(0.05)


def way(args):
    """One timed way: prints one JSON line of what it saw."""
    global INPUTS
    began = time.time()
    items = json.load(open(args.items))
    _imports()
    INPUTS = args.inputs
    imported = time.time()
    fn = FUNCTIONS[args.kind]
    out = {"way": args.way, "kind": args.kind, "items": len(items), "import_s": imported - began}
    if args.way == "loop":
        calls = []
        for path in items:
            t = time.perf_counter()
            value = fn(path)
            calls.append(time.perf_counter() - t)
            del value
            tf.keras.backend.clear_session()
            gc.collect()
        out["call_s"] = calls
    elif args.way.startswith("map"):
        if args.way == FALLBACK:
            items = items[: args.pool_items]
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
        import isorun

        watch = SupervisorWatch()
        watch.start()
        stamps, statuses, peaks = [], [], []
        for r in isorun.map(fn, [(Stamp(), p, Stamp()) for p in items], jobs=int(args.way[3])):
            arrived = time.time()
            statuses.append(r.status)
            peaks.append(r.record.get("peak_rss_bytes"))
            if r.ok:
                stamps.append(dict(r.value["stamps"], arrived=arrived))
            else:
                print(f"bench_map: {r.item!r}: {r.status}: {r.error.message if r.error else ''}", file=sys.stderr)
        watch.done = True
        watch.join()
        out.update(stamps=stamps, statuses=statuses, peak_rss=peaks, supervisor_hwm=watch.peak,
                   map_began=imported, items=len(items))
    else:
        import concurrent.futures
        import multiprocessing

        chosen = items[: args.pool_items]
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1, mp_context=context) as ex:
            for f in [ex.submit(_pool_task, args.kind, args.inputs, p) for p in chosen]:
                f.result()
        out["items"] = len(chosen)
    out["rss_end"] = vm(os.getpid(), "VmRSS")
    print(json.dumps(out))
    return 0


def memory(args):
    """The caller's RSS over many trivial items, the supervisor's peak, and
    the machine's available memory before and after."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import isorun

    for r in isorun.map(trivial, range(10)):  # warm-up: isorun's and cloudpickle's imports
        assert r.ok, r.record
    gc.collect()
    before, available = vm(os.getpid(), "VmRSS"), mem_available()
    watch = SupervisorWatch()
    watch.start()
    began = time.time()
    n, peak_call, pids = 0, 0, set()
    for r in isorun.map(trivial, range(args.n)):
        assert r.ok and r.value[0] == r.item + 1, r.record
        peak_call = max(peak_call, r.peak_rss_bytes or 0)
        pids.add(r.value[1])
        n += 1
    wall = time.time() - began
    watch.done = True
    watch.join()
    gc.collect()
    after = vm(os.getpid(), "VmRSS")
    time.sleep(1)
    # Every call's process has ended (a pid alive now is one reused since,
    # or a call's process left behind): its memory is the machine's again.
    alive = sum(os.path.exists(f"/proc/{pid}") for pid in pids)
    print(json.dumps({"pids": len(pids), "alive": alive, "items": n, "rss_before": before, "rss_after": after, "supervisor_hwm": watch.peak,
                      "available_before": available, "available_after": mem_available(), "wall_s": wall,
                      "call_peak_rss": peak_call}))
    return 0


# --------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------


def run_way(args, kind, way_, items_file, inputs, env):
    cmd = [args.python, os.path.abspath(__file__), "way", "--kind", kind, "--way", way_, "--items", items_file,
           "--inputs", inputs, "--pool-items", str(args.pool_items)]
    load = os.getloadavg()[0]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - began
    # CPU seconds of the way and every process under it (each waited for by
    # its parent): what a loaded machine's share of the CPUs does not move.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
    if done.returncode != 0:
        sys.exit(f"bench_map: {kind} {way_} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out.update(wall_s=wall, cpu_s=cpu_s, load_before=load, load_after=os.getloadavg()[0],
               fallback="fresh interpreter instead" in done.stderr)
    return out


def keras_files(args):
    folder = os.path.join(os.path.abspath(args.keras_work), "ckpts-run")
    have = sorted(f for f in os.listdir(folder) if f.endswith(".keras")) if os.path.isdir(folder) else []
    if len(have) < args.models:
        sys.path.insert(0, HERE)
        from bench_keras import MAKE

        log(f"making {args.models} .keras checkpoints in {folder}")
        subprocess.run([args.python, "-c", MAKE, folder, str(args.models), "run"], check=True)
        have = sorted(f for f in os.listdir(folder) if f.endswith(".keras"))
    return [os.path.join(folder, f) for f in have[: args.models]]


def phases(runs, loop_calls):
    """Per item of the -j 1 map runs (the first item of each run left out:
    it follows the zygote's start), medians in ms; and how many of them ran
    in a process forked before the item before them had reached the caller
    (a spare)."""
    keys = ("fork", "child_start", "handover", "unpickle", "call", "pickle_begin", "arrive", "per_item")
    rows = {k: [] for k in keys}
    ahead = counted = 0
    for run in runs:
        s = sorted(run["stamps"], key=lambda st: st["entry"])
        for i in range(1, len(s)):
            st, before = s[i], s[i - 1]
            if None in (st.get("before_fork"), st.get("after_fork"), st.get("unpickle_begin")):
                continue
            counted += 1
            ahead += st["before_fork"] < before["arrived"]
            rows["fork"].append(st["after_fork"] - st["before_fork"])
            rows["child_start"].append(st["unpickle_begin"] - st["after_fork"])
            rows["handover"].append(st["unpickle_begin"] - before["pickled"])
            rows["unpickle"].append(st["entry"] - st["unpickle_begin"])
            rows["call"].append(st["exit"] - st["entry"])
            rows["pickle_begin"].append(st["pickled"] - st["exit"])
            rows["arrive"].append(st["arrived"] - st["pickled"])
            rows["per_item"].append(st["arrived"] - before["arrived"])
    med = {k: statistics.median(v) * 1000 if v else None for k, v in rows.items()}
    med["loop_call"] = statistics.median(loop_calls[1:] or loop_calls) * 1000 if loop_calls else None
    med["ahead"], med["counted"] = ahead, counted
    return med


def bench(args):
    os.makedirs(os.path.dirname(os.path.abspath(args.results)) or ".", exist_ok=True)
    env = dict(os.environ, ISORUN_BINARY=os.path.abspath(args.isorun), TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0")
    # `import tensorflow` imports pandas, which imports pyarrow when it is
    # installed (it is here), and pyarrow's jemalloc starts a background
    # thread at its first allocation: a zygote with two threads cannot fork
    # safely, and isorun map falls back to a fresh interpreter per call.
    # Turned off for every way (only pyarrow's allocator reads it); the
    # fallback row shows the difference.
    env.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    zoo = os.path.abspath(args.zoo)
    saved = [os.path.join(zoo, "mlp40", f"m{i:02d}") for i in range(40)][: args.models]
    kinds = {"saved": (saved, os.path.join(zoo, "inputs.npz")), "keras": (keras_files(args), "")}
    work = os.path.abspath(args.keras_work)
    files = {}
    for kind, (items, _) in kinds.items():
        files[kind] = os.path.join(work, f"map-items-{kind}.json")
        with open(files[kind], "w") as f:
            json.dump(items, f)
    began = time.time()
    log(f"memory: {args.memory_items} trivial items")
    done = subprocess.run([args.python, os.path.abspath(__file__), "memory", "--n", str(args.memory_items)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"bench_map: memory failed:\n{done.stderr[-3000:]}")
    mem = json.loads(done.stdout.strip().splitlines()[-1])
    runs = {}
    for round_ in range(args.rounds):
        for kind, (items, inputs) in kinds.items():
            ways = WAYS if round_ < args.pool_rounds else WAYS[:3]
            if round_ == 0 and kind in args.fallback_kinds.split(","):
                ways += (FALLBACK,)
            for way_ in ways:
                log(f"round {round_ + 1}/{args.rounds}, {kind}, {way_} ...")
                way_env = env
                if way_ == FALLBACK:
                    way_env = {k: v for k, v in env.items() if k != "JE_ARROW_MALLOC_CONF"}
                out = run_way(args, kind, way_, files[kind], inputs, way_env)
                log(f"  {out['wall_s']:.1f} s (load {out['load_before']:.1f})")
                runs.setdefault((kind, way_), []).append(out)
        # The page after every round: a run cut short still leaves its rounds.
        results = {"runs": {f"{k}/{w}": v for (k, w), v in runs.items()}, "memory": mem,
                   "commit": commit(os.path.dirname(HERE)),
                   "rounds_done": round_ + 1, "minutes": (time.time() - began) / 60,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        with open(args.results, "w") as f:
            json.dump(results, f)
        args.rounds_done = round_ + 1
        text = markdown(args, kinds, runs, mem, results)
        if args.markdown:
            splice(args.markdown, SECTION, text, after="## Keras applications: five real architectures")
    print(text)
    return 0


def render(args):
    """The section again from a results file (after a change to the page's
    wording, or from a run cut short)."""
    results, runs, rounds = None, {}, 0
    for path in args.results:
        # Several files: the rounds of several runs, one after another.
        part = json.load(open(path))
        for key, value in part["runs"].items():
            runs.setdefault(tuple(key.split("/")), []).extend(value)
        rounds += part.get("rounds_done", 1)
        if results is None:
            results = part
        else:
            results = dict(results, date=part["date"], minutes=results["minutes"] + part["minutes"])
    kinds = {}
    for (kind, way_), value in runs.items():
        if way_ == "loop":
            kinds[kind] = ([None] * value[0]["items"], "")
    kinds = {k: kinds[k] for k in ("saved", "keras") if k in kinds}
    args.rounds_done = rounds
    text = markdown(args, kinds, runs, results["memory"], results)
    if args.markdown:
        splice(args.markdown, SECTION, text, after="## Keras applications: five real architectures")
    print(text)
    return 0


def commit(repo):
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "?"


def markdown(args, kinds, runs, mem, results):
    n_rounds = args.rounds_done if hasattr(args, "rounds_done") else args.rounds
    lines = [
        SECTION,
        "",
        f"`scripts/bench_map.py` ({results['date']}, isorun `{results.get('commit') or commit(os.path.dirname(HERE))}`"
        f"{'; ' + args.note if getattr(args, 'note', None) else ''}, {n_rounds} "
        f"alternating round(s), {results['minutes']:.0f} min; 2 cores). One loop body, written once as a function of "
        "a path, run four ways over the same items, each timed as its whole command (interpreter start and imports "
        "included): **saved**: the zoo's 40 SavedModels, `tf.saved_model.load` then `serving_default` once on "
        "`inputs.npz`; **keras**: 40 `.keras` checkpoints (the zoo's MLP, one training run's seeds), `load_model`, "
        "`compile`, then `evaluate` on a `tf.data` pipeline of 256 examples in batches of 32. The loop is the "
        "seed's (`fn(path)`, `del`, `clear_session()`, `gc.collect()`); `isorun.map` gets the same function from "
        "the script's `__main__` (sent by value; the zygote preloads tensorflow and numpy, which it refers to); "
        f"the pool runs the first {args.pool_items} items only, in the first {min(args.pool_rounds, n_rounds)} "
        "round(s), its time extrapolated to all "
        "(each task is a fresh interpreter importing TensorFlow, so its cost is per item), as does the fallback "
        "row (below the table).",
        "",
    ]
    loads = [r["load_before"] for v in runs.values() for r in v]
    lines += [f"**Machine load**: shared with other engineers' builds and tests while it ran: load average "
              f"median {statistics.median(loads):.1f} (from {min(loads):.1f} to {max(loads):.1f}) on 2 cores "
              "at the start of each timed way; so the walls are noisy, and the ratios, of ways run side by side in "
              "the same round, are what to read; so is CPU time (user + system, of the way's command and every process "
              "under it), which the machine's load moves much less than the wall.", ""]
    lines += ["| items | way | wall (s), median | each round (s) | × the loop (median of per-round ratios) "
              "| the pool's time ÷ this | CPU (s), median | CPU × the loop's |", "|---|---|---:|---|---:|---:|---:|---:|"]
    ratio = {}

    def scaled(r, n):
        """A subset way's wall for all n items: the script's own imports
        once, the rest per item."""
        return r["import_s"] + (r["wall_s"] - r["import_s"]) * n / r["items"]

    def scaled_cpu(r, n):
        """The same for CPU seconds (the script's import counted as its
        wall, an upper bound on its CPU)."""
        if r.get("cpu_s") is None:
            return None
        return r["import_s"] + max(r["cpu_s"] - r["import_s"], 0) * n / r["items"]

    for kind, (items, _) in kinds.items():
        loop = [r["wall_s"] for r in runs[(kind, "loop")]]
        pool = [scaled(r, len(items)) for r in runs.get((kind, "pool"), [])]
        for way_ in WAYS + (FALLBACK,):
            if (kind, way_) not in runs:
                continue
            walls = [scaled(r, len(items)) if way_ in SUBSET else r["wall_s"] for r in runs[(kind, way_)]]
            per = statistics.median(w / lw for w, lw in zip(walls, loop))
            vs_pool = statistics.median(p / w for p, w in zip(pool, walls)) if pool else float("nan")
            ratio[(kind, way_)] = (per, vs_pool)
            name = WAY_NAMES[way_]
            if way_ in SUBSET:
                n = runs[(kind, way_)][0]["items"]
                name += f"; {n} items, extrapolated to {len(items)}"
            # A call that ran in a fresh interpreter has no fork stamps.
            fell = sum(bool(r.get("fallback")) or any(st.get("before_fork") is None for st in r.get("stamps", ()))
                       for r in runs[(kind, way_)])
            if way_ == FALLBACK:
                name += ": it fell back to a fresh interpreter per call" if fell else ": no fallback here"
            elif fell:
                name += f" (**fell back to a fresh interpreter per call** in {fell} round(s))"
            cpus = [scaled_cpu(r, len(items)) if way_ in SUBSET else r.get("cpu_s")
                    for r in runs[(kind, way_)]]
            loop_cpu = [r.get("cpu_s") for r in runs[(kind, "loop")]]
            cpu_text = cpu_ratio = "–"
            if all(c is not None for c in cpus + loop_cpu):
                cpu_text = f"{statistics.median(cpus):.1f}"
                cpu_ratio = f"{statistics.median(c / lc for c, lc in zip(cpus, loop_cpu)):.2f}×"
            lines.append(f"| {kind} ({len(items)}) | {name} | {statistics.median(walls):.2f} | "
                         + ", ".join(f"{w:.1f}" for w in walls)
                         + f" | {per:.2f}× | {'–' if way_ == 'pool' else f'{vs_pool:.1f}×'} | {cpu_text} | {cpu_ratio} |")
    lines += ["", "Subset ways: the script's own `import tensorflow` counted once, the rest of the wall scaled by "
              "items ÷ items run. `JE_ARROW_MALLOC_CONF=background_thread:false` is set for every way but the "
              "fallback row: `import tensorflow` imports pandas, which imports pyarrow where it is installed (as "
              "here), and pyarrow's jemalloc starts a background thread; the zygote then runs 2 threads, cannot "
              "fork safely, and `isorun map` says so once and starts a fresh interpreter per call (importing "
              "TensorFlow each time). Since e15d35d isorun sets it for the zygote itself (map/src/lib.rs "
              "`THREAD_VARS`, the caller's value restored in each call), so the fallback row is what a "
              "build before that paid; with a later build that row no longer falls back."]
    lines += ["", "Where a `jobs=1` call's time goes, per item (medians over every item but each run's first, "
              "all rounds; ms). Measured from the Python side, as the map records carry no phases: `os.register_at_fork` "
              "hooks the function's pickle registers in the zygote (the zygote just before `fork`, the child just after), "
              "stamps in the item that note when unpickling began and ended, the function's entry and exit, the "
              "value's `__reduce__` (when the child began pickling it) and the caller's loop (when the result "
              "reached it); all `time.time()`, comparable across processes.", "",
              "| items | fork | forked → unpickling the item (child start; a spare's wait for its item included) | "
              "hand-over: the item before's value pickled → this item's unpickling | unpickling → "
              "the call | the call | the call in-process (the loop's) | return → value pickled | value pickled → the "
              "caller has it (value written, answer, exit, reaped, record, loaded) | per item (result to result) | "
              "overhead per item over the in-process call | items in a process forked ahead (a spare) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ph = {}
    for kind in kinds:
        loop_calls = [c for r in runs[(kind, "loop")] for c in r["call_s"]]
        m = ph[kind] = phases(runs[(kind, "map1")], loop_calls)

        def f(k):
            return "–" if m.get(k) is None else f"{m[k]:.1f}"

        over = None if m["per_item"] is None else m["per_item"] - m["loop_call"]
        lines.append(f"| {kind} | {f('fork')} | {f('child_start')} | {f('handover')} | {f('unpickle')} | {f('call')} | "
                     f"{f('loop_call')} | {f('pickle_begin')} | {f('arrive')} | {f('per_item')} | "
                     f"{'–' if over is None else f'{over:.1f}'} | {m['ahead']}/{m['counted']} |")
    imports = {kind: statistics.median(r["import_s"] for r in runs[(kind, "loop")]) for kind in kinds}
    firsts = []
    for kind in kinds:
        for r in runs[(kind, "map1")]:
            s = [st["before_fork"] for st in r["stamps"] if st.get("before_fork")]
            if s:
                firsts.append(min(s) - r["map_began"])
    lines += ["", f"Before the first call: the script's own `import tensorflow` took {statistics.median(imports.values()):.1f} s "
              f"(median of the loop's), and from `isorun.map`'s call to the first fork {statistics.median(firsts):.1f} s "
              "(the supervisor and the zygote's own imports of tensorflow and numpy), paid once per run and per slot."]
    sup = [r["supervisor_hwm"] for k in kinds for w in ("map1", "map2") for r in runs[(k, w)] if r["supervisor_hwm"]]
    growth = (mem["rss_after"] - mem["rss_before"]) / 2**20
    avail = (mem["available_after"] - mem["available_before"]) / 2**20
    loop_rss = {kind: statistics.median(r["rss_end"] for r in runs[(kind, "loop")]) / 2**20 for kind in kinds}
    map_rss = {kind: statistics.median(r["rss_end"] for r in runs[(kind, "map1")]) / 2**20 for kind in kinds}
    sup_mib = max([mem["supervisor_hwm"]] + sup) / 2**20
    lines += ["", "Memory:", "",
              f"- the caller over {mem['items']} trivial items (`isorun.map(trivial, range(N))`, `def trivial(x): return x + 1, os.getpid()`, "
              f"{mem['wall_s']:.1f} s, {mem['wall_s'] / mem['items'] * 1000:.0f} ms per item): VmRSS "
              f"{mem['rss_before'] / 2**20:.1f} MiB after a 10-item warm-up map, {mem['rss_after'] / 2**20:.1f} MiB "
              f"after the {mem['items']} items: **{growth:+.1f} MiB**;",
              f"- the supervisor (the `isorun` process's VmHWM, polled every 50 ms): {mem['supervisor_hwm'] / 2**20:.1f} MiB "
              f"over the {mem['items']} trivial items; at most {max(sup) / 2**20 if sup else float('nan'):.1f} MiB in the zoo "
              "and Keras runs above (its children, the zygotes and calls, are separate processes);",
              f"- every call's memory returned: each of the {mem['pids']} calls ran in its own process (its pid in "
              f"its value), and {mem['alive']} of those pids exist a second after the run; the machine's MemAvailable {mem['available_before'] / 2**30:.2f} GiB "
              f"before the {mem['items']} items and {mem['available_after'] / 2**30:.2f} GiB a second after "
              f"({avail:+.0f} MiB; other engineers' processes move it too); each call is a process that ends, its "
              f"largest peak {mem['call_peak_rss'] / 2**20:.0f} MiB. The callers' own RSS at the end of the runs above "
              "(medians): " + "; ".join(f"{kind}: the loop {loop_rss[kind]:.0f} MiB, the map's caller "
                                        f"{map_rss[kind]:.0f} MiB (its own `import tensorflow` included)" for kind in kinds) + ".",
              ""]
    t = []
    for kind in kinds:
        j1, p1 = ratio[(kind, "map1")]
        j2, _ = ratio[(kind, "map2")]
        label = kind.capitalize()
        t.append(f"**Target (#40 §4, {kind})**: {label}: `jobs=1` ≤ 1.0× the in-process loop: "
                 f"{'met' if j1 <= 1.0 else '**missed**'} ({j1:.2f}×). {label}: `jobs=2` ≤ 0.6× the loop: "
                 f"{'met' if j2 <= 0.6 else '**missed**'} ({j2:.2f}×)."
                 + (f" {label}: `jobs=1` ≥ 10× faster than the spawn pool: {'met' if p1 >= 10 else '**missed**'} "
                    f"({p1:.1f}×, the pool extrapolated from {runs[(kind, 'pool')][0]['items']} items)."
                    if (kind, "pool") in runs else ""))
    returned = mem["alive"] == 0
    t.append(f"**Target (#40 §4, memory)**: The caller's RSS ≤ 30 MiB growth over {mem['items']} items: "
             f"{'met' if growth <= 30 else '**missed**'} ({growth:+.1f} MiB). The supervisor ≤ 32 MiB: "
             f"{'met' if sup_mib <= 32 else '**missed**'} ({sup_mib:.1f} MiB). Every call's memory returned: "
             f"{'met' if returned else '**missed**'} ({mem['pids']} calls' processes, {mem['alive']} alive a second "
             f"after the run; MemAvailable {avail:+.0f} MiB).")
    lines += t
    bounds = bound_text(kinds, ratio, ph, runs)
    if bounds:
        lines += ["", "**What bounds it.** " + bounds]
    return "\n".join(lines) + "\n"


def bound_text(kinds, ratio, ph, runs):
    parts = []
    load = statistics.median(r["load_before"] for v in runs.values() for r in v)
    for kind, (items, _) in kinds.items():
        j1 = ratio[(kind, "map1")][0]
        j2 = ratio[(kind, "map2")][0]
        m = ph[kind]
        if (j1 > 1.0 or j2 > 0.6) and m["per_item"] is not None:
            loop = statistics.median(r["wall_s"] for r in runs[(kind, "loop")])
            spare = m["ahead"] == m["counted"]
            start = ("the fork and the child's start happen ahead, in a spare, while the call before runs; "
                     if spare else f"fork {m['fork']:.0f} ms and start {m['child_start']:.0f} ms; ")
            parts.append(
                f"*{kind}*: a call in its forked process takes {m['call']:.0f} ms against {m['loop_call']:.0f} ms "
                f"for the same call in the loop's warm process ({m['call'] - m['loop_call']:+.0f} ms), while the "
                f"process around it costs little: {start}the hand-over from one call's value to the next call's "
                f"item {m['handover']:.0f} ms, unpickling {m['unpickle']:.1f} ms, the value to the caller "
                f"{m['arrive']:.0f} ms (overlapping the next call). {len(items)} items at {m['per_item']:.0f} ms "
                f"are {len(items) * m['per_item'] / 1000:.1f} s of the map's wall ({loop:.1f} s for the whole loop).")
    if any(ratio[(k, "map1")][0] > 1.0 or ratio[(k, "map2")][0] > 0.6 for k in kinds):
        parts.append(
            "The difference is what TensorFlow and Keras set up on first use in a process, which the loop pays "
            "once and a fresh process pays per item; it is not imports (a forked child's first call imports no "
            "module the zygote lacks: checked with `sys.modules`), and the zygote may not pay it ahead (it runs no "
            "op). Measured by hand on 2026-12-06 (not by this script), in a child forked from an interpreter that had imported tensorflow: `load_model` 590 ms the "
            "first time and 112 ms the second, `evaluate` 2106 ms and 626 ms. `-j 2` adds a second slot, but "
            f"on a machine whose 2 cores run other engineers' builds (load average {load:.0f}) there is no idle core for "
            "it: its wall is within the rounds' spread of `-j 1`'s, and its CPU time is higher (each slot's zygote "
            "imports TensorFlow). `items_per_worker=N` (isorun "
            "map's `--items-per-worker`) pays the first use once per N items, at the cost of N items sharing a "
            "process.")
    pool_parts = []
    for kind, (items, _) in kinds.items():
        j1, p1 = ratio[(kind, "map1")]
        m = ph[kind]
        if (kind, "pool") in runs and p1 < 10 and m["per_item"] is not None:
            pool = [(r["wall_s"] - r["import_s"]) / r["items"] for r in runs[(kind, "pool")]]
            first = [min(st["before_fork"] for st in r["stamps"] if st.get("before_fork")) - r["map_began"]
                     for r in runs[(kind, "map1")] if any(st.get("before_fork") for st in r["stamps"])]
            imports = statistics.median(r["import_s"] for r in runs[(kind, "map1")])
            wall = statistics.median(r["wall_s"] for r in runs[(kind, "map1")])
            per_pool = statistics.median(pool)
            pool_parts.append(
                f"*{kind}, against the pool*: a pool task costs {per_pool:.1f} s (a fresh interpreter importing "
                f"TensorFlow) and a map item {m['per_item'] / 1000:.2f} s ({per_pool * 1000 / m['per_item']:.0f}× "
                f"less), but the map's script first pays its own `import tensorflow` ({imports:.1f} s, which the "
                f"pool's parent pays too) and the zygote's imports ({statistics.median(first):.1f} s) out of its "
                f"{wall:.1f} s: with {len(items)} items those fixed costs hold the whole-command ratio to "
                f"{p1:.1f}×; it tends to the per-item ratio as items grow.")
    return " ".join(parts + pool_parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench")
    p.add_argument("--isorun", required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--zoo", required=True)
    p.add_argument("--keras-work", required=True)
    p.add_argument("--models", type=int, default=40)
    p.add_argument("--pool-items", type=int, default=6)
    p.add_argument("--memory-items", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pool-rounds", type=int, default=1,
                   help="rounds that include the pool (each of its items imports TensorFlow; default 1)")
    p.add_argument("--fallback-kinds", default="saved",
                   help="kinds that get the fallback row, in the first round (comma-separated; default saved)")
    p.add_argument("--quick", action="store_true", help="10 items, a pool of 3, 100 memory items")
    p.add_argument("--results", default="target/bench/results-map.json")
    p.add_argument("--markdown")
    p.add_argument("--note", help="said after the commit in the section's first line (e.g. which build of isorun)")
    p = sub.add_parser("way")
    p.add_argument("--kind", choices=sorted(FUNCTIONS), required=True)
    p.add_argument("--way", choices=WAYS + (FALLBACK,), required=True)
    p.add_argument("--items", required=True)
    p.add_argument("--inputs", default="")
    p.add_argument("--pool-items", type=int, default=6)
    p = sub.add_parser("render")
    p.add_argument("--results", required=True, action="append")
    p.add_argument("--markdown")
    p.add_argument("--note", help="said after the commit in the section's first line (e.g. which build of isorun)")
    p.add_argument("--pool-items", type=int, default=6)
    p.add_argument("--pool-rounds", type=int, default=1)
    p = sub.add_parser("memory")
    p.add_argument("--n", type=int, default=500)
    args = parser.parse_args()
    if args.command == "bench" and args.quick:
        args.models, args.pool_items, args.memory_items = min(args.models, 10), min(args.pool_items, 3), 100
    return {"bench": bench, "way": way, "memory": memory, "render": render}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
