//! One Needle graph loaded in onnxruntime: what its metadata says about it, its run
//! plan, and a `forward` that threads the typed [`Cache`] through the graph's
//! `present.*` outputs (or, for the accelerator graphs, hands it to
//! [`crate::accelerator`]).

use crate::accelerator::AcceleratorGraphs;
use crate::cache::slide::slide;
use crate::cache::{Cache, LayerKv};
use crate::plan::RunPlan;
use crate::provider::{self, Provider, Registered};
pub use crate::step::{StepInputs, StepOutput};
use anyhow::{anyhow, bail, Context, Result};
use graphs::accelerator::FixedShape;
use graphs::config::ModelConfig;
use graphs::contract::names::{self, layer_cache, LayerCache};
use graphs::contract::{keys, Precision};
use graphs::description::ExportDescription;
use ort::session::{OutputSelector, RunOptions, Session, SessionInputValue, SessionOutputs};
use ort::value::TensorElementType;
use ort::value::{DynTensor, DynValue, Tensor};

/// A state a graph carries besides the KV cache: fed as `past`, its next value read from
/// `present`, float32 `[batch, rows, width]`, zeros before a row's first token.
struct CarriedState {
    past: String,
    present: String,
    rows: usize,
    width: usize,
}

impl CarriedState {
    /// What `description`'s graph carries: each layer's QKV-conv state, then the
    /// confidence head's running pools.
    fn of(description: &ExportDescription) -> Vec<CarriedState> {
        let config = &description.config;
        let conv = config
            .qkv_conv_state()
            .into_iter()
            .flat_map(|(slots, width)| {
                (0..config.num_layers()).map(move |i| {
                    let (past, present) = names::qkv_conv_state(i);
                    CarriedState {
                        past,
                        present,
                        rows: slots,
                        width,
                    }
                })
            });
        let pools = description.confidence_pools.map(|pools| CarriedState {
            past: names::PAST_CONFIDENCE_POOLS.to_string(),
            present: names::PRESENT_CONFIDENCE_POOLS.to_string(),
            rows: pools,
            width: config.common().d_model + 2,
        });
        conv.chain(pools).collect()
    }
}

/// A loaded Needle graph, what its metadata says about it, and how it runs.
pub struct NeedleSession {
    session: Session,
    pub description: ExportDescription,
    pub plan: RunPlan,
    /// The cache input/output names of each layer, then the token history's.
    layer_names: Vec<LayerCache>,
    /// The state besides the KV cache, in the graph's `needle.state_inputs` order.
    carried: Vec<CarriedState>,
    /// The accelerator graphs' prefill graph and driver, when `session` is their decode
    /// graph; the stock names above are empty then.
    accelerator: Option<AcceleratorGraphs>,
    /// Whether the graph takes `names::LOGITS_TO_KEEP` (an overridable initializer, which
    /// onnxruntime lists apart from the inputs).
    takes_logits_to_keep: bool,
}

impl NeedleSession {
    /// Loads graph bytes with the provider `registered` holds.
    pub fn from_memory(onnx: &[u8], mut registered: Registered) -> Result<Self> {
        let session = registered
            .builder
            .commit_from_memory(onnx)
            .map_err(|e| anyhow!("{e}"))?;
        Self::wrap(session, None, &registered)
    }

    /// Loads the accelerator graphs (`needle-export --target`) from their bytes: the
    /// one-token `decode` graph and the `prefill` graph.
    pub fn accelerator_from_memory(
        decode: &[u8],
        prefill: &[u8],
        mut registered: Registered,
    ) -> Result<Self> {
        let mut commit = |onnx: &[u8]| {
            registered
                .builder
                .commit_from_memory(onnx)
                .map_err(|e| anyhow!("{e}"))
        };
        let (decode, prefill) = (commit(decode)?, commit(prefill)?);
        Self::wrap(decode, Some(prefill), &registered)
    }

    /// Loads an `.onnx` written by `needle-export`; an accelerator decode graph
    /// (`OUT.onnx` of `--target`) with the prefill graph beside it (`OUT.prefill.onnx`).
    pub fn from_file(path: &std::path::Path, mut registered: Registered) -> Result<Self> {
        let mut commit = |path: &std::path::Path| {
            registered
                .builder
                .commit_from_file(path)
                .map_err(|e| anyhow!("{}: cannot load: {e}", path.display()))
        };
        let session = commit(path)?;
        let accelerator = session
            .metadata()
            .map_err(|e| anyhow!("{e}"))?
            .custom(keys::TARGET)
            .is_some();
        let prefill = match accelerator {
            true => Some(
                commit(&path.with_extension("prefill.onnx")).with_context(|| {
                    format!(
                        "the prefill graph of the accelerator graph {}",
                        path.display()
                    )
                })?,
            ),
            false => None,
        };
        Self::wrap(session, prefill, &registered)
    }

    /// Creates a session for `onnx` on `provider` with `threads` intra-op threads.
    pub fn create(onnx: &[u8], provider: Provider, fallback: bool, threads: usize) -> Result<Self> {
        let env = crate::ort_env::init()?;
        let registered = provider::session_builder(env, provider, fallback, threads)?;
        Self::from_memory(onnx, registered)
    }

    fn wrap(session: Session, prefill: Option<Session>, registered: &Registered) -> Result<Self> {
        let meta = session.metadata().map_err(|e| anyhow!("{e}"))?;
        let description = ExportDescription::from_metadata(|k| meta.custom(k))
            .map_err(|e| anyhow!("not a needle-export graph: {e}"))?;
        let fixed = FixedShape::from_metadata(|k| meta.custom(k))
            .map_err(|e| anyhow!("not a needle-export graph: {e}"))?;
        drop(meta);
        let plan = RunPlan::new(
            registered.provider,
            &description,
            fixed.as_ref(),
            registered.threads,
        );
        if let Some(shape) = fixed {
            let prefill = prefill.ok_or_else(|| {
                anyhow!("an accelerator graph runs with its prefill graph (OUT.prefill.onnx)")
            })?;
            let accelerator = AcceleratorGraphs::new(&session, &shape, &description, prefill)?;
            return Ok(NeedleSession {
                session,
                description,
                plan,
                layer_names: Vec::new(),
                carried: Vec::new(),
                accelerator: Some(accelerator),
                takes_logits_to_keep: false,
            });
        }
        let layers = description.config.num_layers();
        if description.token_history_layer != layers {
            bail!(
                "not a needle-export graph: its token history is cache pair {}, not {layers}",
                description.token_history_layer
            );
        }
        let layer_names = (0..=layers).map(layer_cache).collect();
        let carried = CarriedState::of(&description);
        let takes_logits_to_keep = session
            .overridable_initializers()
            .iter()
            .any(|i| i.name() == names::LOGITS_TO_KEEP);
        let s = NeedleSession {
            session,
            description,
            plan,
            layer_names,
            carried,
            accelerator: None,
            takes_logits_to_keep,
        };
        s.check_interface()?;
        Ok(s)
    }

    /// The model geometry.
    pub fn config(&self) -> &ModelConfig {
        &self.description.config
    }

    /// Whether the graph computes the confidence head (`names::CONFIDENCE_LOGIT`).
    pub fn has_confidence_head(&self) -> bool {
        self.has_output(names::CONFIDENCE_LOGIT)
    }

    /// Whether the graph computes the contrastive head (`names::CONTRASTIVE_EMBEDDING`).
    pub fn has_contrastive_head(&self) -> bool {
        self.has_output(names::CONTRASTIVE_EMBEDDING)
    }

    fn has_output(&self, name: &str) -> bool {
        self.session.outputs().iter().any(|o| o.name() == name)
    }

    /// The `logits_to_keep` input to feed for `keep` (none where it is 0 or the graph
    /// computes every position's logits).
    fn logits_to_keep(&self, keep: usize) -> Result<Option<Tensor<i64>>> {
        if keep == 0 || !self.takes_logits_to_keep {
            return Ok(None);
        }
        Ok(Some(Tensor::<i64>::from_array((
            [0usize; 0],
            vec![keep as i64],
        ))?))
    }

    /// Whether the confidence head keeps running pools between calls
    /// (`names::PAST_CONFIDENCE_POOLS`): its logit after a row's last token is then the
    /// row's confidence, with no second forward over the row's tokens.
    pub fn carries_confidence_pools(&self) -> bool {
        self.description.confidence_pools.is_some()
    }

    /// Whether a call fetches `head`'s output: when it asks for the heads, and the
    /// carried confidence on every call.
    fn fetches(&self, head: &str, heads: bool) -> bool {
        let carried = head == names::CONFIDENCE_LOGIT && self.carries_confidence_pools();
        (heads || carried) && self.has_output(head)
    }

    /// Whether the graphs are the accelerator graphs (`needle-export --target`).
    pub fn is_accelerator(&self) -> bool {
        self.accelerator.is_some()
    }

    /// The provider that runs the graph (never `Auto`).
    pub fn provider(&self) -> Provider {
        self.plan.provider
    }

    fn check_interface(&self) -> Result<()> {
        let inputs: Vec<&str> = self.session.inputs().iter().map(|i| i.name()).collect();
        let kv = self
            .layer_names
            .iter()
            .flat_map(|n| [n.past_key.as_str(), n.past_value.as_str()]);
        let carried: Vec<&str> = self.carried.iter().map(|s| s.past.as_str()).collect();
        if self.description.state_inputs != carried {
            bail!(
                "this runner carries {carried:?} between steps; the graph needs {:?}",
                self.description.state_inputs
            );
        }
        let wanted = [names::INPUT_IDS, names::ATTENTION_MASK, names::POSITION_IDS];
        for w in wanted.into_iter().chain(kv).chain(carried) {
            if !inputs.contains(&w) {
                bail!("not a needle-export graph: input {w} is missing");
            }
        }
        Ok(())
    }

    /// The empty state for `batch` rows (`past_sequence = 0`).
    pub fn empty_cache(&self, batch: usize) -> Result<Cache> {
        match &self.accelerator {
            Some(graphs) => self.accelerator_cache(graphs, batch, 0),
            None => self.new_cache(batch, None),
        }
    }

    /// The accelerator graphs' cache of one row with room for `tokens`.
    fn accelerator_cache(
        &self,
        graphs: &AcceleratorGraphs,
        batch: usize,
        tokens: usize,
    ) -> Result<Cache> {
        if batch != 1 {
            bail!("the accelerator graphs take one row a call, not {batch}");
        }
        graphs.new_cache(&self.session, self.config(), tokens)
    }

    /// A state of zeros for `batch` rows that have seen `len` tokens (padding included),
    /// with room for `capacity` tokens where the plan updates the cache in place (else
    /// exactly `len` positions): what [`crate::cache::rows::join`] puts rows into.
    pub fn zeroed_cache(&self, batch: usize, len: usize, capacity: usize) -> Result<Cache> {
        if self.is_accelerator() {
            bail!(
                "the accelerator graphs run one row at a time; their rows are never laid out anew"
            );
        }
        let positions = match self.plan.in_place_cache {
            true => capacity.max(len).min(self.config().max_seq_len()),
            false => len,
        };
        let mut cache = self.new_cache(batch, Some(positions))?;
        cache.zero_key_values()?;
        cache.len = len;
        cache.capacity = self.plan.in_place_cache.then_some(positions);
        Ok(cache)
    }

    /// An empty state for `batch` rows and up to `capacity` tokens: preallocated buffers
    /// updated in place where the plan says so, else [`Self::empty_cache`].
    pub fn preallocated_cache(&self, batch: usize, capacity: usize) -> Result<Cache> {
        if let Some(graphs) = &self.accelerator {
            return self.accelerator_cache(graphs, batch, capacity);
        }
        if !self.plan.in_place_cache {
            return self.empty_cache(batch);
        }
        let capacity = capacity.min(self.config().max_seq_len());
        self.new_cache(batch, Some(capacity))
    }

    /// No tokens seen yet; key/value tensors of `capacity` positions, or of none.
    fn new_cache(&self, batch: usize, capacity: Option<usize>) -> Result<Cache> {
        let c = self.config();
        let float = match self.description.variant.precision {
            Precision::Fp32 => TensorElementType::Float32,
            Precision::Fp16 => TensorElementType::Float16,
        };
        let heads = c.head_shape();
        let attention = self.description.variant.attention;
        let len = capacity.unwrap_or(0);
        let key_shape = [batch, heads.kv_heads, len, heads.cached_key_dim(attention)];
        let value_shape = [
            batch,
            heads.kv_heads,
            len,
            heads.cached_value_dim(attention),
        ];
        let alloc = self.session.allocator();
        let layers = (0..=c.num_layers())
            .map(|_| {
                Ok(LayerKv {
                    key: DynTensor::new(alloc, float, key_shape)?.into_dyn(),
                    value: DynTensor::new(alloc, float, value_shape)?.into_dyn(),
                })
            })
            .collect::<Result<_>>()?;
        let states = self
            .carried
            .iter()
            .map(|s| {
                let zeros = vec![0f32; batch * s.rows * s.width];
                Ok(Tensor::<f32>::from_array(([batch, s.rows, s.width], zeros))?.into_dyn())
            })
            .collect::<Result<_>>()?;
        Ok(Cache {
            layers,
            states,
            len: 0,
            slid: 0,
            capacity,
            fixed: None,
        })
    }

    /// Runs `input_ids` (`[batch, sequence]`, row-major) after `cache`; every token is real
    /// (all-ones attention mask, positions continuing each row). Where the plan slides the
    /// cache and the call does not fit it, the rows' oldest tokens are slid out first.
    pub fn forward(&mut self, input_ids: &[i64], batch: usize, cache: Cache) -> Result<StepOutput> {
        self.forward_keeping(input_ids, batch, cache, 0)
    }

    /// [`Self::forward`], keeping the logits of each row's last `logits_to_keep` positions
    /// alone where the graph can ([`StepInputs::logits_to_keep`]; 0 keeps every one).
    pub fn forward_keeping(
        &mut self,
        input_ids: &[i64],
        batch: usize,
        mut cache: Cache,
        logits_to_keep: usize,
    ) -> Result<StepOutput> {
        let seq = input_ids.len().checked_div(batch).unwrap_or(0);
        if let (Some(window), Some(capacity)) = (self.plan.sliding_window, cache.capacity) {
            if cache.len + seq > capacity && cache.len > window {
                let (len, dropped) = (cache.len, cache.len - window);
                slide(&mut cache, &vec![len; batch], window)?;
                cache.slid += dropped;
            }
        }
        let step = StepInputs {
            logits_to_keep,
            ..StepInputs::dense(input_ids, batch, cache.len, cache.seen())
        };
        self.step(step, cache)
    }

    /// The confidence head's logit over `ids` fed whole with an empty cache, fetching that
    /// output alone (the other outputs are computed all the same: onnxruntime's inference
    /// builds run every node whatever is fetched, but none is copied out). `None` without
    /// the head.
    pub fn confidence_logit(&mut self, ids: &[i64]) -> Result<Option<f32>> {
        if !self.has_confidence_head() {
            return Ok(None);
        }
        if ids.is_empty() {
            bail!("the confidence head reads at least one token");
        }
        let cache = self.new_cache(1, None)?;
        let tensors = self.input_tensors(StepInputs::dense(ids, 1, 0, 0), &cache)?;
        let inputs = exact_length_inputs(&self.layer_names, &self.carried, tensors, cache);
        let only = OutputSelector::no_default().with(names::CONFIDENCE_LOGIT);
        let options = RunOptions::new()?.with_outputs(only);
        let outputs = self
            .session
            .run_with_options(inputs, &options)
            .context("onnxruntime run failed")?;
        Ok(head_output(&outputs, names::CONFIDENCE_LOGIT)?.and_then(|l| l.first().copied()))
    }

    /// Runs one step of `inputs` after `cache` (rows of different lengths padded on the
    /// right, see [`StepInputs`]).
    pub fn step(&mut self, inputs: StepInputs, cache: Cache) -> Result<StepOutput> {
        if let Some(graphs) = self.accelerator.as_mut() {
            return graphs.step(&mut self.session, inputs, cache);
        }
        let heads = inputs.heads;
        let keep = self.logits_to_keep(inputs.logits_to_keep)?;
        // Valid once `input_tensors` has checked the rows.
        let total = cache.len + inputs.position_ids.len() / inputs.batch.max(1);
        let slid = cache.slid;
        let [ids, mask, positions] = self.input_tensors(inputs, &cache)?;
        if cache.capacity.is_some() {
            let tensors = [ids, mask, positions];
            return self.forward_in_place(tensors, keep, cache, total, heads);
        }
        let mut inputs = exact_length_inputs(
            &self.layer_names,
            &self.carried,
            [ids, mask, positions],
            cache,
        );
        if let Some(keep) = keep {
            inputs.push((names::LOGITS_TO_KEEP, keep.into()));
        }
        let mut fetched = OutputSelector::default();
        for head in HEADS {
            if !self.fetches(head, heads) {
                fetched = fetched.without(head);
            }
        }
        let options = RunOptions::new()?.with_outputs(fetched);
        let mut outputs = self
            .session
            .run_with_options(inputs, &options)
            .context("onnxruntime run failed")?;
        let logits = logits(&outputs)?;
        let confidence_logit = head_output(&outputs, names::CONFIDENCE_LOGIT)?;
        let contrastive_embedding = head_output(&outputs, names::CONTRASTIVE_EMBEDDING)?;
        let layers = self
            .layer_names
            .iter()
            .map(|n| {
                Ok(LayerKv {
                    key: take(&mut outputs, &n.present_key)?,
                    value: take(&mut outputs, &n.present_value)?,
                })
            })
            .collect::<Result<_>>()?;
        let states = self
            .carried
            .iter()
            .map(|s| take(&mut outputs, &s.present))
            .collect::<Result<_>>()?;
        Ok(StepOutput {
            logits,
            confidence_logit,
            contrastive_embedding,
            cache: Cache {
                layers,
                states,
                len: total,
                slid,
                capacity: None,
                fixed: None,
            },
        })
    }

    /// `inputs`' `input_ids`, `attention_mask` and `position_ids` tensors after `cache`,
    /// once their lengths agree with each other and their positions fit the cache and the
    /// model.
    fn input_tensors(&self, inputs: StepInputs, cache: &Cache) -> Result<[Tensor<i64>; 3]> {
        let StepInputs {
            input_ids,
            attention_mask,
            position_ids,
            batch,
            ..
        } = inputs;
        if batch == 0 || !input_ids.len().is_multiple_of(batch) {
            bail!(
                "input_ids of length {} do not split into {batch} rows",
                input_ids.len()
            );
        }
        let seq = input_ids.len() / batch;
        let total = cache.len + seq;
        if attention_mask.len() != batch * total || position_ids.len() != batch * seq {
            bail!(
                "attention_mask needs {batch}×{total} values and position_ids {batch}×{seq}; \
                 got {} and {}",
                attention_mask.len(),
                position_ids.len()
            );
        }
        let max_seq_len = self.config().max_seq_len();
        let last_position = position_ids.iter().copied().max().unwrap_or(0);
        let first_position = position_ids.iter().copied().min().unwrap_or(0);
        match cache.capacity {
            Some(capacity) if total > capacity => {
                bail!("sequence of {total} tokens exceeds the preallocated cache's {capacity}")
            }
            _ if total > max_seq_len => bail!(
                "sequence of {total} tokens ({} cached + {seq} in this call) exceeds the \
                 model's max_seq_len {max_seq_len}",
                cache.len
            ),
            _ if first_position < 0 => bail!("position_ids must not be negative"),
            _ if last_position as usize >= max_seq_len => {
                bail!("position {last_position} is past the model's max_seq_len {max_seq_len}")
            }
            _ => {}
        }
        let ids = Tensor::<i64>::from_array(([batch, seq], input_ids))?;
        let mask = Tensor::<i64>::from_array(([batch, total], attention_mask))?;
        let positions = Tensor::<i64>::from_array(([batch, seq], position_ids))?;
        Ok([ids, mask, positions])
    }

    /// [`Self::forward`] with a preallocated cache: each key/value buffer is bound as its
    /// layer's `past_*` input and `present.*` output at once.
    fn forward_in_place(
        &mut self,
        [ids, mask, positions]: [Tensor<i64>; 3],
        keep: Option<Tensor<i64>>,
        mut cache: Cache,
        total: usize,
        heads: bool,
    ) -> Result<StepOutput> {
        let mut binding = self.session.create_binding()?;
        binding.bind_input(names::INPUT_IDS, &ids)?;
        binding.bind_input(names::ATTENTION_MASK, &mask)?;
        binding.bind_input(names::POSITION_IDS, &positions)?;
        if let Some(keep) = &keep {
            binding.bind_input(names::LOGITS_TO_KEEP, keep)?;
        }
        for (n, kv) in self.layer_names.iter().zip(cache.layers.iter_mut()) {
            binding.bind_input(n.past_key.as_str(), &kv.key)?;
            binding.bind_input(n.past_value.as_str(), &kv.value)?;
            binding.bind_output(n.present_key.as_str(), &mut kv.key)?;
            binding.bind_output(n.present_value.as_str(), &mut kv.value)?;
        }
        let host = self.session.allocator().memory_info();
        for (carried, state) in self.carried.iter().zip(&cache.states) {
            binding.bind_input(carried.past.as_str(), state)?;
            binding.bind_output_to_device(carried.present.as_str(), host)?;
        }
        binding.bind_output_to_device(names::LOGITS, host)?;
        for head in HEADS {
            if self.fetches(head, heads) {
                binding.bind_output_to_device(head, host)?;
            }
        }
        let mut outputs = self
            .session
            .run_binding(&binding)
            .context("onnxruntime run failed")?;
        let logits = logits(&outputs)?;
        let confidence_logit = head_output(&outputs, names::CONFIDENCE_LOGIT)?;
        let contrastive_embedding = head_output(&outputs, names::CONTRASTIVE_EMBEDDING)?;
        cache.states = self
            .carried
            .iter()
            .map(|s| take(&mut outputs, &s.present))
            .collect::<Result<_>>()?;
        drop(outputs);
        cache.len = total;
        Ok(StepOutput {
            logits,
            confidence_logit,
            contrastive_embedding,
            cache,
        })
    }
}

fn logits(outputs: &SessionOutputs<'_>) -> Result<Vec<f32>> {
    let (_, logits) = outputs[names::LOGITS].try_extract_tensor::<f32>()?;
    Ok(logits.to_vec())
}

/// The probe heads' outputs, which a call fetches only when asked ([`StepInputs::heads`]).
const HEADS: [&str; 2] = [names::CONFIDENCE_LOGIT, names::CONTRASTIVE_EMBEDDING];

/// The exact-length graph inputs of one call: `input_ids`, `attention_mask` and
/// `position_ids` in that order, then `cache`'s layers and other state by their names.
fn exact_length_inputs<'n>(
    layer_names: &'n [LayerCache],
    carried: &'n [CarriedState],
    [ids, mask, positions]: [Tensor<i64>; 3],
    cache: Cache,
) -> Vec<(&'n str, SessionInputValue<'static>)> {
    let mut inputs: Vec<(&str, SessionInputValue)> = Vec::with_capacity(2 * cache.layers.len() + 4);
    inputs.push((names::INPUT_IDS, ids.into()));
    inputs.push((names::ATTENTION_MASK, mask.into()));
    inputs.push((names::POSITION_IDS, positions.into()));
    for (n, kv) in layer_names.iter().zip(cache.layers) {
        inputs.push((&n.past_key, kv.key.into()));
        inputs.push((&n.past_value, kv.value.into()));
    }
    for (carried, state) in carried.iter().zip(cache.states) {
        inputs.push((&carried.past, state.into()));
    }
    inputs
}

/// A probe head's output, when the graph has the head.
fn head_output(outputs: &SessionOutputs<'_>, name: &str) -> Result<Option<Vec<f32>>> {
    match outputs.get(name) {
        Some(v) => Ok(Some(v.try_extract_tensor::<f32>()?.1.to_vec())),
        None => Ok(None),
    }
}

fn take(outputs: &mut SessionOutputs<'_>, name: &str) -> Result<DynValue> {
    outputs
        .remove(name)
        .ok_or_else(|| anyhow!("graph output {name} is missing"))
}
