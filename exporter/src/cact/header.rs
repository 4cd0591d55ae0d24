//! The fixed 120-byte header (29 u32 + f32 `rope_theta`) and the codebooks after it.

use super::bytes::Reader;
use super::layout::{
    header_field_index, HeaderLayout, CODEBOOK_LEN, HEADER_BYTES, HEADER_FIELDS, NEEDLE2_HEADER,
};
use super::CactError;
use graphs::contract::Generation;

/// The header, field for field, after validation. `engram_orders` and
/// `engram_sites` hold only the `num_engram_orders` / `num_engram_sites` used entries.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub num_tensors: u32,
    pub codebook_len: u32,
    /// Sliding attention window the model was trained with (0 = unlimited).
    pub kv_window: u32,
    /// KV-cache width the model was post-trained for (8 = int8, else 2/3/4).
    pub kv_bits: u32,
    pub vocab: u32,
    pub d_model: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub num_layers: u32,
    pub head_dim: u32,
    pub max_seq_len: u32,
    /// `d_model` rounded up to a power of two.
    pub hada_n: u32,
    pub mhc_lanes: u32,
    pub engram_slots: u32,
    pub engram_sub_dim: u32,
    pub num_engram_tables: u32,
    pub engram_conv_taps: u32,
    pub engram_conv_dilation: u32,
    pub engram_orders: Vec<u32>,
    pub engram_sites: Vec<u32>,
    pub rope_theta: f32,
}

/// The Lloyd-Max codebooks stored after the header, already divided by
/// `sqrt(group)` by the writer. Each is finite and ascending.
#[derive(Clone, Debug, PartialEq)]
pub struct Codebooks {
    pub cb2: [f32; 4],
    pub cb3: [f32; 8],
    pub cb4: [f32; 16],
}

impl Codebooks {
    /// The codebook for a 2-, 3- or 4-bit CQ record.
    pub fn for_bits(&self, bits: u32) -> Option<&[f32]> {
        match bits {
            2 => Some(&self.cb2),
            3 => Some(&self.cb3),
            4 => Some(&self.cb4),
            _ => None,
        }
    }

    /// The ternary (record bits 5) codebook, which the file does not store:
    /// `{-c, 0, c} / sqrt(group)` with `c = 1.2240064`, computed in f64 and
    /// rounded to f32 like upstream `_cq_codebook_np(1.58, group)`.
    pub fn ternary(group: u32) -> [f32; 3] {
        let c = (TERNARY_C / (group as f64).sqrt()) as f32;
        [-c, 0.0, c]
    }
}

impl Codebooks {
    /// The binary (record bits 1, Needle 3) codebook, which the file does not store:
    /// `{-c, c} / sqrt(group)` with `c = sqrt(2/pi)`, the centroids of a Gaussian's two
    /// halves, computed in f64 and rounded to f32 like upstream `_cq_codebook_np(1, group)`.
    pub fn binary(group: u32) -> [f32; 2] {
        let c = ((2.0 / std::f64::consts::PI).sqrt() / (group as f64).sqrt()) as f32;
        [-c, c]
    }
}

/// Lloyd-Max centroid of the 3-level Gaussian quantizer (upstream `_TERNARY_CB`).
const TERNARY_C: f64 = 1.224_006_4;

/// A header's bytes, addressed by field name through its generation's layout.
/// Holds exactly `layout.bytes()` bytes, so every field is in range.
#[derive(Clone, Copy)]
pub(crate) struct RawHeader<'a> {
    layout: HeaderLayout,
    bytes: &'a [u8],
}

impl<'a> RawHeader<'a> {
    /// The header at the start of `file`, which holds at least `layout.bytes()` bytes.
    pub(crate) fn new(layout: HeaderLayout, file: &'a [u8]) -> Self {
        RawHeader {
            layout,
            bytes: &file[..layout.bytes() as usize],
        }
    }

    pub(crate) fn layout(&self) -> HeaderLayout {
        self.layout
    }

    /// Element `element` of the u32 header field `name`.
    pub(crate) fn element(&self, name: &str, element: usize) -> u32 {
        let at = self.layout.element_offset(name, element) as usize;
        u32::from_le_bytes(std::array::from_fn(|k| self.bytes[at + k]))
    }

    /// The u32 header field `name` (the first element of an array).
    pub(crate) fn u32(&self, name: &str) -> u32 {
        self.element(name, 0)
    }

    pub(crate) fn f32(&self, name: &str) -> f32 {
        f32::from_bits(self.u32(name))
    }

    /// The error for element `element` of header field `field`.
    pub(crate) fn bad_element(
        &self,
        field: &'static str,
        element: usize,
        value: impl ToString,
        expected: impl Into<String>,
    ) -> CactError {
        CactError::Header {
            field,
            offset: self.layout.element_offset(field, element),
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    /// The error for header field `field` (element 0 of an array).
    pub(crate) fn bad(
        &self,
        field: &'static str,
        value: impl ToString,
        expected: impl Into<String>,
    ) -> CactError {
        self.bad_element(field, 0, value, expected)
    }
}

impl Header {
    /// Reads and validates the header and codebooks at the start of `file`;
    /// also returns the header's bytes for the layout's tensor walk.
    pub(crate) fn parse(file: &[u8]) -> Result<(Header, RawHeader<'_>, Codebooks), CactError> {
        let mut r = Reader::new(file, 0);
        // This is the Needle 2 reader: a file of another generation is refused here.
        let found = crate::model::generation_of(super::read_tag(&mut r)?)?;
        if found != Generation::Needle2 {
            return Err(CactError::OtherGeneration {
                found,
                reader: Generation::Needle2,
            });
        }
        let rest = (HEADER_BYTES - r.offset()) as usize;
        r.take(rest, || "header".to_string())?;
        let raw = RawHeader::new(NEEDLE2_HEADER, file);
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
        if num_sites > 4 {
            return Err(raw.bad("num_engram_sites", num_sites, "0..=4"));
        }
        let array = |name, len| (0..len as usize).map(|i| raw.element(name, i)).collect();
        let header = Header {
            num_tensors: raw.u32("num_tensors"),
            codebook_len: raw.u32("codebook_len"),
            kv_window: raw.u32("kv_window"),
            kv_bits: raw.u32("kv_bits"),
            vocab: raw.u32("vocab"),
            d_model: raw.u32("d_model"),
            num_heads: raw.u32("num_heads"),
            num_kv_heads: raw.u32("num_kv_heads"),
            num_layers: raw.u32("num_layers"),
            head_dim: raw.u32("head_dim"),
            max_seq_len: raw.u32("max_seq_len"),
            hada_n: raw.u32("hada_n"),
            mhc_lanes: raw.u32("mhc_lanes"),
            engram_slots: raw.u32("engram_slots"),
            engram_sub_dim: raw.u32("engram_sub_dim"),
            num_engram_tables: raw.u32("num_engram_tables"),
            engram_conv_taps: raw.u32("engram_conv_taps"),
            engram_conv_dilation: raw.u32("engram_conv_dilation"),
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
        // The geometry sizes, checked in file order.
        let sizes = header_field_index("vocab")..=header_field_index("engram_conv_dilation");
        for field in &HEADER_FIELDS[sizes] {
            if raw.u32(field.name) == 0 {
                return Err(raw.bad(field.name, 0, "a nonzero size"));
            }
        }
        raw.check_heads(
            [self.num_heads, self.num_kv_heads],
            ("head_dim", self.head_dim),
            [self.d_model, self.hada_n],
        )?;
        raw.check_engram_and_rope(
            self.num_engram_tables,
            &self.engram_orders,
            &self.engram_sites,
            self.num_layers,
            self.rope_theta,
        )
    }
}

/// The header checks both generations make, in the order they make them.
impl RawHeader<'_> {
    /// KV heads divide the heads, the RoPE head width (`head_field`) is even, and
    /// `hada_n` is `d_model` rounded up to a power of two.
    pub(crate) fn check_heads(
        &self,
        [num_heads, num_kv_heads]: [u32; 2],
        (head_field, head_dim): (&'static str, u32),
        [d_model, hada_n]: [u32; 2],
    ) -> Result<(), CactError> {
        if !num_heads.is_multiple_of(num_kv_heads) {
            return Err(self.bad(
                "num_kv_heads",
                num_kv_heads,
                format!("a divisor of num_heads ({num_heads})"),
            ));
        }
        if !head_dim.is_multiple_of(2) {
            return Err(self.bad(head_field, head_dim, "even (RoPE rotates pairs)"));
        }
        if d_model.checked_next_power_of_two() != Some(hada_n) {
            return Err(self.bad(
                "hada_n",
                hada_n,
                format!("d_model ({d_model}) rounded up to a power of two"),
            ));
        }
        Ok(())
    }

    /// The engram tables split evenly over the orders, orders are nonzero, sites name
    /// layers, and `rope_theta` is finite and positive.
    pub(crate) fn check_engram_and_rope(
        &self,
        num_engram_tables: u32,
        orders: &[u32],
        sites: &[u32],
        num_layers: u32,
        rope_theta: f32,
    ) -> Result<(), CactError> {
        let num_orders = orders.len() as u32;
        if !num_engram_tables.is_multiple_of(num_orders) {
            return Err(self.bad(
                "num_engram_tables",
                num_engram_tables,
                format!("a multiple of num_engram_orders ({num_orders})"),
            ));
        }
        for (i, &order) in orders.iter().enumerate() {
            if order == 0 {
                return Err(self.bad_element("engram_orders", i, order, "a nonzero n-gram order"));
            }
        }
        for (i, &site) in sites.iter().enumerate() {
            if site >= num_layers {
                return Err(self.bad_element(
                    "engram_sites",
                    i,
                    site,
                    format!("a layer index below num_layers ({num_layers})"),
                ));
            }
        }
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(self.bad("rope_theta", rope_theta, "a finite positive number"));
        }
        Ok(())
    }
}

pub(crate) fn read_codebooks(r: &mut Reader<'_>) -> Result<Codebooks, CactError> {
    let start = r.offset();
    let bytes = r.take(CODEBOOK_LEN as usize * 4, || "codebook".to_string())?;
    let mut values = [0f32; CODEBOOK_LEN as usize];
    for (v, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    let mut first = 0;
    for len in [4, 8, 16] {
        let cb = &values[first..first + len];
        for i in 0..len {
            let ascending = i == 0 || cb[i - 1] < cb[i];
            if !cb[i].is_finite() || !ascending {
                return Err(CactError::Codebook {
                    index: first + i,
                    offset: start + 4 * (first + i) as u64,
                    found: cb[i],
                });
            }
        }
        first += len;
    }
    let mut cb2 = [0f32; 4];
    let mut cb3 = [0f32; 8];
    let mut cb4 = [0f32; 16];
    cb2.copy_from_slice(&values[..4]);
    cb3.copy_from_slice(&values[4..12]);
    cb4.copy_from_slice(&values[12..]);
    Ok(Codebooks { cb2, cb3, cb4 })
}
