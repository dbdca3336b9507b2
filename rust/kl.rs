//! tinker-cookbook's KL penalty arithmetic (`rl.metrics.incorporate_kl_penalty`,
//! `compute_post_kl`, `discounted_future_sum_vectorized` and on-policy
//! distillation's `incorporate_kl_penalty`), as torch does it on the CPU:
//! every per-token term one float32 operation at a time, in the cookbook's
//! order, a Python scalar rounded to float32 before it multiplies a float32
//! tensor. The batch mean is the cookbook's float32 one: torch's tensor
//! sums (`crate::torch_sum`) combined in Python's order.
//!
//! Plain Rust over slices; the PyO3 glue is `py/kl.rs`.

/// `(sampled - scored) * mask`: the cookbook's masked logprob difference.
#[inline]
pub fn masked_diff(sampled: f32, scored: f32, mask: f32) -> f32 {
    (sampled - scored) * mask
}

/// A batch's sums as the cookbook makes them: each Datum's float32 tensor
/// sum (`crate::torch_sum`), added in order by Python's `sum` (`0 + t0 +
/// t1 + ...`, float32 adds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DiffSums {
    pub diff: f32,
    pub mask: f32,
}

impl DiffSums {
    /// Adds one Datum's sums of its masked differences and of its mask.
    pub fn add(&mut self, diff: f32, mask: f32) {
        self.diff += diff;
        self.mask += mask;
    }

    /// `sum(diffs) / sum(masks)`, one float32 division (NaN when no mask
    /// is set: `0 / 0`).
    pub fn mean(&self) -> f32 {
        self.diff / self.mask
    }
}

/// The `rl.metrics` penalty of one position: `coef * mask * (avg - diff)`,
/// evaluated left to right as torch does.
#[inline]
pub fn base_penalty(coef: f32, mask: f32, avg: f32, diff: f32) -> f32 {
    (coef * mask) * (avg - diff)
}

/// The distillation penalty of one position: `-coef * mask * reverse_kl`
/// (`neg_coef` is the Python float `-coef`, rounded to float32).
#[inline]
pub fn teacher_penalty(neg_coef: f32, mask: f32, reverse_kl: f32) -> f32 {
    (neg_coef * mask) * reverse_kl
}

/// `discounted_future_sum_vectorized`: `out[t] = x[t] + gamma * out[t + 1]`
/// from the end, starting from a running value of 0, one float32 multiply
/// then one float32 add per step (never fused: a fused multiply-add would
/// round once and change the bits).
pub fn discounted_future_sum<T: Recurrence>(x: &[T], gamma: T, out: &mut [T]) {
    assert_eq!(x.len(), out.len());
    let mut running = T::ZERO;
    for (o, &v) in out.iter_mut().zip(x).rev() {
        running = v.plus(gamma.times(running));
        *o = running;
    }
}

/// The float types the recurrence runs in (torch keeps `x`'s dtype).
pub trait Recurrence: Copy {
    const ZERO: Self;
    #[must_use]
    fn times(self, other: Self) -> Self;
    #[must_use]
    fn plus(self, other: Self) -> Self;
}

impl Recurrence for f32 {
    const ZERO: f32 = 0.0;
    #[inline]
    fn times(self, other: f32) -> f32 {
        self * other
    }
    #[inline]
    fn plus(self, other: f32) -> f32 {
        self + other
    }
}

impl Recurrence for f64 {
    const ZERO: f64 = 0.0;
    #[inline]
    fn times(self, other: f64) -> f64 {
        self * other
    }
    #[inline]
    fn plus(self, other: f64) -> f64 {
        self + other
    }
}

/// Which penalty a Datum's advantages take.
#[derive(Clone, Copy, Debug)]
pub enum Penalty {
    /// `rl.metrics`: `coef * mask * (avg - diff)`, `avg` the batch mean.
    Base { coef: f32, avg: f32 },
    /// Distillation: `-coef * mask * reverse_kl` (`neg_coef` = `-coef`).
    Teacher { neg_coef: f32 },
}

/// One Datum's new advantages, in place: `advantages += penalty`, the
/// penalty discounted first when `gamma` is given (the cookbook discounts
/// only for `kl_discount_factor > 0`). `diffs` are the masked differences
/// ([`masked_diff`]). One pass (backwards when discounting): each term is
/// computed where the recurrence takes it, with the same roundings as the
/// cookbook's separate tensors.
pub fn add_penalty(advantages: &mut [f32], diffs: &[f32], mask: &[f32], penalty: Penalty, gamma: Option<f32>) {
    let n = advantages.len();
    assert!(diffs.len() == n && mask.len() == n);
    let term = |k: usize| match penalty {
        Penalty::Base { coef, avg } => base_penalty(coef, mask[k], avg, diffs[k]),
        Penalty::Teacher { neg_coef } => teacher_penalty(neg_coef, mask[k], diffs[k]),
    };
    match gamma {
        None => {
            for (k, a) in advantages.iter_mut().enumerate() {
                *a += term(k);
            }
        }
        Some(gamma) => {
            let mut running = 0.0f32;
            for k in (0..n).rev() {
                running = term(k) + gamma * running;
                advantages[k] += running;
            }
        }
    }
}

/// One Datum's penalty inputs for [`add_penalties`]: its advantages (to
/// add to), masked differences and mask.
pub struct PenaltyRow<'a> {
    pub advantages: &'a mut [f32],
    pub diffs: &'a [f32],
    pub mask: &'a [f32],
}

/// [`add_penalty`] of every row. Discounting, four rows' recurrences run
/// side by side (each a chain of dependent multiply-then-add steps, so one
/// alone leaves the CPU waiting on each step's latency); each row's own
/// operations and their order are unchanged, so are its bits.
pub fn add_penalties(rows: &mut [PenaltyRow<'_>], penalty: Penalty, gamma: Option<f32>) {
    let Some(gamma) = gamma else {
        for row in rows.iter_mut() {
            add_penalty(row.advantages, row.diffs, row.mask, penalty, None);
        }
        return;
    };
    let term = |diff: f32, mask: f32| match penalty {
        Penalty::Base { coef, avg } => base_penalty(coef, mask, avg, diff),
        Penalty::Teacher { neg_coef } => teacher_penalty(neg_coef, mask, diff),
    };
    let mut quads = rows.chunks_exact_mut(4);
    for quad in &mut quads {
        let shared = quad.iter().map(|r| r.advantages.len()).min().unwrap_or(0);
        // Each row's last `shared` positions, side by side (equal lengths,
        // so one index serves all four), then the rest of each alone.
        let [r0, r1, r2, r3] = quad else {
            unreachable!("chunks of 4")
        };
        let (a0, h0) = tails(r0, shared);
        let (a1, h1) = tails(r1, shared);
        let (a2, h2) = tails(r2, shared);
        let (a3, h3) = tails(r3, shared);
        let mut running = [0.0f32; 4];
        for k in (0..shared).rev() {
            running[0] = term(h0.0[k], h0.1[k]) + gamma * running[0];
            running[1] = term(h1.0[k], h1.1[k]) + gamma * running[1];
            running[2] = term(h2.0[k], h2.1[k]) + gamma * running[2];
            running[3] = term(h3.0[k], h3.1[k]) + gamma * running[3];
            a0[k] += running[0];
            a1[k] += running[1];
            a2[k] += running[2];
            a3[k] += running[3];
        }
        for (row, start) in [r0, r1, r2, r3].into_iter().zip(running) {
            let n = row.advantages.len() - shared;
            let mut run = start;
            for k in (0..n).rev() {
                run = term(row.diffs[k], row.mask[k]) + gamma * run;
                row.advantages[k] += run;
            }
        }
    }
    for row in quads.into_remainder() {
        add_penalty(row.advantages, row.diffs, row.mask, penalty, Some(gamma));
    }
}

/// A row's last `shared` advantages, masked differences and mask
/// (all of length `shared`).
fn tails<'r>(row: &'r mut PenaltyRow<'_>, shared: usize) -> (&'r mut [f32], (&'r [f32], &'r [f32])) {
    let n = row.advantages.len();
    assert!(row.diffs.len() == n && row.mask.len() == n && shared <= n);
    let start = n - shared;
    (&mut row.advantages[start..], (&row.diffs[start..], &row.mask[start..]))
}

/// `compute_post_kl`'s difference at a position: `prev - new`, float32.
#[inline]
pub fn post_diff(prev: f32, new: f32) -> f32 {
    prev - new
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The recurrence written out with explicit roundings through float64,
    /// independent of the generic code above.
    fn reference_sum(x: &[f32], gamma: f32) -> Vec<f32> {
        let mut out = vec![0.0f32; x.len()];
        let mut running = 0.0f32;
        for t in (0..x.len()).rev() {
            let product = (f64::from(gamma) * f64::from(running)) as f32;
            running = (f64::from(x[t]) + f64::from(product)) as f32;
            out[t] = running;
        }
        out
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn discounted_sum_small() {
        let x = [1.0f32, 2.0, 4.0];
        let mut out = [0.0f32; 3];
        discounted_future_sum(&x, 0.5, &mut out);
        assert_eq!(out, [1.0 + 0.5 * (2.0 + 0.5 * 4.0), 2.0 + 0.5 * 4.0, 4.0]);
        let mut empty: [f32; 0] = [];
        discounted_future_sum(&[], 0.5f32, &mut empty);
        // -0.0 + gamma * 0.0 is +0.0, as in torch.
        let mut out = [1.0f32];
        discounted_future_sum(&[-0.0f32], 0.9, &mut out);
        assert_eq!(out[0].to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn penalties_in_order() {
        let (adv, s, b, m) = ([1.0f32, 2.0], [-0.5f32, -1.0], [-0.25f32, -3.0], [1.0f32, 0.0]);
        let mut out = [0.0f32; 2];
        let diffs: Vec<f32> = (0..2).map(|k| masked_diff(s[k], b[k], m[k])).collect();
        out.copy_from_slice(&adv);
        add_penalty(&mut out, &diffs, &m, Penalty::Base { coef: 2.0, avg: 0.5 }, None);
        assert_eq!(out, [1.0 + 2.0 * (0.5 - (-0.25)), 2.0]);
        out.copy_from_slice(&adv);
        add_penalty(&mut out, &diffs, &m, Penalty::Teacher { neg_coef: -1.0 }, Some(0.5));
        assert_eq!(out, [1.0 + 0.25, 2.0]);
        let mut sums = DiffSums::default();
        sums.add(-0.25, 1.0);
        sums.add(1.0, 3.0);
        assert_eq!(sums.mean(), 0.75 / 4.0);
        assert!(DiffSums::default().mean().is_nan());
    }

    proptest! {
        #[test]
        fn discounted_sum_is_the_rounded_recurrence(
            x in proptest::collection::vec(-1e6f32..1e6, 0..300),
            gamma in 0.0f32..1.5,
        ) {
            let mut out = vec![0.0f32; x.len()];
            discounted_future_sum(&x, gamma, &mut out);
            prop_assert_eq!(bits(&out), bits(&reference_sum(&x, gamma)));
        }

        #[test]
        fn rows_side_by_side_are_each_rows_own(
            rows in proptest::collection::vec(proptest::collection::vec((-5f32..5.0, -3f32..3.0, 0u8..3), 0..40), 0..11),
            gamma in proptest::option::of(0.01f32..1.2),
            teacher in proptest::bool::ANY,
        ) {
            let penalty = if teacher { Penalty::Teacher { neg_coef: -0.7 } } else { Penalty::Base { coef: 0.3, avg: -0.2 } };
            let parts: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = rows.iter().map(|r| (
                r.iter().map(|x| x.0).collect(), r.iter().map(|x| x.1).collect(), r.iter().map(|x| f32::from(x.2) * 0.5).collect(),
            )).collect();
            let mut one_by_one: Vec<Vec<f32>> = parts.iter().map(|p| p.0.clone()).collect();
            for (out, p) in one_by_one.iter_mut().zip(&parts) {
                add_penalty(out, &p.1, &p.2, penalty, gamma);
            }
            let mut together: Vec<Vec<f32>> = parts.iter().map(|p| p.0.clone()).collect();
            let mut table: Vec<PenaltyRow<'_>> = together.iter_mut().zip(&parts)
                .map(|(a, p)| PenaltyRow { advantages: a, diffs: &p.1, mask: &p.2 }).collect();
            add_penalties(&mut table, penalty, gamma);
            drop(table);
            for (a, b) in together.iter().zip(&one_by_one) {
                prop_assert_eq!(bits(a), bits(b));
            }
        }

        #[test]
        fn advantages_are_the_terms_then_the_sum(
            rows in proptest::collection::vec((-5f32..5.0, -20f32..0.0, -20f32..0.0, 0u8..3), 0..100),
            coef in -2f32..2.0,
            avg in -3f32..3.0,
            gamma in proptest::option::of(0.01f32..1.0),
        ) {
            let adv: Vec<f32> = rows.iter().map(|r| r.0).collect();
            let s: Vec<f32> = rows.iter().map(|r| r.1).collect();
            let b: Vec<f32> = rows.iter().map(|r| r.2).collect();
            let m: Vec<f32> = rows.iter().map(|r| f32::from(r.3) * 0.5).collect();
            let mut terms: Vec<f32> = (0..rows.len())
                .map(|k| (coef * m[k]) * (avg - (s[k] - b[k]) * m[k]))
                .collect();
            if let Some(g) = gamma {
                terms = reference_sum(&terms, g);
            }
            let expected: Vec<f32> = adv.iter().zip(&terms).map(|(a, t)| a + t).collect();
            let diffs: Vec<f32> = (0..rows.len()).map(|k| masked_diff(s[k], b[k], m[k])).collect();
            let mut out = adv.clone();
            add_penalty(&mut out, &diffs, &m, Penalty::Base { coef, avg }, gamma);
            prop_assert_eq!(bits(&out), bits(&expected));
        }
    }
}
