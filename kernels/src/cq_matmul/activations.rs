//! The activation side of a CQ product: each token's inputs padded to whole groups,
//! rotated by `H` group by group, and laid out in the order a SIMD path reads codes.
//!
//! A SIMD path widens `lanes` code bytes to `lanes` integer lanes and takes code `s` of
//! every byte with one shift: lane `i`, shift `s` holds the code of input `i·P + s`
//! (`P = 8 / bits` codes per byte). So within each chunk of `lanes · P` inputs the
//! activation is stored shift-major: `xt[s·lanes + i] = (H x)[i·P + s]`.

use super::CqMatrix;
use crate::hadamard;
use crate::isa::Isa;

/// The path a product runs on and the activation order it reads.
pub(super) struct Layout {
    pub isa: Isa,
    /// Float lanes of the path (1 for scalar: natural order).
    lanes: usize,
    /// Codes per byte.
    per_byte: usize,
}

impl Layout {
    /// The widest path up to `isa` that reads `bits`-bit codes whole bytes at a time in
    /// chunks that fit a group (3-bit codes straddle bytes: scalar).
    pub fn new(isa: Isa, bits: usize, group: usize) -> Layout {
        let per_byte = 8 / bits;
        let fits = |lanes: usize| bits != 3 && group.is_multiple_of(lanes * per_byte);
        let (isa, lanes) = match isa {
            Isa::Avx512 if fits(16) => (Isa::Avx512, 16),
            Isa::Avx512 | Isa::Avx2 if fits(8) => (Isa::Avx2, 8),
            _ => (Isa::Scalar, 1),
        };
        Layout {
            isa,
            lanes,
            per_byte,
        }
    }
}

/// The prepared activations `[tokens, groups · group]`.
pub(super) fn prepare(w: &CqMatrix, x: &[f32], tokens: usize, layout: &Layout) -> Vec<f32> {
    let in_pad = w.groups() * w.group;
    let mut out = vec![0.0f32; tokens * in_pad];
    let mut rotated = vec![0.0f32; in_pad];
    for (t, token) in out.chunks_exact_mut(in_pad).enumerate() {
        rotated[..w.cols].copy_from_slice(&x[t * w.cols..(t + 1) * w.cols]);
        rotated[w.cols..].fill(0.0);
        rotated.chunks_exact_mut(w.group).for_each(hadamard::rotate);
        layout.arrange(&rotated, token);
    }
    out
}

impl Layout {
    /// `natural` (one row's or token's padded inputs) into `out` in the order this path
    /// reads codes: the same order for activations and for decoded weights, so a decoded
    /// row's value `i` meets the activation its code would have met.
    pub fn arrange(&self, natural: &[f32], out: &mut [f32]) {
        if self.lanes == 1 {
            out.copy_from_slice(natural);
            return;
        }
        let chunk = self.lanes * self.per_byte;
        for (dst, src) in out.chunks_exact_mut(chunk).zip(natural.chunks_exact(chunk)) {
            for s in 0..self.per_byte {
                for i in 0..self.lanes {
                    dst[s * self.lanes + i] = src[i * self.per_byte + s];
                }
            }
        }
    }
}
