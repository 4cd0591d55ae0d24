#![no_main]
//! `Needle2File::parse` on arbitrary bytes, then weights, probe heads and the
//! tokenizer of whatever parses (see `needle_fuzz::cact_target`).

use libfuzzer_sys::{fuzz_mutator, fuzz_target};
use mutate::{mutate, mutate_cact};

/// Structure-aware mutations (not in the library, which the regression test includes).
#[path = "../src/mutate.rs"]
#[allow(dead_code)]
mod mutate;

#[global_allocator]
static ALLOC: needle_fuzz::peak::PeakAlloc = needle_fuzz::peak::PeakAlloc;

fuzz_target!(|data: &[u8]| needle_fuzz::cact_target(data));

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    mutate(data, size, max_size, seed, mutate_cact)
});
