"""`isorun.map(fn, items)` (issue 40) with real processes: the user's own
function, each call in a fresh process forked from isorun's Python zygote.
Run by scripts/test-wheel in a fresh venv with the wheel (cloudpickle comes
with it) and numpy; quicker, from a checkout, against a debug build:

    cd python/tests && PYTHONPATH=../ ISORUN_BINARY=../../target/debug/isorun \\
        ../../target/wheel-test/venv/bin/python -m pytest -q test_map.py
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import isorun
from conftest import alive, all_gone, descendants

#: Module-level functions the tests map, in a module of their own: they go
#: by reference (the zygote imports this module), as a user's module's do.
FUNCTIONS = '''
import ctypes, os, time

def double(x):
    return x * 2

def fail_on_one(x):
    if x == 1:
        raise ValueError(f"item {x} is bad")
    return x

def segfault_on_one(x):
    if x == 1:
        ctypes.string_at(0)
    return x

def spin_on_pid_files(x):
    """Returns x, except for a path ending in .pid: writes its process id
    there, then spins until stopped."""
    if isinstance(x, str) and x.endswith(".pid"):
        with open(x, "w") as f:
            f.write(str(os.getpid()))
        while True:
            pass
    return x

def sleep_then_return(seconds):
    time.sleep(seconds)
    return seconds

def scale(array):
    return {"doubled": array * 2, "shape": array.shape}

def counted(item):
    """Appends its number to the file the item names, then returns an
    array (fails for 2)."""
    import numpy
    path, x = item
    with open(path, "a") as f:
        print(x, file=f)
    if x == 2:
        raise ValueError("two")
    return {"x": x, "array": numpy.arange(4) * 1.5}
'''


@pytest.fixture(scope="module")
def fns(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("map_functions")
    (folder / "isorun_map_functions.py").write_text(FUNCTIONS)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("isorun_map_functions")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("isorun_map_functions", None)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where `tempfile.mkdtemp` puts isorun.map's folder of pickles, so a
    test sees whether it was removed."""
    folder = tmp_path / "private"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _wait_for(path: Path, within: float = 60.0) -> int:
    """The process id a spinning call wrote into `path`."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    pytest.fail(f"no call wrote its pid into {path}")


def _child_env() -> dict:
    """A child Python's environment: this isorun package first on its path."""
    env = dict(os.environ)
    package = str(Path(isorun.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def test_import_isorun_imports_neither_numpy_nor_tensorflow():
    ran = subprocess.run(
        [sys.executable, "-c",
         "import isorun, sys; assert 'numpy' not in sys.modules and 'tensorflow' not in sys.modules, "
         "sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'tensorflow'))"],
        capture_output=True, text=True, env=_child_env(),
    )
    assert ran.returncode == 0, ran.stderr


def test_lambdas_closures_and_functions_of_main_travel_by_value_and_a_leaked_global_stays_in_its_process(
        tmp_path: Path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import json, isorun

        offset = 100
        seen = []

        def helper(x):
            return x * 3

        def make_adder(k):
            def add(x):
                return x + k + offset
            return add

        def remember(x):
            seen.append(x)  # a leak into a module global: it stays in the call's process
            return len(seen)

        out = {}
        for name, fn in [("lambda", lambda x: helper(x) + offset), ("closure", make_adder(5)),
                         ("function", remember)]:
            out[name] = [[r.item, r.status, r.value, r.record.get("function"), r.error and r.error.message]
                         for r in isorun.map(fn, [1, 2, 3])]
        out["seen"] = seen
        print(json.dumps(out))
    """))
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env=_child_env(), timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["lambda"] == [[i, "ok", i * 3 + 100, "__main__:<lambda>", None] for i in (1, 2, 3)], ran.stderr
    assert out["closure"] == [[i, "ok", i + 105, "__main__:make_adder.<locals>.add", None] for i in (1, 2, 3)]
    # Each call in a fresh process: the global each call appended to held only its own item.
    assert out["function"] == [[i, "ok", 1, "__main__:remember", None] for i in (1, 2, 3)]
    assert out["seen"] == []


def test_a_module_level_function_goes_by_reference_and_results_carry_the_items_themselves(fns, private_tmp: Path):
    items = [1, 2.5, "ab", (1, 2), [3]]
    results = list(isorun.map(fns.double, items))
    assert [r.item for r in results] == items
    assert all(r.item is item for r, item in zip(results, items)), "the items given, not copies"
    assert [(r.status, r.ok, r.error) for r in results] == [("ok", True, None)] * len(items)
    assert [r.value for r in results] == [2, 5.0, "abab", (1, 2, 1, 2), [3, 3]]
    assert results[0].record["function"] == "isorun_map_functions:double"
    assert [r.index for r in results] == list(range(len(items)))
    assert all(r.wall_ms is not None and r.peak_rss_bytes for r in results)
    assert list(private_tmp.iterdir()) == [], "the folder of pickles is removed at the end"


def test_an_exception_is_an_error_with_its_traceback_and_the_next_item_runs(fns):
    results = list(isorun.map(fns.fail_on_one, [0, 1, 2]))
    assert [r.status for r in results] == ["ok", "error", "ok"]
    failed = results[1]
    assert not failed.ok and failed.value is None
    assert failed.error.kind == "exception"
    assert failed.error.message == "ValueError: item 1 is bad"
    assert "Traceback" in failed.error.traceback and "fail_on_one" in failed.error.traceback
    assert 'raise ValueError(f"item {x} is bad")' in failed.error.traceback
    assert failed.error.traceback.rstrip().endswith("ValueError: item 1 is bad")
    assert results[2].value == 2


def test_a_segfault_is_a_crashed_result_and_the_next_item_runs(fns):
    results = list(isorun.map(fns.segfault_on_one, [0, 1, 2]))
    assert [r.status for r in results] == ["ok", "crashed", "ok"]
    assert results[1].record.get("signal") == "SIGSEGV", results[1].record
    assert results[1].value is None and results[1].error is not None
    assert results[2].value == 2


def test_a_timeout_is_a_result_and_its_process_is_gone(fns, tmp_path: Path):
    pid_file = tmp_path / "spin.pid"
    results = list(isorun.map(fns.spin_on_pid_files, [str(pid_file), "after"], timeout=2,
                              writable=[tmp_path]))
    assert [r.status for r in results] == ["timeout", "ok"], [r.record for r in results]
    assert results[0].value is None and results[1].value == "after"
    assert all_gone([int(pid_file.read_text())], within=5)


def test_a_large_numpy_array_goes_in_and_comes_back(fns):
    array = np.arange(100_000, dtype=np.float64).reshape(250, 400)  # 800 kB each way
    [result] = isorun.map(fns.scale, [array])
    assert result.ok, result.record
    assert result.item is array
    assert result.value["shape"] == (250, 400)
    doubled = result.value["doubled"]
    assert doubled.dtype == np.float64 and doubled.shape == (250, 400)
    np.testing.assert_array_equal(doubled, array * 2)
    assert "value" not in result.record and result.record["value_type"] == "dict"
    assert not Path(result.record["value_file"]).exists(), "the value's file is removed once read"


def test_a_value_over_the_cap_is_that_items_error_and_the_next_item_runs(fns):
    big = np.zeros(100_000, dtype=np.float64)  # 800 kB doubled
    small = np.zeros(4, dtype=np.float64)
    over, under = isorun.map(fns.scale, [big, small], value_cap="64K")
    assert (over.status, over.error.kind, over.value) == ("error", "value_too_large", None), over.record
    assert "value_file" not in over.record
    assert under.ok and under.value["shape"] == (4,)


def test_what_cannot_be_pickled_is_refused_before_any_process_starts(fns, tmp_path: Path, private_tmp: Path):
    before = {p for p in descendants(os.getpid()) if alive(p)}
    lock = threading.Lock()

    with pytest.raises(isorun.NotPicklable) as refused:
        isorun.map(lambda x: lock.locked() or x, [1, 2])
    message = str(refused.value)
    assert message.startswith("isorun.map: the function test_map:test_what_cannot_be_pickled_is_refused_before_any_"
                              "process_starts.<locals>.<lambda> cannot be sent to its worker processes through "
                              "`lock` in its closure (a _thread.lock)"), message
    assert "pass paths" in message and "load them inside the function" in message

    with open(tmp_path / "open.txt", "w") as handle:
        with pytest.raises(isorun.NotPicklable) as refused:
            isorun.map(fns.double, [1, handle, 3])
    message = str(refused.value)
    assert message.startswith("isorun.map: item 1 (<_io.TextIOWrapper name="), message
    assert "cannot be sent to a worker process" in message and "pass paths" in message

    assert {p for p in descendants(os.getpid()) if alive(p)} == before, "no process started"
    assert list(private_tmp.iterdir()) == [], "nothing left in the temp folder"


def test_a_break_stops_isorun_and_every_process_below_it_and_removes_the_pickles(fns, tmp_path: Path,
                                                                                private_tmp: Path):
    pid_file = tmp_path / "spin.pid"
    before = set(descendants(os.getpid()))
    seen = []
    for result in isorun.map(fns.spin_on_pid_files, ["first", str(pid_file), "never"], jobs=1, timeout=120,
                             writable=[tmp_path]):
        seen.append((result.item, result.status))
        spinning = _wait_for(pid_file)
        pids = [p for p in descendants(os.getpid()) if p not in before]
        break
    assert seen == [("first", "ok")]
    assert spinning in pids, (spinning, pids)
    assert all_gone(pids, within=5), [p for p in pids if alive(p)]
    assert list(private_tmp.iterdir()) == []


def test_ctrl_c_stops_the_map_and_leaves_no_process(tmp_path: Path):
    pid_file = tmp_path / "spin.pid"
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, isorun

        def spin(x):
            with open(x, "w") as f:
                f.write(str(os.getpid()))
            while True:
                pass

        run = isorun.map(spin, [{str(pid_file)!r}], writable=[{str(tmp_path)!r}])
        print(run.pid, flush=True)
        try:
            for result in run:
                print("result", result.status, flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(42)
    """))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                             env=_child_env())
    isorun_pid = int(child.stdout.readline())
    spinning = _wait_for(pid_file)
    below = descendants(isorun_pid)
    assert spinning in below
    child.send_signal(2)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 42, out
    assert "interrupted" in out and "result" not in out, out
    assert all_gone([isorun_pid] + below), [p for p in [isorun_pid] + below if alive(p)]


def test_a_map_resumed_after_its_caller_was_killed_runs_only_what_the_journal_lacks(tmp_path: Path):
    calls = tmp_path / "calls"
    calls.mkdir()
    script = tmp_path / "nightly.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, isorun

        def evaluate(x):
            with open(os.path.join({str(calls)!r}, "%d-%d" % (x, os.getpid())), "w"):
                pass
            return x * 10

        run = isorun.map(evaluate, list(range(6)), journal="journal.jsonl", resume=True, writable=[{str(calls)!r}])
        print(run.pid, flush=True)
        for r in run:
            print(r.item, r.status, r.value, r.record.get("resumed", False), flush=True)
    """))
    # Killed callers leave their temp folders: in tmp_path, not /tmp.
    (tmp_path / "tmp").mkdir()
    env = {**_child_env(), "TMPDIR": str(tmp_path / "tmp")}
    first = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                             env=env)
    isorun_pid = int(first.stdout.readline())
    assert first.stdout.readline().split() == ["0", "ok", "0", "False"]
    assert first.stdout.readline().split() == ["1", "ok", "10", "False"]
    # The node is lost: the caller and its isorun are killed, nothing stops cleanly.
    first.kill()
    os.kill(isorun_pid, 9)
    first.wait()
    assert all_gone([isorun_pid])
    done = [json.loads(line)["index"] for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert done[:2] == [0, 1]
    called_before = {name.name for name in calls.iterdir()}

    second = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                            env=env, timeout=300)
    assert second.returncode == 0, second.stderr
    rows = [line.split() for line in second.stdout.splitlines()[1:]]
    assert rows == [[str(i), "ok", str(i * 10), str(i in done)] for i in range(6)], (done, second.stdout)
    called_now = {name.name.split("-")[0] for name in calls.iterdir() if name.name not in called_before}
    assert called_now == {str(i) for i in range(6) if i not in done}


def test_a_resumed_map_runs_nothing_again_and_gives_back_the_earlier_values(fns, tmp_path: Path):
    calls = tmp_path / "calls.txt"
    journal = tmp_path / "journal.jsonl"
    items = [(str(calls), 1), (str(calls), 2)]
    first = list(isorun.map(fns.counted, items, journal=journal, writable=[tmp_path]))
    assert [r.status for r in first] == ["ok", "error"], [r.record for r in first]
    assert calls.read_text().split() == ["1", "2"]
    again = list(isorun.map(fns.counted, items, journal=journal, resume=True, writable=[tmp_path]))
    assert [r.status for r in again] == ["ok", "error"], [r.record for r in again]
    assert again[0].record.get("resumed") is True, again[0].record
    assert calls.read_text().split() == ["1", "2"], "no call ran again"
    assert again[0].value["x"] == 1
    np.testing.assert_array_equal(again[0].value["array"], np.arange(4) * 1.5)
    # Once more: the resumed value is still there for the next resume.
    third = list(isorun.map(fns.counted, items, journal=journal, resume=True, writable=[tmp_path]))
    assert calls.read_text().split() == ["1", "2"]
    np.testing.assert_array_equal(third[0].value["array"], np.arange(4) * 1.5)
    # A run without resume starts the journal, and its values, afresh.
    list(isorun.map(fns.counted, items, journal=journal, writable=[tmp_path]))
    assert calls.read_text().split() == ["1", "2", "1", "2"]
    assert len(list(Path(f"{journal}.values").iterdir())) == 1, "the earlier runs' values are gone"


def test_editing_a_module_level_functions_body_runs_its_items_again_on_resume(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch):
    # The function goes by reference (its pickle only names it): its source
    # must still be part of the journal's identity, as `isorun map`'s is.
    module = tmp_path / "isorun_map_edited.py"
    module.write_text("def answer(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delitem(sys.modules, "isorun_map_edited", raising=False)
    edited = importlib.import_module("isorun_map_edited")
    journal = tmp_path / "journal.jsonl"
    first = list(isorun.map(edited.answer, [1, 2], journal=journal))
    assert [r.value for r in first] == [2, 3], [r.record for r in first]
    assert first[0].record["function"] == "isorun_map_edited:answer"

    module.write_text("def answer(x):\n    return x + 100\n")
    edited = importlib.reload(edited)
    again = list(isorun.map(edited.answer, [1, 2], journal=journal, resume=True))
    assert [r.value for r in again] == [101, 102], [r.record for r in again]
    assert [r.record.get("resumed") for r in again] == [None, None], "the edited body ran"
    assert again[0].record["function"] == "isorun_map_edited:answer"

    unchanged = list(isorun.map(edited.answer, [1, 2], journal=journal, resume=True))
    assert [r.value for r in unchanged] == [101, 102], [r.record for r in unchanged]
    assert [r.record.get("resumed") for r in unchanged] == [True, True], "nothing changed: nothing ran"


def test_what_calls_print_reaches_the_callers_stderr_and_is_not_kept_in_its_memory(tmp_path: Path):
    script = tmp_path / "chatty.py"
    script.write_text(textwrap.dedent("""
        import json, resource, sys, isorun

        def chatty(x):
            line = "x" * 99
            for _ in range(100_000):  # 10 MB on stdout
                print(line)
            sys.stdout.flush()
            print(f"last line of item {x}", file=sys.stderr)
            return x

        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        values = [r.value for r in isorun.map(chatty, [1, 2, 3, 4])]
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"values": values, "grew_kib": after - before}))
    """))
    with open(tmp_path / "stderr.txt", "w") as stderr:
        ran = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=stderr, text=True,
                             cwd=tmp_path, env=_child_env(), timeout=300)
    said = (tmp_path / "stderr.txt").read_text()
    assert ran.returncode == 0, said[-4000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["values"] == [1, 2, 3, 4]
    for x in (1, 2, 3, 4):
        assert f"last line of item {x}\n" in said
    assert said.count("x" * 99 + "\n") == 400_000
    # 40 MB went through; what the caller keeps is a short tail.
    assert out["grew_kib"] < 8 * 1024, out


def test_records_show_a_json_item_as_itself_and_other_items_by_repr(fns, tmp_path: Path):
    items = [1, 2.5, "ab", [1, {"k": None}], (1, 2), {3}]
    journal = tmp_path / "journal.jsonl"
    results = list(isorun.map(fns.double, items, journal=journal))
    assert [r.record["item"] for r in results] == [1, 2.5, "ab", [1, {"k": None}], "(1, 2)", "{3}"]
    kept = [json.loads(line) for line in journal.read_text().splitlines()]
    assert sorted((r["index"], r["item"]) for r in kept)[:2] == [(0, 1), (1, 2.5)]


def test_results_come_in_item_order_whichever_call_ends_first(fns):
    items = [1.5, 0.75, 0.0]  # with three at once, the last ends first
    results = list(isorun.map(fns.sleep_then_return, items, jobs=3))
    assert [r.item for r in results] == items
    assert [(r.status, r.value) for r in results] == [("ok", s) for s in items]


def test_a_string_is_not_taken_for_a_list_of_items(fns):
    with pytest.raises(TypeError, match=r"items must be an iterable of items, not one str"):
        isorun.map(fns.double, "models/a")
