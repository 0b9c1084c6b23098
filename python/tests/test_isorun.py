"""The Python API over the installed wheel: what a user of `import isorun`
relies on. Run by scripts/test-wheel in a fresh venv with the wheel,
tensorflow-cpu==2.21.0 and numpy."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import isorun
from conftest import REPO, alive, all_gone, descendants

SCRIPTS = Path(sysconfig.get_path("scripts"))


def cases(fixtures: Path) -> list[dict]:
    return [c for c in json.loads((fixtures / "manifest.json").read_text()) if c["expect_error"] is None]


def test_the_wheel_installs_both_binaries_side_by_side_and_the_supervisor_links_no_tensorflow():
    for name in ("isorun", "isorun-worker"):
        assert (SCRIPTS / name).is_file() and os.access(SCRIPTS / name, os.X_OK), name
    assert isorun._binary.executable() == str(SCRIPTS / "isorun")
    # The supervisor's own dynamic section: no libtensorflow among what it needs.
    if shutil.which("readelf"):
        needed = subprocess.run(["readelf", "-d", str(SCRIPTS / "isorun")], capture_output=True, text=True, check=True)
        assert "tensorflow" not in needed.stdout, needed.stdout
        worker = subprocess.run(["readelf", "-d", str(SCRIPTS / "isorun-worker")], capture_output=True, text=True)
        assert "libtensorflow_cc.so.2" in worker.stdout, worker.stdout


def test_doctor_says_workers_use_the_environments_tensorflow():
    env = {k: v for k, v in os.environ.items() if k != "ISORUN_LIBTENSORFLOW_DIR"}
    ran = subprocess.run([str(SCRIPTS / "isorun"), "doctor"], capture_output=True, text=True, env=env)
    # `name  status  detail`, the columns two spaces apart or more.
    lines = {m[1]: (m[2], m[3]) for m in re.finditer(r"^(\S+(?: \S+)?)\s{2,}(\S+)\s{2,}(.*)$", ran.stdout, re.M)}
    site = sysconfig.get_path("purelib")
    assert lines["libtensorflow"] == (
        "ok",
        f"{site}/tensorflow (TensorFlow 2.21.0, from the tensorflow-cpu package of the Python environment)",
    ), ran.stdout
    assert lines["worker"] == ("ok", str(SCRIPTS / "isorun-worker")), ran.stdout
    assert lines["worker start"] == ("ok", "isorun-worker 0.1.0 (TensorFlow 2.21.0)"), ran.stdout
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_the_seeds_loop_through_isorun_gives_the_clis_outputs(fixtures: Path, tmp_path: Path):
    # The seed's loop was: for each model, tf.saved_model.load, call the
    # signature, del, clear_session, gc.collect. Here: isorun.run per case.
    checked = 0
    for case in cases(fixtures):
        model = fixtures / "models" / case["model"]
        inputs = fixtures / "expected" / case["case"] / "inputs.npz"
        results = list(isorun.run([model], inputs, signature=case["signature"], jobs=1))
        assert [r.model for r in results] == [case["model"]]
        result = results[0]
        assert result.ok, (case["case"], result.status, result.error)
        assert result.error is None and result.wall_ms is not None and result.peak_rss_bytes > 0
        assert set(result.outputs) == set(case["outputs"]), case["case"]

        cli_out = tmp_path / case["case"]
        cli = subprocess.run(
            [str(SCRIPTS / "isorun"), "run", str(model), "--inputs", str(inputs), "--signature", case["signature"],
             "--json", "-j", "1", "--output-dir", str(cli_out)],
            capture_output=True, text=True,
        )
        assert cli.returncode == 0, cli.stderr
        for name, value in result.outputs.items():
            from_cli = np.load(cli_out / case["model"] / f"{name}.npy")
            assert value.dtype == from_cli.dtype and value.shape == from_cli.shape, (case["case"], name)
            assert np.array_equal(value, from_cli), (case["case"], name)
            expected = fixtures / "expected" / case["case"] / "outputs" / f"{name}.npy"
            if expected.is_file() and value.dtype.kind == "f":
                np.testing.assert_allclose(value, np.load(expected).astype(value.dtype), rtol=1e-5, atol=1e-6)
        checked += 1
    assert checked >= 8


def test_many_models_stream_in_model_order_with_arrays_as_inputs(made_models: Path):
    x = np.arange(5, dtype=np.float32)
    results = isorun.run([made_models / "a_double", made_models / "b_abort"], {"x": x}, jobs=2)
    first = next(results)
    assert (first.model, first.status) == ("a_double", "ok")
    np.testing.assert_array_equal(first.outputs["y"], x * 2)
    rest = list(results)
    assert [r.model for r in rest] == ["b_abort"]


def test_numpys_default_float64_is_cast_to_the_signatures_float32(made_models: Path):
    [doubled] = isorun.run(made_models / "a_double", {"x": np.ones(3)})
    assert doubled.ok, doubled
    assert doubled.record["cast"] == {"x": "float64→float32"}
    np.testing.assert_array_equal(doubled.outputs["y"], np.full(3, 2, np.float32))
    [strict] = isorun.run(made_models / "a_double", {"x": np.ones(3)}, strict_dtypes=True)
    assert strict.status == "error" and strict.error is not None, strict
    assert strict.error.kind == "input_mismatch"
    assert "x.astype(np.float32)" in strict.error.message
    with pytest.raises(isorun.UsageError, match=r"no inputs given[^\n]*\n  a_double: x \(float32, \[\?\]\)"):
        list(isorun.run(made_models / "a_double"))


def test_a_crashing_model_is_a_result_and_the_next_model_still_runs(made_models: Path):
    x = np.ones(3, np.float32)
    results = list(isorun.run([made_models / "b_abort", made_models / "a_double"], {"x": x}, jobs=1, timeout=60))
    by_model = {r.model: r for r in results}
    assert set(by_model) == {"a_double", "b_abort"}
    crashed = by_model["b_abort"]
    assert crashed.status == "crashed", crashed
    assert crashed.record.get("signal_name") == "SIGABRT", crashed.record
    assert crashed.error is not None and "SIGABRT" in crashed.error.message
    assert crashed.outputs == {}
    assert by_model["a_double"].ok


def test_a_timeout_is_a_result(made_models: Path):
    [spun] = isorun.run(made_models / "c_spin", {"x": np.ones(1, np.float32)}, timeout=1.5)
    assert spun.status == "timeout", spun
    assert not spun.ok and spun.outputs == {}


def test_leaving_the_loop_early_stops_isorun_and_its_workers(made_models: Path):
    run = isorun.run([made_models / "a_double", made_models / "c_spin"], {"x": np.ones(2, np.float32)}, jobs=2)
    first = next(run)
    assert first.model == "a_double" and first.ok
    deadline = time.monotonic() + 30
    while not any(alive(p) for p in descendants(run.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    below = descendants(run.pid)
    assert below, "the spinning model's worker should be running"
    pid = run.pid
    run.close()
    assert not alive(pid)
    assert all_gone(below), [p for p in below if alive(p)]
    assert list(run) == []


def test_ctrl_c_ends_the_run_and_leaves_no_process(made_models: Path, tmp_path: Path):
    script = textwrap.dedent(f"""
        import sys, numpy as np, isorun
        run = isorun.run([{str(made_models / "c_spin")!r}], {{"x": np.ones(2, np.float32)}})
        print(run.pid, flush=True)
        try:
            for result in run:
                print("result", result.status, flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(42)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    isorun_pid = int(child.stdout.readline())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = [p for p in descendants(isorun_pid) if alive(p)]
        if workers:
            break
        time.sleep(0.05)
    assert workers, "no worker started"
    time.sleep(0.5)  # the worker is spinning in the model
    below = descendants(isorun_pid)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 42, out
    assert "interrupted" in out and "result" not in out, out
    assert not alive(isorun_pid)
    assert all_gone(below), [p for p in below if alive(p)]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _started_here(before: set[int]) -> list[int]:
    """The isorun process this test started (a child of this process that
    was not there before) and every process below it, read once a worker
    is running below it: the pids that must all end when the run stops."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        mine = []
        for pid in descendants(os.getpid()):
            try:
                if pid not in before and _parent(pid) == os.getpid() and alive(pid):
                    mine.append(pid)
            except (OSError, ValueError):
                pass
        below = [p for pid in mine for p in descendants(pid) if alive(p)]
        if mine and below:
            time.sleep(0.5)  # the spinning model's worker is in the model
            return mine + [p for pid in mine for p in descendants(pid)]
        time.sleep(0.05)
    pytest.fail("no isorun process with a worker below it started")


def _spin_between_doubles(made_models: Path, tmp_path: Path) -> list[Path]:
    """a_double, e_spin_rows (runs until stopped or its timeout), z_double:
    with -j 1, a run still going after the first result, and one that would
    write z_double's outputs (or predictions) later if it were not stopped."""
    shutil.copytree(made_models / "a_double", tmp_path / "z_double")
    return [made_models / "a_double", made_models / "e_spin_rows", tmp_path / "z_double"]


def _stopped(pids: list[int], outputs: Path) -> None:
    """Every pid ends within 5 s, and what the run wrote stays as it was."""
    assert pids
    assert all_gone(pids, within=5.0), [p for p in pids if alive(p)]
    written = sorted(p.name for p in outputs.iterdir())
    assert written and not any("z_double" in name for name in written), written
    time.sleep(0.5)
    assert sorted(p.name for p in outputs.iterdir()) == written


def test_a_break_out_of_the_loop_stops_isorun_and_every_process_below_it(made_models: Path, tmp_path: Path):
    # Issue 42: the stderr reader held the run, so a `break` left isorun and
    # its workers going until the whole job was done.
    models = _spin_between_doubles(made_models, tmp_path)
    before = set(descendants(os.getpid()))
    seen = []
    for result in isorun.run(models, {"x": np.ones(2, np.float32)}, jobs=1, timeout=10, output_dir=tmp_path / "out"):
        seen.append(result.model)
        pids = _started_here(before)
        break
    assert seen == ["a_double"]
    _stopped(pids, tmp_path / "out")


def test_a_break_out_of_evaluate_stops_it_and_no_more_predictions_are_written(made_models: Path, tmp_path: Path):
    # The issue's own case: evaluate(..., predictions="preds/"), then break.
    models = _spin_between_doubles(made_models, tmp_path)
    data = tmp_path / "data.csv"
    data.write_text("x,label\n" + "".join(f"{i / 10},{i / 5}\n" for i in range(20)))
    before = set(descendants(os.getpid()))
    for result in isorun.evaluate(models, data=data, label="label", metrics=["mse"], jobs=1, timeout=10,
                                  predictions=tmp_path / "preds"):
        assert (result.model, result.status) == ("a_double", "ok"), result
        pids = _started_here(before)
        break
    _stopped(pids, tmp_path / "preds")


def test_a_collected_run_stops_isorun_and_every_process_below_it(made_models: Path, tmp_path: Path):
    import gc

    models = _spin_between_doubles(made_models, tmp_path)
    before = set(descendants(os.getpid()))
    it = isorun.run(models, {"x": np.ones(2, np.float32)}, jobs=1, timeout=10, output_dir=tmp_path / "out")
    assert next(it).model == "a_double"
    pids = _started_here(before)
    del it
    gc.collect()
    _stopped(pids, tmp_path / "out")


def test_an_exception_inside_the_loop_stops_isorun_and_every_process_below_it(made_models: Path, tmp_path: Path):
    models = _spin_between_doubles(made_models, tmp_path)
    before = set(descendants(os.getpid()))
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="raised inside the loop"):
        for _ in isorun.run(models, {"x": np.ones(2, np.float32)}, jobs=1, timeout=10, output_dir=tmp_path / "out"):
            pids = _started_here(before)
            raise RuntimeError("raised inside the loop")
    _stopped(pids, tmp_path / "out")


def test_a_run_left_open_when_python_exits_is_stopped(made_models: Path, tmp_path: Path):
    # A notebook kernel restarted (or a script ending) with a run still held.
    models = _spin_between_doubles(made_models, tmp_path)
    script = textwrap.dedent(f"""
        import sys, numpy as np, isorun
        run = isorun.run({[str(m) for m in models]!r}, {{"x": np.ones(2, np.float32)}}, jobs=1, timeout=10,
                         output_dir={str(tmp_path / "out")!r})
        print(next(run).model, run.pid, flush=True)
        sys.stdin.readline()
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first, isorun_pid = child.stdout.readline().split()
    assert first == "a_double"
    pid = int(isorun_pid)
    deadline = time.monotonic() + 30
    while not any(alive(p) for p in descendants(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    pids = [pid] + descendants(pid)
    assert len(pids) > 1, "the spinning model's worker should be running"
    child.communicate("\n", timeout=30)
    assert child.returncode == 0
    _stopped(pids, tmp_path / "out")


def test_bad_arguments_raise_with_isoruns_message(tmp_path: Path, made_models: Path):
    with pytest.raises(isorun.UsageError, match="no such file or directory") as raised:
        list(isorun.run(tmp_path / "missing"))
    assert raised.value.exit_code == 2
    with pytest.raises(isorun.UsageError, match="--no-such-option"):
        list(isorun.run(made_models / "a_double", no_such_option=1))
    with pytest.raises(isorun.UsageError, match="--jobs 0"):
        list(isorun.run(made_models / "a_double", jobs=0))
    with pytest.raises(isorun.UsageError):
        list(isorun.run(made_models / "a_double", {"x": tmp_path / "missing.npy"}))
    with pytest.raises(TypeError):
        isorun.run(made_models / "a_double", inputs=[1, 2, 3])
    with pytest.raises(TypeError):
        isorun.run(made_models / "a_double", json=True)
    with pytest.raises(isorun.UsageError):
        isorun.run([])
    with pytest.raises(isorun.UsageError, match="no such file"):
        isorun.inspect(tmp_path / "missing")


def test_a_missing_libtensorflow_is_a_usage_error_saying_how_to_get_one(made_models: Path, tmp_path: Path):
    os.environ["ISORUN_LIBTENSORFLOW_DIR"] = str(tmp_path)
    try:
        with pytest.raises(isorun.UsageError, match="pip install tensorflow-cpu|fetch-libtensorflow"):
            list(isorun.run(made_models / "a_double"))
    finally:
        del os.environ["ISORUN_LIBTENSORFLOW_DIR"]


def test_inspect_reads_the_signatures(fixtures: Path):
    described = isorun.inspect(fixtures / "models" / "multi_sig")
    signatures = described["meta_graphs"][0]["signatures"]
    assert {"add", "mixed", "serving_default"} <= set(signatures)
    assert signatures["add"]["inputs"]["a"]["dtype"] == "int64"
    assert signatures["add"]["inputs"]["a"]["shape"] == [None], "an unknown size is None (JSON null)"


def test_evaluate_gives_the_metrics_of_isorun_eval(fixtures: Path):
    eval_fixtures = fixtures / "eval"
    expected = next(c for c in json.loads((eval_fixtures / "expected.json").read_text())["cases"] if c["name"] == "binary")
    [result] = isorun.evaluate(
        eval_fixtures / "models" / "binary",
        data=eval_fixtures / "data" / "data.tfrecord",
        label=expected["label"],
        metrics=["accuracy", "auc"],
        jobs=1,
    )
    assert result.ok, result
    assert result.examples == expected["examples"]
    assert result.metrics["accuracy"] == pytest.approx(expected["metrics"]["accuracy"], abs=1e-9)
    assert result.metrics["auc"] == pytest.approx(expected["metrics"]["auc"], rel=1e-6)


def test_evaluate_scores_a_model_with_a_string_head_without_writing_outputs(made_models: Path, fixtures: Path):
    # isorun eval scores `probability` and ignores `classes`; the API used to
    # pass --output-dir always, and writing the string head failed every unit.
    eval_fixtures = fixtures / "eval"
    [result] = isorun.evaluate(
        made_models / "d_classes",
        data=eval_fixtures / "data" / "data.tfrecord",
        label="label_bin",
        metrics=["accuracy"],
        output="probability",
        jobs=1,
    )
    assert result.ok, result
    assert result.examples > 0 and 0.0 <= result.metrics["accuracy"] <= 1.0


def test_python_m_isorun_is_the_binary():
    ran = subprocess.run([sys.executable, "-m", "isorun", "--version"], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.startswith("isorun "), ran.stdout + ran.stderr


def test_outputs_are_kept_only_when_an_output_dir_is_given(made_models: Path, tmp_path: Path):
    [kept] = isorun.run(made_models / "a_double", {"x": np.ones(2, np.float32)}, output_dir=tmp_path / "out")
    assert kept.ok and (tmp_path / "out" / "a_double" / "y.npy").is_file()
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "a_double" / "y.npy"), kept.outputs["y"])
    shutil.rmtree(tmp_path / "out")


def test_keras_files_export_with_the_python_isorun_is_installed_in(fixtures: Path, tmp_path: Path, monkeypatch):
    # A cache of its own, so the export really runs (no entry from another test),
    # and no --python: the wheel's isorun finds this venv's python3 beside it.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ISORUN_PYTHON", raising=False)
    [result] = isorun.evaluate(
        fixtures / "keras" / "iris.keras",
        data=REPO / "examples" / "eval" / "iris.tfrecord",
        label="species",
        metrics=["accuracy"],
        jobs=1,
    )
    assert result.ok, result
    assert result.examples == 150
    export = result.record["export"]
    assert export["from"] == "keras" and export["cached"] is False, export


def test_an_onnx_model_runs_beside_numpy_as_onnxruntime_would(fixtures: Path):
    # two_inputs.onnx: sum = a + b, product = a * b (onnx.helper, float32 [batch, 3]).
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 1.5, np.float32)
    [result] = isorun.run(fixtures / "onnx" / "two_inputs.onnx", {"a": a, "b": b})
    assert result.ok, result
    np.testing.assert_array_equal(result.outputs["sum"], a + b)
    np.testing.assert_array_equal(result.outputs["product"], a * b)
    assert result.record["onnxruntime"]["execution_provider"] == "cpu", result.record


def test_evaluate_scores_an_onnx_classifier_as_onnxruntime_predicts(fixtures: Path):
    # sklearn_columns.onnx (skl2onnx): inputs f0..f3 [batch, 1], fed from iris.csv's columns;
    # expected.json holds onnxruntime's own accuracy on those 30 rows.
    expected = json.loads((fixtures / "onnx" / "expected.json").read_text())["iris"]
    [result] = isorun.evaluate(
        fixtures / "onnx" / "sklearn_columns.onnx",
        data=fixtures / "onnx" / "iris.csv",
        label="label",
        metrics=["accuracy"],
        output="probabilities",
        jobs=1,
    )
    assert result.ok, result
    assert result.examples == expected["rows"]
    assert abs(result.metrics["accuracy"] - expected["accuracy"]) < 1e-12, result.metrics
    assert result.record["onnxruntime"]["execution_provider"] == "cpu", result.record


def test_python_m_isorun_fetch_onnxruntime_fills_the_cache_workers_load(fixtures: Path, tmp_path: Path, monkeypatch):
    target = tmp_path / "ort"
    monkeypatch.setenv("ISORUN_ONNXRUNTIME_DIR", str(target))
    ran = subprocess.run([sys.executable, "-m", "isorun", "fetch-onnxruntime"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    libraries = sorted(p.name for p in target.glob("libonnxruntime.so.1.*"))
    assert libraries and (target / ".complete").is_file(), list(target.iterdir())
    again = subprocess.run([sys.executable, "-m", "isorun", "fetch-onnxruntime"], capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr
    [result] = isorun.run(fixtures / "onnx" / "mlp.onnx", {"x": np.ones((1, 4), np.float32)})
    assert result.ok, result
    assert result.record["onnxruntime"]["library"].startswith(str(target)), result.record
