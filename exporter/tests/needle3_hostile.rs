//! Hostile Needle 3 files: each corruption of a valid fixture (`needle3/n3a.cact`) is one
//! typed error naming what and where, never a panic, and the whole-model read agrees.

use exporter::cact::layout::{record_field_offset, RecordField, RECORD_BYTES};
use exporter::cact::needle3::layout::{directory_start, header_element_offset, header_offset};
use exporter::cact::CactError;
use exporter::cact::Needle3File;
use exporter::model::NeedleModel;
use test_support::read_fixture;

fn put_u32(b: &mut [u8], at: u64, v: u32) {
    b[at as usize..at as usize + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(b: &[u8], at: u64) -> u32 {
    u32::from_le_bytes(b[at as usize..at as usize + 4].try_into().unwrap())
}

/// File offset of field `field` of the directory record of the tensor at `index`.
fn record(b: &[u8], index: u64, field: RecordField) -> u64 {
    let codebook_len = get_u32(b, header_offset("codebook_len"));
    directory_start(codebook_len) + index * RECORD_BYTES + record_field_offset(field)
}

/// Index of the tensor named `name` in the valid file.
fn index_of(name: &str) -> u64 {
    let file = Needle3File::parse(&read_fixture("needle3/n3a.cact")).unwrap();
    file.entries().iter().position(|e| e.name == name).unwrap() as u64
}

fn check(what: &str, corrupt: impl Fn(&mut Vec<u8>), expected: impl Fn(&CactError) -> bool) {
    let mut bytes = read_fixture("needle3/n3a.cact");
    corrupt(&mut bytes);
    let err = Needle3File::parse(&bytes)
        .and_then(|f| f.weights().map(|_| ()))
        .expect_err(what);
    assert!(expected(&err), "{what}: unexpected error {err:?}");
    let line = err.to_string();
    assert!(!line.contains('\n') && !line.is_empty(), "{what}: {line}");
    // The model-level read (what needle-export runs) fails the same way.
    let model = NeedleModel::from_bytes("n3a.cact", &bytes)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(model.to_string(), line, "{what}");
}

#[test]
fn every_corruption_is_one_typed_error() {
    let header = |field: &'static str| move |e: &CactError| matches!(e, CactError::Header { field: f, .. } if *f == field);
    check(
        "truncated header",
        |b| b.truncate(100),
        |e| matches!(e, CactError::Truncated { .. }),
    );
    check(
        "truncated directory",
        |b| b.truncate(600),
        |e| matches!(e, CactError::Truncated { .. }),
    );
    check(
        "truncated blobs",
        |b| {
            let n = b.len();
            b.truncate(n - 5000)
        },
        |e| matches!(e, CactError::BlobOutOfBounds { .. }),
    );
    check(
        "out_vocab past vocab",
        |b| put_u32(b, header_offset("out_vocab"), 100_000),
        header("out_vocab"),
    );
    check(
        "global layer 40 of 6",
        |b| put_u32(b, header_offset("global_mask_hi"), 1 << 8),
        header("global_mask_hi"),
    );
    check(
        "17 engram sites",
        |b| put_u32(b, header_offset("num_engram_sites"), 17),
        header("num_engram_sites"),
    );
    check(
        "odd qk head",
        |b| put_u32(b, header_offset("qk_head_dim"), 7),
        header("qk_head_dim"),
    );
    check(
        "a huge conv",
        |b| put_u32(b, header_offset("qkv_conv_taps"), 1 << 30),
        header("qkv_conv_taps"),
    );
    // Fields that size what the graph builds rather than what the file stores: each of
    // these took all memory (or overflowed the hash seed) in needle-export before the
    // header bounded it. The first is the 466 KB file of issue 26.
    for (name, element, value) in [
        ("engram_orders", 1, 0x7FFF_FFFF),
        ("max_seq_len", 0, u32::MAX),
        ("engram_conv_dilation", 0, 0x7FFF_FFFF),
        ("engram_seed_heads", 0, 0xFF00_0000),
        ("sliding_window", 0, u32::MAX),
    ] {
        check(
            &format!("{name}[{element}] = {value:#x}"),
            |b| put_u32(b, header_element_offset(name, element), value),
            header(name),
        );
    }
    check(
        "tensor count far past the file",
        |b| put_u32(b, header_offset("num_tensors"), u32::MAX),
        |e| matches!(e, CactError::Truncated { .. }),
    );
    let tables = index_of("engram0.tables");
    check(
        "CQ bits 6",
        |b| {
            let at = record(b, tables, RecordField::Bits);
            put_u32(b, at, 6)
        },
        |e| matches!(e, CactError::Bits { found: 6, .. }),
    );
    check(
        "misaligned blob",
        |b| {
            let at = record(b, tables, RecordField::BlobOffset);
            let off = get_u32(b, at);
            put_u32(b, at, off + 4)
        },
        |e| matches!(e, CactError::Misaligned { .. } | CactError::Overlap { .. }),
    );
    let p1 = index_of("hada_p1");
    check(
        "a permutation with a repeated index",
        |b| {
            let at = get_u32(b, record(b, p1, RecordField::BlobOffset)) as u64;
            let first = get_u32(b, at);
            put_u32(b, at + 4, first)
        },
        |e| matches!(e, CactError::Permutation { index: 1, .. }),
    );
    let manifest = index_of("heads.manifest");
    check(
        "heads out of order",
        |b| {
            // The FP16 codes 1, 2, 3 become 2, 1, 3.
            let at = get_u32(b, record(b, manifest, RecordField::BlobOffset)) as usize;
            b.swap(at, at + 2);
            b.swap(at + 1, at + 3);
        },
        |e| matches!(e, CactError::HeadCode { index: 1, .. }),
    );
    check(
        "a NaN engram norm",
        |b| {
            let at = record(b, tables, RecordField::BlobOffset);
            let (off, len) = (
                get_u32(b, at) as usize,
                get_u32(b, record(b, tables, RecordField::NBytes)) as usize,
            );
            b[off + len - 2..off + len].copy_from_slice(&0x7e00u16.to_le_bytes());
        },
        |e| matches!(e, CactError::NonFinite { .. }),
    );
}

#[test]
fn the_needle3_reader_refuses_another_generations_file() {
    let mut bytes = read_fixture("needle3/n3a.cact");
    put_u32(&mut bytes, 0, 0x05E1_2A83);
    let err = Needle3File::parse(&bytes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "this is a Needle 2 .cact file; the Needle 3 reader cannot read it"
    );
}
