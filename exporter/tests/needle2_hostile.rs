//! Corrupted variants of the m64 fixture (and one of m48): each must give a
//! specific one-line `CactError`, never a panic or a huge allocation.

use exporter::cact::layout::{record_element_offset, RecordField, CODEBOOK_LEN, RECORD_BYTES};
use exporter::cact::needle2::layout::{self, directory_start, HEADER_BYTES};
use exporter::cact::{CactError, Needle2File, NEEDLE3_TAG};
use graphs::contract::Generation;
use test_support::read_fixture;

const HEADER: usize = HEADER_BYTES as usize;
const DIR_START: usize = directory_start(CODEBOOK_LEN) as usize;
const RECORD: usize = RECORD_BYTES as usize;
const FP16_INF: u16 = 0x7c00;
const FP16_NAN: u16 = 0x7e00;

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// File offset of header field `name` (the first element of an array).
fn field(name: &str) -> usize {
    layout::header_offset(name) as usize
}

/// File offset of codebook entry `index`, which follow the header.
fn codebook_entry(index: usize) -> usize {
    HEADER + 4 * index
}

/// Where things are in the pristine file.
struct Map {
    bytes: Vec<u8>,
    names: Vec<String>,
    blobs: Vec<(usize, usize)>,
}

impl Map {
    fn new(model: &str) -> Map {
        let bytes = read_fixture(&format!("{model}.cact"));
        let file = Needle2File::parse(&bytes).unwrap();
        let names = file.entries().iter().map(|e| e.name.clone()).collect();
        let blobs = file
            .entries()
            .iter()
            .map(|e| (e.blob_offset as usize, e.nbytes as usize))
            .collect();
        Map {
            bytes,
            names,
            blobs,
        }
    }

    fn index(&self, name: &str) -> usize {
        self.names.iter().position(|n| n == name).unwrap()
    }

    /// File offset of element `element` of `field` in the directory record of `name`.
    fn rec_element(&self, name: &str, field: RecordField, element: usize) -> usize {
        DIR_START + RECORD * self.index(name) + record_element_offset(field, element) as usize
    }

    /// File offset of `field` in the directory record of `name`.
    fn rec(&self, name: &str, field: RecordField) -> usize {
        self.rec_element(name, field, 0)
    }

    fn blob(&self, name: &str) -> (usize, usize) {
        self.blobs[self.index(name)]
    }

    fn tokenizer(&self) -> usize {
        self.blob("tokenizer").0
    }

    /// File offset of tokenizer piece record `k` (its f32 score).
    fn piece(&self, k: usize) -> usize {
        let mut at = self.tokenizer() + 24;
        for _ in 0..k {
            at += 7 + u16::from_le_bytes([self.bytes[at + 5], self.bytes[at + 6]]) as usize;
        }
        at
    }
}

enum Stage {
    Parse,
    Weights,
}

struct Case {
    name: String,
    bytes: Vec<u8>,
    stage: Stage,
    expect: Box<dyn Fn(&CactError) -> bool>,
}

fn case(
    cases: &mut Vec<Case>,
    map: &Map,
    name: impl Into<String>,
    mutate: impl FnOnce(&mut Vec<u8>),
    expect: impl Fn(&CactError) -> bool + 'static,
) {
    let mut bytes = map.bytes.clone();
    mutate(&mut bytes);
    cases.push(Case {
        name: name.into(),
        bytes,
        stage: Stage::Parse,
        expect: Box::new(expect),
    });
}

fn truncated(what: &'static str) -> impl Fn(&CactError) -> bool {
    move |e| matches!(e, CactError::Truncated { what: w, .. } if w.contains(what))
}

fn out_of_bounds(tensor: String) -> impl Fn(&CactError) -> bool {
    move |e| matches!(e, CactError::BlobOutOfBounds { tensor: t, .. } if *t == tensor)
}

fn header_field(field: &'static str) -> impl Fn(&CactError) -> bool {
    move |e| matches!(e, CactError::Header { field: f, .. } if *f == field)
}

fn truncations(map: &Map, cases: &mut Vec<Case>) {
    for (len, what) in [
        (0, "header tag"),
        (3, "header tag"),
        (HEADER / 2, "header"),
        (HEADER - 1, "header"),
        (HEADER, "codebook"),
        (HEADER + 50, "codebook"),
        (DIR_START, "directory"),
        (DIR_START + RECORD * 10 + 7, "directory"),
    ] {
        case(
            cases,
            map,
            format!("truncated at {len}"),
            |b| b.truncate(len),
            truncated(what),
        );
    }
    let dir_end = DIR_START + RECORD * map.names.len();
    case(
        cases,
        map,
        "truncated after the directory",
        |b| b.truncate(dir_end),
        out_of_bounds("embedding".into()),
    );
    for (i, name) in map.names.iter().enumerate() {
        let (start, nbytes) = map.blobs[i];
        let cut = [start, start + nbytes / 2, start + nbytes - 1];
        for len in cut {
            case(
                cases,
                map,
                format!("truncated at {len} inside {name}"),
                |b| b.truncate(len),
                out_of_bounds(name.clone()),
            );
        }
    }
}

fn header_cases(map: &Map, cases: &mut Vec<Case>) {
    case(
        cases,
        map,
        "wrong tag",
        |b| put_u32(b, field("tag"), 0xdead_beef),
        |e| matches!(e, CactError::BadTag { found: 0xdead_beef }),
    );
    case(
        cases,
        map,
        "needle 3 tag",
        |b| put_u32(b, field("tag"), NEEDLE3_TAG),
        |e| {
            *e == CactError::OtherGeneration {
                found: Generation::Needle3,
                reader: Generation::Needle2,
            } && e.to_string()
                == "this is a Needle 3 .cact file; the Needle 2 reader cannot read it"
        },
    );
    let count = |e: &CactError| matches!(e, CactError::TensorCount { .. });
    case(
        cases,
        map,
        "num_tensors u32::MAX",
        |b| put_u32(b, field("num_tensors"), u32::MAX),
        count,
    );
    case(
        cases,
        map,
        "num_tensors off by one",
        |b| put_u32(b, field("num_tensors"), 82),
        count,
    );
    case(
        cases,
        map,
        "num_layers 256, the most the header allows",
        |b| put_u32(b, field("num_layers"), 256),
        count,
    );
    case(
        cases,
        map,
        "num_tensors claims one probe head",
        |b| put_u32(b, field("num_tensors"), 80),
        |e| matches!(e, CactError::Shape { tensor, .. } if tensor == "heads.manifest"),
    );
    case(
        cases,
        map,
        "codebook_len 2^30",
        |b| put_u32(b, field("codebook_len"), 1 << 30),
        header_field("codebook_len"),
    );
    case(
        cases,
        map,
        "kv_bits 5",
        |b| put_u32(b, field("kv_bits"), 5),
        header_field("kv_bits"),
    );
    case(
        cases,
        map,
        "vocab 2^20, the most the header allows",
        |b| put_u32(b, field("vocab"), 1 << 20),
        |e| matches!(e, CactError::Shape { tensor, .. } if tensor == "embedding"),
    );
    case(
        cases,
        map,
        "d_model 0",
        |b| put_u32(b, field("d_model"), 0),
        header_field("d_model"),
    );
    case(
        cases,
        map,
        "kv heads 3 of 4",
        |b| put_u32(b, field("num_kv_heads"), 3),
        header_field("num_kv_heads"),
    );
    case(
        cases,
        map,
        "odd head_dim",
        |b| put_u32(b, field("head_dim"), 15),
        header_field("head_dim"),
    );
    case(
        cases,
        map,
        "hada_n 65",
        |b| put_u32(b, field("hada_n"), 65),
        header_field("hada_n"),
    );
    case(
        cases,
        map,
        "9 engram orders",
        |b| put_u32(b, field("num_engram_orders"), 9),
        header_field("num_engram_orders"),
    );
    // Fields that size what the graph builds rather than what the file stores (the RoPE
    // tables, the engram window, the n-gram hashes): each of these took all memory in
    // needle-export before the header bounded it.
    for (name, element, value) in [
        ("max_seq_len", 0, u32::MAX),
        ("engram_conv_dilation", 0, 0x7FFF_FFFF),
        ("engram_orders", 0, 0x0010_0000),
    ] {
        case(
            cases,
            map,
            format!("{name}[{element}] = {value:#x}"),
            |b| {
                put_u32(
                    b,
                    layout::header_element_offset(name, element) as usize,
                    value,
                )
            },
            header_field(name),
        );
    }
    case(
        cases,
        map,
        "200 engram sites",
        |b| put_u32(b, field("num_engram_sites"), 200),
        header_field("num_engram_sites"),
    );
    case(
        cases,
        map,
        "engram site 4 of 4 layers",
        |b| {
            put_u32(
                b,
                layout::header_element_offset("engram_sites", 1) as usize,
                4,
            )
        },
        header_field("engram_sites"),
    );
    case(
        cases,
        map,
        "rope_theta NaN",
        |b| put_u32(b, field("rope_theta"), f32::NAN.to_bits()),
        header_field("rope_theta"),
    );
    let entry5 = codebook_entry(5) as u64;
    case(
        cases,
        map,
        "codebook NaN",
        |b| put_u32(b, codebook_entry(5), f32::NAN.to_bits()),
        move |e| {
            matches!(
                e,
                CactError::Codebook {
                    index: 5,
                    offset,
                    ..
                } if *offset == entry5
            )
        },
    );
    case(
        cases,
        map,
        "codebook not ascending",
        |b| put_u32(b, codebook_entry(12), 1.0f32.to_bits()),
        |e| matches!(e, CactError::Codebook { index: 13, .. }),
    );
}

fn directory_cases(map: &Map, cases: &mut Vec<Case>) {
    let is = |name: &'static str| move |t: &String| t == name;
    let dtype = is("embedding");
    case(
        cases,
        map,
        "dtype 9",
        |b| b[map.rec("embedding", RecordField::Dtype)] = 9,
        move |e| matches!(e, CactError::Dtype { tensor, found: 9, .. } if dtype(tensor)),
    );
    case(
        cases,
        map,
        "tokenizer not RAW",
        |b| b[map.rec("tokenizer", RecordField::Dtype)] = 1,
        |e| matches!(e, CactError::Dtype { tensor, found: 1, .. } if tensor == "tokenizer"),
    );
    case(
        cases,
        map,
        "CQ vector",
        |b| b[map.rec("layer00.norm_in", RecordField::Dtype)] = 3,
        |e| matches!(e, CactError::Dtype { tensor, found: 3, .. } if tensor == "layer00.norm_in"),
    );
    case(
        cases,
        map,
        "ndim 5",
        |b| b[map.rec("layer01.q_proj", RecordField::Ndim)] = 5,
        |e| matches!(e, CactError::Ndim { tensor, found: 5, .. } if tensor == "layer01.q_proj"),
    );
    case(
        cases,
        map,
        "k_proj shape",
        |b| put_u32(b, map.rec("layer03.k_proj", RecordField::Dims), 31),
        |e| {
            matches!(e, CactError::Shape { tensor, found, expected, .. }
                if tensor == "layer03.k_proj" && found == &[31, 64] && expected == &[32, 64])
        },
    );
    case(
        cases,
        map,
        "phi_res shape",
        |b| put_u32(b, map.rec_element("mhc_phi_res", RecordField::Dims, 1), 255),
        |e| matches!(e, CactError::Shape { tensor, .. } if tensor == "mhc_phi_res"),
    );
    case(
        cases,
        map,
        "probe proj shape",
        |b| {
            put_u32(
                b,
                map.rec_element("contrastive_head.proj", RecordField::Dims, 1),
                255,
            )
        },
        |e| matches!(e, CactError::Shape { tensor, .. } if tensor == "contrastive_head.proj"),
    );
    case(
        cases,
        map,
        "nbytes off by 64",
        |b| {
            put_u64(
                b,
                map.rec("layer02.v_proj", RecordField::NBytes),
                map.blob("layer02.v_proj").1 as u64 + 64,
            )
        },
        |e| matches!(e, CactError::NBytes { tensor, .. } if tensor == "layer02.v_proj"),
    );
    let len = map.bytes.len() as u64;
    case(
        cases,
        map,
        "offset past the end",
        |b| put_u64(b, map.rec("final_norm", RecordField::BlobOffset), len),
        out_of_bounds("final_norm".into()),
    );
    case(
        cases,
        map,
        "offset u64::MAX",
        |b| {
            put_u64(
                b,
                map.rec("final_norm", RecordField::BlobOffset),
                u64::MAX - 63,
            )
        },
        out_of_bounds("final_norm".into()),
    );
    case(
        cases,
        map,
        "tokenizer nbytes u64::MAX",
        |b| put_u64(b, map.rec("tokenizer", RecordField::NBytes), u64::MAX),
        out_of_bounds("tokenizer".into()),
    );
    let prev = map.blob("layer00.q_norm").0 as u64;
    case(
        cases,
        map,
        "blobs overlap",
        |b| put_u64(b, map.rec("layer00.k_norm", RecordField::BlobOffset), prev),
        |e| {
            matches!(e, CactError::Overlap { tensor, other, .. }
                if tensor == "layer00.k_norm" && other.contains("layer00.q_norm"))
        },
    );
    case(
        cases,
        map,
        "blob inside the directory",
        |b| put_u64(b, map.rec("layer00.d1", RecordField::BlobOffset), 64),
        |e| matches!(e, CactError::Overlap { tensor, .. } if tensor == "layer00.d1"),
    );
    let start = map.blob("layer01.attn_gate").0 as u64;
    case(
        cases,
        map,
        "misaligned blob",
        |b| {
            put_u64(
                b,
                map.rec("layer01.attn_gate", RecordField::BlobOffset),
                start + 2,
            )
        },
        |e| matches!(e, CactError::Misaligned { tensor, .. } if tensor == "layer01.attn_gate"),
    );
    for bits in [0, 1, 6, 7, 8] {
        case(
            cases,
            map,
            format!("bits {bits}"),
            |b| put_u32(b, map.rec("layer02.gate_proj", RecordField::Bits), bits),
            move |e| matches!(e, CactError::Bits { tensor, found, .. } if tensor == "layer02.gate_proj" && *found == bits),
        );
    }
    for group in [0, 3, 4, 96, 2048, u32::MAX] {
        case(
            cases,
            map,
            format!("group {group}"),
            |b| put_u32(b, map.rec("engram1.key_proj", RecordField::Group), group),
            move |e| matches!(e, CactError::Group { tensor, found, .. } if tensor == "engram1.key_proj" && *found == group),
        );
    }
    let manifest = map.blob("heads.manifest").0;
    case(
        cases,
        map,
        "head code 3",
        |b| put_u16(b, manifest + 2, 0x4200),
        |e| matches!(e, CactError::HeadCode { index: 1, found, .. } if *found == 3.0),
    );
    case(
        cases,
        map,
        "head code twice",
        |b| put_u16(b, manifest + 2, 0x3c00),
        |e| matches!(e, CactError::HeadCode { index: 1, found, .. } if *found == 1.0),
    );
}

fn tokenizer_cases(map: &Map, cases: &mut Vec<Case>) {
    let t = map.tokenizer();
    case(
        cases,
        map,
        "tokenizer count too high",
        |b| put_u32(b, t, 513),
        truncated("tokenizer piece 512"),
    );
    case(
        cases,
        map,
        "tokenizer count too low",
        |b| put_u32(b, t, 511),
        |e| matches!(e, CactError::TokenizerTrailing { .. }),
    );
    case(
        cases,
        map,
        "tokenizer count u32::MAX",
        |b| put_u32(b, t, u32::MAX),
        truncated("tokenizer pieces"),
    );
    let last = map.piece(511);
    let shorter = (last - t) as u64;
    case(
        cases,
        map,
        "tokenizer vocab 511",
        |b| {
            put_u32(b, t, 511);
            put_u64(b, map.rec("tokenizer", RecordField::NBytes), shorter);
        },
        |e| {
            matches!(
                e,
                CactError::TokenizerVocab {
                    found: 511,
                    vocab: 512,
                    ..
                }
            )
        },
    );
    case(
        cases,
        map,
        "tokenizer header cut",
        |b| put_u64(b, map.rec("tokenizer", RecordField::NBytes), 20),
        truncated("tokenizer header"),
    );
    case(
        cases,
        map,
        "tokenizer unk_id 512",
        |b| put_u32(b, t + 16, 512),
        |e| {
            matches!(
                e,
                CactError::TokenizerSpecialId {
                    field: "unk_id",
                    id: 512,
                    ..
                }
            )
        },
    );
    case(
        cases,
        map,
        "tokenizer flag 7",
        |b| b[t + 21] = 7,
        |e| {
            matches!(
                e,
                CactError::TokenizerFlag {
                    field: "byte_fallback",
                    found: 7,
                    ..
                }
            )
        },
    );
    let p = map.piece(300);
    case(
        cases,
        map,
        "tokenizer bad utf8",
        |b| b[p + 7] = 0xff,
        |e| matches!(e, CactError::TokenizerUtf8 { piece: 300, .. }),
    );
    case(
        cases,
        map,
        "tokenizer bad type",
        |b| b[p + 4] = 9,
        |e| {
            matches!(
                e,
                CactError::TokenizerPieceType {
                    piece: 300,
                    found: 9,
                    ..
                }
            )
        },
    );
    let byte_piece = map.piece(20);
    case(
        cases,
        map,
        "tokenizer bad byte piece",
        |b| b[byte_piece + 7 + 3] = b'Z',
        |e| matches!(e, CactError::TokenizerBytePiece { piece: 20, .. }),
    );
    case(
        cases,
        map,
        "tokenizer piece length past the end",
        |b| put_u16(b, last + 5, u16::MAX),
        truncated("tokenizer piece 511"),
    );
}

fn value_cases(map: &Map, cases: &mut Vec<Case>) {
    let mut weights_case = |name: &str, at: usize, v: u16, tensor: &'static str| {
        let mut bytes = map.bytes.clone();
        put_u16(&mut bytes, at, v);
        cases.push(Case {
            name: name.into(),
            bytes,
            stage: Stage::Weights,
            expect: Box::new(move |e| {
                matches!(e, CactError::NonFinite { tensor: t, offset, .. } if t == tensor && *offset == at as u64)
            }),
        });
    };
    weights_case(
        "final_norm inf",
        map.blob("final_norm").0 + 6,
        FP16_INF,
        "final_norm",
    );
    let (start, nbytes) = map.blob("layer01.q_proj");
    weights_case(
        "CQ norm NaN",
        start + nbytes - 2,
        FP16_NAN,
        "layer01.q_proj",
    );
}

fn check(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in &cases {
        let result = Needle2File::parse(&c.bytes).and_then(|f| match c.stage {
            Stage::Parse => Ok(()),
            Stage::Weights => f.weights().map(|_| ()),
        });
        match result {
            Err(e) if (c.expect)(&e) && !e.to_string().contains('\n') => {}
            other => failures.push(format!("{}: got {other:?}", c.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn truncation_at_every_boundary() {
    let map = Map::new("m64");
    let mut cases = Vec::new();
    truncations(&map, &mut cases);
    assert!(cases.len() > 200);
    check(cases);
}

#[test]
fn header_directory_tokenizer_and_values() {
    let map = Map::new("m64");
    let mut cases = Vec::new();
    header_cases(&map, &mut cases);
    directory_cases(&map, &mut cases);
    tokenizer_cases(&map, &mut cases);
    value_cases(&map, &mut cases);
    assert!(cases.len() >= 30);
    check(cases);
}

#[test]
fn ternary_crumb_code_2() {
    let map = Map::new("m48");
    let (start, _) = map.blob("layer00.v_proj");
    assert_eq!(
        get_u32(&map.bytes, map.rec("layer00.v_proj", RecordField::Bits)),
        5
    );
    let mut bytes = map.bytes.clone();
    bytes[start] = (bytes[start] & !0b11) | 0b10;
    let err = Needle2File::parse(&bytes).unwrap().weights().unwrap_err();
    assert!(
        matches!(&err, CactError::TernaryCode { tensor, index: 0, offset } if tensor == "layer00.v_proj" && *offset == start as u64),
        "{err:?}"
    );
}

/// Every single-byte corruption of the header and directory either parses
/// or fails cleanly; none panics.
#[test]
fn every_header_and_directory_byte_flipped() {
    let map = Map::new("m64");
    let dir_end = DIR_START + RECORD * map.names.len();
    let mut bytes = map.bytes.clone();
    for at in 0..dir_end {
        for flip in [0x01, 0x80, 0xff] {
            bytes[at] ^= flip;
            if let Err(e) = Needle2File::parse(&bytes) {
                assert!(!e.to_string().contains('\n'));
            }
            bytes[at] ^= flip;
        }
    }
}

#[test]
fn good_files_parse() {
    for model in ["m48", "m64", "m96"] {
        let bytes = read_fixture(&format!("{model}.cact"));
        Needle2File::parse(&bytes).unwrap().weights().unwrap();
    }
}
