//! CUDA and TensorRT checks. They need an NVIDIA GPU and an onnxruntime built with
//! those providers (e.g. the `onnxruntime-gpu==1.31.1` wheel's library), so they are
//! ignored by default. Run them with:
//!
//! ```sh
//! ORT_DYLIB_PATH=/path/to/onnxruntime_gpu/capi/libonnxruntime.so.1.31.1 \
//! LD_LIBRARY_PATH=<dirs of libcublas.so.13, libcudnn.so.9, libcufft.so.12, …> \
//!     cargo test -p needle-tests --test gpu -- --ignored --nocapture
//! ```
//!
//! What the last run gave is in `bench/RESULTS.md` (CUDA section).

use graphs::contract::AttentionKind;
use graphs::contract::{MatMulWeights, Precision};
use needle_tests::{
    case_logits, case_row_errors, cases, fixture, fixture_generate_options, generations, options,
    session_of,
};
use runner::generate::generate;
use runner::provider::Provider;

fn check(provider: Provider, attention: AttentionKind, precision: Precision, bound: f32) {
    for model in ["m48", "m64", "m96"] {
        let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
        let mut s = session_of(
            &bytes,
            &options(attention, precision, MatMulWeights::Float),
            provider,
        );
        assert_eq!(s.provider(), provider);
        for case in cases(model) {
            let got = case_logits(&mut s, &case);
            let vocab = s.config().output_vocab();
            let errors = case_row_errors(&got, &case.logits, &case, vocab);
            for (b, err) in errors.into_iter().enumerate() {
                println!(
                    "{model} {provider} {attention:?} {precision:?} {}[{b}]: {err:.2e}",
                    case.name
                );
                assert!(err <= bound, "{model} case {} row {b}: {err}", case.name);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and onnxruntime with the CUDA provider (see the module docs)"]
fn cuda_fused_fp16_matches_upstream_to_half_precision() {
    check(Provider::Cuda, AttentionKind::FUSED, Precision::Fp16, 5e-3);
}

#[test]
#[ignore = "needs a CUDA GPU and onnxruntime with the CUDA provider (see the module docs)"]
fn cuda_reference_fp32_matches_upstream() {
    check(
        Provider::Cuda,
        AttentionKind::Reference,
        Precision::Fp32,
        1e-4,
    );
}

#[test]
#[ignore = "needs a CUDA GPU and onnxruntime with the CUDA provider (see the module docs)"]
fn cuda_fused_fp32_matches_upstream() {
    check(Provider::Cuda, AttentionKind::FUSED, Precision::Fp32, 1e-4);
}

#[test]
#[ignore = "needs an NVIDIA GPU and onnxruntime with the TensorRT provider (see the module docs)"]
fn tensorrt_reference_fp32_matches_upstream() {
    check(
        Provider::TensorRt,
        AttentionKind::Reference,
        Precision::Fp32,
        1e-3,
    );
}

/// Greedy generation on CUDA against upstream's: returns (tokens equal before the first
/// divergence, tokens upstream generated) over every prompt, and checks the first token always.
fn generation_agreement(attention: AttentionKind, precision: Precision) -> (usize, usize) {
    let (mut agreed, mut total) = (0, 0);
    for model in ["m48", "m64", "m96"] {
        let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
        let opts = options(attention, precision, MatMulWeights::Float);
        let mut s = session_of(&bytes, &opts, Provider::Cuda);
        for r in generations(model) {
            let got = generate(&mut s, &r.prompt_ids, &fixture_generate_options()).unwrap();
            let same = got
                .generated_ids
                .iter()
                .zip(&r.generated_ids)
                .take_while(|(a, b)| a == b)
                .count();
            println!(
                "{model} cuda {attention:?} {precision:?}: {same}/{} tokens as upstream",
                r.generated_ids.len()
            );
            assert!(same > 0, "{model}: first token differs from upstream");
            agreed += same;
            total += r.generated_ids.len();
        }
    }
    (agreed, total)
}

#[test]
#[ignore = "needs a CUDA GPU and onnxruntime with the CUDA provider (see the module docs)"]
fn cuda_reference_fp32_generates_upstream_tokens_exactly() {
    let (agreed, total) = generation_agreement(AttentionKind::Reference, Precision::Fp32);
    assert_eq!(agreed, total);
}

#[test]
#[ignore = "needs a CUDA GPU and onnxruntime with the CUDA provider (see the module docs)"]
fn cuda_fused_fp32_generates_upstream_tokens_exactly() {
    let (agreed, total) = generation_agreement(AttentionKind::FUSED, Precision::Fp32);
    assert_eq!(agreed, total);
}

#[test]
#[ignore = "needs a CUDA GPU and onnxruntime with the CUDA provider (see the module docs)"]
fn cuda_fused_fp16_generation_follows_upstream() {
    let (agreed, total) = generation_agreement(AttentionKind::FUSED, Precision::Fp16);
    println!("cuda fused fp16: {agreed}/{total} generated tokens before any divergence");
    assert!(agreed * 10 >= total * 9, "{agreed}/{total}");
}
