//! How a kernel hands independent blocks of its output to threads: the host's thread pool
//! (onnxruntime's, inside a session) or none.

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
