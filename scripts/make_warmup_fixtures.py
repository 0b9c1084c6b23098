"""TF Serving exports with warm-up requests, for `isorun run --warmup-inputs`.

Each export carries `assets.extra/tf_serving_warmup_requests`, a TFRecord of
`tensorflow.serving.PredictionLog` protos written as TF Serving documents it
(https://www.tensorflow.org/tfx/serving/saved_model_warmup), with the
`tensorflow-serving-api` package's own protos:

  tests/fixtures/warmup/models/
      predict     serving_default: x float32 [?,4] -> y [?,2]; double: x [?,4] -> doubled [?,4].
                  Warm-ups: 3 PredictRequests (tensor_content; float_val with an
                  empty signature_name; double_val (float64, cast) for `double`).
      classify    serving_default: examples string [?] (serialized tf.Example with
                  x float [4] and bias float [1], default 0) -> scores [?,1].
                  Warm-ups: ClassificationRequest (example_list of 2),
                  ClassificationRequest (example_list_with_context: bias in the
                  context), RegressionRequest (example_list of 1).
      plain       the predict model without a warm-up file.
  tests/fixtures/warmup/hostile_shape: one PredictionLog whose x claims shape
      [2^20, 2^20] and carries a single float_val (a 4 TiB tensor if believed).
  tests/fixtures/warmup/expected.json: per model, per request, the outputs
      TensorFlow computes (dtype, shape, values), the request's signature.

Run through `scripts/make-fixtures` (the same venv, plus
`tensorflow-serving-api`, installed with --no-deps next to tensorflow-cpu).
"""

import json
import os
import shutil
import sys

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, input_pb2, model_pb2, predict_pb2,
                                     prediction_log_pb2, regression_pb2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import stabilise_fingerprint  # noqa: E402

W = np.array([[1.0, -0.5], [0.25, 2.0], [-1.5, 0.75], [0.5, 0.0]], dtype=np.float32)
B = np.array([0.125, -0.25], dtype=np.float32)
W_EX = np.array([[1.5], [-2.0], [0.75], [0.0]], dtype=np.float32)


class Predict(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(W)
        self.b = tf.Variable(B)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.matmul(x, self.w) + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def double(self, x):
        return {"doubled": x * 2.0}


class Classify(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(W_EX)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(self, examples):
        parsed = tf.io.parse_example(examples, {
            "x": tf.io.FixedLenFeature([4], tf.float32),
            "bias": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
        })
        return {"scores": tf.sigmoid(tf.matmul(parsed["x"], self.w) + parsed["bias"])}


def example(x, bias=None):
    feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=list(x)))}
    if bias is not None:
        feature["bias"] = tf.train.Feature(float_list=tf.train.FloatList(value=[bias]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def write_warmup(model_dir, logs):
    extra = os.path.join(model_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(extra, "tf_serving_warmup_requests")) as writer:
        for log in logs:
            writer.write(log.SerializeToString(deterministic=True))


def outputs_json(outputs):
    return {name: {"dtype": value.dtype.name, "shape": list(value.shape), "values": value.numpy().tolist()}
            for name, value in sorted(outputs.items())}


def predict_model(root):
    path = os.path.join(root, "predict")
    module = Predict()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve, "double": module.double})
    stabilise_fingerprint(path)
    x1 = np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.0]], dtype=np.float32)
    x2 = np.array([[0.5, -0.5, 1.5, -1.5]], dtype=np.float32)
    x3 = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [0.25, 0.5, 0.75, 1.0]], dtype=np.float64)
    logs = []
    # 1: numpy's way, tensor_content.
    r1 = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name="predict", signature_name="serving_default"))
    r1.inputs["x"].CopyFrom(tf.make_tensor_proto(x1))
    assert r1.inputs["x"].tensor_content
    # 2: typed float_val, no signature name (TF Serving's default: serving_default).
    r2 = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name="predict"))
    r2.inputs["x"].dtype = tf.float32.as_datatype_enum
    r2.inputs["x"].tensor_shape.dim.add(size=1)
    r2.inputs["x"].tensor_shape.dim.add(size=4)
    r2.inputs["x"].float_val.extend(x2.ravel().tolist())
    # 3: float64 in double_val for the `double` signature (cast to float32).
    r3 = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name="predict", signature_name="double"))
    r3.inputs["x"].dtype = tf.float64.as_datatype_enum
    for n in x3.shape:
        r3.inputs["x"].tensor_shape.dim.add(size=n)
    r3.inputs["x"].double_val.extend(x3.ravel().tolist())
    for request in (r1, r2, r3):
        logs.append(prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request)))
    write_warmup(path, logs)
    loaded = tf.saved_model.load(path)
    serve, double = loaded.signatures["serving_default"], loaded.signatures["double"]
    expected = [
        {"kind": "predict", "signature": "serving_default", "outputs": outputs_json(serve(x=tf.constant(x1)))},
        {"kind": "predict", "signature": "serving_default", "outputs": outputs_json(serve(x=tf.constant(x2)))},
        {"kind": "predict", "signature": "double",
         "outputs": outputs_json(double(x=tf.constant(x3.astype(np.float32))))},
    ]
    return path, expected


def classify_model(root):
    path = os.path.join(root, "classify")
    module = Classify()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    stabilise_fingerprint(path)
    e1 = [example([1.0, 2.0, 3.0, 4.0]), example([-1.0, 0.5, 0.0, 2.0])]
    context = example([0.0, 0.0, 0.0, 0.0], bias=1.0)
    context.features.feature.pop("x")
    e2 = [example([0.5, -0.5, 1.5, -1.5]), example([2.0, 1.0, 0.0, -1.0])]
    e3 = [example([0.25, 0.5, 0.75, 1.0], bias=-0.5)]
    spec = model_pb2.ModelSpec(name="classify", signature_name="serving_default")
    c1 = classification_pb2.ClassificationRequest(
        model_spec=spec, input=input_pb2.Input(example_list=input_pb2.ExampleList(examples=e1)))
    c2 = classification_pb2.ClassificationRequest(
        model_spec=spec,
        input=input_pb2.Input(example_list_with_context=input_pb2.ExampleListWithContext(examples=e2, context=context)))
    r3 = regression_pb2.RegressionRequest(
        model_spec=model_pb2.ModelSpec(name="classify"),
        input=input_pb2.Input(example_list=input_pb2.ExampleList(examples=e3)))
    write_warmup(path, [
        prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=c1)),
        prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=c2)),
        prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=r3)),
    ])
    serve = tf.saved_model.load(path).signatures["serving_default"]

    def run(examples):
        return outputs_json(serve(examples=tf.constant([e.SerializeToString(deterministic=True) for e in examples])))

    # The context's features go into every example, the example's own winning
    # (TF Serving: each example is serialized after the context, and protobuf
    # merges). Computed here on merged examples, not on concatenated bytes.
    merged = []
    for e in e2:
        m = tf.train.Example()
        m.CopyFrom(context)
        m.MergeFrom(e)
        merged.append(m)
    return path, [
        {"kind": "classify", "signature": "serving_default", "outputs": run(e1)},
        {"kind": "classify", "signature": "serving_default", "outputs": run(merged)},
        {"kind": "regress", "signature": "serving_default", "outputs": run(e3)},
    ]


def hostile_shape(path):
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name="predict"))
    request.inputs["x"].dtype = tf.float32.as_datatype_enum
    request.inputs["x"].tensor_shape.dim.add(size=1 << 20)
    request.inputs["x"].tensor_shape.dim.add(size=1 << 20)
    request.inputs["x"].float_val.append(1.0)
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(log.SerializeToString(deterministic=True))


def main():
    repo = os.path.abspath(sys.argv[1])
    tf.keras.utils.set_random_seed(0)
    final = os.path.join(repo, "tests", "fixtures", "warmup")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    models = os.path.join(tmp, "models")
    os.makedirs(models)
    expected = {}
    predict_path, expected["predict"] = predict_model(models)
    _, expected["classify"] = classify_model(models)
    plain = os.path.join(models, "plain")
    shutil.copytree(predict_path, plain)
    shutil.rmtree(os.path.join(plain, "assets.extra"))
    hostile_shape(os.path.join(tmp, "hostile_shape"))
    with open(os.path.join(tmp, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    print(f"wrote {final}")


if __name__ == "__main__":
    main()
