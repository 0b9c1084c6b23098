"""Writes tests/fixtures/eval/calibration.json: ece, brier and the
reliability diagram's counts that NumPy and scikit-learn give on the eval
fixtures' own predictions (Python TensorFlow running the models that
scripts/make_eval_fixtures.py saved, on the same data), for
tests/tests/integration/report_table.rs. ece as eval/src/calibration.rs
defines it (Guo et al. 2017: 15 equal-width bins of the top-class
confidence, bin b holding (b/15, (b+1)/15]); brier is sklearn's
brier_score_loss.

Usage: make_calibration_expected.py REPO (after make_eval_fixtures.py)
"""
import json
import os
import sys

import numpy as np
from sklearn import metrics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_eval_fixtures as fx  # noqa: E402

BINS = 15


def ece_and_counts(conf, correct, w):
    w = np.ones_like(conf) if w is None else w
    edges = np.arange(BINS + 1) / BINS
    b = np.searchsorted(edges[1:-1], conf, side="left")
    ece, counts = 0.0, []
    for k in range(BINS):
        m = b == k
        counts.append(int(m.sum()))
        if w[m].sum() > 0:
            ece += w[m].sum() / w.sum() * abs(np.sum(w[m] * correct[m]) / w[m].sum() - np.sum(w[m] * conf[m]) / w[m].sum())
    return float(ece), counts


def main():
    repo = os.path.abspath(sys.argv[1])
    root = os.path.join(repo, "tests", "fixtures", "eval")
    data = fx.make_data()
    records = [fx.example(data, i) for i in range(fx.N)]
    w = data["weight"].astype(np.float64)
    cases = []
    p = fx.predictions(os.path.join(root, "models", "binary"), data, records)[1].reshape(-1)
    y = data["label_bin"]
    for weights in (None, w):
        pred = p > 0.5
        ece, counts = ece_and_counts(np.where(pred, p, 1 - p), (pred == (y == 1)).astype(float), weights)
        cases.append({"name": "binary" + ("_weighted" if weights is not None else ""), "model": "binary",
                      "label": "label_bin", "flags": [] if weights is None else ["--weight", "weight"],
                      "ece": ece, "brier": float(metrics.brier_score_loss(y, p, sample_weight=weights)),
                      "count": counts})
    yc = data["label_cls"]
    for model, flags in (("multiclass", ["--weight", "weight"]), ("logits", ["--from-logits"])):
        probs = fx.predictions(os.path.join(root, "models", model), data, records)[1]
        if model == "logits":
            probs = fx.softmax(probs)
        weights = w if "--weight" in flags else None
        pred = probs.argmax(axis=1)
        ece, counts = ece_and_counts(probs[np.arange(len(yc)), pred], (pred == yc).astype(float), weights)
        brier = metrics.brier_score_loss(yc, probs, sample_weight=weights, labels=[0, 1, 2])
        cases.append({"name": model, "model": model, "label": "label_cls", "flags": flags, "ece": ece,
                      "brier": float(brier), "count": counts})
    with open(os.path.join(root, "calibration.json"), "w") as f:
        json.dump({"bins": BINS, "cases": cases}, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
