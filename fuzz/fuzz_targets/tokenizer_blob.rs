#![no_main]
//! `TokenizerSpec::parse` on arbitrary bytes, then `NeedleTokenizer::from_spec`,
//! encode and decode (see `needle_fuzz::tokenizer_blob_target`).

use libfuzzer_sys::{fuzz_mutator, fuzz_target};
use mutate::{mutate, mutate_blob};

/// Structure-aware mutations (not in the library, which the regression test includes).
#[path = "../src/mutate.rs"]
#[allow(dead_code)]
mod mutate;

#[global_allocator]
static ALLOC: needle_fuzz::peak::PeakAlloc = needle_fuzz::peak::PeakAlloc;

fuzz_target!(|data: &[u8]| needle_fuzz::tokenizer_blob_target(data));

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    mutate(data, size, max_size, seed, mutate_blob)
});
