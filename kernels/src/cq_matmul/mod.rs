//! `needle.CqMatMul`: `Y = X · Wᵀ` for a CQ matrix `W` kept as the `.cact` stores it.
//!
//! Inputs, exactly the `.cact` record (upstream `export._cq_pack`):
//! - `X` float32 `[…, cols]`, any number of leading axes (the tokens);
//! - `codes` uint8 `[rows, groups · group · bits / 8]`: per row, one LSB-first bitstream
//!   of `bits`-bit codebook indices over the inputs padded to whole groups;
//! - `norms` float16 `[rows, groups]`: each group's norm;
//! - `codebook` float32 `[2^bits]`: the value of each index (ternary: `{0, +c, unused, −c}`
//!   as 2-bit crumbs).
//!
//! Output `Y` float32 `[…, rows]`. Upstream decodes group `g` of row `r` as
//! `W[r, g] = (codebook[idx[r, g]] · norm[r, g]) H` with `H` the orthonormal Walsh–Hadamard
//! matrix of size `group`. `H` is symmetric, so
//! `Y[t, r] = Σ_g norm[r, g] · (codebook[idx[r, g]] · (H X[t, g]))`: the rotation moves onto
//! the activation, once per token for every row, and the weights are read as codes.
//!
//! Each output element is summed in one fixed order whatever the row blocking or the
//! threads. Codes looked up token by token and rows decoded for a few tokens
//! ([`DECODE_FROM_TOKENS`]) sum in the same order (per group, then the groups in order),
//! so there a token gets the bits it gets alone. The AVX-512 path multiplies a prompt of
//! [`PANELS_FROM_TOKENS`] or more in panels of tokens, one running sum an output in input
//! order ([`panels`]: FMA-bound, where dot products of decoded rows were held up by their
//! loads and by a reduction across lanes a sum); there a token gets the same bits in any
//! such prompt, and within rounding (1e-5 of its outputs' scale, tested) what it gets
//! alone. The order differs between instruction-set paths.

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod few_rows;
#[cfg(target_arch = "x86_64")]
mod panels;
mod rows;
mod scalar;

use crate::f16;
use crate::isa::Isa;
use crate::split::RowSplit;
use crate::ShapeError;
pub use activations::RowScale;
use activations::{prepare, Layout};

/// Codes of one chunk of the AVX2 4-bit lookup (16 bytes), which a group must hold whole.
const NIBBLE_CHUNK: usize = 32;

/// Rows per block handed to a thread: a multiple of the 4 rows the SIMD paths sum at once.
const BLOCK_ROWS: usize = 32;

/// A CQ matrix as the graph stores it, its sizes checked against each other.
#[derive(Clone, Copy, Debug)]
pub struct CqMatrix<'a> {
    rows: usize,
    cols: usize,
    group: usize,
    bits: usize,
    codes: &'a [u8],
    norms: &'a [u16],
    codebook: &'a [f32],
}

impl<'a> CqMatrix<'a> {
    /// `codes` `[rows, row bytes]`, `norms` `[rows, groups]`, `codebook` `[2^bits]`.
    pub fn new(
        rows: usize,
        cols: usize,
        group: usize,
        bits: usize,
        codes: &'a [u8],
        norms: &'a [u16],
        codebook: &'a [f32],
    ) -> Result<Self, ShapeError> {
        let fail = |what: String| Err(ShapeError(what));
        if !(1..=4).contains(&bits) {
            return fail(format!("bits {bits} is not 1, 2, 3 or 4"));
        }
        if !group.is_power_of_two() || group < 8 {
            return fail(format!("group {group} is not a power of two ≥ 8"));
        }
        if cols == 0 || rows == 0 {
            return fail(format!("an empty matrix ({rows} × {cols})"));
        }
        let groups = cols.div_ceil(group);
        let row_bytes = groups * group * bits / 8;
        if codes.len() != rows * row_bytes {
            return fail(format!(
                "codes hold {} bytes, {rows} rows of {cols} {bits}-bit codes in groups of {group} need {}",
                codes.len(),
                rows * row_bytes
            ));
        }
        if norms.len() != rows * groups {
            return fail(format!(
                "norms hold {} values, {rows} rows × {groups} groups need {}",
                norms.len(),
                rows * groups
            ));
        }
        if codebook.len() != 1 << bits {
            return fail(format!(
                "codebook holds {} values, {bits}-bit codes need {}",
                codebook.len(),
                1 << bits
            ));
        }
        Ok(CqMatrix {
            rows,
            cols,
            group,
            bits,
            codes,
            norms,
            codebook,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn groups(&self) -> usize {
        self.cols.div_ceil(self.group)
    }

    fn row_bytes(&self) -> usize {
        self.groups() * self.group * self.bits / 8
    }

    fn row_codes(&self, r: usize) -> &'a [u8] {
        &self.codes[r * self.row_bytes()..(r + 1) * self.row_bytes()]
    }

    /// The codebook as the SIMD paths look it up.
    fn table(&self) -> Table {
        let values: [f32; 16] = std::array::from_fn(|j| self.codebook[j % self.codebook.len()]);
        let byte_planes =
            std::array::from_fn(|p| std::array::from_fn(|j| values[j].to_le_bytes()[p]));
        Table {
            values,
            byte_planes,
        }
    }
}

/// The codebook in the forms the SIMD lookups read, made once per product.
pub(super) struct Table {
    /// `values[j] = codebook[j mod 2^bits]`, so a lookup by the low bits of a shifted byte
    /// needs no mask.
    pub values: [f32; 16],
    /// Byte `p` of each of the 16 values: the AVX2 4-bit lookup's `vpshufb` tables.
    pub byte_planes: [[u8; 16]; 4],
}

/// `y[t, r] = Σ_c x[t, c] · W[r, c]` for `tokens` rows of `x` (`[tokens, cols]`), each
/// scaled by `scale` first, into `y` (`[tokens, rows]`), on `isa` (or the widest narrower
/// path the matrix allows), row blocks spread by `split`.
pub fn cq_matmul(
    w: &CqMatrix,
    x: &[f32],
    tokens: usize,
    scale: RowScale,
    y: &mut [f32],
    isa: Isa,
    split: &dyn RowSplit,
) {
    assert_eq!(x.len(), tokens * w.cols, "x is [tokens, cols]");
    assert_eq!(y.len(), tokens * w.rows, "y is [tokens, rows]");
    let layout = Layout::new(isa, w.bits, w.group);
    if let Some(gain) = scale.gain {
        assert_eq!(gain.len(), w.cols, "gain is [cols]");
    }
    #[cfg(target_arch = "x86_64")]
    if layout.isa == Isa::Avx512 && tokens >= PANELS_FROM_TOKENS && w.rows <= few_rows::MOST_ROWS {
        // Sound: the layout is AVX-512's only where `Isa::available` detected it.
        return unsafe { few_rows::product(w, x, scale, y, split) };
    }
    let table = w.table();
    // Every row block reads every token, so the tokens go in equal chunks whose prepared
    // activations a core's L2 cache holds; each chunk is a product of its own (and each
    // output is summed the same way whatever chunk holds its token).
    let bytes = tokens * w.groups() * w.group * std::mem::size_of::<f32>();
    let per_chunk = tokens.div_ceil(bytes.div_ceil(CHUNK_BYTES).max(1)).max(1);
    for (x, y) in x
        .chunks(per_chunk * w.cols)
        .zip(y.chunks_mut(per_chunk * w.rows))
    {
        let tokens = x.len() / w.cols;
        let prepared = prepare(w, x, tokens, scale, &layout, split);
        let xt = Tokens::of(
            prepared.as_slice(),
            tokens,
            w.groups() * w.group,
            &layout,
            split,
        );
        #[cfg(target_arch = "x86_64")]
        if let Tokens::Panels(_) = xt {
            // The panels write each output line in pieces over the whole chunk (8 rows of a
            // token at a time), each piece of a line not in cache a read for ownership from
            // L3; filled first in one streaming pass, the lines are in cache when the pieces
            // come (in isolation, into a cold output: 1.59–1.70 ms a 1536 × 512 product of
            // 128 tokens, 1.42–1.58 with the fill; a Needle 2 prefill +1–4%).
            y.fill(0.0);
        }
        let out = Output(y.as_mut_ptr());
        split.for_each(w.rows.div_ceil(BLOCK_ROWS), &|block| {
            let first = block * BLOCK_ROWS;
            let last = (first + BLOCK_ROWS).min(w.rows);
            rows_block(w, first..last, &xt, tokens, &layout, &table, &out);
        });
    }
}

/// The most prepared activations (bytes) a product streams through its row blocks at
/// once: half the L2 cache of the Sapphire Rapids cores measured, where 1024 tokens ran
/// 1.5–2.3× faster in 1 MiB chunks than whole, and 128 tokens of 1536 or more inputs 2–3%
/// faster than in 512 KiB ones (which split them in two).
const CHUNK_BYTES: usize = 1 << 20;

/// Floats that start on a cache line (64 bytes). The SIMD paths load a token's or a
/// decoded row's inputs a whole vector at a time from its start (every row a multiple of
/// 16 floats long), and a vector that straddles two lines costs two loads: the AVX-512
/// prompt product ran 1.6–2× faster on a Sapphire Rapids core once its activations and
/// decoded rows started on a line (a `Vec<f32>` starts wherever the allocator puts it).
pub(super) struct Aligned {
    buffer: Vec<f32>,
    start: usize,
    len: usize,
    /// Where the buffer goes back to when dropped, for the thread's next product.
    home: Option<&'static Scratch>,
}

/// A thread's buffer of one kind, kept between products: a prompt product's activations
/// and panels are up to a MiB each, and allocating and zeroing them every call was 2–3% of
/// a Needle 2 prefill.
type Scratch = std::thread::LocalKey<std::cell::RefCell<Vec<f32>>>;

impl Aligned {
    const LINE_FLOATS: usize = 64 / std::mem::size_of::<f32>();

    pub fn zeroed(len: usize) -> Aligned {
        if len == 0 {
            // A one-token product decodes no rows: no allocation for each of its blocks.
            return Aligned::on(Vec::new(), 0, None);
        }
        Aligned::on(vec![0.0f32; len + Self::LINE_FLOATS - 1], len, None)
    }

    /// `len` floats from the thread's `home` buffer (grown with zeros where too short),
    /// holding whatever its last user left: for callers that write every value they read.
    pub fn reused(home: &'static Scratch, len: usize) -> Aligned {
        let mut buffer = home.with_borrow_mut(std::mem::take);
        if buffer.len() < len + Self::LINE_FLOATS - 1 {
            buffer.resize(len + Self::LINE_FLOATS - 1, 0.0);
        }
        Aligned::on(buffer, len, Some(home))
    }

    fn on(buffer: Vec<f32>, len: usize, home: Option<&'static Scratch>) -> Aligned {
        // `align_offset` counts floats; a `Vec<f32>` is 4-byte aligned, so at most 15.
        let start = match len {
            0 => 0,
            _ => buffer.as_ptr().align_offset(64),
        };
        Aligned {
            buffer,
            start,
            len,
            home,
        }
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.buffer[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.buffer[self.start..self.start + self.len]
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        if let Some(home) = self.home {
            let buffer = std::mem::take(&mut self.buffer);
            // A thread being torn down has no buffer to return to: the memory is freed.
            let _ = home.try_with(|slot| *slot.borrow_mut() = buffer);
        }
    }
}

thread_local! {
    /// A prompt product's prepared activations.
    static PREPARED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A prompt product's panels.
    static PANELS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A row block's decoded rows, and a token block's rotation.
    static BLOCK_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The output buffer shared by the row blocks. Sound to share: each block writes only
/// the elements of its own rows, and `cq_matmul` holds `y` exclusively until every block
/// has returned.
struct Output(*mut f32);
unsafe impl Sync for Output {}

/// From this many tokens on, a row block decodes its rows' codes into float values once
/// and reuses them for every token (a prompt chunk), instead of looking each code up again
/// per token: decoding a row costs about as much as a few direct dots of it.
const DECODE_FROM_TOKENS: usize = 4;

/// From this many tokens on, AVX-512 multiplies in panels ([`panels`]), whose 16 or 32
/// lanes are tokens: below, most lanes would be padding (Needle 3's engram sites project
/// 4 tokens a decode step, and in panels its decode ran 5–9% slower).
const PANELS_FROM_TOKENS: usize = 16;

/// A product's prepared tokens as its row blocks read them.
enum Tokens<'a> {
    /// `[tokens, padded inputs]`, a token after another.
    Rows(&'a [f32]),
    /// The AVX-512 prompt product's panels (from [`PANELS_FROM_TOKENS`] tokens).
    #[cfg(target_arch = "x86_64")]
    Panels(panels::Panels),
}

impl<'a> Tokens<'a> {
    /// Panels where the layout is AVX-512's and the call has enough tokens.
    fn of(
        prepared: &'a [f32],
        tokens: usize,
        len: usize,
        layout: &Layout,
        split: &dyn RowSplit,
    ) -> Tokens<'a> {
        #[cfg(target_arch = "x86_64")]
        if layout.isa == Isa::Avx512 && tokens >= PANELS_FROM_TOKENS {
            return Tokens::Panels(panels::Panels::of(prepared, tokens, len, split));
        }
        let _ = (tokens, len, layout, split);
        Tokens::Rows(prepared)
    }
}

fn rows_block(
    w: &CqMatrix,
    rows: std::ops::Range<usize>,
    xt: &Tokens,
    tokens: usize,
    layout: &Layout,
    table: &Table,
    out: &Output,
) {
    let groups = w.groups();
    let halves = &w.norms[rows.start * groups..rows.end * groups];
    WIDENED_NORMS.with_borrow_mut(|norms| {
        norms.clear();
        norms.resize(halves.len(), 0.0);
        f16::widen(layout.isa, halves, norms);
        let xt = match xt {
            Tokens::Rows(xt) => xt,
            #[cfg(target_arch = "x86_64")]
            // Sound: panels are made only for the AVX-512 layout, which `Isa::available`
            // offered.
            Tokens::Panels(panels) => {
                return unsafe { panels::rows_block(w, rows, panels, table, norms, out) }
            }
        };
        let block = RowBlock {
            w,
            xt,
            tokens,
            layout,
            table,
            norms,
            first: rows.start,
            out,
        };
        // Where a prompt chunk's rows are decoded: one buffer for the block, not one a row.
        let mut decoded = Aligned::zeroed(match tokens >= DECODE_FROM_TOKENS {
            true => 4 * groups * w.group,
            false => 0,
        });
        let mut r = rows.start;
        while r < rows.end {
            prefetch_rows(w, r + PREFETCH_ROWS, 4);
            if rows.end - r >= 4 {
                block.rows::<4>(r, decoded.as_mut_slice());
                r += 4;
            } else {
                block.rows::<1>(r, decoded.as_mut_slice());
                r += 1;
            }
        }
    });
}

thread_local! {
    /// A row block's group norms widened to f32, one buffer a thread: a one-token product
    /// has dozens of blocks, and allocating each block's norms was 1–2% of a decode step.
    static WIDENED_NORMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How many rows ahead of the ones being multiplied their codes are fetched into the
/// cache.
const PREFETCH_ROWS: usize = 8;

/// Asks the cache for the codes of rows `first..first + count` (those that exist).
fn prefetch_rows(w: &CqMatrix, first: usize, count: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (start, end) = (
            first * w.row_bytes(),
            ((first + count) * w.row_bytes()).min(w.codes.len()),
        );
        for at in (start..end).step_by(64) {
            // Sound: a prefetch reads nothing architecturally, and `at` is within the codes.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(w.codes.as_ptr().add(at).cast()) };
        }
    }
}

/// One row block's product: what every group of rows in it shares.
struct RowBlock<'a> {
    w: &'a CqMatrix<'a>,
    xt: &'a [f32],
    tokens: usize,
    layout: &'a Layout,
    table: &'a Table,
    /// The block's norms as f32, `[rows of the block, groups]`.
    norms: &'a [f32],
    /// The block's first row.
    first: usize,
    out: &'a Output,
}

impl RowBlock<'_> {
    /// Rows `r..r + R` for every token; `decoded` holds `R` decoded rows when the block
    /// decodes them (a prompt chunk).
    fn rows<const R: usize>(&self, r: usize, decoded: &mut [f32]) {
        let (w, groups) = (self.w, self.w.groups());
        let in_pad = groups * w.group;
        let codes: [&[u8]; R] = std::array::from_fn(|j| w.row_codes(r + j));
        let norms: [&[f32]; R] = std::array::from_fn(|j| {
            let at = (r + j - self.first) * groups;
            &self.norms[at..at + groups]
        });
        let token = |t: usize| &self.xt[t * in_pad..(t + 1) * in_pad];
        let write = |t: usize, sums: [f32; R]| {
            for (j, sum) in sums.into_iter().enumerate() {
                // Sound: row r + j belongs to this block alone, and t < tokens.
                unsafe { *self.out.0.add(t * w.rows + r + j) = sum };
            }
        };
        if self.tokens < DECODE_FROM_TOKENS {
            for t in 0..self.tokens {
                write(
                    t,
                    dots::<R>(w, self.layout, codes, norms, token(t), self.table),
                );
            }
            return;
        }
        let decoded = &mut decoded[..R * in_pad];
        for (row, values) in decoded.chunks_exact_mut(in_pad).enumerate() {
            self.decode_row(codes[row], values);
        }
        let values: [&[f32]; R] = std::array::from_fn(|j| &decoded[j * in_pad..(j + 1) * in_pad]);
        // Tokens in tiles as wide as the path's registers hold (R · T sums and partial sums).
        let tile = match self.layout.isa {
            Isa::Avx512 => 3,
            Isa::Avx2 => 2,
            Isa::Scalar => 1,
        };
        let tiled = self.tokens / tile * tile;
        for t in (0..tiled).step_by(tile) {
            match tile {
                3 => {
                    let xts = std::array::from_fn(|i| token(t + i));
                    let sums = decoded_dots::<R, 3>(w, self.layout, values, norms, xts);
                    sums.into_iter()
                        .enumerate()
                        .for_each(|(i, s)| write(t + i, s));
                }
                2 => {
                    let xts = std::array::from_fn(|i| token(t + i));
                    let sums = decoded_dots::<R, 2>(w, self.layout, values, norms, xts);
                    sums.into_iter()
                        .enumerate()
                        .for_each(|(i, s)| write(t + i, s));
                }
                _ => {
                    let [sums] = decoded_dots::<R, 1>(w, self.layout, values, norms, [token(t)]);
                    write(t, sums);
                }
            }
        }
        for t in tiled..self.tokens {
            let [sums] = decoded_dots::<R, 1>(w, self.layout, values, norms, [token(t)]);
            write(t, sums);
        }
    }

    /// One row's codebook values into `values`, `codebook[code k]` for every padded input,
    /// in the layout's order (the order its activations are in).
    fn decode_row(&self, codes: &[u8], values: &mut [f32]) {
        let w = self.w;
        match self.layout.isa {
            Isa::Scalar => scalar::decode(codes, w.bits, w.codebook, values),
            #[cfg(target_arch = "x86_64")]
            // Sound: a layout picks an x86 path only where `Isa::available` detected it, and
            // only for widths whose chunks fit a group.
            Isa::Avx2 => unsafe { avx2::decode(codes, w.bits, self.table, values) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512::decode(codes, w.bits, &self.table.values, values) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("no x86 path off x86-64"),
        }
    }
}

/// The dots of `R` rows with one prepared token, on the layout's path.
fn dots<const R: usize>(
    w: &CqMatrix,
    layout: &Layout,
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    table: &Table,
) -> [f32; R] {
    match layout.isa {
        Isa::Scalar => scalar::dots(codes, norms, xt, w.group, w.bits, w.codebook),
        #[cfg(target_arch = "x86_64")]
        // Sound: a layout picks an x86 path only where `Isa::available` detected it.
        Isa::Avx2 => unsafe { avx2::dots(codes, norms, xt, w.group, w.bits, table) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::dots(codes, norms, xt, w.group, w.bits, &table.values) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 path off x86-64"),
    }
}

/// [`dots`] of `R` rows decoded by [`RowBlock::decode_row`] with `T` tokens: the same bits.
fn decoded_dots<const R: usize, const T: usize>(
    w: &CqMatrix,
    layout: &Layout,
    values: [&[f32]; R],
    norms: [&[f32]; R],
    xts: [&[f32]; T],
) -> [[f32; R]; T] {
    match layout.isa {
        Isa::Scalar => scalar::decoded_dots(values, norms, xts, w.group),
        #[cfg(target_arch = "x86_64")]
        // Sound: a layout picks an x86 path only where `Isa::available` detected it.
        Isa::Avx2 => unsafe { avx2::decoded_dots(values, norms, xts, w.group) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::decoded_dots(values, norms, xts, w.group) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 path off x86-64"),
    }
}

#[cfg(test)]
mod tests;
