#!/usr/bin/env python3
"""`isorun pipe` against its fair floors, side by side (scripts/bench --pipe-only).

One tiny model, the same JSON request lines for every way:
  - `isorun pipe MODEL` (the worker in its own sandboxed process), one request
    at a time and with `--max-batch 64` (waiting lines run as one batch);
  - the in-process floor `isorun-worker --in-process --pipe MODEL`: the same
    JSON parsing and answer code (isorun_tensors::pipe) and the same C API
    calls in one process, with and without `--caller-thread` (ops on the
    calling thread);
  - a Python loop (`json` + a signature loaded with tf.saved_model.load),
    when --python names an interpreter with TensorFlow.

Two measures, each way alternating within a round:
  - throughput: every line written to stdin at once; the steady rate is the
    answers after the first over the time from the first answer to the last
    (the first pays the start and the model load);
  - latency: one line at a time, the next written when the answer to the last
    has come (a closed loop, as a client waiting for each answer), p50/p99.

Writes JSON to --output. Not part of scripts/test.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PYTHON_LOOP = r'''
import json, sys
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
fn = model.signatures[sys.argv[2]]
specs = fn.structured_input_signature[1]
for line in sys.stdin:
    if not line.strip():
        continue
    request = json.loads(line)
    inputs = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in request["inputs"].items()}
    outputs = fn(**inputs)
    answer = {"id": request.get("id"), "outputs": {
        k: {"dtype": v.dtype.name, "shape": v.shape.as_list(), "values": v.numpy().tolist()}
        for k, v in sorted(outputs.items())}}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
'''


def log(message):
    print(f"bench_pipe: {message}", file=sys.stderr, flush=True)


def throughput(command, requests_path, n, env):
    started = time.perf_counter()
    with open(requests_path) as stdin:
        p = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        stamps, errors, first_answer = [], 0, None
        for line in p.stdout:
            stamps.append(time.perf_counter())
            if first_answer is None:
                first_answer = line
            if '"error"' in line:
                errors += 1
        err = p.stderr.read()
        code = p.wait()
    wall = time.perf_counter() - started
    if code != 0 or errors or len(stamps) != n:
        raise SystemExit(f"bench_pipe: {command[0]}: exit {code}, {len(stamps)} answers, {errors} errors:\n{err[-3000:]}")
    steady = stamps[-1] - stamps[0]
    return {"wall_s": wall, "first_s": stamps[0] - started, "steady_s": steady,
            "rate": (n - 1) / steady if steady > 0 else None, "answer": first_answer}


def latency(command, line, n, env):
    p = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         text=True, bufsize=1)
    times = []
    try:
        for i in range(n + 1):
            t = time.perf_counter()
            p.stdin.write(line)
            p.stdin.flush()
            answer = p.stdout.readline()
            took = time.perf_counter() - t
            if '"outputs"' not in answer:
                p.kill()
                raise SystemExit(f"bench_pipe: {command[0]} answered {answer.strip()!r}:\n{p.stderr.read()[-3000:]}")
            if i > 0:  # the first pays the start and the load
                times.append(took)
    finally:
        p.stdin.close()
        p.wait()
    times.sort()
    return {"p50_ms": 1e3 * times[len(times) // 2], "p99_ms": 1e3 * times[min(len(times) - 1, int(len(times) * 0.99))],
            "mean_ms": 1e3 * statistics.fmean(times)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--isorun", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", default="x", help="the signature's input name")
    parser.add_argument("--row", default="[1, 2, 3, 4]", help="one row of that input, as JSON")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--latency-requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", help="an interpreter with tensorflow, for the Python loop")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    env = dict(os.environ)
    work = tempfile.mkdtemp(prefix="bench-pipe-")
    line = json.dumps({"id": 0, "inputs": {args.input: [json.loads(args.row)]}}) + "\n"
    requests_path = os.path.join(work, "requests.jsonl")
    with open(requests_path, "w") as f:
        for i in range(args.requests):
            f.write(json.dumps({"id": i, "inputs": {args.input: [json.loads(args.row)]}}) + "\n")
    python_loop = os.path.join(work, "python_loop.py")
    with open(python_loop, "w") as f:
        f.write(PYTHON_LOOP)

    ways = {
        "pipe": [args.isorun, "pipe", args.model],
        "pipe_inter_op_pool": [args.isorun, "pipe", args.model, "--ops-on-caller-thread", "false"],
        "pipe_batch64": [args.isorun, "pipe", args.model, "--max-batch", "64"],
        "floor": [args.worker, "--in-process", "--pipe", args.model],
        "floor_caller_thread": [args.worker, "--in-process", "--pipe", "--caller-thread", args.model],
    }
    if args.python:
        ways["python"] = [args.python, python_loop, args.model, "serving_default"]
    results = {"requests": args.requests, "latency_requests": args.latency_requests, "model": args.model,
               "throughput": {w: [] for w in ways}, "latency": {w: [] for w in ways if w != "pipe_batch64"}}
    answers = {}
    for r in range(args.rounds):
        for way, command in ways.items():
            log(f"round {r + 1}/{args.rounds}: {way} throughput ({args.requests} lines) ...")
            t = throughput(command, requests_path, args.requests, env)
            answers[way] = t.pop("answer")
            results["throughput"][way].append(t)
        for way, command in ways.items():
            if way == "pipe_batch64":
                continue
            log(f"round {r + 1}/{args.rounds}: {way} latency ({args.latency_requests} lines, one at a time) ...")
            results["latency"][way].append(latency(command, line, args.latency_requests, env))
    # The same answer from every way (the Python loop writes its own JSON: values compared).
    values = {w: json.loads(a)["outputs"] for w, a in answers.items()}
    reference = values["floor"]
    results["same_answers"] = all(
        {k: v["values"] for k, v in out.items()} == {k: v["values"] for k, v in reference.items()}
        for w, out in values.items() if w != "python")
    if "python" in values:
        py = values["python"]
        results["python_max_abs_diff"] = max(
            abs(a - b) for k in reference for a, b in zip(flat(reference[k]["values"]), flat(py[k]["values"])))
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    med = {w: statistics.median(t["rate"] for t in ts) for w, ts in results["throughput"].items()}
    for w, rate in med.items():
        lat = results["latency"].get(w)
        p50 = statistics.median(x["p50_ms"] for x in lat) if lat else float("nan")
        p99 = statistics.median(x["p99_ms"] for x in lat) if lat else float("nan")
        log(f"{w:22s} {rate:9.0f} requests/s   p50 {p50:.3f} ms   p99 {p99:.3f} ms")


def flat(values):
    if isinstance(values, list):
        for v in values:
            yield from flat(v)
    else:
        yield values


if __name__ == "__main__":
    main()
