//! Fuzzing the numeric core with proptest: arbitrary turn shapes (empty
//! prompts and completions included), tokens at the int32 boundaries, and
//! any float bits (NaN, infinities) for logprobs and advantages. The core
//! must not panic and must agree with the per-position definition.

use proptest::prelude::*;

use crate::rows::{fill_rows, Rows, TurnShape};

/// The per-position definition of SPEC, written out plainly.
fn naive(shapes: &[TurnShape], tokens: &[i64], logprobs: &[f32], advantages: &[f32]) -> Rows {
    let mut rows = Rows {
        offsets: vec![0],
        ..Rows::default()
    };
    let (mut tok, mut lp) = (0, 0);
    for (s, &a) in shapes.iter().zip(advantages) {
        let full = &tokens[tok..tok + s.prompt_len + s.completion_len];
        let fitted = &logprobs[lp..lp + s.completion_len];
        tok += full.len();
        lp += fitted.len();
        if s.completion_len == 0 || full.len() < 2 {
            continue;
        }
        for j in 0..full.len() - 1 {
            rows.input_tokens.push(full[j]);
            rows.targets.push(full[j + 1]);
            let completion = j + 1 >= s.prompt_len;
            rows.logprobs
                .push(if completion { fitted[j + 1 - s.prompt_len] } else { 0.0 });
            rows.advantages.push(if completion { a } else { 0.0 });
        }
        rows.offsets.push(rows.targets.len() as i64);
    }
    rows
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

fn token() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(1),
        Just(i32::MAX as i64 - 1),
        Just(i32::MAX as i64),
        0..=i32::MAX as i64
    ]
}

fn float() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<f32>(),
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(-0.0f32),
        -30.0f32..0.0
    ]
}

fn batch() -> impl Strategy<Value = (Vec<TurnShape>, Vec<i64>, Vec<f32>, Vec<f32>)> {
    let shape = (
        prop_oneof![Just(0usize), Just(1), 0..300usize],
        prop_oneof![Just(0usize), Just(1), 0..300usize],
    );
    prop::collection::vec(shape, 0..12).prop_flat_map(|dims| {
        let shapes: Vec<TurnShape> = dims
            .iter()
            .map(|&(p, c)| TurnShape {
                prompt_len: p,
                completion_len: c,
            })
            .collect();
        let n_tokens: usize = dims.iter().map(|&(p, c)| p + c).sum();
        let n_logprobs: usize = dims.iter().map(|&(_, c)| c).sum();
        (
            Just(shapes),
            prop::collection::vec(token(), n_tokens),
            prop::collection::vec(float(), n_logprobs),
            prop::collection::vec(float(), dims.len()),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn core_matches_the_per_position_definition((shapes, tokens, logprobs, advantages) in batch()) {
        let ours = fill_rows(&shapes, &tokens, &logprobs, &advantages);
        let expected = naive(&shapes, &tokens, &logprobs, &advantages);
        prop_assert_eq!(&ours.offsets, &expected.offsets);
        prop_assert_eq!(&ours.targets, &expected.targets);
        prop_assert_eq!(&ours.input_tokens, &expected.input_tokens);
        prop_assert_eq!(bits(&ours.logprobs), bits(&expected.logprobs));
        prop_assert_eq!(bits(&ours.advantages), bits(&expected.advantages));
    }
}
