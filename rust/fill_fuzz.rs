//! Fuzzing the planner and the numeric core with proptest: arbitrary
//! trajectories (empty prompts and completions, prompts that extend the
//! sequence so far, almost extend, or reset), tokens at the int32
//! boundaries, and any float bits. Both must agree with the per-position
//! definition written out plainly here.

use proptest::prelude::*;

use crate::fill::testing::{column, values, FLOAT_SENTINEL, INT_SENTINEL};
use crate::fill::{fill_row, Inputs, RowOut};
use crate::plan::{plan_rows, Element, Keep, Merge, Plan, Trajectory, TurnSpan};

/// (model input, targets, logprob bits, advantage bits, mask bits, first turn, n_turns)
type NaiveRow = (Vec<i64>, Vec<i64>, Vec<u32>, Vec<u32>, Vec<u32>, usize, usize);

/// The contract, one position at a time: per turn `P + C`, or merged while
/// the prompt starts with `S`; drop rows with no completion target.
fn naive(turns: &[(Vec<i64>, Vec<i64>, Vec<f32>)], merged: bool, a: f32) -> Vec<NaiveRow> {
    let mut out = Vec::new();
    // S as (element, completion logprob if a completion element)
    let mut s: Vec<(i64, Option<f32>)> = Vec::new();
    let mut first = 0;
    let mut count = 0;
    let close = |s: &Vec<(i64, Option<f32>)>, first, count, out: &mut Vec<NaiveRow>| {
        if !s.iter().skip(1).any(|(_, lp)| lp.is_some()) {
            return;
        }
        let inputs = s[..s.len() - 1].iter().map(|e| e.0).collect();
        let targets = s[1..].iter().map(|e| e.0).collect();
        let lps = s[1..].iter().map(|e| e.1.unwrap_or(0.0).to_bits()).collect();
        let advs = s[1..]
            .iter()
            .map(|e| if e.1.is_some() { a } else { 0.0 }.to_bits())
            .collect();
        let mask = s[1..]
            .iter()
            .map(|e| if e.1.is_some() { 1.0f32 } else { 0.0 }.to_bits())
            .collect();
        out.push((inputs, targets, lps, advs, mask, first, count));
    };
    for (u, (p, c, lp)) in turns.iter().enumerate() {
        let extends = merged && !s.is_empty() && p.len() >= s.len() && s.iter().zip(p).all(|(e, t)| e.0 == *t);
        if extends {
            s.extend(p[s.len()..].iter().map(|&t| (t, None)));
        } else {
            close(&s, first, count, &mut out);
            s = p.iter().map(|&t| (t, None)).collect();
            first = u;
            count = 0;
        }
        s.extend(c.iter().zip(lp).map(|(&t, &l)| (t, Some(l))));
        count += 1;
    }
    close(&s, first, count, &mut out);
    out
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

fn ours(turns: &[(Vec<i64>, Vec<i64>, Vec<f32>)], merged: bool, a: f32) -> Vec<NaiveRow> {
    let mut t = Trajectory::default();
    let mut logprobs = Vec::new();
    for (p, c, lp) in turns {
        let start = t.elements.len();
        t.elements.extend(p.iter().map(|&v| Element::token(v)));
        logprobs.extend(p.iter().map(|_| 0.0f32));
        let mid = t.elements.len();
        t.elements.extend(c.iter().map(|&v| Element::token(v)));
        logprobs.extend(lp);
        t.turns.push(TurnSpan {
            prompt: start..mid,
            completion: mid..t.elements.len(),
        });
    }
    let merge = if merged {
        Merge::WhilePromptExtends
    } else {
        Merge::PerTurn
    };
    let mut plan = Plan::default();
    plan_rows(&t, merge, Keep::WithCompletionTarget, &mut plan);
    plan.rows
        .iter()
        .map(|row| {
            let n = row.len - 1;
            // Sentinels, not zeros: a position fill_row does not write shows.
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
            fill_row(plan.segments_of(row), &t.elements, &logprobs, |_| (a, 1.0), out).expect("a planned row");
            let (lps, advs, mask) = (values(&lps), values(&advs), values(&mask));
            let (inputs, targets) = (values(&inputs), values(&targets));
            (
                inputs,
                targets,
                bits(&lps),
                bits(&advs),
                bits(&mask),
                row.first_turn,
                row.n_turns,
            )
        })
        .collect()
}

fn token() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(1),
        Just(i64::from(i32::MAX)),
        0..4i64,
        0..=i64::from(i32::MAX)
    ]
}

fn float() -> impl Strategy<Value = f32> {
    prop_oneof![any::<f32>(), Just(f32::NAN), Just(-0.0f32), -30.0f32..0.0]
}

/// Turns whose prompts extend the sequence so far, almost do, or reset.
fn trajectory() -> impl Strategy<Value = Vec<(Vec<i64>, Vec<i64>, Vec<f32>)>> {
    let turn = (
        0..4u8,
        prop::collection::vec(token(), 0..6),
        prop::collection::vec((token(), float()), 0..6),
        any::<prop::sample::Index>(),
    );
    prop::collection::vec(turn, 0..6).prop_map(|raw| {
        let mut turns: Vec<(Vec<i64>, Vec<i64>, Vec<f32>)> = Vec::new();
        let mut s: Vec<i64> = Vec::new();
        for (how, extra, completion, index) in raw {
            let mut p = if how == 0 {
                extra.clone()
            } else {
                let mut p = s.clone();
                p.extend(&extra);
                p
            };
            if how == 2 && !p.is_empty() {
                let i = index.index(p.len());
                p[i] = p[i].wrapping_add(1) & 0x7fff_ffff;
            }
            if how == 3 && !p.is_empty() {
                p.remove(index.index(p.len()));
            }
            let (c, lp): (Vec<i64>, Vec<f32>) = completion.into_iter().unzip();
            s = p.clone();
            s.extend(&c);
            turns.push((p, c, lp));
        }
        turns
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn rows_match_the_per_position_definition(turns in trajectory(), merged in any::<bool>(), a in float()) {
        prop_assert_eq!(ours(&turns, merged, a), naive(&turns, merged, a));
    }
}
