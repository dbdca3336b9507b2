//! Group-relative advantages and reward statistics, in float64.

/// Neumaier's compensated sum, one term at a time: exact to about one
/// rounding of the result, where a naive sum loses digits on long runs of
/// mixed magnitudes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sum {
    sum: f64,
    compensation: f64,
}

impl Sum {
    pub fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.compensation += (self.sum - t) + x;
        } else {
            self.compensation += (x - t) + self.sum;
        }
        self.sum = t;
    }

    /// Adds what another sum holds.
    pub fn merge(&mut self, other: Sum) {
        self.add(other.sum);
        // Not the nan of an overflowed sum (see `value`).
        if other.compensation.is_finite() {
            self.add(other.compensation);
        }
    }

    pub fn value(self) -> f64 {
        // Past overflow the compensation is inf - inf = nan: the sum is inf.
        if self.sum.is_finite() {
            self.sum + self.compensation
        } else {
            self.sum
        }
    }
}

pub fn accurate_sum(xs: &[f64]) -> f64 {
    let mut sum = Sum::default();
    for &x in xs {
        sum.add(x);
    }
    sum.value()
}

pub fn mean(xs: &[f64]) -> f64 {
    accurate_sum(xs) / xs.len() as f64
}

/// What a trajectory's reward is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The group mean (tinker-cookbook's and the evsys module's advantage).
    Mean,
    /// The mean of the group's other trajectories (RLOO).
    LeaveOneOut,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdvantageRule {
    /// `false`: the raw rewards (then `baseline` is `Mean`, no scaling).
    pub normalize: bool,
    pub baseline: Baseline,
    /// Divide by the group's sample standard deviation plus `eps` (GRPO).
    pub scale_by_std: bool,
    pub eps: f64,
}

impl AdvantageRule {
    pub const MEAN: AdvantageRule = AdvantageRule {
        normalize: true,
        baseline: Baseline::Mean,
        scale_by_std: false,
        eps: 1e-6,
    };
}

/// Appends one advantage per reward. Groups of 0 or 1 keep their rewards (a
/// lone sample has no baseline), as does `normalize: false`.
pub fn extend_group_advantages(rewards: &[f64], rule: AdvantageRule, out: &mut Vec<f64>) {
    let n = rewards.len();
    if !rule.normalize || n < 2 {
        out.extend_from_slice(rewards);
        return;
    }
    let sum = accurate_sum(rewards);
    let m = sum / n as f64;
    let scale = if rule.scale_by_std {
        let squares: Vec<f64> = rewards.iter().map(|r| (r - m) * (r - m)).collect();
        (accurate_sum(&squares) / (n - 1) as f64).sqrt() + rule.eps
    } else {
        1.0
    };
    let baseline = |r: f64| match rule.baseline {
        Baseline::Mean => m,
        Baseline::LeaveOneOut => (sum - r) / (n - 1) as f64,
    };
    out.extend(rewards.iter().map(|&r| (r - baseline(r)) / scale));
}

/// Whether the rewards are all equal (so every advantage would be 0).
pub fn is_constant(rewards: &[f64]) -> bool {
    rewards.windows(2).all(|w| w[0] == w[1])
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RewardStats {
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
}

/// `None` for no rewards: there is nothing to report.
pub fn reward_stats(rewards: &[f64]) -> Option<RewardStats> {
    if rewards.is_empty() {
        return None;
    }
    let m = mean(rewards);
    let squares: Vec<f64> = rewards.iter().map(|r| (r - m) * (r - m)).collect();
    Some(RewardStats {
        mean: m,
        std: (accurate_sum(&squares) / rewards.len() as f64).sqrt(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compensated_sum_keeps_small_terms() {
        assert_eq!(accurate_sum(&[1e16, 1.0, -1e16]), 1.0);
        assert_eq!(accurate_sum(&[]), 0.0);
        assert_eq!(accurate_sum(&[f64::MAX, f64::MAX]), f64::INFINITY);
    }

    #[test]
    fn normalized_group_sums_to_zero() {
        let mut out = Vec::new();
        extend_group_advantages(&[1.0, 2.0, 6.0], AdvantageRule::MEAN, &mut out);
        assert_eq!(out, vec![-2.0, -1.0, 3.0]);
    }

    #[test]
    fn lone_trajectory_and_unnormalized_keep_rewards() {
        let raw = AdvantageRule {
            normalize: false,
            ..AdvantageRule::MEAN
        };
        let mut out = Vec::new();
        extend_group_advantages(&[0.5], AdvantageRule::MEAN, &mut out);
        extend_group_advantages(&[1.0, 3.0], raw, &mut out);
        extend_group_advantages(&[], AdvantageRule::MEAN, &mut out);
        assert_eq!(out, vec![0.5, 1.0, 3.0]);
    }

    #[test]
    fn leave_one_out_and_std_scaling() {
        let loo = AdvantageRule {
            baseline: Baseline::LeaveOneOut,
            ..AdvantageRule::MEAN
        };
        let mut out = Vec::new();
        // 1 - (2 + 6) / 2 = -3, 2 - 7 / 2 = -1.5, 6 - 3 / 2 = 4.5
        extend_group_advantages(&[1.0, 2.0, 6.0], loo, &mut out);
        assert_eq!(out, vec![-3.0, -1.5, 4.5]);
        let grpo = AdvantageRule {
            scale_by_std: true,
            eps: 0.0,
            ..AdvantageRule::MEAN
        };
        out.clear();
        // mean 2, sample std sqrt((1 + 1) / 1) = sqrt(2)
        extend_group_advantages(&[1.0, 3.0], grpo, &mut out);
        assert_eq!(out, vec![-1.0 / 2f64.sqrt(), 1.0 / 2f64.sqrt()]);
        assert!(is_constant(&[]) && is_constant(&[1.0]) && is_constant(&[2.0, 2.0]));
        assert!(!is_constant(&[2.0, 3.0]));
    }

    #[test]
    fn stats_are_population_stats() {
        let s = reward_stats(&[1.0, 3.0]).unwrap();
        assert_eq!(s, RewardStats { mean: 2.0, std: 1.0 });
        assert_eq!(reward_stats(&[]), None);
    }
}
