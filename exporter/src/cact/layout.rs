//! The Needle 2 `.cact` layout (`cactus-needle==2.0.15`, `needle/model/export.py`)
//! declared once, as data: the header fields, the directory record and the
//! positional tensor walk. The reader, the hostile-file tests and the fuzzer
//! take every offset and name from here; `exporter/layout/needle2.json` is the
//! rendering for the Python scripts (regenerated and checked by this module's test).
//!
//! ```text
//! header (120 B) | codebooks (28 f32) | directory (num_tensors x 44 B) | 64-aligned blobs
//! ```

use super::directory::Slot;
use super::header::RawHeader;
use super::CactError;

/// First u32 of a Needle 2 `.cact`.
pub const TAG: u32 = 0x05E1_2A83;
/// First u32 of a Needle 3 `.cact`, which this crate does not read.
pub const NEEDLE3_TAG: u32 = 0x05E1_2A84;
/// `codebook_len`: the f32 entries after the header, `cb2[4] | cb3[8] | cb4[16]`.
pub const CODEBOOK_LEN: u32 = 28;
/// Every blob starts on a multiple of this.
pub const ALIGN: u64 = 64;

/// The little-endian type of a field's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    U8,
    U16,
    U32,
    U64,
    F32,
}

impl FieldType {
    /// Bytes per element.
    pub const fn bytes(self) -> u64 {
        match self {
            FieldType::U8 => 1,
            FieldType::U16 => 2,
            FieldType::U32 | FieldType::F32 => 4,
            FieldType::U64 => 8,
        }
    }
}

/// One field of a packed little-endian struct: `count` consecutive elements of `ty`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Upstream name (`num_layers`, `engram_sites`, `nbytes`, ...).
    pub name: &'static str,
    /// Type of each element.
    pub ty: FieldType,
    /// 1 for a scalar, the array length otherwise.
    pub count: usize,
}

impl Field {
    /// Size of the whole field in bytes.
    pub const fn bytes(&self) -> u64 {
        self.ty.bytes() * self.count as u64
    }
}

const fn one(name: &'static str, ty: FieldType) -> Field {
    Field { name, ty, count: 1 }
}

const fn u32s(name: &'static str, count: usize) -> Field {
    Field {
        name,
        ty: FieldType::U32,
        count,
    }
}

/// The header fields in file order, packed (no padding). `engram_orders` and
/// `engram_sites` always take 4 words; only the first `num_engram_orders` /
/// `num_engram_sites` are used.
pub const HEADER_FIELDS: [Field; 24] = [
    one("tag", FieldType::U32),
    one("num_tensors", FieldType::U32),
    one("codebook_len", FieldType::U32),
    one("kv_window", FieldType::U32),
    one("kv_bits", FieldType::U32),
    one("vocab", FieldType::U32),
    one("d_model", FieldType::U32),
    one("num_heads", FieldType::U32),
    one("num_kv_heads", FieldType::U32),
    one("num_layers", FieldType::U32),
    one("head_dim", FieldType::U32),
    one("max_seq_len", FieldType::U32),
    one("hada_n", FieldType::U32),
    one("mhc_lanes", FieldType::U32),
    one("engram_slots", FieldType::U32),
    one("engram_sub_dim", FieldType::U32),
    one("num_engram_tables", FieldType::U32),
    one("engram_conv_taps", FieldType::U32),
    one("engram_conv_dilation", FieldType::U32),
    one("num_engram_orders", FieldType::U32),
    u32s("engram_orders", 4),
    one("num_engram_sites", FieldType::U32),
    u32s("engram_sites", 4),
    one("rope_theta", FieldType::F32),
];

/// Size of the fixed header in bytes (120).
pub const HEADER_BYTES: u64 = struct_bytes(&HEADER_FIELDS);

/// A field of a directory record; its discriminant indexes [`RECORD_FIELDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordField {
    Dtype,
    Ndim,
    Pad,
    Dims,
    BlobOffset,
    NBytes,
    Group,
    Bits,
}

impl RecordField {
    /// Every field, in record order.
    pub const ALL: [RecordField; 8] = [
        RecordField::Dtype,
        RecordField::Ndim,
        RecordField::Pad,
        RecordField::Dims,
        RecordField::BlobOffset,
        RecordField::NBytes,
        RecordField::Group,
        RecordField::Bits,
    ];

    /// The field's name, type and element count.
    pub const fn spec(self) -> Field {
        RECORD_FIELDS[self as usize]
    }
}

/// The directory record's fields in order, packed: `<BBH4IQQII>`. `dims`
/// holds the first `ndim` dimensions, the rest 0; `group`/`bits` are 0
/// except for CQ tensors.
pub const RECORD_FIELDS: [Field; 8] = [
    one("dtype", FieldType::U8),
    one("ndim", FieldType::U8),
    one("pad", FieldType::U16),
    u32s("dims", 4),
    one("blob_offset", FieldType::U64),
    one("nbytes", FieldType::U64),
    one("group", FieldType::U32),
    one("bits", FieldType::U32),
];

/// Size of one directory record in bytes (44).
pub const RECORD_BYTES: u64 = struct_bytes(&RECORD_FIELDS);

const fn struct_bytes(fields: &[Field]) -> u64 {
    let mut total = 0;
    let mut i = 0;
    while i < fields.len() {
        total += fields[i].bytes();
        i += 1;
    }
    total
}

/// Byte offset of `fields[index]` from the start of its struct.
const fn offset_in(fields: &[Field], index: usize) -> u64 {
    struct_bytes(fields.split_at(index).0)
}

/// Offset of element `element` of `fields[index]`; panics past the field's end.
const fn element_offset_in(fields: &[Field], index: usize, element: usize) -> u64 {
    let field = &fields[index];
    assert!(element < field.count, "element past the end of the field");
    offset_in(fields, index) + field.ty.bytes() * element as u64
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A generation's header, addressed by field name: its fields in file order,
/// packed, every one a whole number of u32 words.
#[derive(Clone, Copy, Debug)]
pub struct HeaderLayout {
    pub fields: &'static [Field],
    /// Dimension symbols of the tensor walk that are functions of the header rather
    /// than fields of it (Needle 3's Monarch factor sizes), with their values.
    pub(crate) derived: &'static [DerivedSize],
}

/// A walk dimension computed from header fields: its symbol and how to compute it.
pub(crate) type DerivedSize = (&'static str, fn(&RawHeader<'_>) -> u64);

impl HeaderLayout {
    /// Position of the field `name` in `fields`, if there is one.
    pub const fn find(&self, name: &str) -> Option<usize> {
        let mut i = 0;
        while i < self.fields.len() {
            if same(self.fields[i].name, name) {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// Size of the header in bytes.
    pub const fn bytes(&self) -> u64 {
        struct_bytes(self.fields)
    }

    /// Position of the field `name` in `fields`.
    ///
    /// # Panics
    /// When no header field has that name (at compile time in a const context).
    pub const fn index(&self, name: &str) -> usize {
        match self.find(name) {
            Some(i) => i,
            None => panic!("no header field of this name"),
        }
    }

    /// File offset of field `name` (its first element for the arrays).
    pub const fn offset(&self, name: &str) -> u64 {
        offset_in(self.fields, self.index(name))
    }

    /// File offset of element `element` of field `name`.
    ///
    /// # Panics
    /// When no header field has that name or `element` is not below its count.
    pub const fn element_offset(&self, name: &str, element: usize) -> u64 {
        element_offset_in(self.fields, self.index(name), element)
    }
}

/// The Needle 2 header.
pub const NEEDLE2_HEADER: HeaderLayout = HeaderLayout {
    fields: &HEADER_FIELDS,
    derived: &[],
};

/// Position of the Needle 2 header field `name` in [`HEADER_FIELDS`].
///
/// # Panics
/// When no header field has that name (at compile time in a const context).
pub const fn header_field_index(name: &str) -> usize {
    NEEDLE2_HEADER.index(name)
}

/// File offset of Needle 2 header field `name` (its first element for the arrays),
/// e.g. `header_offset("num_layers") == 36`.
///
/// # Panics
/// When no header field has that name.
pub const fn header_offset(name: &str) -> u64 {
    NEEDLE2_HEADER.offset(name)
}

/// File offset of element `element` of Needle 2 header field `name`, e.g.
/// `header_element_offset("engram_sites", 1) == 104`.
///
/// # Panics
/// When no header field has that name or `element` is not below its count.
pub const fn header_element_offset(name: &str, element: usize) -> u64 {
    NEEDLE2_HEADER.element_offset(name, element)
}

/// Offset of `field` from the start of its directory record, e.g.
/// `record_field_offset(RecordField::Bits) == 40`.
pub const fn record_field_offset(field: RecordField) -> u64 {
    offset_in(&RECORD_FIELDS, field as usize)
}

/// Offset of element `element` of `field` from the start of its record, e.g.
/// `record_element_offset(RecordField::Dims, 1) == 8`.
///
/// # Panics
/// When `element` is not below the field's count.
pub const fn record_element_offset(field: RecordField, element: usize) -> u64 {
    element_offset_in(&RECORD_FIELDS, field as usize, element)
}

/// File offset of a Needle 2 directory: after the header and `codebook_len` f32 codebook entries.
pub const fn directory_start(codebook_len: u32) -> u64 {
    HEADER_BYTES + 4 * codebook_len as u64
}

/// One tensor of the walk. Each dimension is a product of header fields, integer
/// literals and the layout's derived sizes, written `a*b*c`, e.g.
/// `["num_heads*head_dim", "d_model"]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Upstream name within its group (`q_proj`, `mhc_phi_res`, ...).
    pub name: &'static str,
    /// Symbolic dimensions, outermost first.
    pub shape: &'static [&'static str],
    /// The header field that must be nonzero for the tensor to be stored (`None`: always).
    pub when: Option<&'static str>,
}

/// How often a group of tensors appears in the walk and how its copies are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// One copy, named as the tensor itself.
    Once,
    /// One copy per index below the header field `count`; copy `i` of tensor
    /// `t` is named `{prefix}{i}.{t}` with `i` zero-padded to `digits`.
    Indexed {
        count: &'static str,
        prefix: &'static str,
        digits: usize,
    },
}

/// Consecutive tensors of the walk, all repeated the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorGroup {
    pub repeat: Repeat,
    /// In file order; for an indexed group, all of copy 0, then all of copy 1, ...
    pub tensors: &'static [TensorSpec],
}

impl TensorGroup {
    /// Upstream name of copy `index` of `tensor`, e.g. `layer03.k_proj`, `engram1.taps`.
    pub fn tensor_name(&self, index: usize, tensor: &str) -> String {
        match self.repeat {
            Repeat::Once => tensor.to_string(),
            Repeat::Indexed { prefix, digits, .. } => format!("{prefix}{index:0digits$}.{tensor}"),
        }
    }
}

pub(crate) const fn tensor(name: &'static str, shape: &'static [&'static str]) -> TensorSpec {
    TensorSpec {
        name,
        shape,
        when: None,
    }
}

/// A tensor stored only when header field `field` is nonzero.
pub(crate) const fn tensor_if(
    field: &'static str,
    name: &'static str,
    shape: &'static [&'static str],
) -> TensorSpec {
    TensorSpec {
        name,
        shape,
        when: Some(field),
    }
}

/// `embedding`, `[vocab, d_model]`.
pub const EMBEDDING: TensorGroup = TensorGroup {
    repeat: Repeat::Once,
    tensors: &[tensor("embedding", &["vocab", "d_model"])],
};

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

/// The nine hyper-connection tensors, stacked over layers.
pub const MHC: TensorGroup = TensorGroup {
    repeat: Repeat::Once,
    tensors: &[
        tensor("mhc_a_pre", &["num_layers"]),
        tensor("mhc_a_post", &["num_layers"]),
        tensor("mhc_a_res", &["num_layers"]),
        tensor("mhc_b_pre", &["num_layers", "mhc_lanes"]),
        tensor("mhc_b_post", &["num_layers", "mhc_lanes"]),
        tensor("mhc_b_res", &["num_layers", "mhc_lanes", "mhc_lanes"]),
        tensor(
            "mhc_phi_pre",
            &["num_layers*mhc_lanes", "mhc_lanes*d_model"],
        ),
        tensor(
            "mhc_phi_post",
            &["num_layers*mhc_lanes", "mhc_lanes*d_model"],
        ),
        tensor(
            "mhc_phi_res",
            &["num_layers*mhc_lanes*mhc_lanes", "mhc_lanes*d_model"],
        ),
    ],
};

/// The four tensors of each engram site, `engram0.tables` first.
pub const ENGRAM: TensorGroup = TensorGroup {
    repeat: Repeat::Indexed {
        count: "num_engram_sites",
        prefix: "engram",
        digits: 0,
    },
    tensors: &[
        tensor(
            "tables",
            &["num_engram_tables*engram_slots", "engram_sub_dim"],
        ),
        tensor("key_proj", &["d_model", "num_engram_tables*engram_sub_dim"]),
        tensor(
            "value_proj",
            &["d_model", "num_engram_tables*engram_sub_dim"],
        ),
        tensor("taps", &["engram_conv_taps", "d_model"]),
    ],
};

/// `final_norm`, `[d_model]`.
pub const FINAL_NORM: TensorGroup = TensorGroup {
    repeat: Repeat::Once,
    tensors: &[tensor("final_norm", &["d_model"])],
};

/// The fixed part of the positional tensor order (upstream `export._tensors`),
/// `embedding` through `final_norm`, every tensor FP16, FP32 or (matrices) CQ.
/// After it come `heads.manifest` and the probe heads it lists, then the RAW
/// `tokenizer`; those depend on the manifest and are read in `cact/mod.rs`.
pub const CORE_WALK: [TensorGroup; 5] = [EMBEDDING, LAYER, MHC, ENGRAM, FINAL_NORM];

/// Number of copies of `group` the header asks for.
fn copies(group: &TensorGroup, header: &RawHeader<'_>) -> u64 {
    match group.repeat {
        Repeat::Once => 1,
        Repeat::Indexed { count, .. } => header.u32(count).into(),
    }
}

/// The tensors of `group` this header stores.
fn stored<'g>(group: &'g TensorGroup, header: &RawHeader<'_>) -> Vec<&'g TensorSpec> {
    group
        .tensors
        .iter()
        .filter(|t| t.when.is_none_or(|field| header.u32(field) != 0))
        .collect()
}

/// The value of one symbolic dimension, or the error naming the header field
/// whose factor overflows 64 bits (only products of several factors can).
fn dimension(dim: &str, header: &RawHeader<'_>) -> Result<u64, CactError> {
    let layout = header.layout();
    let mut value = 1u64;
    let mut last_field = None;
    for factor in dim.split('*') {
        let size = match layout.find(factor) {
            Some(index) => {
                last_field = Some(layout.fields[index].name);
                header.u32(factor).into()
            }
            None => factor
                .parse::<u64>()
                .ok()
                .or_else(|| {
                    let derived = layout.derived.iter().find(|(name, _)| *name == factor);
                    derived.map(|(_, size)| size(header))
                })
                .expect("a walk names only header fields, literals and its derived sizes"),
        };
        value = value.checked_mul(size).ok_or_else(|| {
            let field = last_field.unwrap_or(layout.fields[0].name);
            header.bad(
                field,
                header.u32(field),
                format!("small enough that {} fits in 64 bits", product_text(dim)),
            )
        })?;
    }
    Ok(value)
}

/// `a*b*b` as `a * b^2`.
fn product_text(dim: &str) -> String {
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for factor in dim.split('*') {
        match runs.last_mut() {
            Some((last, n)) if *last == factor => *n += 1,
            _ => runs.push((factor, 1)),
        }
    }
    let terms: Vec<String> = runs
        .iter()
        .map(|&(f, n)| {
            if n == 1 {
                f.to_string()
            } else {
                format!("{f}^{n}")
            }
        })
        .collect();
    terms.join(" * ")
}

/// Number of tensors the fixed walk `walk` holds for this header.
pub(crate) fn core_count(walk: &[TensorGroup], header: &RawHeader<'_>) -> u64 {
    walk.iter()
        .map(|g| stored(g, header).len() as u64 * copies(g, header))
        .sum()
}

/// Slots of the fixed walk `walk`; call only once `num_tensors` is known to fit in
/// the file, since this allocates [`core_count`] slots. Every shape is evaluated
/// before any slot is built, so an overflowing dimension is reported before anything
/// else about the walk.
pub(crate) fn core_slots(
    walk: &[TensorGroup],
    header: &RawHeader<'_>,
) -> Result<Vec<Slot>, CactError> {
    let groups = walk
        .iter()
        .map(|g| {
            stored(g, header)
                .into_iter()
                .map(|t| {
                    let shape = t.shape.iter().map(|d| dimension(d, header));
                    Ok((t.name, shape.collect::<Result<Vec<u64>, CactError>>()?))
                })
                .collect::<Result<Vec<_>, CactError>>()
        })
        .collect::<Result<Vec<_>, CactError>>()?;
    let mut out = Vec::with_capacity(core_count(walk, header) as usize);
    for (group, tensors) in walk.iter().zip(&groups) {
        for index in 0..copies(group, header) as usize {
            for (name, shape) in tensors {
                out.push(Slot::float(group.tensor_name(index, name), shape));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn sizes_and_offsets_are_upstreams() {
        assert_eq!(HEADER_BYTES, 120);
        assert_eq!(RECORD_BYTES, 44);
        assert_eq!(header_offset("num_tensors"), 4);
        assert_eq!(header_offset("num_engram_orders"), 76);
        assert_eq!(header_element_offset("engram_sites", 1), 104);
        assert_eq!(header_offset("rope_theta"), 116);
        assert_eq!(record_field_offset(RecordField::BlobOffset), 20);
        assert_eq!(record_element_offset(RecordField::Dims, 1), 8);
        assert_eq!(record_field_offset(RecordField::Bits), 40);
        assert_eq!(directory_start(CODEBOOK_LEN), 232);
    }

    #[test]
    fn every_header_field_is_one_word_wide() {
        // The reader addresses the header as 4-byte words.
        assert!(HEADER_FIELDS.iter().all(|f| f.ty.bytes() == 4));
    }

    #[test]
    fn record_fields_match_their_enum() {
        let names = [
            "dtype",
            "ndim",
            "pad",
            "dims",
            "blob_offset",
            "nbytes",
            "group",
            "bits",
        ];
        assert_eq!(RecordField::ALL.len(), RECORD_FIELDS.len());
        for (field, name) in RecordField::ALL.into_iter().zip(names) {
            assert_eq!(field.spec().name, name, "{field:?}");
        }
    }

    #[test]
    fn walk_names_header_fields_only() {
        for group in CORE_WALK {
            if let Repeat::Indexed { count, .. } = group.repeat {
                header_field_index(count);
            }
            for t in group.tensors {
                for factor in t.shape.iter().flat_map(|d| d.split('*')) {
                    if factor.parse::<u64>().is_err() {
                        header_field_index(factor);
                    }
                }
            }
        }
    }

    #[test]
    fn products_read_as_powers() {
        assert_eq!(
            product_text("num_layers*mhc_lanes*mhc_lanes"),
            "num_layers * mhc_lanes^2"
        );
        assert_eq!(product_text("d_model"), "d_model");
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
            "about": "Needle 2 .cact layout, rendered from exporter/src/cact/layout.rs by its \
                      unit test; regenerate with NEEDLE_WRITE_LAYOUT=1 cargo test -p exporter layout. \
                      Little-endian, packed. Shapes are products of header fields (\"1\" is a \
                      literal one). A group with a count repeats once per index below that header \
                      field, its names formatted with str.format(index=, tensor=). After the walk: \
                      heads.manifest and the probe heads it lists (if any), then the RAW tokenizer.",
            "tag": TAG,
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
            "{path} differs from cact/layout.rs; regenerate it with \
             NEEDLE_WRITE_LAYOUT=1 cargo test -p exporter layout"
        );
    }
}
