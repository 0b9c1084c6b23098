"""Writes eval/tests/reference.json: seeded predictions, labels and weights
with the metrics scikit-learn and NumPy give for them, for tests/reference.rs.

Run with the fixtures venv: ~/.cache/isorun/fixtures-venv/bin/python eval/tests/reference.py
"""
import json
import os

import numpy as np
from sklearn import metrics as skm
from sklearn.preprocessing import label_binarize

rng = np.random.default_rng(12)
N = 500


def binary_metrics(y, p, w, threshold=0.5):
    pred = (p > threshold).astype(int)
    return {
        "accuracy": skm.accuracy_score(y, pred, sample_weight=w),
        "precision": skm.precision_score(y, pred, sample_weight=w, zero_division=0),
        "recall": skm.recall_score(y, pred, sample_weight=w, zero_division=0),
        "f1": skm.f1_score(y, pred, sample_weight=w, zero_division=0),
        "auc": skm.roc_auc_score(y, p, sample_weight=w),
        "pr_auc": skm.average_precision_score(y, p, sample_weight=w),
        "log_loss": skm.log_loss(y, p, sample_weight=w, labels=[0, 1]),
        "mse": skm.mean_squared_error(y, p, sample_weight=w),
        "mae": skm.mean_absolute_error(y, p, sample_weight=w),
        "rmse": skm.root_mean_squared_error(y, p, sample_weight=w),
        "mean_prediction": float(np.average(p, weights=w)),
        "mean_label": float(np.average(y, weights=w)),
    }


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def multiclass_metrics(y, p, w, k, classes):
    pred = p.argmax(axis=1)
    labels = list(range(classes))
    return {
        "accuracy": skm.accuracy_score(y, pred, sample_weight=w),
        "top_k_accuracy": skm.top_k_accuracy_score(y, p, k=k, sample_weight=w, labels=labels),
        "log_loss": skm.log_loss(y, p, sample_weight=w, labels=labels),
        "precision": skm.precision_score(y, pred, average="macro", sample_weight=w, zero_division=0),
        "recall": skm.recall_score(y, pred, average="macro", sample_weight=w, zero_division=0),
        "f1": skm.f1_score(y, pred, average="macro", sample_weight=w, zero_division=0),
        "auc": skm.roc_auc_score(y, p, multi_class="ovr", average="macro", sample_weight=w, labels=labels),
        "pr_auc": skm.average_precision_score(label_binarize(y, classes=labels), p, average="macro", sample_weight=w),
    }


def regression_metrics(y, p, w):
    return {
        "mse": skm.mean_squared_error(y, p, sample_weight=w),
        "mae": skm.mean_absolute_error(y, p, sample_weight=w),
        "rmse": skm.root_mean_squared_error(y, p, sample_weight=w),
        "r2": skm.r2_score(y, p, sample_weight=w),
        "mean_prediction": float(np.average(p, weights=w)),
        "mean_label": float(np.average(y, weights=w)),
    }


cases = []

# Binary with many ties (scores on a grid of 0.05), weighted and unweighted.
y = rng.integers(0, 2, N)
p = np.clip(np.round((0.3 * y + rng.random(N) * 0.7) * 20) / 20, 0, 1)
w = rng.random(N) * 2
for weights in (None, w):
    cases.append({"name": "binary ties" + (" weighted" if weights is not None else ""), "task": "binary",
                  "columns": 1, "labels": y.tolist(), "outputs": p.tolist(),
                  "weights": None if weights is None else weights.tolist(), "from_logits": False,
                  "expected": binary_metrics(y, p, weights)})

# Binary from logits.
z = rng.normal(0, 2, N) + (y * 2 - 1)
cases.append({"name": "binary logits", "task": "binary", "columns": 1, "labels": y.tolist(), "outputs": z.tolist(),
              "weights": w.tolist(), "from_logits": True,
              "expected": binary_metrics(y, 1 / (1 + np.exp(-z)), w)})

# Multiclass, C = 4: probabilities, and logits.
C = 4
yc = rng.integers(0, C, N)
zc = rng.normal(0, 1, (N, C)) + np.eye(C)[yc] * 1.5
pc = softmax(zc)
cases.append({"name": "multiclass probabilities", "task": "multiclass", "columns": C, "labels": yc.tolist(),
              "outputs": pc.ravel().tolist(), "weights": None, "from_logits": False, "top_k": 2,
              "expected": multiclass_metrics(yc, pc, None, 2, C)})
cases.append({"name": "multiclass logits weighted", "task": "multiclass", "columns": C, "labels": yc.tolist(),
              "outputs": zc.ravel().tolist(), "weights": w.tolist(), "from_logits": True, "top_k": 2,
              "expected": multiclass_metrics(yc, pc, w, 2, C)})

# Regression.
yr = rng.normal(3, 2, N)
pr = yr + rng.normal(0, 0.7, N)
cases.append({"name": "regression", "task": "regression", "columns": 1, "labels": yr.tolist(),
              "outputs": pr.tolist(), "weights": w.tolist(), "from_logits": False,
              "expected": regression_metrics(yr, pr, w)})

# Slices: binary, one slice feature with three values.
s = rng.choice(["a", "b", "c"], N)
slices = {}
for v in ("a", "b", "c"):
    m = s == v
    slices[v] = binary_metrics(y[m], p[m], w[m])
cases.append({"name": "binary slices", "task": "binary", "columns": 1, "labels": y.tolist(), "outputs": p.tolist(),
              "weights": w.tolist(), "from_logits": False, "slice": s.tolist(),
              "expected": binary_metrics(y, p, w), "expected_slices": slices})

# Many distinct scores: AUC falls back to buckets (checked within 1e-3). The
# data comes from a 64-bit LCG that tests/reference.rs repeats, not the JSON.
def lcg_uniforms(seed, count):
    x = seed
    out = []
    for _ in range(count):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append((x >> 11) / 2**53)
    return np.array(out)


M = 300_000
u = lcg_uniforms(7, 2 * M).reshape(M, 2)
yb = (u[:, 0] < 0.5).astype(int)
pb = u[:, 1] * 0.8 + yb * 0.2
cases.append({"name": "bucketed auc", "task": "binary", "columns": 1, "lcg": {"seed": 7, "rows": M},
              "weights": None, "from_logits": False, "metrics": ["auc", "pr_auc"], "tolerance": 1e-3,
              "expected": {"auc": skm.roc_auc_score(yb, pb), "pr_auc": skm.average_precision_score(yb, pb)}})

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json")
with open(out, "w") as f:
    json.dump({"generator": "eval/tests/reference.py", "sklearn": __import__("sklearn").__version__,
               "cases": cases}, f)
print("wrote", out)
