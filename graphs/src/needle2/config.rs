//! Needle 2 geometry, as the `.cact` header records it (`cactus-needle==2.0.15`), and
//! its metadata form.

use crate::contract::{keys, HeadShape};
use crate::geometry::{CommonGeometry, Geometry};
use crate::metadata::{Field, GeometryFields};

/// Geometry of one Needle 2 model (the `.cact` header, already validated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    pub common: CommonGeometry,
    /// One head width for queries, keys and values.
    pub head_dim: usize,
}

impl Config {
    /// The sliding window when it can bind (shorter than `max_seq_len`).
    pub fn sliding_window(&self) -> Option<usize> {
        let c = &self.common;
        (c.kv_window > 0 && c.kv_window < c.max_seq_len).then_some(c.kv_window)
    }
}

impl Geometry for Config {
    fn common(&self) -> &CommonGeometry {
        &self.common
    }

    fn head_shape(&self) -> HeadShape {
        HeadShape {
            heads: self.common.num_heads,
            kv_heads: self.common.num_kv_heads,
            qk_dim: self.head_dim,
            v_dim: self.head_dim,
        }
    }
}

impl GeometryFields for Config {
    fn fields(&mut self) -> Vec<(&'static str, Field<'_>)> {
        let c = &mut self.common;
        let e = &mut c.engram;
        vec![
            (keys::VOCAB, Field::Count(&mut c.vocab)),
            (keys::D_MODEL, Field::Count(&mut c.d_model)),
            (keys::NUM_HEADS, Field::Count(&mut c.num_heads)),
            (keys::NUM_KV_HEADS, Field::Count(&mut c.num_kv_heads)),
            (keys::NUM_LAYERS, Field::Count(&mut c.num_layers)),
            (keys::HEAD_DIM, Field::Count(&mut self.head_dim)),
            (keys::MAX_SEQ_LEN, Field::Count(&mut c.max_seq_len)),
            (keys::HADA_N, Field::Count(&mut c.hada_n)),
            (keys::MHC_LANES, Field::Count(&mut c.mhc_lanes)),
            (keys::ENGRAM_SLOTS, Field::Count(&mut e.slots)),
            (keys::ENGRAM_SUB_DIM, Field::Count(&mut e.sub_dim)),
            (keys::ENGRAM_TABLES, Field::Count(&mut e.num_tables)),
            (keys::ENGRAM_CONV_TAPS, Field::Count(&mut e.conv_taps)),
            (keys::ENGRAM_CONV_DILATION, Field::Count(&mut e.dilation)),
            (keys::ENGRAM_ORDERS, Field::Counts(&mut e.orders)),
            (keys::ENGRAM_SITES, Field::Counts(&mut e.sites)),
            (keys::ROPE_THETA, Field::Real(&mut c.rope_theta)),
            (keys::KV_WINDOW, Field::Count(&mut c.kv_window)),
            (keys::KV_BITS, Field::Bits(&mut c.kv_bits)),
        ]
    }

    /// Needle 2 seeds its hash heads by their count (`heads`), which is not recorded.
    fn complete(&mut self) {
        let e = &mut self.common.engram;
        if !e.orders.is_empty() {
            e.seed_stride = e.heads();
        }
    }
}
