#!/usr/bin/env python3
"""isorun eval -j 1 of two builds side by side (issue 44 §2: decoded once per run).

Usage: scripts/bench_eval_before_after.py BEFORE_ISORUN AFTER_ISORUN ROUNDS SIZES

Runs `isorun eval` of the evaluation zoo (`$ISORUN_BENCH_ZOO/eval`, made by
`scripts/bench_eval.py zoo`) with each binary at -j 1 and `--report`,
alternating which goes first, for each batch size in SIZES (e.g. 256,1024),
then the in-process floors (`isorun-worker --in-process` beside AFTER); prints
per way the command's median wall time, its CPU and the other processes' (a
shared machine), and per unit its median `wall_ms`, ratio to its floor and
`phases_ms`. Build the old binary from a `git worktree` into its own target
folder. Raw measurements: /tmp/evalcmp/results.json.
"""
import json, math, os, re, statistics, subprocess, sys, tempfile, time

ZOO = os.path.join(os.environ.get("ISORUN_BENCH_ZOO", os.path.expanduser("~/.cache/isorun/bench-zoo")), "eval")
DATA = os.path.join(ZOO, "data.tfrecord")
MODELS = [os.path.join(ZOO, "models", m) for m in sorted(os.listdir(os.path.join(ZOO, "models")))]
WAYS = {"before": sys.argv[1], "after": sys.argv[2]}
ROUNDS = int(sys.argv[3])
SIZES = [int(s) for s in sys.argv[4].split(",")]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

def busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")

def kids():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def run(cmd):
    c0, b0, t0 = kids(), busy(), time.perf_counter()
    p = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    own = kids() - c0
    others = max(0.0, busy() - b0 - own) / wall
    if p.returncode:
        raise SystemExit(f"{cmd[0]} failed {p.returncode}: {p.stderr[-2000:]}")
    return wall, p.stdout, own, others

res = {"rounds": []}
with open(DATA, "rb") as f:
    while f.read(1 << 24):
        pass
for way, isorun in WAYS.items():  # warm-up
    run([isorun, "eval", MODELS[0], "--data", DATA, "--label", "label", "--limit", "2560", "-q"])
for r in range(ROUNDS):
    rnd = {}
    for size in SIZES:
        for way, isorun in (list(WAYS.items()) if r % 2 == 0 else list(WAYS.items())[::-1]):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [isorun, "eval", *MODELS, "--data", DATA, "--label", "label", "--metric", "accuracy",
                       "--metric", "log_loss", "-j", "1", "--json", "--batch-size", str(size),
                       "--report", os.path.join(tmp, "r.json")]
                wall, out, own, others = run(cmd)
            recs = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            recs = sorted([x for x in recs if "model" in x], key=lambda x: x["model"])
            assert all(x["status"] == "ok" for x in recs), recs
            rnd[f"{way} {size}"] = {"wall": wall, "own_cpu": own, "others": others, "units": [
                {k: x.get(k) for k in ("model", "wall_ms", "worker_start", "phases_ms", "metrics", "examples")}
                for x in recs]}
            print(f"round {r+1} {way} b{size}: {wall:.2f} s (others {others:.2f} cores) " +
                  " ".join(f"{u['model']}={u['wall_ms']}" for u in rnd[f'{way} {size}']['units']), flush=True)
        worker = os.path.join(os.path.dirname(WAYS["after"]), "isorun-worker")
        floors = {}
        for m in MODELS:
            runs = math.ceil(100000 / size)
            wall, text, _, _ = run([worker, "--in-process", "--batch", str(size), "--repeat", str(runs - 1), m])
            total = re.search(r"\tload ([\d.]+) ms\ttotal ([\d.]+) ms$", text, re.M)
            rep = re.search(r"\trepeat \d+ runs\t([\d.]+) s", text, re.M)
            floors[os.path.basename(m)] = {"in": float(total.group(2)) / 1e3 + float(rep.group(1)), "process": wall}
        rnd[f"floor {size}"] = floors
    res["rounds"].append(rnd)
os.makedirs("/tmp/evalcmp", exist_ok=True)
with open("/tmp/evalcmp/results.json", "w") as f:
    json.dump(res, f, indent=1)

med = statistics.median
for size in SIZES:
    print(f"\n== batch {size}")
    for way in WAYS:
        k = f"{way} {size}"
        walls = [r[k]["wall"] for r in res["rounds"]]
        print(f"{way}: command wall median {med(walls):.2f} s ({', '.join(f'{w:.2f}' for w in walls)}); "
              f"own CPU {med([r[k]['own_cpu'] for r in res['rounds']]):.2f} s; other processes "
              f"{med([r[k]['others'] for r in res['rounds']]):.2f} cores")
        for i, m in enumerate(MODELS):
            name = os.path.basename(m)
            us = [r[k]["units"][i] for r in res["rounds"]]
            def floor(r, u):
                f = r[f"floor {size}"][name]
                return f["process"] if u["worker_start"] == "exec" else f["in"]
            ratio = med([u["wall_ms"] / 1e3 / floor(r, u) for r, u in zip(res["rounds"], us)])
            ph = lambda key: med([(u["phases_ms"] or {}).get(key) or 0 for u in us])
            print(f"  {name} {us[0]['worker_start']}: unit {med([u['wall_ms'] for u in us]):.0f} ms, floor "
                  f"{med([floor(r, u) for r, u in zip(res['rounds'], us)])*1e3:.0f} ms, ratio {ratio:.2f}x; "
                  f"load {ph('load'):.0f} run {ph('run'):.0f} ipc {ph('ipc'):.0f} data {ph('data'):.1f} "
                  f"score {ph('score'):.1f} exit {ph('exit'):.0f} other {ph('other'):.0f} "
                  f"data_decode {ph('data_decode'):.1f}; acc {us[0]['metrics']['accuracy']} ll {us[0]['metrics']['log_loss']}")
