//! `needle-run`: answer tool-calling queries (one, a `--batch` file, or requests to
//! `needle-run serve`) or continue raw text with a Needle 2 or Needle 3 model through
//! onnxruntime, on the execution provider chosen at startup.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use exporter::cli::spelled;
use graphs::contract::{AttentionKind, MatMulWeights, Precision};
use runner::answer::{Runner, ToolQuery};
use runner::conversation::{self, Conversation};
use runner::decode::Sampling;
use runner::graph_cache;
use runner::load::{is_onnx, load, LoadOptions, ModelSource, DEMO_TOOLS};
use runner::plan::GraphKind;
use runner::provider::{Provider, Unavailable};
use runner::python_json::{self, PyJson};
use runner::serve::auth::ApiKey;
use runner::serve::ServeOptions;
use runner::tool_list::declared_tools;
use serde_json::Value;
use std::io::{stdout, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Runs a Needle 2 or 3 tool-calling model through onnxruntime. Without --model, the
/// built-in demo model (smart-home tools) answers.
#[derive(Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    query: Args,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the model as an OpenAI-compatible chat-completions endpoint with tools
    /// (POST /v1/chat/completions, GET /v1/models[/{id}], GET /metrics, GET /health);
    /// requests are decoded
    /// together by continuous batching. SIGTERM or Ctrl-C finishes the requests in flight,
    /// then exits.
    Serve(ServeArgs),
}

/// Which model, and how to load it.
#[derive(clap::Args)]
struct ModelArgs {
    /// A Needle 2 or 3 `.cact` (exported in memory for the provider) or an `.onnx` from needle-export.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Execution provider, chosen at startup; `auto` tries TensorRT, CUDA, CoreML, then CPU.
    #[arg(long, value_parser = spelled::<Provider>(), default_value_t = Provider::Auto)]
    provider: Provider,
    /// Run on the CPU when the named provider cannot be registered (reported in the output).
    #[arg(long)]
    fallback: bool,
    /// The stock graph or the accelerator graphs (static shapes, batch 1, as
    /// `needle-export --target` writes them); default: the provider's choice (accelerator
    /// for CoreML and TensorRT, stock elsewhere; `.cact` only).
    #[arg(long, value_parser = spelled::<GraphKind>())]
    graph: Option<GraphKind>,
    /// Attention variant of the graph (default: the provider's choice; `.cact` only).
    #[arg(long, value_parser = spelled::<AttentionKind>())]
    attention: Option<AttentionKind>,
    /// Precision of the graph (default: the provider's choice; `.cact` only).
    #[arg(long, value_parser = spelled::<Precision>())]
    precision: Option<Precision>,
    /// MatMul weights (`.cact` only): `packed` (exact, the `.cact`'s codes multiplied by the
    /// Needle kernels; the CPU's default), `float` (exact, four bytes a weight; every other
    /// provider's default), `cq` (exact, the codes folded at load) or re-quantized
    /// `int8`/`int4` MatMulNBits.
    #[arg(long, value_parser = spelled::<MatMulWeights>())]
    weights: Option<MatMulWeights>,
    /// onnxruntime intra-op threads (0: onnxruntime decides).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Export a `.cact` in memory every time instead of caching the exported graph
    /// (in $NEEDLE_ONNX_CACHE, else $XDG_CACHE_HOME/needle-onnx, else ~/.cache/needle-onnx).
    #[arg(long)]
    no_cache: bool,
    /// Run the N-layer ladder rung of a Needle 3 `.cact` (2 to its depth).
    #[arg(long)]
    layers: Option<usize>,
    /// Say on stderr why each provider `auto` tried before the one it uses is unavailable.
    #[arg(long)]
    verbose: bool,
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 serves every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free port, printed on stderr).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Requests decoded together.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    max_batch: u32,
    /// Prompts remembered with their cache (0: none): a conversation that comes back
    /// (the history again, plus tool results) prefills only what it added.
    #[arg(long, default_value_t = 4)]
    prefix_cache: u32,
    /// Requests that may wait for a place in the batch; more are answered 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    queue: u32,
    /// Largest request body in bytes; larger ones are answered 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Seconds a request may take; one that is not done by then is answered 504.
    #[arg(long, default_value_t = 120.0, value_parser = positive_seconds)]
    request_timeout: f64,
    /// max_tokens of a request that does not say.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: u32,
    /// Require `Authorization: Bearer KEY` on every route but /health (401 without it);
    /// default: $NEEDLE_API_KEY, else no key.
    #[arg(long)]
    api_key: Option<String>,
}

/// A tool-calling query (or raw text) to answer.
#[derive(clap::Args)]
struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Tool list: a JSON array of tools in Needle's flat form (`{"name", "description",
    /// "parameters"}`) or OpenAI's (`{"type": "function", "function": {…}}`); default: the
    /// demo model's tools.json.
    #[arg(long)]
    tools: Option<PathBuf>,
    /// The user's request (tool mode).
    #[arg(long, conflicts_with = "raw")]
    query: Option<String>,
    /// Optional system prompt (tool mode).
    #[arg(long, conflicts_with = "raw")]
    system: Option<String>,
    /// Continue a conversation (tool mode): a JSON file with OpenAI's `messages` list (the
    /// user's query, the assistant's `tool_calls`, `tool` results, later user messages),
    /// rendered as `needle-run serve` renders it; answers its last turn.
    #[arg(long, conflicts_with_all = ["query", "system", "raw", "batch", "top_tools"])]
    messages: Option<PathBuf>,
    /// Answer every query of this file, --batch-size decoded together (tool mode):
    /// one JSON object a line, `{"query": …, "tools": […], "system": …}` (`tools` and
    /// `system` optional; `tools` defaults to --tools); one answer a line, in order.
    #[arg(long, conflicts_with_all = ["query", "raw", "stream"])]
    batch: Option<PathBuf>,
    /// Rows decoded together with --batch; a row that is done makes room for the next query.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..), requires = "batch")]
    batch_size: u32,
    /// Write the answer's text to stderr as it is generated; the result still goes to stdout.
    #[arg(long)]
    stream: bool,
    /// Decode the answer under the tools' grammar (tool mode): always a `<tool_call>` list
    /// of declared tools whose arguments satisfy their JSON schemas.
    #[arg(long, conflicts_with = "raw")]
    constrain: bool,
    /// Rank the tools by the model's contrastive head (Needle 2 with the head) against the
    /// query and render only the best K in the prompt, best first (tool mode).
    #[arg(long, conflicts_with_all = ["raw", "batch"], value_parser = clap::value_parser!(u32).range(1..))]
    top_tools: Option<u32>,
    /// Continue this text with no chat template (raw mode).
    #[arg(long)]
    raw: Option<String>,
    /// Print raw mode's result as JSON (tool mode always prints JSON).
    #[arg(long)]
    json: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_new_tokens: u32,
    /// Sample with this temperature (a positive number) instead of greedy argmax.
    #[arg(long, value_parser = positive_temperature)]
    temperature: Option<f32>,
    /// Seed of the sampler (needs --temperature; default 0).
    #[arg(long, requires = "temperature")]
    seed: Option<u64>,
}

/// A temperature that sampling can use: finite and above zero (0 would be greedy, which
/// is what leaving the option out means).
fn positive_temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(t) if t.is_finite() && t > 0.0 => Ok(t),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// Seconds of a timeout: finite and above zero.
fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 => Ok(t),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Serve(args)) => serve(args),
        None => run(cli.query),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("needle-run: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

impl ModelArgs {
    /// Whether to say why a provider was unavailable: with `--verbose`, or when the user
    /// named the provider (`--fallback` ran another).
    fn reasons(&self) -> bool {
        self.verbose || self.provider != Provider::Auto
    }

    /// The model to load and how.
    fn load(&self) -> Result<(ModelSource, LoadOptions)> {
        if let (Some(model), Some(_)) = (&self.model, self.weights) {
            if is_onnx(model) {
                bail!(
                    "{}: --weights picks how a .cact is exported; an exported graph keeps the \
                     weights it was exported with (needle-export --weights)",
                    model.display()
                );
            }
        }
        let source = self
            .model
            .clone()
            .map_or(ModelSource::Demo, ModelSource::Path);
        let options = LoadOptions {
            provider: self.provider,
            fallback: self.fallback,
            graph: self.graph,
            attention: self.attention,
            precision: self.precision,
            matmul_weights: self.weights,
            threads: self.threads,
            remove_extra_whitespaces: true,
            layers: self.layers,
            cache: (!self.no_cache).then(graph_cache::default_dir).flatten(),
        };
        Ok((source, options))
    }
}

/// Says on stderr which provider runs the model when others were tried first: one short
/// line, with onnxruntime's reason for each when `verbose` ([`ModelArgs::reasons`]).
fn report_skipped(provider: Provider, skipped: &[Unavailable], verbose: bool) {
    if skipped.is_empty() {
        return;
    }
    let skipped: Vec<String> = skipped
        .iter()
        .map(|s| match verbose {
            true => format!("{} ({})", s.provider, s.reason),
            false => s.provider.to_string(),
        })
        .collect();
    let why = if verbose { "" } else { " (--verbose says why)" };
    eprintln!(
        "needle-run: using {provider}; unavailable: {}{why}",
        skipped.join(if verbose { "; " } else { ", " })
    );
}

fn serve(args: ServeArgs) -> Result<()> {
    let (source, options) = args.model.load()?;
    let name = match &args.model.model {
        Some(path) => path
            .file_stem()
            .map_or("needle".into(), |s| s.to_string_lossy().into_owned()),
        None => "needle-demo".to_string(),
    };
    let model = load(&source, &options)?;
    report_skipped(
        model.session.provider(),
        &model.skipped,
        args.model.reasons(),
    );
    let api_key = match args
        .api_key
        .or_else(|| std::env::var("NEEDLE_API_KEY").ok())
    {
        None => None,
        Some(key) => Some(
            ApiKey::new(&key)
                .context("the API key (--api-key or NEEDLE_API_KEY) must not be empty")?,
        ),
    };
    let opts = ServeOptions {
        addr: SocketAddr::new(args.host, args.port),
        api_key,
        model_name: name,
        max_batch: args.max_batch as usize,
        prefix_cache: args.prefix_cache as usize,
        queue: args.queue as usize,
        max_body: args.max_body,
        timeout: Duration::from_secs_f64(args.request_timeout),
        default_max_tokens: args.max_tokens as usize,
    };
    runner::serve::serve(model, &opts)
}

fn run(args: Args) -> Result<()> {
    if args.raw.is_none()
        && args.batch.is_none()
        && args.messages.is_none()
        && args.query.as_deref().is_none_or(|q| q.trim().is_empty())
    {
        bail!("give --query \"...\" or --messages FILE (tool mode), --batch FILE or --raw \"...\" (raw mode), or use needle-run serve; the query must not be empty");
    }
    let tools = match &args.tools {
        Some(path) => read_tools(path)?,
        None => match python_json::loads(DEMO_TOOLS) {
            Ok(PyJson::Array(list)) => list,
            _ => bail!("the built-in tools.json is not a JSON array"),
        },
    };
    let (source, options) = args.model.load()?;
    let mut runner = Runner::new(&source, &options)?;
    if args.constrain {
        runner = runner.constrained()?;
    }
    if args.stream {
        runner = runner.streaming();
    }
    if let Some(t) = args.temperature {
        runner = runner.with_sampling(Sampling::Temperature {
            temperature: t,
            seed: args.seed.unwrap_or(0),
        });
    }
    report_skipped(runner.provider(), runner.skipped(), args.model.reasons());
    let max_new = args.max_new_tokens as usize;
    if let Some(path) = &args.batch {
        let default_tools = Value::String(PyJson::Array(tools).dumps_compact());
        let queries = read_batch(path, &default_tools)?;
        let mut out = stdout().lock();
        for answer in runner.complete_batch(&queries, max_new, args.batch_size as usize)? {
            writeln!(out, "{}", serde_json::to_string(&answer)?)?;
        }
    } else if let Some(text) = &args.raw {
        let r = runner.continue_raw(text, max_new)?;
        if args.json {
            writeln!(stdout(), "{}", serde_json::to_string(&r)?)?;
        } else {
            writeln!(stdout(), "{}", r.text)?;
        }
    } else if let Some(path) = &args.messages {
        let conversation = read_messages(path)?;
        let r = runner.continue_conversation(
            &Value::String(PyJson::Array(tools).dumps_compact()),
            &conversation.query,
            conversation.system.as_deref(),
            &conversation.turns,
            max_new,
        )?;
        writeln!(stdout(), "{}", serde_json::to_string(&r)?)?;
    } else {
        let query = args.query.as_deref().unwrap_or_default();
        let tools = match args.top_tools {
            Some(k) => runner.top_tools(&tools, query, k as usize)?,
            None => tools,
        };
        // The text upstream writes into the prompt (a JSON string is used verbatim), so
        // that integers beyond 64 bits and `Infinity` survive.
        let tools = Value::String(PyJson::Array(tools).dumps_compact());
        let r = runner.complete(&tools, query, args.system.as_deref(), max_new)?;
        writeln!(stdout(), "{}", serde_json::to_string(&r)?)?;
    }
    Ok(())
}

/// Reads `--batch`'s queries, one JSON object a line (blank lines skipped); a line
/// without `tools` gets `default_tools`.
fn read_batch(path: &PathBuf, default_tools: &Value) -> Result<Vec<ToolQuery>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let mut queries = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{}:{}", path.display(), i + 1);
        let row: Value = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("{}: not a JSON object: {e}", at()))?;
        let text_field = |key: &str| match row.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(anyhow::anyhow!("{}: \"{key}\" is not a string", at())),
        };
        let query = text_field("query")?
            .filter(|q| !q.trim().is_empty())
            .ok_or_else(|| anyhow::anyhow!("{}: no \"query\" string", at()))?;
        let tools = match row.get("tools") {
            None | Some(Value::Null) => default_tools.clone(),
            Some(Value::Array(list)) => {
                Value::Array(declared_tools(list).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?)
            }
            Some(_) => bail!("{}: \"tools\" is not a JSON array", at()),
        };
        queries.push(ToolQuery {
            tools,
            query,
            system: text_field("system")?,
        });
    }
    if queries.is_empty() {
        bail!("{}: no queries", path.display());
    }
    Ok(queries)
}

/// `--messages`' conversation: OpenAI's `messages` list (or an object holding it, as a
/// chat request does), read as `needle-run serve` reads it.
fn read_messages(path: &PathBuf) -> Result<Conversation> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let list = match &value {
        Value::Array(list) => list,
        Value::Object(o) => match o.get("messages") {
            Some(Value::Array(list)) => list,
            _ => bail!("{}: an object without a \"messages\" list", path.display()),
        },
        _ => bail!("{}: not a list of messages", path.display()),
    };
    conversation::read(list).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Reads a tool list as Python's `json.loads` reads it: a JSON array of tools in Needle's
/// flat form or OpenAI's, as `serve` takes them ([`declared_tools`]).
fn read_tools(path: &PathBuf) -> Result<Vec<PyJson>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let tools = python_json::loads(&text)
        .map_err(|e| anyhow::anyhow!("{}: not valid JSON: {e}", path.display()))?;
    let PyJson::Array(list) = tools else {
        bail!("{}: the tool list must be a JSON array", path.display());
    };
    declared_tools(&list).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}
