"""scripts/bench's driver: runs every way side by side and writes BENCHMARKS.md.

Started by scripts/bench (which builds isorun and provides the interpreter);
see `scripts/bench --help`. The Python side (zoo, Python ways) is in
scripts/bench_models.py. Only the standard library is used here.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1024 * 1024


def log(message):
    print(f"bench: {message}", file=sys.stderr, flush=True)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------
# Watching processes: the supervisor's own memory, and its workers'
# --------------------------------------------------------------------------


def proc_status(pid):
    """Fields of /proc/PID/status in bytes (the kB ones), or {} once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def smaps_rollup(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def children_map():
    """ppid -> [pid] for every process, and pid -> command line."""
    kids, cmdlines = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids, cmdlines


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


class WorkerSampler(threading.Thread):
    """Samples every descendant of a supervisor every `period` s: for each
    worker and zygote, its peak Rss, Pss, private (Private_Clean +
    Private_Dirty) and anonymous memory from /proc/PID/smaps_rollup."""

    def __init__(self, root_pid, period=0.025):
        super().__init__(daemon=True)
        self.root, self.period = root_pid, period
        self.peaks = {}  # pid -> {"zygote": bool, "Rss": .., "Pss": .., "Private": .., "Anonymous": ..}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            kids, _ = children_map()
            todo, seen = [(pid, 1) for pid in kids.get(self.root, [])], []
            while todo:
                pid, depth = todo.pop()
                seen.append((pid, depth))
                todo.extend((kid, depth + 1) for kid in kids.get(pid, []))
            for pid, depth in seen:
                entry = self.peaks.get(pid)
                if entry is None:
                    # A forked worker keeps the zygote's command line: the
                    # zygote is the supervisor's child, its workers are grandchildren.
                    zygote = depth == 1 and b"--zygote" in cmdline(pid)
                    entry = {"zygote": zygote, "Rss": 0, "Pss": 0, "Private": 0, "Anonymous": 0}
                    self.peaks[pid] = entry
                s = smaps_rollup(pid)
                if not s:
                    continue
                private = s.get("Private_Clean", 0) + s.get("Private_Dirty", 0)
                for key, value in (("Rss", s.get("Rss", 0)), ("Pss", s.get("Pss", 0)),
                                   ("Private", private), ("Anonymous", s.get("Anonymous", 0))):
                    entry[key] = max(entry[key], value)
            self.stop.wait(self.period)


# --------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        self.repo = os.path.abspath(args.repo)
        self.isorun = os.path.join(self.repo, "target/release/isorun")
        self.worker = os.path.join(self.repo, "target/release/isorun-worker")
        self.python = args.python
        self.helper = os.path.join(self.repo, "scripts/bench_models.py")
        self.zoo = os.path.abspath(args.zoo)
        self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self.work = tempfile.mkdtemp(prefix="isorun-bench-")
        n = 10 if args.quick else 40
        mlp = os.path.join(self.zoo, "mlp40")
        self.models = [os.path.join(mlp, m) for m in sorted(os.listdir(mlp))][:n]
        self.inputs = os.path.join(self.zoo, "inputs.npz")
        self.results = {"rounds": [], "loadavg": []}

    # -- running things -----------------------------------------------------

    def run(self, cmd, what, capture=True):
        """Runs cmd to the end; returns (wall seconds, stdout, stderr). Fails loudly."""
        cpu_before, busy_before = children_cpu(), machine_busy()
        started = time.perf_counter()
        p = subprocess.run(cmd, env=self.env, stdin=subprocess.DEVNULL, capture_output=capture, text=True)
        wall = time.perf_counter() - started
        own = children_cpu() - cpu_before
        # The CPU time everything else on the machine used meanwhile, in cores.
        self.last_cpu = {"own_cpu_s": own, "others_cores": max(0.0, machine_busy() - busy_before - own) / wall}
        if p.returncode != 0:
            tail = (p.stderr or "")[-3000:]
            raise SystemExit(f"bench: {what} failed with exit code {p.returncode}:\n{tail}")
        return wall, p.stdout or "", p.stderr or ""

    def isorun_cmd(self, models, spawn, jobs, inputs=None, report=None):
        cmd = [self.isorun, "run", *models, "--inputs", inputs or self.inputs, "--json", "-q",
               "--spawn", spawn, "-j", str(jobs), "--summary"]
        if report:
            cmd += ["--report", report]
        return cmd

    def isorun_timed(self, spawn, jobs):
        report = os.path.join(self.work, f"report-{spawn}-{jobs}.json")
        wall, _, err = self.run(self.isorun_cmd(self.models, spawn, jobs, report=report), f"isorun --spawn {spawn} -j {jobs}")
        with open(report) as f:
            units = json.load(f)["units"]
        return {
            "wall_s": wall,
            "supervisor_peak_mib": summary_supervisor_mib(err),
            "units": [{k: u.get(k) for k in ("wall_ms", "load_ms", "run_ms", "user_ms", "sys_ms", "peak_rss_bytes")}
                      for u in units],
        }

    def ways(self):
        """name -> function returning a measurement dict with wall_s; in run order."""
        py = [self.python, self.helper]
        ways = {
            "python loop": lambda: {"wall_s": self.run(py + ["loop", self.inputs, *self.models], "python loop")[0]},
            "python pool": lambda: {"wall_s": self.run(py + ["pool", self.inputs, *self.models], "python pool")[0]},
        }
        for spawn in ("exec", "zygote"):
            for jobs in (1, 2):
                ways[f"isorun {spawn} -j {jobs}"] = (lambda s=spawn, j=jobs: self.isorun_timed(s, j))
        ways["rust floor"] = self.floor
        return ways

    def floor(self):
        wall, out, _ = self.run([self.worker, "--in-process", "--batch", "8", *self.models], "isorun-worker --in-process")
        per_model = []
        for line in out.splitlines():
            m = re.search(r"\tload ([\d.]+) ms\ttotal ([\d.]+) ms$", line)
            if m:
                per_model.append({"load_ms": float(m.group(1)), "total_ms": float(m.group(2))})
        return {"wall_s": wall, "models": per_model}

    # -- the parts ------------------------------------------------------------

    def warm_up(self):
        log("warm-up (not measured): page cache, libtensorflow, Python imports")
        self.run(self.isorun_cmd(self.models, "zygote", 2), "warm-up isorun")
        self.run(self.isorun_cmd(self.models, "exec", 2), "warm-up isorun")
        self.run([self.python, "-c", "import tensorflow"], "warm-up python")

    def timing_rounds(self):
        ways = self.ways()
        for r in range(self.args.rounds):
            round_ = {}
            self.results["loadavg"].append(loadavg())
            for name, fn in ways.items():
                log(f"round {r + 1}/{self.args.rounds}: {name} ({len(self.models)} models) ...")
                m = fn()
                m.update(self.last_cpu)
                log(f"round {r + 1}/{self.args.rounds}: {name}: {m['wall_s']:.2f} s")
                round_[name] = m
            self.results["rounds"].append(round_)
        self.results["loadavg"].append(loadavg())

    def supervisor_500(self):
        """The supervisor's own memory over a 500-unit run (zygote, -j 2): `rounds`
        runs with --summary, and one more without (records are not kept then)."""
        root = os.path.join(self.zoo, "mlp500")
        base = [self.isorun, "run", root, "--inputs", self.inputs, "--json", "-q", "--spawn", "zygote", "-j", "2"]
        if self.args.quick:
            base += ["--shard", "0/10"]
        runs = []
        plan = [True] * self.args.rounds + [False]
        for r, summary in enumerate(plan):
            cmd = base + (["--summary"] if summary else [])
            log(f"supervisor memory {r + 1}/{len(plan)}: isorun run mlp500 ({'~50' if self.args.quick else 500} units, "
                f"zygote, -j 2{', --summary' if summary else ', no --summary'}) ...")
            started = time.perf_counter()
            p = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            # The supervisor's VmRSS and RssAnon after each finished unit (each
            # JSON line), and its VmHWM as late as it can be read.
            rss_after, anon_after, hwm = [], [], 0
            for line in p.stdout:
                if not line.strip():
                    continue
                st = proc_status(p.pid)
                if st:
                    rss_after.append(st.get("VmRSS", 0))
                    anon_after.append(st.get("RssAnon", 0))
                    hwm = max(hwm, st.get("VmHWM", 0))
            err = p.stderr.read()
            code = p.wait()
            wall = time.perf_counter() - started
            if code != 0:
                raise SystemExit(f"bench: isorun run mlp500 failed with exit code {code}:\n{err[-3000:]}")
            n = len(rss_after)
            k = max(0, n // 10 - 1)
            runs.append({
                "summary": summary,
                "units": n,
                "wall_s": wall,
                "summary_peak_mib": summary_supervisor_mib(err),
                "vmhwm_bytes": hwm,
                "rss_after_10pct": rss_after[k] if n else None,
                "rss_after_last": rss_after[-1] if n else None,
                "anon_after_10pct": anon_after[k] if n else None,
                "anon_after_last": anon_after[-1] if n else None,
                "anon_bytes_per_unit": (anon_after[-1] - anon_after[k]) / (n - 1 - k) if n - 1 > k else None,
            })
            log(f"supervisor memory {r + 1}: {n} units in {wall:.1f} s, VmHWM {hwm / MIB:.1f} MiB")
        self.results["supervisor_500"] = runs

    def worker_memory(self):
        """Per-worker memory, exec vs zygote, sampled from /proc (-j 1, one run each)."""
        out = {}
        for spawn in ("exec", "zygote"):
            log(f"worker memory: isorun --spawn {spawn} -j 1, sampling /proc every 25 ms ...")
            report = os.path.join(self.work, f"mem-{spawn}.json")
            cmd = self.isorun_cmd(self.models, spawn, 1, report=report)
            p = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            sampler = WorkerSampler(p.pid)
            sampler.start()
            err = p.communicate()[1]
            sampler.stop.set()
            sampler.join()
            if p.returncode != 0:
                raise SystemExit(f"bench: isorun --spawn {spawn} failed:\n{err[-3000:]}")
            with open(report) as f:
                units = json.load(f)["units"]
            workers = [e for e in sampler.peaks.values() if not e["zygote"] and e["Rss"] > 0]
            zygotes = [e for e in sampler.peaks.values() if e["zygote"] and e["Rss"] > 0]
            out[spawn] = {
                "ru_maxrss_median": median([u.get("peak_rss_bytes") for u in units]),
                "sampled_workers": len(workers),
                "workers": {k: median([w[k] for w in workers]) for k in ("Rss", "Pss", "Private", "Anonymous")},
                "zygote": {k: max([z[k] for z in zygotes]) for k in ("Rss", "Pss", "Private", "Anonymous")} if zygotes else None,
            }
        self.results["worker_memory"] = out

    def big_model_memory(self):
        big = os.path.join(self.zoo, "big", "dense380")
        py, iso = [], []
        for r in range(self.args.rounds):
            log(f"380 MB model {r + 1}/{self.args.rounds}: Python load/run/drop, then isorun ...")
            _, out, _ = self.run([self.python, self.helper, "memory", big], "python memory")
            py.append(json.loads(out.strip().splitlines()[-1]))
            report = os.path.join(self.work, "big.json")
            wall, _, err = self.run(
                self.isorun_cmd([big], "zygote", 1, inputs=os.path.join(self.zoo, "big_inputs.npz"), report=report),
                "isorun big model")
            with open(report) as f:
                unit = json.load(f)["units"][0]
            iso.append({"wall_s": wall, "peak_rss_bytes": unit.get("peak_rss_bytes"),
                        "supervisor_peak_mib": summary_supervisor_mib(err)})
        self.results["big_model"] = {"python": py, "isorun": iso,
                                     "bytes": dir_bytes(big)}

    def ipc(self):
        model = os.path.join(self.zoo, "ipc", "reduce_sum")
        runs = {"big": [], "tiny": []}
        for r in range(self.args.rounds):
            for size in ("big", "tiny"):
                log(f"IPC {r + 1}/{self.args.rounds}: 256 MiB input ({size}) ..." if size == "big" else
                    f"IPC {r + 1}/{self.args.rounds}: 16-element input (tiny) ...")
                report = os.path.join(self.work, f"ipc-{size}.json")
                wall, _, err = self.run(self.isorun_cmd([model], "zygote", 1, inputs=os.path.join(self.zoo, f"ipc_{size}.npz"),
                                                        report=report), f"isorun IPC {size}")
                with open(report) as f:
                    unit = json.load(f)["units"][0]
                runs[size].append({"wall_s": wall, "supervisor_peak_mib": summary_supervisor_mib(err),
                                   **{k: unit.get(k) for k in ("wall_ms", "load_ms", "run_ms", "user_ms", "sys_ms", "peak_rss_bytes")}})
        log("IPC: numpy copy of 256 MiB ...")
        _, out, _ = self.run([self.python, self.helper, "memcopy"], "memcopy")
        runs["memcopy"] = json.loads(out.strip().splitlines()[-1])
        self.results["ipc"] = runs


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def summary_supervisor_mib(stderr):
    m = re.search(r"supervisor peak memory (\d+) MiB", stderr)
    return int(m.group(1)) if m else None


def children_cpu():
    """User + system CPU seconds of every waited-for child (and their waited-for descendants)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def machine_busy():
    """CPU seconds the whole machine has spent busy (user, nice, system, irq, softirq) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def machine(repo):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = proc_meminfo_total()
    try:
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
    except OSError:
        commit, dirty = "unknown", ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem / (1024 ** 3) if mem else None,
        "kernel": platform.release(),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "python": platform.python_version(),
        "thp": thp_mode(),
    }


def thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            m = re.search(r"\[(\w+)\]", f.read())
            return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"



def proc_meminfo_total():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# --------------------------------------------------------------------------
# Analysis and BENCHMARKS.md
# --------------------------------------------------------------------------


def analyse(results, n_models):
    rounds = results["rounds"]
    names = list(rounds[0].keys())
    walls = {name: [r[name]["wall_s"] for r in rounds] for name in names}
    med = {name: median(v) for name, v in walls.items()}

    def paired(a, b, f):
        return median([f(r[a]["wall_s"], r[b]["wall_s"]) for r in rounds])

    rows = []
    for name in names:
        row = {
            "way": name,
            "runs": walls[name],
            "median_s": med[name],
            "per_model_ms": med[name] / n_models * 1e3,
            "vs_loop": paired("python loop", name, lambda a, b: a / b),
            "vs_pool": paired("python pool", name, lambda a, b: a / b),
            "overhead_ms": paired(name, "rust floor", lambda a, b: (a - b) / n_models * 1e3),
            "j2_speedup": None,
            "own_cpu_s": median([r[name].get("own_cpu_s") for r in rounds]),
            "others_cores": median([r[name].get("others_cores") for r in rounds]),
        }
        m = re.match(r"isorun (\w+) -j 2$", name)
        if m:
            row["j2_speedup"] = paired(f"isorun {m.group(1)} -j 1", name, lambda a, b: a / b)
        rows.append(row)

    units = {}
    for name in names:
        if not name.startswith("isorun"):
            continue
        all_units = [u for r in rounds for u in r[name]["units"]]
        units[name] = {k: median([u.get(k) for u in all_units]) for k in ("wall_ms", "load_ms", "run_ms", "user_ms", "sys_ms", "peak_rss_bytes")}
        units[name]["supervisor_peak_mib"] = max(r[name]["supervisor_peak_mib"] or 0 for r in rounds)
    floor_models = [m for r in rounds for m in r["rust floor"]["models"]]
    units["rust floor"] = {"load_ms": median([m["load_ms"] for m in floor_models]),
                           "wall_ms": median([m["total_ms"] for m in floor_models])}
    return rows, units


def fmt(x, spec, suffix=""):
    return "–" if x is None else f"{x:{spec}}{suffix}"


def write_markdown(path, results, args):
    n = results["n_models"]
    rows, units = analyse(results, n)
    m = results["machine"]
    by = {r["way"]: r for r in rows}
    targets = []
    ipc_info = None
    out = []
    w = out.append

    w("# Benchmarks\n")
    w("Written by `./scripts/bench` (do not edit by hand; run it again). "
      + ("**This is a `--quick` smoke run: 1 round, 10 models; not figures to quote.**\n" if args.quick else "\n"))
    w("## Machine\n")
    w(f"- CPU: {m['cpu']}, {m['cores']} cores")
    w(f"- memory: {m['memory_gib']:.1f} GiB; kernel {m['kernel']}; Python {m['python']}, tensorflow-cpu 2.21.0")
    w(f"- date: {m['date']}; isorun commit `{m['commit']}`")
    others = [r[name].get("others_cores") for r in results["rounds"] for name in r]
    others = [x for x in others if x is not None]
    if others:
        w(f"- other processes on the machine used a median of {median(others):.2f} cores (at most {max(others):.2f}) "
          f"during the timed runs (from `/proc/stat`, this bench's own processes excluded)"
          + (" — the machine was shared and busy; read medians and side-by-side ratios, not single runs"
             if median(others) > 0.25 else
             " — mostly quiet, with other work in some runs; medians and side-by-side ratios absorb that"
             if max(others) > 0.25 else " — quiet"))
    w(f"- the whole bench took {results['elapsed_s'] / 60:.1f} min\n")

    w("## How to reproduce\n")
    w("```sh")
    w("./scripts/bench             # 3 rounds; builds isorun, makes the zoo and a venv on first use")
    w("./scripts/bench --rounds 5  # more rounds")
    w("./scripts/bench --quick     # smoke test: 1 round, 10 models, written to target/bench/")
    w("```\n")
    w(f"The zoo (`{'${XDG_CACHE_HOME:-~/.cache}/isorun/bench-zoo'}`, made once): 40 distinct Keras MLPs "
      "32 → 256 → 256 → 10 (seeds 0–39) exported with `model.export`, signature `serving_default`, input "
      "`x` float32 [None, 32]; `inputs.npz` with `x` [8, 32]. Every way below runs the same "
      f"{n} models with that input once each and is timed as the wall time of the whole command "
      "(process start, imports and library loading included). The ways run one after another, in the order "
      f"of the table, {results['rounds_n']} round(s) (ABC…ABC…); a figure is the median of the rounds, and a ratio is "
      "the median of the per-round ratios of runs made side by side.\n")
    w("- **python loop**: one Python process: for each model `tf.saved_model.load`, call `serving_default` once, "
      "`del`, `tf.keras.backend.clear_session()`, `gc.collect()`.")
    w("- **python pool**: `ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1, mp_context=spawn)`, "
      "one task per model (each task a fresh interpreter importing TensorFlow).")
    w("- **isorun exec / zygote, -j 1 / -j 2**: `isorun run MODEL... --inputs inputs.npz --json -q --spawn exec|zygote -j N`.")
    w("- **rust floor**: `isorun-worker --in-process --batch 8 MODEL...`: the same C API calls, all models in one "
      "process with zero inputs, no isolation — what isolation is measured against.\n")

    w("## Time\n")
    w(f"| way | runs (s) | median (s) | per model (ms) | × faster than python loop | × faster than python pool | overhead per model over rust floor (ms) | -j 2 speedup over -j 1 | CPU it used (s) | other processes meanwhile (cores) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        floor = r["way"] == "rust floor"
        w(f"| {r['way']} | {', '.join(f'{x:.2f}' for x in r['runs'])} | {r['median_s']:.2f} | {r['per_model_ms']:.0f} | "
          f"{fmt(r['vs_loop'], '.2f', '×')} | {fmt(r['vs_pool'], '.1f', '×')} | "
          f"{'–' if floor else fmt(r['overhead_ms'], '.0f')} | {fmt(r['j2_speedup'], '.2f', '×')} | "
          f"{fmt(r['own_cpu_s'], '.1f')} | {fmt(r['others_cores'], '.2f')} |")
    w("")
    w(f"The last two columns are medians over the rounds: the user + system CPU time of the command and all its "
      f"descendants, and the CPU time every other process on the machine used during the run, divided by its wall "
      f"time (from `/proc/stat`; {m['cores']} would mean the machine was fully taken by others).\n")
    w("Where the time goes, per unit (medians over every unit of every round, from `--report`: "
      "`wall_ms` is the unit from the worker's start to its end, `load_ms` loading the SavedModel in the worker, "
      "`run_ms` the first call of the signature; the rust floor's per-model load and load + run times):\n")
    w("| way | unit wall (ms) | load (ms) | run (ms) | worker user CPU (ms) | worker sys CPU (ms) | worker peak RSS (MiB) | supervisor peak (MiB) |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, u in units.items():
        run_ms = u.get("run_ms")
        if name == "rust floor":
            run_ms = u["wall_ms"] - u["load_ms"]
        w(f"| {name} | {fmt(u.get('wall_ms'), '.0f')} | {fmt(u.get('load_ms'), '.0f')} | {fmt(run_ms, '.0f')} | "
          f"{fmt(u.get('user_ms'), '.0f')} | {fmt(u.get('sys_ms'), '.0f')} | "
          f"{fmt(u['peak_rss_bytes'] / MIB if u.get('peak_rss_bytes') else None, '.0f')} | {fmt(u.get('supervisor_peak_mib'), 'd')} |")
    w("")

    # -- memory --
    w("## Memory\n")
    sup_all = results.get("supervisor_500", [])
    sup = [x for x in sup_all if x.get("summary", True)]
    bare = [x for x in sup_all if not x.get("summary", True)]
    if sup:
        hwm = median([x["vmhwm_bytes"] for x in sup])
        early = median([x["rss_after_10pct"] for x in sup])
        late = median([x["rss_after_last"] for x in sup])
        units_n = sup[0]["units"]
        runs_text = ", ".join(f"{x['vmhwm_bytes'] / MIB:.1f}" for x in sup)
        slope = median([x.get("anon_bytes_per_unit") for x in sup])
        grows = late > early + MIB
        text = (f"**Supervisor.** `isorun run` over {units_n} units (the 40 MLPs as {units_n} hard-linked copies, "
                f"`--spawn zygote -j 2 --summary`), {len(sup)} run(s), sampled from `/proc/PID/status` after every "
                f"finished unit: peak (VmHWM) **{hwm / MIB:.1f} MiB** ({hwm / 1e6:.1f} MB; runs: {runs_text} MiB; "
                f"`--summary` says {', '.join(str(x['summary_peak_mib']) for x in sup)} MiB). "
                f"VmRSS after {max(1, units_n // 10)} units: {early / MIB:.1f} MiB; after all {units_n}: {late / MIB:.1f} MiB")
        kib = lambda b: fmt(b / 1024 if b is not None else None, ".1f")  # noqa: E731
        if grows:
            text += (f": it grows, by {kib(slope)} KiB of anonymous memory per finished unit (median slope).")
        else:
            text += " (no growth)."
        bare_flat = None
        if bare:
            b = bare[0]
            bare_flat = b["rss_after_last"] <= b["rss_after_10pct"] + MIB
            text += (f" Without `--summary` (no records kept for a summary or report) it "
                     + ("stays flat" if bare_flat else "grows too")
                     + f": {kib(b.get('anon_bytes_per_unit'))} KiB per unit, VmHWM {b['vmhwm_bytes'] / MIB:.1f} MiB "
                     f"after {b['units']} units.")
            if grows and bare_flat:
                text += (f" So the growth is the records `--summary` and `--report` keep until the end (~{kib(slope)} KiB "
                         f"each): 10,000 units with either would add ~{slope * 10000 / MIB:.0f} MiB.")
        text += (f" The 40-unit runs above peak at {max(u.get('supervisor_peak_mib') or 0 for u in units.values())} MiB "
                 "(`--summary`).\n")
        w(text)
        measured = f"{hwm / 1e6:.1f} MB after {units_n} units with `--summary`"
        if bare:
            measured += f"; {bare[0]['vmhwm_bytes'] / 1e6:.1f} MB without, " + ("flat" if bare_flat else "growing")
        targets.append(("supervisor peak RSS < 20 MB after 500 units", hwm < 20e6 and units_n >= 500, measured))
    wm = results.get("worker_memory")
    if wm:
        w("**Workers.** One `-j 1` run of each mode with `/proc/PID/smaps_rollup` of every worker sampled every 25 ms "
          "(peaks per worker, then the median over workers; a 25 ms sample can miss a short spike), and the report's "
          "`peak_rss_bytes` (the kernel's `ru_maxrss` at reaping):\n")
        w("| mode | report peak RSS (MiB) | sampled RSS (MiB) | sampled PSS (MiB) | private (MiB) | anonymous (MiB) |")
        w("|---|---:|---:|---:|---:|---:|")
        for spawn, e in wm.items():
            k = e["workers"]
            w(f"| {spawn} worker | {fmt(e['ru_maxrss_median'] / MIB if e['ru_maxrss_median'] else None, '.0f')} | "
              f"{fmt(k['Rss'] / MIB if k['Rss'] else None, '.0f')} | {fmt(k['Pss'] / MIB if k['Pss'] else None, '.0f')} | "
              f"{fmt(k['Private'] / MIB if k['Private'] is not None else None, '.0f')} | {fmt(k['Anonymous'] / MIB if k['Anonymous'] is not None else None, '.0f')} |")
            if e.get("zygote"):
                z = e["zygote"]
                w(f"| zygote (one per slot, lives for the run) | – | {z['Rss'] / MIB:.0f} | {z['Pss'] / MIB:.0f} | "
                  f"{z['Private'] / MIB:.0f} | {z['Anonymous'] / MIB:.0f} |")
        w("")
        ex, zy = wm.get("exec", {}).get("workers", {}), wm.get("zygote", {}).get("workers", {})
        zg = wm.get("zygote", {}).get("zygote") or {}

        def mi(d, k):
            return fmt(d[k] / MIB if d.get(k) is not None else None, ".0f")

        w(f"RSS counts every resident page a process maps, shared or not, so the two modes' RSS figures are not "
          f"the same measure. An exec'd worker maps libtensorflow itself and faults in the pages it uses: "
          f"{mi(ex, 'Rss')} MiB RSS, of which only {mi(ex, 'Anonymous')} MiB is anonymous memory (heap, relocated "
          f"data, the model); the rest are the library's file pages from the page cache. With one worker at a time "
          f"(-j 1) no other process maps them, so smaps calls them private and PSS is about RSS, but they are not new "
          f"memory: every exec'd worker shares the same page-cache pages. A worker forked from the zygote inherits "
          f"the zygote's loaded image copy-on-write: the file pages it touches count in its RSS "
          f"({mi(zy, 'Rss')} MiB), shared with the zygote (PSS {mi(zy, 'Pss')} MiB), and only {mi(zy, 'Private')} MiB "
          f"is its own (its {mi(zy, 'Anonymous')} MiB of anonymous memory is partly the zygote's pages, shared until "
          f"written). The zygote itself ({mi(zg, 'Rss')} MiB RSS, one per slot) lives for the whole run. "
          f"`--memory-limit` counts `RssAnon + RssShmem` for this reason: that is what a worker adds.\n")
    big = results.get("big_model")
    if big:
        py = big["python"]
        before = median([p["before"] for p in py])
        loaded = median([p["loaded"] for p in py])
        dropped = median([p["dropped"] for p in py])
        kept = median([p["dropped"] - p["before"] for p in py])
        iso_peak = median([i["peak_rss_bytes"] for i in big["isorun"]])
        iso_sup = max(i["supervisor_peak_mib"] or 0 for i in big["isorun"])
        w(f"**A {big['bytes'] / 1e6:.0f} MB model** (one dense layer, ~95M float32 weights). In one Python process "
          f"(median of {len(py)}): VmRSS {before / MIB:.0f} MiB before `tf.saved_model.load`, {loaded / MIB:.0f} MiB "
          f"after loading and one call, **{dropped / MIB:.0f} MiB after `del` + `clear_session()` + `gc.collect()`**: "
          f"the process keeps **{kept / MIB:.0f} MiB ({kept / 1e6:.0f} MB)** it no longer uses. Through isorun "
          f"(`--spawn zygote -j 1`) the worker peaks at {iso_peak / MIB:.0f} MiB RSS and gives all of it back when it "
          f"exits; the supervisor peaks at {iso_sup} MiB.\n")

    # -- IPC --
    ipc = results.get("ipc")
    if ipc:
        big_runs, tiny_runs = ipc["big"], ipc["tiny"]
        size = 64 * 1024 * 1024 * 4
        total_delta = median([b["wall_s"] - t["wall_s"] for b, t in zip(big_runs, tiny_runs)])
        unit_delta = median([(b["wall_ms"] - t["wall_ms"]) / 1e3 for b, t in zip(big_runs, tiny_runs)])
        run_delta = median([(b["run_ms"] - t["run_ms"]) / 1e3 for b, t in zip(big_runs, tiny_runs)])
        warm = median(ipc["memcopy"]["warm_s"])
        fresh = median(ipc["memcopy"]["fresh_s"])
        speed = lambda s: size / s / 1e9 if s and s > 0 else None  # noqa: E731
        w("## IPC: a 256 MiB input\n")
        w(f"`isorun run ipc/reduce_sum --inputs X.npz --spawn zygote -j 1`, where the model returns `reduce_sum(x)` "
          f"(a scalar, so only the way in is measured) and `x` is float32 [67108864] (256 MiB) or [16]; "
          f"{len(big_runs)} pairs, run alternately; the figure is the median of the paired differences. isorun "
          "reads the `.npz`, places inputs ≥ 64 KiB in shared memory once (`IpcSharedMemory`), and the worker maps "
          "it and hands it to TensorFlow (the worker's TF_Tensor borrows the mapping, `TF_NewTensor`, rather than "
          "copying it). The target is judged end to end, on the whole command, as a user sees it.\n")
        w("| measure | 256 MiB input | 16 elements | difference (s) | effective GB/s |")
        w("|---|---:|---:|---:|---:|")
        w(f"| whole command (s; reading the .npz included) | {median([b['wall_s'] for b in big_runs]):.3f} | "
          f"{median([t['wall_s'] for t in tiny_runs]):.3f} | {total_delta:.3f} | {fmt(speed(total_delta), '.2f')} |")
        w(f"| unit: worker start → finished (s) | {median([b['wall_ms'] for b in big_runs]) / 1e3:.3f} | "
          f"{median([t['wall_ms'] for t in tiny_runs]) / 1e3:.3f} | {unit_delta:.3f} | {fmt(speed(unit_delta), '.2f')} |")
        w(f"| worker `run_ms`: the signature call, `reduce_sum` over the input (s) | {median([b['run_ms'] for b in big_runs]) / 1e3:.3f} | "
          f"{median([t['run_ms'] for t in tiny_runs]) / 1e3:.3f} | {run_delta:.3f} | {fmt(speed(run_delta), '.2f')} |")
        w(f"| numpy `np.copyto` of 256 MiB into a written buffer (s) | {warm:.3f} | | | {speed(warm):.2f} |")
        w(f"| numpy copy of 256 MiB into a new array (page faults included) (s) | {fresh:.3f} | | | {speed(fresh):.2f} |")
        w("")
        ratio_unit = warm / unit_delta if unit_delta > 0 else None
        ratio_total = warm / total_delta if total_delta > 0 else None
        prep = total_delta - unit_delta
        sup_big = median([b.get("supervisor_peak_mib") for b in big_runs])
        worker_extra = median([b["peak_rss_bytes"] - t["peak_rss_bytes"] for b, t in zip(big_runs, tiny_runs)
                               if b.get("peak_rss_bytes") and t.get("peak_rss_bytes")])
        w(f"End to end, a 256 MiB input adds **{total_delta:.3f} s** to the command: **{fmt(speed(total_delta), '.2f')} "
          f"GB/s, {fmt(ratio_total, '.2f')}× the speed of a plain `np.copyto`** (a copy into fresh memory runs at "
          f"{speed(fresh):.2f} GB/s). Of that, {prep:.3f} s pass in the supervisor before the worker starts (reading "
          f"the `.npz`, filling the shared memory); the unit itself takes only {unit_delta:.3f} s longer "
          f"({fmt(speed(unit_delta), '.2f')} GB/s, {fmt(ratio_unit, '.2f')}× `np.copyto`'s speed), `reduce_sum` "
          f"reading all 256 MiB included.\n")
        w(f"Memory: with the 256 MiB input the supervisor peaks at {fmt(sup_big, '.0f')} MiB (`--summary`): it "
          f"holds the array read from the `.npz` and its shared-memory copy at once while preparing the inputs. "
          f"The worker's peak RSS is {fmt(worker_extra / MIB if worker_extra is not None else None, '.0f')} MiB "
          f"higher than with the tiny input: "
          + ("about one input's worth, the mapped shared memory itself (no private copy)."
             if worker_extra is not None and worker_extra < 1.5 * size else
             "about two inputs' worth: the mapped shared memory and a copy of it.") + "\n")
        ipc_info = {"total_delta": total_delta, "unit_delta": unit_delta, "run_delta": run_delta,
                    "warm": warm, "fresh": fresh, "sup_big": sup_big, "prep": prep}
        targets.append(("a 256 MB tensor reaches the worker at ≥ half the speed of a memory copy",
                        ratio_total is not None and ratio_total >= 0.5,
                        f"whole command {fmt(ratio_total, '.2f')}× of `np.copyto` ({fmt(speed(total_delta), '.2f')} vs "
                        f"{speed(warm):.2f} GB/s); the unit alone {fmt(ratio_unit, '.2f')}×"))

    # -- targets --
    z1 = by.get("isorun zygote -j 1")
    z2 = by.get("isorun zygote -j 2")
    e1 = by.get("isorun exec -j 1")
    timing_targets = []
    if z1:
        timing_targets.append(("isorun `-j 1` ≥ 2× faster than the Python in-process loop", z1["vs_loop"] >= 2,
                               f"zygote {z1['vs_loop']:.2f}×, exec {e1['vs_loop']:.2f}×"))
        timing_targets.append(("isorun `-j 1` ≥ 15× faster than the Python pool", z1["vs_pool"] >= 15,
                               f"zygote {z1['vs_pool']:.1f}×, exec {e1['vs_pool']:.1f}×"))
        timing_targets.append(("isolation overhead ≤ 60 ms per model over the Rust floor", z1["overhead_ms"] <= 60,
                               f"zygote -j 1 {z1['overhead_ms']:.0f} ms, exec -j 1 {e1['overhead_ms']:.0f} ms"))
    if z2:
        e2 = by["isorun exec -j 2"]
        timing_targets.append(("`-j 2` ≥ 1.7× faster than `-j 1`", z2["j2_speedup"] >= 1.7,
                               f"zygote {z2['j2_speedup']:.2f}×, exec {e2['j2_speedup']:.2f}×"))
    targets = timing_targets + targets
    w("## Targets\n")
    w("Benchmark figures, not tests; judged on the default mode (`--spawn zygote`), exec shown alongside.\n")
    w("| target | measured | |")
    w("|---|---|---|")
    for name, ok, measured in targets:
        w(f"| {name} | {measured} | {'met' if ok else '**missed**'} |")
    w("")
    results["targets"] = [{"target": t, "met": bool(ok), "measured": m} for t, ok, m in targets]

    missed = {name for name, ok, _ in targets if not ok}
    if missed:
        w("## What bounds it\n")
        bounds(w, missed, results, rows, units, ipc_info, n)

    if args.notes and os.path.exists(args.notes):
        with open(args.notes) as f:
            w(f.read().rstrip() + "\n")

    with open(path, "w") as f:
        f.write("\n".join(out))
    return targets


def bounds(w, missed, results, rows, units, ipc, n):
    """One paragraph per missed target, from the measurements."""
    by = {r["way"]: r for r in rows}
    cores = results["machine"]["cores"]
    others = [r[name].get("others_cores") for r in results["rounds"] for name in r]
    others = [x for x in others if x is not None]
    busy = (f" The machine was shared: other processes used a median of {median(others):.2f} (up to "
            f"{max(others):.2f}) of its {cores} cores during the timed runs, so every way got a varying share of the "
            "CPUs." if others and median(others) > 0.25 else "")
    floor_first = median([r["rust floor"]["models"][0]["total_ms"] for r in results["rounds"] if r["rust floor"]["models"]])
    z1, f = units.get("isorun zygote -j 1"), units.get("rust floor")
    e1 = units.get("isorun exec -j 1")
    if any(m.startswith("isolation overhead") for m in missed) and z1 and f:
        other = z1["wall_ms"] - z1["load_ms"] - z1["run_ms"]
        w(f"**Isolation overhead** ({by['isorun zygote -j 1']['overhead_ms']:.0f} ms per model with the zygote, "
          f"{by['isorun exec -j 1']['overhead_ms']:.0f} ms with exec). A zygote unit takes {z1['wall_ms']:.0f} ms "
          f"(median): {z1['load_ms']:.0f} ms loading the SavedModel, {z1['run_ms']:.0f} ms for the first call, "
          f"{other:.0f} ms for fork, handshake, sending the request and reaping. The floor loads a model in "
          f"{f['load_ms']:.0f} ms and runs it in {f['wall_ms'] - f['load_ms']:.0f} ms, but only because its process is "
          f"warm: its *first* model costs {fmt(floor_first, '.0f')} ms. A forked worker is a first model every time: "
          "the zygote has only loaded libtensorflow (it must stay single-threaded to fork safely), so each worker "
          "pays TensorFlow's one-time set-up again. (A `perf` profile of zygote workers, taken while writing this "
          "bench, shows where: the dynamic linker resolving libtensorflow's lazily bound symbols, ~10% of worker "
          "CPU; oneDNN generating its JIT GEMM kernels (Xbyak), ~9%; kernel-registry lookups, ~4%; and malloc-heavy "
          "graph and session construction, plus first-touch page faults.) Spawning "
          "and IPC themselves are small; that per-process warm-up is what the overhead is. "
          + (f"Exec adds ~{e1['wall_ms'] - z1['wall_ms']:.0f} ms more per unit (loading and relocating the ~790 MB "
             "library in every worker). " if e1 else "")
          + "Closing the gap needs a warmer zygote (whatever single-threaded TensorFlow set-up can be done before "
          "fork) or `--models-per-worker N`, which trades isolation for the floor's warm process." + busy + "\n")
    if any(m.startswith("`-j 2`") for m in missed):
        lines = []
        for spawn in ("zygote", "exec"):
            u1, u2 = units.get(f"isorun {spawn} -j 1"), units.get(f"isorun {spawn} -j 2")
            if u1 and u2:
                lines.append(f"{spawn}: a unit takes {u1['wall_ms']:.0f} ms of wall time and {u1['user_ms'] + u1['sys_ms']:.0f} ms "
                             f"of worker CPU at -j 1, {u2['wall_ms']:.0f} ms and {u2['user_ms'] + u2['sys_ms']:.0f} ms at -j 2")
        w(f"**-j 2** ({by['isorun zygote -j 2']['j2_speedup']:.2f}× with the zygote). The work is CPU-bound and the "
          f"machine has {cores} cores, so 2× is the ceiling, reached only if nothing else runs: "
          + "; ".join(lines) + ". A unit at -j 2 gets one intra-op thread instead of two and shares the cores "
          "with the other worker, the supervisor, the zygotes (one per slot) and whatever else runs on the "
          f"machine: other processes used {fmt(by['isorun zygote -j 1'].get('others_cores'), '.2f')} cores during "
          f"the zygote -j 1 runs and {fmt(by['isorun zygote -j 2'].get('others_cores'), '.2f')} during the -j 2 runs "
          "(medians). Where the per-unit CPU time stays the same and the wall time per unit doubles, the second "
          "core was not there to be had." + busy + "\n")
    if any(m.startswith("supervisor") for m in missed):
        w("**Supervisor memory**: see the figures above; it is measured from `/proc/PID/status` after every unit.\n")
    if any(m.startswith("a 256 MB") for m in missed) and ipc:
        need = 2 * ipc["warm"]
        w(f"**IPC.** A plain copy between two buffers already written runs at {256 * MIB / ipc['warm'] / 1e9:.1f} GB/s; "
          f"into fresh memory, paying a page fault per 4 KiB page (transparent huge pages: "
          f"`{results['machine'].get('thp', '?')}`), {256 * MIB / ipc['fresh'] / 1e9:.1f} GB/s. Half the speed of "
          f"`np.copyto` leaves {need:.3f} s for 256 MiB; isorun takes {ipc['total_delta']:.3f} s, of which "
          f"{ipc['prep']:.3f} s in the supervisor before any worker is involved: it reads the `.npz` entry into a "
          f"`Vec` that grows as the bytes arrive (a kernel copy from the page cache into fresh pages, the zip CRC "
          f"checked on the way), then copies that into a fresh shared-memory region (a second copy into fresh "
          f"pages), holding both at once (a {fmt(ipc.get('sup_big'), '.0f')} MiB supervisor peak). The worker's "
          f"part, {ipc['unit_delta']:.3f} s, is small now that its TF_Tensor borrows the mapping. Reading the "
          f"array straight into the shared-memory region (the `.npy` header gives the size, bounded by the zip "
          f"entry's) would drop one copy, one set of page faults and half the supervisor's peak; even then one "
          f"read into fresh pages (~{256 * MIB / ipc['fresh'] / 1e9:.1f} GB/s here) is at best ~"
          f"{ipc['warm'] / ipc['fresh']:.2f}× of `np.copyto`, so a 0.5× target measured end to end from a file "
          f"needs a file-backed mapping or huge pages as well.\n")


# --------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--zoo", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", required=True)
    parser.add_argument("--results", required=True, help="raw measurements, JSON")
    parser.add_argument("--notes", help="a Markdown file appended to the output (analysis written by hand)")
    parser.add_argument("--only-write", action="store_true", help="rewrite the output from --results, measure nothing")
    args = parser.parse_args()

    if args.only_write:
        with open(args.results) as f:
            results = json.load(f)
        args.quick = results.get("quick", False)
    else:
        started = time.perf_counter()
        bench = Bench(args)
        bench.results.update(machine=machine(bench.repo), quick=args.quick, rounds_n=args.rounds,
                             n_models=len(bench.models))
        bench.warm_up()
        bench.timing_rounds()
        bench.supervisor_500()
        bench.worker_memory()
        bench.big_model_memory()
        bench.ipc()
        results = bench.results
        results["elapsed_s"] = time.perf_counter() - started
        shutil.rmtree(bench.work, ignore_errors=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "w") as f:
            json.dump(results, f, indent=1)

    targets = write_markdown(args.output, results, args)
    with open(args.results, "w") as f:
        json.dump(results, f, indent=1)
    with open(args.output) as f:
        text = f.read()
    start = text.index("## Time")
    print(text[start:], file=sys.stderr)
    log(f"wrote {args.output} (raw measurements: {args.results}); {sum(ok for _, ok, _ in targets)}/{len(targets)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
