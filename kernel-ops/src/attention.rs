//! `needle.Attention` (`kernels/src/attention.rs` states it): inputs `qkv` float32
//! `[batch, sequence, (heads + 2 · kv_heads) · head_dim]` (`needle.QkvHeads`' output), the
//! layer's `past_key` and `past_value` `[batch, kv_heads, past or capacity, head_dim]` and
//! the `attention_mask` int64 `[batch, total_sequence]`. Attributes `heads`, `kv_heads`,
//! `head_dim`, `qk_head_dim` (the scores' scale is `1 / √qk_head_dim`) and `window` (the
//! keys a query sees, its own among them; 0: every earlier key). Outputs float32: the
//! heads `[batch, sequence, heads · head_dim]` and the `present_key` and `present_value`,
//! as long as the past's buffer or the mask, whichever is longer, as
//! `GroupQueryAttention`'s are. Bound to the past's memory (the cache updated in place,
//! [`NeedleOp::IN_PLACE`]), only this call's keys and values are written; otherwise the
//! past is copied in first.

use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::attention::{attention, CacheSide, Heads, RowKeys};
use kernels::Isa;

pub struct Attention(Heads);

/// The `qkv` tokens, each row's keys, the pasts (`None` where the present is their
/// memory) and their length, and the sequence.
struct Operands<'a> {
    qkv: &'a [f32],
    rows: Vec<RowKeys>,
    pasts: Option<[&'a [f32]; 2]>,
    past_len: usize,
    batch: usize,
    sequence: usize,
    present_len: usize,
}

impl Attention {
    fn operands<'a>(&self, inputs: &[Input<'a>]) -> Result<Operands<'a>, OpError> {
        let heads = &self.0;
        let (qkv_shape, qkv) = Input::get::<Self, f32>(inputs, 0)?;
        let (key_shape, past_key) = Input::get::<Self, f32>(inputs, 1)?;
        let (value_shape, past_value) = Input::get::<Self, f32>(inputs, 2)?;
        let (mask_shape, mask) = Input::get::<Self, i64>(inputs, 3)?;
        let (&[batch, sequence, width], &[mask_batch, total]) = (qkv_shape, mask_shape) else {
            return Err(op_error::<Self>(format!(
                "qkv {qkv_shape:?} and mask {mask_shape:?} are not [batch, sequence, width] and [batch, total]"
            )));
        };
        let (batch, sequence, total) = (batch as usize, sequence as usize, total as usize);
        let cache = [batch, heads.kv_heads, 0, heads.width].map(|d| d as i64);
        let cache_like = |s: &[i64]| s.len() == 4 && [0, 1, 3].iter().all(|&d| s[d] == cache[d]);
        if width as usize != heads.projections_width()
            || mask_batch as usize != batch
            || !cache_like(key_shape)
            || key_shape != value_shape
            || total < sequence
        {
            return Err(op_error::<Self>(format!(
                "qkv {qkv_shape:?}, past {key_shape:?} and {value_shape:?}, mask {mask_shape:?} \
                 do not agree with {heads:?}"
            )));
        }
        let past_len = key_shape[2] as usize;
        // The past is the present's memory (in place) where the host passes it empty.
        let in_place = past_key.is_empty() && past_value.is_empty() && past_len > 0;
        let rows = (0..batch)
            .map(|b| RowKeys::of_mask(&mask[b * total..(b + 1) * total], sequence))
            .collect();
        Ok(Operands {
            qkv,
            rows,
            pasts: (!in_place).then_some([past_key, past_value]),
            past_len,
            batch,
            sequence,
            present_len: past_len.max(total),
        })
    }
}

impl NeedleOp for Attention {
    const NAME: &'static str = needle_ops::ATTENTION;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // qkv
        ElementType::Float32, // past_key
        ElementType::Float32, // past_value
        ElementType::Int64,   // attention_mask
    ];
    const OUTPUTS: usize = 3;
    const IN_PLACE: &'static [(usize, usize)] = &[(1, 1), (2, 2)];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        let size = |name| size_attribute::<Self>(attribute, name);
        let window = size("window")?;
        Ok(Attention(Heads {
            heads: size("heads")?,
            kv_heads: size("kv_heads")?,
            width: size("head_dim")?,
            scale: 1.0 / (size("qk_head_dim")? as f32).sqrt(),
            window: (window > 0).then_some(window),
        }))
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let o = self.operands(inputs)?;
        let heads = &self.0;
        let present = [o.batch, heads.kv_heads, o.present_len, heads.width].map(|d| d as i64);
        let out = [o.batch, o.sequence, heads.heads * heads.width].map(|d| d as i64);
        Ok(vec![out.to_vec(), present.to_vec(), present.to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let o = self.operands(inputs)?;
        let [out, key, value] = outputs else {
            return Err(op_error::<Self>("three outputs"));
        };
        if let Some(pasts) = o.pasts.filter(|_| o.past_len > 0) {
            let width = self.0.width;
            for (present, past) in [&mut **key, &mut **value].into_iter().zip(pasts) {
                let runs = past.chunks_exact(o.past_len * width);
                let slots = present.chunks_exact_mut(o.present_len * width);
                for (slot, run) in slots.zip(runs) {
                    slot[..run.len()].copy_from_slice(run);
                }
            }
        }
        let capacity = o.present_len;
        attention(
            Isa::best(),
            &self.0,
            o.qkv,
            &o.rows,
            o.sequence,
            CacheSide {
                data: key,
                capacity,
            },
            CacheSide {
                data: value,
                capacity,
            },
            out,
            split,
        )
        .map_err(op_error::<Self>)
    }
}
