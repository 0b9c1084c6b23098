"""What every bench script (scripts/bench_*.py) shares: its progress lines
on stderr (log), the machine a run was measured on and how busy it was
(machine, machine_busy, children_cpu), and its own section of
BENCHMARKS.md rewritten in place (splice). One copy here, so that the
benches log, describe the machine and splice alike; each keeps only what
it measures. Only the standard library."""
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys


def logger(name):
    """A log function that writes `name: message` to stderr at once."""
    def log(message):
        print(f"{name}: {message}", file=sys.stderr, flush=True)
    return log


log = logger("bench")


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


def machine(repo):
    """The machine and checkout a run measured: CPU, cores, memory, kernel,
    date, commit (and whether it had uncommitted changes), Python, THP."""
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


def splice(path, section, text, after=None):
    """Replaces the section headed `section` (`## ...`) in the Markdown at
    path with text; a page without it gets it after the section headed
    `after` when there is one, else before `## Targets`, else at the end."""
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    body = text.rstrip() + "\n"
    start = old.find(f"\n{section}\n")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        new = old[: start + 1] + body + (old[end:] if end >= 0 else "")
    else:
        at = old.find(f"\n{after}\n") if after else -1
        at = old.find("\n## ", at + 1) if at >= 0 else old.find("\n## Targets\n")
        new = (old[: at + 1] + body + old[at:]) if at >= 0 else old.rstrip() + "\n\n" + body
    with open(path, "w") as f:
        f.write(new)


def vm(pid, key):
    """A /proc/PID/status field in bytes (VmRSS, VmHWM, ...); None when the
    process is gone or has no such line."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def publish(args, results, text, section, title, flag):
    """Writes a bench's results: its JSON to args.results, its Markdown
    section either as a page of its own (args.standalone, written by
    `./scripts/bench FLAG --quick`) or spliced into args.output, and the
    section to stderr."""
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(results, f, indent=1)
    if args.standalone:
        with open(args.output, "w") as f:
            f.write(f"# Benchmarks: {title}\n\nWritten by `./scripts/bench {flag} --quick`.\n\n" + text + "\n")
    else:
        splice(args.output, section, text)
    print(text, file=sys.stderr)
