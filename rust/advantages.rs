//! Group-relative advantages and reward statistics, in float64.

/// Neumaier's compensated sum: exact to about one rounding of the result,
/// where a naive sum loses digits on long groups of mixed magnitudes.
pub fn accurate_sum(xs: &[f64]) -> f64 {
    let mut sum = 0.0f64;
    let mut compensation = 0.0f64;
    for &x in xs {
        let t = sum + x;
        if sum.abs() >= x.abs() {
            compensation += (sum - t) + x;
        } else {
            compensation += (x - t) + sum;
        }
        sum = t;
    }
    // Past overflow the compensation is inf - inf = nan: the sum is inf.
    if sum.is_finite() {
        sum + compensation
    } else {
        sum
    }
}

pub fn mean(xs: &[f64]) -> f64 {
    accurate_sum(xs) / xs.len() as f64
}

/// Appends one advantage per reward: `reward - mean` when normalizing a
/// group of 2+, else the rewards themselves (a lone sample has no baseline).
pub fn extend_group_advantages(rewards: &[f64], normalize: bool, out: &mut Vec<f64>) {
    if normalize && rewards.len() >= 2 {
        let m = mean(rewards);
        out.extend(rewards.iter().map(|r| r - m));
    } else {
        out.extend_from_slice(rewards);
    }
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
        extend_group_advantages(&[1.0, 2.0, 6.0], true, &mut out);
        assert_eq!(out, vec![-2.0, -1.0, 3.0]);
    }

    #[test]
    fn lone_trajectory_and_unnormalized_keep_rewards() {
        let mut out = Vec::new();
        extend_group_advantages(&[0.5], true, &mut out);
        extend_group_advantages(&[1.0, 3.0], false, &mut out);
        extend_group_advantages(&[], true, &mut out);
        assert_eq!(out, vec![0.5, 1.0, 3.0]);
    }

    #[test]
    fn stats_are_population_stats() {
        let s = reward_stats(&[1.0, 3.0]).unwrap();
        assert_eq!(s, RewardStats { mean: 2.0, std: 1.0 });
        assert_eq!(reward_stats(&[]), None);
    }
}
