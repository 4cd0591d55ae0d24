//! The Needle 3 `.cact` layout (`cactus-needle==3.2.8`, `needle/model/export.py`,
//! tag `0x05E12A84`) declared once, as data, with the field and walk types of
//! [`crate::cact::layout`]. Upstream's docstring says the header is 120
//! bytes; the writer packs `<48If>`, 196 bytes, and that is what this declares.
//!
//! ```text
//! header (196 B) | codebooks (28 f32) | directory (num_tensors x 44 B) | 64-aligned blobs
//! walk: embedding | layers | mHC | hada_p1, hada_p2 | engram sites | final_norm
//!       | [heads.manifest, heads] | [Whistle audio section] | tokenizer
//! ```

use crate::cact::layout::{
    one, tensor, tensor_if, u32s, word, DerivedSize, Field, FieldType, HeaderLayout, Repeat,
    TensorGroup,
};
/// Layers the 64-bit global-attention mask can name.
pub const MAX_LAYERS: u32 = 64;
/// Engram sites the header has room for.
pub const MAX_SITES: usize = 16;
/// First value of the Whistle `audio.manifest` tensor.
pub const AUDIO_MAGIC: f32 = 3246.0;

/// The header fields in file order, packed (`<48If>`). `engram_orders` takes 4 words
/// and `engram_sites` 16; only the first `num_engram_orders` / `num_engram_sites` are used.
pub const HEADER_FIELDS: [Field; 31] = [
    word("tag"),
    word("num_tensors"),
    word("codebook_len"),
    word("kv_window"),
    word("kv_bits"),
    word("vocab"),
    word("out_vocab"),
    word("d_model"),
    word("num_heads"),
    word("num_kv_heads"),
    word("num_layers"),
    word("qk_head_dim"),
    word("v_head_dim"),
    word("max_seq_len"),
    word("hada_n"),
    word("mhc_lanes"),
    word("sliding_window"),
    word("global_mask_lo"),
    word("global_mask_hi"),
    word("qkv_conv_taps"),
    word("engram_slots"),
    word("engram_sub_dim"),
    word("num_engram_tables"),
    word("engram_conv_taps"),
    word("engram_conv_dilation"),
    word("engram_seed_heads"),
    word("num_engram_orders"),
    u32s("engram_orders", 4),
    word("num_engram_sites"),
    u32s("engram_sites", MAX_SITES),
    one("rope_theta", FieldType::F32),
];

/// The Needle 3 header, with the Monarch factor sizes derived from `hada_n`.
pub const HEADER: HeaderLayout = HeaderLayout {
    fields: &HEADER_FIELDS,
    derived: &[
        DerivedSize {
            name: "monarch_a",
            field: "hada_n",
            size: monarch_a,
        },
        DerivedSize {
            name: "monarch_b",
            field: "hada_n",
            size: monarch_b,
        },
    ],
};

/// Size of the fixed header in bytes (196).
pub const HEADER_BYTES: u64 = HEADER.bytes();

/// File offset of header field `name` (its first element for the arrays).
///
/// # Panics
/// When no header field has that name.
pub const fn header_offset(name: &str) -> u64 {
    HEADER.offset(name)
}

/// File offset of element `element` of header field `name`.
pub const fn header_element_offset(name: &str, element: usize) -> u64 {
    HEADER.element_offset(name, element)
}

/// File offset of the directory: after the header and `codebook_len` codebook entries.
pub const fn directory_start(codebook_len: u32) -> u64 {
    HEADER.directory_start(codebook_len)
}

/// The two Monarch factor sizes `(a, b)` of a width-`n` MLP, `a * b = n`
/// (upstream `_hada_blocks`: `a = 2^(bit_length(n - 1) // 2)`).
pub fn monarch_blocks(n: u64) -> (u64, u64) {
    let bit_length = 64 - n.saturating_sub(1).leading_zeros();
    let a = 1u64 << (bit_length / 2);
    (a, n / a)
}

fn monarch_a(hada_n: u64) -> u64 {
    monarch_blocks(hada_n).0
}

fn monarch_b(hada_n: u64) -> u64 {
    monarch_blocks(hada_n).1
}

/// The 24 tensors of each layer (27 with the QKV conv taps), `layer00.norm_in` first.
pub const LAYER: TensorGroup = TensorGroup {
    repeat: Repeat::Indexed {
        count: "num_layers",
        prefix: "layer",
        digits: 2,
    },
    tensors: &[
        tensor("norm_in", &["d_model"]),
        tensor("q_proj", &["num_heads*qk_head_dim", "d_model"]),
        tensor("k_proj", &["num_kv_heads*qk_head_dim", "d_model"]),
        tensor("v_proj", &["num_kv_heads*v_head_dim", "d_model"]),
        tensor_if(
            "qkv_conv_taps",
            "q_taps",
            &["qkv_conv_taps", "num_heads*qk_head_dim"],
        ),
        tensor_if(
            "qkv_conv_taps",
            "k_taps",
            &["qkv_conv_taps", "num_kv_heads*qk_head_dim"],
        ),
        tensor_if(
            "qkv_conv_taps",
            "v_taps",
            &["qkv_conv_taps", "num_kv_heads*v_head_dim"],
        ),
        tensor("q_norm", &["qk_head_dim"]),
        tensor("k_norm", &["qk_head_dim"]),
        tensor("gate_proj", &["num_heads*v_head_dim", "d_model"]),
        tensor("out_proj", &["d_model", "num_heads*v_head_dim"]),
        tensor("post_norm", &["d_model"]),
        tensor("attn_gate", &["1"]),
        tensor("pre_hada", &["d_model"]),
        tensor("d1", &["hada_n"]),
        tensor("d2", &["hada_n"]),
        tensor("b2", &["hada_n"]),
        tensor("d3", &["hada_n"]),
        tensor("d4", &["hada_n"]),
        tensor("w1a", &["monarch_a", "monarch_a"]),
        tensor("w1b", &["monarch_b", "monarch_b"]),
        tensor("w2a", &["monarch_a", "monarch_a"]),
        tensor("w2b", &["monarch_b", "monarch_b"]),
        tensor("w3a", &["monarch_a", "monarch_a"]),
        tensor("w3b", &["monarch_b", "monarch_b"]),
        tensor("cond_v", &["d_model", "8"]),
        tensor("cond_u", &["8", "hada_n"]),
    ],
};

/// The Monarch MLP's two fixed permutations, FP32 indices (upstream `_hada_perms`).
pub const PERMUTATIONS: TensorGroup = TensorGroup {
    repeat: Repeat::Once,
    tensors: &[
        tensor("hada_p1", &["hada_n"]),
        tensor("hada_p2", &["hada_n"]),
    ],
};

/// The embedding (in Needle 3 its first `out_vocab` rows are the tied head), hyper-connection,
/// engram and final-norm tensors are Needle 2's, field names and all.
pub use crate::cact::layout::{EMBEDDING, ENGRAM, FINAL_NORM, MHC};

/// The fixed part of the positional tensor order, `embedding` through `final_norm`.
/// After it come `heads.manifest` and the probe heads it lists, the optional Whistle
/// audio section, then the RAW `tokenizer`, read in `needle3/mod.rs`.
pub const CORE_WALK: [TensorGroup; 6] = [EMBEDDING, LAYER, MHC, PERMUTATIONS, ENGRAM, FINAL_NORM];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_offsets_are_upstreams() {
        // struct.calcsize("<48If") and the positions of `_pack_cact`'s fields.
        assert_eq!(HEADER_BYTES, 196);
        assert_eq!(header_offset("out_vocab"), 24);
        assert_eq!(header_offset("sliding_window"), 64);
        assert_eq!(header_offset("qkv_conv_taps"), 76);
        assert_eq!(header_offset("engram_seed_heads"), 100);
        assert_eq!(header_offset("num_engram_orders"), 104);
        assert_eq!(header_offset("num_engram_sites"), 124);
        assert_eq!(header_element_offset("engram_sites", 15), 188);
        assert_eq!(header_offset("rope_theta"), 192);
    }

    #[test]
    fn monarch_factors_are_upstreams() {
        // _hada_blocks(1024) == (32, 32); (64) == (8, 8); (128) == (8, 16); (256) == (16, 16).
        assert_eq!(monarch_blocks(1024), (32, 32));
        assert_eq!(monarch_blocks(64), (8, 8));
        assert_eq!(monarch_blocks(128), (8, 16));
        assert_eq!(monarch_blocks(256), (16, 16));
        assert_eq!(monarch_blocks(2), (1, 2));
    }
}
