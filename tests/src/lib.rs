//! Shared helpers for the end-to-end tests: fixture paths, the upstream reference
//! cases, the contract's comparison rule, and in-memory export + session.

use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget, Variant};
use runner::provider::Provider;
use runner::session::NeedleSession;
use safetensors::SafeTensors;
pub use test_support::{fixture, python, python_in, read_fixture, repo_root, scratch};

/// The conformance models (upstream fixtures): Needle 2's three and its sliding-window
/// model, and Needle 3's (`tests/fixtures/needle3/`, cactus-needle 3.2.8).
pub const MODELS: [&str; 9] = [
    "m48",
    "m64",
    "m96",
    "m64w",
    "needle3/n3a",
    "needle3/n3b",
    "needle3/n3c",
    "needle3/n3q",
    "needle3/n3a_d4",
];

pub use test_support::GENERATING_MODELS;

/// One upstream reference case: ids `[batch, seq]`, real lengths, logits `[batch, seq, vocab]`.
pub struct Case {
    pub name: String,
    pub batch: usize,
    pub seq: usize,
    pub input_ids: Vec<i64>,
    pub lengths: Vec<usize>,
    pub logits: Vec<f32>,
}

/// The little-endian int64 tensor `name` of `st`, flattened.
pub fn i64_values(st: &SafeTensors, name: &str) -> Vec<i64> {
    values(st, name, i64::from_le_bytes)
}

/// The little-endian float32 tensor `name` of `st`, flattened.
pub fn f32_values(st: &SafeTensors, name: &str) -> Vec<f32> {
    values(st, name, f32::from_le_bytes)
}

fn values<T, const N: usize>(st: &SafeTensors, name: &str, read: fn([u8; N]) -> T) -> Vec<T> {
    st.tensor(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .data()
        .chunks_exact(N)
        .map(|b| read(b.try_into().expect("N bytes")))
        .collect()
}

/// Every logits case of `<model>.cases.safetensors`.
pub fn cases(model: &str) -> Vec<Case> {
    let bytes = std::fs::read(fixture(&format!("{model}.cases.safetensors"))).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st
        .names()
        .iter()
        .filter_map(|n| n.strip_suffix(".input_ids").map(String::from))
        // Needle 3's head cases (`H.*`) have head outputs instead of logits.
        .filter(|n| st.names().contains(&format!("{n}.logits").as_str()))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let ids = st.tensor(&format!("{name}.input_ids")).unwrap();
            let (batch, seq) = (ids.shape()[0], ids.shape()[1]);
            let input_ids = i64_values(&st, &format!("{name}.input_ids"));
            let lengths = i64_values(&st, &format!("{name}.lengths"))
                .into_iter()
                .map(|l| l as usize)
                .collect();
            let logits = f32_values(&st, &format!("{name}.logits"));
            Case {
                name,
                batch,
                seq,
                input_ids,
                lengths,
                logits,
            }
        })
        .collect()
}

/// One upstream greedy generation (`<model>.generate.json`): prompt ids with BOS, 32 new
/// tokens or fewer when EOS came first.
pub struct UpstreamGeneration {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub stopped_on_eos: bool,
}

/// Every upstream generation of `model`.
pub fn generations(model: &str) -> Vec<UpstreamGeneration> {
    let text = std::fs::read_to_string(fixture(&format!("{model}.generate.json"))).unwrap();
    let refs: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    refs.iter()
        .map(|r| UpstreamGeneration {
            prompt_ids: ids(&r["prompt_ids"]),
            generated_ids: ids(&r["generated_ids"]),
            stopped_on_eos: r["stopped_on_eos"].as_bool().unwrap(),
        })
        .collect()
}

/// The options upstream's fixtures were generated with: greedy, 32 tokens, EOS (id 1) stops.
pub fn fixture_generate_options() -> runner::decode::GenerateOptions {
    runner::decode::GenerateOptions {
        max_new_tokens: 32,
        stop_ids: vec![1],
        sampling: runner::decode::Sampling::Greedy,
    }
}

/// The contract's rule for one row: `max |got − ref| / max(1, max |ref|)` over the
/// first `len` positions. `got`, `reference`: `[seq, vocab]` of that row.
pub fn row_error(got: &[f32], reference: &[f32], len: usize, vocab: usize) -> f32 {
    let n = len * vocab;
    let diff = got[..n]
        .iter()
        .zip(&reference[..n])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let scale = reference[..n].iter().map(|x| x.abs()).fold(1.0, f32::max);
    diff / scale
}

/// The logits of `case` run whole through `s` from an empty cache: `[batch, seq, vocab]`.
pub fn case_logits(s: &mut NeedleSession, case: &Case) -> Vec<f32> {
    let cache = s.empty_cache(case.batch).unwrap();
    s.forward(&case.input_ids, case.batch, cache)
        .unwrap()
        .logits
}

/// [`row_error`] of each row of `got` against `reference`, both `[batch, seq, vocab]` of
/// `case`, over the row's real positions.
pub fn case_row_errors(got: &[f32], reference: &[f32], case: &Case, vocab: usize) -> Vec<f32> {
    let row = case.seq * vocab;
    (0..case.batch)
        .map(|b| {
            let rows = b * row..(b + 1) * row;
            row_error(&got[rows.clone()], &reference[rows], case.lengths[b], vocab)
        })
        .collect()
}

/// The contract's tolerance on that error.
pub const TOLERANCE: f32 = 1e-4;

/// The export options of a plain in-memory export with the given variant.
pub fn options(
    attention: AttentionKind,
    precision: Precision,
    matmul_weights: MatMulWeights,
) -> ExportOptions {
    ExportOptions::in_memory(Variant {
        attention,
        precision,
        matmul_weights,
        runtime: RuntimeTarget::Since1_24,
    })
}

/// The ONNX bytes of `.cact` bytes exported with `opts`.
pub fn onnx_of(cact: &[u8], opts: &ExportOptions) -> Vec<u8> {
    NeedleModel::from_bytes("model.cact", cact)
        .unwrap()
        .export(opts)
}

/// Exports `.cact` bytes with `opts` in memory and loads the graph on `provider` with one thread.
pub fn session_of(cact: &[u8], opts: &ExportOptions, provider: Provider) -> NeedleSession {
    NeedleSession::create(&onnx_of(cact, opts), provider, false, 1).unwrap()
}

/// Exports `.cact` bytes as the accelerator graphs (`needle-export --target`) in memory and
/// loads the pair on the CPU with one thread.
pub fn accelerator_session_of(cact: &[u8]) -> NeedleSession {
    let model = NeedleModel::from_bytes("model.cact", cact).unwrap();
    let opts = options(
        AttentionKind::Reference,
        Precision::Fp32,
        MatMulWeights::Float,
    );
    let target = graphs::contract::AcceleratorTarget::CoreMl;
    let graph = |sequence| model.export_accelerator(&opts, target, sequence).unwrap();
    let registered = runner::provider::session_builder(
        runner::ort_env::init().unwrap(),
        Provider::Cpu,
        false,
        1,
    )
    .unwrap();
    NeedleSession::accelerator_from_memory(
        &graph(1),
        &graph(graphs::accelerator::PREFILL_CHUNK),
        registered,
    )
    .unwrap()
}

/// Exports fixture `model` (fp32, dense weights) and loads it on the CPU with one thread.
pub fn session(model: &str, attention: AttentionKind) -> NeedleSession {
    session_with(model, attention, MatMulWeights::Float)
}

/// [`session`] with the large MatMuls' weights stored as `weights`.
pub fn session_with(
    model: &str,
    attention: AttentionKind,
    weights: MatMulWeights,
) -> NeedleSession {
    let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
    session_of(
        &bytes,
        &options(attention, Precision::Fp32, weights),
        Provider::Cpu,
    )
}
