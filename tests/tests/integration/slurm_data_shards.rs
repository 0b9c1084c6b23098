//! `isorun slurm submit eval ... --data-shards D` on the private Slurm
//! cluster of the `slurm` tests: an array of model shards × data shards,
//! each task evaluating its models on its part of the data, and a merge job
//! whose report equals a local `isorun eval` of everything to 1e-12.

use crate::data_shards::assert_same_report;
use crate::slurm::{read_json, Cluster};
use crate::util::{copy_dir, fixtures, isorun, run};

#[test]
fn an_eval_split_over_models_and_data_through_slurm_reports_what_a_local_eval_reports() {
    let Some(cluster) = Cluster::up_for_real_models() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // Two models, one in each of 2 model shards (FNV-1a of the id): 2 × 3 = 6 array tasks.
    for name in ["binary", "raw_examples"] {
        copy_dir(&fixtures().join("eval/models").join(name), &root.join("models").join(name));
    }
    let data = fixtures().join("eval/data/data.tfrecord");
    let data = data.to_str().unwrap();
    let flags = [
        "--data",
        data,
        "--label",
        "label_bin",
        "--weight",
        "weight",
        "--slice",
        "country",
        "--metric",
        "accuracy",
        "--metric",
        "auc",
        "--metric",
        "log_loss",
        "--metric",
        "f1",
    ];
    let local_report = root.join("local.json");
    let local = run(isorun()
        .current_dir(root)
        .args(["eval", "models"])
        .args(flags)
        .arg("--report")
        .arg(&local_report)
        .arg("-q"));
    assert_eq!(local.code, Some(0), "{}", local.stderr);
    let local = read_json(&local_report);

    let submit = [&["--shards", "2", "--data-shards", "3", "--out", "night", "eval", "models"][..], &flags].concat();
    let (array, merge) = cluster.submit(root, &[], &submit);
    let out = root.join("night");
    let script = std::fs::read_to_string(out.join("array.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --array=0-5"), "{script}");
    assert!(script.contains("--data-shard \"$((T % D))/$D\""), "{script}");
    let merged = cluster.merged_report(&out, &merge);
    assert_same_report((Some(0), &local), (Some(0), &merged), 3, "2 model shards × 3 data shards through Slurm");
    assert_eq!(merged["units"].as_array().unwrap().len(), 2, "{merged}");
    let from = merged["settings"]["merged_from"].as_array().unwrap();
    assert_eq!(from.len(), 6, "{from:?}");
    assert!(from.iter().any(|f| f == "shard 1/2 data shard 2/3"), "{from:?}");
    for task in 0..6 {
        assert_eq!(cluster.job_state(&format!("{array}_{task}")), "COMPLETED", "task {task}");
        assert!(out.join(format!("shards/{task}.json")).is_file(), "shards/{task}.json");
    }
    let listed = read_json(&out.join("models.json"));
    assert_eq!((listed["shards"].as_u64(), listed["data_shards"].as_u64()), (Some(2), Some(3)));
    assert_eq!(listed["command"][1], "eval", "{listed}");
}
