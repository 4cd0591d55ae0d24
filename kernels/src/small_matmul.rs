//! `C = A · B` for the small row-major matrices of the fused ops (the Monarch MLP's
//! `32 × 32` factors, its conditioning), written as rows of `C` accumulated `k` by `k` so
//! the compiler vectorizes along `C`'s row. Each element is summed in `k` order on every
//! path; the SIMD paths fuse each multiply-add, so paths differ in rounding only.

use crate::isa::Isa;

/// `c [m, n] = a [m, k] · b [k, n]` on `isa`.
pub fn matmul(isa: Isa, a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(a.len(), m * k, "a is [m, k]");
    assert_eq!(b.len(), k * n, "b is [k, n]");
    assert_eq!(c.len(), m * n, "c is [m, n]");
    match isa {
        Isa::Scalar => rows::<false>(a, b, c, k, n),
        #[cfg(target_arch = "x86_64")]
        // Sound: `Isa::available` offers the x86 paths only where AVX2 and FMA were detected.
        Isa::Avx2 | Isa::Avx512 => unsafe { fused_rows(a, b, c, k, n) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 path off x86-64"),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fused_rows(a: &[f32], b: &[f32], c: &mut [f32], k: usize, n: usize) {
    rows::<true>(a, b, c, k, n)
}

/// Columns of `C` a pass keeps in registers (4 AVX2 vectors a row).
const TILE: usize = 32;

/// Two rows of `C` at a time, `TILE` columns at a time, each tile's sums in registers over
/// the whole of `k` (summed through memory, each step would wait on the last one's store).
#[inline(always)]
fn rows<const FUSED: bool>(a: &[f32], b: &[f32], c: &mut [f32], k: usize, n: usize) {
    let mut a_rows = a.chunks_exact(2 * k);
    let mut c_rows = c.chunks_exact_mut(2 * n);
    for (a2, c2) in (&mut a_rows).zip(&mut c_rows) {
        let (a0, a1) = a2.split_at(k);
        let (c0, c1) = c2.split_at_mut(n);
        for col in (0..n).step_by(TILE) {
            let width = TILE.min(n - col);
            let mut sums = [[0.0f32; TILE]; 2];
            for (l, b_row) in b.chunks_exact(n).enumerate() {
                let b_tile = &b_row[col..col + width];
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
            for (l, b_row) in b.chunks_exact(n).enumerate() {
                tile_step::<FUSED>(&mut sums, a_row[l], &b_row[col..col + width]);
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

#[cfg(test)]
mod tests {
    use super::*;

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
