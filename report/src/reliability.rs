//! Reliability diagrams for the HTML report: per model whose record has
//! `"calibration"` (eval with `--metric ece`), the accuracy of each
//! confidence bin against the diagonal of perfect calibration, as an inline
//! SVG. Records are not trusted: bins past [`MAX_BINS`], values outside
//! [0, 1] and lists of the wrong length draw nothing for that model.

use crate::escape::escape_html;
use crate::unit::Unit;
use serde_json::Value;
use std::fmt::Write;

/// The most bins drawn (eval allows up to 10,000; a diagram of more is a smear).
pub(crate) const MAX_BINS: usize = 200;

/// The most models drawn.
const MAX_DIAGRAMS: usize = 1000;

const SIZE: f64 = 240.0;
const MARGIN: f64 = 30.0;

/// A bin with examples: lower edge, upper edge, accuracy, mean confidence, examples.
type Bin = (f64, f64, f64, f64, u64);

/// The bins with examples; `None` when the record's diagram is malformed.
fn bins(calibration: &Value) -> Option<Vec<Bin>> {
    let edges = calibration["edges"].as_array()?;
    let count = calibration["count"].as_array()?;
    let accuracy = calibration["accuracy"].as_array()?;
    let confidence = calibration["confidence"].as_array()?;
    let n = count.len();
    if n == 0 || n > MAX_BINS || edges.len() != n + 1 || accuracy.len() != n || confidence.len() != n {
        return None;
    }
    let unit = |v: &Value| v.as_f64().filter(|x| (0.0..=1.0).contains(x));
    let mut out = Vec::new();
    for b in 0..n {
        let (low, high) = (unit(&edges[b])?, unit(&edges[b + 1])?);
        let examples = count[b].as_u64()?;
        if examples == 0 || accuracy[b].is_null() {
            continue;
        }
        out.push((
            low,
            high,
            unit(&accuracy[b])?,
            confidence[b].as_f64().unwrap_or(f64::NAN).clamp(0.0, 1.0),
            examples,
        ));
    }
    Some(out)
}

/// One `<figure>` per model with a reliability diagram; nothing when none has one.
pub(crate) fn reliability_diagrams(units: &[Unit<'_>]) -> String {
    let mut html = String::new();
    for unit in units.iter().take(MAX_DIAGRAMS) {
        let Some(bins) = unit.0.get("calibration").and_then(bins) else { continue };
        let ece = unit.0["metrics"]["ece"].as_f64().map_or_else(String::new, |e| format!(", ece {e:.4}"));
        let full = SIZE + 2.0 * MARGIN;
        let x = |v: f64| MARGIN + v * SIZE;
        let y = |v: f64| MARGIN + (1.0 - v) * SIZE;
        let _ = write!(
            html,
            "<figure class=\"reliability\"><figcaption><code>{model}</code>{ece}</figcaption>\n\
             <svg class=\"chart reliability\" role=\"img\" viewBox=\"0 0 {full} {full}\" width=\"{full}\" height=\"{full}\">\
             <title>Reliability diagram of {model}: accuracy per confidence bin</title>\
             <rect x=\"{MARGIN}\" y=\"{MARGIN}\" width=\"{SIZE}\" height=\"{SIZE}\" fill=\"none\" stroke=\"#999\"></rect>\
             <line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\" stroke-dasharray=\"4 3\"></line>",
            x(0.0),
            y(0.0),
            x(1.0),
            y(1.0),
            model = escape_html(unit.model()),
        );
        for (low, high, accuracy, confidence, examples) in bins {
            let _ = write!(
                html,
                "<rect class=\"bar passed\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\">\
                 <title>confidence ({low:.3}, {high:.3}]: accuracy {accuracy:.4}, mean confidence {confidence:.4}, {examples} examples</title></rect>",
                x(low),
                y(accuracy),
                (x(high) - x(low) - 1.0).max(0.5),
                accuracy * SIZE
            );
        }
        let _ = writeln!(
            html,
            "<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">confidence</text>\
             <text class=\"label\" x=\"12\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 12 {})\">accuracy</text></svg></figure>",
            MARGIN + SIZE / 2.0,
            full - 8.0,
            MARGIN + SIZE / 2.0,
            MARGIN + SIZE / 2.0
        );
    }
    if html.is_empty() {
        return html;
    }
    format!("<section id=\"calibration\">\n<h2>Reliability diagrams</h2>\n{html}</section>\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_diagram_per_model_with_calibration_and_none_from_bad_records() {
        let good = json!({"model": "m<1>", "status": "ok", "metrics": {"ece": 0.05}, "calibration": {
            "bins": 2, "edges": [0.0, 0.5, 1.0], "count": [3, 0], "weight": [3.0, 0.0],
            "confidence": [0.4, null], "accuracy": [0.25, null]}});
        let bad = json!({"model": "x", "status": "ok", "calibration": {
            "bins": 2, "edges": [0.0, 0.5, 7.0], "count": [3, 1], "confidence": [0.4, 0.9], "accuracy": [0.25, 1.0]}});
        let units = [good, bad, json!({"model": "y", "status": "ok"})];
        let units: Vec<Unit<'_>> = units.iter().map(Unit).collect();
        let html = reliability_diagrams(&units);
        assert!(html.contains("<h2>Reliability diagrams</h2>"));
        assert!(html.contains("<code>m&lt;1&gt;</code>, ece 0.0500"), "{html}");
        assert_eq!(html.matches("<figure").count(), 1, "{html}");
        assert_eq!(html.matches("class=\"bar passed\"").count(), 1, "an empty bin draws no bar");
        assert!(reliability_diagrams(&units[2..]).is_empty());
    }
}
