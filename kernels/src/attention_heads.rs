//! `needle.QkvHeads`: Needle 3's query, key and value inputs to attention, packed side by
//! side as `GroupQueryAttention` reads them, from the layer's raw projections in one
//! kernel, where the stock graph runs ~8 nodes a part (`graphs/src/needle3/attention.rs`
//! states the layer):
//!
//! ```text
//! p [B, S, ≥ offset + heads·dim] ─ causal conv over the state's and p's rows ─┬─ (q, k) ZC-RMS norm per head ─ RoPE ─┬─ pad each head to `padded` ─ [B, S, heads·padded]
//!                                                                              └─ (v) ────────────────────────────────┘
//! conv: y_t = Σ_{j < visible} taps_j · window_{t + n − 1 − j},  window = [state (n − 1 rows); p (S rows)]
//! norm: x / √(mean x² + 1e-6) · gain        RoPE (rotate half): (x₁ cos − x₂ sin, x₂ cos + x₁ sin)
//! ```
//! Each token's result depends on its row's window alone, in one order whatever the batch.

use crate::conv_state::ConvWindow;
use crate::math::inverse_root_mean_square;
use crate::split::{token_blocks, RowSplit, TokenRun};
use crate::ShapeError;

/// Tokens a thread takes at once.
const BLOCK_TOKENS: usize = 16;

/// Which columns of the projections are this part, and how they become heads.
#[derive(Clone, Copy, Debug)]
pub struct HeadsLayout {
    /// The part's first column in the projections and the conv state.
    pub offset: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Each head's width in the output (zeros after `head_dim`).
    pub padded: usize,
    /// Taps the conv reads (a local layer's window may hide the older ones).
    pub visible_taps: usize,
}

/// The conv's inputs: its window (the state and the projections) and the taps.
#[derive(Clone, Copy, Debug)]
pub struct ConvInputs<'a> {
    pub window: ConvWindow<'a>,
    /// `[taps, conv width]`.
    pub taps: &'a [f32],
}

/// The norm gain (`1 + scale`, `[head_dim]`) and the rotary tables (`[positions, head_dim / 2]`
/// each) with each token's position (`[batch, sequence]`) of the query and key parts.
#[derive(Clone, Copy, Debug)]
pub struct NormRope<'a> {
    pub gain: &'a [f32],
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub positions: &'a [i64],
}

impl ConvInputs<'_> {
    fn taps(&self) -> usize {
        self.taps.len() / self.window.width.max(1)
    }

    /// Every size checked against the others and `layout`.
    pub fn check(
        &self,
        layout: &HeadsLayout,
        norm_rope: Option<&NormRope>,
    ) -> Result<(), ShapeError> {
        let fail = |what: String| Err(ShapeError(what));
        let w = &self.window;
        let (tokens, n) = (w.batch * w.sequence, self.taps());
        let part = layout.heads * layout.head_dim;
        if n == 0 || self.taps.len() != n * w.width || layout.visible_taps > n {
            return fail(format!(
                "taps hold {} values, not [taps ≥ {}, {}]",
                self.taps.len(),
                layout.visible_taps,
                w.width
            ));
        }
        if layout.offset + part > w.width || w.width > w.projections_width {
            return fail(format!(
                "columns {}..{} are not within the conv's {} and the projections' {}",
                layout.offset,
                layout.offset + part,
                w.width,
                w.projections_width
            ));
        }
        if w.projections.len() != tokens * w.projections_width {
            return fail("the projections are not [batch, sequence, width]".into());
        }
        if w.state.len() != w.batch * (n - 1) * w.width {
            return fail(format!(
                "the state holds {} values, not [{}, {}, {}]",
                w.state.len(),
                w.batch,
                n - 1,
                w.width
            ));
        }
        if layout.padded < layout.head_dim {
            return fail(format!(
                "heads of {} padded to {}",
                layout.head_dim, layout.padded
            ));
        }
        let Some(nr) = norm_rope else { return Ok(()) };
        let half = layout.head_dim / 2;
        if !layout.head_dim.is_multiple_of(2) || nr.gain.len() != layout.head_dim {
            return fail(format!(
                "a gain of {} for heads of {}",
                nr.gain.len(),
                layout.head_dim
            ));
        }
        if nr.cos.len() != nr.sin.len() || !nr.cos.len().is_multiple_of(half.max(1)) {
            return fail("the rotary tables are not [positions, head_dim / 2]".into());
        }
        let positions = (nr.cos.len() / half.max(1)) as i64;
        if nr.positions.len() != tokens {
            return fail("position_ids are not [batch, sequence]".into());
        }
        if let Some(p) = nr.positions.iter().find(|&&p| !(0..positions).contains(&p)) {
            return fail(format!(
                "position {p} is outside the rotary tables' {positions}"
            ));
        }
        Ok(())
    }
}

/// One part of the heads a layer's attention reads: where it is and, for the queries and
/// the keys, its norm and RoPE.
#[derive(Clone, Copy, Debug)]
pub struct HeadsPart<'a> {
    pub layout: HeadsLayout,
    pub norm_rope: Option<NormRope<'a>>,
}

impl HeadsPart<'_> {
    /// One token's values of this part, `heads · padded`.
    pub fn width(&self) -> usize {
        self.layout.heads * self.layout.padded
    }
}

/// `out` `[batch, sequence, Σ heads · padded]`: every token's `parts` side by side, in
/// order (`GroupQueryAttention`'s packed query, key and value), each normalised and
/// rotated where it has a [`NormRope`]; token runs spread by `split`. `inputs` must have
/// passed [`ConvInputs::check`] for every part.
pub fn attention_heads(
    inputs: &ConvInputs,
    parts: &[HeadsPart],
    out: &mut [f32],
    split: &dyn RowSplit,
) {
    let row: usize = parts.iter().map(HeadsPart::width).sum();
    assert_eq!(
        out.len(),
        inputs.window.batch * inputs.window.sequence * row,
        "out is [batch, sequence, Σ heads·padded]"
    );
    token_blocks(
        split,
        out,
        row,
        BLOCK_TOKENS,
        HeadsRun { inputs, parts, row },
    );
}

/// [`attention_heads`] of a run of tokens.
struct HeadsRun<'a> {
    inputs: &'a ConvInputs<'a>,
    parts: &'a [HeadsPart<'a>],
    row: usize,
}

impl TokenRun for HeadsRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, block: &mut [f32]) {
        let mut head = Vec::new();
        for (token, mut out) in (first..).zip(block.chunks_exact_mut(self.row)) {
            for part in self.parts {
                let (layout, part_out) = (&part.layout, out);
                let (part_out, rest) = part_out.split_at_mut(part.width());
                out = rest;
                head.resize(layout.head_dim, 0.0);
                for (h, out) in part_out.chunks_exact_mut(layout.padded).enumerate() {
                    conv(
                        self.inputs,
                        layout,
                        token,
                        layout.offset + h * layout.head_dim,
                        &mut head,
                    );
                    if let Some(nr) = &part.norm_rope {
                        normalize(&mut head, nr.gain);
                        rotate(&mut head, nr, nr.positions[token] as usize);
                    }
                    out[..layout.head_dim].copy_from_slice(&head);
                    out[layout.head_dim..].fill(0.0);
                }
            }
        }
    }
}

/// The conv of `y.len()` columns from `column` at token `token`: tap by tap, as the stock
/// graph sums them.
#[inline(always)]
fn conv(inputs: &ConvInputs, layout: &HeadsLayout, token: usize, column: usize, y: &mut [f32]) {
    let (n, seq, width) = (inputs.taps(), inputs.window.sequence, y.len());
    let (b, t) = (token / seq, token % seq);
    for j in 0..layout.visible_taps {
        let taps = &inputs.taps[j * inputs.window.width + column..][..width];
        let values = &inputs.window.row(b, n - 1, t + n - 1 - j)[column..column + width];
        for ((y, &tap), &v) in y.iter_mut().zip(taps).zip(values) {
            *y = if j == 0 { tap * v } else { *y + tap * v };
        }
    }
}

/// ZC-RMS norm of one head: `x / √(mean x² + ε) · gain`.
#[inline(always)]
fn normalize(x: &mut [f32], gain: &[f32]) {
    let inverse = inverse_root_mean_square(x);
    x.iter_mut()
        .zip(gain)
        .for_each(|(v, &g)| *v = *v * inverse * g);
}

/// Rotate-half RoPE of one head at `position`.
#[inline(always)]
fn rotate(x: &mut [f32], nr: &NormRope, position: usize) {
    let half = x.len() / 2;
    let (cos, sin) = (
        &nr.cos[position * half..][..half],
        &nr.sin[position * half..][..half],
    );
    let (x1, x2) = x.split_at_mut(half);
    for (((a, b), &c), &s) in x1.iter_mut().zip(x2).zip(cos).zip(sin) {
        let (first, second) = (*a, *b);
        *a = first * c - second * s;
        *b = second * c + first * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    const B: usize = 2;
    const S: usize = 3;
    const TAPS: usize = 3;
    const CONV: usize = 12;
    const WIDTH: usize = 16;

    fn values(len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 29 % 31) as f32 - 15.0) * scale)
            .collect()
    }

    /// The tests' conv: projections `[B, S, WIDTH]`, a state of `TAPS − 1` rows and the
    /// taps, each `CONV` wide.
    struct TestWindow {
        p: Vec<f32>,
        state: Vec<f32>,
        taps: Vec<f32>,
    }

    impl TestWindow {
        fn new() -> TestWindow {
            TestWindow {
                p: values(B * S * WIDTH, 0.1),
                state: values(B * (TAPS - 1) * CONV, 0.2),
                taps: values(TAPS * CONV, 0.3),
            }
        }

        fn inputs(&self) -> ConvInputs<'_> {
            ConvInputs {
                window: ConvWindow {
                    state: &self.state,
                    projections: &self.p,
                    projections_width: WIDTH,
                    batch: B,
                    sequence: S,
                    width: CONV,
                },
                taps: &self.taps,
            }
        }
    }

    /// Query-like heads (2 of 4, from column 4) and value-like (1 of 4, from column 8)
    /// against the formulas in f64: the window's rows by hand, the norm, RoPE, padding.
    #[test]
    fn heads_match_the_formulas() {
        let window = TestWindow::new();
        let (gain, cos, sin) = (values(4, 0.05), values(10 * 2, 0.04), values(10 * 2, 0.06));
        let positions: Vec<i64> = vec![7, 8, 9, 2, 3, 0];
        let inputs = window.inputs();
        let nr = NormRope {
            gain: &gain,
            cos: &cos,
            sin: &sin,
            positions: &positions,
        };
        let parts = [
            HeadsPart {
                layout: HeadsLayout {
                    offset: 4,
                    heads: 2,
                    head_dim: 4,
                    padded: 8,
                    visible_taps: 3,
                },
                norm_rope: Some(nr),
            },
            HeadsPart {
                layout: HeadsLayout {
                    offset: 8,
                    heads: 1,
                    head_dim: 4,
                    padded: 4,
                    visible_taps: 2,
                },
                norm_rope: None,
            },
        ];
        let mut singles = Vec::new();
        for part in parts {
            let (layout, rope) = (part.layout, part.norm_rope.is_some());
            inputs.check(&layout, part.norm_rope.as_ref()).unwrap();
            let mut out = vec![f32::NAN; B * S * part.width()];
            attention_heads(&inputs, &[part], &mut out, &Serial);
            singles.push(out.clone());
            for (b, t, h) in
                (0..B).flat_map(|b| (0..S).flat_map(move |t| (0..2).map(move |h| (b, t, h))))
            {
                if h >= layout.heads {
                    continue;
                }
                let column = layout.offset + h * 4;
                let row = |r: usize, c: usize| -> f64 {
                    if r < TAPS - 1 {
                        window.state[(b * (TAPS - 1) + r) * CONV + c] as f64
                    } else {
                        window.p[(b * S + r - (TAPS - 1)) * WIDTH + c] as f64
                    }
                };
                let mut y: Vec<f64> = (0..4)
                    .map(|i| {
                        (0..layout.visible_taps)
                            .map(|j| {
                                window.taps[j * CONV + column + i] as f64
                                    * row(t + TAPS - 1 - j, column + i)
                            })
                            .sum()
                    })
                    .collect();
                if rope {
                    let root = (y.iter().map(|v| v * v).sum::<f64>() / 4.0 + 1e-6).sqrt();
                    y.iter_mut()
                        .zip(&gain)
                        .for_each(|(v, &g)| *v = *v / root * g as f64);
                    let pos = positions[b * S + t] as usize;
                    let (c, s) = (
                        [0, 1].map(|i| cos[pos * 2 + i] as f64),
                        [0, 1].map(|i| sin[pos * 2 + i] as f64),
                    );
                    y = vec![
                        y[0] * c[0] - y[2] * s[0],
                        y[1] * c[1] - y[3] * s[1],
                        y[2] * c[0] + y[0] * s[0],
                        y[3] * c[1] + y[1] * s[1],
                    ];
                }
                let at = ((b * S + t) * layout.heads + h) * layout.padded;
                for (i, want) in y.iter().enumerate() {
                    let got = out[at + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-5 * want.abs().max(1.0),
                        "({b}, {t}, head {h}, {i}): {got} vs {want}"
                    );
                }
                assert!(
                    out[at + 4..at + layout.padded].iter().all(|&v| v == 0.0),
                    "padding of ({b}, {t}, {h})"
                );
            }
        }
        // Both parts packed: each token's rows of the two, side by side.
        let mut packed = vec![f32::NAN; B * S * (16 + 4)];
        attention_heads(&inputs, &parts, &mut packed, &Serial);
        let side_by_side: Vec<f32> = singles[0]
            .chunks_exact(16)
            .zip(singles[1].chunks_exact(4))
            .flat_map(|(q, v)| q.iter().chain(v).copied())
            .collect();
        assert_eq!(packed, side_by_side);
    }

    #[test]
    fn a_position_outside_the_tables_is_refused() {
        let window = TestWindow::new();
        let (gain, table) = (values(4, 0.05), values(10 * 2, 0.04));
        let positions = vec![0, 1, 2, 3, 10, 5];
        let inputs = window.inputs();
        let nr = NormRope {
            gain: &gain,
            cos: &table,
            sin: &table,
            positions: &positions,
        };
        let layout = HeadsLayout {
            offset: 0,
            heads: 1,
            head_dim: 4,
            padded: 4,
            visible_taps: 3,
        };
        let error = inputs.check(&layout, Some(&nr)).unwrap_err();
        assert_eq!(error.0, "position 10 is outside the rotary tables' 10");
    }
}
