//! `needle.Sinkhorn`: the hyper-connections' residual mix `h_res = Sinkhorn(logits)`
//! (upstream `_ScanBody`): `iterations` alternating log-domain normalisations of each
//! `[n, n]` matrix, rows then columns (`x ← x − logsumexp(x)` along the axis), then `exp`.
//!
//! Input `logits` float32 `[…, n, n]`, attribute `iterations`; output float32, same shape.
//! Each half-step is written as onnxruntime's `LogSoftmax` computes it (`(x − max) −
//! ln Σ exp(x − max)`), so the op replaces the stock graph's `2 · iterations` LogSoftmax
//! nodes and its Exp with one kernel: the matrices are tiny (n = the lanes, 3 or 4), and
//! launching 41 nodes a layer cost more than their arithmetic.

/// `out = Sinkhorn(logits)` for every `[n, n]` matrix of `logits`.
pub fn sinkhorn(logits: &[f32], n: usize, iterations: usize, out: &mut [f32]) {
    assert!(
        n > 0 && logits.len().is_multiple_of(n * n),
        "logits are [.., n, n]"
    );
    assert_eq!(out.len(), logits.len(), "out is shaped like logits");
    out.copy_from_slice(logits);
    for matrix in out.chunks_exact_mut(n * n) {
        for _ in 0..iterations {
            for r in 0..n {
                log_normalize(matrix, r * n, 1, n);
            }
            for c in 0..n {
                log_normalize(matrix, c, n, n);
            }
        }
        matrix.iter_mut().for_each(|v| *v = v.exp());
    }
}

/// `x ← (x − max) − ln Σ exp(x − max)` over the `len` elements `start, start + stride, …`.
fn log_normalize(m: &mut [f32], start: usize, stride: usize, len: usize) {
    let at = |i: usize| start + i * stride;
    let max = (0..len).map(|i| m[at(i)]).fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = (0..len).map(|i| (m[at(i)] - max).exp()).sum();
    let log_sum = sum.ln();
    for i in 0..len {
        m[at(i)] = (m[at(i)] - max) - log_sum;
    }
}

#[cfg(test)]
mod tests {
    /// Upstream's recurrence in f64: `log_k − logsumexp(log_k)` along rows, then columns.
    fn reference(logits: &[f32], n: usize, iterations: usize) -> Vec<f64> {
        let mut k: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
        let lse = |v: &[f64]| v.iter().map(|x| x.exp()).sum::<f64>().ln();
        for _ in 0..iterations {
            for r in 0..n {
                let l = lse(&k[r * n..(r + 1) * n]);
                k[r * n..(r + 1) * n].iter_mut().for_each(|x| *x -= l);
            }
            for c in 0..n {
                let column: Vec<f64> = (0..n).map(|r| k[r * n + c]).collect();
                let l = lse(&column);
                (0..n).for_each(|r| k[r * n + c] -= l);
            }
        }
        k.iter().map(|x| x.exp()).collect()
    }

    #[test]
    fn matches_upstreams_recurrence_and_is_doubly_stochastic() {
        for n in [3, 4] {
            let logits: Vec<f32> = (0..2 * n * n)
                .map(|i| ((i * 7919) % 23) as f32 * 0.9 - 9.0)
                .collect();
            let mut out = vec![0.0; logits.len()];
            super::sinkhorn(&logits, n, 20, &mut out);
            for (m, matrix) in out.chunks_exact(n * n).enumerate() {
                let want = reference(&logits[m * n * n..(m + 1) * n * n], n, 20);
                for (got, want) in matrix.iter().zip(&want) {
                    assert!((*got as f64 - want).abs() < 1e-6, "n={n}: {got} vs {want}");
                }
                for c in 0..n {
                    let column: f32 = (0..n).map(|r| matrix[r * n + c]).sum();
                    assert!((column - 1.0).abs() < 1e-5, "column {c} sums to {column}");
                }
            }
        }
    }
}
