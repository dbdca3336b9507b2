//! torch's CPU `Tensor.sum()` of a 1-D float32 tensor, bit for bit: ATen's
//! cascade sum (`aten/src/ATen/native/cpu/SumKernel.cpp`), for a tensor
//! torch reduces in one serial pass (fewer than [`GRAIN_SIZE`] elements).
//!
//! A contiguous tensor of at least `lanes` elements (`Vectorized<float>::
//! size()` of the kernel torch runs) is summed as vectors of `lanes`
//! floats by `row_sum` (4 accumulators, each a 4-level cascade), the tail
//! elements after the last whole vector into one scalar, then the lanes
//! into it in order; anything shorter or strided by the same `row_sum`
//! over scalars. Every add is one float32 add (lane by lane: no fused or
//! reassociated arithmetic), as the kernel's.

/// `at::internal::GRAIN_SIZE`: from this many elements on, torch splits the
/// reduction over its threads (the result then depends on their number).
pub const GRAIN_SIZE: usize = 32768;

/// The vector widths reproduced: `Vectorized<float>::size()`.
pub const LANES: [usize; 3] = [4, 8, 16];

/// An accumulator: a float32, or a vector of them added lane by lane.
trait Acc: Copy {
    const ZERO: Self;
    #[must_use]
    fn add(self, other: Self) -> Self;
}

impl Acc for f32 {
    const ZERO: f32 = 0.0;
    #[inline]
    fn add(self, other: f32) -> f32 {
        self + other
    }
}

impl<const L: usize> Acc for [f32; L] {
    const ZERO: [f32; L] = [0.0; L];
    #[inline]
    fn add(mut self, other: [f32; L]) -> [f32; L] {
        for (a, b) in self.iter_mut().zip(other) {
            *a += b;
        }
        self
    }
}

/// `utils::CeilLog2` (1 for 0, 1 and 2).
fn ceil_log2(x: usize) -> usize {
    if x <= 2 {
        1
    } else {
        (usize::BITS - (x - 1).leading_zeros()) as usize
    }
}

/// `multi_row_sum`: `N` sums at once over `size` rows (`load(i, k)` is
/// element `k` of row `i`), each carried through 4 levels of partial sums
/// that take `2**level_power` of the level below at a time.
fn multi_row_sum<T: Acc, const N: usize>(load: impl Fn(usize, usize) -> T, size: usize) -> [T; N] {
    const LEVELS: usize = 4;
    let level_power = (ceil_log2(size) / LEVELS).max(4);
    let level_step = 1usize << level_power;
    let level_mask = level_step - 1;
    let mut acc = [[T::ZERO; N]; LEVELS];
    let mut i = 0;
    while i + level_step <= size {
        for _ in 0..level_step {
            for (k, a) in acc[0].iter_mut().enumerate() {
                *a = a.add(load(i, k));
            }
            i += 1;
        }
        for j in 1..LEVELS {
            let (lower, upper) = acc.split_at_mut(j);
            for (up, low) in upper[0].iter_mut().zip(lower[j - 1].iter_mut()) {
                *up = up.add(*low);
                *low = T::ZERO;
            }
            if i & (level_mask << (j * level_power)) != 0 {
                break;
            }
        }
    }
    while i < size {
        for (k, a) in acc[0].iter_mut().enumerate() {
            *a = a.add(load(i, k));
        }
        i += 1;
    }
    let (first, rest) = acc.split_at_mut(1);
    for level in rest {
        for (a, &b) in first[0].iter_mut().zip(level.iter()) {
            *a = a.add(b);
        }
    }
    first[0]
}

/// `row_sum`: the `size` elements `load(i)` as rows of 4 (`multi_row_sum`),
/// the elements after the last whole row into the first sum, then the
/// other three sums into it.
fn row_sum<T: Acc>(load: impl Fn(usize) -> T, size: usize) -> T {
    const ILP: usize = 4;
    let rows = size / ILP;
    let mut partial: [T; ILP] = multi_row_sum(|i, k| load(i * ILP + k), rows);
    for i in rows * ILP..size {
        partial[0] = partial[0].add(load(i));
    }
    for k in 1..ILP {
        partial[0] = partial[0].add(partial[k]);
    }
    partial[0]
}

/// `vectorized_inner_sum` of one row with `L` lanes.
fn vectorized<const L: usize>(x: &[f32]) -> f32 {
    let vectors = x.len() / L;
    let load = |i: usize| -> [f32; L] {
        let mut v = [0.0f32; L];
        v.copy_from_slice(&x[i * L..(i + 1) * L]);
        v
    };
    let lanes = row_sum(load, vectors);
    let mut sum = 0.0f32;
    for &v in &x[vectors * L..] {
        sum += v;
    }
    for v in lanes {
        sum += v;
    }
    sum
}

/// torch's `x.sum()` of the float32 tensor holding `x` (`contiguous`: its
/// elements back to back, else evenly strided), with `lanes` floats per
/// vector; `None` for a width not reproduced or `GRAIN_SIZE` elements or
/// more (reduced in parallel chunks: ask torch).
pub fn torch_sum(x: &[f32], lanes: usize, contiguous: bool) -> Option<f32> {
    if x.len() >= GRAIN_SIZE || !LANES.contains(&lanes) {
        return None;
    }
    let sum = if !contiguous || x.len() < lanes {
        row_sum(|i| x[i], x.len())
    } else {
        match lanes {
            4 => vectorized::<4>(x),
            8 => vectorized::<8>(x),
            _ => vectorized::<16>(x),
        }
    };
    // The output is filled with 0, then the sum added to it.
    Some(0.0 + sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_sums_are_in_order() {
        assert_eq!(torch_sum(&[], 8, true), Some(0.0));
        // Below one vector: the 4 partial sums of (x0 + x4), x1, x2, x3.
        let x = [1.0f32, 2.0f32.powi(-24), 2.0f32.powi(-24), 0.0, -1.0];
        let expected = ((0.0f32 + 1.0 + -1.0) + 2.0f32.powi(-24)) + 2.0f32.powi(-24);
        assert_eq!(torch_sum(&x, 8, true), Some(expected));
        assert_eq!(torch_sum(&vec![1.0; GRAIN_SIZE], 8, true), None);
        assert_eq!(torch_sum(&[1.0], 5, true), None);
    }

    #[test]
    fn ceil_log2_is_torchs() {
        let got: Vec<usize> = [0, 1, 2, 3, 4, 5, 8, 9, 1 << 20, (1 << 20) + 1].map(ceil_log2).to_vec();
        assert_eq!(got, [1, 1, 1, 2, 2, 3, 3, 4, 20, 21]);
    }

    /// The cascade written as the recursion it stands for, for exact
    /// values (small integers: every order gives the same sum).
    #[test]
    fn exact_values_sum_exactly() {
        for n in [
            0usize, 3, 7, 8, 15, 16, 17, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097, 32767,
        ] {
            let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
            let exact: f32 = x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
            for lanes in LANES {
                for contiguous in [true, false] {
                    assert_eq!(torch_sum(&x, lanes, contiguous), Some(exact), "n={n} lanes={lanes}");
                }
            }
        }
    }

    proptest! {
        /// Lane by lane: the vector path is the scalar cascade of each
        /// lane's elements, then the tail and the lanes in order, when
        /// every partial sum is exact (integers far below 2**24).
        #[test]
        fn the_vector_path_is_lanes_of_scalar_sums(x in proptest::collection::vec(-1000i32..1000, 0..3000)) {
            let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let plain: f32 = x.iter().sum();
            prop_assert_eq!(torch_sum(&x, 8, true), Some(plain));
            prop_assert_eq!(torch_sum(&x, 16, false), Some(plain));
        }
    }
}
