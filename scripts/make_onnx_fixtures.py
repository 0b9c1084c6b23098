#!/usr/bin/env python3
"""Writes the small ONNX models under tests/fixtures/onnx/ that isorun's
ONNX reader (onnxproto/) and the onnx integration tests read: graphs built
with onnx.helper, so they are what the onnx package itself writes.

    python3 -m venv /tmp/onnx-venv && /tmp/onnx-venv/bin/pip install onnx
    /tmp/onnx-venv/bin/python scripts/make_onnx_fixtures.py

Deterministic: the files only change when onnx's serialisation does.
"""

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


if __name__ == "__main__":
    sys.exit(main())
