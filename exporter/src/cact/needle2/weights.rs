//! From a validated Needle 2 file to the graph crate's typed, dequantized weights.

use graphs::blocks::weights::EngramTables;
use graphs::needle2::{Config, HeadKind, LayerWeights, ProbeHead, Weights};

use super::layout::LAYER;
use super::Needle2File;
use crate::cact::directory::{Encoding, Entry};
use crate::cact::weights::{decode_in_parallel, engram_weights, mhc_weights};
use crate::cact::CactError;

/// Maps the manifest's decoded codes to head kinds; codes must be 1 or 2, each at most once.
pub(crate) fn head_kinds(manifest: &Entry, codes: &[f32]) -> Result<Vec<HeadKind>, CactError> {
    let width = if manifest.encoding == Encoding::Fp32 {
        4
    } else {
        2
    };
    let mut kinds = Vec::with_capacity(codes.len());
    for (index, &code) in codes.iter().enumerate() {
        let kind = if code == 1.0 {
            Some(HeadKind::Contrastive)
        } else if code == 2.0 {
            Some(HeadKind::Confidence)
        } else {
            None
        };
        match kind {
            Some(kind) if !kinds.contains(&kind) => kinds.push(kind),
            _ => {
                return Err(CactError::HeadCode {
                    offset: manifest.blob_offset + width * index as u64,
                    index,
                    found: code,
                    expected: "distinct head codes 1 (contrastive) or 2 (confidence)",
                })
            }
        }
    }
    Ok(kinds)
}

impl Needle2File {
    /// The model geometry, straight from the header.
    pub fn config(&self) -> Config {
        let h = self.header();
        Config {
            // Needle 2 seeds its hash heads by their count.
            common: h.common.geometry(h.common.heads_per_order()),
            head_dim: h.head_dim as usize,
        }
    }

    /// Every weight of the logits graph, dequantized to float32 in the file
    /// layout (matrices `[out, in]`). Fails on a NaN or infinite value.
    pub fn weights(&self) -> Result<Weights, CactError> {
        let layers =
            decode_in_parallel(self.header().common.num_layers as usize, |i| self.layer(i))?;
        let sites = self.header().common.engram_sites.len();
        let engrams = engram_weights(&self.tensors, sites, |name| {
            Ok(EngramTables::Dense(self.tensor(name)?))
        })?;
        let heads = self.probe_heads()?;
        Ok(Weights {
            embedding: self.tensor("embedding")?,
            layers,
            mhc: mhc_weights(&self.tensors)?,
            engrams,
            final_norm: self.tensor("final_norm")?,
            contrastive: heads
                .iter()
                .find(|h| h.kind == HeadKind::Contrastive)
                .cloned(),
            confidence: heads.into_iter().find(|h| h.kind == HeadKind::Confidence),
        })
    }

    fn layer(&self, i: usize) -> Result<LayerWeights, CactError> {
        let t = |name| self.tensor(&LAYER.tensor_name(i, name));
        Ok(LayerWeights {
            norm_in: t("norm_in")?,
            q_proj: t("q_proj")?,
            k_proj: t("k_proj")?,
            v_proj: t("v_proj")?,
            q_norm: t("q_norm")?,
            k_norm: t("k_norm")?,
            gate_proj: t("gate_proj")?,
            out_proj: t("out_proj")?,
            post_norm: t("post_norm")?,
            attn_gate: t("attn_gate")?,
            pre_hada: t("pre_hada")?,
            d1: t("d1")?,
            d2: t("d2")?,
            d3: t("d3")?,
        })
    }

    /// The probe heads, in manifest order (empty when the file has none).
    pub fn probe_heads(&self) -> Result<Vec<ProbeHead>, CactError> {
        self.head_kinds()
            .iter()
            .map(|&kind| {
                let t = |part| self.tensor(&format!("{}.{part}", kind.name()));
                Ok(ProbeHead {
                    kind,
                    probes: t("probes")?,
                    proj: t("proj")?,
                    bias: t("bias")?,
                })
            })
            .collect()
    }
}
