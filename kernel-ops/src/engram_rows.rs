//! `needle.EngramRows` (`kernels/src/engram_rows.rs` states it): inputs `ids` int64
//! `[batch, len]`, `valid` float32 `[batch, len]`, the tables' `seeds` and `orders` int64
//! `[tables]`, then the site's CQ table as `codes`, `norms`, `codebook`; attributes `cols`,
//! `group`, `bits` (the table's) and `slots`. Output float32 `[batch, len, tables · cols]`.

use crate::cq_matmul::CqLayout;
use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::engram_rows::{engram_rows, NgramTables, TokenWindow};
use kernels::isa::Isa;

pub struct EngramRows {
    table: CqLayout,
    slots: usize,
    isa: Isa,
}

impl EngramRows {
    /// The ids' shape and the window and the hashes of `inputs`.
    fn operands<'a>(
        &self,
        inputs: &[Input<'a>],
    ) -> Result<(&'a [i64], TokenWindow<'a>, NgramTables<'a>), OpError> {
        let (ids_shape, ids) = Input::get::<Self, i64>(inputs, 0)?;
        let (valid_shape, valid) = Input::get::<Self, f32>(inputs, 1)?;
        let (_, seeds) = Input::get::<Self, i64>(inputs, 2)?;
        let (_, orders) = Input::get::<Self, i64>(inputs, 3)?;
        let &[_, len] = ids_shape else {
            return Err(op_error::<Self>(format!(
                "ids are {ids_shape:?}, not [batch, len]"
            )));
        };
        if valid_shape != ids_shape {
            return Err(op_error::<Self>(format!(
                "valid is {valid_shape:?}, ids {ids_shape:?}"
            )));
        }
        let window = TokenWindow {
            ids,
            valid,
            len: len as usize,
        };
        let tables = NgramTables {
            seeds,
            orders,
            slots: self.slots,
        };
        Ok((ids_shape, window, tables))
    }
}

impl NeedleOp for EngramRows {
    const NAME: &'static str = needle_ops::ENGRAM_ROWS;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Int64,   // ids
        ElementType::Float32, // valid
        ElementType::Int64,   // seeds
        ElementType::Int64,   // orders
        ElementType::Uint8,   // codes
        ElementType::Float16, // norms
        ElementType::Float32, // codebook
    ];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(EngramRows {
            table: CqLayout::of::<Self>(attribute)?,
            slots: size_attribute::<Self>(attribute, "slots")?,
            isa: Isa::best(),
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (ids_shape, _, tables) = self.operands(inputs)?;
        let width = (tables.seeds.len() * self.table.cols) as i64;
        Ok(vec![vec![ids_shape[0], ids_shape[1], width]])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (_, window, tables) = self.operands(inputs)?;
        let table = self.table.matrix::<Self>(inputs, 4)?;
        engram_rows(self.isa, &window, &tables, &table, outputs[0], split).map_err(op_error::<Self>)
    }
}
