"""Writes eval/tests/calibration_reference.json: seeded predictions, labels,
weights and slices with the ece (NumPy, Guo et al. 2017's equal-width bins,
as eval/src/calibration.rs documents them), brier (scikit-learn's
brier_score_loss) and the reliability diagram they give, for
tests/calibration.rs.

Run with the fixtures venv:
~/.cache/isorun/fixtures-venv/bin/python eval/tests/calibration_reference.py
"""
import json
import os

import numpy as np
from sklearn import metrics as skm

rng = np.random.default_rng(24)
N = 600


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def bins_of(conf, bins):
    # Bin b holds (b/N, (b+1)/N], the first [0, 1/N]: the inner edges strictly below.
    edges = np.arange(bins + 1) / bins
    return np.searchsorted(edges[1:-1], conf, side="left"), edges


def ece_and_diagram(conf, correct, w, bins):
    w = np.ones_like(conf) if w is None else w
    b, edges = bins_of(conf, bins)
    total = w.sum()
    ece = 0.0
    diagram = {"bins": bins, "edges": edges.tolist(), "count": [], "confidence": [], "accuracy": []}
    for k in range(bins):
        m = b == k
        diagram["count"].append(int(m.sum()))
        wb = w[m].sum()
        if wb == 0:
            diagram["confidence"].append(None)
            diagram["accuracy"].append(None)
            continue
        acc = float(np.sum(w[m] * correct[m]) / wb)
        cb = float(np.sum(w[m] * conf[m]) / wb)
        diagram["confidence"].append(cb)
        diagram["accuracy"].append(acc)
        ece += wb / total * abs(acc - cb)
    return float(ece), diagram


def binary(y, p, w, bins, threshold=0.5):
    pred = p > threshold
    conf = np.where(pred, p, 1 - p)
    ece, diagram = ece_and_diagram(conf, (pred == (y == 1)).astype(float), w, bins)
    return {"ece": ece, "brier": float(skm.brier_score_loss(y, p, sample_weight=w))}, diagram


def multiclass(y, probs, w, bins):
    pred = probs.argmax(axis=1)
    conf = probs[np.arange(len(y)), pred]
    ece, diagram = ece_and_diagram(conf, (pred == y).astype(float), w, bins)
    brier = skm.brier_score_loss(y, probs, sample_weight=w, labels=list(range(probs.shape[1])))
    return {"ece": ece, "brier": float(brier)}, diagram


cases = []


def add(name, task, columns, y, outputs, w, bins, score, slice_values=None, from_logits=False, threshold=0.5):
    probs = outputs
    if from_logits:
        probs = 1 / (1 + np.exp(-outputs)) if columns == 1 else softmax(outputs)
    args = (threshold,) if task == "binary" else ()
    expected, diagram = score(y, probs, w, bins, *args)
    case = {"name": name, "task": task, "columns": columns, "labels": y.tolist(),
            "outputs": outputs.reshape(-1).tolist(), "weights": None if w is None else w.tolist(),
            "bins": bins, "from_logits": from_logits, "threshold": threshold,
            "expected": expected, "diagram": diagram}
    if slice_values is not None:
        case["slice"] = slice_values.tolist()
        case["expected_slices"] = {
            v: score(y[slice_values == v], probs[slice_values == v], None if w is None else w[slice_values == v],
                     bins, *args)[0]
            for v in sorted(set(slice_values.tolist()))}
    cases.append(case)


y = rng.integers(0, 2, N)
p = np.clip(0.35 * y + rng.random(N) * 0.65, 0, 1)
w = rng.random(N) * 2
groups = rng.choice(np.array(["a", "b", "c"]), N)
add("binary", "binary", 1, y, p, None, 15, binary, groups)
add("binary weighted", "binary", 1, y, p, w, 15, binary, groups)
add("binary 10 bins weighted", "binary", 1, y, p, w, 10, binary)
add("binary one bin", "binary", 1, y, p, None, 1, binary)
add("binary threshold 0.3", "binary", 1, y, p, w, 15, binary, threshold=0.3)
# Scores on the bin edges (k/15, and 0, 0.5, 1): each belongs to the bin below.
grid = rng.integers(0, 16, N) / 15
grid[:3] = [0.0, 0.5, 1.0]
add("binary on the edges", "binary", 1, y, grid, None, 15, binary)
add("binary logits", "binary", 1, y, rng.normal(0, 2, N) + (2 * y - 1), w, 15, binary, from_logits=True)

for classes, weighted in ((3, False), (3, True), (2, False), (10, True)):
    yc = rng.integers(0, classes, N)
    z = rng.normal(0, 1.5, (N, classes))
    z[np.arange(N), yc] += 1.5
    name = f"multiclass {classes}" + (" weighted" if weighted else "")
    add(name, "multiclass", classes, yc, softmax(z), w if weighted else None, 15, multiclass,
        groups if classes == 3 else None)
    if classes == 10:
        add(name + " logits", "multiclass", classes, yc, z, None, 20, multiclass, from_logits=True)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration_reference.json")
with open(path, "w") as f:
    json.dump({"numpy": np.__version__, "sklearn": __import__("sklearn").__version__, "cases": cases}, f)
print(path, len(cases), "cases")
