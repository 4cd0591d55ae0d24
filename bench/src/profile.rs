//! `needle-bench --profile`: onnxruntime's profiler on decode steps of each `--variants`
//! graph (fp32), summarised by op type, by block and by node (layer numbers folded together),
//! with the kernel launches a step and, for each node that reads its weights whole, the
//! rate it reads them at against this machine's single-thread copy bandwidth.

use crate::measure::{step, tokens, CpuShare};
use crate::Plan;
use anyhow::{anyhow, Context, Result};
use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use prost::Message;
use runner::decode;
use runner::provider::{session_builder, Provider};
use runner::session::NeedleSession;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Decode steps profiled per past length.
const PROFILED_STEPS: usize = 16;

/// For each of the plan's decode lengths: a fresh profiled session, a prefill of that
/// length, one warm-up step and `PROFILED_STEPS` profiled steps. Prints the decode
/// summary of each, and the summary of the longest prefill. The raw traces stay in `dir`.
pub fn run(
    model: &Path,
    variant: crate::Variant,
    threads: usize,
    plan: &Plan,
    dir: &Path,
) -> Result<()> {
    let bytes = std::fs::read(model).with_context(|| format!("cannot read {}", model.display()))?;
    let name = model.file_name().unwrap_or_default().to_string_lossy();
    let parsed =
        NeedleModel::from_bytes(&name, &bytes).with_context(|| format!("{}", model.display()))?;
    let onnx = parsed.export(&ExportOptions::in_memory(variant.graph()));
    let graph = variant.name();
    drop((parsed, bytes));
    let weights = WeightBytes::of(&onnx)?;
    let copy = copy_bandwidth();
    println!(
        "Copy bandwidth of this machine, one thread (the best of 5 copies of 256 MiB): {copy:.1} GB/s.\n"
    );
    std::fs::create_dir_all(dir)?;
    let env = runner::ort_env::init()?;
    let mut prefill = String::new();
    for &past in &plan.decode_past {
        let prefix = dir.join(format!("decode-{graph}-{threads}t-{past}"));
        let mut registered = session_builder(env, Provider::Cpu, false, threads)?;
        registered.builder = registered
            .builder
            .with_profiling(&prefix)
            .map_err(|e| anyhow!("{e}"))?;
        let mut session = NeedleSession::from_memory(&onnx, registered)?;
        let cpu = CpuShare::start();
        let vocab = session.config().vocab();
        let out = decode::prefill(
            &mut session,
            &tokens(past, vocab, 7),
            past + PROFILED_STEPS + 1,
        )?;
        let mut out = step(&mut session, out)?;
        for _ in 0..PROFILED_STEPS {
            out = step(&mut session, out)?;
        }
        drop(out);
        let others = cpu.others_cores();
        drop(session);

        let trace = newest_trace(dir, &prefix)?;
        let events: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&trace)?)
            .with_context(|| format!("{}: not a JSON trace", trace.display()))?;
        let runs = model_runs(&events);
        let title = format!(
            "Decode: {graph} fp32 graph, {threads} thread(s), {PROFILED_STEPS} one-token steps after {past} past tokens \
             (other processes meanwhile: {others:.2} cores; trace {})",
            trace.display()
        );
        print!(
            "{}",
            summarise(
                &events,
                &runs[runs.len().saturating_sub(PROFILED_STEPS)..],
                &Labels {
                    title: &title,
                    unit: "step"
                },
                &weights,
                copy
            )
        );
        let title = format!(
            "Prefill of {past} tokens: {graph} fp32 graph, {threads} thread(s), first run of the session \
             (other processes meanwhile: {others:.2} cores)"
        );
        prefill = summarise(
            &events,
            &runs[..runs.len().min(1)],
            &Labels {
                title: &title,
                unit: "run",
            },
            &weights,
            copy,
        );
    }
    print!("{prefill}");
    Ok(())
}

/// `(start, duration)` of every `model_run`, in µs, in order.
fn model_runs(events: &[Value]) -> Vec<(f64, f64)> {
    let mut runs: Vec<(f64, f64)> = events
        .iter()
        .filter(|e| text(e, "cat") == "Session" && text(e, "name") == "model_run")
        .map(|e| (number(e, "ts"), number(e, "dur")))
        .collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs
}

fn text(e: &Value, key: &str) -> String {
    e.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn number(e: &Value, key: &str) -> f64 {
    e.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

fn newest_trace(dir: &Path, prefix: &Path) -> Result<PathBuf> {
    let stem = format!(
        "{}_",
        prefix.file_name().unwrap_or_default().to_string_lossy()
    );
    std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&stem) && name.ends_with(".json")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .ok_or_else(|| anyhow!("onnxruntime wrote no profile under {}", dir.display()))
}

/// The initializer bytes each weight product reads whole per call (other nodes read
/// rows by index, tables by position, or a few values, and are left out).
struct WeightBytes(HashMap<String, f64>);

/// The ops whose initializers are matrices read whole every call.
const WEIGHT_PRODUCTS: [&str; 8] = [
    "CqMatMul",
    "AttentionOut",
    "HyperConnectionsOut",
    "EngramValue",
    "MonarchMlp",
    "HadamardMlp",
    "MatMul",
    "MatMulNBits",
];

impl WeightBytes {
    fn of(onnx: &[u8]) -> Result<WeightBytes> {
        let model = graphs::onnx::ModelProto::decode(onnx).context("the exported graph")?;
        let graph = model.graph.unwrap_or_default();
        let sizes: HashMap<&str, usize> = graph
            .initializer
            .iter()
            .map(|t| (t.name.as_str(), t.raw_data.len()))
            .collect();
        let by_node = graph
            .node
            .iter()
            .filter(|n| WEIGHT_PRODUCTS.contains(&n.op_type.as_str()))
            .map(|n| {
                let bytes: usize = n.input.iter().filter_map(|i| sizes.get(i.as_str())).sum();
                (n.name.clone(), bytes as f64)
            })
            .filter(|(_, bytes)| *bytes > 0.0)
            .collect();
        Ok(WeightBytes(by_node))
    }
}

/// Bytes a second one thread copies (GB/s): the best of 5 copies of 256 MiB.
fn copy_bandwidth() -> f64 {
    let from = vec![1u8; 256 << 20];
    let mut to = vec![0u8; 256 << 20];
    let best = (0..5)
        .map(|_| {
            let start = std::time::Instant::now();
            to.copy_from_slice(std::hint::black_box(&from));
            std::hint::black_box(&to);
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    from.len() as f64 / best / 1e9
}

#[derive(Default, Clone, Copy)]
struct Tally {
    micros: f64,
    count: usize,
    /// Weight bytes read whole by the calls.
    bytes: f64,
}

/// A summary's heading and what one run of it is.
struct Labels<'a> {
    title: &'a str,
    unit: &'a str,
}

/// The markdown summary of the kernels that ran inside `runs`.
fn summarise(
    events: &[Value],
    runs: &[(f64, f64)],
    labels: &Labels,
    weights: &WeightBytes,
    copy: f64,
) -> String {
    let (title, unit) = (labels.title, labels.unit);
    let run_micros: f64 = runs.iter().map(|r| r.1).sum();
    let inside = |ts: f64| {
        runs.iter()
            .any(|&(start, dur)| ts >= start && ts <= start + dur)
    };
    let (mut by_op, mut by_block, mut by_node) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut kernel_micros = 0.0;
    for e in events {
        let name = text(e, "name");
        if text(e, "cat") != "Node" || !name.ends_with("_kernel_time") || !inside(number(e, "ts")) {
            continue;
        }
        let node = name.trim_end_matches("_kernel_time");
        let op = e
            .pointer("/args/op_name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        let dur = number(e, "dur");
        let bytes = weights.0.get(node).copied().unwrap_or(0.0);
        kernel_micros += dur;
        for (map, key) in [
            (&mut by_op, op.clone()),
            (&mut by_block, block_of(node)),
            (&mut by_node, format!("{} ({op})", fold_layers(node))),
        ] {
            let t: &mut Tally = map.entry(key).or_default();
            t.micros += dur;
            t.count += 1;
            t.bytes += bytes;
        }
    }

    let n = runs.len().max(1) as f64;
    let calls = by_op.values().map(|t: &Tally| t.count).sum::<usize>() as f64 / n;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### {title}\n\nPer {unit}: {:.0} µs in `Run`, {:.0} µs inside kernels ({:.0}%), {calls:.0} kernel launches \
         (one launch: onnxruntime running one node's kernel).\n",
        run_micros / n,
        kernel_micros / n,
        100.0 * kernel_micros / run_micros.max(1e-9),
    );
    let tables = [
        ("op type", &by_op, 12),
        ("block", &by_block, 10),
        ("node (all layers)", &by_node, 12),
    ];
    for (what, map, top) in tables {
        let rows = Rows {
            what,
            unit,
            top,
            runs: n,
            total: kernel_micros,
            copy,
        };
        table(&mut s, &rows, map);
    }
    s
}

/// One table's heading, its run unit, how many rows it shows, and what its shares and
/// rates are of.
struct Rows<'a> {
    what: &'a str,
    unit: &'a str,
    top: usize,
    runs: f64,
    total: f64,
    copy: f64,
}

fn table(s: &mut String, r: &Rows, map: &HashMap<String, Tally>) {
    let mut rows: Vec<(&String, &Tally)> = map.iter().collect();
    rows.sort_by(|a, b| b.1.micros.total_cmp(&a.1.micros));
    let (unit, runs, total) = (r.unit, r.runs, r.total.max(1e-9));
    let _ = writeln!(
        s,
        "| {} | µs / {unit} | share | calls / {unit} | weights read whole, MB / {unit} | GB/s | of copy bandwidth |\n|---|---:|---:|---:|---:|---:|---:|",
        r.what
    );
    let rate = |t: &Tally| match t.bytes > 0.0 {
        true => {
            let gbs = t.bytes / t.micros.max(1e-9) / 1e3;
            let of_copy = 100.0 * gbs / r.copy.max(1e-9);
            format!("{:.2} | {gbs:.1} | {of_copy:.0}%", t.bytes / runs / 1e6)
        }
        false => "— | — | —".to_string(),
    };
    for (key, t) in rows.iter().take(r.top) {
        let _ = writeln!(
            s,
            "| `{key}` | {:.0} | {:.1}% | {:.0} | {} |",
            t.micros / runs,
            100.0 * t.micros / total,
            t.count as f64 / runs,
            rate(t)
        );
    }
    if rows.len() > r.top {
        let rest = rows[r.top..]
            .iter()
            .fold(Tally::default(), |a, (_, t)| Tally {
                micros: a.micros + t.micros,
                count: a.count + t.count,
                bytes: a.bytes + t.bytes,
            });
        let _ = writeln!(
            s,
            "| {} others | {:.0} | {:.1}% | {:.0} | {} |",
            rows.len() - r.top,
            rest.micros / runs,
            100.0 * rest.micros / total,
            rest.count as f64 / runs,
            rate(&rest)
        );
    }
    s.push('\n');
}

/// The block a node belongs to: `layers.N/<scope>` → `<scope>`; nodes directly in a
/// layer's scope are the hyper-connections; outside the layers, the top scope; nodes
/// onnxruntime named itself, as they are.
fn block_of(node: &str) -> String {
    let Some(path) = node.strip_prefix("/model/") else {
        return format!("(onnxruntime) {}", fold_layers(node));
    };
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [layer, scope, _, ..] if layer.starts_with("layers.") => fold_digits(scope),
        [layer, ..] if layer.starts_with("layers.") => {
            "hyper_connections (layer scope)".to_string()
        }
        [top, _, ..] => fold_digits(top),
        _ => "(unscoped)".to_string(),
    }
}

/// `/model/layers.12/sinkhorn/Sub_7` → `/model/layers.*/sinkhorn/Sub_*`: layers and
/// repeats within a scope folded together.
fn fold_layers(node: &str) -> String {
    let parts: Vec<&str> = node.split('/').collect();
    let last = parts.len() - 1;
    let folded: Vec<String> = parts
        .iter()
        .enumerate()
        .map(
            |(i, part)| match (part.strip_prefix("layers."), part.rsplit_once('_')) {
                (Some(n), _) if is_number(n) => "layers.*".to_string(),
                (_, Some((op, n))) if i == last && is_number(n) => format!("{op}_*"),
                _ => part.to_string(),
            },
        )
        .collect();
    folded.join("/")
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

fn fold_digits(scope: &str) -> String {
    match scope.split_once('.') {
        Some((head, n)) if is_number(n) => format!("{head}.*"),
        _ => scope.to_string(),
    }
}
