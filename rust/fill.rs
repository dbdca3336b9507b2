//! The numeric core: writes one planned row's columns.
//!
//! A row spells out a sequence `S` (its segments, in order); position `j` (of
//! `len(S) - 1`) reads `S[j]` and predicts `S[j + 1]`. A position whose
//! target is a completion element carries that element's own logprob, its
//! turn's advantage and mask; every other position carries 0 in all three.
//! Elements below 0 stand for non-text chunks: their target is 0.

use std::mem::MaybeUninit;

use crate::plan::{Element, Segment};

/// The model input column a row may also carry: `S[:-1]` as numbers.
pub enum Inputs<'a> {
    None,
    I32(&'a mut [MaybeUninit<i32>]),
    I64(&'a mut [MaybeUninit<i64>]),
}

/// One row's output columns, each `len(S) - 1` long. They may be
/// uninitialized: [`fill_row`] writes every element of every column (the
/// fuzz tests check it, starting from sentinel values), so fresh arrays
/// need no zeroing first.
pub struct RowOut<'a> {
    pub inputs: Inputs<'a>,
    pub targets: &'a mut [MaybeUninit<i64>],
    pub logprobs: &'a mut [MaybeUninit<f32>],
    pub advantages: &'a mut [MaybeUninit<f32>],
    pub mask: Option<&'a mut [MaybeUninit<f32>]>,
}

/// A row whose segments do not spell out exactly its columns' positions: a
/// planning bug. Reported (in release builds too) instead of handing Python
/// arrays with elements never written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfilled {
    pub positions: usize,
    pub spelled: usize,
}

impl std::fmt::Display for Unfilled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a row of {} positions was planned with segments of {} elements",
            self.positions, self.spelled
        )
    }
}

/// Writes the row spelled by `segments` over `elements` (with `logprobs`
/// parallel to them: a completion element's fitted logprob). `weights(turn)`
/// gives a completion segment's `(advantage, mask)`.
///
/// `Ok` means every element of every column was written: the segments spell
/// `len + 1` elements for columns of `len` (the targets, logprobs,
/// advantages and mask of position `j` are written by the segment holding
/// `S[j + 1]`, the inputs by the one holding `S[j]`, and segments are
/// contiguous in `S`).
pub fn fill_row(
    segments: &[Segment],
    elements: &[Element],
    logprobs: &[f32],
    weights: impl Fn(usize) -> (f32, f32),
    out: RowOut<'_>,
) -> Result<(), Unfilled> {
    let RowOut {
        mut inputs,
        targets,
        logprobs: logprob_out,
        advantages,
        mut mask,
    } = out;
    let n = targets.len();
    let spelled: usize = segments.iter().map(|p| p.elements.len()).sum();
    let input_len = match &inputs {
        Inputs::None => n,
        Inputs::I32(c) => c.len(),
        Inputs::I64(c) => c.len(),
    };
    let same_lengths = [
        logprob_out.len(),
        advantages.len(),
        mask.as_ref().map_or(n, |m| m.len()),
        input_len,
    ]
    .iter()
    .all(|&len| len == n);
    if spelled != n + 1 || !same_lengths {
        return Err(Unfilled { positions: n, spelled });
    }
    let mut at = 0; // where the segment starts in S
    for segment in segments {
        let values = &elements[segment.elements.clone()];
        let k = values.len();
        // Model input: S[at..at + k], cut at n.
        let input_end = (at + k).min(n);
        if at < input_end {
            let src = &values[..input_end - at];
            match &mut inputs {
                Inputs::None => {}
                Inputs::I32(dst) => dst[at..input_end].iter_mut().zip(src).for_each(|(d, &s)| {
                    d.write(s.target() as i32);
                }),
                Inputs::I64(dst) => dst[at..input_end].iter_mut().zip(src).for_each(|(d, &s)| {
                    d.write(s.target());
                }),
            }
        }
        // Targets: position p predicts S[p + 1], so S[at + i] lands at at + i - 1.
        let skip = usize::from(at == 0);
        if skip < k {
            let span = at + skip - 1..at + k - 1;
            targets[span.clone()]
                .iter_mut()
                .zip(&values[skip..])
                .for_each(|(d, &s)| {
                    d.write(s.target()); // a chunk's position: 0
                });
            // Completion targets carry their logprob, advantage and mask;
            // the other positions 0 in all three.
            let (advantage, weight) = if segment.completion {
                write(
                    &mut logprob_out[span.clone()],
                    &logprobs[segment.elements.start + skip..segment.elements.end],
                );
                weights(segment.turn)
            } else {
                logprob_out[span.clone()].fill(MaybeUninit::new(0.0));
                (0.0, 0.0)
            };
            advantages[span.clone()].fill(MaybeUninit::new(advantage));
            if let Some(mask) = &mut mask {
                mask[span].fill(MaybeUninit::new(weight));
            }
        }
        at += k;
    }
    Ok(())
}

/// `dst = src` (equal lengths), for columns not yet initialized.
fn write<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T]) {
    debug_assert_eq!(dst.len(), src.len());
    dst.iter_mut().zip(src).for_each(|(d, &s)| {
        d.write(s);
    });
}

/// Output columns for tests: they start out holding a sentinel, so that a
/// position [`fill_row`] failed to write shows up in the comparisons.
#[cfg(test)]
pub(crate) mod testing {
    use std::mem::MaybeUninit;

    pub const INT_SENTINEL: i64 = -7;
    pub const FLOAT_SENTINEL: f32 = -7.25;

    pub fn column<T: Copy>(n: usize, sentinel: T) -> Vec<MaybeUninit<T>> {
        vec![MaybeUninit::new(sentinel); n]
    }

    pub fn values<T: Copy>(column: &[MaybeUninit<T>]) -> Vec<T> {
        // SAFETY: every element was initialized by `column` (and then
        // possibly overwritten with initialized values).
        column.iter().map(|x| unsafe { x.assume_init() }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{column, values, FLOAT_SENTINEL, INT_SENTINEL};
    use super::*;
    use crate::plan::{elements_of, plan_rows, Keep, Merge, Plan, Trajectory, TurnSpan};

    struct Columns {
        inputs: Vec<i64>,
        targets: Vec<i64>,
        logprobs: Vec<f32>,
        advantages: Vec<f32>,
        mask: Vec<f32>,
    }

    fn rows(t: &Trajectory, logprobs: &[f32], merge: Merge, advantage: f32) -> Vec<Columns> {
        let mut plan = Plan::default();
        plan_rows(t, merge, Keep::WithCompletionTarget, &mut plan);
        plan.rows
            .iter()
            .map(|row| {
                let n = row.len - 1;
                let (mut inputs, mut targets) = (column(n, INT_SENTINEL), column(n, INT_SENTINEL));
                let (mut lps, mut advs, mut mask) = (
                    column(n, FLOAT_SENTINEL),
                    column(n, FLOAT_SENTINEL),
                    column(n, FLOAT_SENTINEL),
                );
                let out = RowOut {
                    inputs: Inputs::I64(&mut inputs),
                    targets: &mut targets,
                    logprobs: &mut lps,
                    advantages: &mut advs,
                    mask: Some(&mut mask),
                };
                fill_row(plan.segments_of(row), &t.elements, logprobs, |_| (advantage, 1.0), out)
                    .expect("a planned row");
                Columns {
                    inputs: values(&inputs),
                    targets: values(&targets),
                    logprobs: values(&lps),
                    advantages: values(&advs),
                    mask: values(&mask),
                }
            })
            .collect()
    }

    fn one_turn(p: &[i64], c: &[i64]) -> Trajectory {
        let mut elements = elements_of(p);
        elements.extend(elements_of(c));
        Trajectory {
            elements,
            turns: vec![TurnSpan {
                prompt: 0..p.len(),
                completion: p.len()..p.len() + c.len(),
            }],
        }
    }

    #[test]
    fn worked_example() {
        // P = 11 12 13, C = 21 22 with logprobs -0.5 -0.25, advantage 0.75.
        let t = one_turn(&[11, 12, 13], &[21, 22]);
        let r = &rows(&t, &[0.0, 0.0, 0.0, -0.5, -0.25], Merge::PerTurn, 0.75)[0];
        assert_eq!(r.inputs, vec![11, 12, 13, 21]);
        assert_eq!(r.targets, vec![12, 13, 21, 22]);
        assert_eq!(r.logprobs, vec![0.0, 0.0, -0.5, -0.25]);
        assert_eq!(r.advantages, vec![0.0, 0.0, 0.75, 0.75]);
        assert_eq!(r.mask, vec![0.0, 0.0, 1.0, 1.0]);
    }

    #[test]
    fn empty_prompt_targets_keep_their_own_logprobs() {
        let t = one_turn(&[], &[5, 6, 7]);
        let r = &rows(&t, &[-1.0, -2.0, -3.0], Merge::PerTurn, 1.0)[0];
        assert_eq!(r.targets, vec![6, 7]);
        assert_eq!(r.logprobs, vec![-2.0, -3.0]);
    }

    #[test]
    fn segments_that_do_not_spell_the_row_are_refused() {
        let t = one_turn(&[1, 2], &[3]);
        let mut plan = Plan::default();
        plan_rows(&t, Merge::PerTurn, Keep::WithCompletionTarget, &mut plan);
        for n in [1, 3] {
            let (mut targets, mut lps, mut advs) = (
                column(n, INT_SENTINEL),
                column(n, FLOAT_SENTINEL),
                column(n, FLOAT_SENTINEL),
            );
            let out = RowOut {
                inputs: Inputs::None,
                targets: &mut targets,
                logprobs: &mut lps,
                advantages: &mut advs,
                mask: None,
            };
            let result = fill_row(
                plan.segments_of(&plan.rows[0]),
                &t.elements,
                &[0.0; 3],
                |_| (1.0, 1.0),
                out,
            );
            assert_eq!(
                result,
                Err(Unfilled {
                    positions: n,
                    spelled: 3
                })
            );
        }
    }

    #[test]
    fn non_text_elements_have_target_zero() {
        let t = one_turn(&[4, -1, i64::MIN], &[9]);
        let r = &rows(&t, &[0.0, 0.0, 0.0, -1.0], Merge::PerTurn, 1.0)[0];
        assert_eq!(r.targets, vec![0, 0, 9]);
    }
}
