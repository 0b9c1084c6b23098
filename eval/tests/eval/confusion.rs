//! Confusions past `max_confusion_classes`: a 1,500-class classifier with
//! planted confusions keeps the top ones (not 1,500² counts), exactly while
//! the summary holds every confused pair, within its stated bound past
//! that, and the same merged from shards (through their JSON) as in one pass.

use isorun_eval::confusion::TOP_CONFUSION_ENTRIES;
use isorun_eval::{Evaluation, Evaluator, Labels, MetricState, MetricsSpec, Targets};
use isorun_protocol::{DType, SignatureInfo, Tensor};

use super::util;

const CLASSES: usize = 1500;

fn signature() -> SignatureInfo {
    util::signature(vec![], vec![util::tensor("out", DType::Float32, &[None, Some(CLASSES as u64)])])
}

/// The planted confusions: (true, predicted, examples).
const PLANTED: [(usize, usize, usize); 4] = [(7, 1203, 60), (1499, 0, 45), (100, 5, 30), (5, 100, 25)];

/// (label, predicted) per example: the planted confusions, `noise` pairs
/// confused once each (all distinct, a planted one left out), and right answers.
fn examples(noise: usize) -> Vec<(usize, usize)> {
    let mut rows = Vec::new();
    for &(t, p, n) in &PLANTED {
        rows.extend(std::iter::repeat_n((t, p), n));
    }
    for k in 0..noise {
        let (t, p) = (k % CLASSES, (k / CLASSES + 1 + k % CLASSES) % CLASSES);
        if !PLANTED.iter().any(|&(a, b, _)| (a, b) == (t, p)) {
            rows.push((t, p));
        }
    }
    rows.extend((0..3000).map(|k| (k % CLASSES, k % CLASSES)));
    // Interleaved, so shards each see part of every planted pair.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    let mut x = 12345u64;
    for i in (1..order.len()).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    order.into_iter().map(|i| rows[i]).collect()
}

fn evaluate(rows: &[(usize, usize)], spec: &MetricsSpec) -> Evaluator {
    let mut evaluator = Evaluator::new(spec, &signature(), &[]).unwrap();
    for chunk in rows.chunks(512) {
        let mut values = vec![0f32; chunk.len() * CLASSES];
        for (r, &(_, p)) in chunk.iter().enumerate() {
            values[r * CLASSES + p] = 1.0;
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let targets = Targets {
            rows: chunk.len(),
            labels: Labels::Int(chunk.iter().map(|&(t, _)| t as i64).collect()),
            weights: None,
            slices: vec![],
            first_index: 0,
            keys: None,
        };
        let tensor = Tensor::dense(DType::Float32, vec![chunk.len() as u64, CLASSES as u64], bytes);
        evaluator.update(&[("out".into(), tensor)], &targets).unwrap();
    }
    evaluator
}

fn top(evaluation: &Evaluation) -> Vec<(usize, usize, u64)> {
    evaluation.top_confusions.as_ref().unwrap().top.iter().map(|c| (c.truth, c.predicted, c.count)).collect()
}

fn merged_shards(rows: &[(usize, usize)], spec: &MetricsSpec, shards: usize) -> Evaluation {
    let mut merged: Option<MetricState> = None;
    for part in rows.chunks(rows.len().div_ceil(shards)) {
        let state = evaluate(part, spec).state();
        let state = MetricState::from_json(&serde_json::from_str(&state.to_json().to_string()).unwrap()).unwrap();
        match &mut merged {
            None => merged = Some(state),
            Some(m) => m.merge(&state).unwrap(),
        }
    }
    Evaluation::from_state(&merged.unwrap())
}

#[test]
fn past_max_confusion_classes_the_record_has_the_exact_top_confusions() {
    let rows = examples(2000);
    let spec = MetricsSpec::default();
    let one = evaluate(&rows, &spec).finish();
    assert!(one.confusion_matrix.is_none() && one.confusion_matrix_omitted);
    let summary = one.top_confusions.as_ref().unwrap();
    assert!(summary.exact);
    assert_eq!(summary.top.len(), 20);
    let planted: Vec<(usize, usize, u64)> = PLANTED.iter().map(|&(t, p, n)| (t, p, n as u64)).collect();
    assert_eq!(top(&one)[..4], planted[..]);
    // The rest are noise pairs confused once, by (true, predicted).
    assert!(top(&one)[4..].iter().all(|&(_, _, n)| n == 1));
    assert_eq!((top(&one)[4].0, top(&one)[4].1), (0, 1));
    let json = one.to_json();
    assert_eq!(json["top_confusions"][0], serde_json::json!({"true": 7, "predicted": 1203, "count": 60}));
    assert_eq!(json["top_confusions_exact"], true);
    assert!(json["confusion_matrix"].is_null());
    // Merged from shards: the same, exactly.
    for shards in [2, 5] {
        let merged = merged_shards(&rows, &spec, shards);
        assert_eq!(merged.top_confusions, one.top_confusions, "{shards} shards");
    }
    // A larger --max-confusion-classes keeps the full matrix instead.
    let full = evaluate(&rows, &MetricsSpec { max_confusion_classes: 2000, ..MetricsSpec::default() }).finish();
    let matrix = full.confusion_matrix.as_ref().unwrap();
    assert_eq!(matrix.len(), CLASSES);
    assert_eq!(matrix[7][1203], 60);
    assert!(full.top_confusions.is_none() && !full.confusion_matrix_omitted);
}

#[test]
fn more_confused_pairs_than_entries_keep_the_planted_ones_within_the_bound() {
    let noise = TOP_CONFUSION_ENTRIES + 4000;
    let rows = examples(noise);
    let spec = MetricsSpec::default();
    let one = evaluate(&rows, &spec).finish();
    let json = one.to_json();
    assert_eq!(json["top_confusions_exact"], false);
    for evaluation in [one.clone(), merged_shards(&rows, &spec, 3)] {
        let summary = evaluation.top_confusions.as_ref().unwrap();
        assert!(!summary.exact);
        // The bound: at most off-diagonal examples / (entries + 1) taken from any count.
        let off_diagonal = (noise + PLANTED.iter().map(|p| p.2).sum::<usize>()) as u64;
        assert!(summary.max_error <= off_diagonal / (TOP_CONFUSION_ENTRIES as u64 + 1) + 1, "{}", summary.max_error);
        for (k, &(t, p, n)) in PLANTED.iter().enumerate() {
            let c = summary.top[k];
            assert_eq!((c.truth, c.predicted), (t, p));
            assert!(c.count <= n as u64 && c.count + summary.max_error >= n as u64, "{c:?} of {n}");
        }
    }
}
