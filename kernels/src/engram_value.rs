//! `needle.EngramValue`: an engram site's value, `value_proj` of its gathered n-gram rows
//! passed through the dilated causal conv (`graphs/src/blocks/engram.rs` states the site),
//! in one kernel. For new position `s` (window row `W + s`, `W` the history):
//!
//! ```text
//! value[s] = Σ_{j < taps} taps_j ⊙ (E[W + s − j·dil] · Wᵀ) · valid[W + s − j·dil]   (rows before the window: 0)
//! ```
//! The stock graph projects every window row and shifts the projections; this projects
//! only the rows some tap reads (a decode step: `taps` rows of `W + 1`). A row's projection
//! has the same bits whatever else is projected with it, so the values are those of the
//! whole window's projection.

use crate::cq_matmul::{cq_matmul, CqMatrix, RowScale};
use crate::isa::Isa;
use crate::split::RowSplit;

/// The window's rows and their validity: `rows` `[batch, window, cols]`, `valid`
/// `[batch, window]` (1 for a real token).
#[derive(Clone, Copy, Debug)]
pub struct EngramWindowRows<'a> {
    pub rows: &'a [f32],
    pub valid: &'a [f32],
    pub batch: usize,
    pub window: usize,
}

/// The conv: `taps` `[taps, d]` at `dilation`, over a window whose first `history` rows
/// come before the new positions.
#[derive(Clone, Copy, Debug)]
pub struct DilatedConv<'a> {
    pub taps: &'a [f32],
    pub dilation: usize,
    pub history: usize,
}

/// `out` `[batch, window − history, d]` for `value_proj` `w` (`[d, cols]`).
pub fn engram_value(
    window: &EngramWindowRows,
    conv: &DilatedConv,
    w: &CqMatrix,
    out: &mut [f32],
    isa: Isa,
    split: &dyn RowSplit,
) {
    let (d, cols) = (w.rows(), w.cols());
    let (batch, len) = (window.batch, window.window);
    let new = len - conv.history;
    let taps = conv.taps.len() / d;
    assert_eq!(
        window.rows.len(),
        batch * len * cols,
        "rows are [batch, window, cols]"
    );
    assert_eq!(window.valid.len(), batch * len, "valid is [batch, window]");
    assert_eq!(out.len(), batch * new * d, "out is [batch, new, d]");
    // The window row each (row, position, tap) reads, and each read row's place among the
    // projected ones.
    let read = |b: usize, s: usize, j: usize| {
        (conv.history + s)
            .checked_sub(j * conv.dilation)
            .map(|r| b * len + r)
    };
    let mut place = vec![usize::MAX; batch * len];
    let mut projected = Vec::new();
    for b in 0..batch {
        for s in 0..new {
            for j in 0..taps {
                if let Some(r) = read(b, s, j) {
                    if place[r] == usize::MAX {
                        place[r] = projected.len();
                        projected.push(r);
                    }
                }
            }
        }
    }
    let mut x = Vec::with_capacity(projected.len() * cols);
    for &r in &projected {
        x.extend_from_slice(&window.rows[r * cols..(r + 1) * cols]);
    }
    let mut y = vec![0.0f32; projected.len() * d];
    cq_matmul(
        w,
        &x,
        projected.len(),
        RowScale::default(),
        &mut y,
        isa,
        split,
    );
    for b in 0..batch {
        for s in 0..new {
            let value = &mut out[(b * new + s) * d..(b * new + s + 1) * d];
            value.fill(0.0);
            for j in 0..taps {
                let Some(r) = read(b, s, j) else { continue };
                let (tap, ok) = (&conv.taps[j * d..(j + 1) * d], window.valid[r]);
                let projection = &y[place[r] * d..(place[r] + 1) * d];
                for ((v, &t), &p) in value.iter_mut().zip(tap).zip(projection) {
                    *v += t * p * ok;
                }
            }
        }
    }
}
