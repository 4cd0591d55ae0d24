//! `needle-bench`: the exported graphs against upstream JAX, on CPU, in one run.
//!
//! ```text
//! needle-bench            full-size model (target/bench/needle-base.cact, made on first use)
//! needle-bench --quick    smoke run on tests/fixtures/m64.cact: small sizes, one iteration, no JAX
//! needle-bench --profile  onnxruntime profile of decode steps of the fused fp32 graph
//! ```
//!
//! Every configuration (attention variant × thread count) runs in a child process of this
//! binary (`--one VARIANT THREADS`), so its peak RSS is its own; upstream JAX runs in
//! `bench/jax_bench.py`. The parent prints one markdown table.

mod measure;
mod profile;
mod table;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use graphs::contract::{
    parse_spelled, AttentionKind, MatMulWeights, Precision, RuntimeTarget, Spelled,
};
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
    /// Smoke run: small sizes, one iteration, no JAX unless --jax.
    #[arg(long)]
    quick: bool,
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
    /// Profile decode steps of the fused fp32 graph instead (for each --threads value).
    #[arg(long)]
    profile: bool,
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
    match run(Args::parse()) {
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
    if !model.exists() {
        make_full_model(&root, &model)?;
    }
    if args.profile {
        for &threads in &args.threads {
            profile::run(&model, threads, &plan, &root.join("target/bench/profile"))?;
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
    let run_jax = !args.no_jax && (!args.quick || args.jax);
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
    Ok(())
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
fn make_full_model(root: &Path, model: &Path) -> Result<()> {
    eprintln!(
        "needle-bench: writing {} with upstream write_export",
        model.display()
    );
    let status = Command::new(root.join(".venv/bin/python"))
        .arg(root.join("bench/make_full_model.py"))
        .arg(model)
        .env("NEEDLE_TELEMETRY", "0")
        .status()
        .context("cannot run .venv/bin/python (run scripts/setup)")?;
    if !status.success() {
        bail!("bench/make_full_model.py failed ({status})");
    }
    Ok(())
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
