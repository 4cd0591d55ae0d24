//! Every path against upstream's formula evaluated densely in f64 (decode each group as
//! `(codebook[idx] · norm) H`, then the plain matrix product), on every width and on
//! shapes with padded groups, odd row counts, several tokens and small groups (which send
//! wide paths to narrower ones).

use super::*;
use crate::split::Serial;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A random CQ matrix: codes, fp16 norms in [0.25, 2), and a codebook.
struct Case {
    rows: usize,
    cols: usize,
    group: usize,
    bits: usize,
    codes: Vec<u8>,
    norms: Vec<u16>,
    codebook: Vec<f32>,
}

impl Case {
    fn new(rows: usize, cols: usize, group: usize, bits: usize, seed: u64) -> Case {
        let mut rng = Rng(seed);
        let in_pad = cols.div_ceil(group) * group;
        let codes = (0..rows * in_pad * bits / 8)
            .map(|_| rng.next() as u8)
            .collect();
        let norms = (0..rows * cols.div_ceil(group))
            // fp16 with exponent 13..=15 (0.25 ≤ n < 2) and a random mantissa.
            .map(|_| ((13 + rng.next() % 3) << 10 | (rng.next() & 0x3ff)) as u16)
            .collect();
        let codebook = (0..1 << bits).map(|_| rng.uniform() * 0.2).collect();
        Case {
            rows,
            cols,
            group,
            bits,
            codes,
            norms,
            codebook,
        }
    }

    fn matrix(&self) -> CqMatrix<'_> {
        CqMatrix::new(
            self.rows,
            self.cols,
            self.group,
            self.bits,
            &self.codes,
            &self.norms,
            &self.codebook,
        )
        .expect("a consistent case")
    }

    /// Row `r` decoded as upstream does, in f64: `(codebook[idx] · norm) @ H` per group.
    fn dense_row(&self, r: usize) -> Vec<f64> {
        let (group, groups) = (self.group, self.cols.div_ceil(self.group));
        let row_bytes = groups * group * self.bits / 8;
        let row = &self.codes[r * row_bytes..(r + 1) * row_bytes];
        let mut out = Vec::new();
        for g in 0..groups {
            let norm = f16::to_f32(self.norms[r * groups + g]) as f64;
            let scaled: Vec<f64> = (0..group)
                .map(|k| {
                    let bit = (g * group + k) * self.bits;
                    let pair =
                        row[bit / 8] as usize | (*row.get(bit / 8 + 1).unwrap_or(&0) as usize) << 8;
                    let index = (pair >> (bit % 8)) & ((1 << self.bits) - 1);
                    self.codebook[index] as f64 * norm
                })
                .collect();
            for j in 0..group {
                let dot: f64 = (0..group)
                    .map(|k| {
                        let sign = if (k & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        scaled[k] * sign / (group as f64).sqrt()
                    })
                    .sum();
                out.push(dot);
            }
        }
        out.truncate(self.cols);
        out
    }
}

fn tokens_for(case: &Case, tokens: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..tokens * case.cols).map(|_| rng.uniform()).collect()
}

fn run(case: &Case, x: &[f32], tokens: usize, isa: Isa) -> Vec<f32> {
    let mut y = vec![f32::NAN; tokens * case.rows];
    cq_matmul(
        &case.matrix(),
        x,
        tokens,
        RowScale::default(),
        &mut y,
        isa,
        &Serial,
    );
    y
}

/// Each output within 1e-5 of the sum of its terms' magnitudes from the f64 product.
fn assert_matches_dense(case: &Case, tokens: usize, isa: Isa) {
    let x = tokens_for(case, tokens, 7);
    let y = run(case, &x, tokens, isa);
    for r in 0..case.rows {
        let w = case.dense_row(r);
        for t in 0..tokens {
            let xs = &x[t * case.cols..(t + 1) * case.cols];
            let exact: f64 = w.iter().zip(xs).map(|(w, x)| w * *x as f64).sum();
            let scale: f64 = w.iter().zip(xs).map(|(w, x)| (w * *x as f64).abs()).sum();
            let got = y[t * case.rows + r] as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * scale + 1e-12,
                "{} bits {} group {} cols {} row {r} token {t}: {got} vs {exact}",
                isa.name(),
                case.bits,
                case.group,
                case.cols,
            );
        }
    }
}

#[test]
fn every_path_and_width_matches_upstreams_decode() {
    for isa in Isa::available() {
        for bits in 1..=4 {
            for (rows, cols, group) in [(37, 200, 128), (8, 256, 128), (5, 96, 32), (6, 40, 8)] {
                let case = Case::new(rows, cols, group, bits, 11 + bits as u64);
                // Fewer tokens than DECODE_FROM_TOKENS look codes up, more decode rows;
                // on AVX-512 from PANELS_FROM_TOKENS in panels (one of 16, one of 32 and
                // one of 16, two of 32).
                for tokens in [3, DECODE_FROM_TOKENS + 1, PANELS_FROM_TOKENS, 33, 50] {
                    assert_matches_dense(&case, tokens, isa);
                }
            }
        }
    }
}

/// The row scale (unit rows, a gain, both) on every path, against the dense product of the
/// scaled rows in f64: lookups, decoded rows, panels (45 rows) and few rows (24).
#[test]
fn row_scales_are_applied_on_every_path() {
    for isa in Isa::available() {
        for rows in [45, 24] {
            let case = Case::new(rows, 200, 64, 4, 41);
            let gain: Vec<f32> = (0..case.cols).map(|c| 0.5 + (c % 7) as f32 * 0.2).collect();
            for tokens in [3, DECODE_FROM_TOKENS + 1, PANELS_FROM_TOKENS + 3] {
                let x = tokens_for(&case, tokens, 13);
                for (unit_rows, gain) in [
                    (true, None),
                    (false, Some(&gain[..])),
                    (true, Some(&gain[..])),
                ] {
                    let scale = RowScale { unit_rows, gain };
                    let mut y = vec![f32::NAN; tokens * rows];
                    cq_matmul(&case.matrix(), &x, tokens, scale, &mut y, isa, &Serial);
                    for t in 0..tokens {
                        let token = &x[t * case.cols..(t + 1) * case.cols];
                        let mean: f64 = token.iter().map(|&v| v as f64 * v as f64).sum::<f64>()
                            / case.cols as f64;
                        let root = if unit_rows { (mean + 1e-6).sqrt() } else { 1.0 };
                        let scaled: Vec<f64> = (0..case.cols)
                            .map(|c| token[c] as f64 / root * gain.map_or(1.0, |g| g[c] as f64))
                            .collect();
                        for r in 0..rows {
                            let w = case.dense_row(r);
                            let exact: f64 = w.iter().zip(&scaled).map(|(w, x)| w * x).sum();
                            let size: f64 = w.iter().zip(&scaled).map(|(w, x)| (w * x).abs()).sum();
                            let got = y[t * rows + r] as f64;
                            assert!(
                                (got - exact).abs() <= 1e-5 * size + 1e-12,
                                "{} {rows} rows, {tokens} tokens, unit {unit_rows}, gain {}: token {t} row {r}: {got} vs {exact}",
                                isa.name(),
                                gain.is_some()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn ternary_crumbs_decode_through_their_codebook() {
    // Ternary is stored as 2-bit crumbs with the codebook {0, +c, unused, −c}; crumb 2
    // never occurs in a valid file.
    let mut case = Case::new(9, 256, 128, 2, 5);
    let c = 1.224_006_4 / (128f32).sqrt();
    case.codebook = vec![0.0, c, 0.0, -c];
    for byte in &mut case.codes {
        for k in 0..4 {
            if (*byte >> (2 * k)) & 3 == 2 {
                *byte ^= 1 << (2 * k + 1);
            }
        }
    }
    for isa in Isa::available() {
        assert_matches_dense(&case, 2, isa);
        assert_matches_dense(&case, DECODE_FROM_TOKENS, isa);
    }
}

#[test]
fn a_token_gets_the_same_bits_in_any_prompt_and_its_sums_alone() {
    for isa in Isa::available() {
        // 45 rows: panels on AVX-512; 24: few_rows' dequantized rows.
        for (rows, bits) in [45, 24]
            .into_iter()
            .flat_map(|r| (1..=4).map(move |b| (r, b)))
        {
            let case = Case::new(rows, 384, 128, bits, 3);
            // Rows decoded once for a few tokens, and (AVX-512) 16 and 37 tokens.
            for tokens in [DECODE_FROM_TOKENS + 1, PANELS_FROM_TOKENS, 37] {
                let x = tokens_for(&case, tokens, 9);
                let what = format!("{} {rows} rows {bits}-bit", isa.name());
                assert_each_token_as_alone(&case, &x, tokens, isa, &what);
            }
        }
    }
}

/// Every token of `x` (`tokens` of them, run together) gets the bits it gets in another
/// call that takes the same path (itself and the tokens after it, as many as the path
/// starts at), and alone: the same bits where the call sums as one token does (lookups,
/// rows decoded for a few tokens), within 1e-5 of the token's largest output on AVX-512
/// from `PANELS_FROM_TOKENS` tokens (panels, or few rows dequantized), which sum each
/// output in input order where the lookups sum sixteen lanes a group.
fn assert_each_token_as_alone(case: &Case, x: &[f32], tokens: usize, isa: Isa, what: &str) {
    let together = run(case, x, tokens, isa);
    let token = |t: usize| &x[(t % tokens) * case.cols..(t % tokens + 1) * case.cols];
    let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let panels =
        Layout::new(isa, case.bits, case.group).isa == Isa::Avx512 && tokens >= PANELS_FROM_TOKENS;
    let other_tokens = match panels {
        true => PANELS_FROM_TOKENS,
        false => DECODE_FROM_TOKENS,
    };
    for t in 0..tokens {
        let want = &together[t * case.rows..(t + 1) * case.rows];
        let other: Vec<f32> = (t..t + other_tokens).flat_map(token).copied().collect();
        let other = run(case, &other, other_tokens, isa);
        assert_eq!(
            bits_of(&other[..case.rows]),
            bits_of(want),
            "{what} token {t} of {tokens}, in a call of {other_tokens}"
        );
        let alone = run(case, token(t), 1, isa);
        if !panels {
            assert_eq!(bits_of(&alone), bits_of(want), "{what} token {t} alone");
            continue;
        }
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (r, (a, w)) in alone.iter().zip(want).enumerate() {
            assert!(
                (a - w).abs() <= 1e-5 * scale,
                "{what} token {t} alone, row {r}: {a} vs {w}"
            );
        }
    }
}

#[test]
fn tokens_past_a_chunk_get_the_same_bits_as_alone() {
    // Enough tokens for two chunks of the activations' budget, of an odd size each.
    let case = Case::new(6, 2048, 128, 4, 17);
    let tokens = CHUNK_BYTES / (case.cols * std::mem::size_of::<f32>()) + 2;
    let x = tokens_for(&case, tokens, 5);
    for isa in Isa::available() {
        assert_each_token_as_alone(&case, &x, tokens, isa, isa.name());
    }
}

#[test]
fn avx512_rotation_is_the_scalar_rotations_bits() {
    if !Isa::available().contains(&Isa::Avx512) {
        return;
    }
    for bits in [1, 2, 4] {
        for (cols, group) in [(200, 32), (96, 64), (300, 128), (256, 256), (1000, 1024)] {
            let case = Case::new(1, cols, group, bits, 23);
            let layout = Layout::new(Isa::Avx512, bits, group);
            if layout.isa != Isa::Avx512 {
                continue; // Chunks of 16 · 8 / bits inputs larger than the group.
            }
            let tokens = 3;
            let x = tokens_for(&case, tokens, 29);
            let got = prepare(
                &case.matrix(),
                &x,
                tokens,
                RowScale::default(),
                &layout,
                &Serial,
            );
            let in_pad = cols.div_ceil(group) * group;
            for (t, got) in got.as_slice().chunks_exact(in_pad).enumerate() {
                let mut natural = vec![0.0f32; in_pad];
                natural[..cols].copy_from_slice(&x[t * cols..(t + 1) * cols]);
                natural
                    .chunks_exact_mut(group)
                    .for_each(crate::hadamard::rotate);
                let mut want = vec![0.0f32; in_pad];
                layout.arrange(&natural, &mut want);
                let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits_of(got),
                    bits_of(&want),
                    "{bits}-bit group {group} cols {cols} token {t}"
                );
            }
        }
    }
}

/// Row blocks on scoped threads, in reverse order.
struct Threads;

impl RowSplit for Threads {
    fn for_each(&self, blocks: usize, f: &(dyn Fn(usize) + Sync)) {
        std::thread::scope(|s| {
            for block in (0..blocks).rev() {
                s.spawn(move || f(block));
            }
        });
    }
}

#[test]
fn threads_change_no_bit() {
    let case = Case::new(100, 256, 128, 4, 21);
    let isa = Isa::best();
    for tokens in [2, DECODE_FROM_TOKENS, PANELS_FROM_TOKENS + 1] {
        let x = tokens_for(&case, tokens, 1);
        let serial = run(&case, &x, tokens, isa);
        let mut threaded = vec![0.0; serial.len()];
        cq_matmul(
            &case.matrix(),
            &x,
            tokens,
            RowScale::default(),
            &mut threaded,
            isa,
            &Threads,
        );
        assert_eq!(serial, threaded);
    }
}

#[test]
fn inconsistent_tensors_are_refused_with_what_disagrees() {
    let case = Case::new(4, 256, 128, 4, 1);
    let short = &case.codes[..case.codes.len() - 1];
    let error = CqMatrix::new(4, 256, 128, 4, short, &case.norms, &case.codebook).unwrap_err();
    assert!(error.0.contains("codes hold 511 bytes"), "{error}");
    let error = CqMatrix::new(4, 256, 96, 4, &case.codes, &case.norms, &case.codebook).unwrap_err();
    assert!(error.0.contains("group 96"), "{error}");
    let error = CqMatrix::new(
        4,
        256,
        128,
        4,
        &case.codes,
        &case.norms,
        &case.codebook[..8],
    )
    .unwrap_err();
    assert!(error.0.contains("codebook holds 8"), "{error}");
}

#[test]
fn gathered_rows_are_upstreams_decode_and_a_bad_index_is_refused() {
    for (bits, isa) in
        (1..=4).flat_map(|bits| Isa::available().into_iter().map(move |isa| (bits, isa)))
    {
        let case = Case::new(9, 200, 64, bits, 31 + bits as u64);
        let indices = [3i64, 0, 8, 3];
        let mut out = vec![f32::NAN; indices.len() * case.cols];
        case.matrix()
            .gather_rows(isa, &indices, &mut out, &Serial)
            .unwrap();
        for (&r, row) in indices.iter().zip(out.chunks_exact(case.cols)) {
            let want = case.dense_row(r as usize);
            // f32 rounding of sums of `group` terms, against the row's largest value.
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (c, (&got, want)) in row.iter().zip(want).enumerate() {
                assert!(
                    (got as f64 - want).abs() <= 1e-6 * scale,
                    "{isa:?} {bits}-bit row {r} col {c}: {got} vs {want}"
                );
            }
        }
    }
    let case = Case::new(4, 64, 64, 2, 1);
    let mut out = vec![0.0; 64];
    let error = case
        .matrix()
        .gather_rows(Isa::best(), &[4], &mut out, &Serial)
        .unwrap_err();
    assert_eq!(error.0, "row 4 is outside the 4 rows");
}
