//! Sums that do not depend on the order of their terms, so that the metric
//! state of a dataset split over machines and merged gives the same sums,
//! to the last bit, as one pass over it.
//!
//! [`ExactSum`] keeps the exact sum of its terms as non-overlapping
//! partials (Shewchuk's expansions, as Python's `math.fsum`): adding a term
//! or another sum is exact, and [`ExactSum::value`] is the exact sum
//! correctly rounded, whatever the order the terms came in. Products that
//! must not round (`w·y`, `w·y²` for r2) go in as the exact pairs of
//! [`two_product`]. [`Dd`] (double-double, ~106 bits) finishes the few
//! formulas that cancel (r2's Σw·y² − (Σw·y)²/Σw).
//!
//! An [`ExactSum`] is the simplest [`Accumulator`], and the one the others
//! are built of: its laws hold to the last bit. Its JSON is a number when
//! one number holds the sum exactly, else its partials (and `"inf"`,
//! `"-inf"` or `"nan"` for non-finite terms).

use crate::accumulator::Accumulator;
use serde_json::{json, Value};

/// The exact sum of f64 terms. Non-finite terms (and a sum that
/// overflows) are kept apart, as IEEE arithmetic would combine them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExactSum {
    /// Non-overlapping, increasing in magnitude.
    partials: Vec<f64>,
    /// The sum of the non-finite terms (0 when none).
    special: f64,
}

impl ExactSum {
    /// Adds one term, exactly ([`Accumulator::add`]).
    fn add_term(&mut self, x: f64) {
        if !x.is_finite() {
            self.special += x;
            return;
        }
        let mut x = x;
        let mut kept = 0;
        for j in 0..self.partials.len() {
            let mut y = self.partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let high = x + y;
            if !high.is_finite() {
                // Past f64's range: the sum is ±infinity, as a plain sum would say.
                self.special += high;
                self.partials.truncate(kept);
                return;
            }
            let low = y - (high - x);
            if low != 0.0 {
                self.partials[kept] = low;
                kept += 1;
            }
            x = high;
        }
        self.partials.truncate(kept);
        if x != 0.0 || self.partials.is_empty() {
            self.partials.push(x);
        }
    }

    /// Adds every term of `other`, exactly: [`Accumulator::merge`], which
    /// cannot fail for a sum.
    pub fn merge(&mut self, other: &ExactSum) {
        self.special += other.special;
        for &p in &other.partials {
            self.add_term(p);
        }
    }

    /// The exact sum, correctly rounded to f64 (ties to even).
    pub fn value(&self) -> f64 {
        if self.special != 0.0 || self.special.is_nan() {
            return self.special;
        }
        let p = &self.partials;
        let Some(mut j) = p.len().checked_sub(1) else { return 0.0 };
        let mut high = p[j];
        let mut low = 0.0;
        while j > 0 {
            j -= 1;
            let x = high;
            let y = p[j];
            high = x + y;
            let y_rounded = high - x;
            low = y - y_rounded;
            if low != 0.0 {
                break;
            }
        }
        // Round half to even when the rest lies exactly on a tie.
        if j > 0 && ((low < 0.0 && p[j - 1] < 0.0) || (low > 0.0 && p[j - 1] > 0.0)) {
            let y = low * 2.0;
            let x = high + y;
            if y == x - high {
                high = x;
            }
        }
        high
    }

    /// The sum to about 106 bits: the rounded value and what it left out.
    pub fn dd(&self) -> Dd {
        let high = self.value();
        if !high.is_finite() {
            return Dd(high, 0.0);
        }
        let mut rest = self.clone();
        rest.add_term(-high);
        Dd(high, rest.value())
    }

    /// The partials and the non-finite part, for the metric state's JSON.
    pub fn parts(&self) -> (&[f64], f64) {
        (&self.partials, self.special)
    }

    /// A sum from [`ExactSum::parts`] (any finite terms, in any order).
    pub fn from_parts(terms: &[f64], special: f64) -> ExactSum {
        let mut sum = ExactSum::default();
        sum.add_batch(terms.iter().copied());
        if special != 0.0 || special.is_nan() {
            sum.special += special;
        }
        sum
    }
}

impl Accumulator for ExactSum {
    /// One term.
    type Input = f64;
    /// The exact sum, correctly rounded.
    type Output = f64;
    type Bounds = ();

    fn add(&mut self, x: f64) {
        self.add_term(x);
    }

    fn merge(&mut self, other: &ExactSum) -> Result<(), String> {
        ExactSum::merge(self, other);
        Ok(())
    }

    fn finish(&self) -> f64 {
        self.value()
    }

    /// A number when one number holds the sum exactly, else its partials
    /// (and `"inf"`, `"-inf"` or `"nan"` for non-finite terms).
    fn encode(&self) -> Value {
        let (partials, special) = self.parts();
        match partials {
            [] | [_] if special == 0.0 => json!(partials.first().copied().unwrap_or(0.0)),
            _ => {
                let mut list: Vec<Value> = partials.iter().map(|p| json!(p)).collect();
                if special != 0.0 || special.is_nan() {
                    list.push(json!(special_name(special)));
                }
                Value::Array(list)
            }
        }
    }

    fn decode(value: &Value, _: ()) -> Result<ExactSum, String> {
        if let Some(x) = value.as_f64() {
            return Ok(ExactSum::from_parts(&[x], 0.0));
        }
        let list = value.as_array().ok_or_else(|| format!("{value} is not a sum"))?;
        let mut terms = Vec::new();
        let mut special = 0.0;
        for item in list {
            match (item.as_f64(), item.as_str()) {
                (Some(x), _) => terms.push(x),
                (None, Some("inf")) => special += f64::INFINITY,
                (None, Some("-inf")) => special += f64::NEG_INFINITY,
                (None, Some("nan")) => special = f64::NAN,
                _ => return Err(format!("{item} is not a term of a sum")),
            }
        }
        Ok(ExactSum::from_parts(&terms, special))
    }
}

fn special_name(x: f64) -> &'static str {
    if x.is_nan() {
        "nan"
    } else if x > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// `a·b` as `(p, e)` with `p + e == a·b` exactly (Dekker's product,
/// without FMA; exact unless it overflows or underflows).
pub fn two_product(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    if !p.is_finite() || a.abs() > 1e150 || b.abs() > 1e150 {
        return (p, 0.0);
    }
    let (ah, al) = split(a);
    let (bh, bl) = split(b);
    let e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
    (p, e)
}

fn split(a: f64) -> (f64, f64) {
    let c = 134_217_729.0 * a; // 2^27 + 1
    let high = c - (c - a);
    (high, a - high)
}

fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

fn quick_two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    Dd(s, b - (s - a))
}

/// A double-double: `high + low`, `|low| ≤ ulp(high)/2`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dd(pub f64, pub f64);

impl Dd {
    pub fn add(self, other: Dd) -> Dd {
        let (s, e) = two_sum(self.0, other.0);
        if !s.is_finite() {
            return Dd(s, 0.0);
        }
        quick_two_sum(s, e + self.1 + other.1)
    }

    pub fn neg(self) -> Dd {
        Dd(-self.0, -self.1)
    }

    pub fn mul(self, other: Dd) -> Dd {
        let (p, e) = two_product(self.0, other.0);
        if !p.is_finite() {
            return Dd(p, 0.0);
        }
        quick_two_sum(p, e + self.0 * other.1 + self.1 * other.0)
    }

    pub fn div(self, other: Dd) -> Dd {
        let q1 = self.0 / other.0;
        if !q1.is_finite() {
            return Dd(q1, 0.0);
        }
        let r = self.add(other.mul(Dd(q1, 0.0)).neg());
        let q2 = r.0 / other.0;
        let r = r.add(other.mul(Dd(q2, 0.0)).neg());
        let q3 = r.0 / other.0;
        quick_two_sum(q1, q2).add(Dd(q3, 0.0))
    }

    /// Rounded to f64.
    pub fn value(self) -> f64 {
        self.0 + self.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(terms: &[f64]) -> f64 {
        let mut s = ExactSum::default();
        terms.iter().for_each(|&t| s.add(t));
        s.value()
    }

    #[test]
    fn sums_are_exact_in_any_order() {
        // A plain left-to-right sum gives 0 here, and 2 the other way round.
        assert_eq!(sum(&[1e16, 1.0, -1e16, 1.0]), 2.0);
        assert_eq!(sum(&[1.0, 1.0, 1e16, -1e16]), 2.0);
        assert_eq!(sum(&[1e308, 1e308]), f64::INFINITY);
        assert_eq!(sum(&[0.1; 10]), 1.0);
        assert_eq!(sum(&[]), 0.0);
        assert!(sum(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
        // Ties round to even: 2^53 + 1 is halfway between 2^53 and 2^53 + 2.
        assert_eq!(sum(&[9007199254740992.0, 1.0, 1e-30]), 9007199254740994.0);
        assert_eq!(sum(&[9007199254740992.0, 1.0]), 9007199254740992.0);
    }

    #[test]
    fn merged_sums_equal_one_sum() {
        let terms: Vec<f64> =
            (0..1000).map(|i| ((i * 7919) % 1013) as f64 * 1e-3 * if i % 3 == 0 { -1e12 } else { 1.0 }).collect();
        let one = sum(&terms);
        for split in [1, 7, 333, 999] {
            let (mut a, mut b) = (ExactSum::default(), ExactSum::default());
            terms[..split].iter().for_each(|&t| a.add(t));
            terms[split..].iter().rev().for_each(|&t| b.add(t));
            b.merge(&a);
            assert_eq!(b.value(), one);
            let (parts, special) = b.parts();
            assert_eq!(ExactSum::from_parts(parts, special).value(), one);
        }
    }

    #[test]
    fn products_and_double_doubles_are_exact_enough() {
        let (p, e) = two_product(0.1, 0.3);
        assert_eq!(p, 0.1 * 0.3);
        assert_ne!(e, 0.0);
        // (1e8 + 1)² − (1e8)² = 2e8 + 1, lost in plain f64 squares of large labels.
        let a = Dd(1e8 + 1.0, 0.0);
        let b = Dd(1e8, 0.0);
        assert_eq!(a.mul(a).add(b.mul(b).neg()).value(), 2e8 + 1.0);
        assert_eq!(Dd(1.0, 0.0).div(Dd(3.0, 0.0)).mul(Dd(3.0, 0.0)).value(), 1.0);
    }
}
