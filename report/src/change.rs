//! A model's change against its baseline record (`eval --baseline`): the
//! record's `"change": {METRIC: {"baseline", "delta"}}`, and with `--ci`
//! the paired change of the same examples, and `--gate significant`'s
//! decision. In its own module so every reader and writer of `change`
//! (eval, rescore, report merge) decides it in one place.
//!
//! How significance is decided, per metric:
//! - accuracy, where both nights' predictions files are there
//!   (`--predictions`, matched by key or index): McNemar's exact test on the
//!   discordant examples ([`Discordant`], `"test": "mcnemar_exact"`),
//!   significant when p < 1 − level. The percentile paired bootstrap
//!   declares 12 broken against 4 fixed of 5,000 significant (p = 0.03)
//!   where the exact p is 0.077: with few discordant examples it does not
//!   keep its level, the exact test does (a test simulates 400 null
//!   nights). The counts are used only when they give the record's own
//!   accuracy change (unweighted, the same decision threshold).
//! - every other metric (and accuracy without both predictions files): the
//!   paired bootstrap, `new_r − base_r` over the same replicates, seed and
//!   keying (`"test": "paired_bootstrap"`): its interval, a two-sided
//!   bootstrap p, significant when the interval excludes 0. The baseline's
//!   replicates are its record's `bootstrap_values`, or drawn again from its
//!   predictions file when the record has none (the caller fills
//!   [`BaselineRecord::bootstrap`]).
//! - a metric with no paired statistic (`ece` and multiclass `brier`, which
//!   the replicates do not compute; a baseline without replicates of it) gets
//!   `"significant": null` and `"unpaired"`, the reason, whenever this run
//!   has `--ci`. The gate fails closed: a `--max-drop` breach is dropped only
//!   where `"significant"` is `false`, so a breach that cannot be tested, or
//!   of a metric not computed, stays a breach.

use isorun_eval::predictions::mcnemar_exact_p;
use isorun_eval::{paired_change, Breach, Evaluation};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The level at which the exact test decides when this run has no `--ci`.
pub const DEFAULT_LEVEL: f64 = 0.95;

/// When a `--max-drop` breach fails a model (`--gate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gate {
    /// The drop alone (without `--gate`).
    #[default]
    Always,
    /// The drop and a paired interval of the change that excludes 0.
    Significant,
}

impl Gate {
    /// `always` or `significant`.
    pub fn parse(text: &str) -> Option<Gate> {
        match text {
            "always" => Some(Gate::Always),
            "significant" => Some(Gate::Significant),
            _ => None,
        }
    }

    /// As `--gate` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Gate::Always => "always",
            Gate::Significant => "significant",
        }
    }
}

/// A model's record in the baseline: its metrics and, when it was
/// evaluated with `--ci`, its bootstrap settings and replicate values; with
/// `--predictions`, its predictions file. What pairs it with this run
/// through the predictions (`discordant`, replicates drawn from the file,
/// or why that failed) is filled in by the caller before [`change_json`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BaselineRecord {
    pub metrics: BTreeMap<String, f64>,
    pub bootstrap: Option<BaselineBootstrap>,
    /// The record's `"predictions"` file (eval `--predictions`).
    pub predictions: Option<PathBuf>,
    /// The examples whose correctness changed, from both predictions files.
    pub discordant: Option<Discordant>,
    /// Why pairing through the predictions failed, for the record.
    pub unpaired: Option<String>,
}

/// McNemar's discordant counts of two runs over the same examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discordant {
    /// Right in the baseline, wrong now.
    pub broke: u64,
    /// Wrong in the baseline, right now.
    pub fixed: u64,
    /// Examples compared.
    pub examples: u64,
}

/// The baseline's `"bootstrap"` settings and `"bootstrap_values"`.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineBootstrap {
    /// `{"replicates", "seed", "by"}` as the record has it.
    pub settings: Value,
    pub values: BTreeMap<String, Vec<f64>>,
}

fn numbers(value: &Value) -> BTreeMap<String, f64> {
    value
        .as_object()
        .map(|m| m.iter().filter_map(|(name, v)| Some((name.clone(), v.as_f64()?))).collect())
        .unwrap_or_default()
}

impl BaselineBootstrap {
    /// From a record's `"bootstrap"` and `"bootstrap_values"` (NaN for `null`).
    pub fn from_fields(settings: &Value, values: &Value) -> Option<BaselineBootstrap> {
        let values = values
            .as_object()?
            .iter()
            .filter_map(|(m, list)| {
                let list = list.as_array()?.iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect();
                Some((m.clone(), list))
            })
            .collect();
        settings.is_object().then(|| BaselineBootstrap { settings: settings.clone(), values })
    }

    /// `{"bootstrap": .., "values": ..}`, as a data shard's record keeps it for `report merge`.
    pub fn to_json(&self) -> Value {
        json!({"bootstrap": self.settings, "values": self.values})
    }
}

impl BaselineRecord {
    /// A unit record of an eval report (`metrics`, `bootstrap`, `bootstrap_values`).
    pub fn from_unit(unit: &Value) -> Option<BaselineRecord> {
        let metrics = numbers(unit.get("metrics")?);
        let bootstrap = BaselineBootstrap::from_fields(&unit["bootstrap"], &unit["bootstrap_values"]);
        let predictions = unit["predictions"].as_str().map(PathBuf::from);
        Some(BaselineRecord { metrics, bootstrap, predictions, ..BaselineRecord::default() })
    }

    /// What a data shard's record carries (`baseline_metrics`, `baseline_bootstrap`).
    pub fn from_shard_unit(unit: &Value) -> Option<BaselineRecord> {
        let metrics = numbers(unit.get("baseline_metrics")?);
        let b = &unit["baseline_bootstrap"];
        let bootstrap = BaselineBootstrap::from_fields(&b["bootstrap"], &b["values"]);
        Some(BaselineRecord { metrics, bootstrap, ..BaselineRecord::default() })
    }

    /// Whether its replicates pair with `evaluation`'s: the same replicates, seed and keying.
    pub fn pairs_with(&self, evaluation: &Evaluation) -> bool {
        match (&self.bootstrap, &evaluation.ci) {
            (Some(base), Some(ci)) => {
                base.settings
                    == json!({"replicates": ci.spec.bootstrap.replicates, "seed": ci.spec.bootstrap.seed, "by": ci.spec.by.name()})
            }
            _ => false,
        }
    }
}

/// The bootstrap settings `--ci` draws with, as records write them.
pub fn bootstrap_settings(replicates: u32, seed: u64, by: &str) -> Value {
    json!({"replicates": replicates, "seed": seed, "by": by})
}

/// `{METRIC: {"baseline", "delta", "test"?, "ci"?, "p"?, "significant"?,
/// "unpaired"?}}` for the metrics both have: see the module's doc for how
/// each metric is tested.
pub fn change_json(evaluation: &Evaluation, baseline: &BaselineRecord) -> Map<String, Value> {
    let paired = baseline.pairs_with(evaluation);
    let level = evaluation.ci.as_ref().map_or(DEFAULT_LEVEL, |ci| ci.spec.level);
    let mut change = Map::new();
    for (name, value) in &evaluation.metrics {
        let Some(base) = baseline.metrics.get(name) else { continue };
        let delta = value - base;
        let mut entry = Map::new();
        entry.insert("baseline".into(), json!(base));
        entry.insert("delta".into(), number(delta));
        let bootstrap = match (paired, &evaluation.ci, &baseline.bootstrap) {
            (true, Some(ci), Some(b)) => match (ci.values.get(name), b.values.get(name)) {
                (Some(new), Some(old)) => paired_change(new, old, ci.spec.level).ok_or_else(|| {
                    if new.iter().chain(old).all(|v| v.is_nan()) {
                        format!("the bootstrap replicates do not compute {name}")
                    } else {
                        format!(
                            "the baseline's replicates of {name} are not this run's ({} against {})",
                            old.len(),
                            new.len()
                        )
                    }
                }),
                (_, None) => Err(format!("the baseline has no replicates of {name}")),
                (None, _) => Err(format!("this run has no replicates of {name}")),
            },
            _ => Err(unpaired_reason(evaluation, baseline)),
        };
        if let Ok(p) = &bootstrap {
            entry.insert("ci".into(), json!([number(p.interval.0), number(p.interval.1)]));
        }
        let exact = baseline.discordant.filter(|d| name == "accuracy" && d.gives(delta, evaluation.examples));
        match (exact, bootstrap) {
            (Some(d), _) => {
                let p = mcnemar_exact_p(d.broke, d.fixed);
                entry.insert("test".into(), json!("mcnemar_exact"));
                entry.insert("broke".into(), json!(d.broke));
                entry.insert("fixed".into(), json!(d.fixed));
                entry.insert("p".into(), number(p));
                entry.insert("significant".into(), json!(p < 1.0 - level));
            }
            (None, Ok(p)) => {
                entry.insert("test".into(), json!("paired_bootstrap"));
                entry.insert("p".into(), number(p.p));
                entry.insert("significant".into(), json!(p.significant));
            }
            (None, Err(reason)) if evaluation.ci.is_some() || baseline.discordant.is_some() => {
                entry.insert("significant".into(), Value::Null);
                entry.insert("unpaired".into(), json!(reason));
            }
            (None, Err(_)) => {}
        }
        change.insert(name.clone(), Value::Object(entry));
    }
    change
}

/// Why this run and the baseline have no paired replicates at all.
fn unpaired_reason(evaluation: &Evaluation, baseline: &BaselineRecord) -> String {
    let why = match (&evaluation.ci, &baseline.bootstrap) {
        (None, _) => "this run has no --ci replicates".to_string(),
        (Some(_), None) => "the baseline has no bootstrap replicates".to_string(),
        (Some(ci), Some(b)) => format!(
            "the baseline drew its replicates with {}, this run with {}",
            b.settings,
            bootstrap_settings(ci.spec.bootstrap.replicates, ci.spec.bootstrap.seed, ci.spec.by.name())
        ),
    };
    match &baseline.unpaired {
        Some(predictions) => format!("{why}; {predictions}"),
        None => why,
    }
}

impl Discordant {
    /// Whether these counts give `delta`, an accuracy change over
    /// `examples` examples: (fixed − broke) / examples, as unweighted
    /// accuracies at the same decision threshold do.
    pub fn gives(&self, delta: f64, examples: u64) -> bool {
        let counted = (self.fixed as f64 - self.broke as f64) / examples.max(1) as f64;
        self.examples == examples && (counted - delta).abs() <= 1e-9
    }
}

fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// `--gate significant`: a drop against the baseline (a breach with a
/// baseline value) is dropped only where `change` says the metric's change
/// is not significant (`"significant": false`); one that could not be
/// tested (no entry, `null`: a metric not computed, no paired statistic)
/// stays, as do bounds. The gate fails closed.
pub fn gate_breaches(breaches: Vec<Breach>, gate: Gate, change: &Map<String, Value>) -> Vec<Breach> {
    match gate {
        Gate::Always => breaches,
        Gate::Significant => breaches
            .into_iter()
            .filter(|b| b.baseline.is_none() || change.get(&b.metric).map(|c| &c["significant"]) != Some(&json!(false)))
            .collect(),
    }
}

/// A record's change of `metric`: its delta, whether an old bare number
/// (reports before the change object) or `{"delta"}`.
pub fn delta_of(change: &Value) -> Option<f64> {
    change.as_f64().or_else(|| change["delta"].as_f64())
}

/// A metric of a record as people read it: `0.8140 [0.790, 0.837]` with
/// `--ci`, then its change against the baseline when there is one:
/// `(-0.0100 [-0.030, 0.010], p=0.32)`, `significant` marked. A metric left
/// out because the scores were not probabilities reads `n/a (not
/// probabilities)` (the record's `not_probabilities` says why).
pub fn metric_text(record: &Value, metric: &str) -> Option<String> {
    let value = record["metrics"].get(metric)?;
    let left_out = || record["not_probabilities"]["left_out"].as_array().is_some_and(|l| l.contains(&json!(metric)));
    let mut text = match value.as_f64() {
        Some(x) => format!("{x:.4}"),
        None if left_out() => "n/a (not probabilities)".into(),
        None => value.to_string(),
    };
    let interval = |ci: &Value| Some((ci.get(0)?.as_f64()?, ci.get(1)?.as_f64()?));
    if let Some((low, high)) = record["ci"].get(metric).and_then(interval) {
        text += &format!(" [{low:.3}, {high:.3}]");
    }
    let change = &record["change"][metric];
    if let Some(delta) = delta_of(change) {
        text += &format!(" ({delta:+.4}");
        if let Some((low, high)) = interval(&change["ci"]) {
            text += &format!(" [{low:+.3}, {high:+.3}]");
        }
        if let Some(p) = change["p"].as_f64() {
            text += &format!(", p={p:.3}");
        }
        if change["test"] == json!("mcnemar_exact") {
            text += " McNemar";
        }
        if change["significant"] == json!(true) {
            text += ", significant";
        } else if change["significant"].is_null() && change["unpaired"].is_string() {
            text += ", untested";
        }
        text += ")";
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_eval::bootstrap::{id_of_index, mix64, Bootstrap};
    use isorun_eval::{check, CiSpec, Intervals, KeyedBy, MaxDrop, Metric, Task};

    const REPLICATES: u32 = 200;

    /// An evaluation of `examples` examples with these metrics and, when
    /// given, `--ci` replicate values (200 replicates, seed 0, keyed by key).
    fn evaluation(metrics: &[(&str, f64)], examples: u64, values: Option<BTreeMap<String, Vec<f64>>>) -> Evaluation {
        let spec = CiSpec { bootstrap: Bootstrap { replicates: REPLICATES, seed: 0 }, level: 0.95, by: KeyedBy::Key };
        Evaluation {
            examples,
            task: Task::Binary,
            output: "y".into(),
            defaulted: false,
            metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            slices: BTreeMap::new(),
            confusion_matrix: None,
            confusion_matrix_omitted: false,
            top_confusions: None,
            calibration: None,
            auc_exact: true,
            slices_auc_exact: true,
            top_k: 5,
            threshold: 0.5,
            from_logits: false,
            ci: values.map(|values| Intervals { spec, overall: BTreeMap::new(), values, slices: BTreeMap::new() }),
            not_probabilities: None,
        }
    }

    fn baseline(metrics: &[(&str, f64)], values: Option<BTreeMap<String, Vec<f64>>>) -> BaselineRecord {
        BaselineRecord {
            metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            bootstrap: values
                .map(|values| BaselineBootstrap { settings: bootstrap_settings(REPLICATES, 0, "key"), values }),
            ..BaselineRecord::default()
        }
    }

    fn values(of: &[(&str, Vec<f64>)]) -> BTreeMap<String, Vec<f64>> {
        of.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    /// `--max-drop METRIC=amount` breaches of `evaluation` against `record`, after `--gate significant`.
    fn gated(
        evaluation: &Evaluation,
        record: &BaselineRecord,
        drops: &[(&str, f64)],
    ) -> (Vec<Breach>, Map<String, Value>) {
        let drops: Vec<MaxDrop> = drops
            .iter()
            .map(|(m, amount)| MaxDrop { metric: Metric::parse(m).unwrap(), amount: *amount, relative: false })
            .collect();
        let change = change_json(evaluation, record);
        let breaches = check(evaluation, &[], &drops, Some(&record.metrics));
        (gate_breaches(breaches, Gate::Significant, &change), change)
    }

    #[test]
    fn a_drop_the_gate_cannot_test_stays_a_breach() {
        let spread = |at: f64| (0..REPLICATES).map(|r| at + f64::from(r) * 1e-5).collect::<Vec<f64>>();
        let nan = vec![f64::NAN; REPLICATES as usize];
        // ECE from 0.038 to 0.335: the replicates do not compute it, so it is untested and stays a breach.
        let tonight = evaluation(
            &[("accuracy", 0.80), ("ece", 0.335)],
            2000,
            Some(values(&[("accuracy", spread(0.80)), ("ece", nan.clone())])),
        );
        let record =
            baseline(&[("accuracy", 0.80), ("ece", 0.038)], Some(values(&[("accuracy", spread(0.80)), ("ece", nan)])));
        let (kept, change) = gated(&tonight, &record, &[("ece", 0.01), ("accuracy", 0.01)]);
        assert_eq!(kept.iter().map(|b| b.metric.as_str()).collect::<Vec<_>>(), ["ece"], "{change:?}");
        assert_eq!(change["ece"]["significant"], Value::Null);
        assert_eq!(change["ece"]["unpaired"], "the bootstrap replicates do not compute ece");
        assert_eq!(change["accuracy"]["significant"], false);
        assert_eq!(change["accuracy"]["test"], "paired_bootstrap");
        // A baseline without bootstrap_values for the metric: untested, kept, and the record says why.
        let tonight = evaluation(&[("accuracy", 0.70)], 2000, Some(values(&[("accuracy", spread(0.70))])));
        let record = baseline(&[("accuracy", 0.80)], Some(BTreeMap::new()));
        let (kept, change) = gated(&tonight, &record, &[("accuracy", 0.01)]);
        assert_eq!(kept.len(), 1, "{change:?}");
        assert_eq!(change["accuracy"]["unpaired"], "the baseline has no replicates of accuracy");
        assert_eq!(
            metric_text(&json!({"metrics": {"accuracy": 0.7}, "change": change}), "accuracy").unwrap(),
            "0.7000 (-0.1000, untested)"
        );
        // A metric the run does not compute (auc asked of a baseline that has it): kept, no panic.
        let record = baseline(&[("accuracy", 0.80), ("auc", 0.9)], Some(values(&[("accuracy", spread(0.80))])));
        let (kept, change) = gated(&tonight, &record, &[("auc", 0.01)]);
        assert!(change.get("auc").is_none());
        assert_eq!(kept.len(), 1);
        assert!(kept[0].value.is_nan(), "{kept:?}");
    }

    #[test]
    fn accuracy_with_both_nights_predictions_is_decided_by_mcnemar_s_exact_test() {
        // 16 of 5,000 examples differ: 12 broke, 4 fixed. Replicate deltas all below 0: the bootstrap says significant.
        let examples = 5000;
        let (base, new) = (0.9, 0.9 - 8.0 / 5000.0);
        let replicates = |at: f64| values(&[("accuracy", (0..REPLICATES).map(|r| at + f64::from(r) * 1e-7).collect())]);
        let tonight = evaluation(&[("accuracy", new)], examples, Some(replicates(new)));
        let mut record = baseline(&[("accuracy", base)], Some(replicates(base)));
        let (kept, change) = gated(&tonight, &record, &[("accuracy", 0.001)]);
        assert_eq!((kept.len(), &change["accuracy"]["significant"]), (1, &json!(true)), "{change:?}");
        record.discordant = Some(Discordant { broke: 12, fixed: 4, examples });
        let (kept, change) = gated(&tonight, &record, &[("accuracy", 0.001)]);
        let entry = &change["accuracy"];
        assert_eq!(entry["test"], "mcnemar_exact");
        assert!((entry["p"].as_f64().unwrap() - 0.0768).abs() < 1e-4, "{entry}");
        assert_eq!(
            (entry["significant"].clone(), entry["broke"].clone(), entry["fixed"].clone()),
            (json!(false), json!(12), json!(4))
        );
        assert!(kept.is_empty(), "{kept:?}");
        // The bootstrap interval is still shown; the decision is the exact test's.
        assert!(entry["ci"][1].as_f64().unwrap() < 0.0, "{entry}");
        // 30 broke, 4 fixed: significant, kept.
        let worse = evaluation(&[("accuracy", 0.9 - 26.0 / 5000.0)], examples, Some(replicates(0.9 - 26.0 / 5000.0)));
        record.discordant = Some(Discordant { broke: 30, fixed: 4, examples });
        let (kept, change) = gated(&worse, &record, &[("accuracy", 0.001)]);
        assert_eq!((kept.len(), &change["accuracy"]["significant"]), (1, &json!(true)), "{change:?}");
        // Counts that do not give the record's change (weights, another threshold) are not used.
        record.discordant = Some(Discordant { broke: 12, fixed: 4, examples: 4000 });
        let (_, change) = gated(&tonight, &record, &[("accuracy", 0.001)]);
        assert_eq!(change["accuracy"]["test"], "paired_bootstrap");
    }

    #[test]
    fn at_most_5_percent_of_400_null_nights_with_5_to_40_discordant_examples_fail_the_gate() {
        // 5,000 examples: 4,000 right on both nights, 500 wrong on both, and
        // among 500 others 5 to 40 discordant, each broken or fixed with
        // probability 1/2 (no real change). Replicates are the real
        // bootstrap's weights of these examples, as eval --ci draws them.
        let examples = 5000u64;
        let bootstrap = Bootstrap { replicates: REPLICATES, seed: 0 };
        let mut weights = Vec::new();
        let (mut all, mut right) = (vec![0.0; REPLICATES as usize], vec![0.0; REPLICATES as usize]);
        let mut candidates: Vec<Vec<f64>> = Vec::new();
        for i in 0..examples {
            bootstrap.weights(id_of_index(i), &mut weights);
            for (r, w) in weights.iter().enumerate() {
                all[r] += f64::from(*w);
                if (1..=8).contains(&(i % 10)) {
                    right[r] += f64::from(*w);
                }
            }
            if i % 10 == 0 {
                candidates.push(weights.iter().map(|w| f64::from(*w)).collect());
            }
        }
        let (mut exact_failed, mut exact_significant) = (0, 0);
        let (mut bootstrap_failed, mut bootstrap_significant) = (0, 0);
        for night in 0..400u64 {
            let mut state = mix64(night ^ 0x6e75_6c6c);
            let mut next = || {
                state = mix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
                state
            };
            let discordant = 5 + (next() % 36) as usize;
            let mut order: Vec<usize> = (0..candidates.len()).collect();
            let (mut broke, mut fixed) = (0u64, 0u64);
            let (mut base_r, mut new_r) = (right.clone(), right.clone());
            for k in 0..discordant {
                let pick = k + (next() % (order.len() - k) as u64) as usize;
                order.swap(k, pick);
                let w = &candidates[order[k]];
                let side = if next() & 1 == 1 {
                    broke += 1;
                    &mut base_r
                } else {
                    fixed += 1;
                    &mut new_r
                };
                side.iter_mut().zip(w).for_each(|(s, w)| *s += w);
            }
            let accuracy = |right: u64| right as f64 / examples as f64;
            let ratio = |sums: Vec<f64>| sums.iter().zip(&all).map(|(s, a)| s / a).collect::<Vec<f64>>();
            let tonight = evaluation(
                &[("accuracy", accuracy(4000 + fixed))],
                examples,
                Some(values(&[("accuracy", ratio(new_r))])),
            );
            let mut record =
                baseline(&[("accuracy", accuracy(4000 + broke))], Some(values(&[("accuracy", ratio(base_r))])));
            // Any drop at all is past the bound: only the gate decides.
            let (kept, change) = gated(&tonight, &record, &[("accuracy", 0.0)]);
            bootstrap_failed += usize::from(!kept.is_empty());
            bootstrap_significant += usize::from(change["accuracy"]["significant"] == true);
            record.discordant = Some(Discordant { broke, fixed, examples });
            let (kept, change) = gated(&tonight, &record, &[("accuracy", 0.0)]);
            assert_eq!(change["accuracy"]["test"], "mcnemar_exact");
            exact_failed += usize::from(!kept.is_empty());
            exact_significant += usize::from(change["accuracy"]["significant"] == true);
        }
        // Measured: the exact test fails 9 of 400 nights (14 significant either way); the
        // percentile bootstrap alone, which the gate used before, 10 (20 significant).
        assert!(exact_failed <= 20, "the exact test failed {exact_failed} of 400 null nights");
        assert!(exact_significant <= 20, "the exact test found {exact_significant} of 400 null nights significant");
        assert!(bootstrap_failed + bootstrap_significant > 0, "the simulation draws discordant splits");
    }

    #[test]
    fn gate_significant_keeps_only_significant_drops_and_every_bound() {
        let breach = |metric: &str, baseline: Option<f64>| Breach {
            metric: metric.into(),
            rule: "r".into(),
            bound: 0.0,
            value: 0.0,
            baseline,
        };
        let change: Map<String, Value> = serde_json::from_value(json!({
            "accuracy": {"baseline": 0.9, "delta": -0.1, "significant": true},
            "auc": {"baseline": 0.9, "delta": -0.1, "significant": false},
        }))
        .unwrap();
        let all = vec![breach("accuracy", Some(0.9)), breach("auc", Some(0.9)), breach("auc", None)];
        let kept = gate_breaches(all.clone(), Gate::Significant, &change);
        assert_eq!(kept, vec![all[0].clone(), all[2].clone()]);
        assert_eq!(gate_breaches(all.clone(), Gate::Always, &change), all);
        assert_eq!(delta_of(&json!(-0.5)), Some(-0.5));
        assert_eq!(delta_of(&json!({"delta": 0.25})), Some(0.25));
        let record = json!({"metrics": {"accuracy": 0.814}, "ci": {"accuracy": [0.79, 0.8372]},
            "change": {"accuracy": {"baseline": 0.9, "delta": -0.086, "ci": [-0.1, -0.07], "p": 0.0, "significant": true}}});
        assert_eq!(
            metric_text(&record, "accuracy").unwrap(),
            "0.8140 [0.790, 0.837] (-0.0860 [-0.100, -0.070], p=0.000, significant)"
        );
    }

    #[test]
    fn a_metric_left_out_for_scores_that_are_not_probabilities_reads_n_a() {
        let record = json!({
            "metrics": {"accuracy": 0.736, "log_loss": null, "auc": null},
            "not_probabilities": {"left_out": ["log_loss"]},
        });
        assert_eq!(metric_text(&record, "log_loss").unwrap(), "n/a (not probabilities)");
        assert_eq!(metric_text(&record, "accuracy").unwrap(), "0.7360");
        // A metric that could not be computed for another reason stays null.
        assert_eq!(metric_text(&record, "auc").unwrap(), "null");
    }
}
