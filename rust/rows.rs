//! The numeric core: where each token and logprob of a turn lands in the
//! per-position rows of the importance-sampling loss.
//!
//! A turn with prompt `P` and completion `C` becomes `full = P + C`; position
//! `j` (of `len(full) - 1`) predicts `full[j + 1]`. Positions whose target is
//! a completion token carry that token's own logprob and the trajectory's
//! advantage; the others carry 0 in both. Rows lie back to back in flat
//! arrays; row `i` is `[offsets[i], offsets[i + 1])`.

/// The shape of one turn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TurnShape {
    pub prompt_len: usize,
    pub completion_len: usize,
}

impl TurnShape {
    /// A turn yields a row when it has a completion and at least one position.
    pub fn is_kept(&self) -> bool {
        self.completion_len > 0 && self.prompt_len + self.completion_len >= 2
    }

    pub fn positions(&self) -> usize {
        self.prompt_len + self.completion_len - 1
    }

    /// The first position whose target is a completion token.
    fn first_completion_position(&self) -> usize {
        self.prompt_len.saturating_sub(1)
    }

    /// How many leading completion tokens are no target: 1 with an empty
    /// prompt (nothing predicts the first token), else 0.
    fn untargeted(&self) -> usize {
        usize::from(self.prompt_len == 0)
    }
}

/// `offsets` of rows of these shapes (all kept), `shapes.len() + 1` long.
pub fn row_offsets(shapes: &[TurnShape]) -> Vec<i64> {
    let mut offsets = Vec::with_capacity(shapes.len() + 1);
    let mut total = 0i64;
    offsets.push(0);
    for s in shapes {
        total += s.positions() as i64;
        offsets.push(total);
    }
    offsets
}

/// One row being written. Targets and (optionally) input tokens are set
/// token by token of `full`, logprobs logprob by logprob of the completion.
pub struct RowMut<'a> {
    shape: TurnShape,
    input_tokens: &'a mut [i64],
    targets: &'a mut [i64],
    logprobs: &'a mut [f32],
}

impl<'a> RowMut<'a> {
    /// `input_tokens` may be empty: the model input is then not kept.
    pub fn new(shape: TurnShape, input_tokens: &'a mut [i64], targets: &'a mut [i64], logprobs: &'a mut [f32]) -> Self {
        let n = shape.positions();
        debug_assert!(targets.len() == n && logprobs.len() == n);
        debug_assert!(input_tokens.is_empty() || input_tokens.len() == n);
        RowMut {
            shape,
            input_tokens,
            targets,
            logprobs,
        }
    }

    /// Token `i` of `full`.
    #[inline(always)]
    pub fn set_token(&mut self, i: usize, token: i64) {
        if i >= 1 {
            self.targets[i - 1] = token;
        }
        if let Some(slot) = self.input_tokens.get_mut(i) {
            *slot = token;
        }
    }

    /// The logprob of completion token `k` (of the fitted logprobs).
    #[inline(always)]
    pub fn set_logprob(&mut self, k: usize, logprob: f32) {
        if let Some(at) = k.checked_sub(self.shape.untargeted()) {
            self.logprobs[self.shape.first_completion_position() + at] = logprob;
        }
    }
}

/// The advantages column: `advantage` of each row on its completion
/// positions; the rest must already be 0.
pub fn fill_advantages(shapes: &[TurnShape], row_advantages: &[f32], offsets: &[i64], out: &mut [f32]) {
    for ((s, &a), &start) in shapes.iter().zip(row_advantages).zip(offsets) {
        let start = start as usize;
        out[start + s.first_completion_position()..start + s.positions()].fill(a);
    }
}

/// Flat rows, owned: the whole core as one plain function, for the tests and
/// the fuzzer (the Python glue writes into numpy's buffers through [`RowMut`]).
#[cfg(test)]
#[derive(Debug, Default, PartialEq)]
pub struct Rows {
    pub input_tokens: Vec<i64>,
    pub targets: Vec<i64>,
    pub logprobs: Vec<f32>,
    pub advantages: Vec<f32>,
    pub offsets: Vec<i64>,
}

/// Rows of the kept turns among `shapes`, whose `full` tokens lie back to
/// back in `tokens` and fitted logprobs (one per completion token) in
/// `logprobs`, with one advantage per turn.
#[cfg(test)]
pub fn fill_rows(shapes: &[TurnShape], tokens: &[i64], logprobs: &[f32], advantages: &[f32]) -> Rows {
    let (mut tok, mut lp) = (0, 0);
    let mut kept = Vec::new();
    let mut kept_advantages = Vec::new();
    let mut spans = Vec::new();
    for (s, &a) in shapes.iter().zip(advantages) {
        let full = tok..tok + s.prompt_len + s.completion_len;
        let fitted = lp..lp + s.completion_len;
        tok = full.end;
        lp = fitted.end;
        if s.is_kept() {
            kept.push(*s);
            kept_advantages.push(a);
            spans.push((full, fitted));
        }
    }
    let offsets = row_offsets(&kept);
    let total = *offsets.last().unwrap() as usize;
    let mut rows = Rows {
        input_tokens: vec![0; total],
        targets: vec![0; total],
        logprobs: vec![0.0; total],
        advantages: vec![0.0; total],
        offsets,
    };
    for ((s, (full, fitted)), w) in kept.iter().zip(spans).zip(rows.offsets.windows(2)) {
        let row = w[0] as usize..w[1] as usize;
        let mut writer = RowMut::new(
            *s,
            &mut rows.input_tokens[row.clone()],
            &mut rows.targets[row.clone()],
            &mut rows.logprobs[row],
        );
        for (i, &t) in tokens[full].iter().enumerate() {
            writer.set_token(i, t);
        }
        for (k, &l) in logprobs[fitted].iter().enumerate() {
            writer.set_logprob(k, l);
        }
    }
    fill_advantages(&kept, &kept_advantages, &rows.offsets, &mut rows.advantages);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(p: usize, c: usize) -> TurnShape {
        TurnShape {
            prompt_len: p,
            completion_len: c,
        }
    }

    #[test]
    fn worked_example_from_the_spec() {
        let rows = fill_rows(&[shape(3, 2)], &[11, 12, 13, 21, 22], &[-0.5, -0.25], &[0.75]);
        assert_eq!(rows.input_tokens, vec![11, 12, 13, 21]);
        assert_eq!(rows.targets, vec![12, 13, 21, 22]);
        assert_eq!(rows.logprobs, vec![0.0, 0.0, -0.5, -0.25]);
        assert_eq!(rows.advantages, vec![0.0, 0.0, 0.75, 0.75]);
        assert_eq!(rows.offsets, vec![0, 4]);
    }

    #[test]
    fn empty_prompt_targets_keep_their_own_logprobs() {
        let rows = fill_rows(&[shape(0, 3)], &[5, 6, 7], &[-1.0, -2.0, -3.0], &[1.0]);
        assert_eq!(rows.targets, vec![6, 7]);
        assert_eq!(rows.logprobs, vec![-2.0, -3.0]);
        assert_eq!(rows.advantages, vec![1.0, 1.0]);
    }

    #[test]
    fn skipped_turns_leave_no_row() {
        assert!(!shape(5, 0).is_kept());
        assert!(!shape(0, 1).is_kept());
        assert!(shape(1, 1).is_kept());
        assert!(shape(0, 2).is_kept());
        let rows = fill_rows(
            &[shape(2, 0), shape(0, 1), shape(1, 1)],
            &[1, 2, 3, 4, 5],
            &[-1.0, -2.0],
            &[9.0, 8.0, 7.0],
        );
        assert_eq!(rows.targets, vec![5]);
        assert_eq!(rows.logprobs, vec![-2.0]);
        assert_eq!(rows.advantages, vec![7.0]);
        assert_eq!(rows.offsets, vec![0, 1]);
    }
}
