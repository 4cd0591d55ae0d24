//! The measurements: one configuration of ours (in a child process), upstream JAX
//! (through `bench/jax_bench.py`), and the machine's memory bandwidth.

use crate::{Plan, Variant};
use anyhow::{anyhow, bail, Context, Result};
use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use graphs::onnx::{data_type, ModelProto};
use prost::Message;
use runner::decode::{self, argmax};
use runner::provider::Provider;
use runner::session::{NeedleSession, StepOutput};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Everything measured for one attention variant and thread count.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Config {
    pub variant: String,
    pub threads: usize,
    /// `.cact` bytes in memory → ONNX bytes: parse, hash, dequantize, build, encode.
    pub export_s: f64,
    /// `NeedleSession::create` on the ONNX bytes (graph optimization included).
    pub session_s: f64,
    /// `(tokens, best seconds)` per prefill length.
    pub prefill: Vec<(usize, f64)>,
    /// `(past tokens, steps, seconds)` per decode figure.
    pub decode: Vec<(usize, usize, f64)>,
    pub onnx_bytes: usize,
    /// Initializer bytes one decode step reads (see [`weight_bytes_per_token`]).
    pub weight_bytes_per_token: usize,
    /// VmHWM during parse + export.
    pub peak_rss_export: u64,
    /// VmHWM during session creation (reset after the export).
    pub peak_rss_session: u64,
    /// VmHWM during prefill and decode (reset after session creation).
    pub peak_rss_run: u64,
    /// CPU cores other processes used meanwhile (set by the parent, see [`CpuShare`]).
    #[serde(default)]
    pub others_cores: f64,
}

/// Measures one configuration in this process (the `--one` child).
pub fn one_config(model: &Path, variant: Variant, threads: usize, plan: &Plan) -> Result<Config> {
    let bytes = std::fs::read(model).with_context(|| format!("cannot read {}", model.display()))?;
    let start = Instant::now();
    let name = model.file_name().unwrap_or_default().to_string_lossy();
    let parsed =
        NeedleModel::from_bytes(&name, &bytes).with_context(|| format!("{}", model.display()))?;
    let onnx = parsed.export(&ExportOptions::in_memory(variant.graph()));
    let export_s = start.elapsed().as_secs_f64();
    let peak_rss_export = vm_hwm();
    drop((parsed, bytes));
    let weight_bytes = weight_bytes_per_token(&onnx)?;
    reset_hwm();

    let start = Instant::now();
    let mut session = NeedleSession::create(&onnx, Provider::Cpu, false, threads)?;
    let session_s = start.elapsed().as_secs_f64();
    let onnx_bytes = onnx.len();
    drop(onnx);
    let peak_rss_session = vm_hwm();
    reset_hwm();
    let vocab = session.config().vocab();

    let mut prefill = Vec::new();
    for &t in &plan.prefill {
        let ids = tokens(t, vocab, t as u64);
        decode::prefill(&mut session, &ids, t)?;
        let mut best = f64::INFINITY;
        for _ in 0..plan.reps {
            let start = Instant::now();
            decode::prefill(&mut session, &ids, t)?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        prefill.push((t, best));
    }

    let mut decode = Vec::new();
    for &past in &plan.decode_past {
        let ids = tokens(past, vocab, 1000 + past as u64);
        // As `runner::generate` does: room for the prompt and every step.
        let out = decode::prefill(&mut session, &ids, past + plan.steps + 1)?;
        let mut out = step(&mut session, out)?;
        let start = Instant::now();
        for _ in 0..plan.steps {
            out = step(&mut session, out)?;
        }
        decode.push((past, plan.steps, start.elapsed().as_secs_f64()));
    }

    Ok(Config {
        variant: variant.name(),
        threads,
        export_s,
        session_s,
        prefill,
        decode,
        onnx_bytes,
        weight_bytes_per_token: weight_bytes,
        peak_rss_export,
        peak_rss_session,
        peak_rss_run: vm_hwm(),
        others_cores: 0.0,
    })
}

/// One greedy decode step after `out`, as `runner::generate` takes it. The logits are
/// `output_vocab` wide, which for Needle 3 need not be the input vocabulary.
pub fn step(session: &mut NeedleSession, out: StepOutput) -> Result<StepOutput> {
    let width = session.config().output_vocab();
    let next = argmax(&out.logits[out.logits.len() - width..]);
    session.forward(&[next as i64], 1, out.cache)
}

/// `n` token ids in `[4, vocab)` from a fixed generator.
pub fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            4 + (state % (vocab as u64 - 4)) as i64
        })
        .collect()
}

/// Bytes of the initializers one decode step reads: every initializer some node reads
/// whole. An initializer only ever read as `Gather` data (engram tables, RoPE tables,
/// engram taps) is left out, since a step touches only a few of its rows; the tied
/// embedding counts once, for the logits projection.
pub fn weight_bytes_per_token(onnx: &[u8]) -> Result<usize> {
    let model =
        ModelProto::decode(onnx).map_err(|e| anyhow!("cannot decode the exported graph: {e}"))?;
    let graph = model
        .graph
        .ok_or_else(|| anyhow!("the exported model has no graph"))?;
    let sizes: HashMap<&str, usize> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), tensor_bytes(t)))
        .collect();
    let mut read_whole: HashMap<&str, bool> = HashMap::new();
    for node in &graph.node {
        for (i, input) in node.input.iter().enumerate() {
            if sizes.contains_key(input.as_str()) {
                // Gathers read only the rows they fetch: the table of a Gather, the
                // codes (0) and scales (2) of a GatherBlockQuantized.
                let gathered = match node.op_type.as_str() {
                    "Gather" => i == 0,
                    "GatherBlockQuantized" => i == 0 || i == 2,
                    _ => false,
                };
                let whole = !gathered;
                *read_whole.entry(input.as_str()).or_default() |= whole;
            }
        }
    }
    Ok(read_whole
        .iter()
        .filter(|(_, &whole)| whole)
        .map(|(name, _)| sizes[name])
        .sum())
}

fn tensor_bytes(t: &graphs::onnx::TensorProto) -> usize {
    let count: i64 = t.dims.iter().product();
    let bits = match t.data_type {
        data_type::FLOAT | data_type::INT32 => 32,
        data_type::INT64 => 64,
        data_type::FLOAT16 | 16 => 16,
        data_type::BOOL | 2 | 3 => 8,
        21 | 22 => 4,
        _ => 8 * t.raw_data.len() / count.max(1) as usize,
    };
    (count.max(0) as usize * bits).div_ceil(8)
}

/// `VmHWM` (peak resident set) of this process in bytes; 0 where `/proc` has none.
pub fn vm_hwm() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Resets `VmHWM` to the current resident set (Linux `clear_refs` 5).
fn reset_hwm() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// What `bench/jax_bench.py` prints.
#[derive(Deserialize, Clone, Debug)]
pub struct Jax {
    pub threads: usize,
    pub jax: String,
    pub load_seconds: f64,
    pub compile_seconds: HashMap<String, f64>,
    pub prefill: HashMap<String, JaxRate>,
    pub decode: HashMap<String, JaxRate>,
    pub compiled: HashMap<String, bool>,
    pub peak_rss_bytes: u64,
    pub peak_rss_run_bytes: u64,
    /// CPU cores other processes used meanwhile (set by the parent, see [`CpuShare`]).
    #[serde(default)]
    pub others_cores: f64,
}

/// One JAX rate (`prefill` or `decode` entry of `jax_bench.py`).
#[derive(Deserialize, Clone, Debug)]
pub struct JaxRate {
    pub tokens_per_s: f64,
}

/// Runs upstream JAX on `model` with `threads` XLA threads.
pub fn jax(root: &Path, model: &Path, threads: usize, plan: &Plan) -> Result<Jax> {
    let mut cmd = Command::new(root.join(".venv/bin/python"));
    cmd.arg(root.join("bench/jax_bench.py")).arg(model);
    cmd.args(plan.prefill.iter().map(|t| t.to_string()));
    cmd.arg("--decode-past")
        .args(plan.decode_past.iter().map(|t| t.to_string()));
    cmd.args([
        "--threads",
        &threads.to_string(),
        "--steps",
        &plan.steps.to_string(),
        "--reps",
        &plan.reps.to_string(),
    ]);
    cmd.env("NEEDLE_TELEMETRY", "0");
    last_json_line(&mut cmd, "bench/jax_bench.py (run scripts/setup-tests)")
}

/// Runs `cmd` and parses the last line it prints as JSON; `what` names it in errors.
pub fn last_json_line<T: serde::de::DeserializeOwned>(cmd: &mut Command, what: &str) -> Result<T> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("{what} printed {line:?}"))
}

/// Memory bandwidth with `threads` threads, in GB/s (10⁹ bytes).
#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub threads: usize,
    /// memcpy of `Plan::copy_bytes`: bytes copied per second (each read once, written once).
    pub copy: f64,
    /// Summing a buffer of `Plan::copy_bytes` (read only).
    pub read: f64,
    /// Summing a buffer the size of the decode weights, repeatedly: what a cache that
    /// holds the weights (if one does) delivers.
    pub read_weights: f64,
    /// CPU cores other processes used meanwhile (set by the caller, see [`CpuShare`]).
    pub others_cores: f64,
}

/// Best-of-`plan.copy_reps` copy and read bandwidth with `threads` threads.
pub fn bandwidth(threads: usize, plan: &Plan, weight_bytes: usize) -> Bandwidth {
    let words = plan.copy_bytes / 8;
    let src = vec![1u64; words];
    let mut dst = vec![2u64; words];
    let chunk = words.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..plan.copy_reps {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    drop(dst);
    let copy = plan.copy_bytes as f64 / best / 1e9;
    let read = read_bandwidth(&src, threads, plan.copy_reps, 1);
    drop(src);
    let w = vec![3u64; weight_bytes.max(1 << 20) / 8];
    let passes = (plan.copy_bytes / (w.len() * 8)).max(1);
    let read_weights = read_bandwidth(&w, threads, plan.copy_reps.max(3), passes);
    Bandwidth {
        threads,
        copy,
        read,
        read_weights,
        others_cores: 0.0,
    }
}

/// Best-of-`reps` bandwidth of `threads` threads each summing its share of `buf`
/// `passes` times.
fn read_bandwidth(buf: &[u64], threads: usize, reps: usize, passes: usize) -> f64 {
    let chunk = buf.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        std::thread::scope(|s| {
            for c in buf.chunks(chunk) {
                s.spawn(move || {
                    for _ in 0..passes {
                        std::hint::black_box(sum_words(std::hint::black_box(c)));
                    }
                });
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (buf.len() * 8 * passes) as f64 / best / 1e9
}

fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut blocks = words.chunks_exact(8);
    for block in &mut blocks {
        for (a, &w) in acc.iter_mut().zip(block) {
            *a = a.wrapping_add(w);
        }
    }
    let tail = blocks
        .remainder()
        .iter()
        .fold(0u64, |s, &w| s.wrapping_add(w));
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

/// How busy the machine was with other work while one measurement ran: system-wide busy
/// time (`/proc/stat`, steal included) minus this process's own and its waited-for
/// children's (`/proc/self/stat` utime + stime + cutime + cstime), per second of wall time.
pub struct CpuShare {
    start: Instant,
    busy: u64,
    own: u64,
}

/// `USER_HZ`, the unit of `/proc/stat` and `/proc/self/stat` times on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

impl CpuShare {
    /// Takes the first snapshot.
    pub fn start() -> CpuShare {
        CpuShare {
            start: Instant::now(),
            busy: system_busy_ticks(),
            own: own_ticks(),
        }
    }

    /// Cores' worth of CPU used by other processes since [`CpuShare::start`]; NaN without `/proc`.
    pub fn others_cores(&self) -> f64 {
        let wall = self.start.elapsed().as_secs_f64();
        let busy = system_busy_ticks().saturating_sub(self.busy) as f64;
        let ours = own_ticks().saturating_sub(self.own) as f64;
        if self.busy == 0 || wall <= 0.0 {
            return f64::NAN;
        }
        ((busy - ours) / TICKS_PER_SECOND / wall).max(0.0)
    }
}

/// user + nice + system + irq + softirq + steal of the `cpu` line of `/proc/stat`.
fn system_busy_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0;
    };
    let Some(line) = stat.lines().next() else {
        return 0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum()
}

/// utime + stime + cutime + cstime of `/proc/self/stat` (fields 14 to 17).
fn own_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let v: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (11..15).filter_map(|i| v.get(i)).sum()
}
