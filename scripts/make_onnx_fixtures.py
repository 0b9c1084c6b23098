#!/usr/bin/env python3
"""Writes the small ONNX models under tests/fixtures/onnx/ that isorun's
ONNX reader (onnxproto/) and the onnx integration tests read, and what
ONNX Runtime's Python API gives on them, so that isorun's outputs can be
compared with onnxruntime's:

- graphs built with onnx.helper (mlp, dtypes, sequence_map, ir3, external,
  truncated, every_dtype, two_inputs, unknown_op, grow, total, spin, huge_external), so they are what the onnx
  package itself writes;
- scikit-learn classifiers converted by skl2onnx (sklearn_classifier,
  sklearn_columns, sklearn_zipmap);
- expected.json and inputs/*.npz for those and keras_tf2onnx.onnx, which
  scripts/make_onnx_tf_fixtures.py writes with tf2onnx (it needs
  TensorFlow: run it first, in its own venv; see its docstring);
- iris.npz (x float32 [30, 4], label int64 [30]) for sklearn_classifier and
  iris.csv (header f0,f1,f2,f3,label; one value a cell, as isorun eval reads
  CSV) for sklearn_columns, whose inputs are f0..f3 float32 [batch, 1]: 30
  labelled iris rows (every fifth) the classifiers were not trained on.

skl2onnx 1.20.0 writes sklearn_classifier.onnx with the default domain's
opset imported twice ("" 17 twice): kept, since that is what the tool
writes; its opset list is only sorted (skl2onnx's order follows
PYTHONHASHSEED). sklearn_zipmap.onnx's output_probability is
seq(map(int64, tensor(float))), which isorun refuses as unsupported_dtype.
unknown_op.onnx's com.example Frobnicate makes ONNX Runtime's load fail.

    python3 -m venv /tmp/onnx-venv
    /tmp/onnx-venv/bin/pip install onnx==1.23.2 onnxruntime==1.32.0 numpy==2.4.6 \\
        ml_dtypes==0.7.0 protobuf==7.36.2 scikit-learn==1.9.1 scipy==1.17.1 skl2onnx==1.20.0
    /tmp/onnx-venv/bin/python scripts/make_onnx_fixtures.py

expected.json was written with onnxruntime 1.32.0 (CPUExecutionProvider),
the version isorun's worker loads from ~/.cache/isorun/onnxruntime-1.32.0.
Its schema:

    {"onnxruntime": "1.32.0", "onnx": ..., "numpy": ..., "skl2onnx": ...,
     "models": {"<path under tests/fixtures/onnx>": {
         "inputs_npz": "inputs/<stem>.npz",   # the same inputs, np.savez
         "inputs":  {name: TENSOR},
         "outputs": {name: TENSOR or SEQUENCE},  # in the graph's order
         # or, for a model ONNX Runtime refuses to load, instead of both:
         "load_error": "<onnxruntime's message>"}}}
    TENSOR   = {"dtype": "float32", "shape": [2, 4], "values": nested lists}
    SEQUENCE = {"type": "seq(map(int64,tensor(float)))", "values": [{"0": p, ...}, ...]}

"dtype" is isorun's name (float32, bfloat16, string, ...); "values" are
nested lists in the tensor's shape as `isorun run --values` prints them,
except floats: each is its exact value (a float32 0.1 is
0.10000000149011612), so that it converts into its dtype exactly; isorun
prints the shortest decimal at the dtype's width (0.1), so compare after
converting both to the dtype. 64-bit integers exact, strings as UTF-8. A bfloat16
input is kept in its .npz as float32 (NumPy has no bfloat16; every value is
exact in both): its TENSOR says "npz_dtype": "float32". Strings are kept as
NumPy bytes (dtype 'S', UTF-8), which isorun reads.

bfloat16 is in every_dtype.onnx: ONNX Runtime 1.32's CPU provider has
Identity for it, though its Python API takes and gives it only as an
OrtValue (no NumPy type), so this script feeds and reads it that way: the
bfloat16 output from the part of the graph that computes it
(onnx.utils.Extractor), since run_with_ort_values takes no string input.

Deterministic (fixed seeds; scikit-learn's lbfgs is): the files only change
when a tool's serialisation or numbers do.
"""

import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "onnx")


# IR version 8 (ONNX 1.10): what ONNX Runtime releases of the last years
# all load; onnx's helper would write its newest.
IR_VERSION = 8


def save(model, name, check=True, **kwargs):
    if model.ir_version > IR_VERSION:
        model.ir_version = IR_VERSION
    if check:
        onnx.checker.check_model(model)
    path = os.path.join(OUT, name)
    onnx.save_model(model, path, **kwargs)
    print(f"{name}: {os.path.getsize(path)} bytes")
    return path


def opsets(*pairs):
    return [helper.make_opsetid(domain, version) for domain, version in pairs]


def mlp():
    """float32 [batch, 4] -> Gemm -> Relu -> float32 [batch, 3], weights inline."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                              producer_version="1.0")
    return model


def dtypes():
    """Several inputs and outputs of several dtypes, fixed, symbolic and unknown dims."""
    nodes = [
        helper.make_node("Identity", ["half"], ["half_out"]),
        helper.make_node("Identity", ["brain"], ["brain_out"]),
        helper.make_node("Identity", ["text"], ["text_out"]),
        helper.make_node("Not", ["flag"], ["flag_out"]),
        helper.make_node("Identity", ["ids"], ["ids_out"]),
        helper.make_node("Identity", ["small"], ["small_out"]),
    ]
    inputs = [
        helper.make_tensor_value_info("half", TensorProto.FLOAT16, ["batch", 8]),
        helper.make_tensor_value_info("brain", TensorProto.BFLOAT16, [2, "seq"]),
        helper.make_tensor_value_info("text", TensorProto.STRING, [None]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        helper.make_tensor_value_info("ids", TensorProto.INT64, None),
        helper.make_tensor_value_info("small", TensorProto.UINT8, ["batch", 3, 3]),
    ]
    outputs = [
        helper.make_tensor_value_info("half_out", TensorProto.FLOAT16, ["batch", 8]),
        helper.make_tensor_value_info("brain_out", TensorProto.BFLOAT16, [2, "seq"]),
        helper.make_tensor_value_info("text_out", TensorProto.STRING, [None]),
        helper.make_tensor_value_info("flag_out", TensorProto.BOOL, []),
        helper.make_tensor_value_info("ids_out", TensorProto.INT64, None),
        helper.make_tensor_value_info("small_out", TensorProto.UINT8, ["batch", 3, 3]),
    ]
    graph = helper.make_graph(nodes, "dtypes", inputs, outputs)
    return helper.make_model(graph, opset_imports=opsets(("", 18), ("ai.onnx.ml", 3)),
                             producer_name="isorun-fixtures", producer_version="1.0")


def sequence_map():
    """A ZipMap-like output: a sequence of maps (scikit-learn classifiers' probabilities)."""
    seq_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    probabilities = helper.make_value_info("probabilities", seq_type)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, ["n"])
    nodes = [
        helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0),
        helper.make_node("ZipMap", ["x"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1]),
    ]
    graph = helper.make_graph(nodes, "classifier", [x], [label, probabilities])
    return helper.make_model(graph, opset_imports=opsets(("", 17), ("ai.onnx.ml", 3)), producer_name="skl2onnx-like",
                             producer_version="0.0")


def old_ir():
    """IR version 3: the initializers are listed among the inputs too."""
    model = mlp()
    graph = model.graph
    for init in graph.initializer:
        graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    model.ir_version = 3
    del model.opset_import[:]
    model.opset_import.extend(opsets(("", 8)))
    # Gemm and Relu exist at opset 8; the checker knows IR 3 with opset 8.
    return model


# Identity per dtype in every_dtype.onnx: isorun's name, ONNX's element type.
EVERY_DTYPE = [
    ("float16", TensorProto.FLOAT16), ("bfloat16", TensorProto.BFLOAT16), ("bool", TensorProto.BOOL),
    ("string", TensorProto.STRING), ("int8", TensorProto.INT8), ("uint8", TensorProto.UINT8),
    ("int16", TensorProto.INT16), ("uint16", TensorProto.UINT16), ("int32", TensorProto.INT32),
    ("uint32", TensorProto.UINT32), ("int64", TensorProto.INT64), ("uint64", TensorProto.UINT64),
    ("float32", TensorProto.FLOAT), ("float64", TensorProto.DOUBLE),
]


def every_dtype():
    """x_<dtype> [batch, 3] -> Identity -> y_<dtype> [batch, 3], for each dtype ONNX Runtime's CPU provider runs."""
    nodes, inputs, outputs = [], [], []
    for name, elem in EVERY_DTYPE:
        nodes.append(helper.make_node("Identity", [f"x_{name}"], [f"y_{name}"], name=f"identity_{name}"))
        inputs.append(helper.make_tensor_value_info(f"x_{name}", elem, ["batch", 3]))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", elem, ["batch", 3]))
    graph = helper.make_graph(nodes, "every_dtype", inputs, outputs)
    return helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                             producer_version="1.0")


def two_inputs():
    """a, b float32 [batch, 3] -> sum = a + b, product = a * b."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["product"])],
        "two_inputs",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("product", TensorProto.FLOAT, ["batch", 3])],
    )
    return helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                             producer_version="1.0")


def grow():
    """shape int64 [1] -> ConstantOfShape(1.0) -> y float32 [n]: a 150-byte model that takes
    as much memory as its input asks for (a model that eats the machine)."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"],
                          value=numpy_helper.from_array(np.ones(1, np.float32), "value"))],
        "grow",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    return helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                             producer_version="1.0")


def spin():
    """n int64 [] -> Loop n times adding 1 -> y float32 []: a 300-byte model that runs as long
    as its input asks (10^12 turns: a model that hangs)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "turn",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "keep_going", "start"], ["y"], body=body)],
        "spin",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(True), "keep_going"),
         numpy_helper.from_array(np.array(0.0, np.float32), "start")],
    )
    return helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                             producer_version="1.0")


def huge_external():
    """x float32 [batch, 4] -> Identity -> y, beside an initializer w of 3 GiB (805,306,368 float32)
    kept in huge.bin (offset 0, length 3 GiB): a graph over protobuf's 2 GiB, as models that big
    are saved. The data file is not written here: a test makes it (sparse) beside a copy."""
    w = TensorProto()
    w.name = "w"
    w.data_type = TensorProto.FLOAT
    w.dims.extend([3 << 28])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "huge.bin"), ("offset", "0"), ("length", str(3 << 30))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "huge_external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                             producer_version="1.0")


def total():
    """x float32 [rows, cols] -> ReduceSum (every axis) -> total float32 []: a big input, a tiny
    output (the worker's memory then shows whether the input was copied)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)],
        "total",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "cols"])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
    )
    return helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                             producer_version="1.0")


def unknown_op():
    """x float32 [batch, 4] -> com.example.Frobnicate -> y: an op no ONNX Runtime has, so loading fails."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example", strength=3)],
        "unknown_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return helper.make_model(graph, opset_imports=opsets(("", 17), ("com.example", 1)),
                             producer_name="isorun-fixtures", producer_version="1.0")


def iris_split():
    """Iris (bundled with scikit-learn) as float32: every fifth row held out (30 rows, 10 per class)."""
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    held = np.arange(len(y)) % 5 == 0
    return x[~held], y[~held].astype(np.int64), x[held], y[held].astype(np.int64)


def sklearn_models(x_train, y_train):
    """LogisticRegression on iris through skl2onnx: without ZipMap ([batch, 4] and four [batch, 1]
    columns), and with its default ZipMap output (a sequence of maps)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    target = {"": 17, "ai.onnx.ml": 3}
    clf = LogisticRegression(max_iter=1000).fit(x_train, y_train)
    plain = convert_sklearn(clf, "iris_logistic", initial_types=[("x", FloatTensorType([None, 4]))],
                            options={id(clf): {"zipmap": False}}, target_opset=target)
    zipmap = convert_sklearn(clf, "iris_logistic", initial_types=[("x", FloatTensorType([None, 4]))],
                             target_opset=target)
    # One [batch, 1] input per feature, as a CSV's columns feed them.
    pipe = Pipeline([("columns", ColumnTransformer([("features", "passthrough", [0, 1, 2, 3])])),
                     ("clf", LogisticRegression(max_iter=1000))]).fit(x_train, y_train)
    columns = convert_sklearn(pipe, "iris_logistic_columns",
                              initial_types=[(f"f{i}", FloatTensorType([None, 1])) for i in range(4)],
                              options={id(pipe.steps[-1][1]): {"zipmap": False}}, target_opset=target)
    for model in (plain, columns, zipmap):
        # skl2onnx lists the opsets in a set's order, which PYTHONHASHSEED changes.
        ordered = sorted((o.domain, o.version) for o in model.opset_import)
        del model.opset_import[:]
        model.opset_import.extend(opsets(*ordered))
    return plain, columns, zipmap


# ---- expected outputs -------------------------------------------------

def exact(value, np_type):
    """A float as JSON: its exact value at its dtype's width, written as the shortest decimal that reads
    back to that value as a double, so it converts into its dtype exactly (NaN, infinities as isorun's
    --values writes them)."""
    v = np_type(value)
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return float(v)


def tensor_json(array, dtype):
    """TENSOR of the docstring: dtype, shape and nested values of a NumPy array (bfloat16 from ml_dtypes)."""
    import ml_dtypes

    if dtype in ("float16", "float32", "float64", "bfloat16"):
        np_type = {"float16": np.float16, "float32": np.float32, "float64": np.float64,
                   "bfloat16": ml_dtypes.bfloat16}[dtype]
        flat = [exact(v, np_type) for v in array.reshape(-1)]
    elif dtype == "string":
        flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    elif dtype == "bool":
        flat = [bool(v) for v in array.reshape(-1)]
    else:
        flat = [int(v) for v in array.reshape(-1)]
    return {"dtype": dtype, "shape": list(array.shape), "values": nest(flat, list(array.shape))}


def nest(flat, shape):
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0] if shape[0] else 0
    return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


ISORUN_DTYPE = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16", TensorProto.BOOL: "bool",
                TensorProto.STRING: "string", TensorProto.INT8: "int8", TensorProto.UINT8: "uint8",
                TensorProto.INT16: "int16", TensorProto.UINT16: "uint16", TensorProto.INT32: "int32",
                TensorProto.UINT32: "uint32", TensorProto.INT64: "int64", TensorProto.UINT64: "uint64",
                TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64"}


def fixture_inputs(iris_x):
    """Two rows for each model's inputs, as NumPy arrays (bfloat16 as ml_dtypes.bfloat16)."""
    import ml_dtypes

    rng = np.random.default_rng(41)
    x4 = np.array([[0.5, -1.25, 2.0, 3.5], [-0.75, 0.125, 1.5, -2.25]], np.float32)
    every = {
        "float16": np.array([[0.5, -65504.0, 0.000999], [1.0, 3.140625, -0.0]], np.float16),
        "bfloat16": np.array([[1.5, -2.0, 3.0e38], [0.0078125, 256.0, -3.140625]], ml_dtypes.bfloat16),
        "bool": np.array([[True, False, True], [False, False, True]]),
        "string": np.array([["a", "héllo", ""], ["isorun", "ünïcode ✓", "x y"]], object),
        "int8": np.array([[-128, 0, 127], [1, -1, 42]], np.int8),
        "uint8": np.array([[0, 255, 1], [128, 7, 200]], np.uint8),
        "int16": np.array([[-32768, 0, 32767], [1, -1, 1234]], np.int16),
        "uint16": np.array([[0, 65535, 1], [32768, 7, 4321]], np.uint16),
        "int32": np.array([[-2**31, 0, 2**31 - 1], [1, -1, 123456]], np.int32),
        "uint32": np.array([[0, 2**32 - 1, 1], [2**31, 7, 654321]], np.uint32),
        "int64": np.array([[-2**63, 0, 2**63 - 1], [1, -1, 2**53 + 1]], np.int64),
        "uint64": np.array([[0, 2**64 - 1, 1], [2**63, 7, 2**53 + 1]], np.uint64),
        "float32": np.array([[0.1, -1e30, 1e-40], [3.4028235e38, -0.0, 1.0]], np.float32),
        "float64": np.array([[0.1, -1e300, 5e-324], [1.7976931348623157e308, -0.0, 1.0 / 3.0]], np.float64),
    }
    two = rng.standard_normal((2, 2, 3)).astype(np.float32)
    rows = iris_x[[0, 25]]  # a setosa and a virginica
    return {
        "mlp.onnx": {"x": x4},
        "ir3_initializer_inputs.onnx": {"x": x4},
        "external/external.onnx": {"x": rng.standard_normal((2, 16)).astype(np.float32)},
        "every_dtype.onnx": {f"x_{name}": every[name] for name, _ in EVERY_DTYPE},
        "two_inputs.onnx": {"a": two[0], "b": two[1]},
        "unknown_op.onnx": {"x": x4},
        "sklearn_classifier.onnx": {"x": rows},
        "sklearn_columns.onnx": {f"f{i}": rows[:, i:i + 1] for i in range(4)},
        "sklearn_zipmap.onnx": {"x": rows},
        "keras_tf2onnx.onnx": {"x": x4},
    }


def run_onnxruntime(path, feeds):
    """The graph's outputs by name from onnxruntime's CPU provider, or the load error's message."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        # Bytes, not the path: the message then names no folder of this machine.
        # external.onnx's data lies beside it, so it is loaded from its path.
        source = path if os.path.exists(os.path.join(os.path.dirname(path), "weights.bin")) \
            else open(path, "rb").read()
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        return None, str(e)
    ort_feeds = {name: bfloat16_ortvalue(array) if is_bfloat16(array) else array for name, array in feeds.items()}
    declared = [(o.name, o.type) for o in session.get_outputs()]
    # session.run gives NumPy arrays (and Python lists of dicts for ZipMap's
    # sequences) but has no NumPy type for a bfloat16 output; those are read below.
    plain = [name for name, t in declared if t != "tensor(bfloat16)"]
    outputs = dict(zip(plain, session.run(plain, ort_feeds)))
    for name, t in declared:
        if t == "tensor(bfloat16)":
            outputs[name] = run_bfloat16_output(path, name, feeds, options)
    return {name: (t, outputs[name]) for name, t in declared}, None


def is_bfloat16(array):
    import ml_dtypes

    return array.dtype == ml_dtypes.bfloat16


def bfloat16_ortvalue(array):
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(array).view(np.uint16),
                                                          onnx_element_type=TensorProto.BFLOAT16)


def run_bfloat16_output(path, output, feeds, options):
    """One bfloat16 output through ONNX Runtime: onnxruntime's Python API gives bfloat16 only as an
    OrtValue from run_with_ort_values, which takes no string input, so it runs the part of the graph
    that computes this output (onnx.utils.Extractor), with its inputs as OrtValues, and reads the
    OrtValue's bytes."""
    import ctypes

    import ml_dtypes
    import onnxruntime as ort

    model = onnx.load(path)
    producers = {o: n for n in model.graph.node for o in n.output}
    graph_inputs = {i.name for i in model.graph.input}
    needed, todo = set(), [output]
    while todo:
        name = todo.pop()
        if name in graph_inputs:
            needed.add(name)
        elif name in producers:
            todo.extend(producers[name].input)
    part = onnx.utils.Extractor(model).extract_model(sorted(needed), [output])
    session = ort.InferenceSession(part.SerializeToString(), options, providers=["CPUExecutionProvider"])
    values = {name: bfloat16_ortvalue(feeds[name]) if is_bfloat16(feeds[name])
              else ort.OrtValue.ortvalue_from_numpy(feeds[name]) for name in needed}
    (value,) = session.run_with_ort_values([output], values)
    assert value.data_type() == "tensor(bfloat16)", value.data_type()
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    return np.frombuffer(raw, np.uint16).view(ml_dtypes.bfloat16).reshape(value.shape())


def output_json(ort_type, value):
    if ort_type.startswith("tensor("):
        elem = ort_type[len("tensor("):-1]
        dtype = {"float": "float32", "double": "float64", "float16": "float16", "bfloat16": "bfloat16"}.get(elem, elem)
        return tensor_json(np.asarray(value), dtype)
    # seq(map(int64,tensor(float))): a list of dicts; JSON keys are strings.
    return {"type": ort_type,
            "values": [{str(k): exact(v, np.float32) for k, v in row.items()} for row in value]}


def input_json(array):
    if is_bfloat16(array):
        out = tensor_json(array, "bfloat16")
        out["npz_dtype"] = "float32"
        return out
    if array.dtype == object:
        return tensor_json(array, "string")
    name = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.float16): "float16",
            np.dtype(np.bool_): "bool"}.get(array.dtype, str(array.dtype))
    return tensor_json(array, name)


def npz_array(array):
    """What np.savez keeps for an input: bfloat16 as float32, strings as UTF-8 bytes."""
    if is_bfloat16(array):
        return array.astype(np.float32)
    if array.dtype == object:
        return np.array([[s.encode("utf-8") for s in row] for row in array])
    return array


def write_expected(iris_x, iris_y):
    import onnxruntime as ort
    import skl2onnx

    if not os.path.exists(os.path.join(OUT, "keras_tf2onnx.onnx")):
        sys.exit("keras_tf2onnx.onnx is missing: run scripts/make_onnx_tf_fixtures.py first (see its docstring)")
    os.makedirs(os.path.join(OUT, "inputs"), exist_ok=True)
    models = {}
    for rel, feeds in fixture_inputs(iris_x).items():
        stem = os.path.splitext(os.path.basename(rel))[0]
        npz = f"inputs/{stem}.npz"
        # np.savez stores each array's zip entry with a fixed date: the bytes are the same each run.
        np.savez(os.path.join(OUT, npz), **{k: npz_array(v) for k, v in feeds.items()})
        entry = {"inputs_npz": npz, "inputs": {k: input_json(v) for k, v in feeds.items()}}
        outputs, error = run_onnxruntime(os.path.join(OUT, rel), feeds)
        if error is not None:
            entry["load_error"] = error
        else:
            entry["outputs"] = {k: output_json(t, v) for k, (t, v) in outputs.items()}
        models[rel] = entry
        print(f"{npz}; {rel}: " + ("load error" if error is not None else ", ".join(entry["outputs"])))
    # What `isorun eval` on iris.npz / iris.csv must score: onnxruntime's
    # labels for the 30 held-out rows against the true ones.
    session = ort.InferenceSession(os.path.join(OUT, "sklearn_classifier.onnx"), providers=["CPUExecutionProvider"])
    predicted = session.run(["label"], {"x": iris_x})[0]
    iris = {"rows": int(len(iris_y)), "predicted": [int(v) for v in predicted],
            "accuracy": float(np.mean(predicted == iris_y))}
    expected = {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "numpy": np.__version__,
                "skl2onnx": skl2onnx.__version__, "models": models, "iris": iris}
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("expected.json")


def write_iris(x_eval, y_eval):
    """30 labelled rows: iris.npz (x [30, 4] float32, label [30] int64) for sklearn_classifier.onnx, and
    iris.csv (f0..f3, label; one value per cell) for sklearn_columns.onnx."""
    np.savez(os.path.join(OUT, "iris.npz"), x=x_eval, label=y_eval)
    with open(os.path.join(OUT, "iris.csv"), "w", encoding="utf-8") as f:
        f.write("f0,f1,f2,f3,label\n")
        for row, label in zip(x_eval, y_eval):
            f.write(",".join(str(v) for v in row) + f",{label}\n")
    print("iris.npz, iris.csv")


def main():
    os.makedirs(OUT, exist_ok=True)
    save(mlp(), "mlp.onnx")
    # Its `ids` input has no shape at all (unknown rank), which ONNX allows
    # and its checker refuses for a graph input.
    save(dtypes(), "dtypes.onnx", check=False)
    save(sequence_map(), "sequence_map.onnx")
    save(old_ir(), "ir3_initializer_inputs.onnx")

    # External data: every tensor over 64 bytes kept in weights.bin beside the model.
    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=opsets(("", 17)), producer_name="isorun-fixtures",
                              producer_version="1.0")
    model.ir_version = IR_VERSION
    os.makedirs(os.path.join(OUT, "external"), exist_ok=True)
    # onnx appends to an existing data file: start from none.
    if os.path.exists(os.path.join(OUT, "external", "weights.bin")):
        os.remove(os.path.join(OUT, "external", "weights.bin"))
    onnx.save_model(model, os.path.join(OUT, "external", "external.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=64)
    print("external/external.onnx, external/weights.bin")

    # Cut short in the middle of the graph.
    whole = mlp()
    whole.ir_version = IR_VERSION
    whole = whole.SerializeToString()
    with open(os.path.join(OUT, "truncated.onnx"), "wb") as f:
        f.write(whole[: len(whole) * 2 // 3])
    print("truncated.onnx")

    save(every_dtype(), "every_dtype.onnx")
    save(two_inputs(), "two_inputs.onnx")
    save(grow(), "grow.onnx")
    save(total(), "total.onnx")
    save(spin(), "spin.onnx")
    # The checker would look for huge.bin, which only the test makes.
    save(huge_external(), "huge_external.onnx", check=False)
    # The checker refuses an op of a domain it does not know.
    save(unknown_op(), "unknown_op.onnx", check=False)
    x_train, y_train, x_eval, y_eval = iris_split()
    plain, columns, zipmap = sklearn_models(x_train, y_train)
    save(plain, "sklearn_classifier.onnx")
    save(columns, "sklearn_columns.onnx")
    save(zipmap, "sklearn_zipmap.onnx")
    write_iris(x_eval, y_eval)
    write_expected(x_eval, y_eval)


if __name__ == "__main__":
    sys.exit(main())
