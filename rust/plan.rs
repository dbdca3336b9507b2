//! Where rows begin and end. Plain Rust over one trajectory as read: one
//! row per turn, or (merged) one row while each turn's prompt extends the
//! sequence so far.
//!
//! Rows are made of *segments*: runs of the trajectory's elements (tokens, or
//! opaque non-text chunks, each one element) that are either context
//! (prompt / observation) or a turn's completion.

use std::ops::Range;

/// One position of a trajectory: a token, or a position of a non-text chunk
/// (an image, say), which the rows carry as it was given.
///
/// Chunks are numbered per trajectory by equality (equal chunks share an
/// id), so that comparing two elements compares tokens by value and chunks
/// by equality, as tinker-cookbook compares model inputs. Stored in one
/// integer, so that the prefix checks over long sequences compare integers;
/// [`Element::kind`] is the one reading of it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Element(i64);

/// What an [`Element`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementKind {
    /// A token, in `0..2**31`.
    Token(i64),
    /// The first position of chunk `id`.
    ChunkStart(usize),
    /// A later position of the chunk before it.
    ChunkRest,
    /// A chunk of length 0: it takes no position, and rows are planned with
    /// it and filled without it.
    ZeroWidth(usize),
}

/// Ids below this (about 2**61) are what the encoding holds.
const ZERO_WIDTH: i64 = i64::MIN / 2;
const CHUNK_REST: i64 = i64::MIN;

impl Element {
    pub fn token(token: i64) -> Self {
        debug_assert!(token >= 0);
        Element(token)
    }

    pub fn chunk_start(id: usize) -> Self {
        Element(-(id as i64) - 1)
    }

    pub fn chunk_rest() -> Self {
        Element(CHUNK_REST)
    }

    pub fn zero_width(id: usize) -> Self {
        Element(ZERO_WIDTH - id as i64)
    }

    pub fn kind(self) -> ElementKind {
        match self.0 {
            t if t >= 0 => ElementKind::Token(t),
            CHUNK_REST => ElementKind::ChunkRest,
            z if z <= ZERO_WIDTH => ElementKind::ZeroWidth((ZERO_WIDTH - z) as usize),
            c => ElementKind::ChunkStart((-(c + 1)) as usize),
        }
    }

    pub fn is_token(self) -> bool {
        self.0 >= 0
    }

    pub fn is_zero_width(self) -> bool {
        matches!(self.kind(), ElementKind::ZeroWidth(_))
    }

    /// As a target (and as model input, where rows hold tokens only): the
    /// token, or 0 for a chunk's position.
    #[inline]
    pub fn target(self) -> i64 {
        // max(v, 0), in a form SSE2 vectorizes (it has no 64-bit max).
        self.0 & !(self.0 >> 63)
    }
}

impl std::fmt::Debug for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind() {
            ElementKind::Token(t) => write!(f, "{t}"),
            kind => write!(f, "{kind:?}"),
        }
    }
}

/// One trajectory's elements as read: every turn's prompt and completion,
/// back to back in `elements`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Trajectory {
    pub elements: Vec<Element>,
    pub turns: Vec<TurnSpan>,
}

impl Trajectory {
    pub fn clear(&mut self) {
        self.elements.clear();
        self.turns.clear();
    }
}

/// Where one turn's prompt and completion lie in [`Trajectory::elements`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSpan {
    pub prompt: Range<usize>,
    pub completion: Range<usize>,
}

/// A run of elements within a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Into [`Trajectory::elements`].
    pub elements: Range<usize>,
    pub turn: usize,
    pub completion: bool,
}

/// One row: the sequence `S` its segments spell out, and the turns it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Into [`Plan::segments`].
    pub segments: Range<usize>,
    pub first_turn: usize,
    pub n_turns: usize,
    /// Elements in `S`.
    pub len: usize,
    /// Whether a completion element is among the targets (`S[1:]`).
    pub completion_target: bool,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    pub rows: Vec<Row>,
    pub segments: Vec<Segment>,
}

impl Plan {
    pub fn clear(&mut self) {
        self.rows.clear();
        self.segments.clear();
    }

    pub fn segments_of(&self, row: &Row) -> &[Segment] {
        &self.segments[row.segments.clone()]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// One row per turn: `prompt + completion`.
    PerTurn,
    /// Consecutive turns share a row while each prompt starts with the
    /// sequence so far (tinker-cookbook's rule).
    WhilePromptExtends,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Rows with at least one completion element among their targets (`S[1:]`).
    WithCompletionTarget,
    /// Every non-empty row (tinker-cookbook; its too-short rows are errors).
    NonEmpty,
}

/// The rows of `trajectory`, appended to `plan` (which is cleared first).
pub fn plan_rows(trajectory: &Trajectory, merge: Merge, keep: Keep, plan: &mut Plan) {
    plan.clear();
    let mut open: Option<Open> = None;
    for (u, turn) in trajectory.turns.iter().enumerate() {
        let extends = match (&open, merge) {
            (Some(row), Merge::WhilePromptExtends) => {
                row.len > 0
                    && starts_with(
                        &trajectory.elements,
                        turn.prompt.clone(),
                        &plan.segments[row.first_segment..],
                    )
            }
            _ => false,
        };
        let new_part = if extends {
            let row = open.as_ref().expect("extends implies an open row");
            turn.prompt.start + row.len..turn.prompt.end
        } else {
            if let Some(row) = open.take() {
                row.close(keep, plan);
            }
            open = Some(Open::at(u, plan.segments.len()));
            turn.prompt.clone()
        };
        let row = open.as_mut().expect("a row is open");
        row.push(plan, new_part, u, false);
        row.push(plan, turn.completion.clone(), u, true);
        row.n_turns += 1;
    }
    if let Some(row) = open {
        row.close(keep, plan);
    }
}

/// A row being built: its segments are `plan.segments[first_segment..]`.
struct Open {
    first_segment: usize,
    first_turn: usize,
    n_turns: usize,
    len: usize,
    completion_target: bool,
}

impl Open {
    fn at(turn: usize, first_segment: usize) -> Self {
        Open {
            first_segment,
            first_turn: turn,
            n_turns: 0,
            len: 0,
            completion_target: false,
        }
    }

    fn push(&mut self, plan: &mut Plan, elements: Range<usize>, turn: usize, completion: bool) {
        if elements.is_empty() {
            return;
        }
        // A completion element is a target unless it is the first of `S`.
        self.completion_target |= completion && (self.len > 0 || elements.len() > 1);
        self.len += elements.len();
        plan.segments.push(Segment {
            elements,
            turn,
            completion,
        });
    }

    fn close(self, keep: Keep, plan: &mut Plan) {
        let kept = match keep {
            Keep::WithCompletionTarget => self.completion_target,
            Keep::NonEmpty => self.len > 0,
        };
        if kept {
            plan.rows.push(Row {
                segments: self.first_segment..plan.segments.len(),
                first_turn: self.first_turn,
                n_turns: self.n_turns,
                len: self.len,
                completion_target: self.completion_target,
            });
        } else {
            plan.segments.truncate(self.first_segment);
        }
    }
}

/// Whether `elements[prompt]` starts with the sequence `segments` spell out.
fn starts_with(elements: &[Element], prompt: Range<usize>, segments: &[Segment]) -> bool {
    let prompt = &elements[prompt];
    let mut at = 0;
    for segment in segments {
        let part = &elements[segment.elements.clone()];
        match prompt.get(at..at + part.len()) {
            Some(p) if p == part => at += part.len(),
            _ => return false,
        }
    }
    true
}

/// Elements of tokens (`>= 0`) and chunk positions: `-1 - id` a chunk's
/// first, `i64::MIN` a later one.
#[cfg(test)]
pub(crate) fn elements_of(values: &[i64]) -> Vec<Element> {
    values
        .iter()
        .map(|&v| match v {
            i64::MIN => Element::chunk_rest(),
            v if v < 0 => Element::chunk_start((-v - 1) as usize),
            v => Element::token(v),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_element_reads_back_as_what_it_was_made_as() {
        let made = [
            (Element::token(0), ElementKind::Token(0)),
            (
                Element::token(i64::from(i32::MAX)),
                ElementKind::Token(i64::from(i32::MAX)),
            ),
            (Element::chunk_start(0), ElementKind::ChunkStart(0)),
            (Element::chunk_start(1 << 40), ElementKind::ChunkStart(1 << 40)),
            (Element::chunk_rest(), ElementKind::ChunkRest),
            (Element::zero_width(0), ElementKind::ZeroWidth(0)),
            (Element::zero_width(1 << 40), ElementKind::ZeroWidth(1 << 40)),
        ];
        for (i, (a, kind)) in made.iter().enumerate() {
            assert_eq!(a.kind(), *kind);
            assert_eq!(a.target(), if let ElementKind::Token(t) = kind { *t } else { 0 });
            for (j, (b, _)) in made.iter().enumerate() {
                assert_eq!(a == b, i == j, "{a:?} vs {b:?}");
            }
        }
        assert_ne!(Element::chunk_start(3), Element::zero_width(3));
    }

    /// A trajectory from `(prompt, completion)` token lists.
    pub fn trajectory(turns: &[(&[i64], &[i64])]) -> Trajectory {
        let mut t = Trajectory::default();
        for (p, c) in turns {
            let start = t.elements.len();
            t.elements.extend(elements_of(p));
            let mid = t.elements.len();
            t.elements.extend(elements_of(c));
            t.turns.push(TurnSpan {
                prompt: start..mid,
                completion: mid..t.elements.len(),
            });
        }
        t
    }

    fn sequences(t: &Trajectory, plan: &Plan) -> Vec<(Vec<i64>, usize, usize)> {
        plan.rows
            .iter()
            .map(|row| {
                let s = plan
                    .segments_of(row)
                    .iter()
                    .flat_map(|p| t.elements[p.elements.clone()].iter().map(|e| e.target()))
                    .collect();
                (s, row.first_turn, row.n_turns)
            })
            .collect()
    }

    #[test]
    fn per_turn_rows_keep_turns_with_a_completion_target() {
        let t = trajectory(&[(&[1, 2], &[]), (&[], &[7]), (&[], &[7, 8]), (&[1], &[2])]);
        let mut plan = Plan::default();
        plan_rows(&t, Merge::PerTurn, Keep::WithCompletionTarget, &mut plan);
        assert_eq!(sequences(&t, &plan), vec![(vec![7, 8], 2, 1), (vec![1, 2], 3, 1)]);
    }

    #[test]
    fn merged_rows_follow_the_prompt_while_it_extends() {
        // Turn 1 extends turn 0 (prompt = 1 2 | 3 | 9), turn 2 almost does
        // (one token differs) and starts a new row, turn 3 extends turn 2.
        let t = trajectory(&[
            (&[1, 2], &[3]),
            (&[1, 2, 3, 9], &[4, 5]),
            (&[1, 2, 3, 9, 4, 6], &[7]),
            (&[1, 2, 3, 9, 4, 6, 7], &[8]),
        ]);
        let mut plan = Plan::default();
        plan_rows(&t, Merge::WhilePromptExtends, Keep::WithCompletionTarget, &mut plan);
        assert_eq!(
            sequences(&t, &plan),
            vec![(vec![1, 2, 3, 9, 4, 5], 0, 2), (vec![1, 2, 3, 9, 4, 6, 7, 8], 2, 2)]
        );
        let completions: Vec<bool> = plan.segments.iter().map(|p| p.completion).collect();
        // Turn 3's prompt is exactly the sequence so far: no new context segment.
        assert_eq!(completions, vec![false, true, false, true, false, true, true]);
    }

    #[test]
    fn rows_without_completion_targets_are_dropped_or_kept_by_rule() {
        // One lone completion token with an empty prompt: no target at all.
        let t = trajectory(&[(&[], &[5]), (&[5, 6], &[])]);
        let mut plan = Plan::default();
        plan_rows(&t, Merge::WhilePromptExtends, Keep::WithCompletionTarget, &mut plan);
        assert!(plan.rows.is_empty() && plan.segments.is_empty());
        plan_rows(&t, Merge::WhilePromptExtends, Keep::NonEmpty, &mut plan);
        assert_eq!(sequences(&t, &plan), vec![(vec![5, 6], 0, 2)]);
    }

    #[test]
    fn an_empty_sequence_never_extends() {
        let t = trajectory(&[(&[], &[]), (&[1], &[2])]);
        let mut plan = Plan::default();
        plan_rows(&t, Merge::WhilePromptExtends, Keep::NonEmpty, &mut plan);
        assert_eq!(sequences(&t, &plan), vec![(vec![1, 2], 1, 1)]);
    }
}
