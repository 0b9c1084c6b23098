"""scripts/bench's driver: runs every way side by side and writes BENCHMARKS.md.

Started by scripts/bench (which builds isorun and provides the interpreter);
see `scripts/bench --help`. The Python side (zoo, Python ways) is in
scripts/bench_models.py. Only the standard library is used here.
"""

import argparse
import json
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
from benchlib import children_cpu, log, machine, machine_busy  # noqa: E402

MIB = 1024 * 1024


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


def peaks(samples):
    """pid -> {"zygote", "Rss", "Pss", "Private", "Anonymous"}: each process's
    peaks over a SlotSampler's series."""
    out = {}
    for _, procs in samples:
        for p in procs:
            entry = out.setdefault(p["pid"], {"zygote": p["zygote"], "Rss": 0, "Pss": 0, "Private": 0, "Anonymous": 0})
            for k in ("Rss", "Pss", "Private", "Anonymous"):
                entry[k] = max(entry[k], p[k])
    return out


def proc_stat(pid):
    """(state, start time in clock ticks since boot, user + system CPU ticks)
    from /proc/PID/stat, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state; utime, stime are 14, 15; starttime 22.
    return fields[0], int(fields[19]), int(fields[11]) + int(fields[12])


def descendants(root):
    """(pid, depth) of every descendant of root."""
    kids, _ = children_map()
    todo, seen = [(pid, 1) for pid in kids.get(root, [])], []
    while todo:
        pid, depth = todo.pop()
        seen.append((pid, depth))
        todo.extend((kid, depth + 1) for kid in kids.get(pid, []))
    return seen


class SlotSampler(threading.Thread):
    """Samples every descendant of a supervisor every `period` s and keeps
    the whole series: for each live process at each sample, whether it is
    the zygote, its start time, its CPU ticks so far and its Rss, Pss and
    private memory (smaps_rollup). Tells spares from the worker running the
    unit afterwards (`spare_memory`)."""

    def __init__(self, root_pid, period=0.025):
        super().__init__(daemon=True)
        self.root, self.period = root_pid, period
        self.samples = []  # [(t, [{"pid", "zygote", "start", "cpu", "Rss", "Pss", "Private", "Anonymous"}])]
        self.zygotes = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            t = time.perf_counter()
            procs = []
            for pid, depth in descendants(self.root):
                if pid not in self.zygotes:
                    self.zygotes[pid] = depth == 1 and b"--zygote" in cmdline(pid)
                st = proc_stat(pid)
                s = smaps_rollup(pid)
                if not st or not s or st[0] == "Z":
                    continue
                procs.append({"pid": pid, "zygote": self.zygotes[pid], "start": st[1], "cpu": st[2],
                              "Rss": s.get("Rss", 0), "Pss": s.get("Pss", 0), "Anonymous": s.get("Anonymous", 0),
                              "Private": s.get("Private_Clean", 0) + s.get("Private_Dirty", 0)})
            self.samples.append((t, procs))
            self.stop.wait(self.period)


def spare_memory(samples):
    """From a SlotSampler's series: the memory of spares while they wait and
    the slot's total (zygote + workers + spares) over the run.

    At -j 1 the slot's units run in the order their workers were forked, so
    at each sample the oldest live worker is the one running (or just
    finishing) a unit and every younger one is a spare. A spare's memory
    while it waits is taken at the last sample before it became the oldest,
    i.e. just before it got its unit (warmed up by then unless its unit had
    to wait for it: see the report's `spare.waited_ms`)."""
    last_as_spare = {}  # pid -> {"Rss", "Pss", "Private"} at its last sample as a spare
    served = set()  # pids seen as the oldest worker
    totals = []  # per sample with a worker: sums over zygote + workers
    spares_live = []
    for _, procs in samples:
        workers = sorted((p for p in procs if not p["zygote"]), key=lambda p: (p["start"], p["pid"]))
        for i, p in enumerate(workers):
            if i == 0:
                served.add(p["pid"])
            elif p["pid"] not in served:
                last_as_spare[p["pid"]] = {k: p[k] for k in ("Rss", "Pss", "Private")}
        if workers:
            spares_live.append(len(workers) - 1)
            totals.append({k: sum(p[k] for p in procs) for k in ("Rss", "Pss", "Private")})
    waiting = [m for pid, m in last_as_spare.items() if pid in served]
    return {
        "waiting_spares": len(waiting),
        "waiting": {k: median([w[k] for w in waiting]) for k in ("Rss", "Pss", "Private")},
        "spares_live_median": median(spares_live),
        "spares_live_max": max(spares_live) if spares_live else None,
        "total_peak": {k: max((t[k] for t in totals), default=None) for k in ("Rss", "Pss", "Private")},
        "total_median": {k: median([t[k] for t in totals]) for k in ("Rss", "Pss", "Private")},
        "samples": len(totals),
        "interval_s": ((samples[-1][0] - samples[0][0]) / (len(samples) - 1)) if len(samples) > 1 else None,
    }


# --------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------

# The isorun ways of the time table: (spawn, jobs, spares); spares None for
# exec (spares fork from a zygote). -j 1 --spares 2 and -j 2 --spares 0 are
# the defaults on a 2-core machine; -j 2 --spares 1 shows what a spare costs
# when every CPU is busy.
ISORUN_WAYS = [("exec", 1, None), ("exec", 2, None), ("zygote", 1, 0), ("zygote", 1, 2), ("zygote", 2, 0),
               ("zygote", 2, 1)]
# Which -j 1 way each -j 2 way's speedup is measured against.
JOBS_PAIRS = {"isorun exec -j 2": "isorun exec -j 1",
              "isorun zygote -j 2 --spares 0": "isorun zygote -j 1 --spares 0",
              "isorun zygote -j 2 --spares 1": "isorun zygote -j 1 --spares 2"}
Z1_ON, Z1_OFF = "isorun zygote -j 1 --spares 2", "isorun zygote -j 1 --spares 0"
Z2_OFF, Z2_ON = "isorun zygote -j 2 --spares 0", "isorun zygote -j 2 --spares 1"
E1, E2 = "isorun exec -j 1", "isorun exec -j 2"
UNIT_KEYS = ("wall_ms", "load_ms", "run_ms", "user_ms", "sys_ms", "peak_rss_bytes")
PIPE_REQUESTS = 1000
NPY_BIG_BYTES = 1024 * MIB


def way_name(spawn, jobs, spares):
    return f"isorun {spawn} -j {jobs}" + ("" if spares is None else f" --spares {spares}")


class Bench:
    def __init__(self, args):
        self.args = args
        self.repo = os.path.abspath(args.repo)
        self.isorun = os.path.join(self.repo, "target/release/isorun")
        self.worker = os.path.join(self.repo, "target/release/isorun-worker")
        self.python = args.python
        self.helper = os.path.join(self.repo, "scripts/bench_models.py")
        self.zoo = os.path.abspath(args.zoo)
        # isorun's own settings from the environment would change what the ways
        # measure (each passes its flags, and the default ways need defaults).
        self.env = {k: v for k, v in os.environ.items() if k not in ("ISORUN_SPAWN", "ISORUN_SPARES", "ISORUN_JOBS")}
        self.env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        self.work = tempfile.mkdtemp(prefix="isorun-bench-")
        n = 10 if args.quick else 40
        mlp = os.path.join(self.zoo, "mlp40")
        self.models = [os.path.join(mlp, m) for m in sorted(os.listdir(mlp))][:n]
        self.inputs = os.path.join(self.zoo, "inputs.npz")
        self.results = {"rounds": [], "loadavg": [], "read_mb": []}
        # The files every way reads, read into the page cache before each
        # timed run (this host takes file pages back within a minute):
        # Python's TensorFlow as its import maps it, isorun's libtensorflow
        # and binaries, and whatever paths the command names.
        self.warm = bench_host.way_files(self.python, self.repo, self.isorun) + [self.inputs]

    # -- running things -----------------------------------------------------

    def run(self, cmd, what, capture=True):
        """Runs cmd to the end; returns (wall seconds, stdout, stderr). Fails loudly."""
        bench_host.warm(self.warm + [a for a in cmd if isinstance(a, str) and a.startswith("/") and os.path.exists(a)])
        read_before = bench_host.disk_read_bytes()
        cpu_before, busy_before = children_cpu(), machine_busy()
        started = time.perf_counter()
        p = subprocess.run(cmd, env=self.env, stdin=subprocess.DEVNULL, capture_output=capture, text=True)
        wall = time.perf_counter() - started
        self.results["read_mb"].append((bench_host.disk_read_bytes() - read_before) / 1e6)
        own = children_cpu() - cpu_before
        # The CPU time everything else on the machine used meanwhile, in cores.
        self.last_cpu = {"own_cpu_s": own, "others_cores": max(0.0, machine_busy() - busy_before - own) / wall}
        if p.returncode != 0:
            tail = (p.stderr or "")[-3000:]
            raise SystemExit(f"bench: {what} failed with exit code {p.returncode}:\n{tail}")
        return wall, p.stdout or "", p.stderr or ""

    def isorun_cmd(self, models, spawn, jobs, inputs=None, report=None, spares=None):
        cmd = [self.isorun, "run", *models, "--inputs", inputs or self.inputs, "--json", "-q",
               "--spawn", spawn, "-j", str(jobs), "--summary"]
        if spares is not None:
            cmd += ["--spares", str(spares)]
        if report:
            cmd += ["--report", report]
        return cmd

    def isorun_timed(self, spawn, jobs, spares):
        name = way_name(spawn, jobs, spares)
        report = os.path.join(self.work, f"report-{spawn}-{jobs}-{spares}.json")
        wall, _, err = self.run(self.isorun_cmd(self.models, spawn, jobs, report=report, spares=spares), name)
        with open(report) as f:
            units = json.load(f)["units"]
        return {
            "wall_s": wall,
            "supervisor_peak_mib": summary_supervisor_mib(err),
            "units": [{**{k: u.get(k) for k in UNIT_KEYS}, "spare": u.get("spare")} for u in units],
        }

    def ways(self):
        """name -> function returning a measurement dict with wall_s; in run order."""
        py = [self.python, self.helper]
        ways = {
            "python loop": lambda: {"wall_s": self.run(py + ["loop", self.inputs, *self.models], "python loop")[0]},
            "python pool": lambda: {"wall_s": self.run(py + ["pool", self.inputs, *self.models], "python pool")[0]},
        }
        for spawn, jobs, spares in ISORUN_WAYS:
            ways[way_name(spawn, jobs, spares)] = (lambda s=spawn, j=jobs, k=spares: self.isorun_timed(s, j, k))
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
        """Per-worker memory, exec vs zygote with spares off and on, and what
        spares add to the slot: one -j 1 run each, every descendant's
        /proc/PID/smaps_rollup sampled every 25 ms."""
        out = {}
        for spawn, spares in (("exec", None), ("zygote", 0), ("zygote", 2)):
            name = spawn if spares is None else f"zygote --spares {spares}"
            log(f"worker memory: isorun --spawn {spawn} -j 1{'' if spares is None else f' --spares {spares}'}, "
                "sampling /proc every 25 ms ...")
            report = os.path.join(self.work, f"mem-{spawn}-{spares}.json")
            cmd = self.isorun_cmd(self.models, spawn, 1, report=report, spares=spares)
            p = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            sampler = SlotSampler(p.pid)
            sampler.start()
            err = p.communicate()[1]
            sampler.stop.set()
            sampler.join()
            if p.returncode != 0:
                raise SystemExit(f"bench: isorun --spawn {spawn} failed:\n{err[-3000:]}")
            with open(report) as f:
                units = json.load(f)["units"]
            per_pid = peaks(sampler.samples)
            workers = [e for e in per_pid.values() if not e["zygote"] and e["Rss"] > 0]
            zygotes = [e for e in per_pid.values() if e["zygote"] and e["Rss"] > 0]
            out[name] = {
                "spawn": spawn,
                "spares": spares,
                "units": len(units),
                "units_in_spares": sum(1 for u in units if u.get("spare")),
                "ru_maxrss_median": median([u.get("peak_rss_bytes") for u in units]),
                "sampled_workers": len(workers),
                "workers": {k: median([w[k] for w in workers]) for k in ("Rss", "Pss", "Private", "Anonymous")},
                "zygote": {k: max([z[k] for z in zygotes]) for k in ("Rss", "Pss", "Private", "Anonymous")} if zygotes else None,
                "slot": spare_memory(sampler.samples),
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

    def one_model(self):
        """One model end to end, as in a shell pipeline: `isorun run m00` with
        the default spawn mode, --spawn exec and --spawn zygote, and `python -c`
        loading and calling the same model once; 5 alternating rounds (2 with
        --quick: `python -c` takes seconds)."""
        rounds = 2 if self.args.quick else 5
        model = self.models[0]
        code = ("import os, sys; os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2'); "
                "import numpy as np, tensorflow as tf; d = np.load(sys.argv[2]); "
                "m = tf.saved_model.load(sys.argv[1]); "
                "y = m.signatures['serving_default'](**{k: tf.constant(d[k]) for k in d.files}); "
                "print({k: v.shape for k, v in y.items()})")
        ways = {
            "isorun (default)": [self.isorun, "run", model, "--inputs", self.inputs],
            "isorun --spawn exec": [self.isorun, "run", model, "--inputs", self.inputs, "--spawn", "exec"],
            "isorun --spawn zygote": [self.isorun, "run", model, "--inputs", self.inputs, "--spawn", "zygote"],
            "python -c": [self.python, "-c", code, model, self.inputs],
        }
        runs = []
        for r in range(rounds):
            round_ = {}
            for name, cmd in ways.items():
                round_[name] = self.run(cmd, f"one model: {name}")[0]
            runs.append(round_)
            log(f"one model {r + 1}/{rounds}: " + ", ".join(f"{k} {v:.2f} s" for k, v in round_.items()))
        self.results["one_model"] = {"model": os.path.basename(model), "rounds": runs}

    def npy_input(self):
        """A 1 GiB .npy input (`--input x=ipc_1g.npy`) against a 16-element one:
        the supervisor's peak memory (`--summary`, and VmHWM read from /proc
        until it exits) and the effective speed end to end."""
        model = os.path.join(self.zoo, "ipc", "reduce_sum")
        runs = {"big": [], "tiny": []}
        files = {"big": os.path.join(self.zoo, "ipc_1g.npy"), "tiny": os.path.join(self.zoo, "ipc_16.npy")}
        log("1 GiB .npy: one run not measured (the file into the page cache) ...")
        self.run([self.isorun, "run", model, "--input", f"x={files['big']}", "--json", "-q"], "1 GiB .npy warm-up")
        for r in range(self.args.rounds):
            for size in ("big", "tiny"):
                log(f"1 GiB .npy {r + 1}/{self.args.rounds}: {'1 GiB' if size == 'big' else '16-element'} input ...")
                report = os.path.join(self.work, f"npy-{size}.json")
                cmd = [self.isorun, "run", model, "--input", f"x={files[size]}", "--json", "-q", "--summary",
                       "--report", report]
                started = time.perf_counter()
                p = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
                hwm = [0]
                done = threading.Event()

                def watch(pid=p.pid, hwm=hwm, done=done):
                    while not done.is_set():
                        hwm[0] = max(hwm[0], proc_status(pid).get("VmHWM", 0))
                        done.wait(0.005)

                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
                err = p.communicate()[1]
                wall = time.perf_counter() - started
                done.set()
                watcher.join()
                if p.returncode != 0:
                    raise SystemExit(f"bench: isorun --input x={files[size]} failed:\n{err[-3000:]}")
                with open(report) as f:
                    unit = json.load(f)["units"][0]
                if unit.get("status") != "ok":
                    raise SystemExit(f"bench: isorun --input x={files[size]}: unit {unit.get('status')}")
                runs[size].append({"wall_s": wall, "supervisor_peak_mib": summary_supervisor_mib(err),
                                   "vmhwm_bytes": hwm[0], **{k: unit.get(k) for k in UNIT_KEYS}})
        runs["bytes"] = os.path.getsize(files["big"])
        self.results["npy"] = runs

    def pipe(self):
        """`isorun pipe m00` answering PIPE_REQUESTS lines of x [8, 32] against
        the in-process floor running the same signature as many times
        (`isorun-worker --in-process --repeat N`), alternating; then the cost
        of a restart after the worker is SIGKILLed between two requests."""
        model = self.models[0]
        with open(self.inputs_json()) as f:
            x = json.load(f)
        requests = os.path.join(self.work, "requests.jsonl")
        with open(requests, "w") as f:
            for i in range(PIPE_REQUESTS):
                f.write(json.dumps({"id": i, "inputs": {"x": x}}) + "\n")
        out = {"requests": PIPE_REQUESTS, "pipe": [], "floor": [], "restart": {}}
        for r in range(self.args.rounds):
            log(f"pipe {r + 1}/{self.args.rounds}: {PIPE_REQUESTS} requests through isorun pipe, then the floor ...")
            out["pipe"].append(self.pipe_rate(model, requests))
            wall, text, _ = self.run([self.worker, "--in-process", "--batch", "8", "--repeat", str(PIPE_REQUESTS), model],
                                     "isorun-worker --in-process --repeat")
            m = re.search(r"\trepeat (\d+) runs\t([\d.]+) s\tfirst ([\d.]+) ms$", text, re.M)
            if not m:
                raise SystemExit(f"bench: no repeat line from isorun-worker --in-process:\n{text[-2000:]}")
            out["floor"].append({"wall_s": wall, "runs": int(m.group(1)), "total_s": float(m.group(2)),
                                 "first_ms": float(m.group(3))})
        for spawn in ("auto", "exec"):
            log(f"pipe restart: SIGKILL the worker between requests (--spawn {spawn}) ...")
            out["restart"][spawn] = self.pipe_restart(model, x, spawn, kills=3 if self.args.quick else 10)
        self.results["pipe"] = out

    def inputs_json(self):
        """inputs.npz's x as nested lists (JSON), for pipe's request lines."""
        path = os.path.join(self.work, "x.json")
        if not os.path.exists(path):
            self.run([self.python, "-c", "import json, sys, numpy as np; "
                      "json.dump(np.load(sys.argv[1])['x'].tolist(), open(sys.argv[2], 'w'))", self.inputs, path],
                     "inputs.npz to JSON")
        return path

    def pipe_rate(self, model, requests):
        """Whole command wall time and the steady rate: answers 2..N over the
        time from the first answer to the last (the first includes starting
        the worker and loading the model)."""
        started = time.perf_counter()
        with open(requests) as stdin:
            p = subprocess.Popen([self.isorun, "pipe", model], env=self.env, stdin=stdin, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            stamps, errors = [], 0
            for line in p.stdout:
                stamps.append(time.perf_counter())
                if '"error"' in line:
                    errors += 1
            err = p.stderr.read()
            code = p.wait()
        wall = time.perf_counter() - started
        if code != 0 or errors or len(stamps) != PIPE_REQUESTS:
            raise SystemExit(f"bench: isorun pipe: exit {code}, {len(stamps)} answers, {errors} errors:\n{err[-3000:]}")
        return {"wall_s": wall, "first_s": stamps[0] - started, "steady_s": stamps[-1] - stamps[0]}

    def pipe_restart(self, model, x, spawn, kills):
        """One `isorun pipe` session fed a line at a time: a few normal requests,
        then SIGKILL its worker (the pipe's descendant that is not the
        zygote), wait until it is gone, and time the next request's answer;
        `kills` times."""
        line = json.dumps({"id": 0, "inputs": {"x": x}}) + "\n"
        p = subprocess.Popen([self.isorun, "pipe", model, "--spawn", spawn, "--max-restarts", str(kills + 1)],
                             env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, bufsize=1)

        def ask(may_fail=False):
            """(seconds to the answer, its error kind or None)."""
            t = time.perf_counter()
            p.stdin.write(line)
            p.stdin.flush()
            answer = p.stdout.readline()
            took = time.perf_counter() - t
            if '"outputs"' in answer:
                return took, None
            if may_fail and '"error"' in answer:
                return took, json.loads(answer)["error"].get("kind")
            p.kill()
            raise SystemExit(f"bench: isorun pipe answered {answer.strip()!r}:\n{p.stderr.read()[-3000:]}")

        normal, after_kill, failed, starts = [], [], [], []
        try:
            ask()  # the first: starts the worker, loads the model
            for _ in range(kills):
                normal.extend(ask()[0] for _ in range(5))
                workers = [pid for pid, depth in descendants(p.pid)
                           if not (depth == 1 and b"--zygote" in cmdline(pid))]
                if len(workers) != 1:
                    raise SystemExit(f"bench: isorun pipe: expected one worker, found {workers}")
                starts.append("fork" if b"--zygote" in cmdline(workers[0]) else "exec")
                os.kill(workers[0], 9)
                # Gone: reaped, or a zombie with no thread left (a zombie leader
                # whose TensorFlow threads are still exiting is not dead yet: a
                # request sent then meets a dying worker).
                while not gone_or_zombie(workers[0]):
                    time.sleep(0.001)
                # The request right after the kill may meet the dead worker's
                # socket and get an error line; the one after it then starts
                # the fresh worker. Both are kept: their sum is what a client
                # waits from the kill to its next answer.
                took, error = ask(may_fail=True)
                if error is None:
                    after_kill.append(took)
                    failed.append(None)
                else:
                    failed.append({"kind": error, "s": took})
                    after_kill.append(ask()[0])
        finally:
            p.stdin.close()
            p.wait()
        return {"normal_s": normal, "after_kill_s": after_kill, "failed_after_kill": failed,
                "killed_worker_start": starts}


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def gone_or_zombie(pid):
    """True once pid is reaped, or a zombie whose every thread has exited."""
    stat = proc_stat(pid)
    if stat is None:
        return True
    try:
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return True
    return stat[0] == "Z" and threads <= 1


def summary_supervisor_mib(stderr):
    m = re.search(r"supervisor peak memory (\d+) MiB", stderr)
    return int(m.group(1)) if m else None


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
            "vs_floor": paired(name, "rust floor", lambda a, b: a / b),
            "j2_speedup": None,
            "own_cpu_s": median([r[name].get("own_cpu_s") for r in rounds]),
            "others_cores": median([r[name].get("others_cores") for r in rounds]),
        }
        if name in JOBS_PAIRS and JOBS_PAIRS[name] in names:
            row["j2_speedup"] = paired(JOBS_PAIRS[name], name, lambda a, b: a / b)
        rows.append(row)

    units = {}
    for name in names:
        if not name.startswith("isorun"):
            continue
        all_units = [u for r in rounds for u in r[name]["units"]]
        units[name] = {k: median([u.get(k) for u in all_units]) for k in UNIT_KEYS}
        units[name]["supervisor_peak_mib"] = max(r[name]["supervisor_peak_mib"] or 0 for r in rounds)
        in_spares = [u["spare"] for u in all_units if u.get("spare")]
        units[name]["units"] = len(all_units)
        units[name]["in_spares"] = len(in_spares)
        units[name]["warm_ms"] = median([x.get("warm_ms") for x in in_spares])
        units[name]["waited_ms"] = median([x.get("waited_ms") for x in in_spares])
        preloads = [x["preload_ms"] for x in in_spares if x.get("preload_ms") is not None]
        units[name]["preloaded"] = len(preloads)
        units[name]["preload_ms"] = median(preloads)

        def rest(u):
            spare = u.get("spare") or {}
            load = 0 if spare.get("preload_ms") is not None else (u.get("load_ms") or 0)
            return u["wall_ms"] - load - (u.get("run_ms") or 0)
        # Per unit, then the median: medians of the parts do not add up.
        units[name]["rest_ms"] = median([rest(u) for u in all_units if u.get("wall_ms") is not None])
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
    line = bench_host.reads_line(results.get("read_mb"), "the models and inputs each run names")
    if line:
        w(line)
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
    w("- **isorun exec / zygote, -j 1 / -j 2, --spares N**: `isorun run MODEL... --inputs inputs.npz --json -q "
      "--spawn exec|zygote -j N [--spares N]`. A spare is a worker forked from the slot's zygote for the next unit in "
      "line and warmed up (TensorFlow's first-use set-up: it loads the unit's own model ahead, #25, or a built-in one where it may not) while the current unit runs; "
      "`--spares` is 2 by default while the slots leave a CPU idle (here -j 1), else 0 (here -j 2); "
      "`-j 2 --spares 1` shows what a spare costs when every CPU already runs a unit. Exec'd workers have no spares.")
    w("- **rust floor**: `isorun-worker --in-process --batch 8 MODEL...`: the same C API calls, all models in one "
      "process with zero inputs, no isolation — what isolation is measured against.\n")

    w("## Time\n")
    w(f"| way | runs (s) | median (s) | per model (ms) | × faster than python loop | × faster than python pool | × the rust floor's time | overhead per model over rust floor (ms) | -j 2 speedup over -j 1 | CPU it used (s) | other processes meanwhile (cores) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        floor = r["way"] == "rust floor"
        w(f"| {r['way']} | {', '.join(f'{x:.2f}' for x in r['runs'])} | {r['median_s']:.2f} | {r['per_model_ms']:.0f} | "
          f"{fmt(r['vs_loop'], '.2f', '×')} | {fmt(r['vs_pool'], '.1f', '×')} | "
          f"{'–' if floor else fmt(r['vs_floor'], '.2f', '×')} | "
          f"{'–' if floor else fmt(r['overhead_ms'], '.0f')} | {fmt(r['j2_speedup'], '.2f', '×')} | "
          f"{fmt(r['own_cpu_s'], '.1f')} | {fmt(r['others_cores'], '.2f')} |")
    w("")
    w("-j 2 speedups are per-round ratios against " + "; ".join(f"`{b}` for `{a}`" for a, b in JOBS_PAIRS.items())
      + ": the same per-unit work, or the default of each.\n")
    w(f"The last two columns are medians over the rounds: the user + system CPU time of the command and all its "
      f"descendants, and the CPU time every other process on the machine used during the run, divided by its wall "
      f"time (from `/proc/stat`; {m['cores']} would mean the machine was fully taken by others).\n")
    w("Where the time goes, per unit (medians over every unit of every round, from `--report`: "
      "`wall_ms` is the unit from the worker's start to its end, `load_ms` loading the SavedModel in the worker, "
      "`run_ms` the first call of the signature; for units that ran in a spare, `spare.warm_ms` is the spare's "
      "warm-up (fork to warmed, overlapping the unit before it) and `spare.waited_ms` how long the unit waited for "
      "its spare to finish warming; a spare that preloaded its unit's model (#25) did that load in its warm-up, "
      "so the unit's `load_ms` is the spare's, before the unit's `wall_ms` starts; the rust floor's per-model load "
      "and load + run times):\n")
    w("| way | unit wall (ms) | load (ms) | run (ms) | worker user CPU (ms) | worker sys CPU (ms) | worker peak RSS (MiB) | supervisor peak (MiB) | units in a spare | spare warm-up (ms) | waited for its spare (ms) |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, u in units.items():
        run_ms = u.get("run_ms")
        if name == "rust floor":
            run_ms = u["wall_ms"] - u["load_ms"]
        spared = f"{u['in_spares']}/{u['units']}" if "units" in u else "–"
        w(f"| {name} | {fmt(u.get('wall_ms'), '.0f')} | {fmt(u.get('load_ms'), '.0f')} | {fmt(run_ms, '.0f')} | "
          f"{fmt(u.get('user_ms'), '.0f')} | {fmt(u.get('sys_ms'), '.0f')} | "
          f"{fmt(u['peak_rss_bytes'] / MIB if u.get('peak_rss_bytes') else None, '.0f')} | {fmt(u.get('supervisor_peak_mib'), 'd')} | "
          f"{spared} | {fmt(u.get('warm_ms'), '.0f')} | {fmt(u.get('waited_ms'), '.0f')} |")
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
          "(peaks per worker, then the median over workers, spares included where there are any; a 25 ms sample can "
          "miss a short spike), and the report's `peak_rss_bytes` (the kernel's `ru_maxrss` at reaping):\n")
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
        off = wm.get("zygote --spares 0", wm.get("zygote", {}))
        ex, zy = wm.get("exec", {}).get("workers", {}), off.get("workers", {})
        zg = off.get("zygote") or {}

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
        spares_memory(w, wm, targets)
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
          f"{len(big_runs)} pairs, run alternately; the figure is the median of the paired differences. The "
          "`.npz` is written by `np.savez` (entries stored, not compressed, their data not 64-byte aligned in the file): "
          "isorun reads the entry's header only and has the kernel copy its bytes into a sealed memfd "
          "(`sendfile`), which the worker maps and hands to TensorFlow (the worker's TF_Tensor borrows the "
          "mapping, `TF_NewTensor`, rather than copying it); a `.npy` file (data 64-byte aligned) needs no copy at all (next "
          "sections). The target is judged end to end, on the whole command, as a user sees it.\n")
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
        w(f"Memory: with the 256 MiB input the supervisor peaks at {fmt(sup_big, '.0f')} MiB (`--summary`): "
          + ("it never holds the array (the kernel copies file to memfd). "
             if sup_big is not None and sup_big < 64 else
             "it holds the array read from the `.npz` while preparing the inputs. ") +
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

    one_model_section(w, results, targets)
    npy_info = npy_section(w, results, targets)
    pipe_info = pipe_section(w, results, targets)

    # -- targets --
    z1, z1_off = by.get(Z1_ON), by.get(Z1_OFF)
    z2, z2_on = by.get(Z2_OFF), by.get(Z2_ON)
    e1, e2 = by.get(E1), by.get(E2)
    timing_targets = []
    if z1 and z1_off and e1:
        timing_targets.append(("isorun `-j 1` ≥ 2× faster than the Python in-process loop", z1["vs_loop"] >= 2,
                               f"zygote with spares {z1['vs_loop']:.2f}×, without {z1_off['vs_loop']:.2f}×, "
                               f"exec {e1['vs_loop']:.2f}×"))
        timing_targets.append(("isorun `-j 1` ≥ 15× faster than the Python pool", z1["vs_pool"] >= 15,
                               f"zygote with spares {z1['vs_pool']:.1f}×, without {z1_off['vs_pool']:.1f}×, "
                               f"exec {e1['vs_pool']:.1f}×"))
        timing_targets.append(("isolation overhead ≤ 60 ms per model over the Rust floor", z1["overhead_ms"] <= 60,
                               f"zygote -j 1 with spares {z1['overhead_ms']:.0f} ms, without "
                               f"{z1_off['overhead_ms']:.0f} ms, exec -j 1 {e1['overhead_ms']:.0f} ms"))
        timing_targets.append(("zygote `-j 1` with spares ≤ 1.3× the Rust floor's time (per-round ratio)",
                               z1["vs_floor"] <= 1.3,
                               f"`--spares 2` {z1['vs_floor']:.2f}× ({z1['overhead_ms']:.0f} ms per model), "
                               f"`--spares 0` {z1_off['vs_floor']:.2f}×, exec {e1['vs_floor']:.2f}×"))
    if z2 and z2_on and e2:
        timing_targets.append(("`-j 2` ≥ 1.7× faster than `-j 1`", z2["j2_speedup"] >= 1.7,
                               f"zygote `--spares 0` {z2['j2_speedup']:.2f}×, `-j 2 --spares 1` over `-j 1 --spares 2` "
                               f"{z2_on['j2_speedup']:.2f}×, exec {e2['j2_speedup']:.2f}×"))
    targets = timing_targets + targets
    w("## Targets\n")
    w("Benchmark figures, not tests; judged on the defaults (`--spawn auto`: the zygote for many units; `--spares 2` "
      "at -j 1 and 0 at -j 2 on this machine), the other modes shown alongside.\n")
    w("| target | measured | |")
    w("|---|---|---|")
    for name, ok, measured in targets:
        w(f"| {name} | {measured} | {'met' if ok else '**missed**'} |")
    w("")
    results["targets"] = [{"target": t, "met": bool(ok), "measured": m} for t, ok, m in targets]

    missed = {name for name, ok, _ in targets if not ok}
    if missed:
        w("## What bounds it\n")
        bounds(w, missed, results, rows, units, ipc_info, n, npy_info, pipe_info)

    if args.notes and os.path.exists(args.notes):
        with open(args.notes) as f:
            w(f.read().rstrip() + "\n")

    page = with_others_sections(path, "\n".join(out))
    with open(path, "w") as f:
        f.write(page)
    return targets


def with_others_sections(path, text):
    """`text` with the sections other bench scripts own (any `## ` heading
    this script does not write) kept from the page at `path`, in their order,
    before `## Targets`: so that this part alone (`scripts/bench --zoo-only`)
    rewrites only its own sections."""
    if not os.path.exists(path):
        return text
    old = open(path).read()
    ours = {line for line in text.splitlines() if line.startswith("## ")}
    kept = []
    for part in old.split("\n## ")[1:]:
        heading = "## " + part.splitlines()[0]
        if heading not in ours:
            kept.append("## " + part.rstrip() + "\n")
    at = text.find("\n## Targets\n")
    if not kept or at < 0:
        return text
    return text[: at + 1] + "\n".join(kept) + "\n" + text[at + 1 :]


def one_model_section(w, results, targets):
    one = results.get("one_model")
    if not one:
        return
    rounds = one["rounds"]
    names = list(rounds[0].keys())
    w("## One model end to end\n")
    w(f"The shell-pipeline case: `isorun run {one['model']} --inputs inputs.npz` (one of the zoo's MLPs; table "
      f"output) with the default spawn mode, with `--spawn exec` and with `--spawn zygote`, and `python -c` doing "
      f"`tf.saved_model.load` and one `serving_default` call on the same model (imports included); the whole "
      f"command's wall time, {len(rounds)} rounds run alternately, medians and per-round ratios.\n")
    w("| way | runs (s) | median (s) | × `--spawn exec`'s time | × `python -c`'s time |")
    w("|---|---|---:|---:|---:|")
    ratio = {}
    for name in names:
        runs = [r[name] for r in rounds]
        ratio[name] = median([r[name] / r["isorun --spawn exec"] for r in rounds])
        w(f"| {name} | {', '.join(f'{x:.2f}' for x in runs)} | {median(runs):.2f} | {ratio[name]:.2f}× | "
          f"{median([r[name] / r['python -c'] for r in rounds]):.2f}× |")
    w("")
    d = ratio["isorun (default)"]
    targets.append(("one model: the default spawn mode ≤ `--spawn exec` (per-round ratio)", d <= 1.0,
                    f"{d:.2f}× exec's time ({median([r['isorun (default)'] for r in rounds]):.2f} vs "
                    f"{median([r['isorun --spawn exec'] for r in rounds]):.2f} s); zygote "
                    f"{ratio['isorun --spawn zygote']:.2f}×; `python -c` {ratio['python -c']:.2f}×"))


def npy_section(w, results, targets):
    npy = results.get("npy")
    if not npy or not npy.get("big"):
        return None
    big, tiny = npy["big"], npy["tiny"]
    size = npy["bytes"]
    delta = median([b["wall_s"] for b in big]) - median([t["wall_s"] for t in tiny])
    unit_delta = (median([b["wall_ms"] for b in big]) - median([t["wall_ms"] for t in tiny])) / 1e3
    run_delta = (median([b["run_ms"] for b in big]) - median([t["run_ms"] for t in tiny])) / 1e3
    memcopy = (results.get("ipc") or {}).get("memcopy")
    warm = median(memcopy["warm_s"]) * size / memcopy["bytes"] if memcopy else None
    fresh = median(memcopy["fresh_s"]) * size / memcopy["bytes"] if memcopy else None
    speed = lambda t: size / t / 1e9 if t and t > 0 else None  # noqa: E731
    sup = max((b.get("supervisor_peak_mib") or 0) for b in big)
    hwm = max(b["vmhwm_bytes"] for b in big) / MIB
    sup_tiny = max((t.get("supervisor_peak_mib") or 0) for t in tiny)
    hwm_tiny = max(t["vmhwm_bytes"] for t in tiny) / MIB
    w("## A 1 GiB `.npy` input\n")
    w(f"`isorun run ipc/reduce_sum --input x=FILE.npy --json -q --summary` (default spawn mode), where FILE is "
      f"a float32 `.npy` of {size / MIB:.0f} MiB or of 16 elements; {len(big)} pair(s), run alternately. The "
      f"supervisor's peak is `--summary`'s \"supervisor peak memory\" and its VmHWM read from `/proc/PID/status` "
      f"every 5 ms until it exits; the effective speed is {size / MIB:.0f} MiB over the difference of the two "
      f"medians; memcpy is `bench_models.py memcopy`'s 256 MiB `np.copyto` (IPC section), scaled to the size.\n")
    w("| measure | 1 GiB input | 16 elements | difference (s) | effective GB/s |")
    w("|---|---:|---:|---:|---:|")
    w(f"| whole command (s) | {median([b['wall_s'] for b in big]):.3f} | {median([t['wall_s'] for t in tiny]):.3f} | "
      f"{delta:.3f} | {fmt(speed(delta), '.2f')} |")
    w(f"| unit: worker start → finished (s) | {median([b['wall_ms'] for b in big]) / 1e3:.3f} | "
      f"{median([t['wall_ms'] for t in tiny]) / 1e3:.3f} | {unit_delta:.3f} | {fmt(speed(unit_delta), '.2f')} |")
    w(f"| worker `run_ms`: `reduce_sum` over the input (s) | {median([b['run_ms'] for b in big]) / 1e3:.3f} | "
      f"{median([t['run_ms'] for t in tiny]) / 1e3:.3f} | {run_delta:.3f} | {fmt(speed(run_delta), '.2f')} |")
    if warm:
        w(f"| memcpy (`np.copyto`, scaled) (s) | {warm:.3f} | | | {speed(warm):.2f} |")
        w(f"| copy into a new array, page faults included (scaled) (s) | {fresh:.3f} | | | {speed(fresh):.2f} |")
    w(f"| supervisor peak, `--summary` (MiB) | {sup} | {sup_tiny} | | |")
    w(f"| supervisor VmHWM, sampled (MiB) | {hwm:.1f} | {hwm_tiny:.1f} | | |")
    w("")
    ratio = warm / delta if warm and delta > 0 else None
    w(f"A {size / MIB:.0f} MiB `.npy` input adds **{delta:.3f} s** end to end: **{fmt(speed(delta), '.2f')} GB/s, "
      f"{fmt(ratio, '.2f')}× memcpy's speed**" + (" (faster than a copy: nothing is copied; the file is mapped "
      "and the worker's TF_Tensor reads it where it lies)" if ratio and ratio > 1 else "")
      + f". The supervisor peaks at **{max(sup, hwm):.0f} MiB** with it and {max(sup_tiny, hwm_tiny):.0f} MiB "
      f"without: its memory does not grow with the input.\n")
    targets.append(("supervisor peak ≤ 32 MiB with a 1 GiB `.npy` input", max(sup, hwm) <= 32,
                    f"`--summary` {sup} MiB, VmHWM {hwm:.1f} MiB (16 elements: {sup_tiny} / {hwm_tiny:.1f} MiB)"))
    targets.append(("a 1 GiB `.npy` input at ≥ 0.5× memcpy speed end to end", ratio is not None and ratio >= 0.5,
                    f"{fmt(ratio, '.2f')}× ({fmt(speed(delta), '.2f')} vs {fmt(speed(warm), '.2f')} GB/s)"))
    return {"delta": delta, "unit_delta": unit_delta, "run_delta": run_delta, "warm": warm, "fresh": fresh,
            "sup": sup, "hwm": hwm, "size": size}


def pipe_section(w, results, targets):
    pipe = results.get("pipe")
    if not pipe or not pipe.get("pipe"):
        return None
    n = pipe["requests"]
    rate = lambda r: (n - 1) / r["steady_s"]  # noqa: E731
    floor_rate = lambda f: (f["runs"] - 1) / (f["total_s"] - f["first_ms"] / 1e3)  # noqa: E731
    pipe_rates = [rate(r) for r in pipe["pipe"]]
    floor_rates = [floor_rate(f) for f in pipe["floor"]]
    share = median([rate(p) / floor_rate(f) for p, f in zip(pipe["pipe"], pipe["floor"])])
    w("## `pipe`\n")
    w(f"`isorun pipe m00` (default spawn mode) fed {n} request lines `{{\"id\": i, \"inputs\": {{\"x\": ...}}}}` "
      f"(x float32 [8, 32], inputs.npz's values) on stdin, against the floor `isorun-worker --in-process --batch 8 "
      f"--repeat {n} m00`: the same model loaded once and its signature run {n} times more on the same inputs in "
      f"one process, the same C API calls with no IPC and no JSON. The rate is answers 2–{n} over the time from the "
      f"first answer to the last (the first includes starting the worker and loading the model); the floor's, "
      f"runs 2–{n} over their time. {len(pipe_rates)} round(s), run alternately.\n")
    w("| way | requests/s (runs) | median requests/s | per request (ms) | whole command (s) |")
    w("|---|---|---:|---:|---:|")
    w(f"| isorun pipe | {', '.join(f'{x:.0f}' for x in pipe_rates)} | {median(pipe_rates):.0f} | "
      f"{1e3 / median(pipe_rates):.2f} | {median([r['wall_s'] for r in pipe['pipe']]):.2f} |")
    w(f"| in-process loop (floor) | {', '.join(f'{x:.0f}' for x in floor_rates)} | {median(floor_rates):.0f} | "
      f"{1e3 / median(floor_rates):.2f} | {median([f['wall_s'] for f in pipe['floor']]):.2f} |")
    w("")
    w(f"`isorun pipe` answers at **{share * 100:.0f}%** of the in-process loop's rate (median of the per-round "
      f"ratios).\n")
    targets.append(("`pipe` ≥ 90% of the in-process loop's requests/s", share >= 0.9,
                    f"{share * 100:.0f}% ({median(pipe_rates):.0f} vs {median(floor_rates):.0f} requests/s)"))
    restart = pipe.get("restart") or {}
    info = {"share": share, "pipe_rate": median(pipe_rates), "floor_rate": median(floor_rates)}
    if restart:
        w("**Restart after a crash.** One `isorun pipe m00` session fed a line at a time: five normal requests, then "
          "SIGKILL of its worker (the pipe's descendant that is not the zygote), wait until it is gone, and time "
          "the next request's answer (a fresh worker starts and loads the model first); repeated. With the default "
          "spawn mode the first worker is exec'd while the zygote starts and every restarted one is forked; "
          "`--spawn exec` execs every one.\n")
        w("| pipe | kills | normal answer (ms, median) | first answer after a kill (ms, median) | restart cost (ms) | "
          "error lines right after a kill | killed workers' start |")
        w("|---|---:|---:|---:|---:|---|---|")
        lost = 0
        for spawn, r in restart.items():
            normal, after = median(r["normal_s"]) * 1e3, median(r["after_kill_s"]) * 1e3
            starts = ", ".join(f"{r['killed_worker_start'].count(k)} {k}" for k in ("exec", "fork")
                               if k in r["killed_worker_start"])
            errors = [f for f in r.get("failed_after_kill", []) if f]
            lost += len(errors)
            kinds = ", ".join(sorted({f["kind"] for f in errors}))
            err_text = (f"{len(errors)} of {len(r['after_kill_s'])} (`{kinds}`, "
                        f"{median([f['s'] for f in errors]) * 1e3:.1f} ms)" if errors else "none")
            w(f"| `--spawn {spawn}` | {len(r['after_kill_s'])} | {normal:.2f} | {after:.0f} | {after - normal:.0f} | "
              f"{err_text} | {starts} |")
            info[f"restart_{spawn}"] = after - normal
        w("")
        w("Restart cost: the first answer from the fresh worker less a normal answer (the fresh worker's start "
          "and the model's load)."
          + (" **The request sent right after a kill got an error line** instead of being run by a fresh worker "
             "(the worker died between requests, so no request was lost with it, yet the next one fails): the "
             "table counts these, and the restart cost is the request after." if lost else "") + "\n")
    return info


def spares_memory(w, wm, targets):
    """The "Memory with spares" paragraph and table, from worker_memory's runs."""
    on, off = wm.get("zygote --spares 2"), wm.get("zygote --spares 0")
    if not on or not off or "slot" not in on:
        return

    def mib(x):
        return fmt(x / MIB if x is not None else None, ".0f")

    w("**Spares.** The same sampling during `isorun run -j 1 --spares 2` and `--spares 0` (zygote). At -j 1 a "
      "slot's units run in the order their workers were forked, so at each sample the oldest live worker is the "
      "one running a unit and the younger ones are spares; a waiting spare's memory is taken at its last sample "
      f"before it got its unit (median over the spares that did; a pass over `/proc` took "
      f"{fmt(on['slot']['interval_s'] * 1e3 if on['slot'].get('interval_s') else None, '.0f')} ms on average here). The slot's total is the sum over "
      "the zygote, the worker and the spares at one sample (PSS splits shared pages between the processes that map "
      "them, so it adds up; RSS counts a shared page in each).\n")
    w("| run | units in a spare | spares alive (median, max) | waiting spare: private (MiB) | PSS (MiB) | RSS (MiB) | "
      "slot total PSS: peak (MiB) | median (MiB) | slot total private: peak (MiB) |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("zygote --spares 0", "zygote --spares 2"):
        e = wm[name]
        slot = e["slot"]
        wait = slot["waiting"] if slot["waiting_spares"] else {}
        w(f"| `-j 1 --{name.split(' --')[1]}` | {e['units_in_spares']}/{e['units']} | "
          f"{fmt(slot['spares_live_median'], '.0f')}, {fmt(slot['spares_live_max'], 'd')} | "
          f"{mib(wait.get('Private'))} | {mib(wait.get('Pss'))} | {mib(wait.get('Rss'))} | "
          f"{mib(slot['total_peak']['Pss'])} | {mib(slot['total_median']['Pss'])} | {mib(slot['total_peak']['Private'])} |")
    w("")
    son, soff = on["slot"], off["slot"]
    extra = (son["total_peak"]["Pss"] - soff["total_peak"]["Pss"]
             if son["total_peak"]["Pss"] is not None and soff["total_peak"]["Pss"] is not None else None)
    w(f"A waiting spare holds {mib(son['waiting'].get('Private'))} MiB of its own memory (private; "
      f"median of {son['waiting_spares']} spares, just before each got its unit): TensorFlow's first-use state — thread pools, the kernel "
      f"registry, oneDNN's generated kernels, and its unit's model, which it preloaded (#25; without preloading, the built-in warm-up model's graph) — written after the fork. With two of them "
      f"the slot peaks at {mib(son['total_peak']['Pss'])} MiB PSS against {mib(soff['total_peak']['Pss'])} MiB "
      f"without spares ({mib(extra)} MiB more). `--memory-limit` counts spares, and spares are dropped when memory "
      f"is short.\n")


def bounds(w, missed, results, rows, units, ipc, n, npy=None, pipe=None):
    """One paragraph per missed target, from the measurements."""
    by = {r["way"]: r for r in rows}
    cores = results["machine"]["cores"]
    others = [r[name].get("others_cores") for r in results["rounds"] for name in r]
    others = [x for x in others if x is not None]
    busy = (f" The machine was shared: other processes used a median of {median(others):.2f} (up to "
            f"{max(others):.2f}) of its {cores} cores during the timed runs, so every way got a varying share of the "
            "CPUs." if others and median(others) > 0.25 else "")
    floor_first = median([r["rust floor"]["models"][0]["total_ms"] for r in results["rounds"] if r["rust floor"]["models"]])
    z1, z0, f = units.get(Z1_ON), units.get(Z1_OFF), units.get("rust floor")
    e1 = units.get(E1)
    if any(m.startswith(("isolation overhead", "zygote `-j 1` with spares")) for m in missed) and z1 and z0 and f:
        other = z1["rest_ms"]
        other0 = z0["wall_ms"] - z0["load_ms"] - z0["run_ms"]
        w(f"**Isolation overhead** ({by[Z1_ON]['overhead_ms']:.0f} ms per model, {by[Z1_ON]['vs_floor']:.2f}× the "
          f"floor, with spares; {by[Z1_OFF]['overhead_ms']:.0f} ms, {by[Z1_OFF]['vs_floor']:.2f}×, without; "
          f"{by[E1]['overhead_ms']:.0f} ms with exec). The floor loads a model in {f['load_ms']:.0f} ms and runs it "
          f"in {f['wall_ms'] - f['load_ms']:.0f} ms, but only because its process is warm: its *first* model costs "
          f"{fmt(floor_first, '.0f')} ms. Without spares a forked worker is a first model every time: a unit takes "
          f"{z0['wall_ms']:.0f} ms (median): {z0['load_ms']:.0f} ms loading, {z0['run_ms']:.0f} ms for the first "
          f"call, {other0:.0f} ms for fork, handshake, request and reaping; the zygote has only loaded libtensorflow "
          "(it must stay single-threaded to fork safely), so each worker pays TensorFlow's one-time set-up again. "
          "(A `perf` profile of zygote workers with spares (#25) showed where: oneDNN generating its JIT GEMM "
          "kernels (Xbyak, once per process), ~21% of worker CPU, until the zygote made them before it forks "
          "(`worker/src/onednn.rs`; the workers inherit them), with three smaller registry set-ups; what is left is "
          "Grappler and executor construction for the restore and the first call, ~20%; the oneDNN layout pass's "
          "kernel-registry lookups (a per-thread cache, cold in every process), ~6%; malloc, and first-touch page "
          "faults, ~12%.) "
          + (f"With spares that set-up moves off the unit's path: {z1['in_spares']} of {z1['units']} units ran in a "
             f"spare, {z1['preloaded']} of them with their model preloaded: the spare loads the unit's own model as "
             f"its warm-up ({fmt(z1.get('preload_ms'), '.0f')} ms, median; where the zygote could not make "
             f"oneDNN's kernels, it then runs a graph of its own for them), {fmt(z1.get('warm_ms'), '.0f')} ms in "
             f"all on the other core while the unit before "
             f"ran; a unit then takes {z1['wall_ms']:.0f} ms: {z1['run_ms']:.0f} ms for the first call, "
             f"{other:.0f} ms for the rest (request, answer, exit), after waiting "
             f"{fmt(z1.get('waited_ms'), '.0f')} ms for its spare to finish. "
             "So the unit's own path is at the floor's; what is left is CPU beside it: each spare's first use of "
             "TensorFlow (the load of a model in a process that has never loaded one), the workers' "
             "exits, the forks, the zygote and the supervisor, on "
             f"{cores} cores with the unit on one of them (the command's CPU over its wall time is in the table "
             "above). "
             if z1.get("preloaded") else
             f"With spares that set-up moves off the unit's path: {z1['in_spares']} of {z1['units']} units ran in a "
             f"spare, whose warm-up took {fmt(z1.get('warm_ms'), '.0f')} ms (median) on the other core while the "
             f"unit before ran; a unit then takes {z1['wall_ms']:.0f} ms: {z1['load_ms']:.0f} ms loading, "
             f"{z1['run_ms']:.0f} ms for the first call, {fmt(z1.get('waited_ms'), '.0f')} ms waiting for its spare "
             f"to finish warming, {other:.0f} ms for the rest. What is left over the floor is what a process that has "
             "never seen this model still pays: the model's own graph import, session and kernels, and the first "
             "call's per-process first uses the warm-up model did not cover; and with -j 1 on "
             f"{cores} cores the spares' warm-ups take the second core, so the supervisor, the zygote and the unit "
             "share the first. ")
          + (f"Exec adds ~{e1['wall_ms'] - z0['wall_ms']:.0f} ms more per unit than a fork without "
                           "spares (loading and relocating the ~790 MB library in every worker). " if e1 else "")
          + "`--models-per-worker N` trades isolation for the floor's warm process." + busy + "\n")
    if any(m.startswith("`-j 2`") for m in missed):
        lines = []
        for two, one in JOBS_PAIRS.items():
            u1, u2 = units.get(one), units.get(two)
            if u1 and u2:
                lines.append(f"`{two.removeprefix('isorun ')}`: a unit takes {u2['wall_ms']:.0f} ms of wall time and "
                             f"{u2['user_ms'] + u2['sys_ms']:.0f} ms of worker CPU, against {u1['wall_ms']:.0f} ms and "
                             f"{u1['user_ms'] + u1['sys_ms']:.0f} ms at `{one.removeprefix('isorun ')}`")
        w(f"**-j 2** ({by[Z2_OFF]['j2_speedup']:.2f}× with the zygote, no spares). The work is CPU-bound and the "
          f"machine has {cores} cores, so 2× is the ceiling, reached only if nothing else runs: "
          + "; ".join(lines) + ". A unit at -j 2 gets one intra-op thread instead of two and shares the cores "
          "with the other worker, the supervisor, the zygotes (one per slot) and whatever else runs on the "
          f"machine: other processes used {fmt(by[Z1_OFF].get('others_cores'), '.2f')} cores during "
          f"the zygote -j 1 runs and {fmt(by[Z2_OFF].get('others_cores'), '.2f')} during the -j 2 runs "
          "(medians). Where the per-unit CPU time stays the same and the wall time per unit doubles, the second "
          "core was not there to be had." + busy + "\n")
    if any(m.startswith("supervisor peak RSS < 20 MB") for m in missed):
        w("**Supervisor memory**: see the figures above; it is measured from `/proc/PID/status` after every unit.\n")
    one = results.get("one_model")
    if any(m.startswith("one model") for m in missed) and one:
        rounds = one["rounds"]
        d, e = median([r["isorun (default)"] for r in rounds]), median([r["isorun --spawn exec"] for r in rounds])
        z = median([r["isorun --spawn zygote"] for r in rounds])
        w(f"**One model.** The default took {d:.3f} s and `--spawn exec` {e:.3f} s (medians; zygote {z:.3f} s): "
          f"{(d - e) * 1e3:.0f} ms apart over {len(rounds)} rounds, on runs that vary by "
          f"{(max(r['isorun --spawn exec'] for r in rounds) - min(r['isorun --spawn exec'] for r in rounds)) * 1e3:.0f} ms "
          "between rounds for exec alone. With one unit the default execs its worker (the zygote is not started "
          "on the first result's path), so both run the same way and the difference is noise unless it is "
          "larger than that spread." + busy + "\n")
    if npy and any(m.startswith(("supervisor peak ≤ 32 MiB", "a 1 GiB")) for m in missed):
        w(f"**A 1 GiB `.npy` input.** The supervisor peaked at {npy['sup']} MiB (`--summary`) / {npy['hwm']:.1f} MiB "
          f"(VmHWM); the input added {npy['delta']:.3f} s end to end, of which the unit (worker start to finish) "
          f"{npy['unit_delta']:.3f} s and `reduce_sum` reading all of it {npy['run_delta']:.3f} s; "
          f"{npy['delta'] - npy['unit_delta']:.3f} s passed in the supervisor outside the unit (opening the file, "
          f"checking its header and size, and mapping it for the worker). memcpy of the same size takes "
          f"{fmt(npy['warm'], '.3f')} s here; reading the input at all — `reduce_sum` touches every page of the "
          f"mapping, a page-cache read of {npy['size'] / MIB:.0f} MiB — takes {npy['run_delta']:.3f} s on its own, so "
          "that read bounds how close to memcpy the whole command can come." + busy + "\n")
    if pipe and any(m.startswith("`pipe`") for m in missed):
        per_pipe, per_floor = 1e3 / pipe["pipe_rate"], 1e3 / pipe["floor_rate"]
        w(f"**pipe.** A request takes {per_pipe:.2f} ms through `isorun pipe` against {per_floor:.2f} ms for the same "
          f"call in the floor's loop (the signature run again, no JSON): {per_pipe - per_floor:.2f} ms per request "
          "is the JSON line parsed into a tensor, the request framed and written to the socket, the worker "
          "woken (unless it was still polling for it, `--spin-us`), the run, the reply read back and the outputs "
          "written as a JSON line and flushed. Since #25 no thread hand-off lies on that path on either side (the "
          "serving thread reads stdin, writes the request and reads the answer itself; the worker runs the ops on "
          "its own thread), so what is left is the process boundary itself: two processes woken in turn, a few "
          "system calls each (through seccomp in the worker), on a VM where a cross-CPU wake-up is a hypercall. "
          "The section \"`pipe` against its floors\" compares it with the fair floor (the same JSON code "
          "in-process)." + busy + "\n")
    if any(m.startswith("a 256 MB") for m in missed) and ipc:
        need = 2 * ipc["warm"]
        w(f"**IPC.** A plain copy between two buffers already written runs at {256 * MIB / ipc['warm'] / 1e9:.1f} GB/s; "
          f"into fresh memory, paying a page fault per 4 KiB page (transparent huge pages: "
          f"`{results['machine'].get('thp', '?')}`), {256 * MIB / ipc['fresh'] / 1e9:.1f} GB/s. Half the speed of "
          f"`np.copyto` leaves {need:.3f} s for 256 MiB; isorun takes {ipc['total_delta']:.3f} s, of which "
          f"{ipc['prep']:.3f} s in the supervisor before any worker is involved: the kernel copies the stored "
          f"`.npz` entry from the file into a fresh sealed memfd (`sendfile`: a copy into fresh pages, a page "
          f"fault per 4 KiB), since its data does not start 64-byte aligned in the zip, as TensorFlow wants it, and cannot be mapped as it is (a "
          f"{fmt(ipc.get('sup_big'), '.0f')} MiB supervisor peak). The worker's part, {ipc['unit_delta']:.3f} s, "
          f"is small: its TF_Tensor borrows the mapping. A copy into fresh pages (~"
          f"{256 * MIB / ipc['fresh'] / 1e9:.1f} GB/s here) is at best ~{ipc['warm'] / ipc['fresh']:.2f}× of "
          f"`np.copyto`; an aligned input (a `.npy` file, whose data follows a header padded to 64 bytes, "
          f"mapped from the file itself: the next section) is the way past it.\n")


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
        bench.npy_input()
        bench.one_model()
        bench.pipe()
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
