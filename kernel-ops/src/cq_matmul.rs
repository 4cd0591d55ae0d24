//! `needle.CqMatMul` (`kernels/src/cq_matmul/mod.rs` states its contract): inputs `X`
//! float32 `[…, cols]`, `codes` uint8 `[rows, row bytes]`, `norms` float16
//! `[rows, groups]`, `codebook` float32 `[2^bits]`; attributes `cols`, `group`, `bits`;
//! output float32 `[…, rows]`. Optional attributes: `row_axes` (default 1), how many of
//! `X`'s last axes make one row of `cols` (the hyper-connections read all lanes at once,
//! `[…, lanes, d]`), and `unit_rows` (default 0), 1 to divide each row by its root mean
//! square first (upstream `_rms_unit`). Optional input `gain` float32 `[cols]`: each row
//! is multiplied by it before the product (with `unit_rows`, an RMS norm's gain).

use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::cq_matmul::RowScale;
use kernels::{cq_matmul, CqMatrix, Isa};

pub struct CqMatMul {
    layout: CqLayout,
    row_axes: usize,
    unit_rows: bool,
    isa: Isa,
}

/// The attributes of an op that reads a CQ matrix: its width, group and code bits.
pub(crate) struct CqLayout {
    pub cols: usize,
    group: usize,
    bits: usize,
}

impl CqLayout {
    pub fn of<Op: NeedleOp>(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(CqLayout {
            cols: size_attribute::<Op>(attribute, "cols")?,
            group: size_attribute::<Op>(attribute, "group")?,
            bits: size_attribute::<Op>(attribute, "bits")?,
        })
    }

    /// The matrix of inputs `first`, `first + 1` and `first + 2` (codes, norms, codebook)
    /// of `Op`.
    pub fn matrix<'a, Op: NeedleOp>(
        &self,
        inputs: &[Input<'a>],
        first: usize,
    ) -> Result<CqMatrix<'a>, OpError> {
        let (codes_shape, codes) = Input::get::<Op, u8>(inputs, first)?;
        let (_, norms) = Input::get::<Op, u16>(inputs, first + 1)?;
        let (_, codebook) = Input::get::<Op, f32>(inputs, first + 2)?;
        let rows = codes_shape.first().copied().unwrap_or(0) as usize;
        CqMatrix::new(
            rows, self.cols, self.group, self.bits, codes, norms, codebook,
        )
        .map_err(op_error::<Op>)
    }
}

impl CqMatMul {
    /// The CQ matrix of `inputs` and the activations `X` with their shape, checked against
    /// each other and the attributes.
    fn operands<'a>(
        &self,
        inputs: &[Input<'a>],
    ) -> Result<(CqMatrix<'a>, &'a [i64], &'a [f32]), OpError> {
        let (x_shape, x) = Input::get::<Self, f32>(inputs, 0)?;
        let w = self.layout.matrix::<Self>(inputs, 1)?;
        let row = x_shape
            .len()
            .checked_sub(self.row_axes)
            .map(|at| &x_shape[at..]);
        if row.map(|axes| axes.iter().product::<i64>()) != Some(self.layout.cols as i64) {
            let row = match self.row_axes {
                1 => "its last axis must be".to_string(),
                n => format!("its last {n} axes must hold"),
            };
            return Err(op_error::<Self>(format!(
                "X is {x_shape:?}, {row} cols = {}",
                self.layout.cols
            )));
        }
        Ok((w, x_shape, x))
    }
}

impl NeedleOp for CqMatMul {
    const NAME: &'static str = needle_ops::CQ_MATMUL;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32,
        ElementType::Uint8,
        ElementType::Float16,
        ElementType::Float32,
    ];
    const OPTIONAL_INPUTS: &'static [ElementType] = &[ElementType::Float32]; // gain

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        let row_axes = attribute("row_axes").unwrap_or(1);
        let unit_rows = attribute("unit_rows").unwrap_or(0);
        if row_axes < 1 || !(0..=1).contains(&unit_rows) {
            return Err(op_error::<Self>(format!(
                "row_axes {row_axes} and unit_rows {unit_rows} are not ≥ 1 and 0 or 1"
            )));
        }
        Ok(CqMatMul {
            layout: CqLayout::of::<Self>(attribute)?,
            row_axes: row_axes as usize,
            unit_rows: unit_rows == 1,
            isa: Isa::best(),
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (w, x_shape, _) = self.operands(inputs)?;
        let mut y_shape = x_shape[..x_shape.len() - self.row_axes].to_vec();
        y_shape.push(w.rows() as i64);
        Ok(vec![y_shape])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (w, _, x) = self.operands(inputs)?;
        let cols = self.layout.cols;
        let tokens = x.len() / cols;
        let gain = match Input::optional::<Self, f32>(inputs, 4)? {
            Some((_, gain)) if gain.len() != cols => {
                return Err(op_error::<Self>(format!(
                    "gain holds {} values, not cols = {cols}",
                    gain.len()
                )))
            }
            gain => gain.map(|(_, gain)| gain),
        };
        let scale = RowScale {
            unit_rows: self.unit_rows,
            gain,
        };
        cq_matmul(&w, x, tokens, scale, outputs[0], self.isa, split);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InputData;

    /// A 4 × 16 matrix of 2-bit codes in one group of 16.
    fn attribute(name: &str) -> Option<i64> {
        match name {
            "cols" | "group" => Some(16),
            "bits" => Some(2),
            _ => None,
        }
    }

    const CODES: [u8; 16] = [0; 16];
    const NORMS: [u16; 4] = [0x3c00; 4];
    const CODEBOOK: [f32; 4] = [0.0, 1.0, 2.0, 3.0];

    fn inputs<'a>(x_shape: &'a [i64], x: &'a [f32]) -> [Input<'a>; 4] {
        [
            Input {
                shape: x_shape,
                data: InputData::Float32(x),
            },
            Input {
                shape: &[4, 4],
                data: InputData::Uint8(&CODES),
            },
            Input {
                shape: &[4, 1],
                data: InputData::Float16(&NORMS),
            },
            Input {
                shape: &[4],
                data: InputData::Float32(&CODEBOOK),
            },
        ]
    }

    #[test]
    fn the_output_takes_the_rows_and_a_wrong_width_is_an_error() {
        let op = CqMatMul::new(&attribute).unwrap();
        let x = [1.0; 2 * 3 * 16];
        assert_eq!(
            op.output_shapes(&inputs(&[2, 3, 16], &x)),
            Ok(vec![vec![2, 3, 4]])
        );
        let mut y = [f32::NAN; 2 * 3 * 4];
        op.compute(&inputs(&[2, 3, 16], &x), &mut [&mut y], &kernels::Serial)
            .unwrap();
        // Every code is index 0, value 0.
        assert_eq!(y, [0.0; 24]);
        assert_eq!(
            op.output_shapes(&inputs(&[1, 8], &x[..8])),
            Err(OpError(
                "needle.CqMatMul: X is [1, 8], its last axis must be cols = 16".into()
            ))
        );
    }

    /// `row_axes` 2 and `unit_rows` 1 on `[1, 2, 8]` give the product of the row flattened
    /// and divided by its root mean square (computed here in f64).
    #[test]
    fn unit_rows_over_two_axes_are_the_normalised_flat_row() {
        const MIXED: [u8; 16] = [
            0x1b, 0xe4, 0x4e, 0xb1, 0x27, 0x8d, 0x72, 0xd8, 0x1b, 0xe4, 0x4e, 0xb1, 0x27, 0x8d,
            0x72, 0xd8,
        ];
        let with_codes = |x_shape, x| {
            let mut inputs = inputs(x_shape, x);
            inputs[1].data = InputData::Uint8(&MIXED);
            inputs
        };
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
        let root = (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / 16.0 + 1e-6).sqrt();
        let normed: Vec<f32> = x.iter().map(|&v| (v as f64 / root) as f32).collect();
        let plain = CqMatMul::new(&attribute).unwrap();
        let mut want = [0.0; 4];
        plain
            .compute(
                &with_codes(&[1, 16], &normed),
                &mut [&mut want],
                &kernels::Serial,
            )
            .unwrap();
        let fused_attribute = |name: &str| match name {
            "row_axes" => Some(2),
            "unit_rows" => Some(1),
            _ => attribute(name),
        };
        let op = CqMatMul::new(&fused_attribute).unwrap();
        let shaped = with_codes(&[1, 2, 8], &x);
        assert_eq!(op.output_shapes(&shaped), Ok(vec![vec![1, 4]]));
        let mut got = [f32::NAN; 4];
        op.compute(&shaped, &mut [&mut got], &kernels::Serial)
            .unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{g} vs {w}");
        }
        assert!(
            want.iter().any(|&w| w.abs() > 0.1),
            "a product that can tell: {want:?}"
        );
    }

    /// A `gain` input with `unit_rows` 1 gives the product of the normalised row times the
    /// gain (computed here in f64); a gain of the wrong width is an error.
    #[test]
    fn a_gain_multiplies_the_normalised_rows() {
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.9).cos() * 2.0).collect();
        let gain: Vec<f32> = (0..16).map(|i| 0.5 + i as f32 * 0.1).collect();
        let root = (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / 16.0 + 1e-6).sqrt();
        let scaled: Vec<f32> = x
            .iter()
            .zip(&gain)
            .map(|(&v, &g)| (v as f64 / root * g as f64) as f32)
            .collect();
        let codes: [u8; 16] = std::array::from_fn(|i| (i * 37 % 256) as u8);
        fn with<'a>(
            x_shape: &'a [i64],
            x: &'a [f32],
            codes: &'a [u8],
            gain: Option<&'a [f32]>,
        ) -> Vec<Input<'a>> {
            let mut inputs = inputs(x_shape, x).to_vec();
            inputs[1].data = InputData::Uint8(codes);
            inputs.extend(gain.map(|g| Input {
                shape: &[16],
                data: InputData::Float32(g),
            }));
            inputs
        }
        let plain = CqMatMul::new(&attribute).unwrap();
        let mut want = [0.0; 4];
        let shaped = with(&[1, 16], &scaled, &codes, None);
        plain
            .compute(&shaped, &mut [&mut want], &kernels::Serial)
            .unwrap();
        let normed = |name: &str| match name {
            "unit_rows" => Some(1),
            _ => attribute(name),
        };
        let op = CqMatMul::new(&normed).unwrap();
        let mut got = [f32::NAN; 4];
        let shaped = with(&[1, 16], &x, &codes, Some(&gain));
        op.compute(&shaped, &mut [&mut got], &kernels::Serial)
            .unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
        assert!(
            want.iter().any(|&w| w.abs() > 0.1),
            "a product that can tell: {want:?}"
        );
        let short = with(&[1, 16], &x, &codes, Some(&gain[..8]));
        assert_eq!(
            op.compute(&short, &mut [&mut got], &kernels::Serial),
            Err(OpError(
                "needle.CqMatMul: gain holds 8 values, not cols = 16".into()
            ))
        );
    }

    #[test]
    fn a_missing_attribute_or_a_mistyped_input_is_named() {
        let no_bits = |name: &str| attribute(name).filter(|_| name != "bits");
        let missing = CqMatMul::new(&no_bits).err();
        assert_eq!(
            missing,
            Some(OpError("needle.CqMatMul: no attribute bits".into()))
        );
        let op = CqMatMul::new(&attribute).unwrap();
        let mut mistyped = inputs(&[1, 16], &[0.0; 16]);
        mistyped[2].data = InputData::Uint8(&CODES);
        assert_eq!(
            op.output_shapes(&mistyped),
            Err(OpError("needle.CqMatMul: input 2 is not Float16".into()))
        );
    }
}
