//! The one place that turns (execution provider, model) into how the model runs: the
//! variant a `.cact` is exported as, prefill chunking, the in-place cache, threads.

use crate::provider::Provider;
use graphs::accelerator::{FixedShape, PREFILL_CHUNK};
use graphs::contract::{
    AcceleratorTarget, AttentionKind, MatMulWeights, Precision, RuntimeTarget, Spelled, Variant,
};
use graphs::description::ExportDescription;

/// Prompt tokens per forward call of a CPU prefill. onnxruntime's CPU attention scores
/// every cached key for every new query and masks afterwards, so a long prompt costs less
/// fed through the cache in pieces (measured in `bench/RESULTS.md`); a GPU scores a whole
/// prompt at once.
pub const CPU_PREFILL_CHUNK: usize = 128;

/// Prompts prefilled together go in one call while that call's logits (`[rows, longest,
/// vocab]` float32, every position's) stay within this many bytes. Measured on `--batch`
/// with 16 rows, CPU: the demo held-out set (prompts of ~240 tokens, 16 MB a call) took 3.3 s
/// prefilled together and 4.2 s one by one; 16 full-size Needle 2 prompts of ~590 tokens
/// (310 MB together) took 28.4 s together and 20.9 s one by one.
pub const PREFILL_GROUP_LOGITS_BYTES: usize = 32 << 20;

/// How one loaded graph runs on its provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunPlan {
    /// The provider that registered; never `Auto`.
    pub provider: Provider,
    /// Prompt tokens per forward call of a prefill; `None`: the whole prompt in one call.
    pub prefill_chunk: Option<usize>,
    /// Most bytes of logits one call prefilling several prompts may produce
    /// ([`PREFILL_GROUP_LOGITS_BYTES`]); more prompts are prefilled in several groups.
    pub prefill_group_logits_bytes: usize,
    /// Key/value buffers are preallocated and bound as both `past_key_values.*` and
    /// `present.*`, so attention writes only the new positions instead of copying the
    /// whole cache into a new `present` each step (most of a step's time after a thousand
    /// tokens). Only where the graph takes shared buffers and the buffers live where the
    /// provider computes (host memory: the CPU).
    pub in_place_cache: bool,
    /// `Some(window)`: the in-place cache slides. Every layer reads only the last
    /// `window` keys, so when the next call does not fit, each row's oldest tokens are
    /// slid out down to `window` ([`crate::cache::slide`]) and a row needs room for the
    /// window and one prefill piece ([`RunPlan::cache_room`]), not its whole conversation
    /// (Needle 2 as published: 55 KB a token). Only the fused graph, whose attention finds
    /// each row's keys packed from slot 0, and only with the cache in place.
    pub sliding_window: Option<usize>,
    /// onnxruntime intra-op threads; 0 lets onnxruntime choose.
    pub threads: usize,
    /// Most rows decoded together; `None`: as many as the caller asks. The accelerator
    /// graphs take one row a call, so rows run one after another.
    pub max_rows: Option<usize>,
}

impl RunPlan {
    /// The plan for a graph `description` describes on `provider`; `fixed`: the shapes of
    /// an accelerator graph (`None` for a stock one).
    pub fn new(
        provider: Provider,
        description: &ExportDescription,
        fixed: Option<&FixedShape>,
        threads: usize,
    ) -> Self {
        let cpu = provider == Provider::Cpu;
        if fixed.is_some() {
            return RunPlan {
                provider,
                prefill_chunk: Some(PREFILL_CHUNK),
                prefill_group_logits_bytes: PREFILL_GROUP_LOGITS_BYTES,
                in_place_cache: false,
                sliding_window: None,
                threads,
                max_rows: Some(1),
            };
        }
        let in_place_cache = cpu && description.past_present_share_buffer;
        let fused = description.variant.attention.is_fused();
        RunPlan {
            provider,
            prefill_chunk: cpu.then_some(CPU_PREFILL_CHUNK),
            prefill_group_logits_bytes: PREFILL_GROUP_LOGITS_BYTES,
            in_place_cache,
            sliding_window: (in_place_cache && fused)
                .then(|| description.config.window_of_every_layer())
                .flatten(),
            threads,
            max_rows: None,
        }
    }

    /// Positions to preallocate for rows that feed `budget` tokens in all, `now` of them
    /// in the next call: `budget`, or where the cache slides, at most the window and one
    /// prefill piece (or the next call, when that is longer).
    pub fn cache_room(&self, now: usize, budget: usize) -> usize {
        match (self.sliding_window, self.prefill_chunk) {
            (Some(window), Some(chunk)) => budget.min((window + chunk).max(now)),
            _ => budget,
        }
    }
}

/// Which graphs `needle-run` runs (`--graph`): the stock interface's one graph, or the
/// accelerator graphs (`needle-export --target`: static shapes, batch 1, a decode and a
/// prefill graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKind {
    Stock,
    Accelerator,
}

impl Spelled for GraphKind {
    const WHAT: &'static str = "graph kind";
    const ALL: &'static [Self] = &[GraphKind::Stock, GraphKind::Accelerator];
    fn name(self) -> &'static str {
        match self {
            GraphKind::Stock => "stock",
            GraphKind::Accelerator => "accelerator",
        }
    }
}

/// The graphs a `.cact` is exported as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannedGraphs {
    /// One stock graph of this variant.
    Stock(Variant),
    /// The accelerator graphs for this target (fp32, float weights).
    Accelerator(AcceleratorTarget),
}

/// What the caller overrides of the provider's choice (`None`: the provider's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub graph: Option<GraphKind>,
    pub attention: Option<AttentionKind>,
    pub precision: Option<Precision>,
    pub matmul_weights: Option<MatMulWeights>,
}

/// The graphs a `.cact` is exported as for `provider`: the accelerator graphs for CoreML
/// and TensorRT (their one static-shape partition instead of the stock reference graph's
/// dozen; CONTRACT §2d), the stock [`variant_for`] elsewhere, or what `overrides` say.
/// `--attention` alone picks a stock graph (the accelerator graphs have no attention
/// variants); the accelerator graphs with an attention, precision or weights they cannot
/// be is an error.
pub fn graphs_for(provider: Provider, overrides: Overrides) -> Result<PlannedGraphs, String> {
    let preferred = match provider {
        _ if overrides.attention.is_some() => GraphKind::Stock,
        Provider::TensorRt | Provider::CoreMl => GraphKind::Accelerator,
        Provider::Auto | Provider::Cpu | Provider::Cuda => GraphKind::Stock,
    };
    let Overrides {
        attention,
        precision,
        matmul_weights,
        ..
    } = overrides;
    match overrides.graph.unwrap_or(preferred) {
        GraphKind::Stock => Ok(PlannedGraphs::Stock(variant_for(
            provider,
            attention,
            precision,
            matmul_weights,
        ))),
        GraphKind::Accelerator => {
            if attention.is_some()
                || precision.is_some_and(|p| p != Precision::Fp32)
                || matmul_weights.is_some_and(|w| w != MatMulWeights::Float)
            {
                return Err(
                    "the accelerator graphs are fp32 with float weights and have no \
                            attention variants; leave out --attention, --precision and \
                            --weights, or run --graph stock"
                        .into(),
                );
            }
            // One graph serves every target; the target is only recorded in its metadata.
            let target = match provider {
                Provider::TensorRt | Provider::Cuda => AcceleratorTarget::TensorRt,
                Provider::CoreMl | Provider::Cpu | Provider::Auto => AcceleratorTarget::CoreMl,
            };
            Ok(PlannedGraphs::Accelerator(target))
        }
    }
}

/// The variant a `.cact` is exported as for `provider`, unless the caller overrides the
/// attention core, the precision or the MatMul weights.
///
/// Attention: fused for CUDA and CPU, reference for TensorRT and CoreML (they take a
/// plain ai.onnx graph whole). Precision: fp32 everywhere; on CUDA the fused fp16 graph
/// was an order of magnitude slower than fp32 on small models (`bench/RESULTS.md`), and
/// fp32 matches upstream to 1.4e-6 there. Weights: packed on the CPU in fp32 — the
/// Needle kernels read the `.cact`'s codes, a file of about the `.cact`'s size instead of
/// four bytes a weight, and decode faster (`bench/RESULTS.md`) — float elsewhere, since
/// the kernels are CPU kernels and fp16 graphs have no packed form. Runtime: 1.24, the
/// releases of the onnxruntime the runner links.
pub fn variant_for(
    provider: Provider,
    attention: Option<AttentionKind>,
    precision: Option<Precision>,
    matmul_weights: Option<MatMulWeights>,
) -> Variant {
    let preferred = match provider {
        Provider::Auto | Provider::Cpu | Provider::Cuda => AttentionKind::FUSED,
        Provider::TensorRt | Provider::CoreMl => AttentionKind::Reference,
    };
    let precision = precision.unwrap_or(Precision::Fp32);
    let weights = match (provider, precision) {
        (Provider::Cpu, Precision::Fp32) => MatMulWeights::Packed,
        _ => MatMulWeights::Float,
    };
    Variant {
        attention: attention.unwrap_or(preferred),
        precision,
        matmul_weights: matmul_weights.unwrap_or(weights),
        runtime: RuntimeTarget::Since1_24,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_provider_gets_the_contracts_variant_unless_overridden() {
        let pick = |p| variant_for(p, None, None, None);
        for p in [Provider::Cpu, Provider::Cuda] {
            assert_eq!(pick(p).attention, AttentionKind::FUSED);
        }
        for p in [Provider::TensorRt, Provider::CoreMl] {
            assert_eq!(pick(p).attention, AttentionKind::Reference);
        }
        for p in [
            Provider::Cpu,
            Provider::Cuda,
            Provider::TensorRt,
            Provider::CoreMl,
        ] {
            assert_eq!(pick(p).precision, Precision::Fp32);
        }
        let forced = variant_for(
            Provider::Cuda,
            Some(AttentionKind::Reference),
            Some(Precision::Fp16),
            Some(MatMulWeights::Int4),
        );
        assert_eq!(
            forced,
            Variant {
                attention: AttentionKind::Reference,
                precision: Precision::Fp16,
                matmul_weights: MatMulWeights::Int4,
                runtime: RuntimeTarget::Since1_24,
            }
        );
    }

    #[test]
    fn coreml_and_tensorrt_get_the_accelerator_graphs_unless_overridden() {
        let plan = |p, overrides| graphs_for(p, overrides).unwrap();
        let none = Overrides::default();
        assert_eq!(
            plan(Provider::CoreMl, none),
            PlannedGraphs::Accelerator(AcceleratorTarget::CoreMl)
        );
        assert_eq!(
            plan(Provider::TensorRt, none),
            PlannedGraphs::Accelerator(AcceleratorTarget::TensorRt)
        );
        for p in [Provider::Cpu, Provider::Cuda] {
            assert_eq!(
                plan(p, none),
                PlannedGraphs::Stock(variant_for(p, None, None, None))
            );
        }
        let forced = Overrides {
            graph: Some(GraphKind::Accelerator),
            ..none
        };
        assert!(matches!(
            plan(Provider::Cpu, forced),
            PlannedGraphs::Accelerator(_)
        ));
        let reference = Overrides {
            attention: Some(AttentionKind::Reference),
            ..none
        };
        assert!(matches!(
            plan(Provider::CoreMl, reference),
            PlannedGraphs::Stock(v) if v.attention == AttentionKind::Reference
        ));
        let fp16 = Overrides {
            precision: Some(Precision::Fp16),
            ..forced
        };
        assert!(graphs_for(Provider::Cpu, fp16).is_err());
    }

    #[test]
    fn only_the_cpu_in_fp32_gets_packed_weights_by_default() {
        let weights = |p, precision| variant_for(p, None, precision, None).matmul_weights;
        assert_eq!(weights(Provider::Cpu, None), MatMulWeights::Packed);
        assert_eq!(
            weights(Provider::Cpu, Some(Precision::Fp16)),
            MatMulWeights::Float
        );
        for p in [Provider::Cuda, Provider::TensorRt, Provider::CoreMl] {
            assert_eq!(weights(p, None), MatMulWeights::Float);
        }
        let kept = variant_for(Provider::Cpu, None, None, Some(MatMulWeights::Float));
        assert_eq!(kept.matmul_weights, MatMulWeights::Float);
    }
}
