#![no_main]
//! A Needle 3 `.cact` through the whole export, in memory (see
//! `needle_fuzz::needle3_export_target`).

use libfuzzer_sys::{fuzz_mutator, fuzz_target};
use mutate::{mutate, mutate_cact};

/// Structure-aware mutations (not in the library, which the regression test includes).
#[path = "../src/mutate.rs"]
#[allow(dead_code)]
mod mutate;

fuzz_target!(|data: &[u8]| needle_fuzz::needle3_export_target(data));

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    mutate(data, size, max_size, seed, mutate_cact)
});
