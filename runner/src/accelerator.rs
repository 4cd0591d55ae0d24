//! The accelerator graphs' session driver (`needle-export --target`, README "Accelerator
//! graph interface"): a prompt through the prefill graph in chunks of its fixed sequence
//! (the last one padded), then one token a call through the decode graph, both reading
//! the caller's fixed-capacity cache ([`crate::cache::fixed`]) and returning only their
//! own tokens' keys and values, which are written into it at their positions' slots (a
//! ring's, for a model whose every layer attends over a sliding window). Batch 1;
//! no probe heads. [`crate::session::NeedleSession`] hands its steps here when its graph
//! is the decode graph of such a pair.

use crate::cache::fixed::{push_rows, slot_runs, write_slots, FixedSlots};
use crate::cache::{Cache, LayerKv};
use crate::step::{StepInputs, StepOutput};
use anyhow::{anyhow, bail, Context, Result};
use graphs::accelerator::FixedShape;
use graphs::config::ModelConfig;
use graphs::contract::names::{self, layer_cache};
use graphs::description::ExportDescription;
use ort::session::{Session, SessionOutputs};
use ort::value::{DynTensor, DynValue, Tensor, TensorElementType};

/// The prefill graph beside a decode graph, and the names and shapes both share.
pub struct AcceleratorGraphs {
    prefill: Session,
    /// Tokens per prefill call.
    chunk: usize,
    /// Cache slots.
    slots: usize,
    /// Whether the slots are a ring (position `p` in slot `p mod slots`).
    ring: bool,
    /// The most tokens a row may have: the model's `max_seq_len`, or the slots when fewer.
    max_positions: usize,
    /// Tokens before a call that `token_window` carries (`engram_history`).
    history: usize,
    vocab: usize,
    layers: Vec<LayerNames>,
    /// `(past, new)` names of each layer's QKV-conv state; empty without the conv.
    conv: Vec<(String, String)>,
}

/// One layer's cache input and call output names.
struct LayerNames {
    past_key: String,
    past_value: String,
    new_key: String,
    new_value: String,
}

/// Which of the pair a call runs.
#[derive(Clone, Copy)]
enum Graph {
    Decode,
    Prefill,
}

impl AcceleratorGraphs {
    /// The pair of `decode` (whose metadata says `shape` and `description`) and `prefill`,
    /// checked to be two graphs of one export.
    pub fn new(
        decode: &Session,
        shape: &FixedShape,
        description: &ExportDescription,
        prefill: Session,
    ) -> Result<Self> {
        let meta = prefill.metadata().map_err(|e| anyhow!("{e}"))?;
        let get = |k: &str| meta.custom(k);
        let prefill_shape = FixedShape::from_metadata(get)
            .map_err(|e| anyhow!("the prefill graph: {e}"))?
            .ok_or_else(|| anyhow!("the prefill graph is not an accelerator graph"))?;
        let prefill_description = ExportDescription::from_metadata(|k| meta.custom(k))
            .map_err(|e| anyhow!("the prefill graph: {e}"))?;
        drop(meta);
        if shape.sequence != 1 {
            bail!(
                "the accelerator graph takes {} tokens a call; give needle-run the one-token \
                 decode graph (OUT.onnx), which finds OUT.prefill.onnx beside it",
                shape.sequence
            );
        }
        if (prefill_shape.capacity, prefill_shape.ring) != (shape.capacity, shape.ring)
            || prefill_description.source != description.source
        {
            bail!("the prefill graph is not of the same export as the decode graph");
        }
        let config = &description.config;
        let layers = (0..config.num_layers())
            .map(|i| {
                let past = layer_cache(i);
                let (new_key, new_value) = names::new_key_values(i);
                LayerNames {
                    past_key: past.past_key,
                    past_value: past.past_value,
                    new_key,
                    new_value,
                }
            })
            .collect();
        let conv = match config.qkv_conv_state() {
            Some(_) => (0..config.num_layers())
                .map(|i| (names::qkv_conv_state(i).0, names::new_state(i)))
                .collect(),
            None => Vec::new(),
        };
        let window = static_shape(decode, names::TOKEN_WINDOW)?;
        let graphs = AcceleratorGraphs {
            prefill,
            chunk: prefill_shape.sequence,
            slots: shape.capacity,
            ring: shape.ring,
            max_positions: if shape.ring {
                config.max_seq_len()
            } else {
                shape.capacity
            },
            history: window[1] - shape.sequence,
            vocab: config.output_vocab(),
            layers,
            conv,
        };
        graphs.check_interface(decode)?;
        Ok(graphs)
    }

    fn check_interface(&self, decode: &Session) -> Result<()> {
        for (graph, session) in [("decode", decode), ("prefill", &self.prefill)] {
            let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
            let ring = self.ring.then_some(names::CACHE_POSITIONS);
            let fixed = [
                names::TOKEN_WINDOW,
                names::POSITION_IDS,
                names::ATTENTION_MASK,
            ]
            .into_iter()
            .chain(ring);
            let pasts = self
                .layers
                .iter()
                .flat_map(|n| [n.past_key.as_str(), n.past_value.as_str()])
                .chain(self.conv.iter().map(|(past, _)| past.as_str()));
            for name in fixed.chain(pasts) {
                if !inputs.contains(&name) {
                    bail!("not a needle-export accelerator graph: the {graph} graph has no input {name}");
                }
            }
        }
        Ok(())
    }

    /// A row's empty cache with room for `tokens` positions: buffers of the graphs'
    /// capacity, zeros.
    pub fn new_cache(
        &self,
        decode: &Session,
        config: &ModelConfig,
        tokens: usize,
    ) -> Result<Cache> {
        if tokens > self.max_positions {
            bail!(
                "the prompt and the tokens to generate need {tokens} positions; the \
                 accelerator graphs take {} (the model's max_seq_len): ask for fewer tokens \
                 (--max-new-tokens) or use the stock graphs (--graph stock)",
                self.max_positions
            );
        }
        let zeros = |name: &str| -> Result<DynValue> {
            let shape = static_shape(decode, name)?;
            let mut tensor = DynTensor::new(decode.allocator(), TensorElementType::Float32, shape)?;
            let (_, data) = tensor.try_extract_tensor_mut::<f32>()?;
            data.fill(0.0);
            Ok(tensor.into_dyn())
        };
        let layers = self
            .layers
            .iter()
            .map(|n| {
                Ok(LayerKv {
                    key: zeros(&n.past_key)?,
                    value: zeros(&n.past_value)?,
                })
            })
            .collect::<Result<_>>()?;
        let states = self
            .conv
            .iter()
            .map(|(past, _)| zeros(past))
            .collect::<Result<_>>()?;
        let positions = self
            .ring
            .then(|| Tensor::<i32>::from_array(([1, self.slots], vec![0; self.slots])))
            .transpose()?
            .map(Tensor::into_dyn);
        debug_assert_eq!(self.layers.len(), config.num_layers());
        Ok(Cache {
            layers,
            states,
            len: 0,
            slid: 0,
            capacity: Some(self.max_positions),
            fixed: Some(FixedSlots {
                mask: zeros(names::ATTENTION_MASK)?,
                positions,
                recent: Vec::new(),
                history: self.history,
            }),
        })
    }

    /// Runs one row's `inputs` (its next tokens, in order) after `cache`: one token
    /// through the decode graph, more through the prefill graph in chunks. The logits
    /// are every token's, `[1, tokens, vocab]`.
    pub fn step(
        &mut self,
        decode: &mut Session,
        inputs: StepInputs,
        mut cache: Cache,
    ) -> Result<StepOutput> {
        let StepInputs {
            input_ids,
            attention_mask,
            position_ids,
            batch,
            // No probe heads here: a step's outputs are its logits and keys.
            heads: _,
            // Every token's logits: the fixed-shape graphs compute them all anyway.
            logits_to_keep: _,
        } = inputs;
        if batch != 1 {
            bail!("the accelerator graphs take one row a call, not {batch}");
        }
        let p0 = cache.len;
        let n = input_ids.len();
        let in_order = (p0..p0 + n)
            .map(|p| p as i64)
            .eq(position_ids.iter().copied());
        if !in_order || attention_mask.iter().any(|&m| m != 1) {
            bail!("the accelerator graphs take a row's tokens in order, without padding");
        }
        if p0 + n > self.max_positions {
            bail!(
                "{} tokens do not fit the accelerator graphs' {} positions",
                p0 + n,
                self.max_positions
            );
        }
        let mut logits = Vec::with_capacity(n * self.vocab);
        if n == 1 {
            self.call(decode, Graph::Decode, &input_ids, &mut cache, &mut logits)?;
        } else {
            for chunk in input_ids.chunks(self.chunk) {
                self.call(decode, Graph::Prefill, chunk, &mut cache, &mut logits)?;
            }
        }
        Ok(StepOutput {
            logits,
            confidence_logit: None,
            contrastive_embedding: None,
            cache,
        })
    }

    /// One call of `graph` on `tokens` (at most its sequence) after `cache`: appends their
    /// logits to `logits` and writes their keys, values and conv rows into `cache`.
    fn call(
        &mut self,
        decode: &mut Session,
        graph: Graph,
        tokens: &[i64],
        cache: &mut Cache,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let AcceleratorGraphs {
            prefill,
            chunk,
            slots,
            ring,
            max_positions,
            vocab,
            layers,
            conv,
            ..
        } = self;
        let (session, sequence) = match graph {
            Graph::Decode => (decode, 1),
            Graph::Prefill => (prefill, *chunk),
        };
        let (p0, n) = (cache.len, tokens.len());
        let fixed = cache
            .fixed
            .as_ref()
            .context("not the accelerator graphs' cache")?;
        let window = fixed.token_window(tokens, sequence);
        // A padded chunk's padding may take any position the model has.
        let positions: Vec<i32> = (p0..p0 + sequence)
            .map(|p| p.min(*max_positions - 1) as i32)
            .collect();
        let window = Tensor::<i32>::from_array(([1, window.len()], window))?;
        let positions = Tensor::<i32>::from_array(([1, sequence], positions))?;
        let mut binding = session.create_binding()?;
        binding.bind_input(names::TOKEN_WINDOW, &window)?;
        binding.bind_input(names::POSITION_IDS, &positions)?;
        binding.bind_input(names::ATTENTION_MASK, &fixed.mask)?;
        if let Some(slot_positions) = &fixed.positions {
            binding.bind_input(names::CACHE_POSITIONS, slot_positions)?;
        }
        let host = session.allocator().memory_info();
        for (n, kv) in layers.iter().zip(&cache.layers) {
            binding.bind_input(n.past_key.as_str(), &kv.key)?;
            binding.bind_input(n.past_value.as_str(), &kv.value)?;
            binding.bind_output_to_device(n.new_key.as_str(), host)?;
            binding.bind_output_to_device(n.new_value.as_str(), host)?;
        }
        for ((past, new), state) in conv.iter().zip(&cache.states) {
            binding.bind_input(past.as_str(), state)?;
            binding.bind_output_to_device(new.as_str(), host)?;
        }
        binding.bind_output_to_device(names::LOGITS, host)?;
        let outputs = session
            .run_binding(&binding)
            .context("onnxruntime run failed")?;
        logits.extend_from_slice(&floats(&outputs, names::LOGITS)?[..n * *vocab]);
        let runs = slot_runs(p0, n, *slots, *ring);
        for (names, kv) in layers.iter().zip(cache.layers.iter_mut()) {
            write_slots(&mut kv.key, floats(&outputs, &names.new_key)?, &runs)?;
            write_slots(&mut kv.value, floats(&outputs, &names.new_value)?, &runs)?;
        }
        for ((_, new), state) in conv.iter().zip(cache.states.iter_mut()) {
            push_rows(state, floats(&outputs, new)?, n)?;
        }
        drop(outputs);
        cache.fill_slots(tokens, p0, &runs)
    }
}

/// An output's float32 elements.
fn floats<'o>(outputs: &'o SessionOutputs<'_>, name: &str) -> Result<&'o [f32]> {
    let value = outputs
        .get(name)
        .ok_or_else(|| anyhow!("graph output {name} is missing"))?;
    Ok(value.try_extract_tensor::<f32>()?.1)
}

/// The fixed shape of `session`'s input `name`.
fn static_shape(session: &Session, name: &str) -> Result<Vec<usize>> {
    let input = session
        .inputs()
        .iter()
        .find(|i| i.name() == name)
        .ok_or_else(|| anyhow!("not a needle-export accelerator graph: no input {name}"))?;
    let shape = input
        .dtype()
        .tensor_shape()
        .ok_or_else(|| anyhow!("input {name} is not a tensor"))?;
    shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| anyhow!("input {name} has no fixed shape")))
        .collect()
}
