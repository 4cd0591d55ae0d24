//! One Needle graph loaded in onnxruntime: geometry from its metadata, and a
//! `forward` that threads the `past_*` state through the graph's `present_*` outputs.

use crate::provider::{self, Provider, Registered};
use anyhow::{anyhow, bail, Context, Result};
use exporter::export::{attention_name, keys, precision_name};
use graphs::builder::Precision;
use graphs::needle::model::{kv_names, present_name, PAST_INPUT_IDS, PRESENT_INPUT_IDS};
use graphs::needle::{AttentionKind, Config};
use ort::session::{Session, SessionInputValue};
use ort::value::TensorElementType;
use ort::value::{DynTensor, DynValue, Tensor};

/// The state carried between steps: every `past_*` input, by name, and its length.
pub struct Cache {
    values: Vec<(String, DynValue)>,
    len: usize,
    /// `Some(tokens)`: the key/value tensors are buffers of that many positions, bound as
    /// both `past_*` and `present.*` so attention appends in place (see
    /// [`NeedleSession::preallocated_cache`]); `None`: exact-length tensors, replaced each step.
    capacity: Option<usize>,
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

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A loaded Needle graph and what its metadata says about it.
pub struct NeedleSession {
    session: Session,
    pub config: Config,
    pub attention: AttentionKind,
    pub precision: Precision,
    /// The provider that actually runs it (never `Auto`).
    pub provider: Provider,
    /// Every `metadata_props` entry of the graph.
    pub metadata: std::collections::HashMap<String, String>,
}

/// Output of one step.
pub struct StepOutput {
    /// `[batch, sequence, vocab]`, row-major.
    pub logits: Vec<f32>,
    pub cache: Cache,
}

impl NeedleSession {
    /// Loads graph bytes with `provider` (see [`provider::session_builder`]).
    pub fn from_memory(onnx: &[u8], mut registered: Registered) -> Result<Self> {
        let provider = registered.provider;
        let session = registered
            .builder
            .commit_from_memory(onnx)
            .map_err(|e| anyhow!("{e}"))?;
        Self::wrap(session, provider)
    }

    /// Loads an `.onnx` written by `needle-export`.
    pub fn from_file(path: &std::path::Path, mut registered: Registered) -> Result<Self> {
        let provider = registered.provider;
        let session = registered
            .builder
            .commit_from_file(path)
            .map_err(|e| anyhow!("{}: cannot load: {e}", path.display()))?;
        Self::wrap(session, provider)
    }

    /// Creates a session for `onnx` on `provider` with `threads` intra-op threads.
    pub fn create(onnx: &[u8], provider: Provider, fallback: bool, threads: usize) -> Result<Self> {
        let env = crate::ort_env::init()?;
        let registered = provider::session_builder(env, provider, fallback, threads)?;
        Self::from_memory(onnx, registered)
    }

    fn wrap(session: Session, provider: Provider) -> Result<Self> {
        let meta = session.metadata().map_err(|e| anyhow!("{e}"))?;
        let get = |k: &str| meta.custom(k);
        let config =
            Config::from_metadata(get).map_err(|e| anyhow!("not a needle-export graph: {e}"))?;
        let named = |key: &str, value: Option<String>| {
            anyhow!("not a needle-export graph: metadata {key} is {value:?}")
        };
        let attention = get(keys::ATTENTION);
        let attention = [AttentionKind::Fused, AttentionKind::Reference]
            .into_iter()
            .find(|k| attention.as_deref() == Some(attention_name(*k)))
            .ok_or_else(|| named(keys::ATTENTION, attention.clone()))?;
        let precision = get(keys::PRECISION);
        let precision = [Precision::Fp32, Precision::Fp16]
            .into_iter()
            .find(|p| precision.as_deref() == Some(precision_name(*p)))
            .ok_or_else(|| named(keys::PRECISION, precision.clone()))?;
        let metadata = meta
            .custom_keys()
            .map_err(|e| anyhow!("{e}"))?
            .into_iter()
            .filter_map(|k| get(&k).map(|v| (k, v)))
            .collect();
        drop(meta);
        let s = NeedleSession {
            session,
            config,
            attention,
            precision,
            provider,
            metadata,
        };
        s.check_interface()?;
        Ok(s)
    }

    fn check_interface(&self) -> Result<()> {
        let inputs: Vec<&str> = self.session.inputs().iter().map(|i| i.name()).collect();
        let mut wanted = vec![
            "input_ids".to_string(),
            "attention_mask".into(),
            PAST_INPUT_IDS.into(),
        ];
        for i in 0..self.config.num_layers {
            let [k, v, _, _] = kv_names(i);
            wanted.extend([k, v]);
        }
        for w in &wanted {
            if !inputs.contains(&w.as_str()) {
                bail!("not a needle-export graph: input {w} is missing");
            }
        }
        Ok(())
    }

    /// The empty state for `batch` rows (`past_sequence = 0`).
    pub fn empty_cache(&self, batch: usize) -> Result<Cache> {
        self.new_cache(batch, None)
    }

    /// An empty state whose key/value tensors are preallocated for `capacity` tokens, when
    /// this session can update them in place: a fused graph on the CPU whose metadata says
    /// it takes such buffers (older exports read the past length off the cache's shape).
    /// onnxruntime's `GroupQueryAttention` then writes only the new positions (it shares
    /// the buffers when `past` and `present` are the same memory) instead of copying the
    /// whole cache into a new `present` every step — most of a step's time after a
    /// thousand tokens. Other sessions get [`Self::empty_cache`].
    pub fn preallocated_cache(&self, batch: usize, capacity: usize) -> Result<Cache> {
        let shares = self
            .metadata
            .get(keys::PAST_PRESENT_SHARE_BUFFER)
            .is_some_and(|v| v.starts_with("true"));
        if !shares || self.attention != AttentionKind::Fused || self.provider != Provider::Cpu {
            return self.empty_cache(batch);
        }
        self.new_cache(batch, Some(capacity.min(self.config.max_seq_len)))
    }

    /// No tokens seen yet; key/value tensors of `capacity` positions, or of none.
    fn new_cache(&self, batch: usize, capacity: Option<usize>) -> Result<Cache> {
        let c = &self.config;
        let float = match self.precision {
            Precision::Fp32 => TensorElementType::Float32,
            Precision::Fp16 => TensorElementType::Float16,
        };
        let shape = [batch, c.num_kv_heads, capacity.unwrap_or(0), c.head_dim];
        let alloc = self.session.allocator();
        let mut values = Vec::new();
        for i in 0..c.num_layers {
            let [k, v, _, _] = kv_names(i);
            for name in [k, v] {
                values.push((name, DynTensor::new(alloc, float, shape)?.into_dyn()));
            }
        }
        let ids = Tensor::<i64>::from_array(([batch, 0usize], Vec::<i64>::new()))?;
        values.push((PAST_INPUT_IDS.to_string(), ids.into_dyn()));
        Ok(Cache {
            values,
            len: 0,
            capacity,
        })
    }

    /// Runs `input_ids` (`[batch, sequence]`, row-major) after `cache`; every token is real
    /// (all-ones attention mask).
    pub fn forward(&mut self, input_ids: &[i64], batch: usize, cache: Cache) -> Result<StepOutput> {
        if batch == 0 || !input_ids.len().is_multiple_of(batch) {
            bail!(
                "input_ids of length {} do not split into {batch} rows",
                input_ids.len()
            );
        }
        let seq = input_ids.len() / batch;
        let total = cache.len + seq;
        match cache.capacity {
            Some(capacity) if total > capacity => {
                bail!("sequence of {total} tokens exceeds the preallocated cache's {capacity}")
            }
            _ if total > self.config.max_seq_len => bail!(
                "sequence of {total} tokens exceeds the model's max_seq_len {}",
                self.config.max_seq_len
            ),
            _ => {}
        }
        let ids = Tensor::<i64>::from_array(([batch, seq], input_ids.to_vec()))?;
        let mask = Tensor::<i64>::from_array(([batch, total], vec![1i64; batch * total]))?;
        if cache.capacity.is_some() {
            return self.forward_in_place(ids, mask, cache, total);
        }
        let mut inputs: Vec<(String, SessionInputValue)> =
            Vec::with_capacity(cache.values.len() + 2);
        inputs.push(("input_ids".into(), ids.into()));
        inputs.push(("attention_mask".into(), mask.into()));
        for (name, value) in cache.values {
            inputs.push((name, value.into()));
        }
        let mut outputs = self.session.run(inputs).context("onnxruntime run failed")?;
        let (_, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
        let logits = logits.to_vec();
        let mut values = Vec::with_capacity(2 * self.config.num_layers + 1);
        for i in 0..self.config.num_layers {
            let [pk, pv, k, v] = kv_names(i);
            values.push((pk, take(&mut outputs, &k)?));
            values.push((pv, take(&mut outputs, &v)?));
        }
        values.push((
            PAST_INPUT_IDS.to_string(),
            take(&mut outputs, PRESENT_INPUT_IDS)?,
        ));
        Ok(StepOutput {
            logits,
            cache: Cache {
                values,
                len: total,
                capacity: None,
            },
        })
    }

    /// [`Self::forward`] with a preallocated cache: each key/value buffer is bound as its
    /// layer's `past_*` input and `present.*` output at once.
    fn forward_in_place(
        &mut self,
        ids: Tensor<i64>,
        mask: Tensor<i64>,
        mut cache: Cache,
        total: usize,
    ) -> Result<StepOutput> {
        let mut binding = self.session.create_binding()?;
        binding.bind_input("input_ids", &ids)?;
        binding.bind_input("attention_mask", &mask)?;
        for (name, value) in cache.values.iter_mut() {
            binding.bind_input(name.as_str(), &*value)?;
            if let Some(present) = present_name(name) {
                binding.bind_output(present, &mut *value)?;
            }
        }
        let host = self.session.allocator().memory_info();
        binding.bind_output_to_device("logits", host)?;
        binding.bind_output_to_device(PRESENT_INPUT_IDS, host)?;
        let mut outputs = self
            .session
            .run_binding(&binding)
            .context("onnxruntime run failed")?;
        let (_, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
        let logits = logits.to_vec();
        let history = take(&mut outputs, PRESENT_INPUT_IDS)?;
        drop(outputs);
        for (name, value) in cache.values.iter_mut() {
            if name == PAST_INPUT_IDS {
                *value = history;
                break;
            }
        }
        cache.len = total;
        Ok(StepOutput { logits, cache })
    }
}

fn take(outputs: &mut ort::session::SessionOutputs<'_>, name: &str) -> Result<DynValue> {
    outputs
        .remove(name)
        .ok_or_else(|| anyhow!("graph output {name} is missing"))
}
