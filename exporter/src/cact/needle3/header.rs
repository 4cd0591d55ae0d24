//! The 196-byte Needle 3 header and the codebooks after it (the same 28 as Needle 2's).

use super::layout::{HEADER, MAX_LAYERS};
use crate::cact::codebooks::{read_codebooks, Codebooks};
use crate::cact::header::{CommonHeader, HeaderRules, RawHeader};
use crate::cact::CactError;
use graphs::contract::Generation;

/// The header, field for field, after validation; the global mask unpacked into layer
/// indices.
#[derive(Clone, Debug, PartialEq)]
pub struct Needle3Header {
    /// The fields Needle 2 stores too. Its `kv_window` is the window the model was sized
    /// for (0 = from the KV budget alone; upstream `effective_kv_window` writes it).
    pub common: CommonHeader,
    /// Rows of the tied output head; 0 in the file means all of `vocab`.
    pub out_vocab: u32,
    pub qk_head_dim: u32,
    pub v_head_dim: u32,
    /// Keys a local layer sees: `query_pos - key_pos < sliding_window`; 0 = none local.
    pub sliding_window: u32,
    /// Layers with full attention (the 64-bit mask's set bits), ascending.
    pub global_layers: Vec<u32>,
    /// Width of the causal depthwise conv over Q, K and V; 0 = none.
    pub qkv_conv_taps: u32,
    /// Hash seed stride between orders; 0 = tables per order.
    pub engram_seed_heads: u32,
}

/// Needle 3's head widths (`num_layers` is bounded by the mask first) and its RoPE width.
const RULES: HeaderRules = HeaderRules {
    sizes: &["qk_head_dim", "v_head_dim"],
    rope_head: "qk_head_dim",
};

impl Needle3Header {
    /// Reads and validates the header and codebooks at the start of `file` (whose tag
    /// must be Needle 3's); also returns the header's bytes for the tensor walk.
    pub(crate) fn parse(
        file: &[u8],
    ) -> Result<(Needle3Header, RawHeader<'_>, Codebooks), CactError> {
        let (raw, mut r) = RawHeader::read(file, Generation::Needle3, HEADER)?;
        let global_layers = global_layers(&raw)?;
        let common = CommonHeader::read(&raw, &RULES)?;
        let header = Needle3Header {
            out_vocab: raw.u32("out_vocab"),
            qk_head_dim: raw.u32("qk_head_dim"),
            v_head_dim: raw.u32("v_head_dim"),
            sliding_window: raw.u32("sliding_window"),
            global_layers,
            qkv_conv_taps: raw.u32("qkv_conv_taps"),
            engram_seed_heads: raw.u32("engram_seed_heads"),
            common,
        };
        header.validate(&raw)?;
        let codebooks = read_codebooks(&mut r)?;
        Ok((header, raw, codebooks))
    }

    /// The checks of the fields Needle 2 does not have.
    fn validate(&self, raw: &RawHeader<'_>) -> Result<(), CactError> {
        if self.out_vocab > self.common.vocab {
            return Err(raw.bad(
                "out_vocab",
                self.out_vocab,
                format!("at most vocab ({})", self.common.vocab),
            ));
        }
        Ok(())
    }

    /// Rows of the output head: `out_vocab`, or all of `vocab` when that is 0.
    pub fn output_rows(&self) -> u32 {
        if self.out_vocab == 0 {
            self.common.vocab
        } else {
            self.out_vocab
        }
    }

    /// Hash seed stride between orders: `engram_seed_heads`, or the heads per order
    /// when that is 0.
    pub fn seed_stride(&self) -> u32 {
        match self.engram_seed_heads {
            0 => self.common.heads_per_order(),
            stride => stride,
        }
    }
}

/// The global-attention layers the 64-bit mask names, once `num_layers` is known to be
/// one the mask can name and no bit names a layer past it.
fn global_layers(raw: &RawHeader<'_>) -> Result<Vec<u32>, CactError> {
    let num_layers = raw.u32("num_layers");
    if !(1..=MAX_LAYERS).contains(&num_layers) {
        return Err(raw.bad(
            "num_layers",
            num_layers,
            "1..=64 (the global-attention mask has 64 bits)",
        ));
    }
    let mask = u64::from(raw.u32("global_mask_lo")) | u64::from(raw.u32("global_mask_hi")) << 32;
    let stray = if num_layers < 64 {
        mask >> num_layers << num_layers
    } else {
        0
    };
    if stray != 0 {
        let field = if stray & 0xFFFF_FFFF != 0 {
            "global_mask_lo"
        } else {
            "global_mask_hi"
        };
        return Err(raw.bad(
            field,
            raw.u32(field),
            format!("bits only for layers below num_layers ({num_layers})"),
        ));
    }
    Ok((0..num_layers).filter(|i| mask >> i & 1 == 1).collect())
}
