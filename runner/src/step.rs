//! One forward call's inputs and outputs, shared by the stock session and the
//! accelerator graphs' driver.

use crate::cache::Cache;

/// One step's inputs for `batch` rows, row-major: `input_ids` `[batch, sequence]`,
/// `attention_mask` `[batch, cache.len() + sequence]` (every column of the cache and the
/// new ones; 0 for padding, which goes after a row's tokens) and `position_ids`
/// `[batch, sequence]` (each token's position in its own row).
#[derive(Clone, Debug)]
pub struct StepInputs {
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    pub position_ids: Vec<i64>,
    pub batch: usize,
    /// Whether the call fetches the probe heads' outputs. They pool over the call's
    /// tokens, so only a sequence fed whole reads them. (onnxruntime still computes them:
    /// its inference builds run every node whatever is fetched, as the decode profile of
    /// `needle-bench --profile` shows.)
    pub heads: bool,
    /// The logits of each row's last `logits_to_keep` positions only, on graphs that take
    /// `names::LOGITS_TO_KEEP` (the packed ones); 0 for every position.
    pub logits_to_keep: usize,
}

impl StepInputs {
    /// `batch` rows of equal length after `past` real tokens each in the cache, the first
    /// new one at position `first`: every token real. (`first` exceeds `past` by the
    /// tokens slid out of the cache; [`crate::session::NeedleSession::step`] reports ids
    /// that do not split into `batch` rows.)
    pub fn dense(input_ids: &[i64], batch: usize, past: usize, first: usize) -> Self {
        let seq = input_ids.len().checked_div(batch).unwrap_or(0);
        let row: Vec<i64> = (first..first + seq).map(|p| p as i64).collect();
        StepInputs {
            input_ids: input_ids.to_vec(),
            attention_mask: vec![1; batch * (past + seq)],
            position_ids: row.repeat(batch),
            batch,
            heads: false,
            logits_to_keep: 0,
        }
    }

    /// `rows` of different lengths from an empty cache, padded on the right to the longest
    /// with `pad` (mask 0, position 0).
    pub fn right_padded(rows: &[&[u32]], pad: i64) -> Self {
        let batch = rows.len();
        let longest = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let mut inputs = StepInputs {
            input_ids: Vec::with_capacity(batch * longest),
            attention_mask: Vec::with_capacity(batch * longest),
            position_ids: Vec::with_capacity(batch * longest),
            batch,
            heads: false,
            logits_to_keep: 0,
        };
        for row in rows {
            for i in 0..longest {
                let token = row.get(i);
                inputs.input_ids.push(token.map_or(pad, |&t| i64::from(t)));
                inputs.attention_mask.push(i64::from(token.is_some()));
                inputs
                    .position_ids
                    .push(if token.is_some() { i as i64 } else { 0 });
            }
        }
        inputs
    }

    /// The same call, also computing the probe heads' outputs.
    pub fn with_heads(self) -> Self {
        StepInputs {
            heads: true,
            ..self
        }
    }
}

/// Output of one step.
pub struct StepOutput {
    /// `[batch, sequence, vocab]`, row-major; `[batch, min(sequence, logits_to_keep),
    /// vocab]` where the call kept fewer ([`StepInputs::logits_to_keep`]).
    pub logits: Vec<f32>,
    /// `[batch]`: the confidence head's logit, when the graph has the head and the call
    /// asked for it ([`StepInputs::heads`]; see `names::CONFIDENCE_LOGIT`): over this
    /// step's tokens, or, where the graph carries the head's pools, over every token each
    /// row has fed (then fetched on every call).
    pub confidence_logit: Option<Vec<f32>>,
    /// `[batch, contrastive_dim]`, row-major: the contrastive head's unit-norm embedding of
    /// this step's tokens, when the graph has the head and the call asked for it (see
    /// `names::CONTRASTIVE_EMBEDDING`).
    pub contrastive_embedding: Option<Vec<f32>>,
    pub cache: Cache,
}
