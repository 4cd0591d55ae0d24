//! From a validated file to the graph crate's typed, dequantized weights.

use graphs::blocks::weights::{EngramTables, EngramWeights, MhcWeights, Tensor};
use graphs::geometry::{CommonGeometry, EngramGeometry};
use graphs::needle2::{Config, HeadKind, LayerWeights, ProbeHead, Weights};

use super::layout::{ENGRAM, LAYER};
use super::{CactError, CactFile, Encoding, Entry};

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

impl CactFile {
    /// The model geometry, straight from the header.
    pub fn config(&self) -> Config {
        let h = self.header();
        let us = |v: u32| v as usize;
        Config {
            common: CommonGeometry {
                vocab: us(h.vocab),
                d_model: us(h.d_model),
                num_heads: us(h.num_heads),
                num_kv_heads: us(h.num_kv_heads),
                num_layers: us(h.num_layers),
                max_seq_len: us(h.max_seq_len),
                hada_n: us(h.hada_n),
                mhc_lanes: us(h.mhc_lanes),
                engram: EngramGeometry {
                    orders: h.engram_orders.iter().copied().map(us).collect(),
                    sites: h.engram_sites.iter().copied().map(us).collect(),
                    num_tables: us(h.num_engram_tables),
                    slots: us(h.engram_slots),
                    sub_dim: us(h.engram_sub_dim),
                    conv_taps: us(h.engram_conv_taps),
                    dilation: us(h.engram_conv_dilation),
                    // Needle 2 seeds its hash heads by their count.
                    seed_stride: us(h.num_engram_tables) / h.engram_orders.len(),
                },
                rope_theta: h.rope_theta,
                kv_window: us(h.kv_window),
                kv_bits: h.kv_bits,
            },
            head_dim: us(h.head_dim),
        }
    }

    /// Every weight of the logits graph, dequantized to float32 in the file
    /// layout (matrices `[out, in]`). Fails on a NaN or infinite value.
    pub fn weights(&self) -> Result<Weights, CactError> {
        let layers = self.layers_in_parallel()?;
        let engrams = (0..self.header().engram_sites.len())
            .map(|s| {
                let t = |name| self.tensor(&ENGRAM.tensor_name(s, name));
                Ok(EngramWeights {
                    tables: EngramTables::Dense(t("tables")?),
                    key_proj: t("key_proj")?,
                    value_proj: t("value_proj")?,
                    taps: t("taps")?,
                })
            })
            .collect::<Result<_, CactError>>()?;
        let mhc = mhc_weights(|name| self.tensor(name))?;
        let heads = self.probe_heads()?;
        Ok(Weights {
            embedding: self.tensor("embedding")?,
            layers,
            mhc,
            engrams,
            final_norm: self.tensor("final_norm")?,
            contrastive: heads
                .iter()
                .find(|h| h.kind == HeadKind::Contrastive)
                .cloned(),
            confidence: heads.into_iter().find(|h| h.kind == HeadKind::Confidence),
        })
    }

    /// Every layer's weights, decoded on all cores (dequantization is most of an export's
    /// time); the result does not depend on the thread count.
    fn layers_in_parallel(&self) -> Result<Vec<LayerWeights>, CactError> {
        let count = self.header().num_layers as usize;
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_worker = count.div_ceil(workers).max(1);
        let chunks: Vec<Vec<Result<LayerWeights, CactError>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..count)
                .step_by(per_worker)
                .map(|start| {
                    s.spawn(move || {
                        (start..(start + per_worker).min(count))
                            .map(|i| self.layer(i))
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        chunks.into_iter().flatten().collect()
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

/// The nine hyper-connection tensors (both generations store them alike), read by `tensor`.
pub(crate) fn mhc_weights(
    tensor: impl Fn(&str) -> Result<Tensor, CactError>,
) -> Result<MhcWeights, CactError> {
    Ok(MhcWeights {
        a_pre: tensor("mhc_a_pre")?,
        a_post: tensor("mhc_a_post")?,
        a_res: tensor("mhc_a_res")?,
        b_pre: tensor("mhc_b_pre")?,
        b_post: tensor("mhc_b_post")?,
        b_res: tensor("mhc_b_res")?,
        phi_pre: tensor("mhc_phi_pre")?,
        phi_post: tensor("mhc_phi_post")?,
        phi_res: tensor("mhc_phi_res")?,
    })
}
