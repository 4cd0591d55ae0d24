//! The activation side of a CQ product: each token's inputs padded to whole groups,
//! rotated by `H` group by group, and laid out in the order a SIMD path reads codes
//! ([`Order`]), so the path's looked-up codebook values meet their inputs lane by lane.

use super::{Aligned, CqMatrix, NIBBLE_CHUNK};
use crate::hadamard;
use crate::isa::Isa;
use crate::math::inverse_root_mean_square;
use crate::split::{token_blocks, RowSplit, TokenRun};

/// The path a product runs on and the activation order it reads.
pub(super) struct Layout {
    pub isa: Isa,
    order: Order,
}

/// Where a path reads each input of a chunk.
enum Order {
    /// As the inputs come (the scalar path).
    Natural,
    /// `lanes` code bytes widened to lanes, code `s` of every byte taken by one shift:
    /// within each chunk of `lanes · per_byte` inputs, `xt[s·lanes + i] = (H x)[i·per_byte + s]`.
    ShiftMajor { lanes: usize, per_byte: usize },
    /// The AVX2 4-bit lookup (`avx2.rs`): within each 8 inputs, element `e` holds input
    /// `2(e mod 4) + e / 4`.
    NibblePairs,
}

impl Layout {
    /// The widest path up to `isa` that reads `bits`-bit codes whole bytes at a time in
    /// chunks that fit a group (3-bit codes straddle bytes: scalar).
    pub fn new(isa: Isa, bits: usize, group: usize) -> Layout {
        let per_byte = 8 / bits;
        let fits = |lanes: usize| bits != 3 && group.is_multiple_of(lanes * per_byte);
        let (isa, order) = match isa {
            Isa::Avx512 if fits(16) => (
                Isa::Avx512,
                Order::ShiftMajor {
                    lanes: 16,
                    per_byte,
                },
            ),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx2 if bits == 4 && group.is_multiple_of(NIBBLE_CHUNK) => {
                (Isa::Avx2, Order::NibblePairs)
            }
            Isa::Avx512 | Isa::Avx2 if bits < 3 && fits(8) => {
                (Isa::Avx2, Order::ShiftMajor { lanes: 8, per_byte })
            }
            _ => (Isa::Scalar, Order::Natural),
        };
        Layout { isa, order }
    }
}

/// The prepared activations `[tokens, groups · group]`, each token's row scaled first,
/// starting on a cache line; runs of tokens spread by `split` (on one thread the
/// rotation of a 2048-wide stream was a third of its 24-row projection's time).
pub(super) fn prepare(
    w: &CqMatrix,
    x: &[f32],
    tokens: usize,
    scale: RowScale,
    layout: &Layout,
    split: &dyn RowSplit,
) -> Aligned {
    let in_pad = w.groups() * w.group;
    // Every token's padded inputs are written below.
    let mut out = Aligned::reused(&super::PREPARED, tokens * in_pad);
    let work = PrepareRun {
        w,
        x,
        scale,
        layout,
    };
    token_blocks(split, out.as_mut_slice(), in_pad, BLOCK_TOKENS, work);
    out
}

/// [`prepare`] of a run of tokens.
struct PrepareRun<'a> {
    w: &'a CqMatrix<'a>,
    x: &'a [f32],
    scale: RowScale<'a>,
    layout: &'a Layout,
}

impl TokenRun for PrepareRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, block: &mut [f32]) {
        let (w, in_pad) = (self.w, self.w.groups() * self.w.group);
        let mut rotated = Aligned::reused(&super::BLOCK_SCRATCH, in_pad);
        let rotated = rotated.as_mut_slice();
        for (t, token) in (first..).zip(block.chunks_exact_mut(in_pad)) {
            self.scale.write(
                &self.x[t * w.cols..(t + 1) * w.cols],
                &mut rotated[..w.cols],
            );
            rotated[w.cols..].fill(0.0);
            self.layout.rotate_arrange(rotated, w.group, token);
        }
    }
}

/// Tokens a thread prepares at once.
const BLOCK_TOKENS: usize = 16;

/// How each row of `x` is scaled before the product: divided by its root mean square
/// (upstream `_rms_unit`) where `unit_rows`, then times `gain` (`[cols]`) where given; an
/// RMS norm with that gain, or the hyper-connections' unit rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct RowScale<'a> {
    pub unit_rows: bool,
    pub gain: Option<&'a [f32]>,
}

impl RowScale<'_> {
    /// `out = x` scaled, in one pass (`x · (1 / root) · gain`, each step only where asked).
    #[inline(always)]
    fn write(&self, x: &[f32], out: &mut [f32]) {
        let inverse = self.unit_rows.then(|| inverse_root_mean_square(x));
        match (inverse, self.gain) {
            (Some(inverse), Some(gain)) => {
                for ((o, &v), &g) in out.iter_mut().zip(x).zip(gain) {
                    *o = v * inverse * g;
                }
            }
            (Some(inverse), None) => out.iter_mut().zip(x).for_each(|(o, &v)| *o = v * inverse),
            (None, Some(gain)) => {
                for ((o, &v), &g) in out.iter_mut().zip(x).zip(gain) {
                    *o = v * g;
                }
            }
            (None, None) => out.copy_from_slice(x),
        }
    }
}

impl Layout {
    /// `natural` (one token's padded inputs) rotated by `H` group by group in place, then
    /// [`Layout::arrange`]d into `out`. The AVX-512 path does both in vectors (the same
    /// butterflies in the same order, so the same bits): the scalar rotation and arrangement
    /// took a sixth of a 128-token product of 1536 inputs, 5× as long.
    fn rotate_arrange(&self, natural: &mut [f32], group: usize, out: &mut [f32]) {
        match (self.isa, &self.order) {
            #[cfg(target_arch = "x86_64")]
            // Sound: a layout picks AVX-512 only where `Isa::available` detected it, and
            // only for groups that hold whole chunks of 16 · `per_byte` inputs.
            (Isa::Avx512, &Order::ShiftMajor { per_byte, .. }) => unsafe {
                super::avx512::rotate_arrange(natural, group, per_byte, out)
            },
            _ => {
                natural.chunks_exact_mut(group).for_each(hadamard::rotate);
                self.arrange(natural, out);
            }
        }
    }

    /// `natural` (one row's or token's padded inputs) into `out` in the order this path
    /// reads codes: the same order for activations and for decoded weights, so a decoded
    /// row's value `i` meets the activation its code would have met.
    pub fn arrange(&self, natural: &[f32], out: &mut [f32]) {
        match self.order {
            Order::Natural => out.copy_from_slice(natural),
            Order::ShiftMajor { lanes, per_byte } => {
                let chunk = lanes * per_byte;
                for (dst, src) in out.chunks_exact_mut(chunk).zip(natural.chunks_exact(chunk)) {
                    for s in 0..per_byte {
                        for i in 0..lanes {
                            dst[s * lanes + i] = src[i * per_byte + s];
                        }
                    }
                }
            }
            Order::NibblePairs => {
                for (dst, src) in out.chunks_exact_mut(8).zip(natural.chunks_exact(8)) {
                    for (e, value) in dst.iter_mut().enumerate() {
                        *value = src[2 * (e % 4) + e / 4];
                    }
                }
            }
        }
    }
}
