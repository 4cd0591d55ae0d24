//! Weights transposed for the graphs (ONNX's `MatMul` takes `[in, out]`; the `.cact`
//! stores `[out, in]`), in tiles: element by element, each write of a full-size model's
//! projections went to another cache line (13% of `needle-export`'s samples).

/// Rows and columns of a tile: 32 source rows of 32 values are 32 cache lines read
/// whole, and each destination row gets 32 values side by side.
const TILE: usize = 32;

/// `src` (`[rows, cols]`, row-major) transposed into `dst`, whose rows are `stride`
/// long: `dst[c * stride + offset + r] = src[r * cols + c]`.
pub fn transpose_into(
    src: &[f32],
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    stride: usize,
    offset: usize,
) {
    debug_assert_eq!(src.len(), rows * cols);
    debug_assert!(offset + rows <= stride && dst.len() >= cols * stride);
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            for c in c0..(c0 + TILE).min(cols) {
                let line = &mut dst[c * stride + offset..];
                for r in r0..r1 {
                    line[r] = src[r * cols + c];
                }
            }
        }
    }
}

/// `[n, a, c]` row-major → `[n, c, a]`.
pub fn transpose_last(data: &[f32], n: usize, a: usize, c: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * a * c];
    for (src, dst) in data.chunks_exact(a * c).zip(out.chunks_exact_mut(a * c)) {
        transpose_into(src, a, c, dst, a, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes past a tile and not multiples of it, into a wider destination.
    #[test]
    fn moves_every_value_to_its_transposed_place() {
        let (rows, cols, stride, offset) = (45, 70, 60, 9);
        let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let mut dst = vec![-1.0; cols * stride];
        transpose_into(&src, rows, cols, &mut dst, stride, offset);
        for c in 0..cols {
            for j in 0..stride {
                let want = match j.checked_sub(offset) {
                    Some(r) if r < rows => (r * cols + c) as f32,
                    _ => -1.0,
                };
                assert_eq!(dst[c * stride + j], want, "column {c}, place {j}");
            }
        }
    }

    #[test]
    fn transposes_each_matrix_of_a_stack() {
        let data: Vec<f32> = (0..2 * 3 * 4).map(|i| i as f32).collect();
        let out = transpose_last(&data, 2, 3, 4);
        assert_eq!(
            &out[..12],
            &[0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]
        );
        assert_eq!(out[12], 12.0);
        assert_eq!(out[13], 16.0);
    }
}
