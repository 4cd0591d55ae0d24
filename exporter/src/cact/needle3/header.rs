//! The 196-byte Needle 3 header and the codebooks after it (the same 28 as Needle 2's).

use super::layout::{HEADER, HEADER_BYTES, MAX_LAYERS, MAX_SITES};
use crate::cact::bytes::Reader;
use crate::cact::header::{read_codebooks, RawHeader};
use crate::cact::layout::CODEBOOK_LEN;
use crate::cact::{CactError, Codebooks};
use graphs::contract::Generation;

/// The header, field for field, after validation. `engram_orders` and `engram_sites`
/// hold only the used entries; the global mask is unpacked into layer indices.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub num_tensors: u32,
    pub codebook_len: u32,
    /// KV window the model was sized for (0 = from the KV budget alone); upstream
    /// `effective_kv_window` writes it.
    pub kv_window: u32,
    pub kv_bits: u32,
    pub vocab: u32,
    /// Rows of the tied output head; 0 in the file means all of `vocab`.
    pub out_vocab: u32,
    pub d_model: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub num_layers: u32,
    pub qk_head_dim: u32,
    pub v_head_dim: u32,
    pub max_seq_len: u32,
    pub hada_n: u32,
    pub mhc_lanes: u32,
    /// Keys a local layer sees: `query_pos - key_pos < sliding_window`; 0 = none local.
    pub sliding_window: u32,
    /// Layers with full attention (the 64-bit mask's set bits), ascending.
    pub global_layers: Vec<u32>,
    /// Width of the causal depthwise conv over Q, K and V; 0 = none.
    pub qkv_conv_taps: u32,
    pub engram_slots: u32,
    pub engram_sub_dim: u32,
    pub num_engram_tables: u32,
    pub engram_conv_taps: u32,
    pub engram_conv_dilation: u32,
    /// Hash seed stride between orders; 0 = tables per order.
    pub engram_seed_heads: u32,
    pub engram_orders: Vec<u32>,
    pub engram_sites: Vec<u32>,
    pub rope_theta: f32,
}

impl Header {
    /// Reads and validates the header and codebooks at the start of `file` (whose
    /// tag must be Needle 3's); also returns the header's bytes for the tensor walk.
    pub(crate) fn parse(file: &[u8]) -> Result<(Header, RawHeader<'_>, Codebooks), CactError> {
        let mut r = Reader::new(file, 0);
        let found = crate::model::generation_of(crate::cact::read_tag(&mut r)?)?;
        if found != Generation::Needle3 {
            return Err(CactError::OtherGeneration {
                found,
                reader: Generation::Needle3,
            });
        }
        r.take(HEADER_BYTES as usize - 4, || "header".to_string())?;
        let raw = RawHeader::new(HEADER, file);
        let header = Self::from_fields(&raw)?;
        let codebooks = read_codebooks(&mut r)?;
        Ok((header, raw, codebooks))
    }

    fn from_fields(raw: &RawHeader<'_>) -> Result<Header, CactError> {
        let num_orders = raw.u32("num_engram_orders");
        let num_sites = raw.u32("num_engram_sites");
        if !(1..=4).contains(&num_orders) {
            return Err(raw.bad("num_engram_orders", num_orders, "1..=4"));
        }
        if num_sites as usize > MAX_SITES {
            return Err(raw.bad("num_engram_sites", num_sites, "0..=16"));
        }
        let num_layers = raw.u32("num_layers");
        if !(1..=MAX_LAYERS).contains(&num_layers) {
            return Err(raw.bad(
                "num_layers",
                num_layers,
                "1..=64 (the global-attention mask has 64 bits)",
            ));
        }
        let mask =
            u64::from(raw.u32("global_mask_lo")) | u64::from(raw.u32("global_mask_hi")) << 32;
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
        let array = |name, len| (0..len as usize).map(|i| raw.element(name, i)).collect();
        let header = Header {
            num_tensors: raw.u32("num_tensors"),
            codebook_len: raw.u32("codebook_len"),
            kv_window: raw.u32("kv_window"),
            kv_bits: raw.u32("kv_bits"),
            vocab: raw.u32("vocab"),
            out_vocab: raw.u32("out_vocab"),
            d_model: raw.u32("d_model"),
            num_heads: raw.u32("num_heads"),
            num_kv_heads: raw.u32("num_kv_heads"),
            num_layers,
            qk_head_dim: raw.u32("qk_head_dim"),
            v_head_dim: raw.u32("v_head_dim"),
            max_seq_len: raw.u32("max_seq_len"),
            hada_n: raw.u32("hada_n"),
            mhc_lanes: raw.u32("mhc_lanes"),
            sliding_window: raw.u32("sliding_window"),
            global_layers: (0..num_layers).filter(|i| mask >> i & 1 == 1).collect(),
            qkv_conv_taps: raw.u32("qkv_conv_taps"),
            engram_slots: raw.u32("engram_slots"),
            engram_sub_dim: raw.u32("engram_sub_dim"),
            num_engram_tables: raw.u32("num_engram_tables"),
            engram_conv_taps: raw.u32("engram_conv_taps"),
            engram_conv_dilation: raw.u32("engram_conv_dilation"),
            engram_seed_heads: raw.u32("engram_seed_heads"),
            engram_orders: array("engram_orders", num_orders),
            engram_sites: array("engram_sites", num_sites),
            rope_theta: raw.f32("rope_theta"),
        };
        header.validate(raw)?;
        Ok(header)
    }

    fn validate(&self, raw: &RawHeader<'_>) -> Result<(), CactError> {
        if self.codebook_len != CODEBOOK_LEN {
            return Err(raw.bad(
                "codebook_len",
                self.codebook_len,
                "28 (cb2[4] | cb3[8] | cb4[16])",
            ));
        }
        if ![2, 3, 4, 8].contains(&self.kv_bits) {
            return Err(raw.bad("kv_bits", self.kv_bits, "2, 3, 4 or 8"));
        }
        let sizes = [
            "vocab",
            "d_model",
            "num_heads",
            "num_kv_heads",
            "qk_head_dim",
            "v_head_dim",
            "max_seq_len",
            "hada_n",
            "mhc_lanes",
            "engram_slots",
            "engram_sub_dim",
            "num_engram_tables",
            "engram_conv_taps",
            "engram_conv_dilation",
        ];
        for field in sizes {
            if raw.u32(field) == 0 {
                return Err(raw.bad(field, 0, "a nonzero size"));
            }
        }
        if self.out_vocab > self.vocab {
            return Err(raw.bad(
                "out_vocab",
                self.out_vocab,
                format!("at most vocab ({})", self.vocab),
            ));
        }
        raw.check_heads(
            [self.num_heads, self.num_kv_heads],
            ("qk_head_dim", self.qk_head_dim),
            [self.d_model, self.hada_n],
        )?;
        if self.qkv_conv_taps > 16 {
            return Err(raw.bad("qkv_conv_taps", self.qkv_conv_taps, "0..=16"));
        }
        raw.check_engram_and_rope(
            self.num_engram_tables,
            &self.engram_orders,
            &self.engram_sites,
            self.num_layers,
            self.rope_theta,
        )
    }

    /// Rows of the output head: `out_vocab`, or all of `vocab` when that is 0.
    pub fn output_rows(&self) -> u32 {
        if self.out_vocab == 0 {
            self.vocab
        } else {
            self.out_vocab
        }
    }
}
