"""Fixtures of the Python API's tests (scripts/test-wheel runs them in a
fresh venv holding the wheel, tensorflow-cpu and numpy): the repository's
fixture models, and a few models made here with TensorFlow in a child
process (this process never imports TensorFlow: the tests check that)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

MAKE_MODELS = r'''
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
root = sys.argv[1]

class Double(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": x * 2.0}

class Abort(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def __call__(self, x):
        with tf.control_dependencies([tf.raw_ops.Abort(error_msg="this model aborts on purpose")]):
            return {"y": tf.identity(x)}

class Spin(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def __call__(self, x):
        _, total = tf.while_loop(lambda i, t: i < 10**15, lambda i, t: (i + 1, t + tf.reduce_sum(x)),
                                 [tf.constant(0, tf.int64), tf.constant(0.0)])
        return {"y": total}

class SpinRows(tf.Module):
    """c_spin with an output of one value per row, as eval's metrics take."""
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def __call__(self, x):
        _, total = tf.while_loop(lambda i, t: i < 10**15, lambda i, t: (i + 1, t + tf.reduce_sum(x)),
                                 [tf.constant(0, tf.int64), tf.constant(0.0)])
        return {"y": x + total}

class Classes(tf.Module):
    """A binary classifier with a string `classes` head beside its probability."""
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def __call__(self, x):
        p = tf.sigmoid(tf.reduce_sum(x, axis=1, keepdims=True))
        return {"probability": p, "classes": tf.where(p > 0.5, "positive", "negative")}
for name, module in [("a_double", Double()), ("b_abort", Abort()), ("c_spin", Spin()), ("d_classes", Classes()),
                     ("e_spin_rows", SpinRows())]:
    tf.saved_model.save(module, os.path.join(root, name), signatures={"serving_default": module.__call__})
'''


@pytest.fixture(scope="session")
def made_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a_double (y = 2x), b_abort (the worker calls abort()), c_spin (runs
    until stopped): input `x` float32 [None], output `y`; d_classes: input
    `x` float32 [None, 4], outputs `probability` and a string `classes`;
    e_spin_rows: c_spin whose `y` is float32 [None], so eval scores it."""
    root = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, "-c", MAKE_MODELS, str(root)], check=True)
    return root


@pytest.fixture(scope="session")
def fixtures() -> Path:
    if not (FIXTURES / "manifest.json").is_file():
        pytest.fail(f"no fixtures at {FIXTURES} (scripts/make-fixtures makes them)")
    return FIXTURES


@pytest.fixture(autouse=True)
def no_tensorflow_in_this_process():
    yield
    assert "tensorflow" not in sys.modules, "the API imported TensorFlow"


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def all_gone(pids: list[int], within: float = 10.0) -> bool:
    """Whether every one of `pids` has ended within `within` seconds."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
