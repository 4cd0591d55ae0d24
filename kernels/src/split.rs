//! How a kernel hands independent blocks of its output to threads: the host's thread pool
//! (onnxruntime's, inside a session) or none.

use crate::isa::{Isa, Vectorized};

/// Runs `f(block)` once for every block in `0..blocks`, in any order, possibly at once.
pub trait RowSplit {
    fn for_each(&self, blocks: usize, f: &(dyn Fn(usize) + Sync));
}

/// Every block on the calling thread, in order.
pub struct Serial;

impl RowSplit for Serial {
    fn for_each(&self, blocks: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..blocks).for_each(f);
    }
}

/// The work [`token_blocks`] does on a run of tokens.
pub trait TokenRun: Sync {
    /// Tokens `first..`, whose part of the output is `rows`. Per-token loops of plain
    /// Rust go in a type whose `run` is `#[inline(always)]`: then they are compiled for
    /// the widest vectors this CPU has ([`Isa::vectorized`]). A closure also does (the
    /// impl below), for work whose arithmetic is explicit SIMD already: its own body is
    /// compiled for the baseline SSE2 once it is too large to inline.
    fn run(&self, first: usize, rows: &mut [f32]);
}

impl<F: Fn(usize, &mut [f32]) + Sync> TokenRun for F {
    #[inline(always)]
    fn run(&self, first: usize, rows: &mut [f32]) {
        self(first, rows)
    }
}

/// One run of [`token_blocks`], as [`Isa::vectorized`] takes it.
struct OneRun<'a, W> {
    work: &'a W,
    first: usize,
    rows: &'a mut [f32],
}

impl<W: TokenRun> Vectorized for OneRun<'_, W> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        self.work.run(self.first, self.rows)
    }
}

/// `work` for each run of up to `block` consecutive tokens of `out` (`row` values a
/// token), the runs spread by `split`.
pub fn token_blocks(
    split: &dyn RowSplit,
    out: &mut [f32],
    row: usize,
    block: usize,
    work: impl TokenRun,
) {
    let tokens = out.len().checked_div(row).unwrap_or(0);
    let base = SharedRows(out.as_mut_ptr());
    split.for_each(tokens.div_ceil(block), &|b| {
        let first = b * block;
        let count = block.min(tokens - first);
        // Sound: run `b` alone covers tokens first..first + count, and `token_blocks` holds
        // `out` exclusively until every run has returned.
        let rows = unsafe { std::slice::from_raw_parts_mut(base.at(first * row), count * row) };
        let work = &work;
        Isa::best().vectorized(OneRun { work, first, rows });
    });
}

/// The output shared by the runs of [`token_blocks`] (each writes only its own tokens').
struct SharedRows(*mut f32);
unsafe impl Sync for SharedRows {}

impl SharedRows {
    fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}
