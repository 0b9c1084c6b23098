"""A plain NumPy / scikit-learn Poisson bootstrap of the case written by
eval/tests/ci.rs, with the weights drawn by this script's own copy of the
generator (SplitMix64's finalizer, FNV-1a for keys, Poisson(1) by inversion,
as eval/src/bootstrap.rs): every replicate's accuracy, mse, log_loss and AUC
and the np.quantile interval must agree with isorun's to 1e-9.

usage: python ci_reference.py CASE.json
"""

import json
import math
import sys

import numpy as np
from sklearn.metrics import accuracy_score, log_loss, mean_squared_error, roc_auc_score

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
INDEX_DOMAIN = 0x6973_6F72_756E_6978
KEY_DOMAIN = 0x6973_6F72_756E_6B79


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def id_of_index(i):
    return mix64(i ^ INDEX_DOMAIN)


def id_of_key(key):
    h = 0xCBF29CE484222325
    for b in key.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return mix64(h ^ KEY_DOMAIN)


def uniform(seed, ident, r):
    z = mix64(((seed + GOLDEN) & MASK) ^ mix64(ident ^ mix64((r * GOLDEN) & MASK)))
    return (z >> 11) * (1.0 / (1 << 53))


def poisson1(u):
    k, p = 0, math.exp(-1.0)
    cdf = p
    while u >= cdf and k < 20:
        k += 1
        p /= k
        cdf += p
    return k


def main(path):
    case = json.load(open(path))
    y = np.array(case["labels"], dtype=np.float64)
    s = np.array(case["scores"], dtype=np.float64)
    base = np.ones(len(y)) if case["weights"] is None else np.array(case["weights"], dtype=np.float64)
    if case["by"] == "key":
        ids = [id_of_key(k) for k in case["keys"]]
    else:
        ids = [id_of_index(case["first_index"] + i) for i in range(len(y))]
    R, seed, level = case["replicates"], case["seed"], case["level"]
    eps = np.finfo(np.float64).eps
    values = {"accuracy": [], "mse": [], "log_loss": [], "auc": []}
    for r in range(R):
        k = np.array([poisson1(uniform(seed, i, r)) for i in ids], dtype=np.float64)
        w = base * k
        keep = w > 0
        yy, ss, ww = y[keep], s[keep], w[keep]
        values["accuracy"].append(accuracy_score(yy, (ss > 0.5).astype(float), sample_weight=ww))
        values["mse"].append(mean_squared_error(yy, ss, sample_weight=ww))
        values["log_loss"].append(log_loss(yy, np.clip(ss, eps, 1 - eps), sample_weight=ww, labels=[0, 1]))
        values["auc"].append(roc_auc_score(yy, ss, sample_weight=ww))
    worst = 0.0
    for metric, mine in values.items():
        theirs = np.array(case["bootstrap_values"][metric], dtype=np.float64)
        mine = np.array(mine)
        diff = float(np.max(np.abs(mine - theirs)))
        worst = max(worst, diff)
        if diff > 1e-9:
            sys.exit(f"{metric}: replicate values differ by {diff} (numpy {mine[:5]}, isorun {theirs[:5]})")
        low, high = np.quantile(mine, [(1 - level) / 2, (1 + level) / 2])
        ci = case["ci"][metric]
        if abs(low - ci[0]) > 1e-9 or abs(high - ci[1]) > 1e-9:
            sys.exit(f"{metric}: interval numpy [{low}, {high}], isorun {ci}")
    print(f"{case['by']}: {R} replicates of {len(y)} examples agree (largest difference {worst:.3g})")


if __name__ == "__main__":
    main(sys.argv[1])
