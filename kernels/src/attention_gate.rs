//! `needle.AttentionGate`: attention's output heads cut back to `head_dim` (the core ran
//! them `padded` wide) and gated by the sigmoid of the layer's gate projection, per token
//! (`graphs/src/needle3/attention.rs`):
//!
//! ```text
//! out[t, h·head_dim + i] = attention[t, h·padded + i] · σ(projections[t, offset + h·head_dim + i])
//! ```
//! The Reshape, Slice, Reshape of the unpadding and the gate's Slice, Sigmoid, Mul in one.

use crate::math::exp;
use crate::split::{token_blocks, RowSplit, TokenRun};
use crate::ShapeError;

/// Tokens a thread takes at once.
const BLOCK_TOKENS: usize = 64;

/// Where the heads and the gate are.
#[derive(Clone, Copy, Debug)]
pub struct GateLayout {
    pub heads: usize,
    pub head_dim: usize,
    /// Each head's width in the attention output (`≥ head_dim`).
    pub padded: usize,
    /// The gate's first column in the projections.
    pub offset: usize,
}

impl GateLayout {
    /// One token's output width, `heads · head_dim`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Tokens of `attention` (`[tokens, heads · padded]`) with `projections` (`[tokens,
    /// projections_width]`), every size checked against the layout.
    pub fn tokens(
        &self,
        attention: usize,
        projections: usize,
        projections_width: usize,
    ) -> Result<usize, ShapeError> {
        let row = self.heads * self.padded;
        if self.width() == 0 || self.head_dim > self.padded {
            return Err(ShapeError(format!(
                "{} heads of {} values cut from {} are no gate",
                self.heads, self.head_dim, self.padded
            )));
        }
        if self.offset + self.width() > projections_width {
            return Err(ShapeError(format!(
                "a gate of {} columns from column {} does not fit projections {projections_width} wide",
                self.width(),
                self.offset
            )));
        }
        let tokens = attention / row;
        if attention != tokens * row || projections != tokens * projections_width {
            return Err(ShapeError(format!(
                "attention of {attention} values and projections of {projections} are not \
                 [tokens, {row}] and [tokens, {projections_width}] alike"
            )));
        }
        Ok(tokens)
    }
}

/// `out` `[tokens, heads · head_dim]` from `attention` `[tokens, heads · padded]` and
/// `projections` `[tokens, projections_width]`.
pub fn attention_gate(
    attention: &[f32],
    projections: &[f32],
    projections_width: usize,
    layout: &GateLayout,
    out: &mut [f32],
    split: &dyn RowSplit,
) -> Result<(), ShapeError> {
    let tokens = layout.tokens(attention.len(), projections.len(), projections_width)?;
    let width = layout.width();
    if out.len() != tokens * width {
        return Err(ShapeError(format!(
            "the output holds {} values, not [{tokens}, {width}]",
            out.len()
        )));
    }
    let work = GateRun {
        attention,
        projections,
        projections_width,
        layout,
    };
    token_blocks(split, out, width, BLOCK_TOKENS, work);
    Ok(())
}

/// [`attention_gate`] of a run of tokens.
struct GateRun<'a> {
    attention: &'a [f32],
    projections: &'a [f32],
    projections_width: usize,
    layout: &'a GateLayout,
}

impl TokenRun for GateRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, block: &mut [f32]) {
        let layout = self.layout;
        let (dim, padded, width) = (layout.head_dim, layout.padded, layout.width());
        for (t, out) in (first..).zip(block.chunks_exact_mut(width)) {
            let heads = &self.attention[t * layout.heads * padded..(t + 1) * layout.heads * padded];
            let gate_at = t * self.projections_width + layout.offset;
            let gate = &self.projections[gate_at..gate_at + width];
            for ((out, head), gate) in out
                .chunks_exact_mut(dim)
                .zip(heads.chunks_exact(padded))
                .zip(gate.chunks_exact(dim))
            {
                for ((o, &a), &g) in out.iter_mut().zip(head).zip(gate) {
                    *o = a / (1.0 + exp(-g));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    const LAYOUT: GateLayout = GateLayout {
        heads: 2,
        head_dim: 3,
        padded: 4,
        offset: 5,
    };

    #[test]
    fn matches_the_formula() {
        let (tokens, pw) = (3, 12);
        let attention: Vec<f32> = (0..tokens * 8).map(|i| (i as f32 * 0.7).sin()).collect();
        let projections: Vec<f32> = (0..tokens * pw)
            .map(|i| (i as f32 * 0.3).cos() * 4.0)
            .collect();
        let mut out = vec![f32::NAN; tokens * 6];
        attention_gate(&attention, &projections, pw, &LAYOUT, &mut out, &Serial).unwrap();
        for t in 0..tokens {
            for h in 0..2 {
                for i in 0..3 {
                    let a = attention[t * 8 + h * 4 + i] as f64;
                    let g = projections[t * pw + 5 + h * 3 + i] as f64;
                    let want = a / (1.0 + (-g).exp());
                    let got = out[t * 6 + h * 3 + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-6,
                        "({t}, {h}, {i}): {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_gate_past_the_projections_or_a_ragged_token_is_named() {
        let mut out = vec![0.0; 6];
        let short = attention_gate(&[0.0; 8], &[0.0; 10], 10, &LAYOUT, &mut out, &Serial);
        assert!(short
            .unwrap_err()
            .0
            .contains("does not fit projections 10 wide"));
        let ragged = attention_gate(&[0.0; 9], &[0.0; 12], 12, &LAYOUT, &mut out, &Serial);
        assert!(ragged.unwrap_err().0.contains("are not [tokens, 8]"));
    }
}
