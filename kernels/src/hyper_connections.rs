//! The manifold hyper-connections around a layer's block, each side in one kernel (the
//! stock graph runs ~10 nodes a side; `graphs/src/blocks/hyper_connections.rs` states the
//! formulas). Per token, from the stream `x` `[n, C]` and the layer's `2n + n²` mixing
//! logits `l` (the projection of the normalised stream, before its gains `a` and bias `b`):
//!
//! ```text
//! m = a·l + b = [pre (n), post (n), res (n·n)]
//! into the block:   u = Σᵢ σ(preᵢ) · xᵢ
//! out of the block: x'ᵢ = Σⱼ Sinkhorn(res)ᵢⱼ · xⱼ + 2σ(postᵢ) · (block(u) − u)
//! ```
//! Each token's result depends on that token alone, in one order whatever the batch.

use crate::isa::Isa;
use crate::math::exp;
use crate::sinkhorn::sinkhorn;
use crate::split::{token_blocks, RowSplit, TokenRun};
use crate::ShapeError;

/// Tokens a thread takes at once.
const BLOCK_TOKENS: usize = 64;

/// A layer's mixing logits for a run of tokens and what turns them into mixes.
#[derive(Clone, Copy, Debug)]
pub struct LaneMix<'a> {
    lanes: usize,
    /// `[tokens, 2n + n²]`, before the gains and bias.
    logits: &'a [f32],
    /// `[2n + n²]` each.
    gains: &'a [f32],
    bias: &'a [f32],
}

impl<'a> LaneMix<'a> {
    pub fn new(
        lanes: usize,
        logits: &'a [f32],
        gains: &'a [f32],
        bias: &'a [f32],
    ) -> Result<Self, ShapeError> {
        if lanes > MAX_LANES {
            return Err(ShapeError(format!(
                "{lanes} lanes: at most {MAX_LANES} are supported"
            )));
        }
        let width = 2 * lanes + lanes * lanes;
        if lanes == 0 || gains.len() != width || bias.len() != width {
            return Err(ShapeError(format!(
                "{lanes} lanes need {width} gains and biases, not {} and {}",
                gains.len(),
                bias.len()
            )));
        }
        if !logits.len().is_multiple_of(width) {
            return Err(ShapeError(format!(
                "logits hold {} values, not a multiple of {width}",
                logits.len()
            )));
        }
        Ok(LaneMix {
            lanes,
            logits,
            gains,
            bias,
        })
    }

    pub fn tokens(&self) -> usize {
        self.logits.len() / self.width()
    }

    fn width(&self) -> usize {
        2 * self.lanes + self.lanes * self.lanes
    }

    /// `a·l + b` of token `t`'s logits `range`.
    fn mixed(&self, t: usize, range: std::ops::Range<usize>, out: &mut [f32]) {
        let at = t * self.width();
        for (((out, &l), &a), &b) in out
            .iter_mut()
            .zip(&self.logits[at + range.start..at + range.end])
            .zip(&self.gains[range.clone()])
            .zip(&self.bias[range])
        {
            *out = l * a + b;
        }
    }
}

/// The block's input `u` `[tokens, C]` from the stream `x` `[tokens, n, C]`.
pub fn block_input(mix: &LaneMix, x: &[f32], u: &mut [f32], split: &dyn RowSplit) {
    let (n, tokens) = (mix.lanes, mix.tokens());
    let width = u.len() / tokens.max(1);
    assert_eq!(u.len(), tokens * width, "u is [tokens, C]");
    assert_eq!(x.len(), tokens * n * width, "x is [tokens, n, C]");
    token_blocks(split, u, width, BLOCK_TOKENS, InputRun { mix, x });
}

/// [`block_input`] of a run of tokens.
struct InputRun<'a> {
    mix: &'a LaneMix<'a>,
    x: &'a [f32],
}

impl TokenRun for InputRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, block: &mut [f32]) {
        let stream = self.x.len() / self.mix.tokens();
        let width = stream / self.mix.lanes;
        for (t, u) in (first..).zip(block.chunks_exact_mut(width)) {
            token_input(self.mix, t, &self.x[t * stream..(t + 1) * stream], u);
        }
    }
}

/// `u` of token `t` from its stream `x` `[n, C]`.
#[inline(always)]
fn token_input(mix: &LaneMix, t: usize, x: &[f32], u: &mut [f32]) {
    let mut pre = [0.0f32; MAX_LANES];
    let pre = &mut pre[..mix.lanes];
    mix.mixed(t, 0..mix.lanes, pre);
    u.fill(0.0);
    for (lane, &logit) in x.chunks_exact(u.len()).zip(pre.iter()) {
        let weight = sigmoid(logit);
        u.iter_mut().zip(lane).for_each(|(u, &x)| *u += weight * x);
    }
}

/// The next stream `[tokens, n, C]` from the stream `x`, the block's output `out` and
/// input `u` (`[tokens, C]` each), the residual mix normalised by `iterations` Sinkhorn
/// steps, on `isa`.
#[allow(clippy::too_many_arguments)]
pub fn stream_update(
    mix: &LaneMix,
    x: &[f32],
    out: &[f32],
    u: &[f32],
    iterations: usize,
    next: &mut [f32],
    isa: Isa,
    split: &dyn RowSplit,
) {
    let (n, tokens) = (mix.lanes, mix.tokens());
    let width = u.len() / tokens.max(1);
    assert_eq!(u.len(), tokens * width, "u is [tokens, C]");
    assert_eq!(out.len(), u.len(), "out is [tokens, C]");
    assert_eq!(x.len(), tokens * n * width, "x is [tokens, n, C]");
    assert_eq!(next.len(), x.len(), "next is [tokens, n, C]");
    let stream = n * width;
    let work = UpdateRun {
        mix,
        x,
        all: BlockOutput { out, u },
        iterations,
        isa,
    };
    token_blocks(split, next, stream, BLOCK_TOKENS, work);
}

/// [`stream_update`] of a run of tokens (`all` holds every token's block output).
struct UpdateRun<'a> {
    mix: &'a LaneMix<'a>,
    x: &'a [f32],
    all: BlockOutput<'a>,
    iterations: usize,
    isa: Isa,
}

impl TokenRun for UpdateRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, block: &mut [f32]) {
        let (mix, all) = (self.mix, &self.all);
        let (n, tokens) = (mix.lanes, mix.tokens());
        let stream = self.x.len() / tokens;
        // The block's residual mixes first, normalised side by side.
        let count = block.len() / stream;
        let mut res = vec![0.0f32; count * n * n];
        for (t, res) in (first..).zip(res.chunks_exact_mut(n * n)) {
            mix.mixed(t, 2 * n..mix.width(), res);
        }
        let mut h_res = vec![0.0f32; res.len()];
        sinkhorn(self.isa, &res, n, self.iterations, &mut h_res);
        let per_token = block
            .chunks_exact_mut(stream)
            .zip(h_res.chunks_exact(n * n));
        for (t, (next, h_res)) in (first..).zip(per_token) {
            let token = |v: &[f32]| -> std::ops::Range<usize> {
                t * v.len() / tokens..(t + 1) * v.len() / tokens
            };
            let block_output = BlockOutput {
                out: &all.out[token(all.out)],
                u: &all.u[token(all.u)],
            };
            token_update(mix, t, &self.x[token(self.x)], block_output, h_res, next);
        }
    }
}

/// The most lanes a stream has (Needle uses 3 or 4).
const MAX_LANES: usize = 8;

/// A token's block input `u` and output `out`, `[C]` each.
struct BlockOutput<'a> {
    out: &'a [f32],
    u: &'a [f32],
}

/// The next stream `[n, C]` of token `t` from its stream `x` and its residual mix `h_res`
/// `[n, n]`: each value `0 + Σⱼ h·xⱼ + h_post·(o − u)`, summed in that order.
#[inline(always)]
fn token_update(
    mix: &LaneMix,
    t: usize,
    x: &[f32],
    block: BlockOutput,
    h_res: &[f32],
    next: &mut [f32],
) {
    let n = mix.lanes;
    let mut post = [0.0f32; MAX_LANES];
    mix.mixed(t, n..2 * n, &mut post[..n]);
    // A loop, not `array::map`: its closure is compiled on its own, for the baseline, where
    // `exp`'s fused steps are calls to `fmaf` (~0.5% of a Needle 2 prompt).
    let mut h_post = [0.0f32; MAX_LANES];
    for (h, &p) in h_post.iter_mut().zip(&post[..n]) {
        *h = 2.0 * sigmoid(p);
    }
    match n {
        // One pass over the values for the lane counts Needle has, each read once (a pass
        // a lane and term read the stream n + 2 times a lane).
        3 => lanes_update::<3>(x, &block, h_res, &h_post, next),
        4 => lanes_update::<4>(x, &block, h_res, &h_post, next),
        _ => {
            let width = block.u.len();
            for ((lane, h_row), &h_post) in next
                .chunks_exact_mut(width)
                .zip(h_res.chunks_exact(n))
                .zip(&h_post)
            {
                lane.fill(0.0);
                for (x_j, &h) in x.chunks_exact(width).zip(h_row) {
                    lane.iter_mut().zip(x_j).for_each(|(v, &x)| *v += h * x);
                }
                for ((v, &o), &u) in lane.iter_mut().zip(block.out).zip(block.u) {
                    *v += h_post * (o - u);
                }
            }
        }
    }
}

/// [`token_update`] of `N` lanes in one pass: the same sums in the same order.
#[inline(always)]
fn lanes_update<const N: usize>(
    x: &[f32],
    block: &BlockOutput,
    h_res: &[f32],
    h_post: &[f32; MAX_LANES],
    next: &mut [f32],
) {
    let width = block.u.len();
    assert!(x.len() == N * width && next.len() == N * width && block.out.len() == width);
    assert_eq!(h_res.len(), N * N, "h_res is [n, n]");
    let xs: [&[f32]; N] = std::array::from_fn(|j| &x[j * width..(j + 1) * width]);
    let h: [[f32; N]; N] = std::array::from_fn(|i| std::array::from_fn(|j| h_res[i * N + j]));
    let mut lanes = next.chunks_exact_mut(width);
    let outs: [&mut [f32]; N] = std::array::from_fn(|_| lanes.next().expect("n lanes"));
    for c in 0..width {
        let update = block.out[c] - block.u[c];
        for i in 0..N {
            let mut sum = 0.0f32;
            for j in 0..N {
                sum += h[i][j] * xs[j][c];
            }
            outs[i][c] = sum + h_post[i] * update;
        }
    }
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    const N: usize = 3;
    const C: usize = 5;
    const TOKENS: usize = 2;
    const WIDTH: usize = 2 * N + N * N;

    fn values(len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * scale)
            .collect()
    }

    fn sigmoid64(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// Both sides against the formulas in f64, with no Sinkhorn step (so `h_res = exp(res)`:
    /// the Sinkhorn kernel has its own test against upstream's recurrence), for lane counts
    /// with a one-pass update (3, 4) and without (2).
    #[test]
    fn both_sides_match_the_formulas() {
        for n in [2, N, 4] {
            both_sides_match_the_formulas_with(n);
        }
    }

    fn both_sides_match_the_formulas_with(n: usize) {
        let width = 2 * n + n * n;
        let (logits, gains, bias) = (
            values(TOKENS * width, 0.1),
            values(width, 0.07),
            values(width, 0.05),
        );
        let mix = LaneMix::new(n, &logits, &gains, &bias).unwrap();
        let (x, out) = (values(TOKENS * n * C, 0.3), values(TOKENS * C, 0.2));
        let mut u = vec![f32::NAN; TOKENS * C];
        block_input(&mix, &x, &mut u, &Serial);
        let mut next = vec![f32::NAN; x.len()];
        stream_update(&mix, &x, &out, &u, 0, &mut next, Isa::best(), &Serial);
        for t in 0..TOKENS {
            let m = |i: usize| logits[t * width + i] as f64 * gains[i] as f64 + bias[i] as f64;
            let x = |i: usize, c: usize| x[(t * n + i) * C + c] as f64;
            for c in 0..C {
                let want_u: f64 = (0..n).map(|i| sigmoid64(m(i)) * x(i, c)).sum();
                assert!(
                    (u[t * C + c] as f64 - want_u).abs() < 1e-6,
                    "{n} lanes: u[{t}, {c}]"
                );
                for i in 0..n {
                    let mixed: f64 = (0..n).map(|j| m(2 * n + i * n + j).exp() * x(j, c)).sum();
                    let update = 2.0 * sigmoid64(m(n + i)) * (out[t * C + c] - u[t * C + c]) as f64;
                    let got = next[(t * n + i) * C + c] as f64;
                    let what = format!("{n} lanes: next[{t}, {i}, {c}]");
                    assert!((got - (mixed + update)).abs() < 1e-5, "{what}");
                }
            }
        }
    }

    #[test]
    fn mixes_of_the_wrong_width_are_refused() {
        let logits = values(WIDTH, 0.1);
        let error = LaneMix::new(N, &logits, &logits[1..], &logits).unwrap_err();
        assert_eq!(error.0, "3 lanes need 15 gains and biases, not 14 and 15");
        let error = LaneMix::new(N, &logits[1..], &logits, &logits).unwrap_err();
        assert_eq!(error.0, "logits hold 14 values, not a multiple of 15");
    }
}
