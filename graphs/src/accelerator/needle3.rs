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
    /// The unwindowed core only where a layer reads it: when every layer's window binds, the
    /// one core is the window's (in the `global` place, which every layer then reads), so the
    /// graph holds no bias nothing uses.
    fn core_windows(&self) -> Vec<Option<usize>> {
        let layers = 0..self.common.num_layers;
        let local = layers.clone().find_map(|l| self.window_of(l));
        let unwindowed = layers.into_iter().any(|l| self.window_of(l).is_none());
        unwindowed
            .then_some(None)
            .into_iter()
            .chain(local.map(Some))
            .collect()
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
            global: cores.next().expect("a core"),
            local: cores.next(),
            real_new: None,
        }
    }
}
