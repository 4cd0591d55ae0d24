//! How a kernel hands independent blocks of its output to threads: the host's thread pool
//! (onnxruntime's, inside a session) or none.

use crate::isa::Isa;

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

/// `f(first, rows)` for each run of up to `block` consecutive tokens of `out` (`row`
/// values a token), `first` the run's first token and `rows` its part of `out`; the runs
/// spread by `split`. `f` is compiled for the widest vectors this CPU has
/// ([`Isa::vectorized`]): the per-token kernels are plain Rust loops, which vectorized at
/// SSE width only.
pub fn token_blocks(
    split: &dyn RowSplit,
    out: &mut [f32],
    row: usize,
    block: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let tokens = out.len().checked_div(row).unwrap_or(0);
    let base = SharedRows(out.as_mut_ptr());
    split.for_each(tokens.div_ceil(block), &|b| {
        let first = b * block;
        let count = block.min(tokens - first);
        // Sound: run `b` alone covers tokens first..first + count, and `token_blocks` holds
        // `out` exclusively until every run has returned.
        let rows = unsafe { std::slice::from_raw_parts_mut(base.at(first * row), count * row) };
        Isa::best().vectorized(|| f(first, rows));
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
