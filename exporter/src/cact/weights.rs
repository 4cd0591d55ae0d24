//! The weight groups both generations store alike, read from a file's tensors, and the
//! parallel decode both use for their layers.

use graphs::blocks::weights::{EngramTables, EngramWeights, MhcWeights};

use super::layout::ENGRAM;
use super::tensors::Tensors;
use super::CactError;

/// The nine hyper-connection tensors.
pub(crate) fn mhc_weights(tensors: &Tensors) -> Result<MhcWeights, CactError> {
    let t = |name| tensors.tensor(name);
    Ok(MhcWeights {
        a_pre: t("mhc_a_pre")?,
        a_post: t("mhc_a_post")?,
        a_res: t("mhc_a_res")?,
        b_pre: t("mhc_b_pre")?,
        b_post: t("mhc_b_post")?,
        b_res: t("mhc_b_res")?,
        phi_pre: t("mhc_phi_pre")?,
        phi_post: t("mhc_phi_post")?,
        phi_res: t("mhc_phi_res")?,
    })
}

/// The weights of each of `sites` engram sites, the tables read by `tables` (each
/// generation decides how its tables reach the graph).
pub(crate) fn engram_weights(
    tensors: &Tensors,
    sites: usize,
    tables: impl Fn(&str) -> Result<EngramTables, CactError>,
) -> Result<Vec<EngramWeights>, CactError> {
    (0..sites)
        .map(|s| {
            let t = |name| tensors.tensor(&ENGRAM.tensor_name(s, name));
            Ok(EngramWeights {
                tables: tables(&ENGRAM.tensor_name(s, "tables"))?,
                key_proj: t("key_proj")?,
                value_proj: t("value_proj")?,
                taps: t("taps")?,
            })
        })
        .collect()
}

/// `decode(0..count)` on all cores (dequantizing the layers is most of an export's
/// time), in index order; the result does not depend on the thread count.
pub(crate) fn decode_in_parallel<T: Send>(
    count: usize,
    decode: impl Fn(usize) -> Result<T, CactError> + Sync,
) -> Result<Vec<T>, CactError> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_worker = count.div_ceil(workers).max(1);
    let decode = &decode;
    let chunks: Vec<Vec<Result<T, CactError>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..count)
            .step_by(per_worker)
            .map(|start| {
                s.spawn(move || {
                    (start..(start + per_worker).min(count))
                        .map(decode)
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
