//! The numbers behind tinker-cookbook's per-step metrics, accumulated in
//! float64: `rl.metrics.compute_kl_sample_train`'s sums over the action
//! positions of every Datum (the cookbook's are float32 tensor means), and
//! `rl.metric_util.compute_trajectory_metrics`'s per-group totals, read once
//! and combined into one summary per tag (the cookbook reads every group
//! again for each tag). Plain Rust: `py/step/` reads the Python objects.

use crate::advantages::Sum;

// --------------------------------------------------------------------------
// compute_kl_sample_train

/// An element type of the tensors read, widened to float64.
pub trait Real: Copy {
    fn real(self) -> f64;
}

impl Real for f32 {
    fn real(self) -> f64 {
        f64::from(self)
    }
}

impl Real for f64 {
    fn real(self) -> f64 {
        self
    }
}

impl Real for i64 {
    fn real(self) -> f64 {
        self as f64
    }
}

/// `compute_kl_sample_train`'s three metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlMetrics {
    /// The mean of `d = s - t` (sampling minus training logprob).
    pub v1: f64,
    /// Half the mean of `d²`.
    pub v2: f64,
    /// Minus the mean of `s`.
    pub entropy: f64,
}

/// Sums over the action positions (mask > 0) of every Datum added.
#[derive(Clone, Copy, Debug, Default)]
pub struct KlSums {
    positions: u64,
    diff: Sum,
    diff_squared: Sum,
    sampling: Sum,
}

/// Independent running sums, so that additions need not wait for each
/// other (a single chain of float additions runs at one per 4 cycles).
const LANES: usize = 4;

#[derive(Default)]
struct Lanes {
    positions: [u64; LANES],
    diff: [f64; LANES],
    diff_squared: [f64; LANES],
    sampling: [f64; LANES],
}

impl Lanes {
    #[inline]
    fn add<S: Real, T: Real, M: Real>(&mut self, lane: usize, s: S, t: T, m: M) {
        // Selected, not multiplied by the mask: a nan or infinite logprob
        // at a position outside the mask must not reach the sums.
        let on = m.real() > 0.0;
        let s = s.real();
        let d = s - t.real();
        self.positions[lane] += u64::from(on);
        self.diff[lane] += if on { d } else { 0.0 };
        self.diff_squared[lane] += if on { d * d } else { 0.0 };
        self.sampling[lane] += if on { s } else { 0.0 };
    }
}

impl KlSums {
    /// Adds one Datum's positions: its sampling logprobs, the training
    /// logprobs and its mask, all of one length (the caller checks: the
    /// cookbook's indexing raises otherwise).
    pub fn add_datum<S: Real, T: Real, M: Real>(&mut self, sampling: &[S], training: &[T], mask: &[M]) {
        assert!(
            sampling.len() == mask.len() && training.len() == mask.len(),
            "a Datum's logprobs, training logprobs and mask differ in length"
        );
        let mut lanes = Lanes::default();
        let blocks = sampling
            .chunks_exact(LANES)
            .zip(training.chunks_exact(LANES))
            .zip(mask.chunks_exact(LANES));
        for ((s, t), m) in blocks {
            for lane in 0..LANES {
                lanes.add(lane, s[lane], t[lane], m[lane]);
            }
        }
        for i in mask.len() - mask.len() % LANES..mask.len() {
            lanes.add(0, sampling[i], training[i], mask[i]);
        }
        for lane in 0..LANES {
            self.positions += lanes.positions[lane];
            self.diff.add(lanes.diff[lane]);
            self.diff_squared.add(lanes.diff_squared[lane]);
            self.sampling.add(lanes.sampling[lane]);
        }
    }

    /// `None` when no position was an action one (where the cookbook's
    /// `assert all_diffs` fails).
    pub fn metrics(&self) -> Option<KlMetrics> {
        if self.positions == 0 {
            return None;
        }
        let n = self.positions as f64;
        Some(KlMetrics {
            v1: self.diff.value() / n,
            v2: 0.5 * (self.diff_squared.value() / n),
            entropy: -(self.sampling.value() / n),
        })
    }
}

// --------------------------------------------------------------------------
// compute_trajectory_metrics

/// A Python `int` or `float` as read: its value, and whether it was a float
/// (Python adds an int and a float as floats, two ints exactly).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Number {
    pub value: f64,
    pub is_float: bool,
}

impl Number {
    pub fn float(value: f64) -> Self {
        Number { value, is_float: true }
    }

    pub fn int(value: f64) -> Self {
        Number { value, is_float: false }
    }
}

/// A trajectory's total reward as tinker-cookbook's `get_total_rewards`
/// computes it: `sum(transition rewards) + final_reward`, in Python.
///
/// CPython's `sum()` adds floats one after the other up to 3.11 and with
/// Neumaier's compensation from 3.12; whenever none of its additions
/// rounds, both give the exact sum, and so does this. When one would round,
/// [`RewardSum::total`] is `None` and the caller asks the group's own
/// method instead.
#[derive(Clone, Copy, Debug)]
pub struct RewardSum {
    sum: f64,
    exact: bool,
    is_float: bool,
}

impl Default for RewardSum {
    fn default() -> Self {
        // Python's sum() starts from the int 0.
        RewardSum {
            sum: 0.0,
            exact: true,
            is_float: false,
        }
    }
}

impl RewardSum {
    pub fn add(&mut self, reward: Number) {
        let t = self.sum + reward.value;
        self.exact &= rounding_error(self.sum, reward.value, t) == 0.0;
        self.sum = t;
        self.is_float |= reward.is_float;
    }

    pub fn total(self, final_reward: Number) -> Option<f64> {
        if !self.exact {
            return None;
        }
        let t = self.sum + final_reward.value;
        // With a float on either side this is one float addition, in Python
        // as here; two ints Python adds exactly.
        let floats = self.is_float || final_reward.is_float;
        (floats || rounding_error(self.sum, final_reward.value, t) == 0.0).then_some(t)
    }
}

/// What `t = a + b` lost to rounding (Knuth's TwoSum): 0 when `t` is
/// exact, nan when anything is infinite or nan.
fn rounding_error(a: f64, b: f64, t: f64) -> f64 {
    let b_part = t - a;
    let a_part = t - b_part;
    (a - a_part) + (b - b_part)
}

/// `_compute_by_group_metrics`'s threshold for a group whose rewards are
/// all equal.
pub const GOOD_THRESHOLD: f64 = 0.5;

/// How `compute_trajectory_metrics` classes a group by its total rewards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    Mixed,
    AllGood,
    AllBad,
}

impl GroupKind {
    /// All equal to the first (Python's `==`: a nan equals nothing, itself
    /// included) makes the group all good when the first is >= 0.5, else
    /// all bad. `None` without rewards (the cookbook's `grp_rewards[0]`
    /// raises).
    pub fn of(rewards: &[f64]) -> Option<GroupKind> {
        let first = *rewards.first()?;
        Some(if !rewards.iter().all(|&r| r == first) {
            GroupKind::Mixed
        } else if first >= GOOD_THRESHOLD {
            GroupKind::AllGood
        } else {
            GroupKind::AllBad
        })
    }
}

/// Per-key metric values (tinker-cookbook's `dict_mean`), the keys (small
/// dense ids given by the caller: 0, 1, 2, ...) in the order they first
/// appear, each key's values in the order `dict_mean` lists them.
#[derive(Clone, Debug, Default)]
pub struct KeyedValues {
    entries: Vec<KeyValues>,
    /// By key: 1 + its entry's index, 0 for a key not seen (the ids are
    /// small and dense: a lookup is an index, not a hash).
    index: Vec<u32>,
}

#[derive(Clone, Debug)]
struct KeyValues {
    key: usize,
    values: Vec<f64>,
    /// Every value a Python number (or a float subclass): numpy averages
    /// them as float64, and so does [`numpy_mean`], to the bit. Else (a
    /// float32 or other numpy scalar among them, whose promotion numpy
    /// decides) an accurate float64 mean.
    as_numpy: bool,
}

impl KeyedValues {
    /// `as_numpy`: the value was a Python number or a float subclass.
    pub fn add(&mut self, key: usize, value: f64, as_numpy: bool) {
        let entry = self.entry(key);
        entry.values.push(value);
        entry.as_numpy &= as_numpy;
    }

    fn merge(&mut self, other: &KeyedValues) {
        for e in &other.entries {
            let entry = self.entry(e.key);
            entry.values.extend_from_slice(&e.values);
            entry.as_numpy &= e.as_numpy;
        }
    }

    fn entry(&mut self, key: usize) -> &mut KeyValues {
        if key >= self.index.len() {
            self.index.resize(key + 1, 0);
        }
        let i = match self.index[key] {
            0 => {
                self.entries.push(KeyValues {
                    key,
                    values: Vec::new(),
                    as_numpy: true,
                });
                self.index[key] = u32::try_from(self.entries.len()).expect("fewer than 2**32 metric keys");
                self.entries.len() - 1
            }
            i => i as usize - 1,
        };
        &mut self.entries[i]
    }

    /// `(key, mean)` in order of first appearance.
    pub fn means(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.entries.iter().map(|e| {
            let mean = if e.as_numpy {
                numpy_mean(&e.values)
            } else {
                crate::advantages::mean(&e.values)
            };
            (e.key, mean)
        })
    }
}

/// What one group contributes to every summary it is part of.
#[derive(Clone, Debug, Default)]
pub struct GroupStats {
    pub trajectories: i64,
    pub turns: i64,
    pub ac_tokens: i64,
    pub ob_tokens: i64,
    pub cached_ob_tokens: i64,
    /// Its transitions' metrics, then (kept apart: `dict_mean` sees every
    /// transition of a summary before any trajectory) its `metrics_G`.
    pub transition_metrics: KeyedValues,
    pub trajectory_metrics: KeyedValues,
    rewards: Vec<f64>,
    kind: Option<GroupKind>,
}

impl GroupStats {
    /// The group's total rewards, one per trajectory.
    pub fn set_rewards(&mut self, totals: &[f64]) {
        self.rewards = totals.to_vec();
        self.kind = GroupKind::of(totals);
    }
}

/// `_compute_trajectory_metrics` of some groups.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub episodes: i64,
    pub turns: i64,
    pub ac_tokens: i64,
    pub ob_tokens: i64,
    pub cached_ob_tokens: i64,
    /// The mean total reward (0.0 without trajectories).
    pub reward: f64,
    /// `dict_mean` of every transition's metrics, then of every
    /// trajectory's: `(key, mean)`, keys in order of first appearance.
    pub metric_means: Vec<(usize, f64)>,
    pub frac_mixed: f64,
    pub frac_all_good: f64,
    pub frac_all_bad: f64,
}

/// `float(np.mean(values))` of a non-empty list of Python floats and ints
/// (below 2**53) to the bit: numpy's reduction adds the values' pairwise
/// sum to its identity, 0.0, and divides by the count.
pub fn numpy_mean(values: &[f64]) -> f64 {
    (0.0 + numpy_pairwise_sum(values)) / values.len() as f64
}

/// numpy's pairwise summation (`pairwise_sum` of its add loops), in its
/// order: under 8 values one by one from -0.0; up to 128, eight running
/// sums combined as a tree, then the rest one by one; above, the two halves
/// (the first a multiple of 8) summed alike and added.
pub fn numpy_pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        a.iter().fold(-0.0, |res, &x| res + x)
    } else if n <= 128 {
        let mut r = [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]];
        let whole = n - n % 8;
        for block in a[8..whole].chunks_exact(8) {
            for (acc, &x) in r.iter_mut().zip(block) {
                *acc += x;
            }
        }
        let res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        a[whole..].iter().fold(res, |res, &x| res + x)
    } else {
        let half = n / 2;
        let half = half - half % 8;
        numpy_pairwise_sum(&a[..half]) + numpy_pairwise_sum(&a[half..])
    }
}

/// `a / b` as Python's `a / b if b > 0 else 0.0` gives it for ints below 2**53.
fn ratio(a: i64, b: i64) -> f64 {
    if b > 0 {
        a as f64 / b as f64
    } else {
        0.0
    }
}

impl Summary {
    pub fn ac_tokens_per_turn(&self) -> f64 {
        ratio(self.ac_tokens, self.turns)
    }

    pub fn ob_tokens_per_turn(&self) -> f64 {
        ratio(self.ob_tokens, self.turns)
    }

    pub fn turns_per_episode(&self) -> f64 {
        ratio(self.turns, self.episodes)
    }
}

/// The summary of `members` (indices into `groups`; a group listed twice
/// counts twice, as in the cookbook). `None` when a member has no rewards.
pub fn summarize(groups: &[GroupStats], members: &[usize]) -> Option<Summary> {
    let mut rewards = Vec::new();
    let mut metrics = KeyedValues::default();
    let (mut mixed, mut good, mut bad) = (0i64, 0i64, 0i64);
    let mut s = Summary {
        episodes: 0,
        turns: 0,
        ac_tokens: 0,
        ob_tokens: 0,
        cached_ob_tokens: 0,
        reward: 0.0,
        metric_means: Vec::new(),
        frac_mixed: 0.0,
        frac_all_good: 0.0,
        frac_all_bad: 0.0,
    };
    for &g in members {
        let group = &groups[g];
        s.episodes += group.trajectories;
        s.turns += group.turns;
        s.ac_tokens += group.ac_tokens;
        s.ob_tokens += group.ob_tokens;
        s.cached_ob_tokens += group.cached_ob_tokens;
        rewards.extend_from_slice(&group.rewards);
        match group.kind? {
            GroupKind::Mixed => mixed += 1,
            GroupKind::AllGood => good += 1,
            GroupKind::AllBad => bad += 1,
        }
        metrics.merge(&group.transition_metrics);
    }
    for &g in members {
        metrics.merge(&groups[g].trajectory_metrics);
    }
    if !rewards.is_empty() {
        s.reward = numpy_mean(&rewards);
    }
    s.metric_means = metrics.means().collect();
    let n_groups = members.len() as i64;
    s.frac_mixed = ratio(mixed, n_groups);
    s.frac_all_good = ratio(good, n_groups);
    s.frac_all_bad = ratio(bad, n_groups);
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_mean_sums_in_numpys_order() {
        // float(np.mean(xs)) of each, numpy 2.5.5, where math.fsum(xs) / n
        // and sum(xs) / n give 0.19999999999999998, 1.3013698630136985 and
        // 6.41095890410959: the three orders (under 8, eight running sums,
        // halves) each matter.
        let xs = |n: usize, k: usize| -> Vec<f64> { (0..n).map(|i| ((i * k) % 97) as f64 / 7.3).collect() };
        assert_eq!(numpy_mean(&[0.1, 0.2, 0.3]), 0.200_000_000_000_000_04);
        assert_eq!(numpy_mean(&xs(20, 1)), 1.301_369_863_013_699);
        assert_eq!(numpy_mean(&xs(300, 2)), 6.410_958_904_109_589);
        assert_eq!(numpy_mean(&[-0.0]).to_bits(), 0.0f64.to_bits());
    }

    fn kl(sampling: &[f32], training: &[f32], mask: &[f32]) -> Option<KlMetrics> {
        let mut sums = KlSums::default();
        sums.add_datum(sampling, training, mask);
        sums.metrics()
    }

    #[test]
    fn kl_averages_the_action_positions_only() {
        // Seven positions (one block of four and three more), actions at 1, 4, 6;
        // the nan and inf outside the mask do not count.
        let s = [f32::NAN, -1.0, 0.0, 0.0, -2.0, f32::INFINITY, -4.0];
        let t = [0.0, -1.5, f32::NAN, 0.0, -1.0, 0.0, -4.0];
        let m = [0.0, 1.0, 0.0, -1.0, 1.0, 0.0, 0.5];
        let got = kl(&s, &t, &m).unwrap();
        // d = 0.5, -1, 0
        assert_eq!(got.v1, -0.5 / 3.0);
        assert_eq!(got.v2, 0.5 * (1.25 / 3.0));
        assert_eq!(got.entropy, 7.0 / 3.0);
    }

    #[test]
    fn kl_accumulates_across_datums_and_types() {
        let mut sums = KlSums::default();
        sums.add_datum(&[-1.0f32], &[-1.0f64], &[1i64]);
        sums.add_datum(&[-3.0f64], &[-2.0f32], &[1.0f64]);
        let got = sums.metrics().unwrap();
        assert_eq!((got.v1, got.v2, got.entropy), (-0.5, 0.25, 2.0));
    }

    #[test]
    fn kl_without_action_positions_is_none() {
        assert_eq!(kl(&[], &[], &[]), None);
        assert_eq!(kl(&[-1.0; 5], &[0.0; 5], &[0.0; 5]), None);
    }

    #[test]
    fn a_nan_action_makes_nan_metrics() {
        let got = kl(&[f32::NAN, -1.0], &[0.0, 0.0], &[1.0, 1.0]).unwrap();
        assert!(got.v1.is_nan() && got.v2.is_nan() && got.entropy.is_nan());
    }

    fn total(rewards: &[Number], final_reward: Number) -> Option<f64> {
        let mut sum = RewardSum::default();
        for &r in rewards {
            sum.add(r);
        }
        sum.total(final_reward)
    }

    #[test]
    fn reward_totals_known_when_the_sum_is_exact() {
        let f = Number::float;
        assert_eq!(total(&[], f(0.7)), Some(0.7));
        assert_eq!(total(&[f(0.0)], f(0.7)), Some(0.7));
        assert_eq!(total(&[f(0.25), f(-1.5)], f(0.1)), Some(-1.25 + 0.1));
        // -0.0 + 0 is 0.0 in Python too.
        assert_eq!(total(&[], f(-0.0)).map(f64::to_bits), Some(0f64.to_bits()));
        // 0.1 + 0.2 rounds: the order of CPython's sum() would matter.
        assert_eq!(total(&[f(0.1), f(0.2)], f(0.0)), None);
        assert_eq!(total(&[f(f64::INFINITY)], f(0.0)), None);
        assert_eq!(total(&[f(f64::NAN)], f(0.0)), None);
    }

    #[test]
    fn int_rewards_add_exactly_as_python_ints() {
        let i = Number::int;
        let big = 2f64.powi(53);
        assert_eq!(total(&[i(1.0), i(2.0)], i(3.0)), Some(6.0));
        // 2**53 + 1 is exact for Python ints, not for floats.
        assert_eq!(total(&[i(big)], i(1.0)), None);
        // With a float final reward Python rounds the same float addition.
        assert_eq!(total(&[i(big)], Number::float(1.0)), Some(big + 1.0));
    }

    #[test]
    fn group_kinds() {
        assert_eq!(GroupKind::of(&[]), None);
        assert_eq!(GroupKind::of(&[1.0, 0.0]), Some(GroupKind::Mixed));
        assert_eq!(GroupKind::of(&[0.5, 0.5]), Some(GroupKind::AllGood));
        assert_eq!(GroupKind::of(&[0.4]), Some(GroupKind::AllBad));
        assert_eq!(GroupKind::of(&[f64::NAN]), Some(GroupKind::Mixed));
    }

    fn group(trajectories: i64, turns: i64, ac: i64, rewards: &[f64], transition_keys: &[usize]) -> GroupStats {
        let mut g = GroupStats {
            trajectories,
            turns,
            ac_tokens: ac,
            ob_tokens: 2 * ac,
            cached_ob_tokens: 1,
            ..GroupStats::default()
        };
        for &k in transition_keys {
            g.transition_metrics.add(k, k as f64, true);
        }
        g.trajectory_metrics.add(9, 1.0, true);
        g.set_rewards(rewards);
        g
    }

    #[test]
    fn summaries_combine_groups_with_multiplicity() {
        let groups = [group(2, 4, 10, &[1.0, 0.0], &[3, 1]), group(1, 1, 5, &[1.0], &[2, 3])];
        let s = summarize(&groups, &[0, 1, 1]).unwrap();
        assert_eq!(
            (s.episodes, s.turns, s.ac_tokens, s.ob_tokens, s.cached_ob_tokens),
            (4, 6, 20, 40, 3)
        );
        assert_eq!(s.ac_tokens_per_turn(), 20.0 / 6.0);
        assert_eq!(s.turns_per_episode(), 1.5);
        assert_eq!(s.reward, 0.75);
        // Every transition key (in order of first appearance) before the trajectory keys.
        assert_eq!(s.metric_means, vec![(3, 3.0), (1, 1.0), (2, 2.0), (9, 1.0)]);
        assert_eq!(
            (s.frac_mixed, s.frac_all_good, s.frac_all_bad),
            (1.0 / 3.0, 2.0 / 3.0, 0.0)
        );
    }

    #[test]
    fn an_empty_summary_is_zeros_and_a_group_without_rewards_is_none() {
        let s = summarize(&[], &[]).unwrap();
        assert_eq!(
            (s.ac_tokens_per_turn(), s.turns_per_episode(), s.reward),
            (0.0, 0.0, 0.0)
        );
        assert_eq!((s.frac_mixed, s.frac_all_good, s.frac_all_bad), (0.0, 0.0, 0.0));
        assert!(s.metric_means.is_empty());
        assert_eq!(summarize(&[group(0, 0, 0, &[], &[])], &[0]), None);
    }
}
