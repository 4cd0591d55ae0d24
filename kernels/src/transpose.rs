//! Matrix transposition for the kernels that turn rows into columns: a prompt's tokens into
//! CQ panels (tokens in lanes), attention's keys into the columns of a product. One value
//! at a time, every write of a long row went to another cache line; AVX-512 moves whole
//! 16 × 16 blocks through registers.

use crate::isa::Isa;

/// A row-major matrix view: `rows × cols` values, row `r` starting at `r · stride`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub stride: usize,
}

/// `dst[c · dst_stride + r] = src[r, c]` for `rows × cols` values of `src`.
pub(crate) fn transpose(
    isa: Isa,
    src: Strided,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        src.stride >= cols && src.data.len() >= (rows - 1) * src.stride + cols,
        "src holds {rows} rows of {cols}"
    );
    assert!(
        dst_stride >= rows && dst.len() >= (cols - 1) * dst_stride + rows,
        "dst holds {cols} rows of {rows}"
    );
    let (full_rows, full_cols) = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => (rows / 16 * 16, cols / 16 * 16),
        _ => (0, 0),
    };
    #[cfg(target_arch = "x86_64")]
    for r in (0..full_rows).step_by(16) {
        for c in (0..full_cols).step_by(16) {
            // Sound: AVX-512 is chosen only where `Isa::available` detected it, and the
            // block's 16 rows of 16 lie within both matrices (checked above).
            unsafe {
                avx512::block(
                    src.data.as_ptr().add(r * src.stride + c),
                    src.stride,
                    dst.as_mut_ptr().add(c * dst_stride + r),
                    dst_stride,
                )
            };
        }
    }
    // What the blocks leave: the columns past them in every row, and the rows below them.
    let mut scalar = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
        for r in rows {
            let row = &src.data[r * src.stride..];
            for c in cols.clone() {
                dst[c * dst_stride + r] = row[c];
            }
        }
    };
    scalar(0..full_rows, full_cols..cols);
    scalar(full_rows..rows, 0..cols);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// One 16 × 16 block: pairs of rows interleaved by 32, then 64 bits within each
    /// 128-bit lane, then the lanes gathered by two rounds of 128-bit shuffles.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; 16 rows of 16 values from `src` (`src_stride` apart)
    /// and to `dst` (`dst_stride` apart) are within their buffers.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn block(
        src: *const f32,
        src_stride: usize,
        dst: *mut f32,
        dst_stride: usize,
    ) {
        let r: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(src.add(i * src_stride)));
        // t[2p] = rows 2p, 2p+1 interleaved by their elements 0, 1 (of each lane); t[2p+1]
        // by 2, 3.
        let t: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        // u[4q + e] = element e of each lane for rows 4q..4q+4.
        let u: [__m512; 16] = std::array::from_fn(|i| {
            let (q, e) = (i / 4, i % 4);
            let (a, b) = (t[4 * q + e / 2], t[4 * q + 2 + e / 2]);
            if e % 2 == 0 {
                _mm512_shuffle_ps::<0x44>(a, b)
            } else {
                _mm512_shuffle_ps::<0xEE>(a, b)
            }
        });
        // v[e] (rows 0–7) and w[e] (rows 8–15): lanes 0 and 2 of each, then 1 and 3.
        let half = |first: usize, e: usize, odd: bool| {
            let (a, b) = (u[first + e], u[first + 4 + e]);
            if odd {
                _mm512_shuffle_f32x4::<0xDD>(a, b)
            } else {
                _mm512_shuffle_f32x4::<0x88>(a, b)
            }
        };
        for e in 0..4 {
            for odd in [false, true] {
                let (v, w) = (half(0, e, odd), half(8, e, odd));
                // Columns e + 4·odd and e + 4·odd + 8.
                let column = e + 4 * usize::from(odd);
                _mm512_storeu_ps(
                    dst.add(column * dst_stride),
                    _mm512_shuffle_f32x4::<0x88>(v, w),
                );
                _mm512_storeu_ps(
                    dst.add((column + 8) * dst_stride),
                    _mm512_shuffle_f32x4::<0xDD>(v, w),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path against the definition, on shapes with and without whole blocks.
    #[test]
    fn every_path_transposes() {
        for isa in Isa::available() {
            for (rows, cols) in [(16, 16), (37, 50), (5, 64), (64, 3), (33, 17)] {
                let stride = cols + 3;
                let src: Vec<f32> = (0..rows * stride).map(|i| i as f32).collect();
                let dst_stride = rows + 2;
                let mut dst = vec![f32::NAN; cols * dst_stride];
                let view = Strided { data: &src, stride };
                transpose(isa, view, rows, cols, &mut dst, dst_stride);
                for r in 0..rows {
                    for c in 0..cols {
                        assert_eq!(
                            dst[c * dst_stride + r],
                            src[r * stride + c],
                            "{} {rows} × {cols} at ({r}, {c})",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}
