//! The fixed 120-byte header (29 u32 + f32 `rope_theta`) and the codebooks after it.

use super::bytes::Reader;
use super::CactError;
use graphs::contract::Generation;

/// First u32 of a Needle 2 `.cact`.
pub const TAG: u32 = 0x05E1_2A83;
/// First u32 of a Needle 3 `.cact`, which this crate does not read.
pub const NEEDLE3_TAG: u32 = 0x05E1_2A84;
/// Size of the fixed header in bytes.
pub const HEADER_BYTES: u64 = 120;
/// `codebook_len`: `cb2[4] | cb3[8] | cb4[16]`.
pub const CODEBOOK_LEN: u32 = 28;

const FIELDS: [&str; 19] = [
    "tag",
    "num_tensors",
    "codebook_len",
    "kv_window",
    "kv_bits",
    "vocab",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "num_layers",
    "head_dim",
    "max_seq_len",
    "hada_n",
    "mhc_lanes",
    "engram_slots",
    "engram_sub_dim",
    "num_engram_tables",
    "engram_conv_taps",
    "engram_conv_dilation",
];
const NUM_ORDERS_FIELD: usize = 19;
const NUM_SITES_FIELD: usize = 24;
const ROPE_THETA_FIELD: usize = 29;

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

/// Lloyd-Max centroid of the 3-level Gaussian quantizer (upstream `_TERNARY_CB`).
const TERNARY_C: f64 = 1.224_006_4;

fn field_offset(index: usize) -> u64 {
    4 * index as u64
}

fn bad(
    index: usize,
    name: &'static str,
    value: impl ToString,
    expected: impl Into<String>,
) -> CactError {
    CactError::Header {
        field: name,
        offset: field_offset(index),
        value: value.to_string(),
        expected: expected.into(),
    }
}

impl Header {
    /// Reads and validates the header and codebooks at the start of `file`.
    pub(crate) fn parse(file: &[u8]) -> Result<(Header, Codebooks), CactError> {
        let tag = super::read_tag(file)?;
        // This is the Needle 2 reader: a file of another generation is refused by the dispatch.
        let Generation::Needle2 = crate::model::generation_of(tag)?;
        let mut r = Reader::new(&file[4..], 4);
        let rest = r.take(HEADER_BYTES as usize - 4, || "header".to_string())?;
        let mut h = Reader::new(rest, 4);
        let mut raw = [0u32; 29];
        raw[0] = tag;
        for v in &mut raw[1..] {
            *v = h.u32(String::new)?;
        }
        let rope_theta = h.f32(String::new)?;
        let header = Self::from_fields(&raw, rope_theta)?;
        let codebooks = read_codebooks(&mut r)?;
        Ok((header, codebooks))
    }

    fn from_fields(raw: &[u32; 29], rope_theta: f32) -> Result<Header, CactError> {
        let num_orders = raw[NUM_ORDERS_FIELD];
        let num_sites = raw[NUM_SITES_FIELD];
        if !(1..=4).contains(&num_orders) {
            return Err(bad(
                NUM_ORDERS_FIELD,
                "num_engram_orders",
                num_orders,
                "1..=4",
            ));
        }
        if num_sites > 4 {
            return Err(bad(NUM_SITES_FIELD, "num_engram_sites", num_sites, "0..=4"));
        }
        let orders = &raw[NUM_ORDERS_FIELD + 1..NUM_ORDERS_FIELD + 1 + num_orders as usize];
        let sites = &raw[NUM_SITES_FIELD + 1..NUM_SITES_FIELD + 1 + num_sites as usize];
        let header = Header {
            num_tensors: raw[1],
            codebook_len: raw[2],
            kv_window: raw[3],
            kv_bits: raw[4],
            vocab: raw[5],
            d_model: raw[6],
            num_heads: raw[7],
            num_kv_heads: raw[8],
            num_layers: raw[9],
            head_dim: raw[10],
            max_seq_len: raw[11],
            hada_n: raw[12],
            mhc_lanes: raw[13],
            engram_slots: raw[14],
            engram_sub_dim: raw[15],
            num_engram_tables: raw[16],
            engram_conv_taps: raw[17],
            engram_conv_dilation: raw[18],
            engram_orders: orders.to_vec(),
            engram_sites: sites.to_vec(),
            rope_theta,
        };
        header.validate(raw)?;
        Ok(header)
    }

    fn validate(&self, raw: &[u32; 29]) -> Result<(), CactError> {
        if self.codebook_len != CODEBOOK_LEN {
            return Err(bad(
                2,
                FIELDS[2],
                self.codebook_len,
                "28 (cb2[4] | cb3[8] | cb4[16])",
            ));
        }
        if ![2, 3, 4, 8].contains(&self.kv_bits) {
            return Err(bad(4, FIELDS[4], self.kv_bits, "2, 3, 4 or 8"));
        }
        for index in 5..FIELDS.len() {
            if raw[index] == 0 {
                return Err(bad(index, FIELDS[index], 0, "a nonzero size"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(
                8,
                FIELDS[8],
                self.num_kv_heads,
                format!("a divisor of num_heads ({})", self.num_heads),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(
                10,
                FIELDS[10],
                self.head_dim,
                "even (RoPE rotates pairs)",
            ));
        }
        let hada_n = self.d_model.checked_next_power_of_two();
        if hada_n != Some(self.hada_n) {
            return Err(bad(
                12,
                FIELDS[12],
                self.hada_n,
                format!("d_model ({}) rounded up to a power of two", self.d_model),
            ));
        }
        let num_orders = self.engram_orders.len() as u32;
        if !self.num_engram_tables.is_multiple_of(num_orders) {
            return Err(bad(
                16,
                FIELDS[16],
                self.num_engram_tables,
                format!("a multiple of num_engram_orders ({num_orders})"),
            ));
        }
        for (i, &order) in self.engram_orders.iter().enumerate() {
            if order == 0 {
                return Err(bad(
                    NUM_ORDERS_FIELD + 1 + i,
                    "engram_orders",
                    order,
                    "a nonzero n-gram order",
                ));
            }
        }
        for (i, &site) in self.engram_sites.iter().enumerate() {
            if site >= self.num_layers {
                return Err(bad(
                    NUM_SITES_FIELD + 1 + i,
                    "engram_sites",
                    site,
                    format!("a layer index below num_layers ({})", self.num_layers),
                ));
            }
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(bad(
                ROPE_THETA_FIELD,
                "rope_theta",
                self.rope_theta,
                "a finite positive number",
            ));
        }
        Ok(())
    }
}

fn read_codebooks(r: &mut Reader<'_>) -> Result<Codebooks, CactError> {
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
