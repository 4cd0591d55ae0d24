//! The state a Needle graph carries between steps ([`Cache`]: every layer's keys and
//! values, the token history, Needle 3's QKV-conv state and confidence pools), and its row relayouts
//! ([`rows`]), which let rows join and leave a running batch; the rows of prompts a
//! conversation may continue ([`prefix`]); its oldest tokens slid out where every layer
//! attends within a window ([`slide`]); the accelerator graphs' fixed-capacity form of
//! it ([`fixed`]).

pub mod fixed;
mod host;
pub mod prefix;
pub mod rows;
pub mod slide;

use anyhow::Result;
use ort::value::DynValue;

/// One layer's cache, `[batch, num_kv_heads, len or capacity, width]` each.
pub struct LayerKv {
    pub key: DynValue,
    pub value: DynValue,
}

/// The state carried between steps.
pub struct Cache {
    /// Per layer, in layer order, then the token history (`names::token_history`).
    pub(crate) layers: Vec<LayerKv>,
    /// The state besides the keys and values, float32 `[batch, …]` each, in the graph's
    /// `needle.state_inputs` order: Needle 3's per-layer QKV-conv state `[batch, taps − 1,
    /// width]`, then the confidence head's running pools `[batch, pools, d + 2]` where the
    /// graph carries them.
    pub(crate) states: Vec<DynValue>,
    pub(crate) len: usize,
    /// Tokens slid out of every row before column 0 ([`slide`]) by
    /// [`crate::session::NeedleSession::forward`], whose rows are all as long: its
    /// positions go on from `slid + len`. (The engine's rows, of different lengths, count
    /// their own positions.)
    pub(crate) slid: usize,
    /// `Some(tokens)`: the key/value tensors are buffers of that many positions, bound as
    /// both `past_*` and `present.*` so attention appends in place (see
    /// [`crate::plan::RunPlan::in_place_cache`]), or the accelerator graphs' buffers, which
    /// take that many positions (a ring's are fewer slots); `None`: exact-length tensors,
    /// replaced each step.
    pub(crate) capacity: Option<usize>,
    /// The accelerator graphs' cache (`layers` hold no token history then, and their
    /// buffers are the graphs' capacity): what their caller keeps besides; `None` for the
    /// stock graphs.
    pub(crate) fixed: Option<fixed::FixedSlots>,
}

impl Cache {
    /// Number of tokens already seen (`past_sequence`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The preallocated positions, when the session updates the cache in place.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// Tokens each row has fed, those slid out included (for caches whose rows are all
    /// as long; see `slid`).
    pub fn seen(&self) -> usize {
        self.slid + self.len
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each layer's key, then its value.
    fn key_values(&self) -> impl Iterator<Item = &DynValue> {
        self.layers.iter().flat_map(|kv| [&kv.key, &kv.value])
    }

    fn key_values_mut(&mut self) -> impl Iterator<Item = &mut DynValue> {
        self.layers
            .iter_mut()
            .flat_map(|kv| [&mut kv.key, &mut kv.value])
    }

    /// The state carried beside the keys and values, `[batch, …]` each.
    fn states(&self) -> impl Iterator<Item = &DynValue> {
        self.states.iter()
    }

    fn states_mut(&mut self) -> impl Iterator<Item = &mut DynValue> {
        self.states.iter_mut()
    }

    /// Sets every key and value to zero.
    pub(crate) fn zero_key_values(&mut self) -> Result<()> {
        for tensor in self.key_values_mut() {
            host::zero(tensor)?;
        }
        Ok(())
    }
}
