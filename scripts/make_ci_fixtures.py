"""tests/fixtures/ci: last night's and tonight's checkpoints of one binary
classifier, for `isorun eval --ci ... --baseline ... --gate significant`
(tests/tests/integration/eval_ci.rs and the README's "Is the drop real?").

    data.tfrecord          2,000 tf.Examples: x float[4], label int64, id bytes
                           ("ex-00000" ...), country bytes
    last_night/classifier  sigmoid(x·w + b), the eval fixtures' binary model
    noise/classifier       the same, its output flipped (p -> 1 - p) where
                           |x·w + b| < NOISE_BAND: examples next to the
                           decision boundary, right and wrong about as often,
                           so accuracy moves by noise only
    regressed/classifier   the same, its output flipped where x[:, 2] > CUT:
                           a planted regression on a known set of examples
                           (those of expected.json's "regressed_ids")
    expected.json          each model's accuracy (NumPy, on TensorFlow's own
                           predictions) and the changed examples

usage: make_ci_fixtures.py REPO
"""

import json
import os
import shutil
import sys

import numpy as np
import tensorflow as tf

N = 2000
W = np.array([[1.5], [-2.0], [0.75], [0.0]], dtype=np.float32)
B = np.array([0.25], dtype=np.float32)
NOISE_BAND = 0.15
CUT = 1.5
COUNTRIES = [b"de", b"fr", b"jp", b"us"]


def spec(shape, dtype, name):
    return tf.TensorSpec(shape, dtype, name=name)


class Classifier(tf.Module):
    """mode: "plain", "noise" or "regressed"."""

    def __init__(self, mode):
        super().__init__()
        self.w = tf.Variable(W)
        self.b = tf.Variable(B)
        self.mode = mode

    @tf.function(input_signature=[spec([None, 4], tf.float32, "x")])
    def serve(self, x):
        logit = tf.matmul(x, self.w) + self.b
        p = tf.sigmoid(logit)
        if self.mode == "noise":
            p = tf.where(tf.abs(logit) < NOISE_BAND, 1.0 - p, p)
        elif self.mode == "regressed":
            p = tf.where(x[:, 2:3] > CUT, 1.0 - p, p)
        return {"probability": p}


def main():
    repo = os.path.abspath(sys.argv[1])
    root = os.path.join(repo, "tests", "fixtures", "ci")
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(22)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    logit = (x.astype(np.float64) @ W.astype(np.float64) + B[0])[:, 0]
    label = (rng.random(N) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    ids = [f"ex-{i:05d}".encode() for i in range(N)]
    country = [COUNTRIES[i % 4] for i in rng.integers(0, 4, size=N)]
    with tf.io.TFRecordWriter(os.path.join(tmp, "data.tfrecord")) as w:
        for i in range(N):
            f = tf.train.Feature
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": f(float_list=tf.train.FloatList(value=x[i])),
                "label": f(int64_list=tf.train.Int64List(value=[label[i]])),
                "id": f(bytes_list=tf.train.BytesList(value=[ids[i]])),
                "country": f(bytes_list=tf.train.BytesList(value=[country[i]])),
            })).SerializeToString())
    expected = {"examples": N, "models": {}}
    predictions = {}
    for name, mode in [("last_night", "plain"), ("noise", "noise"), ("regressed", "regressed")]:
        module = Classifier(mode)
        path = os.path.join(tmp, name, "classifier")
        tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
        loaded = tf.saved_model.load(path).signatures["serving_default"]
        p = loaded(x=tf.constant(x))["probability"].numpy()[:, 0].astype(np.float64)
        predictions[name] = p
        expected["models"][name] = {"accuracy": float(np.mean((p > 0.5) == (label == 1)))}
    base = predictions["last_night"] > 0.5
    for name in ["noise", "regressed"]:
        changed = np.nonzero((predictions[name] > 0.5) != base)[0]
        expected["models"][name]["changed_ids"] = [ids[i].decode() for i in changed]
    drop = expected["models"]["last_night"]["accuracy"] - expected["models"]["noise"]["accuracy"]
    assert 0 < drop < 0.01, f"the noise model should drop accuracy a little, not {drop}"
    with open(os.path.join(tmp, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)
    print(json.dumps({k: v["accuracy"] for k, v in expected["models"].items()}))


if __name__ == "__main__":
    main()
