//! Rows of a CQ matrix decoded as they are gathered (`needle.CqGather`: embedding and
//! engram tables kept as their codes): row `r`, group `g` is `(codebook[idx] · norm) H`.

use super::activations::Layout;
use super::{scalar, CqMatrix};
use crate::f16;
use crate::hadamard::rotate_groups;
use crate::isa::Isa;
use crate::split::{token_blocks, RowSplit};
use crate::ShapeError;

/// Rows a thread decodes at once.
const BLOCK_ROWS: usize = 16;

impl CqMatrix<'_> {
    /// Rows `indices` into `out` (`[indices, cols]`), decoded on `isa`, spread by `split`;
    /// an index outside the matrix is an error naming it, found before anything is written.
    pub fn gather_rows(
        &self,
        isa: Isa,
        indices: &[i64],
        out: &mut [f32],
        split: &dyn RowSplit,
    ) -> Result<(), ShapeError> {
        self.gather_scaled_rows(isa, indices, None, out, split)
    }

    /// [`CqMatrix::gather_rows`], row `i` multiplied by `scales[i]` where given.
    pub fn gather_scaled_rows(
        &self,
        isa: Isa,
        indices: &[i64],
        scales: Option<&[f32]>,
        out: &mut [f32],
        split: &dyn RowSplit,
    ) -> Result<(), ShapeError> {
        assert_eq!(
            out.len(),
            indices.len() * self.cols,
            "out is [indices, cols]"
        );
        assert!(
            scales.is_none_or(|s| s.len() == indices.len()),
            "a scale a row"
        );
        if let Some(bad) = indices
            .iter()
            .find(|&&r| !(0..self.rows as i64).contains(&r))
        {
            return Err(ShapeError(format!(
                "row {bad} is outside the {} rows",
                self.rows
            )));
        }
        token_blocks(
            split,
            out,
            self.cols,
            BLOCK_ROWS,
            |first: usize, block: &mut [f32]| {
                let mut padded = vec![0.0f32; self.groups() * self.group];
                for (i, row) in (first..).zip(block.chunks_exact_mut(self.cols)) {
                    self.decode_row_into(isa, indices[i] as usize, &mut padded);
                    row.copy_from_slice(&padded[..self.cols]);
                    if let Some(scales) = scales {
                        row.iter_mut().for_each(|v| *v *= scales[i]);
                    }
                }
            },
        );
        Ok(())
    }

    /// Row `r` over its padded width, as upstream decodes it, on `isa`: AVX-512 (where the
    /// codes fit its 16-lane layout) looks the codes up and rotates the groups in vectors,
    /// the same bits as one value at a time.
    pub(super) fn decode_row_into(&self, isa: Isa, r: usize, padded: &mut [f32]) {
        let layout = Layout::new(isa, self.bits, self.group);
        match layout.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                let mut arranged = super::Aligned::reused(&super::BLOCK_SCRATCH, padded.len());
                let table = self.table();
                // Sound: a layout is AVX-512's only where `Isa::available` detected it, and
                // only for codes in whole 16-lane chunks of a group.
                unsafe {
                    let arranged = arranged.as_mut_slice();
                    super::avx512::decode(self.row_codes(r), self.bits, &table.values, arranged);
                    // The lookups' 16-lane order back into the inputs' own.
                    super::avx512::natural(arranged, 8 / self.bits, padded);
                }
            }
            _ => scalar::decode(self.row_codes(r), self.bits, self.codebook, padded),
        }
        let norms = &self.norms[r * self.groups()..(r + 1) * self.groups()];
        for (group, &norm) in padded.chunks_exact_mut(self.group).zip(norms) {
            let norm = f16::to_f32(norm);
            group.iter_mut().for_each(|v| *v *= norm);
        }
        rotate_groups(isa, padded, self.group);
    }
}
