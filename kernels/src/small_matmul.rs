//! `C = A · B` for the small row-major matrices of the fused ops (the Monarch MLP's
//! `32 × 32` factors, its conditioning), written as rows of `C` accumulated `k` by `k` so
//! the compiler vectorizes along `C`'s row. Each element is summed in `k` order on every
//! path; the SIMD paths fuse each multiply-add, so paths differ in rounding only.

use crate::isa::Isa;

/// `c [m, n] = a [m, k] · b [k, n]` on `isa`.
pub fn matmul(isa: Isa, a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(b.len(), k * n, "b is [k, n]");
    matmul_strided(isa, a, (b, n), c, m, k, n);
}

/// [`matmul`] with `b`'s rows `stride` apart: `b` `[k, n]` is columns of a wider matrix
/// (attention's keys, transposed once for a call and read a window at a time).
pub fn matmul_strided(
    isa: Isa,
    a: &[f32],
    (b, stride): (&[f32], usize),
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    assert_eq!(a.len(), m * k, "a is [m, k]");
    assert!(
        stride >= n && (k == 0 || b.len() >= (k - 1) * stride + n),
        "b is [k, n], rows {stride} apart"
    );
    assert_eq!(c.len(), m * n, "c is [m, n]");
    let b = B { data: b, stride };
    match isa {
        Isa::Scalar => rows::<false>(a, &b, c, k, n),
        #[cfg(target_arch = "x86_64")]
        // Sound: `Isa::available` offers the x86 paths only where AVX2 and FMA were detected.
        Isa::Avx2 => unsafe { fused_rows(a, &b, c, k, n) },
        #[cfg(target_arch = "x86_64")]
        // Sound: `Isa::available` offers AVX-512 only where AVX-512F was detected.
        Isa::Avx512 => unsafe { avx512::rows(a, &b, c, k, n) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 path off x86-64"),
    }
}

/// The right-hand matrix: row `l` starts at `l · stride`.
struct B<'a> {
    data: &'a [f32],
    stride: usize,
}

impl B<'_> {
    #[inline(always)]
    fn row(&self, l: usize, n: usize) -> &[f32] {
        &self.data[l * self.stride..l * self.stride + n]
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fused_rows(a: &[f32], b: &B, c: &mut [f32], k: usize, n: usize) {
    rows::<true>(a, b, c, k, n)
}

/// Columns of `C` a pass keeps in registers (4 AVX2 vectors a row).
const TILE: usize = 32;

/// Two rows of `C` at a time, `TILE` columns at a time, each tile's sums in registers over
/// the whole of `k` (summed through memory, each step would wait on the last one's store).
#[inline(always)]
fn rows<const FUSED: bool>(a: &[f32], b: &B, c: &mut [f32], k: usize, n: usize) {
    let mut a_rows = a.chunks_exact(2 * k);
    let mut c_rows = c.chunks_exact_mut(2 * n);
    for (a2, c2) in (&mut a_rows).zip(&mut c_rows) {
        let (a0, a1) = a2.split_at(k);
        let (c0, c1) = c2.split_at_mut(n);
        for col in (0..n).step_by(TILE) {
            let width = TILE.min(n - col);
            let mut sums = [[0.0f32; TILE]; 2];
            for l in 0..k {
                let b_tile = &b.row(l, n)[col..col + width];
                tile_step::<FUSED>(&mut sums[0], a0[l], b_tile);
                tile_step::<FUSED>(&mut sums[1], a1[l], b_tile);
            }
            c0[col..col + width].copy_from_slice(&sums[0][..width]);
            c1[col..col + width].copy_from_slice(&sums[1][..width]);
        }
    }
    for (a_row, c_row) in a_rows
        .remainder()
        .chunks_exact(k)
        .zip(c_rows.into_remainder().chunks_exact_mut(n))
    {
        for col in (0..n).step_by(TILE) {
            let width = TILE.min(n - col);
            let mut sums = [0.0f32; TILE];
            for (l, &a) in a_row.iter().enumerate() {
                tile_step::<FUSED>(&mut sums, a, &b.row(l, n)[col..col + width]);
            }
            c_row[col..col + width].copy_from_slice(&sums[..width]);
        }
    }
}

/// `sums[j] += s · b[j]` over `b`'s width (a whole tile in the common case, a fixed loop
/// the compiler unrolls into registers).
#[inline(always)]
fn tile_step<const FUSED: bool>(sums: &mut [f32; TILE], s: f32, b: &[f32]) {
    let step = |sum: &mut f32, b: f32| {
        *sum = if FUSED {
            s.mul_add(b, *sum)
        } else {
            s * b + *sum
        }
    };
    match <&[f32; TILE]>::try_from(b) {
        Ok(b) => sums.iter_mut().zip(b).for_each(|(sum, &b)| step(sum, b)),
        Err(_) => sums.iter_mut().zip(b).for_each(|(sum, &b)| step(sum, b)),
    }
}

/// The AVX-512 path: eight rows of `C` at a time, 32 columns (two registers) a tile, so
/// sixteen independent sums are in flight (fewer leave the FMA units waiting on each
/// other's latency). Every element is the same `k`-ordered chain of
/// fused multiply-adds as on the AVX2 path: the same bits.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::B;
    use std::arch::x86_64::*;

    /// Rows of `C` a pass takes: sixteen sums in flight (eight left the FMA units waiting
    /// on their latency), ten loads for sixteen multiply-adds.
    const ROWS: usize = 8;

    /// # Safety
    /// The CPU must have AVX-512F; `a` `[m, k]`, `b` `[k, n]`, `c` `[m, n]`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn rows(a: &[f32], b: &B, c: &mut [f32], k: usize, n: usize) {
        let m = c.len() / n.max(1);
        let mut r = 0;
        while r < m {
            // Eight rows, then what is left four and fewer at a time.
            let rows = match m - r {
                left if left >= ROWS => ROWS,
                left => left.min(4),
            };
            for col in (0..n).step_by(32) {
                let width = 32.min(n - col);
                // Lanes of the tile's two registers that hold columns.
                let low = lanes(width.min(16));
                let high = lanes(width.saturating_sub(16));
                match rows {
                    8 => tile::<8>(a, b, c, k, n, r, col, low, high),
                    4 => tile::<4>(a, b, c, k, n, r, col, low, high),
                    3 => tile::<3>(a, b, c, k, n, r, col, low, high),
                    2 => tile::<2>(a, b, c, k, n, r, col, low, high),
                    _ => tile::<1>(a, b, c, k, n, r, col, low, high),
                }
            }
            r += rows;
        }
    }

    fn lanes(count: usize) -> __mmask16 {
        ((1u32 << count) - 1) as __mmask16
    }

    /// Rows `r..r + R`, columns `col..` of the lanes `low` and `high`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize>(
        a: &[f32],
        b: &B,
        c: &mut [f32],
        k: usize,
        n: usize,
        r: usize,
        col: usize,
        low: __mmask16,
        high: __mmask16,
    ) {
        let mut sums = [[_mm512_setzero_ps(); 2]; R];
        // Sound: rows r..r + R of a, k values each, are within `a` (`[m, k]`, r + R ≤ m);
        // read through pointers, since a bounds check a row and step held the FMAs back.
        let a_rows: [*const f32; R] = std::array::from_fn(|i| a.as_ptr().add((r + i) * k));
        for l in 0..k {
            // Sound: row l of b holds columns col.. where the masks have lanes.
            let row = b.data.as_ptr().add(l * b.stride + col);
            let b0 = _mm512_maskz_loadu_ps(low, row);
            let b1 = _mm512_maskz_loadu_ps(high, row.wrapping_add(16));
            for (sum, a_row) in sums.iter_mut().zip(a_rows) {
                // Sound: l < k.
                let s = _mm512_set1_ps(*a_row.add(l));
                sum[0] = _mm512_fmadd_ps(s, b0, sum[0]);
                sum[1] = _mm512_fmadd_ps(s, b1, sum[1]);
            }
        }
        for (i, sum) in sums.iter().enumerate() {
            // Sound: row r + i of c holds columns col.. where the masks have lanes.
            let out = c.as_mut_ptr().add((r + i) * n + col);
            _mm512_mask_storeu_ps(out, low, sum[0]);
            _mm512_mask_storeu_ps(out.wrapping_add(16), high, sum[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AVX-512 sums each element in the same order as AVX2: the same bits, whatever the
    /// rows and columns left over by its tiles.
    #[test]
    fn avx512_is_avx2_bit_for_bit() {
        if !Isa::available().contains(&Isa::Avx512) {
            return;
        }
        for (m, k, n) in [(9, 32, 32), (5, 7, 19), (3, 8, 48), (64, 32, 1024)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let (mut wide, mut narrow) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            matmul(Isa::Avx512, &a, &b, &mut wide, m, k, n);
            matmul(Isa::Avx2, &a, &b, &mut narrow, m, k, n);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&wide), bits(&narrow), "{m} x {k} x {n}");
        }
    }

    #[test]
    fn every_path_is_the_f64_product() {
        let (m, k, n) = (5, 7, 19);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        for isa in Isa::available() {
            let mut c = vec![f32::NAN; m * n];
            matmul(isa, &a, &b, &mut c, m, k, n);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|l| a[i * k + l] as f64 * b[l * n + j] as f64)
                        .sum();
                    let got = c[i * n + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{isa:?} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
