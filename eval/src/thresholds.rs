//! Pass/fail rules over an evaluation: bounds (`accuracy>=0.9`) and drops
//! against a baseline (`accuracy=0.01` absolute, `accuracy=2%` relative).
//!
//! A drop is a change for the worse in the metric's direction
//! ([`Metric::higher_is_better`]): for accuracy `baseline − amount`
//! (relative: `baseline − |baseline| × amount`) is the lowest value allowed,
//! for losses `baseline + amount` the highest. A metric the baseline lacks
//! (a new model, a new metric) is not checked against it. A bound on a
//! metric the evaluation lacks, or whose value is NaN, is breached: a
//! rule that cannot be checked does not pass (callers add the metrics of
//! their bounds to what they compute).

use crate::metrics::{Evaluation, Metric};
use std::collections::BTreeMap;

/// `>=` or `<=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundOp {
    AtLeast,
    AtMost,
}

impl BoundOp {
    /// `>=` or `<=`.
    pub fn symbol(self) -> &'static str {
        match self {
            BoundOp::AtLeast => ">=",
            BoundOp::AtMost => "<=",
        }
    }
}

/// A metric's bound: `accuracy>=0.9`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub metric: Metric,
    pub op: BoundOp,
    pub value: f64,
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}{}", self.metric, self.op.symbol(), self.value)
    }
}

fn parse_number(text: &str, rule: &str) -> Result<f64, String> {
    let value: f64 = text.trim().parse().map_err(|_| format!("'{rule}': '{}' is not a number", text.trim()))?;
    if !value.is_finite() {
        return Err(format!("'{rule}': the value must be a finite number"));
    }
    Ok(value)
}

impl std::str::FromStr for Bound {
    type Err = String;

    /// `accuracy>=0.9`, `log_loss <= 0.3`.
    fn from_str(rule: &str) -> Result<Bound, String> {
        let (at, op) = match (rule.find(">="), rule.find("<=")) {
            (Some(at), None) => (at, BoundOp::AtLeast),
            (None, Some(at)) => (at, BoundOp::AtMost),
            _ => {
                let hint =
                    if rule.contains(['>', '<', '=']) { " ('>' and '<' and '=' alone are not bounds)" } else { "" };
                return Err(format!("'{rule}': expected METRIC>=VALUE or METRIC<=VALUE{hint}"));
            }
        };
        let metric = Metric::parse(&rule[..at]).map_err(|e| format!("'{rule}': {e}"))?;
        let value = parse_number(&rule[at + 2..], rule)?;
        Ok(Bound { metric, op, value })
    }
}

/// The largest drop allowed against a baseline: `accuracy=0.01` or `accuracy=2%`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaxDrop {
    pub metric: Metric,
    /// Absolute, or a fraction of the baseline's value when `relative` (2% is 0.02).
    pub amount: f64,
    pub relative: bool,
}

impl std::fmt::Display for MaxDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.relative {
            write!(f, "{}={}%", self.metric, self.amount * 100.0)
        } else {
            write!(f, "{}={}", self.metric, self.amount)
        }
    }
}

impl std::str::FromStr for MaxDrop {
    type Err = String;

    fn from_str(rule: &str) -> Result<MaxDrop, String> {
        let Some((name, amount)) = rule.split_once('=') else {
            return Err(format!(
                "'{rule}': expected METRIC=AMOUNT or METRIC=PERCENT% (e.g. accuracy=0.01, accuracy=2%)"
            ));
        };
        let metric = Metric::parse(name).map_err(|e| format!("'{rule}': {e}"))?;
        let amount = amount.trim();
        let (number, relative) = match amount.strip_suffix('%') {
            Some(n) => (n, true),
            None => (amount, false),
        };
        let mut value = parse_number(number, rule)?;
        if value < 0.0 {
            return Err(format!("'{rule}': the drop allowed cannot be negative"));
        }
        if relative {
            value /= 100.0;
        }
        Ok(MaxDrop { metric, amount: value, relative })
    }
}

/// A rule an evaluation does not meet: the protocol's, since the outcome
/// `below_threshold` carries every one.
pub use isorun_protocol::Breach;

/// Every breach, in order: bounds first (as given), then drops against
/// the baseline's metrics, if a baseline is given. The first is the
/// outcome's; a nightly job wants to see all it missed at once.
pub fn check(
    evaluation: &Evaluation,
    bounds: &[Bound],
    drops: &[MaxDrop],
    baseline: Option<&BTreeMap<String, f64>>,
) -> Vec<Breach> {
    let mut breaches = Vec::new();
    let value_of = |m: Metric| evaluation.metrics.get(m.name()).copied().unwrap_or(f64::NAN);
    for bound in bounds {
        let value = value_of(bound.metric);
        let met = match bound.op {
            BoundOp::AtLeast => value >= bound.value,
            BoundOp::AtMost => value <= bound.value,
        };
        if !met {
            breaches.push(Breach {
                metric: bound.metric.name().into(),
                rule: bound.to_string(),
                bound: bound.value,
                value,
                baseline: None,
            });
        }
    }
    let Some(baseline) = baseline else { return breaches };
    for drop in drops {
        let Some(&base) = baseline.get(drop.metric.name()) else { continue };
        if !base.is_finite() {
            continue;
        }
        let allowed = if drop.relative { base.abs() * drop.amount } else { drop.amount };
        let value = value_of(drop.metric);
        let (bound, met) = if drop.metric.higher_is_better() {
            (base - allowed, value >= base - allowed)
        } else {
            (base + allowed, value <= base + allowed)
        };
        if !met {
            breaches.push(Breach {
                metric: drop.metric.name().into(),
                rule: format!("max drop {drop}"),
                bound,
                value,
                baseline: Some(base),
            });
        }
    }
    breaches
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Task;

    fn evaluation(metrics: &[(&str, f64)]) -> Evaluation {
        Evaluation {
            examples: 10,
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
            ci: None,
            not_probabilities: None,
        }
    }

    #[test]
    fn every_breach_is_found_bounds_first_then_drops() {
        let evaluation = evaluation(&[("accuracy", 0.5), ("auc", 0.6), ("log_loss", 0.9)]);
        let bounds: Vec<Bound> =
            ["accuracy>=0.9", "auc>=0.5", "log_loss<=0.5"].iter().map(|b| b.parse().unwrap()).collect();
        let drops: Vec<MaxDrop> = ["auc=0.05"].iter().map(|d| d.parse().unwrap()).collect();
        let baseline: BTreeMap<String, f64> = [("auc".to_string(), 0.7)].into();
        let breaches = check(&evaluation, &bounds, &drops, Some(&baseline));
        let rules: Vec<&str> = breaches.iter().map(|b| b.rule.as_str()).collect();
        assert_eq!(rules, ["accuracy>=0.9", "log_loss<=0.5", "max drop auc=0.05"]);
        assert_eq!(breaches[2].baseline, Some(0.7));
        assert!(check(&evaluation, &bounds[1..2], &[], None).is_empty());
    }
}
