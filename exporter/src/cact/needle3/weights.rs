//! From a validated Needle 3 file to the graph crate's typed, dequantized weights.

use graphs::blocks::weights::EngramTables;
use graphs::needle3::{
    Config, HeadKind, LayerWeights, MonarchWeights, ProbeHead, QkvTaps, Weights,
};

use super::layout::LAYER;
use super::Needle3File;
use crate::cact::weights::{decode_in_parallel, engram_weights, mhc_weights};
use crate::cact::CactError;

impl Needle3File {
    /// The model geometry, from the header (`out_vocab` and the seed stride resolved).
    pub fn config(&self) -> Config {
        let h = self.header();
        let us = |v: u32| v as usize;
        Config {
            common: h.common.geometry(h.seed_stride()),
            out_vocab: us(h.output_rows()),
            qk_head_dim: us(h.qk_head_dim),
            v_head_dim: us(h.v_head_dim),
            sliding_window: us(h.sliding_window),
            global_layers: h.global_layers.iter().copied().map(us).collect(),
            qkv_conv_taps: us(h.qkv_conv_taps),
            source_layers: (0..us(h.common.num_layers)).collect(),
        }
    }

    /// Every weight of the logits graph, dequantized to float32 in the file layout.
    /// Fails on a NaN or infinite value, or permutations that are not permutations.
    pub fn weights(&self) -> Result<Weights, CactError> {
        let layers =
            decode_in_parallel(self.header().common.num_layers as usize, |i| self.layer(i))?;
        let sites = self.header().common.engram_sites.len();
        let engrams = engram_weights(&self.tensors, sites, |name| self.engram_tables(name))?;
        Ok(Weights {
            embedding: self.tensor("embedding")?,
            layers,
            mhc: mhc_weights(&self.tensors)?,
            hada_p1: self.permutation("hada_p1")?,
            hada_p2: self.permutation("hada_p2")?,
            engrams,
            final_norm: self.tensor("final_norm")?,
            confidence: self
                .probe_heads()?
                .into_iter()
                .find(|h| h.kind == HeadKind::Confidence),
        })
    }

    /// An engram site's tables: as their CQ codes when they are CQ (decoded in the graph
    /// row by row; the tables are most of a Needle 3 file), else dequantized.
    fn engram_tables(&self, name: &str) -> Result<EngramTables, CactError> {
        match self.cq_rows(name)? {
            Some(rows) => Ok(EngramTables::Codes(rows)),
            None => Ok(EngramTables::Dense(self.tensor(name)?)),
        }
    }

    fn layer(&self, i: usize) -> Result<LayerWeights, CactError> {
        let t = |name| self.tensor(&LAYER.tensor_name(i, name));
        let qkv_taps = if self.header().qkv_conv_taps > 0 {
            Some(QkvTaps {
                q: t("q_taps")?,
                k: t("k_taps")?,
                v: t("v_taps")?,
            })
        } else {
            None
        };
        Ok(LayerWeights {
            norm_in: t("norm_in")?,
            q_proj: t("q_proj")?,
            k_proj: t("k_proj")?,
            v_proj: t("v_proj")?,
            qkv_taps,
            q_norm: t("q_norm")?,
            k_norm: t("k_norm")?,
            gate_proj: t("gate_proj")?,
            out_proj: t("out_proj")?,
            post_norm: t("post_norm")?,
            attn_gate: t("attn_gate")?,
            pre_hada: t("pre_hada")?,
            mlp: MonarchWeights {
                d1: t("d1")?,
                d2: t("d2")?,
                b2: t("b2")?,
                d3: t("d3")?,
                d4: t("d4")?,
                w1a: t("w1a")?,
                w1b: t("w1b")?,
                w2a: t("w2a")?,
                w2b: t("w2b")?,
                w3a: t("w3a")?,
                w3b: t("w3b")?,
                cond_v: t("cond_v")?,
                cond_u: t("cond_u")?,
            },
        })
    }

    /// A stored permutation of `0..hada_n` (float indices), as integers.
    fn permutation(&self, name: &str) -> Result<Vec<i64>, CactError> {
        let values = self.tensor(name)?.data;
        let n = values.len();
        let mut seen = vec![false; n];
        let mut out = Vec::with_capacity(n);
        for (index, &v) in values.iter().enumerate() {
            let i = v as usize;
            if v.fract() != 0.0 || v < 0.0 || i >= n || seen[i] {
                let entry = self.tensors.entry(name)?;
                return Err(CactError::Permutation {
                    tensor: name.to_string(),
                    offset: entry.blob_offset + 4 * index as u64,
                    index,
                    found: v,
                });
            }
            seen[i] = true;
            out.push(i as i64);
        }
        Ok(out)
    }

    /// The probe heads, in manifest order (empty when the file has none), probes as
    /// `[rows, k, d_model]` whichever way the file stores them.
    pub fn probe_heads(&self) -> Result<Vec<ProbeHead>, CactError> {
        self.head_kinds()
            .iter()
            .map(|&kind| {
                let t = |part| self.tensor(&format!("{}.{part}", kind.name()));
                let gain = t("gain")?;
                let mut probes = t("probes")?;
                probes.shape = vec![
                    gain.shape[0],
                    gain.shape[1],
                    probes.shape[probes.shape.len() - 1],
                ];
                Ok(ProbeHead {
                    kind,
                    probes,
                    gain,
                    query: t("query")?,
                    row_bias: t("row_bias")?,
                    proj: t("proj")?,
                    bias: t("bias")?,
                    calibration: match kind {
                        HeadKind::Router => Some(t("calibration")?),
                        _ => None,
                    },
                })
            })
            .collect()
    }
}
