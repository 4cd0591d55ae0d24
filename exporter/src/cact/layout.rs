//! What both generations' `.cact` layouts are made of, declared as data: packed
//! little-endian fields, the header addressed by field name, the 44-byte directory
//! record, and the positional tensor walk with the groups both generations store alike.
//! Each generation's header and walk are in `needle2/layout.rs` and `needle3/layout.rs`;
//! the reader, the hostile-file tests and the fuzzer take every offset and name from them.
//!
//! ```text
//! header | codebooks (28 f32) | directory (num_tensors x 44 B) | 64-aligned blobs
//! ```

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

pub(crate) const fn one(name: &'static str, ty: FieldType) -> Field {
    Field { name, ty, count: 1 }
}

/// A u32 header word.
pub(crate) const fn word(name: &'static str) -> Field {
    one(name, FieldType::U32)
}

/// An array of `count` u32 words.
pub(crate) const fn u32s(name: &'static str, count: usize) -> Field {
    Field {
        name,
        ty: FieldType::U32,
        count,
    }
}

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

/// A walk dimension that is a function of one header field rather than a field itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DerivedSize {
    /// The symbol the walk's shapes use.
    pub name: &'static str,
    /// The header field it is computed from.
    pub field: &'static str,
    pub size: fn(u64) -> u64,
}

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

    /// File offset of the directory: after the header and `codebook_len` f32 codebook entries.
    pub const fn directory_start(&self, codebook_len: u32) -> u64 {
        self.bytes() + 4 * codebook_len as u64
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_is_upstreams() {
        // struct.calcsize("<BBH4IQQII") and its field positions.
        assert_eq!(RECORD_BYTES, 44);
        assert_eq!(record_field_offset(RecordField::BlobOffset), 20);
        assert_eq!(record_element_offset(RecordField::Dims, 1), 8);
        assert_eq!(record_field_offset(RecordField::Bits), 40);
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
}
