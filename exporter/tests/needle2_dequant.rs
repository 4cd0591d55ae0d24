//! Every tensor of the three fixture models, read by `Needle2File`, against
//! upstream `read_export` (tests/fixtures/<model>.dequant.safetensors, written
//! by tests/fixtures/make_dequant_reference.py).

use exporter::cact::{Codebooks, Encoding, Needle2File, PieceKind};
use graphs::blocks::weights::EngramTables;
use graphs::needle2::HeadKind;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use test_support::fixture;

fn f32s(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let view = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(view.dtype(), Dtype::F32, "{name}");
    let data = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (view.shape().to_vec(), data)
}

/// Checks every tensor bit for bit and prints the max |ours - upstream|.
fn check_tensors(model: &str, file: &Needle2File, st: &SafeTensors) {
    let mut max_diff = 0f32;
    let mut differing = 0usize;
    for entry in file.entries() {
        if entry.encoding == Encoding::Raw {
            continue;
        }
        let ours = file.tensor(&entry.name).unwrap();
        let (shape, want) = f32s(st, &entry.name);
        assert_eq!(ours.shape, shape, "{model} {}", entry.name);
        assert_eq!(ours.data.len(), want.len(), "{model} {}", entry.name);
        for (&a, &b) in ours.data.iter().zip(&want) {
            max_diff = max_diff.max((a - b).abs());
            differing += usize::from(a.to_bits() != b.to_bits());
        }
    }
    println!("{model}: max |ours - upstream| = {max_diff:e}, {differing} values differ in any bit");
    assert_eq!(
        differing, 0,
        "{model}: dequantization is not bit-identical to upstream"
    );
}

fn check_header(model: &str, file: &Needle2File, st: &SafeTensors, meta: &Value) {
    let h = file.header();
    let words: Vec<u32> = st
        .tensor("header.u32")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mine = [
        h.common.num_tensors,
        h.common.codebook_len,
        h.common.kv_window,
        h.common.kv_bits,
        h.common.vocab,
        h.common.d_model,
        h.common.num_heads,
        h.common.num_kv_heads,
        h.common.num_layers,
        h.head_dim,
        h.common.max_seq_len,
        h.common.hada_n,
        h.common.mhc_lanes,
        h.common.engram_slots,
        h.common.engram_sub_dim,
        h.common.num_engram_tables,
        h.common.engram_conv_taps,
        h.common.engram_conv_dilation,
    ];
    assert_eq!(mine.as_slice(), &words[1..19], "{model}: header words");
    assert_eq!(words[19] as usize, h.common.engram_orders.len());
    assert_eq!(
        &words[20..20 + h.common.engram_orders.len()],
        h.common.engram_orders.as_slice()
    );
    assert_eq!(words[24] as usize, h.common.engram_sites.len());
    assert_eq!(
        &words[25..25 + h.common.engram_sites.len()],
        h.common.engram_sites.as_slice()
    );
    assert_eq!(f32s(st, "header.rope_theta").1, vec![h.common.rope_theta]);

    let cfg = file.config();
    let c = &cfg.common;
    let e = &c.engram;
    let field = |k: &str| meta[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
    let list = |k: &str| -> Vec<usize> {
        meta[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect()
    };
    assert_eq!(c.vocab, field("vocab_size"));
    assert_eq!(c.d_model, field("d_model"));
    assert_eq!(c.num_heads, field("num_heads"));
    assert_eq!(c.num_kv_heads, field("num_kv_heads"));
    assert_eq!(c.num_layers, field("num_layers"));
    assert_eq!(cfg.head_dim, field("head_dim"));
    assert_eq!(c.max_seq_len, field("max_seq_len"));
    assert_eq!(c.hada_n, field("hada_n"));
    assert_eq!(c.mhc_lanes, field("mhc_lanes"));
    assert_eq!(e.slots, field("engram_slots"));
    assert_eq!(e.sub_dim, field("engram_sub_dim"));
    assert_eq!(e.num_tables, field("num_engram_tables"));
    assert_eq!(e.conv_taps, field("engram_conv_taps"));
    assert_eq!(e.dilation, field("engram_conv_dilation"));
    assert_eq!(e.orders, list("engram_orders"));
    assert_eq!(e.sites, list("engram_layers"));
    assert_eq!(c.kv_window, field("kv_window"));
    assert_eq!(c.kv_bits as usize, field("kv_bits"));
    assert_eq!(c.rope_theta as f64, meta["rope_theta"].as_f64().unwrap());
    assert_eq!(file.entries().len(), field("num_tensors"));

    let cb = file.codebooks();
    let stored: Vec<f32> = [&cb.cb2[..], &cb.cb3[..], &cb.cb4[..]].concat();
    assert_eq!(
        stored,
        f32s(st, "codebook.header").1,
        "{model}: header codebooks"
    );
    let recomputed = f32s(st, "codebook.recomputed").1;
    assert_eq!(
        stored,
        recomputed[..28],
        "{model}: header codebooks != _cq_codebook_np"
    );
    assert_eq!(
        Codebooks::ternary(128).as_slice(),
        &recomputed[28..],
        "{model}: ternary"
    );
}

fn check_tokenizer(model: &str, file: &Needle2File, want: &Value) {
    let t = file.tokenizer();
    let id = |k: &str| want[k].as_u64().unwrap() as u32;
    assert_eq!(
        (t.pad_id, t.eos_id, t.bos_id, t.unk_id),
        (id("pad_id"), id("eos_id"), id("bos_id"), id("unk_id"))
    );
    assert_eq!(
        t.add_dummy_prefix,
        want["add_dummy_prefix"].as_bool().unwrap()
    );
    assert_eq!(t.byte_fallback, want["byte_fallback"].as_bool().unwrap());
    let pieces = want["pieces"].as_array().unwrap();
    assert_eq!(t.pieces.len(), pieces.len(), "{model}: n_pieces");
    for (i, p) in t.pieces.iter().enumerate() {
        assert_eq!(p.text, pieces[i].as_str().unwrap(), "piece {i}");
        assert_eq!(
            p.score as f64,
            want["scores"][i].as_f64().unwrap(),
            "score {i}"
        );
        let kind = match want["types"][i].as_u64().unwrap() {
            0 => PieceKind::Normal,
            1 => PieceKind::Unknown,
            2 => PieceKind::Control,
            3 => PieceKind::UserDefined,
            _ => PieceKind::Byte,
        };
        assert_eq!(p.kind, kind, "type {i}");
        if kind == PieceKind::Byte {
            assert_eq!(format!("<0x{:02X}>", p.byte_value().unwrap()), p.text);
        }
    }
}

fn check_model(model: &str) {
    let file = Needle2File::read(fixture(&format!("{model}.cact"))).unwrap();
    let bytes = std::fs::read(fixture(&format!("{model}.dequant.safetensors"))).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    let reference: Value = serde_json::from_str(&meta["reference"]).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();

    let names: Vec<&str> = reference["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let got: Vec<&str> = file.entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(got, names, "{model}: positional names");
    check_header(model, &file, &st, &reference["header"]);
    check_tokenizer(model, &file, &reference["tokenizer"]);
    check_tensors(model, &file, &st);

    let w = file.weights().unwrap();
    assert_eq!(w.layers.len(), file.config().common.num_layers);
    assert_eq!(w.engrams.len(), file.config().common.engram.sites.len());
    assert_eq!(w.layers[0].k_proj, file.tensor("layer00.k_proj").unwrap());
    assert_eq!(w.mhc.phi_res, file.tensor("mhc_phi_res").unwrap());
    assert_eq!(
        w.engrams[0].tables,
        EngramTables::Dense(file.tensor("engram0.tables").unwrap())
    );
}

#[test]
fn m48_matches_upstream() {
    check_model("m48");
}

#[test]
fn m64_matches_upstream() {
    check_model("m64");
}

#[test]
fn m96_matches_upstream() {
    check_model("m96");
}

#[test]
fn probe_heads_of_m64() {
    let file = Needle2File::read(fixture("m64.cact")).unwrap();
    let heads = file.probe_heads().unwrap();
    let kinds: Vec<HeadKind> = heads.iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HeadKind::Contrastive, HeadKind::Confidence]);
    assert_eq!(heads[0].probes.shape, [4, 64]);
    assert_eq!(heads[0].proj.shape, [128, 256]);
    assert_eq!(heads[0].bias.shape, [128]);
    assert_eq!(heads[1].probes.shape, [8, 64]);
    assert_eq!(heads[1].proj.shape, [1, 512]);
    assert_eq!(heads[1].bias.shape, [1]);
    for model in ["m48", "m96"] {
        let file = Needle2File::read(fixture(&format!("{model}.cact"))).unwrap();
        assert!(file.probe_heads().unwrap().is_empty(), "{model}");
    }
}
