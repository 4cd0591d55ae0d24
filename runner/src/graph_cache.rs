//! needle-run's cache of the graphs it exports from `.cact` files. Exporting in memory at
//! every start parses and dequantizes the whole file and builds the graph (most of a cold
//! start from a `.cact`); a cached graph is loaded like any exported `.onnx`, found by the
//! `.cact`'s SHA-256, everything else that chooses the graph and the graphs' revision, so
//! an edited file, other options or a newer needle-run never meet a stale graph. Entries
//! are written all or nothing (the exporter's staging) beside their tokenizer, whose
//! checksum the graph records.

use crate::plan::PlannedGraphs;
use std::path::{Path, PathBuf};

/// The exported graphs' revision, in every cached file's name: bumped whenever the graphs
/// exported for the same `.cact` and options change (interface, node order, numerics), so
/// an upgraded needle-run exports anew instead of loading what an older one cached.
/// 2: the accelerator graphs' ring for windowed models; the probe heads built last.
/// 3: packed graphs run their blocks as fused Needle ops (`graphs::contract::needle_ops`).
/// 4: `needle.AttentionGate`, `needle.ConvState`, `needle.QkvHeads` (packed for
///    `GroupQueryAttention`); the MLP ops take the pre-norm and the residual add;
///    `needle.CqMatMul` reads the hyper-connections' lanes and normalises them itself;
///    `needle.ProbePool` pools the Needle 3 confidence head.
/// 5: `needle.QkvHeads` gives the next QKV-conv state; `needle.ProbePool` reads each
///    layer's cells as its own input; `needle.CqMatMul` applies the layer's norm_in.
/// 6: `needle.HyperConnectionsOut` projects the next layer's mixing logits.
/// 7: `needle.ProbePool` carries the confidence head's running pools between calls
///    (`past_confidence_pools`), so needle-run reads the confidence after the answer.
/// 8: Needle 2 pools its heads in `needle.JointProbePool` (the confidence head's pools
///    carried too) and gathers its engram rows in `needle.EngramRows`.
/// 9: `needle.AttentionOut` gates the attention heads and projects them by `out_proj`.
/// 10: `needle.Attention` is the packed graphs' core in place of `GroupQueryAttention`.
/// 11: the packed graphs take `logits_to_keep`.
const GRAPH_REVISION: u32 = 11;

/// Where the cache lives: `$NEEDLE_ONNX_CACHE`, else `$XDG_CACHE_HOME/needle-onnx`, else
/// `$HOME/.cache/needle-onnx`; `None` when none of them is set.
pub fn default_dir() -> Option<PathBuf> {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("NEEDLE_ONNX_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("needle-onnx")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/needle-onnx")))
}

/// The cached graph of the `.cact` with checksum `sha256` exported as `graphs`, as ladder
/// rung `layers` (the whole model when `None`) with the tokenizer's whitespace rule (the
/// accelerator graphs: their decode graph, the prefill graph beside it).
pub fn graph_path(
    dir: &Path,
    sha256: &str,
    graphs: PlannedGraphs,
    layers: Option<usize>,
    remove_extra_whitespaces: bool,
) -> PathBuf {
    let mut name = match graphs {
        PlannedGraphs::Stock(variant) => format!(
            "{sha256}.g{GRAPH_REVISION}.{}.{}.{}.ort{}",
            variant.attention, variant.precision, variant.matmul_weights, variant.runtime
        ),
        PlannedGraphs::Accelerator(target) => {
            format!("{sha256}.g{GRAPH_REVISION}.accelerator-{target}")
        }
    };
    if let Some(depth) = layers {
        name.push_str(&format!(".layers{depth}"));
    }
    if !remove_extra_whitespaces {
        name.push_str(".spaces");
    }
    dir.join(format!("{name}.onnx"))
}
