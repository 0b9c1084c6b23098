"""What the host does to a timed run that is not the run's own work: the
bench scripts (scripts/bench_*.py) read the files a way will read just before
timing it, and record how much the run still read from disk.

Why: on the VMs these benches run on, the host takes file pages back within
a minute even with most of the memory free (libtensorflow_cc.so.2, 790 MB,
read in 2.5 s from the page cache and in 20.8 s 45 s later). A first run
then measures the disk, not isorun or Keras, and two ways that read
different files (isorun's libtensorflow beside Python's TensorFlow) pay it
unequally. Warming both puts them on the same footing; the bytes read during
the run say whether it held.
"""
import os
import statistics
import subprocess
import time


def disk_read_bytes():
    """Bytes read from the machine's disks so far (/proc/diskstats, whole
    disks only: partitions would count twice; loop and ram devices left out)."""
    disks = {d for d in os.listdir("/sys/block") if not d.startswith(("loop", "ram", "zram"))}
    total = 0
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[2] in disks:
                total += int(fields[5]) * 512
    return total


def python_files(python):
    """The files a `import tensorflow, keras` in the given interpreter maps
    or imports: its shared libraries (/proc/self/maps) and its modules'
    compiled and source files (found once; what that import will read)."""
    script = (
        "import sys, os, tensorflow\n"
        "try:\n    import keras\nexcept ImportError:\n    pass\n"
        "files = set()\n"
        "for line in open('/proc/self/maps'):\n"
        "    path = line.split(None, 5)[-1].strip()\n"
        "    if path.startswith('/') and os.path.isfile(path):\n"
        "        files.add(path)\n"
        "for m in list(sys.modules.values()):\n"
        "    for f in (getattr(m, '__file__', None), getattr(m, '__cached__', None)):\n"
        "        if f and os.path.isfile(f):\n"
        "            files.add(f)\n"
        "print('\\n'.join(sorted(files)))\n"
    )
    out = subprocess.run([python, "-c", script], check=True, capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout
    return [line for line in out.splitlines() if line]


def _wanted(name):
    return ".so" in name or name.endswith((".pyc", ".py", ".keras", ".pb", ".npz", ".npy", ".tfrecord"))


def warm(paths):
    """Reads every file under paths that a run maps or imports (shared
    libraries, Python modules, models, inputs) so it starts from the page
    cache. Returns (bytes read, seconds)."""
    began, total, seen = time.monotonic(), 0, set()
    buffer = bytearray(1 << 20)
    for path in paths:
        if os.path.isfile(path):
            files = [path]
        else:
            files = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names if _wanted(n)]
        for file in files:
            file = os.path.realpath(file)
            if file in seen:
                continue
            seen.add(file)
            try:
                with open(file, "rb", buffering=0) as f:
                    while True:
                        got = f.readinto(buffer)
                        if not got:
                            break
                        total += got
            except OSError:
                continue
    return total, time.monotonic() - began


def libtensorflow(repo):
    """isorun's libtensorflow folder (the checkout's `.libtensorflow`)."""
    return os.path.realpath(os.path.join(repo, ".libtensorflow"))


def way_files(python, repo, isorun):
    """What every way of a bench reads before its own inputs: Python's
    TensorFlow and Keras as their import maps them, isorun's libtensorflow,
    isorun and the isorun-worker beside it."""
    isorun = os.path.realpath(isorun)
    return python_files(python) + [libtensorflow(repo), isorun, os.path.join(os.path.dirname(isorun), "isorun-worker")]


def warmed(inputs, sentence=False):
    """How a page says what was warmed: `inputs` names the bench's own files;
    `sentence`: capitalised, to start one."""
    return (f"{'The' if sentence else 'the'} files every way reads (Python's TensorFlow and Keras as their import maps them, isorun's "
            f"libtensorflow and binaries, {inputs}) are read into the page cache before each timed run "
            f"(`scripts/bench_host.py`: this host takes file pages back within a minute, and a run from the disk "
            f"measures the disk)")


def reads_line(reads, inputs):
    """The Machine list's line on warming and what the runs still read, or None."""
    if not reads:
        return None
    return (f"- {warmed(inputs)}; the runs then read a median of {statistics.median(reads):.0f} MB from disk "
            f"(at most {max(reads):.0f} MB)")
