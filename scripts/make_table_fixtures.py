"""Parquet and Arrow fixtures for `isorun eval --data`, written by the tools
users write them with (pandas with pyarrow, Hugging Face `datasets`), from
the same 1000 examples as tests/fixtures/eval/data/data.tfrecord (the rows of
`make_eval_fixtures.make_data`), so the same metrics are expected.

  tests/fixtures/eval/data/tables/
      data.parquet   pandas `DataFrame.to_parquet` (pyarrow engine, snappy),
                     4 row groups of 300, 300, 300, 100 rows: x list<float>
                     (4 values a row), label_bin/label_cls int64, target and
                     weight float32, country categorical (dictionary-encoded)
      hf/            `datasets.Dataset.from_dict(...).save_to_disk`:
                     data-00000-of-00001.arrow (the IPC stream format; x a
                     fixed-size list of 4 float32), dataset_info.json, state.json
      data.feather   pyarrow's IPC *file* format (`feather.write_feather`,
                     uncompressed), the same columns as hf/
      lz4.feather    pandas `DataFrame.to_feather` as it writes by default
                     (the IPC file format, lz4-compressed buffers)
      zstd.feather   `feather.write_feather(..., compression="zstd")`
      {lz4,brotli,zstd,gzip}.parquet  `DataFrame.to_parquet(compression=...)`
                     (pyarrow's "lz4" is Parquet's LZ4_RAW)
      ragged.parquet 10 rows whose x has 4 values, but 3 in row 6
      wrong_type.parquet  10 rows whose x is a string
      null_label.parquet  10 rows whose label_bin is null in row 4

Run after make_eval_fixtures.py (which rewrites tests/fixtures/eval), by
`scripts/make-fixtures` (which installs pandas, pyarrow and datasets).
"""

import json
import os
import shutil
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather

import datasets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_eval_fixtures import make_data  # noqa: E402


def frame(data):
    return pd.DataFrame({
        "x": list(data["x"]),
        "label_bin": data["label_bin"],
        "label_cls": data["label_cls"],
        "target": data["target"],
        "weight": data["weight"],
        "country": pd.Categorical([c.decode() for c in data["country"]]),
    })


def write_compressed(df, table, out):
    """The same rows compressed as the field writes them by default."""
    df.to_feather(os.path.join(out, "lz4.feather"))
    feather.write_feather(table, os.path.join(out, "zstd.feather"), compression="zstd")
    for codec in ["lz4", "brotli", "zstd", "gzip"]:
        df.to_parquet(os.path.join(out, f"{codec}.parquet"), engine="pyarrow", index=False,
                      compression=codec, row_group_size=300)


def main():
    repo = os.path.abspath(sys.argv[1])
    out = os.path.join(repo, "tests", "fixtures", "eval", "data", "tables")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    data = make_data()
    df = frame(data)
    df.to_parquet(os.path.join(out, "data.parquet"), engine="pyarrow", index=False, row_group_size=300)

    features = datasets.Features({
        "x": datasets.Sequence(datasets.Value("float32"), length=4),
        "label_bin": datasets.Value("int64"),
        "label_cls": datasets.Value("int64"),
        "target": datasets.Value("float32"),
        "weight": datasets.Value("float32"),
        "country": datasets.Value("string"),
    })
    ds = datasets.Dataset.from_dict({
        "x": data["x"].tolist(),
        "label_bin": data["label_bin"].tolist(),
        "label_cls": data["label_cls"].tolist(),
        "target": data["target"].tolist(),
        "weight": data["weight"].tolist(),
        "country": [c.decode() for c in data["country"]],
    }, features=features)
    hf = os.path.join(out, "hf")
    ds.save_to_disk(hf)
    # The fingerprint in state.json is random per run; the data is not.
    with open(os.path.join(hf, "state.json")) as f:
        state = json.load(f)
    state["_fingerprint"] = "isorun-fixture"
    with open(os.path.join(hf, "state.json"), "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
        f.write("\n")
    feather.write_feather(ds.data.table, os.path.join(out, "data.feather"), compression="uncompressed")

    write_compressed(df, ds.data.table, out)

    small = frame({k: v[:10] for k, v in data.items()})
    ragged = small.copy()
    ragged.at[6, "x"] = data["x"][6][:3]
    ragged.to_parquet(os.path.join(out, "ragged.parquet"), engine="pyarrow", index=False)
    wrong = small.copy()
    wrong["x"] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
    wrong.to_parquet(os.path.join(out, "wrong_type.parquet"), engine="pyarrow", index=False)
    null = small.copy()
    null["label_bin"] = pd.array([1, 0, 1, 0, None, 1, 0, 1, 0, 1], dtype="Int64")
    null.to_parquet(os.path.join(out, "null_label.parquet"), engine="pyarrow", index=False)
    print(f"pandas {pd.__version__}, pyarrow {pa.__version__}, datasets {datasets.__version__}: wrote {out}")


if __name__ == "__main__":
    main()
