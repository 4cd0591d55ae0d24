//! `needle-bench`: the exported graphs against upstream JAX, on CPU, in one run.
//!
//! ```text
//! needle-bench              full-size model (target/bench/needle-base.cact, made on first use)
//! needle-bench --needle3    full-size Needle 3 (target/bench/needle3-full.cact, made on first use)
//! needle-bench --shipped    full-size Needle 2 as published: 2-bit, kv_window 256
//!                           (target/bench/needle-shipped.cact, made on first use)
//! needle-bench --quick      smoke run on tests/fixtures/m64.cact: small sizes, one iteration, no JAX
//! needle-bench --peer-only  only the whole-process comparison with needle-rs
//! needle-bench --profile    onnxruntime profile of decode steps of the --variants graphs
//! needle-bench --mask       what --constrain's mask costs a token, against a decode step
//! needle-bench --serve      load test of needle-run serve (the demo model unless --model)
//! ```
//!
//! Every configuration (attention variant × thread count) runs in a child process of this
//! binary (`--one VARIANT THREADS`), so its peak RSS is its own; upstream JAX runs in
//! `bench/jax_bench.py`. The parent prints one markdown table, then the peer section
//! (`peer.rs`): needle-rs and needle-run as whole processes (needle-run and needle-export
//! are taken from beside this binary: build them with it).

mod mask;
mod measure;
mod peer;
mod profile;
mod serve_load;
mod table;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use exporter::cact::generation_of;
use graphs::contract::{
    parse_spelled, AttentionKind, Generation, MatMulWeights, Precision, RuntimeTarget, Spelled,
};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Measures export, session creation, prefill and decode of the ONNX graphs against upstream JAX.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The `.cact` to measure. Default: target/bench/needle-base.cact (written by
    /// bench/make_full_model.py when missing), or tests/fixtures/m64.cact with --quick.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Default to Needle 3: target/bench/needle3-full.cact (written by
    /// bench/make_full_needle3.py when missing), or tests/fixtures/needle3/n3a.cact with --quick.
    #[arg(long, conflicts_with = "model")]
    needle3: bool,
    /// Default to the full-size Needle 2 with the published file's 2-bit weights and
    /// 256-token window: target/bench/needle-shipped.cact (bench/make_full_model.py --shipped).
    #[arg(long, conflicts_with_all = ["model", "needle3", "quick"])]
    shipped: bool,
    /// Smoke run: small sizes, one iteration, no JAX unless --jax.
    #[arg(long)]
    quick: bool,
    /// Only the whole-process comparison with needle-rs.
    #[arg(long, conflicts_with = "no_peer")]
    peer_only: bool,
    /// Skip the whole-process comparison with needle-rs.
    #[arg(long)]
    no_peer: bool,
    /// Tokens the peer comparison's long answer generates (default 64, 8 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    peer_tokens: Option<u32>,
    /// Run upstream JAX even with --quick.
    #[arg(long, conflicts_with = "no_jax")]
    jax: bool,
    /// Skip upstream JAX (its columns show "—").
    #[arg(long)]
    no_jax: bool,
    /// Intra-op thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Graphs to measure: `fused` or `reference`, optionally with `-int8`/`-int4` MatMul
    /// weights and `@1.20` for the graph written for onnxruntime 1.20–1.23.
    #[arg(long, value_delimiter = ',', default_value = "fused,reference")]
    variants: Vec<String>,
    /// Measure what --constrain's mask costs a token against a decode step instead.
    #[arg(long)]
    mask: bool,
    /// Profile decode steps of each --variants graph instead (for each --threads value).
    #[arg(long)]
    profile: bool,
    /// Load-test needle-run serve instead: 1, 8 and 32 concurrent clients (and 32 against
    /// --max-batch 1) sending the demo's held-out queries; the demo model unless --model
    /// or --shipped.
    #[arg(long, conflicts_with_all = ["needle3", "peer_only", "mask", "profile"])]
    serve: bool,
    /// Requests per --serve level (default 64, 16 with --quick).
    #[arg(long, requires = "serve", value_parser = clap::value_parser!(u32).range(1..))]
    requests: Option<u32>,
    /// Tools each --serve query carries (default: all of its tools): the full-size models'
    /// synthetic tokenizer spends ~2 characters a token, so a whole list is ~1,900 tokens.
    #[arg(long, requires = "serve", value_parser = clap::value_parser!(u32).range(1..))]
    tools_per_query: Option<u32>,
    /// Child mode: measure one configuration and print it as JSON.
    #[arg(long, num_args = 2, value_names = ["VARIANT", "THREADS"], hide = true)]
    one: Option<Vec<String>>,
}

/// One measured graph: the attention core, how the large MatMuls store their weights and
/// the onnxruntime releases it is written for (always fp32).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Variant {
    pub attention: AttentionKind,
    pub weights: MatMulWeights,
    pub runtime: RuntimeTarget,
}

impl Variant {
    /// `fused`, `reference`, `fused-int4`, `fused@1.20`, … (the contract's spellings).
    pub fn name(self) -> String {
        let mut name = self.attention.to_string();
        if self.weights != MatMulWeights::Float {
            name.push_str(&format!("-{}", self.weights));
        }
        if self.runtime != RuntimeTarget::Since1_24 {
            name.push_str(&format!("@{}", self.runtime));
        }
        name
    }

    fn parse(s: &str) -> Result<Variant> {
        let (graph, runtime) = s
            .split_once('@')
            .unwrap_or((s, RuntimeTarget::Since1_24.name()));
        let (attention, weights) = graph
            .split_once('-')
            .unwrap_or((graph, MatMulWeights::Float.name()));
        Ok(Variant {
            attention: parse_spelled(attention).map_err(|e| anyhow!("{e}"))?,
            weights: parse_spelled(weights).map_err(|e| anyhow!("{e}"))?,
            runtime: parse_spelled(runtime).map_err(|e| anyhow!("{e}"))?,
        })
    }

    /// The graph variant exported for it.
    pub fn graph(self) -> graphs::contract::Variant {
        graphs::contract::Variant {
            attention: self.attention,
            precision: Precision::Fp32,
            matmul_weights: self.weights,
            runtime: self.runtime,
        }
    }
}

/// The sizes one run measures.
#[derive(Clone, Debug)]
pub struct Plan {
    pub prefill: Vec<usize>,
    pub decode_past: Vec<usize>,
    /// Timed one-token steps per decode figure (after one untimed warm-up step).
    pub steps: usize,
    /// Prefill repetitions after one warm-up run; the best is kept.
    pub reps: usize,
    /// Size of the memcpy buffers and best-of count of the bandwidth measurement.
    pub copy_bytes: usize,
    pub copy_reps: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                prefill: vec![8, 32],
                decode_past: vec![8, 32],
                steps: 2,
                reps: 1,
                copy_bytes: 64 << 20,
                copy_reps: 3,
            }
        } else {
            Plan {
                prefill: vec![32, 256, 1024],
                decode_past: vec![64, 1024],
                steps: 32,
                reps: 3,
                copy_bytes: 1 << 30,
                copy_reps: 5,
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    // Not a clap option: everything after it belongs to the timed program.
    let args: Vec<_> = std::env::args_os().collect();
    let result = match args.get(1) {
        Some(first) if first == peer::TIMED => peer::timed_process(&args[2..]),
        _ => run(Args::parse()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("needle-bench: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let plan = Plan::new(args.quick);
    let root = workspace_root();
    let model = match &args.model {
        Some(m) => m.clone(),
        None if args.needle3 && args.quick => root.join("tests/fixtures/needle3/n3a.cact"),
        None if args.needle3 => root.join("target/bench/needle3-full.cact"),
        None if args.shipped => root.join("target/bench/needle-shipped.cact"),
        None if args.quick => root.join("tests/fixtures/m64.cact"),
        None => root.join("target/bench/needle-base.cact"),
    };
    let variants = args
        .variants
        .iter()
        .map(|v| Variant::parse(v))
        .collect::<Result<Vec<_>>>()?;
    if let Some(one) = &args.one {
        let variant = Variant::parse(&one[0])?;
        let threads: usize = one[1]
            .parse()
            .with_context(|| format!("thread count {:?}", one[1]))?;
        let m = measure::one_config(&model, variant, threads, &plan)?;
        println!("{}", serde_json::to_string(&m)?);
        return Ok(());
    }
    if args.serve {
        let text = std::fs::read_to_string(root.join("runner/demo/eval.jsonl"))?;
        let queries = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<Vec<serde_json::Value>, _>>()?;
        let queries: Vec<serde_json::Value> = match args.tools_per_query {
            Some(n) => queries
                .into_iter()
                .map(|mut q| {
                    if let Some(tools) = q["tools"].as_array_mut() {
                        tools.truncate(n as usize);
                    }
                    q
                })
                .collect(),
            None => queries,
        };
        let plan = serve_load::LoadPlan {
            clients: vec![1, 8, 32],
            requests: args
                .requests
                .map_or(if args.quick { 16 } else { 64 }, |n| n as usize),
            time_cap: std::time::Duration::from_secs(if args.quick { 20 } else { 180 }),
            max_tokens: if args.quick { 16 } else { 64 },
            threads: args.threads.first().copied().unwrap_or(1),
        };
        let bin = std::env::current_exe()?
            .parent()
            .context("needle-bench has no folder")?
            .to_path_buf();
        // The demo model unless a model is named (or --shipped).
        let served = match (&args.model, args.shipped) {
            (Some(m), _) => Some(m.clone()),
            (None, true) => {
                if !model.exists() {
                    make_full_model(&root, &model, true)?;
                }
                Some(model.clone())
            }
            (None, false) => None,
        };
        print!(
            "{}",
            serve_load::run(&bin, served.as_deref(), &queries, &plan)?
        );
        return Ok(());
    }
    if !model.exists() {
        if args.needle3 {
            make_full_needle3(&root, &model)?;
        } else {
            make_full_model(&root, &model, args.shipped)?;
        }
    }
    let peer_plan = peer::PeerPlan::new(
        args.quick,
        &args.threads,
        args.peer_tokens.map(|n| n as usize),
    );
    if args.peer_only {
        print!("{}", peer::run(&root, &model, &peer_plan)?);
        return Ok(());
    }
    if args.mask {
        for &threads in &args.threads {
            print!("{}", mask::run(&model, threads)?);
        }
        return Ok(());
    }
    if args.profile {
        for &threads in &args.threads {
            for &variant in &variants {
                let dir = root.join("target/bench/profile");
                profile::run(&model, variant, threads, &plan, &dir)?;
            }
        }
        return Ok(());
    }

    let load_before = loadavg();
    let mut ours = Vec::new();
    for &threads in &args.threads {
        for &variant in &variants {
            eprintln!("needle-bench: {} with {threads} thread(s)", variant.name());
            let cpu = measure::CpuShare::start();
            let mut m = child_config(&model, variant, threads, args.quick)?;
            m.others_cores = cpu.others_cores();
            ours.push(m);
        }
    }
    eprintln!("needle-bench: memory bandwidth");
    let weight_bytes = ours
        .iter()
        .map(|m| m.weight_bytes_per_token)
        .max()
        .unwrap_or(0);
    let bandwidth: Vec<measure::Bandwidth> = args
        .threads
        .iter()
        .map(|&t| {
            let cpu = measure::CpuShare::start();
            let mut b = measure::bandwidth(t, &plan, weight_bytes);
            b.others_cores = cpu.others_cores();
            b
        })
        .collect();
    let mut run_jax = !args.no_jax && (!args.quick || args.jax);
    let mut notes = Vec::new();
    if run_jax && generation(&model)? == Generation::Needle3 {
        // Upstream's cached decode (needle/model/decode.py) is gone from cactus-needle 3.x.
        notes.push("Upstream JAX: not run: cactus-needle 3.x has no cached decode (decode.py was removed), so it has no decode step to time.".to_string());
        run_jax = false;
    }
    let mut jax = Vec::new();
    if run_jax {
        for &threads in &args.threads {
            eprintln!("needle-bench: upstream JAX with {threads} thread(s)");
            let cpu = measure::CpuShare::start();
            let mut j = measure::jax(&root, &model, threads, &plan)?;
            j.others_cores = cpu.others_cores();
            jax.push(j);
        }
    }
    let load_after = loadavg();

    let report = table::Report {
        model: &model,
        cact_bytes: std::fs::metadata(&model)?.len(),
        plan: &plan,
        threads: &args.threads,
        variants: &variants.iter().map(|v| v.name()).collect::<Vec<_>>(),
        ours: &ours,
        jax: &jax,
        bandwidth: &bandwidth,
        load: (load_before, load_after),
    };
    print!("{}", report.render());
    for n in &notes {
        println!("{n}");
    }
    if !args.no_peer {
        print!("{}", peer::run(&root, &model, &peer_plan)?);
    }
    Ok(())
}

/// The generation the `.cact`'s first word names.
fn generation(model: &Path) -> Result<Generation> {
    let mut tag = [0u8; 4];
    std::fs::File::open(model)
        .and_then(|mut f| f.read_exact(&mut tag))
        .with_context(|| format!("cannot read {}", model.display()))?;
    generation_of(u32::from_le_bytes(tag)).with_context(|| format!("{}", model.display()))
}

/// Runs `needle-bench --one` in a child process and reads its JSON line.
fn child_config(
    model: &Path,
    variant: Variant,
    threads: usize,
    quick: bool,
) -> Result<measure::Config> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--model")
        .arg(model)
        .arg("--one")
        .arg(variant.name())
        .arg(threads.to_string());
    if quick {
        cmd.arg("--quick");
    }
    measure::last_json_line(&mut cmd, "needle-bench --one")
}

/// Writes the full-size model with the upstream package (`bench/make_full_model.py`).
fn make_full_model(root: &Path, model: &Path, shipped: bool) -> Result<()> {
    create_parent(model)?;
    eprintln!(
        "needle-bench: writing {} with upstream write_export",
        model.display()
    );
    let status = Command::new(root.join(".venv/bin/python"))
        .arg(root.join("bench/make_full_model.py"))
        .arg(model)
        .args(shipped.then_some("--shipped"))
        .env("NEEDLE_TELEMETRY", "0")
        .status()
        .context("cannot run .venv/bin/python (run scripts/setup-tests)")?;
    if !status.success() {
        bail!("bench/make_full_model.py failed ({status})");
    }
    Ok(())
}

/// Writes the full-size Needle 3 with upstream cactus-needle 3.2.8
/// (`bench/make_full_needle3.py`), in `.venv-needle3` (made from requirements-needle3.txt
/// when missing; scripts/setup-tests does not make it).
fn make_full_needle3(root: &Path, model: &Path) -> Result<()> {
    create_parent(model)?;
    let venv = root.join(".venv-needle3");
    let python = venv.join("bin/python");
    if !python.exists() {
        eprintln!(
            "needle-bench: creating {} from requirements-needle3.txt",
            venv.display()
        );
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("cannot run python3 -m venv")?;
        let installed = made.success()
            && Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "-r"])
                .arg(root.join("requirements-needle3.txt"))
                .status()
                .context("cannot run pip in .venv-needle3")?
                .success();
        if !installed {
            bail!(
                "cannot create {} from requirements-needle3.txt",
                venv.display()
            );
        }
    }
    eprintln!(
        "needle-bench: writing {} with upstream cactus-needle 3.2.8 write_export",
        model.display()
    );
    let status = Command::new(&python)
        .arg(root.join("bench/make_full_needle3.py"))
        .arg(model)
        .env("NEEDLE_TELEMETRY", "0")
        .status()
        .context("cannot run .venv-needle3/bin/python")?;
    if !status.success() {
        bail!("bench/make_full_needle3.py failed ({status})");
    }
    Ok(())
}

/// The folder a model is written into (`target/bench/` on a fresh clone).
fn create_parent(model: &Path) -> Result<()> {
    match model.parent() {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
        }
        None => Ok(()),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ is inside the workspace")
        .to_path_buf()
}

/// `/proc/loadavg`'s 1-minute load, or NaN where there is none.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}
