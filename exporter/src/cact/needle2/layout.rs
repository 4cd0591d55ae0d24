//! The Needle 2 `.cact` layout (`cactus-needle==2.0.15`, `needle/model/export.py`, tag
//! `0x05E12A83`) declared once, as data, with the field and walk types of
//! [`crate::cact::layout`]. `exporter/layout/needle2.json` is its rendering for the
//! Python scripts (regenerated and checked by this module's test).
//!
//! ```text
//! header (120 B) | codebooks (28 f32) | directory (num_tensors x 44 B) | 64-aligned blobs
//! walk: embedding | layers | mHC | engram sites | final_norm | [heads.manifest, heads] | tokenizer
//! ```

use crate::cact::layout::{
    one, tensor, u32s, word, Field, FieldType, HeaderLayout, Repeat, TensorGroup,
};

/// The header fields in file order, packed (no padding). `engram_orders` and
/// `engram_sites` always take 4 words; only the first `num_engram_orders` /
/// `num_engram_sites` are used.
pub const HEADER_FIELDS: [Field; 24] = [
    word("tag"),
    word("num_tensors"),
    word("codebook_len"),
    word("kv_window"),
    word("kv_bits"),
    word("vocab"),
    word("d_model"),
    word("num_heads"),
    word("num_kv_heads"),
    word("num_layers"),
    word("head_dim"),
    word("max_seq_len"),
    word("hada_n"),
    word("mhc_lanes"),
    word("engram_slots"),
    word("engram_sub_dim"),
    word("num_engram_tables"),
    word("engram_conv_taps"),
    word("engram_conv_dilation"),
    word("num_engram_orders"),
    u32s("engram_orders", 4),
    word("num_engram_sites"),
    u32s("engram_sites", 4),
    one("rope_theta", FieldType::F32),
];

/// Size of the fixed header in bytes (120).
pub const HEADER_BYTES: u64 = HEADER.bytes();

/// The Needle 2 header.
pub const HEADER: HeaderLayout = HeaderLayout {
    fields: &HEADER_FIELDS,
    derived: &[],
};

/// Position of the Needle 2 header field `name` in [`HEADER_FIELDS`].
///
/// # Panics
/// When no header field has that name (at compile time in a const context).
pub const fn header_field_index(name: &str) -> usize {
    HEADER.index(name)
}

/// File offset of Needle 2 header field `name` (its first element for the arrays),
/// e.g. `header_offset("num_layers") == 36`.
///
/// # Panics
/// When no header field has that name.
pub const fn header_offset(name: &str) -> u64 {
    HEADER.offset(name)
}

/// File offset of element `element` of Needle 2 header field `name`, e.g.
/// `header_element_offset("engram_sites", 1) == 104`.
///
/// # Panics
/// When no header field has that name or `element` is not below its count.
pub const fn header_element_offset(name: &str, element: usize) -> u64 {
    HEADER.element_offset(name, element)
}

/// File offset of the directory: after the header and `codebook_len` f32 codebook entries.
pub const fn directory_start(codebook_len: u32) -> u64 {
    HEADER.directory_start(codebook_len)
}

/// The 14 tensors of each layer, `layer00.norm_in` first.
pub const LAYER: TensorGroup = TensorGroup {
    repeat: Repeat::Indexed {
        count: "num_layers",
        prefix: "layer",
        digits: 2,
    },
    tensors: &[
        tensor("norm_in", &["d_model"]),
        tensor("q_proj", &["num_heads*head_dim", "d_model"]),
        tensor("k_proj", &["num_kv_heads*head_dim", "d_model"]),
        tensor("v_proj", &["num_kv_heads*head_dim", "d_model"]),
        tensor("q_norm", &["head_dim"]),
        tensor("k_norm", &["head_dim"]),
        tensor("gate_proj", &["num_heads*head_dim", "d_model"]),
        tensor("out_proj", &["d_model", "num_heads*head_dim"]),
        tensor("post_norm", &["d_model"]),
        tensor("attn_gate", &["1"]),
        tensor("pre_hada", &["d_model"]),
        tensor("d1", &["hada_n"]),
        tensor("d2", &["hada_n"]),
        tensor("d3", &["hada_n"]),
    ],
};

/// The embedding, hyper-connection, engram and final-norm tensors, which Needle 3 stores alike.
pub use crate::cact::layout::{EMBEDDING, ENGRAM, FINAL_NORM, MHC};

/// The fixed part of the positional tensor order (upstream `export._tensors`),
/// `embedding` through `final_norm`, every tensor FP16, FP32 or (matrices) CQ.
/// After it come `heads.manifest` and the probe heads it lists, then the RAW
/// `tokenizer`; those depend on the manifest and are read in `needle2/mod.rs`.
pub const CORE_WALK: [TensorGroup; 5] = [EMBEDDING, LAYER, MHC, ENGRAM, FINAL_NORM];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cact::layout::{ALIGN, CODEBOOK_LEN, RECORD_BYTES, RECORD_FIELDS};
    use crate::cact::tag::{NEEDLE2_TAG, NEEDLE3_TAG};
    use serde_json::{json, Value};

    #[test]
    fn sizes_and_offsets_are_upstreams() {
        assert_eq!(HEADER_BYTES, 120);
        assert_eq!(header_offset("num_tensors"), 4);
        assert_eq!(header_offset("num_engram_orders"), 76);
        assert_eq!(header_element_offset("engram_sites", 1), 104);
        assert_eq!(header_offset("rope_theta"), 116);
        assert_eq!(directory_start(CODEBOOK_LEN), 232);
    }

    #[test]
    fn every_header_field_is_one_word_wide() {
        // The reader addresses the header as 4-byte words.
        assert!(HEADER_FIELDS.iter().all(|f| f.ty.bytes() == 4));
    }

    /// The element's code in a Python `struct` format.
    fn struct_code(ty: FieldType) -> char {
        match ty {
            FieldType::U8 => 'B',
            FieldType::U16 => 'H',
            FieldType::U32 => 'I',
            FieldType::U64 => 'Q',
            FieldType::F32 => 'f',
        }
    }

    fn type_name(ty: FieldType) -> &'static str {
        match ty {
            FieldType::U8 => "u8",
            FieldType::U16 => "u16",
            FieldType::U32 => "u32",
            FieldType::U64 => "u64",
            FieldType::F32 => "f32",
        }
    }

    /// `<29If`: runs of one type merged.
    fn struct_format(fields: &[Field]) -> String {
        let mut runs: Vec<(char, usize)> = Vec::new();
        for f in fields {
            let code = struct_code(f.ty);
            match runs.last_mut() {
                Some((last, n)) if *last == code => *n += f.count,
                _ => runs.push((code, f.count)),
            }
        }
        let body: String = runs
            .iter()
            .map(|&(c, n)| {
                if n == 1 {
                    c.to_string()
                } else {
                    format!("{n}{c}")
                }
            })
            .collect();
        format!("<{body}")
    }

    fn fields_json(fields: &[Field]) -> Value {
        let mut at = 0;
        fields
            .iter()
            .map(|f| {
                let v =
                    json!({"name": f.name, "offset": at, "type": type_name(f.ty), "count": f.count});
                at += f.bytes();
                v
            })
            .collect()
    }

    fn group_json(g: &TensorGroup) -> Value {
        let (count, name) = match g.repeat {
            Repeat::Once => (Value::Null, "{tensor}".to_string()),
            Repeat::Indexed {
                count,
                prefix,
                digits,
            } => {
                let index = if digits == 0 {
                    "{index}".to_string()
                } else {
                    format!("{{index:0{digits}}}")
                };
                (json!(count), format!("{prefix}{index}.{{tensor}}"))
            }
        };
        let tensors: Vec<Value> = g
            .tensors
            .iter()
            .map(|t| json!({"name": t.name, "shape": t.shape}))
            .collect();
        json!({"count": count, "name": name, "tensors": tensors})
    }

    fn render() -> String {
        let layout = json!({
            "about": "Needle 2 .cact layout, rendered from exporter/src/cact/needle2/layout.rs by its \
                      unit test; regenerate with NEEDLE_WRITE_LAYOUT=1 cargo test -p exporter layout. \
                      Little-endian, packed. Shapes are products of header fields (\"1\" is a \
                      literal one). A group with a count repeats once per index below that header \
                      field, its names formatted with str.format(index=, tensor=). After the walk: \
                      heads.manifest and the probe heads it lists (if any), then the RAW tokenizer.",
            "tag": NEEDLE2_TAG,
            "needle3_tag": NEEDLE3_TAG,
            "header_bytes": HEADER_BYTES,
            "header_format": struct_format(&HEADER_FIELDS),
            "header": fields_json(&HEADER_FIELDS),
            "codebook_len": CODEBOOK_LEN,
            "record_bytes": RECORD_BYTES,
            "record_format": struct_format(&RECORD_FIELDS),
            "record": fields_json(&RECORD_FIELDS),
            "align": ALIGN,
            "walk": CORE_WALK.iter().map(group_json).collect::<Vec<_>>(),
        });
        serde_json::to_string_pretty(&layout).unwrap() + "\n"
    }

    #[test]
    fn layout_json_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/layout/needle2.json");
        let rendered = render();
        if std::env::var_os("NEEDLE_WRITE_LAYOUT").is_some() {
            std::fs::write(path, &rendered).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == rendered,
            "{path} differs from cact/needle2/layout.rs; regenerate it with \
             NEEDLE_WRITE_LAYOUT=1 cargo test -p exporter layout"
        );
    }
}
