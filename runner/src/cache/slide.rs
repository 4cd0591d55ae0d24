//! Sliding a cache whose every layer attends within a window
//! ([`crate::plan::RunPlan::sliding_window`]): when the next call would not fit the
//! buffers, each row's oldest tokens are dropped so that it keeps its last `keep`. The
//! fused graph's layout only: each row's tokens packed from column 0, which its attention
//! core (`GroupQueryAttention`, packed graphs' `needle.Attention`) finds by their count
//! (the attention mask's ones), so a row's keys
//! and values (token history included) move down by the tokens it drops and nothing else
//! changes. Positions are not stored in the cache: RoPE takes `position_ids`, which go on
//! counting every token a row has fed.

use super::host::host_bytes_mut;
use super::Cache;
use anyhow::{bail, Result};

/// Keeps each row's last `keep` tokens, `counts` being how many each row has in `cache`,
/// and makes the cache `keep` columns wide; the columns a row vacates are zeroed (the
/// padding of the right-padded layout). Returns each row's count after.
pub fn slide(cache: &mut Cache, counts: &[usize], keep: usize) -> Result<Vec<usize>> {
    for tensor in cache.key_values_mut() {
        let t = host_bytes_mut(tensor)?;
        let [batch, heads, positions, width] = t.shape[..] else {
            bail!("a key/value tensor of shape {:?}", t.shape);
        };
        if batch != counts.len() || keep > positions || counts.iter().any(|&c| c > positions) {
            bail!(
                "cannot slide rows of {counts:?} tokens to {keep} in a cache of shape {:?}",
                t.shape
            );
        }
        let item = width * t.element;
        for (r, &count) in counts.iter().enumerate() {
            let Some(dropped) = count.checked_sub(keep).filter(|&d| d > 0) else {
                continue;
            };
            for h in 0..heads {
                let head = (r * heads + h) * positions * item;
                t.bytes
                    .copy_within(head + dropped * item..head + count * item, head);
                t.bytes[head + keep * item..head + count * item].fill(0);
            }
        }
    }
    cache.len = keep;
    Ok(counts.iter().map(|&c| c.min(keep)).collect())
}
