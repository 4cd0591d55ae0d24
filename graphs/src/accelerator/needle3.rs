//! Needle 3's part of the accelerator stream: a global core and, when a layer is local,
//! a windowed one; RoPE over `qk_head_dim`; the QKV-conv state kept by the caller (each
//! layer returns this call's raw projections, see `names::new_state`).

use crate::accelerator::Accelerated;
use crate::blocks::attention::{rope, CoreInputs};
use crate::blocks::context::BuildContext;
use crate::builder::{GraphBuilder, Value};
use crate::needle3::attention::AttentionCtx;
use crate::needle3::Config;

impl Accelerated for Config {
    fn core_windows(&self) -> Vec<Option<usize>> {
        let local = (0..self.common.num_layers).find_map(|l| self.window_of(l));
        std::iter::once(None).chain(local.map(Some)).collect()
    }

    fn fixed_attention(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        position_ids: &Value,
        cores: Vec<CoreInputs>,
    ) -> AttentionCtx {
        let cfg = ctx.cfg;
        let c = &cfg.common;
        let mut cores = cores.into_iter();
        AttentionCtx {
            rope: rope(
                b,
                ctx,
                cfg.qk_head_dim,
                c.max_seq_len,
                c.rope_theta,
                position_ids,
            ),
            global: cores.next().expect("the global core"),
            local: cores.next(),
            real_new: None,
        }
    }
}
