//! `needle.ProbePool`: a probe head's pooling (upstream `probe_pool`, what
//! `graphs/src/needle3/confidence.rs` states) over the hidden cells, in one kernel where
//! the stock graph runs ~35 nodes, reading each layer's cells where they are (stacking
//! them first cost a copy of them all and two nodes a layer).
//! Per batch row, `cells[t, l]` the cell of layer `l` (the embedding's first) at token `t`:
//!
//! ```text
//! a[l,k,·] = softmax_t(cells[t,l]·probes[l,k] / √d)   (tokens not kept: −∞)
//! r[l,k] = rms_unit(Σ_t a[l,k,t]·cells[t,l]) · gain[l,k]
//! w[q,·] = softmax_(l,k)(r[l,k]·query[q] / √d + row_bias[q,l,k])      out[q] = Σ_(l,k) w[q,l,k]·r[l,k]
//! ```
//!
//! The softmax over the tokens is kept as a running sum ([`PoolState`]), so a sequence
//! fed in several calls (a prompt, then one token a step) pools as if fed whole: each
//! call starts from the state the previous one left, and the head's output needs no
//! second forward over the prompt and the answer.

use crate::isa::Isa;
use crate::math::{dot, exp, softmax, RMS_EPSILON};
use crate::ShapeError;

/// One call's cells and which tokens are real.
#[derive(Clone, Debug)]
pub struct Cells<'a> {
    /// Each layer's `[batch, sequence, d]`, the embedding's first.
    pub layers: Vec<&'a [f32]>,
    /// `[batch, sequence]`, non-zero for a kept token.
    pub keep: &'a [i64],
    pub batch: usize,
    pub sequence: usize,
}

/// A head's pooling weights.
#[derive(Clone, Copy, Debug)]
pub struct ProbeWeights<'a> {
    /// `[layers, k, d]`.
    pub probes: &'a [f32],
    /// `[layers, k]`.
    pub gain: &'a [f32],
    /// `[q, d]`.
    pub query: &'a [f32],
    /// `[q, layers, k]`.
    pub row_bias: &'a [f32],
    pub layers: usize,
    pub k: usize,
    pub d: usize,
}

impl ProbeWeights<'_> {
    /// The head's query count `q`, every size checked against `cells`.
    pub fn queries(&self, cells: &Cells) -> Result<usize, ShapeError> {
        let (l, k, d) = (self.layers, self.k, self.d);
        let q = self.query.len().checked_div(d).unwrap_or(0);
        let fits = l * k * d > 0
            && self.probes.len() == l * k * d
            && self.gain.len() == l * k
            && q > 0
            && self.query.len() == q * d
            && self.row_bias.len() == q * l * k;
        if !fits {
            return Err(ShapeError(format!(
                "probes {}, gain {}, query {} and row_bias {} values are not [{l}, {k}, {d}], \
                 [{l}, {k}], [q, {d}] and [q, {l}, {k}]",
                self.probes.len(),
                self.gain.len(),
                self.query.len(),
                self.row_bias.len()
            )));
        }
        let tokens = cells.batch * cells.sequence;
        let fit = |layer: &&[f32]| layer.len() == tokens * d;
        if cells.layers.len() != l || !cells.layers.iter().all(fit) || cells.keep.len() != tokens {
            return Err(ShapeError(format!(
                "cells of {:?} values and keep of {} are not {l} times [{}, {}, {d}] and [{}, {}]",
                cells.layers.iter().map(|c| c.len()).collect::<Vec<_>>(),
                cells.keep.len(),
                cells.batch,
                cells.sequence,
                cells.batch,
                cells.sequence
            )));
        }
        Ok(q)
    }

    /// The values of one batch row's [`PoolState`]: `layers · k` pools of `d + 2`.
    pub fn state_len(&self) -> usize {
        self.layers * self.k * (self.d + 2)
    }
}

/// The running pools of the tokens seen so far, `[batch, layers · k, d + 2]`: per pool
/// (layer `l`, probe `k`) the largest score `m`, `Σ_t exp(score_t − m)` and
/// `Σ_t exp(score_t − m) · cells[t,l]`. A pool whose sum is 0 has seen no token, so
/// zeros are the state before the first.
#[derive(Debug)]
pub struct PoolState<'a> {
    /// The state the call starts from; `None`: no tokens before it.
    pub past: Option<&'a [f32]>,
    /// Where the state after the call goes, when wanted.
    pub present: Option<&'a mut [f32]>,
}

/// `out` `[batch, q · d]`: each batch row's pooling over the tokens of `state.past` and
/// of this call, and those rows' state after the call into `state.present`.
pub fn probe_pool(
    cells: &Cells,
    w: &ProbeWeights,
    state: PoolState,
    out: &mut [f32],
    isa: Isa,
) -> Result<(), ShapeError> {
    let q = w.queries(cells)?;
    let pools = w.layers * w.k;
    each_row(
        cells.batch,
        q * w.d,
        pools,
        w.d,
        state,
        out,
        |b, pools, out| pool_row(cells, w, b, isa, pools, out),
    )
}

/// Needle 2's pooling (upstream 2.x `probe_pool`): each probe `k` of `probes` `[P, d]`
/// attends over every cell of every layer at once, token by token, each token's layers
/// in order (upstream's `[t·l, d]` rows):
///
/// ```text
/// a[k,(t,l)] = softmax_(t,l)(cells[t,l]·probes[k] / √d)   (tokens not kept: −∞)      out[k] = Σ_(t,l) a·cells[t,l]
/// ```
///
/// `out` `[batch, P · d]`, over the tokens of `state.past` (`[batch, P, d + 2]`) and of
/// this call.
pub fn joint_pool(
    cells: &Cells,
    probes: &[f32],
    d: usize,
    state: PoolState,
    out: &mut [f32],
    isa: Isa,
) -> Result<(), ShapeError> {
    let p = probes.len().checked_div(d).unwrap_or(0);
    let tokens = cells.batch * cells.sequence;
    let fits = p > 0
        && probes.len() == p * d
        && !cells.layers.is_empty()
        && cells.layers.iter().all(|c| c.len() == tokens * d)
        && cells.keep.len() == tokens;
    if !fits {
        return Err(ShapeError(format!(
            "probes of {} values, cells of {:?} and keep of {} are not [P, {d}], layers of \
             [{b}, {s}, {d}] and [{b}, {s}]",
            probes.len(),
            cells.layers.iter().map(|c| c.len()).collect::<Vec<_>>(),
            cells.keep.len(),
            b = cells.batch,
            s = cells.sequence,
        )));
    }
    let root_d = (d as f32).sqrt();
    each_row(cells.batch, p * d, p, d, state, out, |b, pools, out| {
        let s = cells.sequence;
        let kept_cells: Vec<&[f32]> = (0..s)
            .filter(|&t| cells.keep[b * s + t] != 0)
            .flat_map(|t| cells.layers.iter().map(move |c| &c[(b * s + t) * d..][..d]))
            .collect();
        let per_probe = pools.chunks_exact_mut(d + 2).zip(out.chunks_exact_mut(d));
        for (k, (pool, out)) in per_probe.enumerate() {
            let probe = &probes[k * d..(k + 1) * d];
            let scores: Vec<f32> = kept_cells
                .iter()
                .map(|c| dot(isa, c, probe) / root_d)
                .collect();
            add_tokens(pool, &scores, kept_cells.iter().copied());
            mean_of(pool, out);
        }
    })
}

/// Runs `pool_row(b, pools, out)` for each of `batch` rows, `row` values of `out` each,
/// with the row's `pools` (`pools · (d + 2)` values) as `state.past` left them (zeros
/// without), left in `state.present` where given.
fn each_row(
    batch: usize,
    row: usize,
    pools: usize,
    d: usize,
    state: PoolState,
    out: &mut [f32],
    mut pool_row: impl FnMut(usize, &mut [f32], &mut [f32]),
) -> Result<(), ShapeError> {
    let state_row = pools * (d + 2);
    if out.len() != batch * row {
        return Err(ShapeError(format!(
            "the output holds {} values, not [{batch}, {row}]",
            out.len(),
        )));
    }
    let states = [
        state.past.map(|s| s.len()),
        state.present.as_ref().map(|s| s.len()),
    ];
    if let Some(bad) = states
        .into_iter()
        .flatten()
        .find(|&n| n != batch * state_row)
    {
        return Err(ShapeError(format!(
            "a pool state holds {bad} values, not [{batch}, {pools}, {}]",
            d + 2
        )));
    }
    // A row's pools are small (pools · (d + 2) values) and a call has few rows.
    let mut scratch = vec![0.0f32; state_row];
    let mut present = state.present;
    for (b, out) in out.chunks_exact_mut(row).enumerate() {
        let pools = match present.as_deref_mut() {
            Some(present) => &mut present[b * state_row..(b + 1) * state_row],
            None => &mut scratch[..],
        };
        match state.past {
            Some(past) => pools.copy_from_slice(&past[b * state_row..(b + 1) * state_row]),
            None => pools.fill(0.0),
        }
        pool_row(b, pools, out);
    }
    Ok(())
}

/// Batch row `b`'s tokens added to its `pools`, then its pooled output `[q · d]`.
fn pool_row(
    cells: &Cells,
    w: &ProbeWeights,
    b: usize,
    isa: Isa,
    pools: &mut [f32],
    out: &mut [f32],
) {
    let (s, l, k, d) = (cells.sequence, w.layers, w.k, w.d);
    let root_d = (d as f32).sqrt();
    let keep = &cells.keep[b * s..(b + 1) * s];
    let kept: Vec<usize> = (0..s).filter(|&t| keep[t] != 0).collect();
    // r [l, k, d]: each layer's probes attend over its cells.
    let mut r = vec![0.0f32; l * k * d];
    let mut scores = vec![0.0f32; kept.len()];
    for li in 0..l {
        let cell = |t: usize| &cells.layers[li][(b * s + t) * d..][..d];
        for j in 0..k {
            let probe = &w.probes[(li * k + j) * d..][..d];
            let pool = &mut pools[(li * k + j) * (d + 2)..][..d + 2];
            for (score, &t) in scores.iter_mut().zip(&kept) {
                *score = dot(isa, cell(t), probe) / root_d;
            }
            add_tokens(pool, &scores, kept.iter().map(|&t| cell(t)));
            let pooled = &mut r[(li * k + j) * d..(li * k + j + 1) * d];
            mean_of(pool, pooled);
            let root = (dot(isa, pooled, pooled) / d as f32 + RMS_EPSILON).sqrt();
            let gain = w.gain[li * k + j];
            pooled.iter_mut().for_each(|p| *p = *p / root * gain);
        }
    }
    // w [q, l·k] over r's rows, then out[q] = Σ w · r.
    let m = l * k;
    for (qi, out) in out.chunks_exact_mut(d).enumerate() {
        let query = &w.query[qi * d..(qi + 1) * d];
        let bias = &w.row_bias[qi * m..(qi + 1) * m];
        let mut weights: Vec<f32> = r
            .chunks_exact(d)
            .zip(bias)
            .map(|(r, &bias)| dot(isa, r, query) / root_d + bias)
            .collect();
        softmax(&mut weights);
        out.fill(0.0);
        for (&a, r) in weights.iter().zip(r.chunks_exact(d)) {
            out.iter_mut().zip(r).for_each(|(o, &v)| *o += a * v);
        }
    }
}

/// The attention-weighted mean of a running `pool` into `out` (zeros before any token).
fn mean_of(pool: &[f32], out: &mut [f32]) {
    let (total, sum) = (pool[1], &pool[2..]);
    match total > 0.0 {
        true => out.iter_mut().zip(sum).for_each(|(o, &v)| *o = v / total),
        false => out.fill(0.0),
    }
}

/// Tokens with `scores` and `cells` into one running `pool` (`[m, Σ e, Σ e · cell]`),
/// everything rescaled to the new largest score.
fn add_tokens<'c>(pool: &mut [f32], scores: &[f32], cells: impl Iterator<Item = &'c [f32]>) {
    let Some(top) = scores.iter().copied().reduce(f32::max) else {
        return;
    };
    let seen = pool[1] > 0.0;
    let m = if seen { pool[0].max(top) } else { top };
    if !seen {
        pool[1..].fill(0.0);
    } else if m > pool[0] {
        let rescale = exp(pool[0] - m);
        pool[1..].iter_mut().for_each(|v| *v *= rescale);
    }
    pool[0] = m;
    for (&score, cell) in scores.iter().zip(cells) {
        let e = exp(score - m);
        pool[1] += e;
        pool[2..]
            .iter_mut()
            .zip(cell)
            .for_each(|(v, &c)| *v += e * c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One call's output: `run(from, to, past, present)` over tokens `from..to`.
    type Call<'a> = &'a dyn Fn(usize, usize, Option<&[f32]>, Option<&mut [f32]>) -> Vec<f32>;

    /// The last output when tokens `0..first` go in one call and the rest of `0..s` one a
    /// call, the pools (`pools` values) carried from call to call.
    fn fed_in_pieces(pools: usize, first: usize, s: usize, run: Call) -> Vec<f32> {
        let mut state = vec![0.0f32; pools];
        let mut out = run(0, first, None, Some(&mut state));
        for t in first..s {
            let mut next = vec![f32::NAN; pools];
            out = run(t, t + 1, Some(&state), Some(&mut next));
            state = next;
        }
        out
    }

    /// Equal but for the order of the sums.
    fn assert_close(got: &[f32], want: &[f32]) {
        for (i, (got, want)) in got.iter().zip(want).enumerate() {
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{i}: {got} vs {want}"
            );
        }
    }

    fn values(len: usize, scale: f64) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 37 % 23) as f64 - 11.0) * scale) as f32)
            .collect()
    }

    /// Two rows (the second with its last token dropped) against the formula in f64.
    #[test]
    fn matches_the_formula() {
        let (batch, s, l, k, q, d) = (2, 3, 2, 2, 2, 4);
        let cells = values(batch * s * l * d, 0.13);
        let layers: Vec<Vec<f32>> = (0..l)
            .map(|li| {
                (0..batch * s)
                    .flat_map(|t| &cells[(t * l + li) * d..][..d])
                    .copied()
                    .collect()
            })
            .collect();
        let keep = [1, 1, 1, 1, 1, 0];
        let (probes, gain) = (values(l * k * d, 0.07), values(l * k, 0.05));
        let (query, row_bias) = (values(q * d, 0.09), values(q * l * k, 0.11));
        let c = Cells {
            layers: layers.iter().map(Vec::as_slice).collect(),
            keep: &keep,
            batch,
            sequence: s,
        };
        let w = ProbeWeights {
            probes: &probes,
            gain: &gain,
            query: &query,
            row_bias: &row_bias,
            layers: l,
            k,
            d,
        };
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; batch * q * d];
            let none = PoolState {
                past: None,
                present: None,
            };
            probe_pool(&c, &w, none, &mut out, isa).unwrap();
            for b in 0..batch {
                let cell =
                    |t: usize, li: usize, i: usize| cells[((b * s + t) * l + li) * d + i] as f64;
                let kept: Vec<usize> = (0..s).filter(|&t| keep[b * s + t] != 0).collect();
                let mut r = vec![vec![0.0f64; d]; l * k];
                for li in 0..l {
                    for j in 0..k {
                        let score = |t: usize| {
                            (0..d)
                                .map(|i| cell(t, li, i) * probes[(li * k + j) * d + i] as f64)
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        };
                        let z: f64 = kept.iter().map(|&t| score(t).exp()).sum();
                        let pooled: Vec<f64> = (0..d)
                            .map(|i| {
                                kept.iter()
                                    .map(|&t| score(t).exp() / z * cell(t, li, i))
                                    .sum()
                            })
                            .collect();
                        let rms =
                            (pooled.iter().map(|v| v * v).sum::<f64>() / d as f64 + 1e-6).sqrt();
                        r[li * k + j] = pooled
                            .iter()
                            .map(|v| v / rms * gain[li * k + j] as f64)
                            .collect();
                    }
                }
                for qi in 0..q {
                    let u: Vec<f64> = (0..l * k)
                        .map(|m| {
                            (0..d)
                                .map(|i| r[m][i] * query[qi * d + i] as f64)
                                .sum::<f64>()
                                / (d as f64).sqrt()
                                + row_bias[qi * l * k + m] as f64
                        })
                        .collect();
                    let z: f64 = u.iter().map(|v| v.exp()).sum();
                    for i in 0..d {
                        let want: f64 = (0..l * k).map(|m| u[m].exp() / z * r[m][i]).sum();
                        let got = out[(b * q + qi) * d + i] as f64;
                        assert!(
                            (got - want).abs() < 1e-5,
                            "{isa:?} ({b}, {qi}, {i}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// A sequence fed whole, and fed as a prompt then one token a call with the state
    /// carried: the same output (the sums' order aside), padding included.
    #[test]
    fn a_sequence_fed_in_pieces_pools_as_fed_whole() {
        let (batch, s, l, k, q, d) = (2, 6, 3, 2, 2, 8);
        let layers: Vec<Vec<f32>> = (0..l)
            .map(|li| values(batch * s * d, 0.11 + 0.02 * li as f64))
            .collect();
        let keep = [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0];
        let (probes, gain) = (values(l * k * d, 0.07), values(l * k, 0.05));
        let (query, row_bias) = (values(q * d, 0.09), values(q * l * k, 0.11));
        let w = ProbeWeights {
            probes: &probes,
            gain: &gain,
            query: &query,
            row_bias: &row_bias,
            layers: l,
            k,
            d,
        };
        // Tokens `from..to` of every row, as one call sees them.
        let piece = |from: usize, to: usize| -> (Vec<Vec<f32>>, Vec<i64>) {
            let cells = layers
                .iter()
                .map(|layer| {
                    (0..batch)
                        .flat_map(|b| &layer[(b * s + from) * d..(b * s + to) * d])
                        .copied()
                        .collect()
                })
                .collect();
            let keep = (0..batch)
                .flat_map(|b| &keep[b * s + from..b * s + to])
                .copied()
                .collect();
            (cells, keep)
        };
        let run = |from: usize, to: usize, past: Option<&[f32]>, present: Option<&mut [f32]>| {
            let (cells, keep) = piece(from, to);
            let c = Cells {
                layers: cells.iter().map(Vec::as_slice).collect(),
                keep: &keep,
                batch,
                sequence: to - from,
            };
            let mut out = vec![f32::NAN; batch * q * d];
            probe_pool(&c, &w, PoolState { past, present }, &mut out, Isa::best()).unwrap();
            out
        };
        let whole = run(0, s, None, None);
        let out = fed_in_pieces(batch * w.state_len(), 3, s, &run);
        assert_close(&out, &whole);
        // Zeros are the state before the first token.
        let zeros = vec![0.0f32; batch * w.state_len()];
        assert_eq!(run(0, s, Some(&zeros), None), whole);
    }

    /// Needle 2's joint pooling against the formula in f64, whole and fed in pieces.
    #[test]
    fn the_joint_pool_matches_the_formula_whole_and_in_pieces() {
        let (batch, s, l, p, d) = (2, 4, 3, 2, 8);
        let layers: Vec<Vec<f32>> = (0..l)
            .map(|li| values(batch * s * d, 0.09 + 0.03 * li as f64))
            .collect();
        let keep = [1, 1, 1, 1, 1, 1, 1, 0];
        let probes = values(p * d, 0.07);
        let run = |from: usize, to: usize, past: Option<&[f32]>, present: Option<&mut [f32]>| {
            let cells: Vec<Vec<f32>> = layers
                .iter()
                .map(|c| {
                    (0..batch)
                        .flat_map(|b| &c[(b * s + from) * d..(b * s + to) * d])
                        .copied()
                        .collect()
                })
                .collect();
            let keep: Vec<i64> = (0..batch)
                .flat_map(|b| &keep[b * s + from..b * s + to])
                .copied()
                .collect();
            let c = Cells {
                layers: cells.iter().map(Vec::as_slice).collect(),
                keep: &keep,
                batch,
                sequence: to - from,
            };
            let mut out = vec![f32::NAN; batch * p * d];
            let state = PoolState { past, present };
            joint_pool(&c, &probes, d, state, &mut out, Isa::best()).unwrap();
            out
        };
        let whole = run(0, s, None, None);
        for b in 0..batch {
            let kept: Vec<(usize, usize)> = (0..s)
                .filter(|&t| keep[b * s + t] != 0)
                .flat_map(|t| (0..l).map(move |li| (t, li)))
                .collect();
            let cell = |(t, li): (usize, usize), i: usize| layers[li][(b * s + t) * d + i] as f64;
            for k in 0..p {
                let score = |at: (usize, usize)| {
                    (0..d)
                        .map(|i| cell(at, i) * probes[k * d + i] as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                };
                let z: f64 = kept.iter().map(|&at| score(at).exp()).sum();
                for i in 0..d {
                    let want: f64 = kept
                        .iter()
                        .map(|&at| score(at).exp() / z * cell(at, i))
                        .sum();
                    let got = whole[(b * p + k) * d + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-6,
                        "({b}, {k}, {i}): {got} vs {want}"
                    );
                }
            }
        }
        assert_close(&fed_in_pieces(batch * p * (d + 2), 2, s, &run), &whole);
    }
}
