"""Evaluation fixtures for `isorun eval`, made by real TensorFlow, with the
numbers scikit-learn and NumPy give on Python TensorFlow's own predictions.

  tests/fixtures/eval/models/<model>/   SavedModels (fixed weights, float32):
      binary        x [?,4] -> probability [?,1] (sigmoid)
      multiclass    x [?,4] -> probabilities [?,3] (softmax)
      logits        x [?,4] -> logits [?,3] (no softmax: --from-logits)
      regressor     x [?,4] -> y [?,1]
      raw_examples  examples string [?] (serialized tf.Example, parsed inside,
                    as TF Serving's predict-on-Example signatures) -> probability [?,1]
      fails_late    x [?,4] -> probability [?,1]; fails (tf.debugging) on a
                    batch holding an example with x[0] > 3 (mid-dataset error)
      echo          x [?,1] -> x [?,1] (identity: what the fault worker
                    returns too, and cheap enough to stream big datasets)
  tests/fixtures/eval/data/
      data.tfrecord, data.tfrecord.gz, shards/part-0000{0,1,2}.tfrecord,
      data.npz, npy/<name>.npy, data.jsonl, data.jsonl.gz: the same 1000
      examples (features x float 4, label_bin int, label_cls int, target
      float, weight float, country bytes; .npz/.npy have no country); the
      JSON Lines are written by Python's json module, one object a line
      corrupt.tfrecord: data.tfrecord with one data byte of record 300 flipped
      truncated.tfrecord: data.tfrecord cut in the middle of record 700
  tests/fixtures/eval/expected.json: per case, the flags and the expected metrics
  examples/eval/: iris.tfrecord (scikit-learn's bundled iris, 150 rows) and
      models/iris_e002, models/iris_e100 (Keras, trained 2 and 100 epochs)

Run through `scripts/make-fixtures --eval-only` (same venv, plus scikit-learn).
"""

import gzip
import json
import os
import shutil
import sys

import numpy as np
import tensorflow as tf
from sklearn import datasets, metrics

N = 1000
W_BIN = np.array([[1.5], [-2.0], [0.75], [0.0]], dtype=np.float32)
B_BIN = np.array([0.25], dtype=np.float32)
W_CLS = np.array([[1.0, -1.0, 0.5], [0.5, 1.5, -1.0], [-1.0, 0.25, 1.0], [0.0, 0.5, -0.5]], dtype=np.float32)
B_CLS = np.array([0.1, -0.2, 0.05], dtype=np.float32)
COUNTRIES = [b"de", b"fr", b"jp", b"us"]


def spec(shape, dtype, name):
    return tf.TensorSpec(shape, dtype, name=name)


class Binary(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(W_BIN)
        self.b = tf.Variable(B_BIN)

    @tf.function(input_signature=[spec([None, 4], tf.float32, "x")])
    def serve(self, x):
        return {"probability": tf.sigmoid(tf.matmul(x, self.w) + self.b)}


class Multiclass(tf.Module):
    def __init__(self, softmax):
        super().__init__()
        self.w = tf.Variable(W_CLS)
        self.b = tf.Variable(B_CLS)
        self.softmax = softmax

    @tf.function(input_signature=[spec([None, 4], tf.float32, "x")])
    def serve(self, x):
        logits = tf.matmul(x, self.w) + self.b
        if self.softmax:
            return {"probabilities": tf.nn.softmax(logits)}
        return {"logits": logits}


class Regressor(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.array([[0.5], [-1.0], [2.0], [0.25]], dtype=np.float32))
        self.b = tf.Variable(np.array([0.125], dtype=np.float32))

    @tf.function(input_signature=[spec([None, 4], tf.float32, "x")])
    def serve(self, x):
        return {"y": tf.matmul(x, self.w) + self.b}


class RawExamples(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(W_BIN)
        self.b = tf.Variable(B_BIN)

    @tf.function(input_signature=[spec([None], tf.string, "examples")])
    def serve(self, examples):
        parsed = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([4], tf.float32)})
        return {"probability": tf.sigmoid(tf.matmul(parsed["x"], self.w) + self.b)}


class FailsLate(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(W_BIN)
        self.b = tf.Variable(B_BIN)

    @tf.function(input_signature=[spec([None, 4], tf.float32, "x")])
    def serve(self, x):
        check = tf.debugging.assert_less_equal(x[:, 0], 3.0, message="fails_late expects x[:, 0] <= 3")
        with tf.control_dependencies([check]):
            return {"probability": tf.sigmoid(tf.matmul(x, self.w) + self.b)}


class Echo(tf.Module):
    @tf.function(input_signature=[spec([None, 1], tf.float32, "x")])
    def serve(self, x):
        return {"x": tf.identity(x)}


def save(module, path):
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def make_data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    # Duplicate rows give tied predictions (ties in ROC AUC).
    x[900:] = x[:100]
    # One example that makes fails_late fail, late in the data.
    x[750, 0] = 3.5
    p_bin = 1 / (1 + np.exp(-(x.astype(np.float64) @ W_BIN[:, 0] + B_BIN[0])))
    label_bin = (rng.random(N) < p_bin).astype(np.int64)
    logits = x.astype(np.float64) @ W_CLS + B_CLS
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    label_cls = np.array([rng.choice(3, p=p) for p in probs], dtype=np.int64)
    target = (x.astype(np.float64) @ np.array([0.5, -1.0, 2.0, 0.25]) + 0.125 + rng.normal(scale=0.5, size=N))
    target = target.astype(np.float32)
    weight = rng.uniform(0.5, 2.0, size=N).astype(np.float32)
    country = np.array([COUNTRIES[i] for i in rng.integers(0, 4, size=N)])
    return {"x": x, "label_bin": label_bin, "label_cls": label_cls, "target": target, "weight": weight,
            "country": country}


def example(data, i):
    f = tf.train.Feature
    return tf.train.Example(features=tf.train.Features(feature={
        "x": f(float_list=tf.train.FloatList(value=data["x"][i])),
        "label_bin": f(int64_list=tf.train.Int64List(value=[data["label_bin"][i]])),
        "label_cls": f(int64_list=tf.train.Int64List(value=[data["label_cls"][i]])),
        "target": f(float_list=tf.train.FloatList(value=[data["target"][i]])),
        "weight": f(float_list=tf.train.FloatList(value=[data["weight"][i]])),
        "country": f(bytes_list=tf.train.BytesList(value=[data["country"][i]])),
    })).SerializeToString()


def write_tfrecord(path, records, options=None):
    with tf.io.TFRecordWriter(path, options=options) as w:
        for r in records:
            w.write(r)


def record_offsets(path):
    """(offset, length) of each record of a plain TFRecord file."""
    out = []
    with open(path, "rb") as f:
        blob = f.read()
    pos = 0
    while pos < len(blob):
        length = int.from_bytes(blob[pos:pos + 8], "little")
        out.append((pos, length))
        pos += 8 + 4 + length + 4
    return out


def predictions(model_dir, data, records):
    fn = tf.saved_model.load(model_dir).signatures["serving_default"]
    if "raw" in model_dir:
        out = fn(examples=tf.constant(records))
    else:
        out = fn(x=tf.constant(data["x"]))
    (name, value), = out.items()
    return name, value.numpy().astype(np.float64)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def binary_metrics(y, p, w, threshold=0.5):
    p = p.reshape(-1)
    pred = (p >= threshold).astype(np.int64)
    return {
        "accuracy": metrics.accuracy_score(y, pred, sample_weight=w),
        "auc": metrics.roc_auc_score(y, p, sample_weight=w),
        "pr_auc": metrics.average_precision_score(y, p, sample_weight=w),
        "log_loss": metrics.log_loss(y, p, sample_weight=w, labels=[0, 1]),
        "precision": metrics.precision_score(y, pred, sample_weight=w, zero_division=0),
        "recall": metrics.recall_score(y, pred, sample_weight=w, zero_division=0),
        "f1": metrics.f1_score(y, pred, sample_weight=w, zero_division=0),
        "mean_prediction": float(np.average(p, weights=w)),
        "mean_label": float(np.average(y, weights=w)),
    }


def multiclass_metrics(y, probs, w, k):
    pred = probs.argmax(axis=1)
    labels = list(range(probs.shape[1]))
    return {
        "accuracy": metrics.accuracy_score(y, pred, sample_weight=w),
        "top_k_accuracy": metrics.top_k_accuracy_score(y, probs, k=k, labels=labels, sample_weight=w),
        "log_loss": metrics.log_loss(y, probs, sample_weight=w, labels=labels),
        "precision": metrics.precision_score(y, pred, average="macro", sample_weight=w, zero_division=0),
        "recall": metrics.recall_score(y, pred, average="macro", sample_weight=w, zero_division=0),
        "f1": metrics.f1_score(y, pred, average="macro", sample_weight=w, zero_division=0),
        "auc": metrics.roc_auc_score(y, probs, multi_class="ovr", average="macro", sample_weight=w, labels=labels),
    }


def regression_metrics(y, p, w):
    p = p.reshape(-1)
    mse = metrics.mean_squared_error(y, p, sample_weight=w)
    return {
        "mse": mse,
        "mae": metrics.mean_absolute_error(y, p, sample_weight=w),
        "rmse": float(np.sqrt(mse)),
        "mean_prediction": float(np.average(p, weights=w)),
        "mean_label": float(np.average(y, weights=w)),
    }


def write_jsonl(d, data):
    """data.jsonl and data.jsonl.gz: one json.dumps object a line. x is
    written as float32's shortest text (it feeds a float32 input, exactly);
    target and weight as float64 of the float32 value, as TFRecord's
    float_list holds them, so that metrics equal the TFRecord run's."""
    lines = []
    for i in range(len(data["x"])):
        row = {
            "x": [float(str(v)) for v in data["x"][i]],
            "label_bin": int(data["label_bin"][i]),
            "label_cls": int(data["label_cls"][i]),
            "target": float(data["target"][i]),
            "weight": float(data["weight"][i]),
            "country": data["country"][i].decode(),
        }
        lines.append(json.dumps(row) + "\n")
    text = "".join(lines).encode()
    open(os.path.join(d, "data.jsonl"), "wb").write(text)
    with open(os.path.join(d, "data.jsonl.gz"), "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(text)


def main():
    repo = os.path.abspath(sys.argv[1])
    tf.keras.utils.set_random_seed(0)
    root = os.path.join(repo, "tests", "fixtures", "eval")
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "models"))
    os.makedirs(os.path.join(tmp, "data", "shards"))
    os.makedirs(os.path.join(tmp, "data", "npy"))
    models = {
        "binary": Binary(), "multiclass": Multiclass(True), "logits": Multiclass(False),
        "regressor": Regressor(), "raw_examples": RawExamples(), "fails_late": FailsLate(),
        "echo": Echo(),
    }
    for name, module in models.items():
        save(module, os.path.join(tmp, "models", name))

    data = make_data()
    records = [example(data, i) for i in range(N)]
    d = os.path.join(tmp, "data")
    write_tfrecord(os.path.join(d, "data.tfrecord"), records)
    write_tfrecord(os.path.join(d, "data.tfrecord.gz"), records, tf.io.TFRecordOptions(compression_type="GZIP"))
    for s, (lo, hi) in enumerate([(0, 400), (400, 401), (401, N)]):
        write_tfrecord(os.path.join(d, "shards", f"part-{s:05d}.tfrecord"), records[lo:hi])
    arrays = {k: v for k, v in data.items() if k != "country"}
    np.savez(os.path.join(d, "data.npz"), **arrays)
    for k, v in arrays.items():
        np.save(os.path.join(d, "npy", f"{k}.npy"), v)
    write_jsonl(d, data)
    blob = open(os.path.join(d, "data.tfrecord"), "rb").read()
    offsets = record_offsets(os.path.join(d, "data.tfrecord"))
    off, length = offsets[300]
    corrupt = bytearray(blob)
    corrupt[off + 12 + length // 2] ^= 0x55
    open(os.path.join(d, "corrupt.tfrecord"), "wb").write(bytes(corrupt))
    off7, length7 = offsets[700]
    open(os.path.join(d, "truncated.tfrecord"), "wb").write(blob[:off7 + 12 + length7 // 2])

    preds = {name: predictions(os.path.join(tmp, "models", name), data, records)
             for name in ["binary", "multiclass", "logits", "regressor", "raw_examples"]}
    w = data["weight"].astype(np.float64)
    yb, yc, yt = data["label_bin"], data["label_cls"], data["target"].astype(np.float64)
    cases = []

    def case(name, model, label, flags, expected, slices=None, task=None):
        cases.append({"name": name, "model": model, "label": label, "flags": flags, "task": task,
                      "examples": N, "metrics": expected, "slices": slices or {}})

    bin_names = ["accuracy", "auc", "pr_auc", "log_loss", "precision", "recall", "f1", "mean_prediction", "mean_label"]
    metric_flags = lambda names: [f for n in names for f in ("--metric", n)]
    case("binary", "binary", "label_bin", metric_flags(bin_names), binary_metrics(yb, preds["binary"][1], None),
         task="binary")
    case("binary_weighted", "binary", "label_bin", metric_flags(bin_names) + ["--weight", "weight"],
         binary_metrics(yb, preds["binary"][1], w), task="binary")
    case("binary_threshold", "binary", "label_bin", metric_flags(["accuracy", "precision", "recall", "f1"])
         + ["--threshold", "0.7"],
         {k: v for k, v in binary_metrics(yb, preds["binary"][1], None, 0.7).items()
          if k in ("accuracy", "precision", "recall", "f1")}, task="binary")
    slices = {}
    for c in COUNTRIES:
        m = data["country"] == c
        slices[c.decode()] = {k: v for k, v in binary_metrics(yb[m], preds["binary"][1][m], None).items()
                              if k in ("accuracy", "auc")}
    case("binary_sliced", "binary", "label_bin", metric_flags(["accuracy", "auc"]) + ["--slice", "country"],
         {k: v for k, v in binary_metrics(yb, preds["binary"][1], None).items() if k in ("accuracy", "auc")},
         slices={"country": slices}, task="binary")
    cls_names = ["accuracy", "top_k_accuracy", "log_loss", "precision", "recall", "f1", "auc"]
    case("multiclass", "multiclass", "label_cls", metric_flags(cls_names) + ["--top-k", "2"],
         multiclass_metrics(yc, preds["multiclass"][1], None, 2), task="multiclass")
    case("multiclass_weighted", "multiclass", "label_cls", metric_flags(cls_names) + ["--top-k", "2", "--weight", "weight"],
         multiclass_metrics(yc, preds["multiclass"][1], w, 2), task="multiclass")
    case("logits", "logits", "label_cls", metric_flags(cls_names) + ["--top-k", "2", "--from-logits"],
         multiclass_metrics(yc, softmax(preds["logits"][1]), None, 2), task="multiclass")
    reg_names = ["mse", "mae", "rmse", "mean_prediction", "mean_label"]
    case("regression", "regressor", "target", metric_flags(reg_names), regression_metrics(yt, preds["regressor"][1], None),
         task="regression")
    case("regression_weighted", "regressor", "target", metric_flags(reg_names) + ["--weight", "weight"],
         regression_metrics(yt, preds["regressor"][1], w), task="regression")
    case("raw_examples", "raw_examples", "label_bin", metric_flags(["accuracy", "auc", "log_loss"]),
         {k: v for k, v in binary_metrics(yb, preds["raw_examples"][1], None).items()
          if k in ("accuracy", "auc", "log_loss")}, task="binary")
    # The defaults, as documented: binary -> accuracy, auc, log_loss, precision, recall, f1.
    case("binary_default", "binary", "label_bin", [],
         {k: v for k, v in binary_metrics(yb, preds["binary"][1], None).items()
          if k in ("accuracy", "auc", "log_loss", "precision", "recall", "f1")}, task="binary")
    with open(os.path.join(tmp, "expected.json"), "w") as f:
        json.dump({"examples": N, "fails_late_example": 750, "corrupt_record": 300,
                   "corrupt_offset": offsets[300][0], "truncated_record": 700, "truncated_offset": offsets[700][0],
                   "cases": cases}, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)

    # The README's example: iris, two Keras classifiers trained 2 and 100 epochs.
    ex = os.path.join(repo, "examples", "eval")
    shutil.rmtree(ex, ignore_errors=True)
    os.makedirs(os.path.join(ex, "models"))
    iris = datasets.load_iris()
    xi = iris.data.astype(np.float32)
    yi = iris.target.astype(np.int64)
    f = tf.train.Feature
    with tf.io.TFRecordWriter(os.path.join(ex, "iris.tfrecord")) as w_:
        for i in range(len(yi)):
            w_.write(tf.train.Example(features=tf.train.Features(feature={
                "x": f(float_list=tf.train.FloatList(value=xi[i])),
                "species": f(int64_list=tf.train.Int64List(value=[yi[i]])),
                "petal": f(bytes_list=tf.train.BytesList(value=[b"long" if xi[i, 2] >= 4.0 else b"short"])),
            })).SerializeToString())
    for epochs in (2, 100):
        tf.keras.utils.set_random_seed(0)
        x_in = tf.keras.Input(shape=(4,), dtype="float32", name="x")
        hidden = tf.keras.layers.Dense(16, activation="relu")(x_in)
        out = tf.keras.layers.Dense(3, activation="softmax", name="probabilities")(hidden)
        model = tf.keras.Model(x_in, {"probabilities": out})
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss={"probabilities": "sparse_categorical_crossentropy"})
        model.fit(xi, {"probabilities": yi}, epochs=epochs, batch_size=16, verbose=0, shuffle=True)
        model.export(os.path.join(ex, "models", f"iris_e{epochs:03d}"), verbose=False)
        acc = (model.predict(xi, verbose=0)["probabilities"].argmax(axis=1) == yi).mean()
        print(f"examples/eval/models/iris_e{epochs:03d}: accuracy {acc:.3f}", file=sys.stderr)
    print(f"make-fixtures: {len(cases)} eval cases in tests/fixtures/eval", file=sys.stderr)


if __name__ == "__main__":
    main()
