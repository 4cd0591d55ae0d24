//! Queries to answers, the embeddable API:
//! `Runner::new(source, options)?.complete(&tools, query, None, 256)?`, and tool
//! retrieval with Needle 2's contrastive head: `runner.rank_tools(&tools, query)?`.

use crate::batch::generate_batch;
use crate::constrain::{CallCount, ConstraintFactory, ToolConstraint};
use crate::decode::{Decoded, GenerateOptions, Sampling, TokenFilter};
use crate::engine::Admission;
use crate::generate::generate_filtered;
use crate::load::{load, LoadOptions, LoadedModel, ModelSource};
use crate::prompt::{answers_tool_results, parse_answer, render_conversation, Turn, IM_END};
use crate::provider::{Provider, Unavailable};
use crate::python_json::PyJson;
use crate::session::NeedleSession;
use crate::step::StepInputs;
use crate::stream::{Both, TextStream};
use anyhow::{anyhow, bail, Result};
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::names::CONTRASTIVE_EMBEDDING;
use serde::Serialize;
use serde_json::Value;

/// A loaded model ready to answer.
pub struct Runner {
    model: LoadedModel,
    sampling: Sampling,
    /// Set by [`Runner::constrained`]: tool answers are decoded under the tools' grammar.
    constraints: Option<ConstraintFactory>,
    /// Set by [`Runner::streaming`]: the text is written to stderr as it is generated.
    stream: bool,
}

/// Tool mode's answer (upstream's response contract plus run statistics).
#[derive(Clone, Debug, Serialize)]
pub struct ToolResponse {
    /// `call` when the `<tool_call>` list is non-empty, `respond` otherwise.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function_calls: Vec<Value>,
    /// False when the model's `<tool_call>` block is missing or not a JSON list.
    pub success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub reasoning: String,
    pub text: String,
    pub provider: Provider,
    /// Tokens of the rendered prompt, BOS included (what the prefill ran on).
    pub prompt_tokens: usize,
    /// Tokens generated, the stop token not counted (a run that hit the cap has
    /// `--max-new-tokens` of them).
    pub generated_tokens: usize,
    #[serde(serialize_with = "one_decimal")]
    pub prefill_tps: f64,
    #[serde(serialize_with = "one_decimal")]
    pub decode_tps: f64,
    #[serde(serialize_with = "one_decimal_or_null")]
    pub peak_ram_mb: Option<f64>,
    /// `sigmoid` of the confidence head's logit over prompt + completion; `None` when
    /// the model has no confidence head.
    pub confidence: Option<f64>,
}

/// One query of a batch: its tools (a JSON list, or the text to render verbatim), the
/// request and an optional system prompt.
#[derive(Clone, Debug)]
pub struct ToolQuery {
    pub tools: Value,
    pub query: String,
    pub system: Option<String>,
}

/// Raw mode's answer.
#[derive(Clone, Debug, Serialize)]
pub struct RawResponse {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub text: String,
    pub provider: Provider,
    #[serde(serialize_with = "one_decimal")]
    pub prefill_tps: f64,
    #[serde(serialize_with = "one_decimal")]
    pub decode_tps: f64,
}

/// A rate or size as the answer prints it: one decimal (the measurement's noise is
/// larger than that), so `8877.165343562494` reads `8877.2`.
fn one_decimal<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((v * 10.0).round() / 10.0)
}

fn one_decimal_or_null<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => one_decimal(v, s),
        None => s.serialize_none(),
    }
}

impl Runner {
    /// Loads `source` on the provider `options` names (see [`LoadOptions`]).
    pub fn new(source: &ModelSource, options: &LoadOptions) -> Result<Self> {
        Ok(Runner {
            model: load(source, options)?,
            sampling: Sampling::Greedy,
            constraints: None,
            stream: false,
        })
    }

    /// Writes each answer's text to stderr as it is generated (`--stream`); the result is
    /// returned as usual.
    pub fn streaming(mut self) -> Self {
        self.stream = true;
        self
    }

    /// Decodes tool answers so they are always well-formed for the declared tools
    /// (`--constrain`, see [`crate::constrain`]).
    pub fn constrained(mut self) -> Result<Self> {
        self.constraints = Some(ConstraintFactory::new(&self.model.tokenizer)?);
        Ok(self)
    }

    /// Samples with `temperature` from a generator seeded with `seed` instead of argmax.
    pub fn with_sampling(mut self, sampling: Sampling) -> Self {
        self.sampling = sampling;
        self
    }

    /// The provider the model runs on.
    pub fn provider(&self) -> Provider {
        self.model.session.provider()
    }

    /// Providers tried before the one that registered, with onnxruntime's reasons.
    pub fn skipped(&self) -> &[Unavailable] {
        &self.model.skipped
    }

    /// Answers `query` with the tools of `tools` (a JSON list), like upstream
    /// `render_example` + greedy decoding; stops at EOS or `<|im_end|>`.
    pub fn complete(
        &mut self,
        tools: &Value,
        query: &str,
        system: Option<&str>,
        max_new_tokens: usize,
    ) -> Result<ToolResponse> {
        self.continue_conversation(tools, query, system, &[], max_new_tokens)
    }

    /// Answers the conversation that `turns` continue after `query`
    /// ([`crate::prompt::render_conversation`]), as [`Runner::complete`] answers a query.
    pub fn continue_conversation(
        &mut self,
        tools: &Value,
        query: &str,
        system: Option<&str>,
        turns: &[Turn],
        max_new_tokens: usize,
    ) -> Result<ToolResponse> {
        let ids = tool_conversation_ids(&self.model.tokenizer, tools, query, system, turns);
        let stop_ids = self.tool_stop_ids()?;
        let max_len = self.model.session.config().max_seq_len();
        let mut constraint = constraint(
            self.constraints.as_ref(),
            max_len,
            tools,
            &ids,
            answers_tool_results(turns),
            max_new_tokens,
        )?;
        let filter = constraint.as_mut().map(|c| c as &mut dyn TokenFilter);
        let run = self.run(&ids, stop_ids, max_new_tokens, filter)?;
        self.tool_response(&ids, &run)
    }

    /// Answers every query of `queries` (`--batch`), `max_rows` decoded together: each
    /// answer is the query's [`Runner::complete`] answer, but `decode_tps` is the rate of
    /// the steps its row was in and `prefill_tps` that of the prefill it joined with.
    pub fn complete_batch(
        &mut self,
        queries: &[ToolQuery],
        max_new_tokens: usize,
        max_rows: usize,
    ) -> Result<Vec<ToolResponse>> {
        let opts = GenerateOptions {
            max_new_tokens,
            stop_ids: self.tool_stop_ids()?,
            sampling: self.sampling,
        };
        let max_len = self.model.session.config().max_seq_len();
        let (tokenizer, factory) = (&self.model.tokenizer, self.constraints.as_ref());
        let mut prompts = Vec::with_capacity(queries.len());
        // Each query's prompt and grammar are made when its row joins, so a long file
        // never holds more than `max_rows` grammars.
        let runs = generate_batch(&mut self.model.session, queries.len(), max_rows, |i| {
            let q = &queries[i];
            let prompt = tool_prompt_ids(tokenizer, &q.tools, &q.query, q.system.as_deref());
            let filter = constraint(factory, max_len, &q.tools, &prompt, false, max_new_tokens)?;
            prompts.push(prompt.clone());
            Ok(Admission {
                prompt,
                opts: opts.clone(),
                filter,
            })
        })?;
        prompts
            .iter()
            .zip(&runs)
            .map(|(ids, run)| self.tool_response(ids, run))
            .collect()
    }

    fn tool_stop_ids(&self) -> Result<Vec<u32>> {
        tool_stop_ids(&self.model.tokenizer)
    }

    /// Tool mode's answer of what `run` decoded after prompt `ids`.
    fn tool_response(&mut self, ids: &[u32], run: &Decoded) -> Result<ToolResponse> {
        let answer = parse_answer(&self.model.tokenizer.decode(&run.generated_ids));
        let confidence = run_confidence(&mut self.model.session, ids, run)?;
        let (success, error) = match &answer.calls {
            Ok(_) => (true, None),
            Err(e) => (false, Some(e.clone())),
        };
        Ok(ToolResponse {
            kind: answer.kind(),
            function_calls: answer.function_calls().to_vec(),
            success,
            error,
            reasoning: answer.reasoning,
            text: answer.text,
            provider: self.provider(),
            prompt_tokens: ids.len(),
            generated_tokens: run.generated_ids.len(),
            prefill_tps: run.prefill_tps(),
            decode_tps: run.decode_tps(),
            peak_ram_mb: peak_ram_mb(),
            confidence,
        })
    }

    /// The tools ranked for `query` by the cosine similarity of the contrastive head's
    /// embeddings of the query and of each tool's [`tool_text`], best first, as
    /// `(index into tools, similarity)`; equal scores keep the catalogue's order. Fails
    /// when the model has no contrastive head.
    pub fn rank_tools(&mut self, tools: &[PyJson], query: &str) -> Result<Vec<(usize, f32)>> {
        if !self.model.session.has_contrastive_head() {
            bail!(
                "the model has no contrastive head (its heads.manifest lists none), so it \
                 cannot rank tools"
            );
        }
        let tok = &self.model.tokenizer;
        let limit = self.model.session.config().max_seq_len();
        let mut query_ids = tok.encode(query);
        if query_ids.is_empty() {
            bail!("the query has no tokens to embed");
        }
        query_ids.truncate(limit);
        let mut texts = vec![query_ids];
        texts.extend(tools.iter().map(|tool| {
            let mut ids = tok.encode(&tool_text(tool));
            ids.truncate(MAX_TOOL_TOKENS.min(limit));
            ids
        }));
        let embeddings = self.embed(&texts)?;
        let (query, tools) = embeddings.split_first().expect("the query's row");
        let mut ranked: Vec<(usize, f32)> = tools
            .iter()
            .map(|t| query.iter().zip(t).map(|(a, b)| a * b).sum())
            .enumerate()
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(ranked)
    }

    /// The `k` tools of [`Self::rank_tools`] that rank best for `query`, best first.
    pub fn top_tools(&mut self, tools: &[PyJson], query: &str, k: usize) -> Result<Vec<PyJson>> {
        let ranked = self.rank_tools(tools, query)?;
        Ok(ranked
            .iter()
            .take(k)
            .map(|&(i, _)| tools[i].clone())
            .collect())
    }

    /// The contrastive head's embedding of each token sequence, each fed whole with an
    /// empty cache, in right-padded batches (exact per row).
    fn embed(&mut self, texts: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let session = &mut self.model.session;
        // Sequences of similar length share a batch, so little of it is padding.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(EMBED_BATCH) {
            let rows: Vec<&[u32]> = chunk.iter().map(|&i| &texts[i][..]).collect();
            let step = StepInputs::right_padded(&rows, 0).with_heads();
            let cache = session.empty_cache(chunk.len())?;
            let flat = session
                .step(step, cache)?
                .contrastive_embedding
                .ok_or_else(|| anyhow!("the graph returned no {CONTRASTIVE_EMBEDDING}"))?;
            let dim = flat.len() / chunk.len();
            for (row, &i) in chunk.iter().enumerate() {
                out[i] = flat[row * dim..(row + 1) * dim].to_vec();
            }
        }
        Ok(out)
    }

    /// Continues `[BOS] + tokenize(text)` with no chat template; stops only at EOS.
    pub fn continue_raw(&mut self, text: &str, max_new_tokens: usize) -> Result<RawResponse> {
        let tok = &self.model.tokenizer;
        let ids = [vec![tok.bos_id()], tok.encode(text)].concat();
        let run = self.run(&ids, vec![tok.eos_id()], max_new_tokens, None)?;
        Ok(RawResponse {
            text: self.model.tokenizer.decode(&run.generated_ids),
            prompt_ids: ids,
            generated_ids: run.generated_ids.clone(),
            provider: self.provider(),
            prefill_tps: run.prefill_tps(),
            decode_tps: run.decode_tps(),
        })
    }

    fn run(
        &mut self,
        ids: &[u32],
        stop_ids: Vec<u32>,
        max_new_tokens: usize,
        filter: Option<&mut dyn TokenFilter>,
    ) -> Result<Decoded> {
        let opts = GenerateOptions {
            max_new_tokens,
            stop_ids,
            sampling: self.sampling,
        };
        let tokenizer = &self.model.tokenizer;
        let mut stream = self
            .stream
            .then(|| TextStream::new(tokenizer, std::io::stderr()));
        let mut both;
        let filter: Option<&mut dyn TokenFilter> = match (filter, stream.as_mut()) {
            (Some(filter), Some(stream)) => {
                both = Both(filter, stream);
                Some(&mut both)
            }
            (Some(filter), None) => Some(filter),
            (None, Some(stream)) => Some(stream),
            (None, None) => None,
        };
        let decoded = generate_filtered(&mut self.model.session, ids, &opts, filter)?;
        if let Some(stream) = stream {
            stream.finish()?;
        }
        Ok(decoded)
    }
}

/// The `--constrain` state of one answer after prompt `ids`, when constraining (`factory`);
/// with `prose` the answer may be plain text instead of calls.
fn constraint(
    factory: Option<&ConstraintFactory>,
    max_len: usize,
    tools: &Value,
    ids: &[u32],
    prose: bool,
    max_new_tokens: usize,
) -> Result<Option<ToolConstraint>> {
    let Some(factory) = factory else {
        return Ok(None);
    };
    // The answer has to close before the context is full, too.
    let budget = max_new_tokens.min(max_len.saturating_sub(ids.len()));
    factory
        .for_tools(tools, CallCount::ANY, prose, budget)
        .map(Some)
}

/// `[BOS] + tokenize(render_prompt(..))`: tool mode's prompt.
pub fn tool_prompt_ids(
    tok: &NeedleTokenizer,
    tools: &Value,
    query: &str,
    system: Option<&str>,
) -> Vec<u32> {
    tool_conversation_ids(tok, tools, query, system, &[])
}

/// `[BOS] + tokenize(render_conversation(..))`: a conversation that goes on after the
/// query (see [`crate::prompt`]).
pub fn tool_conversation_ids(
    tok: &NeedleTokenizer,
    tools: &Value,
    query: &str,
    system: Option<&str>,
    turns: &[Turn],
) -> Vec<u32> {
    let prompt = render_conversation(tools, query, system, turns);
    [vec![tok.bos_id()], tok.encode(&prompt)].concat()
}

/// A tool answer ends at EOS or `<|im_end|>`.
pub fn tool_stop_ids(tok: &NeedleTokenizer) -> Result<Vec<u32>> {
    let im_end = tok
        .token_id(IM_END)
        .ok_or_else(|| anyhow!("the tokenizer has no {IM_END} marker"))?;
    Ok(vec![tok.eos_id(), im_end])
}

/// `sigmoid` of the confidence head's logit over `ids` fed whole with an empty cache
/// (the head pools over every position at once); `None` without the head.
pub fn confidence(session: &mut NeedleSession, ids: &[u32]) -> Result<Option<f64>> {
    let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let logit = session.confidence_logit(&ids)?;
    Ok(logit.map(sigmoid))
}

/// The confidence of `run` after `prompt`: from the pools the graph carried through the
/// run where it carries them, else [`confidence`] over the prompt and the answer.
pub fn run_confidence(
    session: &mut NeedleSession,
    prompt: &[u32],
    run: &Decoded,
) -> Result<Option<f64>> {
    match run.confidence_logit {
        Some(logit) => Ok(Some(sigmoid(logit))),
        None => confidence(session, &[prompt, &run.generated_ids].concat()),
    }
}

fn sigmoid(logit: f32) -> f64 {
    1.0 / (1.0 + (-f64::from(logit)).exp())
}

/// Tool texts are cut at this many tokens before they are embedded, as upstream's
/// contrastive training data cuts them (`max_tool_len`).
pub const MAX_TOOL_TOKENS: usize = 256;

/// Rows per onnxruntime call when embedding: the logits of a batch are
/// `rows × tokens × vocab` floats.
const EMBED_BATCH: usize = 16;

/// The text of `tool` that the contrastive head embeds: `json.dumps(tool,
/// separators=(",", ":"))`, as upstream's contrastive data writes each tool
/// (`cactus-compute/needle` `dataset.py`, `_build_contrastive_arrays`), tokenized
/// without BOS like the query.
pub fn tool_text(tool: &PyJson) -> String {
    tool.dumps_compact_ascii()
}

/// Peak resident memory of this process (Linux `VmHWM`), in MB.
pub fn peak_ram_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
