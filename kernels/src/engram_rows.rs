//! `needle.EngramRows`: an engram site's n-gram rows for a window of tokens, in one kernel
//! (`graphs/src/blocks/engram.rs` states the hash): for every position `t` and table `τ`
//! (its order `o`, its seed), `acc = seed; for j < o: acc = ((acc ^ tok[t − j]) · 0x01000193)
//! mod 2³²; acc ^= acc >> 15`, row `acc mod slots + τ · slots` of the site's CQ table,
//! decoded and zeroed where the n-gram starts before the first valid token
//! (`valid[t − (o − 1)]`, 0 before the window). Tokens before the window count as 0.

use crate::cq_matmul::CqMatrix;
use crate::isa::Isa;
use crate::split::RowSplit;
use crate::ShapeError;

const PRIME: u64 = 0x0100_0193;
const MASK32: u64 = 0xFFFF_FFFF;

/// The window: token ids and validity, `[batch, len]` each.
#[derive(Clone, Copy, Debug)]
pub struct TokenWindow<'a> {
    pub ids: &'a [i64],
    pub valid: &'a [f32],
    pub len: usize,
}

/// The hash of each table: its seed and n-gram order, and the slots of a table.
#[derive(Clone, Copy, Debug)]
pub struct NgramTables<'a> {
    pub seeds: &'a [i64],
    pub orders: &'a [i64],
    pub slots: usize,
}

/// `out` `[batch, len, tables · cols]`: every position's rows of `table`, table by table.
pub fn engram_rows(
    isa: Isa,
    window: &TokenWindow,
    tables: &NgramTables,
    table: &CqMatrix,
    out: &mut [f32],
    split: &dyn RowSplit,
) -> Result<(), ShapeError> {
    let fail = |what: String| Err(ShapeError(what));
    let count = tables.seeds.len();
    if count == 0 || tables.orders.len() != count || tables.orders.iter().any(|&o| o < 1) {
        return fail(format!(
            "{} seeds and orders {:?}: not one positive order a table",
            count, tables.orders
        ));
    }
    if window.len == 0
        || !window.ids.len().is_multiple_of(window.len)
        || window.valid.len() != window.ids.len()
    {
        return fail("ids and valid are not one [batch, len] shape".into());
    }
    let positions = window.ids.len();
    let mut rows = Vec::with_capacity(positions * count);
    let mut ok = Vec::with_capacity(positions * count);
    for p in 0..positions {
        let (b, t) = (p / window.len, p % window.len);
        let token = |back: usize| match t.checked_sub(back) {
            Some(s) => window.ids[b * window.len + s] as u64,
            None => 0,
        };
        for (&seed, &order) in tables.seeds.iter().zip(tables.orders) {
            let mut acc = seed as u64 & MASK32;
            for j in 0..order as usize {
                acc = ((acc ^ token(j)) & MASK32).wrapping_mul(PRIME) & MASK32;
            }
            acc ^= acc >> 15;
            let table_index = rows.len() % count;
            rows.push((acc % tables.slots as u64 + (table_index * tables.slots) as u64) as i64);
            ok.push(match t.checked_sub(order as usize - 1) {
                Some(s) => window.valid[b * window.len + s],
                None => 0.0,
            });
        }
    }
    table.gather_scaled_rows(isa, &rows, Some(&ok), out, split)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    /// A 6-row table of 8 columns, 2-bit codes in one group, every norm 1.
    fn table_parts() -> (Vec<u8>, Vec<u16>, Vec<f32>) {
        let codes = (0..6 * 2).map(|i| (i * 37 % 251) as u8).collect();
        (codes, vec![0x3c00; 6], vec![0.5, -1.0, 2.0, 0.25])
    }

    /// Orders 1 and 2 over three tokens: the order-2 table's first position reaches before
    /// the window and is zeroed, as is every row of an invalid position's n-grams; the
    /// rows are those `gather_rows` decodes.
    #[test]
    fn ngrams_before_the_first_valid_token_are_zero_and_rows_are_the_tables() {
        let (codes, norms, codebook) = table_parts();
        let matrix = CqMatrix::new(6, 8, 8, 2, &codes, &norms, &codebook).unwrap();
        let window = TokenWindow {
            ids: &[5, 9, 2],
            valid: &[0.0, 1.0, 1.0],
            len: 3,
        };
        let tables = NgramTables {
            seeds: &[11, 12],
            orders: &[1, 2],
            slots: 3,
        };
        let mut out = vec![f32::NAN; 3 * 2 * 8];
        engram_rows(Isa::best(), &window, &tables, &matrix, &mut out, &Serial).unwrap();
        let zero = |p: usize, t: usize| {
            out[(p * 2 + t) * 8..(p * 2 + t + 1) * 8]
                .iter()
                .all(|&v| v == 0.0)
        };
        // Position 0 is invalid (order 1 reads it) and before the window (order 2).
        assert!(zero(0, 0) && zero(0, 1));
        // Position 1's order-2 n-gram starts at the invalid position 0.
        assert!(!zero(1, 0) && zero(1, 1));
        assert!(!zero(2, 0) && !zero(2, 1));
        // Each row is one of its table's rows, decoded.
        for (p, t) in [(1, 0), (2, 0), (2, 1)] {
            let row = &out[(p * 2 + t) * 8..(p * 2 + t + 1) * 8];
            let found = (0..3).any(|slot| {
                let mut want = vec![0.0; 8];
                matrix
                    .gather_rows(Isa::Scalar, &[(slot + 3 * t) as i64], &mut want, &Serial)
                    .unwrap();
                want == row
            });
            assert!(found, "position {p}, table {t}: not a row of its table");
        }
    }

    #[test]
    fn orders_below_one_and_tables_beyond_the_matrix_are_refused() {
        let (codes, norms, codebook) = table_parts();
        let matrix = CqMatrix::new(6, 8, 8, 2, &codes, &norms, &codebook).unwrap();
        let window = TokenWindow {
            ids: &[1, 2],
            valid: &[1.0, 1.0],
            len: 2,
        };
        let mut out = vec![0.0; 2 * 3 * 8];
        let bad_order = NgramTables {
            seeds: &[1, 2, 3],
            orders: &[1, 0, 2],
            slots: 2,
        };
        let error =
            engram_rows(Isa::best(), &window, &bad_order, &matrix, &mut out, &Serial).unwrap_err();
        assert!(
            error.0.contains("not one positive order a table"),
            "{error}"
        );
        // Three tables of 3 slots need 9 rows; the matrix has 6.
        let too_many = NgramTables {
            seeds: &[1, 2, 3],
            orders: &[1, 1, 1],
            slots: 3,
        };
        let error =
            engram_rows(Isa::best(), &window, &too_many, &matrix, &mut out, &Serial).unwrap_err();
        assert!(error.0.contains("outside the 6 rows"), "{error}");
    }
}
