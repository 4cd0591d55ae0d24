//! Needle 2's part of the accelerator stream: its one attention core (windowed when its
//! `kv_window` binds) and RoPE over `head_dim`.

use crate::accelerator::Accelerated;
use crate::blocks::attention::{rope, CoreInputs};
use crate::blocks::context::BuildContext;
use crate::builder::{GraphBuilder, Value};
use crate::needle2::attention::AttentionCtx;
use crate::needle2::Config;

impl Accelerated for Config {
    fn core_windows(&self) -> Vec<Option<usize>> {
        vec![self.sliding_window()]
    }

    fn fixed_attention(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        position_ids: &Value,
        cores: Vec<CoreInputs>,
    ) -> AttentionCtx {
        let cfg = ctx.cfg;
        let c = &cfg.common;
        AttentionCtx {
            rope: rope(
                b,
                ctx,
                cfg.head_dim,
                c.max_seq_len,
                c.rope_theta,
                position_ids,
            ),
            core: cores.into_iter().next().expect("one core"),
        }
    }
}
