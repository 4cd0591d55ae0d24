//! What both generations' headers hold and how they are checked: the header's bytes
//! addressed by field name ([`RawHeader`]) and the fields they share ([`CommonHeader`]),
//! each validated once, here, before anything is sized from it.

use super::bytes::Reader;
use super::layout::{HeaderLayout, CODEBOOK_LEN};
use super::limits::{FIELD_LIMITS, MAX_ENGRAM_ORDER};
use super::tag::expect_generation;
use super::CactError;
use graphs::contract::Generation;
use graphs::geometry::{CommonGeometry, EngramGeometry};

/// A header's bytes, addressed by field name through its generation's layout.
/// Holds exactly `layout.bytes()` bytes, so every field is in range.
#[derive(Clone, Copy)]
pub(crate) struct RawHeader<'a> {
    layout: HeaderLayout,
    bytes: &'a [u8],
}

impl<'a> RawHeader<'a> {
    /// The header of `generation`, laid out as `layout`, at the start of `file`: the tag
    /// checked, the bytes present. Also returns a reader at the codebooks after it.
    pub(crate) fn read(
        file: &'a [u8],
        generation: Generation,
        layout: HeaderLayout,
    ) -> Result<(Self, Reader<'a>), CactError> {
        let mut r = Reader::new(file, 0);
        expect_generation(&mut r, generation)?;
        let rest = (layout.bytes() - r.offset()) as usize;
        r.take(rest, || "header".to_string())?;
        let raw = RawHeader {
            layout,
            bytes: &file[..layout.bytes() as usize],
        };
        Ok((raw, r))
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

/// The header fields both generations store under the same names, after validation.
/// `engram_orders` and `engram_sites` hold only the `num_engram_orders` /
/// `num_engram_sites` used entries.
#[derive(Clone, Debug, PartialEq)]
pub struct CommonHeader {
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

/// A generation's own part of the shared checks: its head widths and any other sizes that
/// must be nonzero besides [`COMMON_SIZES`], and the width RoPE rotates.
pub(crate) struct HeaderRules {
    pub sizes: &'static [&'static str],
    pub rope_head: &'static str,
}

/// The sizes both generations store that must be nonzero, in file order.
const COMMON_SIZES: [&str; 12] = [
    "vocab",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "max_seq_len",
    "hada_n",
    "mhc_lanes",
    "engram_slots",
    "engram_sub_dim",
    "num_engram_tables",
    "engram_conv_taps",
    "engram_conv_dilation",
];

impl CommonHeader {
    /// Reads the shared fields of `raw` and validates them by `rules`. The engram array
    /// lengths are checked against the room the layout has before anything is read.
    pub(crate) fn read(raw: &RawHeader<'_>, rules: &HeaderRules) -> Result<Self, CactError> {
        let num_orders = raw.u32("num_engram_orders");
        let num_sites = raw.u32("num_engram_sites");
        let room = |name| raw.layout.fields[raw.layout.index(name)].count as u32;
        if !(1..=room("engram_orders")).contains(&num_orders) {
            let most = room("engram_orders");
            return Err(raw.bad("num_engram_orders", num_orders, format!("1..={most}")));
        }
        if num_sites > room("engram_sites") {
            let most = room("engram_sites");
            return Err(raw.bad("num_engram_sites", num_sites, format!("0..={most}")));
        }
        let array = |name, len| (0..len as usize).map(|i| raw.element(name, i)).collect();
        let header = CommonHeader {
            num_tensors: raw.u32("num_tensors"),
            codebook_len: raw.u32("codebook_len"),
            kv_window: raw.u32("kv_window"),
            kv_bits: raw.u32("kv_bits"),
            vocab: raw.u32("vocab"),
            d_model: raw.u32("d_model"),
            num_heads: raw.u32("num_heads"),
            num_kv_heads: raw.u32("num_kv_heads"),
            num_layers: raw.u32("num_layers"),
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
        header.validate(raw, rules)?;
        Ok(header)
    }

    fn validate(&self, raw: &RawHeader<'_>, rules: &HeaderRules) -> Result<(), CactError> {
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
        for &field in COMMON_SIZES.iter().chain(rules.sizes) {
            if raw.u32(field) == 0 {
                return Err(raw.bad(field, 0, "a nonzero size"));
            }
        }
        for (field, most) in FIELD_LIMITS {
            if raw.layout.find(field).is_none() {
                continue;
            }
            let value = raw.u32(field);
            if value > most {
                return Err(raw.bad(field, value, format!("at most {most}")));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(raw.bad(
                "num_kv_heads",
                self.num_kv_heads,
                format!("a divisor of num_heads ({})", self.num_heads),
            ));
        }
        let rope_head = raw.u32(rules.rope_head);
        if !rope_head.is_multiple_of(2) {
            return Err(raw.bad(rules.rope_head, rope_head, "even (RoPE rotates pairs)"));
        }
        if self.d_model.checked_next_power_of_two() != Some(self.hada_n) {
            return Err(raw.bad(
                "hada_n",
                self.hada_n,
                format!("d_model ({}) rounded up to a power of two", self.d_model),
            ));
        }
        let num_orders = self.engram_orders.len() as u32;
        if !self.num_engram_tables.is_multiple_of(num_orders) {
            return Err(raw.bad(
                "num_engram_tables",
                self.num_engram_tables,
                format!("a multiple of num_engram_orders ({num_orders})"),
            ));
        }
        for (i, &order) in self.engram_orders.iter().enumerate() {
            if !(1..=MAX_ENGRAM_ORDER).contains(&order) {
                return Err(raw.bad_element(
                    "engram_orders",
                    i,
                    order,
                    format!("an n-gram order in 1..={MAX_ENGRAM_ORDER}"),
                ));
            }
        }
        for (i, &site) in self.engram_sites.iter().enumerate() {
            if site >= self.num_layers {
                return Err(raw.bad_element(
                    "engram_sites",
                    i,
                    site,
                    format!("a layer index below num_layers ({})", self.num_layers),
                ));
            }
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(raw.bad("rope_theta", self.rope_theta, "a finite positive number"));
        }
        Ok(())
    }

    /// Hash heads per n-gram order: the tables split evenly over the orders.
    pub fn heads_per_order(&self) -> u32 {
        self.num_engram_tables / self.engram_orders.len() as u32
    }

    /// The geometry both generations' graphs share, with the engram hash seeds
    /// `seed_stride` apart (each generation says how its file sets that).
    pub fn geometry(&self, seed_stride: u32) -> CommonGeometry {
        let us = |v: u32| v as usize;
        CommonGeometry {
            vocab: us(self.vocab),
            d_model: us(self.d_model),
            num_heads: us(self.num_heads),
            num_kv_heads: us(self.num_kv_heads),
            num_layers: us(self.num_layers),
            max_seq_len: us(self.max_seq_len),
            hada_n: us(self.hada_n),
            mhc_lanes: us(self.mhc_lanes),
            engram: EngramGeometry {
                orders: self.engram_orders.iter().copied().map(us).collect(),
                sites: self.engram_sites.iter().copied().map(us).collect(),
                num_tables: us(self.num_engram_tables),
                slots: us(self.engram_slots),
                sub_dim: us(self.engram_sub_dim),
                conv_taps: us(self.engram_conv_taps),
                dilation: us(self.engram_conv_dilation),
                seed_stride: us(seed_stride),
            },
            rope_theta: self.rope_theta,
            kv_window: us(self.kv_window),
            kv_bits: self.kv_bits,
        }
    }
}
