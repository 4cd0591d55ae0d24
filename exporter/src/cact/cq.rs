//! Blob decoding: FP16/FP32 as is, and Cactus-Quants (upstream
//! `export._cq_unpack`): per group of `group` inputs,
//! `w = (codebook[idx] * f32(fp16 norm)) @ H`, H the orthonormal
//! Walsh-Hadamard matrix, the padded inputs cut off afterwards.
//!
//! ```text
//! blob = out rows of packed indices (in_pad * index_bits / 8 bytes each,
//!        one LSB-first bitstream per row) | out * in_pad/group FP16 norms
//! ```

use super::codebooks::Codebooks;
use super::directory::{index_bits, padded_in, Encoding, Entry, BINARY_BITS, TERNARY_BITS};
use super::CactError;
use graphs::blocks::weights::CqRows;
pub(crate) use graphs::builder::f16_to_f32;

/// Decodes a float entry's blob to float32, row-major in `entry.shape`.
pub(crate) fn decode(
    entry: &Entry,
    blob: &[u8],
    codebooks: &Codebooks,
) -> Result<Vec<f32>, CactError> {
    let values = match entry.encoding {
        Encoding::Fp16 => blob
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        Encoding::Fp32 => blob
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Encoding::Cq { bits, group } => cq(entry, blob, bits, group as usize, codebooks)?,
        Encoding::Raw => {
            return Err(CactError::Dtype {
                tensor: entry.name.clone(),
                offset: entry.record_offset,
                found: 4,
                expected: "1 (FP16), 2 (FP32) or 3 (CQ)",
            })
        }
    };
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(CactError::NonFinite {
            tensor: entry.name.clone(),
            offset: source_offset(entry, index),
            index,
        });
    }
    Ok(values)
}

/// A CQ entry's codes and norms as stored, checked like [`decode`] checks them (finite
/// norms, no unused ternary crumb) without dequantizing; `None` for another encoding.
pub(crate) fn rows(
    entry: &Entry,
    blob: &[u8],
    codebooks: &Codebooks,
) -> Result<Option<CqRows>, CactError> {
    let Encoding::Cq { bits, group } = entry.encoding else {
        return Ok(None);
    };
    let (out, cols) = (entry.shape[0], entry.shape[1]);
    let group = group as usize;
    let in_pad = cols.div_ceil(group) * group;
    let index_bits = index_bits(bits) as usize;
    let row_bytes = in_pad * index_bits / 8;
    let (codes, norms) = blob.split_at(out * row_bytes);
    let norms: Vec<u16> = norms
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    if let Some(i) = norms.iter().position(|&n| n & 0x7c00 == 0x7c00) {
        let groups = in_pad / group;
        return Err(CactError::NonFinite {
            tensor: entry.name.clone(),
            offset: entry.blob_offset + (out * row_bytes + 2 * i) as u64,
            index: (i / groups) * cols + (i % groups) * group,
        });
    }
    let codebook = if bits == TERNARY_BITS {
        if let Some(byte) = codes
            .iter()
            .position(|&b| (0..4).any(|k| (b >> (2 * k)) & 3 == 2))
        {
            let k = (0..4)
                .find(|k| (codes[byte] >> (2 * k)) & 3 == 2)
                .expect("found above");
            let (row, col) = (byte / row_bytes, (byte % row_bytes) * 4 + k);
            return Err(CactError::TernaryCode {
                tensor: entry.name.clone(),
                offset: entry.blob_offset + byte as u64,
                index: row * cols + col,
            });
        }
        // Crumb 3, 0, 1 stand for the trits -c, 0, +c; crumb 2 is unused (checked above).
        let [minus, zero, plus] = Codebooks::ternary(group as u32);
        vec![zero, plus, 0.0, minus]
    } else {
        codebook(bits, group as u32, codebooks)
    };
    Ok(Some(CqRows {
        rows: out,
        cols,
        group,
        index_bits,
        codes: codes.to_vec(),
        norms,
        codebook,
    }))
}

/// File offset of the stored value element `index` was decoded from: the
/// element itself, or for CQ the norm of its group.
fn source_offset(entry: &Entry, index: usize) -> u64 {
    let start = entry.blob_offset;
    match entry.encoding {
        Encoding::Fp16 => start + 2 * index as u64,
        Encoding::Fp32 => start + 4 * index as u64,
        Encoding::Cq { bits, group } => {
            let (out, in_dim) = (entry.shape[0] as u64, entry.shape[1] as u64);
            let in_pad = padded_in(in_dim, group).unwrap_or(0);
            let groups = in_pad / group as u64;
            let (row, col) = (index as u64 / in_dim, index as u64 % in_dim);
            let norms_start = start + out * in_pad * index_bits(bits) as u64 / 8;
            norms_start + 2 * (row * groups + col / group as u64)
        }
        Encoding::Raw => start,
    }
}

/// The codebook a CQ record decodes with. For 2/3/4 bits this is the one in
/// the file header: upstream `read_export` recomputes it with
/// `_cq_codebook_np(bits, group)` instead, but the writer stores exactly that
/// array (cb / sqrt(group) rounded to f32), so both agree bit for bit (the
/// dequant parity test checks it). Ternary and binary are analytic and not stored.
fn codebook(bits: u32, group: u32, codebooks: &Codebooks) -> Vec<f32> {
    if bits == TERNARY_BITS {
        return Codebooks::ternary(group).to_vec();
    }
    if bits == BINARY_BITS {
        return Codebooks::binary(group).to_vec();
    }
    codebooks.for_bits(bits).unwrap_or_default().to_vec()
}

/// The orthonormal Sylvester Walsh-Hadamard matrix of size `n`, row-major:
/// `H[k][j] = (-1)^popcount(k & j) / sqrt(n)`, the scale computed in f64 and
/// rounded to f32 like upstream `_cq_hadamard_np`.
fn hadamard(n: usize) -> Vec<f32> {
    let h = (1.0 / (n as f64).sqrt()) as f32;
    let mut out = Vec::with_capacity(n * n);
    for k in 0..n {
        for j in 0..n {
            out.push(if (k & j).count_ones().is_multiple_of(2) {
                h
            } else {
                -h
            });
        }
    }
    out
}

/// Index `k` of a row stored as one LSB-first bitstream of `bits`-bit fields.
fn unpack(row: &[u8], k: usize, bits: u32) -> usize {
    let bit = k * bits as usize;
    let lo = row[bit / 8] as u16;
    let hi = row.get(bit / 8 + 1).copied().unwrap_or(0) as u16;
    (((lo | (hi << 8)) >> (bit % 8)) & ((1 << bits) - 1)) as usize
}

fn cq(
    entry: &Entry,
    blob: &[u8],
    bits: u32,
    group: usize,
    codebooks: &Codebooks,
) -> Result<Vec<f32>, CactError> {
    let (out, in_dim) = (entry.shape[0], entry.shape[1]);
    let in_pad = in_dim.div_ceil(group) * group;
    let stored_bits = index_bits(bits);
    let row_bytes = in_pad * stored_bits as usize / 8;
    let (packed, norms) = blob.split_at(out * row_bytes);
    let matrix = CqMatrix {
        entry,
        packed,
        norms,
        bits,
        group,
        row_bytes,
        codebook: codebook(bits, group as u32, codebooks),
        hadamard: hadamard(group),
    };
    let mut w = vec![0f32; out * in_dim];
    matrix.decode(&mut w)?;
    Ok(w)
}

/// One CQ matrix's stored parts and what decoding them needs.
struct CqMatrix<'a> {
    entry: &'a Entry,
    packed: &'a [u8],
    norms: &'a [u8],
    bits: u32,
    group: usize,
    row_bytes: usize,
    codebook: Vec<f32>,
    hadamard: Vec<f32>,
}

impl CqMatrix<'_> {
    /// Decodes every row into `w`, `in_dim` values a row: [`TILE`] groups at a time (a
    /// row's, then the next row's), rotated together.
    fn decode(&self, w: &mut [f32]) -> Result<(), CactError> {
        let group = self.group;
        let in_dim = self.entry.shape[1];
        if in_dim == 0 {
            return Ok(());
        }
        let groups = in_dim.div_ceil(group);
        let pairs = w.len() / in_dim * groups;
        let mut xs = vec![0f32; TILE * group];
        let mut ys = vec![0f32; TILE * group];
        for start in (0..pairs).step_by(TILE) {
            let tile = (pairs - start).min(TILE);
            for (i, x) in xs.chunks_exact_mut(group).take(tile).enumerate() {
                let pair = start + i;
                self.inputs(pair / groups, pair % groups, x)?;
            }
            let n = tile * group;
            rotate(&xs[..n], &self.hadamard, &mut ys[..n], groups == 1);
            for (i, y) in ys.chunks_exact(group).take(tile).enumerate() {
                let (row, g) = ((start + i) / groups, (start + i) % groups);
                let at = g * group;
                let cols = (in_dim - at).min(group);
                w[row * in_dim + at..][..cols].copy_from_slice(&y[..cols]);
            }
        }
        Ok(())
    }

    /// Group `g` of row `r` before the rotation: `codebook[idx] · norm`.
    fn inputs(&self, r: usize, g: usize, x: &mut [f32]) -> Result<(), CactError> {
        let (group, row_bytes) = (self.group, self.row_bytes);
        let in_dim = self.entry.shape[1];
        let groups = in_dim.div_ceil(group);
        let stored_bits = index_bits(self.bits);
        let row = &self.packed[r * row_bytes..(r + 1) * row_bytes];
        let n = 2 * (r * groups + g);
        let norm = f16_to_f32(u16::from_le_bytes([self.norms[n], self.norms[n + 1]]));
        for (k, xk) in x.iter_mut().enumerate() {
            let code = unpack(row, g * group + k, stored_bits);
            let idx = if self.bits == TERNARY_BITS {
                match code {
                    3 => 0,
                    0 => 1,
                    1 => 2,
                    _ => {
                        return Err(CactError::TernaryCode {
                            tensor: self.entry.name.clone(),
                            offset: self.entry.blob_offset
                                + (r * row_bytes + (g * group + k) / 4) as u64,
                            index: r * in_dim + g * group + k,
                        })
                    }
                }
            } else {
                code
            };
            *xk = self.codebook[idx] * norm;
        }
        Ok(())
    }
}

/// Groups rotated together: each output keeps its own FMA chain, and the tile gives the
/// CPU `TILE` × 2 independent chains to overlap (one group's 2 chains wait on the FMA
/// latency) and reuses each Hadamard row it loads `TILE` times.
const TILE: usize = 4;

/// `y = x @ h` for each group of `x` (`h.len()` = n², `x` whole groups of n), each
/// output a float32 sum of fused multiply-adds in the order numpy 2.4's OpenBLAS (x86-64)
/// uses for upstream's `(out, groups, group) @ H`, so the result is bit-identical: with
/// several groups per row numpy calls sgemm, whose kernels run one FMA chain over all of
/// `k`; with a single group the product is vector @ matrix, which numpy hands to sgemv,
/// whose kernel chains 8 terms at a time and adds each 8-term partial sum to `y`. Another
/// BLAS may differ by a few ulps.
fn rotate(x: &[f32], h: &[f32], y: &mut [f32], single_group: bool) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has FMA and AVX2, checked just above.
        return unsafe { rotate_fma(x, h, y, single_group) };
    }
    rotate_body(x, h, y, single_group);
}

/// [`rotate`] compiled with the FMA instruction instead of a libm `fmaf`
/// call per term (same results: a fused multiply-add rounds once either way),
/// and 8 lanes per AVX2 register (each lane keeps its own summation order).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,avx2")]
fn rotate_fma(x: &[f32], h: &[f32], y: &mut [f32], single_group: bool) {
    rotate_body(x, h, y, single_group);
}

/// [`TILE`] groups at a time through [`rotate_tile`], the rest one by one; 16 columns of
/// each in registers, or 8 for the smallest group.
#[inline(always)]
fn rotate_body(x: &[f32], h: &[f32], y: &mut [f32], single_group: bool) {
    let n = h.len().isqrt();
    let tiles = x.len() / (TILE * n);
    let (x_tiles, x_rest) = x.split_at(tiles * TILE * n);
    let (y_tiles, y_rest) = y.split_at_mut(tiles * TILE * n);
    let wide = n.is_multiple_of(16);
    for (xt, yt) in x_tiles
        .chunks_exact(TILE * n)
        .zip(y_tiles.chunks_exact_mut(TILE * n))
    {
        match wide {
            true => rotate_tile::<TILE, 16>(xt, h, yt, n, single_group),
            false => rotate_tile::<TILE, 8>(xt, h, yt, n, single_group),
        }
    }
    for (xg, yg) in x_rest.chunks_exact(n).zip(y_rest.chunks_exact_mut(n)) {
        match wide {
            true => rotate_tile::<1, 16>(xg, h, yg, n, single_group),
            false => rotate_tile::<1, 8>(xg, h, yg, n, single_group),
        }
    }
}

/// `R` groups of `n`, `L` outputs of each at a time, each summed down `k` (see [`rotate`]
/// for the order).
#[inline(always)]
fn rotate_tile<const R: usize, const L: usize>(
    x: &[f32],
    h: &[f32],
    y: &mut [f32],
    n: usize,
    single_group: bool,
) {
    let block = if single_group { 8 } else { n };
    for j0 in (0..n).step_by(L) {
        let mut sum = [[0f32; L]; R];
        for k0 in (0..n).step_by(block) {
            let mut acc = [[0f32; L]; R];
            for k in k0..k0 + block {
                let row: &[f32; L] = h[k * n + j0..][..L].try_into().expect("L columns");
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xk = x[r * n + k];
                    for (a, &hkj) in acc.iter_mut().zip(row) {
                        *a = xk.mul_add(hkj, *a);
                    }
                }
            }
            for (sum, acc) in sum.iter_mut().zip(acc) {
                for (s, a) in sum.iter_mut().zip(acc) {
                    *s += a;
                }
            }
        }
        for (r, sum) in sum.iter().enumerate() {
            y[r * n + j0..][..L].copy_from_slice(sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_special_values() {
        for (h, f) in [
            (0x0000, 0.0),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x7bff, 65504.0),
            (0x0001, 2f32.powi(-24)),
            (0x03ff, 1023.0 * 2f32.powi(-24)),
            (0x0400, 2f32.powi(-14)),
            (0x3555, 0.333_251_95),
        ] {
            assert_eq!(f16_to_f32(h), f, "{h:#06x}");
        }
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    /// The summation order of [`rotate`], written the plain way.
    fn reference(x: &[f32], h: &[f32], single_group: bool) -> Vec<f32> {
        let n = x.len();
        let block = if single_group { 8 } else { n };
        (0..n)
            .map(|j| {
                let mut y = 0f32;
                for k0 in (0..n).step_by(block) {
                    let mut acc = 0f32;
                    for k in k0..k0 + block {
                        acc = x[k].mul_add(h[k * n + j], acc);
                    }
                    y += acc;
                }
                y
            })
            .collect()
    }

    #[test]
    fn rotate_matches_its_definition_for_every_group_size() {
        for n in [8, 16, 32, 64, 128, 256, 1024] {
            let h = hadamard(n);
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 113) as f32 - 56.0) * 0.013)
                .collect();
            for single_group in [true, false] {
                // Alone, and as each of 7 groups rotated at once (a tile and the rest).
                let mut y = vec![f32::NAN; n];
                rotate(&x, &h, &mut y, single_group);
                let want = reference(&x, &h, single_group);
                assert_eq!(y, want, "n={n} single={single_group}");
                let groups: Vec<Vec<f32>> = (0..7)
                    .map(|g| x.iter().map(|v| v * (g as f32 - 3.0)).collect())
                    .collect();
                let xs = groups.concat();
                let mut ys = vec![f32::NAN; xs.len()];
                rotate(&xs, &h, &mut ys, single_group);
                for (g, (group, y)) in groups.iter().zip(ys.chunks_exact(n)).enumerate() {
                    assert_eq!(y, reference(group, &h, single_group), "n={n} group {g}");
                }
            }
        }
    }

    #[test]
    fn hadamard_is_orthonormal() {
        let n = 16;
        let h = hadamard(n);
        for a in 0..n {
            for b in 0..n {
                let dot: f32 = (0..n).map(|k| h[a * n + k] * h[b * n + k]).sum();
                assert!((dot - f32::from(a == b)).abs() < 1e-6);
            }
        }
    }
}
