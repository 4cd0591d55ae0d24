//! What the fuzz targets run on one input. Shared with the regression test
//! `exporter/tests/fuzz_regressions.rs` (which includes this file by path), so
//! a committed crash input replays through exactly the calls that found it.
//!
//! Every call may return an error; none may panic. With [`peak::PeakAlloc`]
//! as the global allocator, parsing must also stay within a small multiple of
//! the input's size in live heap (`-malloc_limit_mb` only catches single giant
//! allocations); without it the allocation checks pass trivially.

use exporter::cact::{file_generation, CactError, Needle2File, Needle3File, TokenizerSpec};
use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use exporter::tokenizer::{NeedleTokenizer, SpecialIds};
use graphs::contract::{
    AttentionKind, FusedOp, Generation, MatMulWeights, Precision, RuntimeTarget, Variant,
};

use peak::measure;

/// Most heap `Needle2File::parse` / `TokenizerSpec::parse` may hold at once for
/// an input of `len` bytes (the reader copies the file and keeps a few
/// structs per 44-byte directory record or 7-byte piece record).
pub fn parse_budget(len: usize) -> usize {
    16 * len + (1 << 20)
}

/// Most heap reading everything out of a parsed `.cact` may hold at once:
/// 2-bit CQ weights dequantize to 16 x their size in float32, plus a
/// Hadamard matrix of up to 1024^2 floats and the tokenizer.
pub fn read_budget(len: usize) -> usize {
    64 * len + (16 << 20)
}

/// Parses `data` with its generation's reader (the tag picks it; Needle 2's reports a bad tag).
fn parse(data: &[u8]) -> Result<(), CactError> {
    match file_generation(data) {
        Ok(Generation::Needle3) => Needle3File::parse(data).map(drop),
        _ => Needle2File::parse(data).map(drop),
    }
}

/// The `cact` fuzz target: either generation.
pub fn cact_target(data: &[u8]) {
    let (parsed, peak) = measure(|| parse(data));
    assert!(
        peak <= parse_budget(data.len()),
        "parsing {} bytes held {peak} bytes of heap at once",
        data.len()
    );
    if parsed.is_ok() {
        drop(parsed);
        let ((), peak) = measure(|| cact(data));
        assert!(
            peak <= read_budget(data.len()),
            "reading {} bytes held {peak} bytes of heap at once",
            data.len()
        );
    }
}

/// The `tokenizer_blob` fuzz target.
pub fn tokenizer_blob_target(data: &[u8]) {
    let (parsed, peak) = measure(|| TokenizerSpec::parse(data));
    assert!(
        peak <= parse_budget(data.len()),
        "parsing a {}-byte tokenizer blob held {peak} bytes of heap at once",
        data.len()
    );
    if let Ok(spec) = parsed {
        tokenizer(&spec);
    }
}

/// Text encoded by every tokenizer that builds: spaces (leading, doubled,
/// trailing), a chat marker, an ASCII byte, non-ASCII letters and an emoji that
/// a small vocabulary only covers through byte fallback or `<unk>`.
pub const TEXT: &str = "  <|im_start|>user\nHello,  wörld ab a\tb 日本 \u{1F600} <|im_end|> ";

/// The `.cact` readers: parse, then everything a parsed file offers — the
/// config, every weight (dequantized; Needle 3's engram tables as checked codes), the
/// probe heads, and its tokenizer.
pub fn cact(data: &[u8]) {
    if file_generation(data).ok() == Some(Generation::Needle3) {
        return cact3(data);
    }
    let Ok(file) = Needle2File::parse(data) else {
        return;
    };
    let _ = file.config();
    let _ = file.weights();
    let _ = file.probe_heads();
    for entry in file.entries() {
        if entry.name == "heads.manifest" || entry.name == "tokenizer" {
            let _ = file.tensor(&entry.name);
        }
    }
    tokenizer(file.tokenizer());
}

fn cact3(data: &[u8]) {
    let Ok(file) = Needle3File::parse(data) else {
        return;
    };
    let _ = file.config();
    let _ = file.weights();
    let _ = file.probe_heads();
    for entry in file.entries() {
        if entry.name.ends_with(".tables") {
            let _ = file.tensor(&entry.name);
        }
    }
    tokenizer(file.tokenizer());
}

/// The `needle3_export` target: what `needle-export` does with a Needle 3 file, in memory —
/// the whole-model read, the fused and the reference graph, and the smallest ladder rung's.
/// Header fields that size no tensor still size the graph (RoPE tables, engram windows and
/// hashes), so this, not the parse, is where a missing bound shows; libFuzzer's
/// `-rss_limit_mb` bounds what building may take.
pub fn needle3_export_target(data: &[u8]) {
    if file_generation(data).ok() != Some(Generation::Needle3) {
        return;
    }
    let Ok(model) = NeedleModel::from_bytes("fuzz.cact", data) else {
        return;
    };
    let variant = |attention| Variant {
        attention,
        precision: Precision::Fp32,
        matmul_weights: MatMulWeights::Float,
        runtime: RuntimeTarget::Since1_24,
    };
    let fused = variant(AttentionKind::Fused(FusedOp::GroupQueryAttention));
    let reference = variant(AttentionKind::Reference);
    for v in [fused, reference] {
        let _ = model.export(&ExportOptions::in_memory(v));
    }
    if let Ok(rung) = model.rung(2) {
        let _ = rung.export(&ExportOptions::in_memory(fused));
    }
}

/// The tokenizer blob parser on its own, then the tokenizer it describes.
pub fn tokenizer_blob(data: &[u8]) {
    if let Ok(spec) = TokenizerSpec::parse(data) {
        tokenizer(&spec);
    }
}

/// Builds the BPE tokenizer from the pieces, encodes [`TEXT`] and a text made of every piece
/// (so each chat marker is cut out somewhere, next to other markers and pieces), decodes the
/// results, every id of the vocabulary and a few ids past it, and writes its
/// `tokenizer.json` and reads it back.
pub fn tokenizer(spec: &TokenizerSpec) {
    let Ok(tok) = NeedleTokenizer::from_spec(spec, true) else {
        return;
    };
    let every_piece: String = spec.pieces.iter().map(|p| p.text.as_str()).collect();
    for text in [TEXT, &every_piece, "", " "] {
        let ids = tok.encode(text);
        let _ = tok.decode(&ids);
    }
    let n = spec.pieces.len() as u32;
    let mut all: Vec<u32> = (0..n).collect();
    all.extend([n, n.wrapping_add(1), u32::MAX]);
    let _ = tok.decode(&all);
    let json = tok.to_json();
    let special = SpecialIds {
        pad: spec.pad_id,
        eos: spec.eos_id,
        bos: spec.bos_id,
        unk: spec.unk_id,
    };
    let back = NeedleTokenizer::from_json(&json, special, spec.add_dummy_prefix, true)
        .expect("a written tokenizer.json reads back");
    assert_eq!(
        back.encode(TEXT),
        tok.encode(TEXT),
        "tokenizer.json encodes alike"
    );
    let _ = tok.token_id("<|im_end|>");
}

/// A counting allocator, installed as the global allocator by the fuzz targets
/// and the regression test.
pub mod peak {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    static LIVE: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);

    pub struct PeakAlloc;

    unsafe impl GlobalAlloc for PeakAlloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc(layout);
            if !p.is_null() {
                grow(layout.size());
            }
            p
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc_zeroed(layout);
            if !p.is_null() {
                grow(layout.size());
            }
            p
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            System.dealloc(ptr, layout);
            LIVE.fetch_sub(layout.size(), Relaxed);
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let p = System.realloc(ptr, layout, new_size);
            if !p.is_null() {
                LIVE.fetch_sub(layout.size(), Relaxed);
                grow(new_size);
            }
            p
        }
    }

    fn grow(size: usize) {
        let live = LIVE.fetch_add(size, Relaxed) + size;
        PEAK.fetch_max(live, Relaxed);
    }

    /// Runs `f` and returns its result with the most bytes it had allocated
    /// at once (beyond what was live before), when [`PeakAlloc`] is the global allocator.
    pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let base = LIVE.load(Relaxed);
        PEAK.store(base, Relaxed);
        let out = f();
        (out, PEAK.load(Relaxed).saturating_sub(base))
    }
}
