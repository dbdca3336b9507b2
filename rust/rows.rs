//! The numeric core: from the validated tokens and fitted logprobs of the
//! kept turns, fill the per-position rows of the importance-sampling loss.
//!
//! A turn with prompt `P` and completion `C` becomes `full = P + C`; position
//! `j` (of `len(full) - 1`) predicts `full[j + 1]`. Positions whose target is
//! a completion token carry that token's own logprob and the trajectory's
//! advantage; the others carry 0 in both.

/// One kept turn. Its tokens (`prompt_len + completion_len` of them, prompt
/// first) and its fitted logprobs (`completion_len`) follow the previous
/// turn's in the flat buffers given to [`fill_rows`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TurnSpan {
    pub prompt_len: usize,
    pub completion_len: usize,
    pub advantage: f32,
}

impl TurnSpan {
    /// A turn yields a row when it has a completion and at least one position.
    pub fn is_kept(prompt_len: usize, completion_len: usize) -> bool {
        completion_len > 0 && prompt_len + completion_len >= 2
    }

    pub fn positions(&self) -> usize {
        self.prompt_len + self.completion_len - 1
    }
}

/// Flat rows: row `i` is `[offsets[i], offsets[i + 1])` of each array.
#[derive(Debug, Default, PartialEq)]
pub struct Rows {
    /// `full[:-1]` per row; only filled when asked for.
    pub input_tokens: Vec<i64>,
    pub targets: Vec<i64>,
    pub logprobs: Vec<f32>,
    pub advantages: Vec<f32>,
    pub offsets: Vec<i64>,
}

/// Mutable views of one contiguous run of rows.
struct RowsMut<'a> {
    input_tokens: &'a mut [i64],
    targets: &'a mut [i64],
    logprobs: &'a mut [f32],
    advantages: &'a mut [f32],
}

impl<'a> RowsMut<'a> {
    fn split_at(self, at: usize) -> (RowsMut<'a>, RowsMut<'a>) {
        let in_at = if self.input_tokens.is_empty() { 0 } else { at };
        let (i0, i1) = self.input_tokens.split_at_mut(in_at);
        let (t0, t1) = self.targets.split_at_mut(at);
        let (l0, l1) = self.logprobs.split_at_mut(at);
        let (a0, a1) = self.advantages.split_at_mut(at);
        (
            RowsMut { input_tokens: i0, targets: t0, logprobs: l0, advantages: a0 },
            RowsMut { input_tokens: i1, targets: t1, logprobs: l1, advantages: a1 },
        )
    }
}

/// Batches smaller than this are filled on one thread: spawning costs more
/// than it saves (measured in bench/).
pub const PARALLEL_MIN_POSITIONS: usize = 1 << 18;

pub fn fill_rows(spans: &[TurnSpan], tokens: &[i32], logprobs: &[f32], with_inputs: bool) -> Rows {
    let mut offsets = Vec::with_capacity(spans.len() + 1);
    offsets.push(0i64);
    let mut total = 0usize;
    for s in spans {
        total += s.positions();
        offsets.push(total as i64);
    }
    let mut rows = Rows {
        input_tokens: if with_inputs { vec![0; total] } else { Vec::new() },
        targets: vec![0; total],
        logprobs: vec![0.0; total],
        advantages: vec![0.0; total],
        offsets,
    };
    let out = RowsMut {
        input_tokens: &mut rows.input_tokens,
        targets: &mut rows.targets,
        logprobs: &mut rows.logprobs,
        advantages: &mut rows.advantages,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
    if threads < 2 || total < PARALLEL_MIN_POSITIONS {
        fill_run(spans, tokens, logprobs, out);
        return rows;
    }
    // Two halves by position count; each half starts at a turn boundary.
    let split = rows.offsets.partition_point(|&o| (o as usize) < total / 2).min(spans.len());
    let (token_at, logprob_at) = spans[..split]
        .iter()
        .fold((0, 0), |(t, l), s| (t + s.prompt_len + s.completion_len, l + s.completion_len));
    let (first, second) = out.split_at(rows.offsets[split] as usize);
    std::thread::scope(|scope| {
        scope.spawn(|| fill_run(&spans[split..], &tokens[token_at..], &logprobs[logprob_at..], second));
        fill_run(&spans[..split], &tokens[..token_at], &logprobs[..logprob_at], first);
    });
    rows
}

fn fill_run(spans: &[TurnSpan], tokens: &[i32], logprobs: &[f32], out: RowsMut<'_>) {
    let (mut tok, mut lp, mut pos) = (0usize, 0usize, 0usize);
    let with_inputs = !out.input_tokens.is_empty();
    for s in spans {
        let full = &tokens[tok..tok + s.prompt_len + s.completion_len];
        let fitted = &logprobs[lp..lp + s.completion_len];
        let n = s.positions();
        let row = pos..pos + n;
        for (t, &x) in out.targets[row.clone()].iter_mut().zip(&full[1..]) {
            *t = x as i64;
        }
        if with_inputs {
            for (t, &x) in out.input_tokens[row.clone()].iter_mut().zip(&full[..n]) {
                *t = x as i64;
            }
        }
        // First position whose target is a completion token, and which of the
        // completion's logprobs it takes (1 with an empty prompt: the first
        // completion token is then no target at all).
        let first = s.prompt_len.saturating_sub(1);
        let skipped = usize::from(s.prompt_len == 0);
        let completion = pos + first..pos + n;
        out.logprobs[completion.clone()].copy_from_slice(&fitted[skipped..]);
        out.advantages[completion].fill(s.advantage);
        tok += full.len();
        lp += fitted.len();
        pos += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(p: usize, c: usize, a: f32) -> TurnSpan {
        TurnSpan { prompt_len: p, completion_len: c, advantage: a }
    }

    #[test]
    fn worked_example_from_the_spec() {
        let rows = fill_rows(&[span(3, 2, 0.75)], &[11, 12, 13, 21, 22], &[-0.5, -0.25], true);
        assert_eq!(rows.input_tokens, vec![11, 12, 13, 21]);
        assert_eq!(rows.targets, vec![12, 13, 21, 22]);
        assert_eq!(rows.logprobs, vec![0.0, 0.0, -0.5, -0.25]);
        assert_eq!(rows.advantages, vec![0.0, 0.0, 0.75, 0.75]);
        assert_eq!(rows.offsets, vec![0, 4]);
    }

    #[test]
    fn empty_prompt_targets_keep_their_own_logprobs() {
        let rows = fill_rows(&[span(0, 3, 1.0)], &[5, 6, 7], &[-1.0, -2.0, -3.0], false);
        assert_eq!(rows.targets, vec![6, 7]);
        assert_eq!(rows.logprobs, vec![-2.0, -3.0]);
        assert_eq!(rows.advantages, vec![1.0, 1.0]);
        assert!(rows.input_tokens.is_empty());
    }

    #[test]
    fn kept_turns() {
        assert!(!TurnSpan::is_kept(5, 0));
        assert!(!TurnSpan::is_kept(0, 1));
        assert!(TurnSpan::is_kept(1, 1));
        assert!(TurnSpan::is_kept(0, 2));
    }

    /// Plain per-position definition, to check the slice arithmetic against.
    fn naive(spans: &[TurnSpan], tokens: &[i32], logprobs: &[f32]) -> Rows {
        let mut rows = Rows { offsets: vec![0], ..Rows::default() };
        let (mut tok, mut lp) = (0, 0);
        for s in spans {
            let full: Vec<i64> = tokens[tok..tok + s.prompt_len + s.completion_len].iter().map(|&x| x as i64).collect();
            for j in 0..full.len() - 1 {
                rows.input_tokens.push(full[j]);
                rows.targets.push(full[j + 1]);
                if j + 1 >= s.prompt_len {
                    rows.logprobs.push(logprobs[lp + j + 1 - s.prompt_len]);
                    rows.advantages.push(s.advantage);
                } else {
                    rows.logprobs.push(0.0);
                    rows.advantages.push(0.0);
                }
            }
            rows.offsets.push(rows.targets.len() as i64);
            tok += full.len();
            lp += s.completion_len;
        }
        rows
    }

    #[test]
    fn parallel_fill_matches_the_per_position_definition() {
        // Deterministic pseudo-random turn shapes, enough positions to split.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % m as u64) as usize
        };
        let mut spans = Vec::new();
        let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
        let mut total = 0;
        while total < 2 * PARALLEL_MIN_POSITIONS {
            let (p, c) = (next(300), 1 + next(300));
            if !TurnSpan::is_kept(p, c) {
                continue;
            }
            spans.push(span(p, c, next(100) as f32 / 7.0));
            tokens.extend((0..p + c).map(|_| next(1 << 31) as i32));
            logprobs.extend((0..c).map(|_| -(next(1000) as f32) / 10.0));
            total += p + c - 1;
        }
        let rows = fill_rows(&spans, &tokens, &logprobs, true);
        assert_eq!(rows, naive(&spans, &tokens, &logprobs));
        let few = &spans[..3];
        let n_tok: usize = few.iter().map(|s| s.prompt_len + s.completion_len).sum();
        let n_lp: usize = few.iter().map(|s| s.completion_len).sum();
        let mut expected = naive(few, &tokens[..n_tok], &logprobs[..n_lp]);
        expected.input_tokens.clear();
        assert_eq!(fill_rows(few, &tokens[..n_tok], &logprobs[..n_lp], false), expected);
    }
}
