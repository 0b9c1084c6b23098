#!/usr/bin/env python3
"""Writes tests/fixtures/onnx/keras_tf2onnx.onnx: a small Keras model
converted to ONNX by tf2onnx, so that isorun's ONNX tests run a graph that
tool wrote (its node names, its Transpose/MatMul patterns, its opset
imports), not only graphs built by hand with onnx.helper.

It needs TensorFlow, so it lives apart from scripts/make_onnx_fixtures.py
(which computes this model's expected outputs with onnxruntime, with the
others'). Run it first, in its own venv (tf2onnx must not go into
~/.cache/isorun/fixtures-venv):

    python3 -m venv /tmp/tf2onnx-venv
    /tmp/tf2onnx-venv/bin/pip install tensorflow-cpu==2.21.0 keras==3.15.1 \\
        tf2onnx==1.17.0 onnx==1.23.2 numpy==2.4.6 protobuf==7.36.2
    /tmp/tf2onnx-venv/bin/python scripts/make_onnx_tf_fixtures.py
    /tmp/onnx-venv/bin/python scripts/make_onnx_fixtures.py   # expected.json

The model: Input x float32 [batch, 4] -> Dense(8, relu) -> Dense(3,
softmax) -> output `probabilities` float32 [batch, 3], weights from Keras's
initialisers under keras.utils.set_random_seed(3), opset 17, IR version 8.

tf2onnx.convert.from_keras does not work with Keras 3 (tf2onnx 1.17.0
looks its outputs up by Keras 2 tensor names: KeyError 'keras_tensor_1'),
so the model is traced as a tf.function and converted with
tf2onnx.convert.from_function, which is what from_keras does for Keras 2.

Deterministic: the same seed and versions write the same bytes.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import onnx  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "onnx")

# What ONNX Runtime releases of the last years all load (as in
# make_onnx_fixtures.py).
IR_VERSION = 8


def main():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((4,), name="x"),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(3, activation="softmax", name="probabilities"),
    ])
    spec = (tf.TensorSpec((None, 4), tf.float32, name="x"),)

    @tf.function(input_signature=spec)
    def serve(x):
        return {"probabilities": model(x, training=False)}

    proto, _ = tf2onnx.convert.from_function(serve, input_signature=spec, opset=17)
    if proto.ir_version > IR_VERSION:
        proto.ir_version = IR_VERSION
    # tf2onnx names the batch dimension after a TensorFlow tensor
    # ("unk__6"); that name is what a tf2onnx graph carries, keep it.
    onnx.checker.check_model(proto)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "keras_tf2onnx.onnx")
    onnx.save_model(proto, path)
    print(f"keras_tf2onnx.onnx: {os.path.getsize(path)} bytes "
          f"(tensorflow {tf.__version__}, keras {keras.__version__}, tf2onnx {tf2onnx.__version__})")


if __name__ == "__main__":
    sys.exit(main())
