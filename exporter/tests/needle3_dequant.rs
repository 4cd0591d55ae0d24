//! Every tensor of every Needle 3 fixture (tests/fixtures/needle3/, upstream
//! `cactus-needle==3.2.8`, written by make_needle3_fixtures.py), read by `Needle3File`,
//! against upstream `read_export`: float tensors bit for bit, and the engram tables'
//! CQ codes decoded the way the graph decodes them.

use exporter::cact::Encoding;
use exporter::cact::Needle3File;
use graphs::blocks::weights::{CqRows, EngramTables};
use graphs::needle3::HeadKind;
use safetensors::{Dtype, SafeTensors};
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

/// The fixtures that have a dequantization reference.
fn models() -> Vec<String> {
    let dir = fixture("needle3");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".dequant.safetensors")
                .map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no Needle 3 dequantization references");
    names
}

/// `rows`'s values as the graph computes them (codebook · norm, then the Hadamard
/// rotation) in f64: an independent decoding of the stored codes.
fn decode_rows(t: &CqRows) -> Vec<f32> {
    let (groups, group) = (t.groups(), t.group);
    let row_bytes = t.row_bytes();
    let scale = 1.0 / (group as f64).sqrt();
    let mut out = Vec::with_capacity(t.rows * t.cols);
    for r in 0..t.rows {
        let row = &t.codes[r * row_bytes..(r + 1) * row_bytes];
        let mut padded = vec![0f64; groups * group];
        for g in 0..groups {
            let norm = half_to_f64(t.norms[r * groups + g]);
            for j in 0..group {
                let mut y = 0f64;
                for k in 0..group {
                    let bit = (g * group + k) * t.index_bits;
                    let word =
                        row[bit / 8] as u32 | (*row.get(bit / 8 + 1).unwrap_or(&0) as u32) << 8;
                    let index = (word >> (bit % 8)) & ((1 << t.index_bits) - 1);
                    let h = if (k & j).count_ones() % 2 == 0 {
                        scale
                    } else {
                        -scale
                    };
                    y += t.codebook[index as usize] as f64 * norm * h;
                }
                padded[g * group + j] = y;
            }
        }
        out.extend(padded[..t.cols].iter().map(|&v| v as f32));
    }
    out
}

fn half_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let mant = (h & 0x3ff) as f64;
    sign * match exp {
        0 => mant * 2f64.powi(-24),
        _ => (1.0 + mant / 1024.0) * 2f64.powi(exp - 15),
    }
}

#[test]
fn every_tensor_equals_upstream_read_export() {
    for model in models() {
        let bytes = std::fs::read(fixture(&format!("needle3/{model}.cact"))).unwrap();
        let file = Needle3File::parse(&bytes).unwrap_or_else(|e| panic!("{model}: {e}"));
        let blob = std::fs::read(fixture(&format!("needle3/{model}.dequant.safetensors"))).unwrap();
        let st = SafeTensors::deserialize(&blob).unwrap();
        let mut checked = 0;
        for entry in file.entries() {
            if entry.encoding == Encoding::Raw || !st.names().contains(&entry.name.as_str()) {
                continue;
            }
            let ours = file.tensor(&entry.name).unwrap();
            let (shape, want) = f32s(&st, &entry.name);
            assert_eq!(ours.shape, shape, "{model} {}", entry.name);
            let differing = ours
                .data
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differing, 0,
                "{model} {}: {differing} values differ",
                entry.name
            );
            checked += 1;
        }
        let expected = file
            .entries()
            .iter()
            .filter(|e| e.encoding != Encoding::Raw)
            .count()
            - file.audio_tensors();
        assert_eq!(checked, expected, "{model}: tensors without a reference");

        // The graph's engram tables: the stored codes, decoded independently.
        let weights = file.weights().unwrap();
        for (s, site) in weights.engrams.iter().enumerate() {
            let (_, want) = f32s(&st, &format!("engram{s}.tables"));
            let got = match &site.tables {
                EngramTables::Codes(rows) => decode_rows(rows),
                EngramTables::Dense(t) => t.data.clone(),
            };
            assert_eq!(got.len(), want.len(), "{model} engram{s}");
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-6 * scale,
                "{model} engram{s}: |codes decoded - upstream| up to {worst} (values up to {scale})"
            );
        }
        let heads: Vec<HeadKind> = file.head_kinds().to_vec();
        println!("{model}: {checked} tensors bit-identical, heads {heads:?}");
    }
}
