//! The one markdown table of a full run, with its footnotes.

use crate::measure::{Bandwidth, Config, Jax};
use crate::Plan;
use std::fmt::Write;
use std::path::Path;

/// Everything one run measured.
pub struct Report<'a> {
    pub model: &'a Path,
    pub cact_bytes: u64,
    pub plan: &'a Plan,
    pub threads: &'a [usize],
    /// Variant names, in column order.
    pub variants: &'a [String],
    pub ours: &'a [Config],
    pub jax: &'a [Jax],
    pub bandwidth: &'a [Bandwidth],
    /// 1-minute load average before and after.
    pub load: (f64, f64),
}

/// Reads one figure from a measurement, given the bandwidth at its thread count.
type Figure<'r, M> = Box<dyn Fn(&M, &Bandwidth) -> Option<f64> + 'r>;

/// One row: a label and how to read the figure from ours and from JAX.
struct Row<'r> {
    label: String,
    ours: Figure<'r, Config>,
    jax: Figure<'r, Jax>,
    fmt: fn(f64) -> String,
    /// Whether ours ÷ JAX means anything for this row.
    ratio: bool,
}

impl Report<'_> {
    /// The table, preceded by the machine and followed by the footnotes.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Machine: {}, {} cores, {:.1} GiB RAM; 1-min load {:.2} before, {:.2} after. Model: `{}` ({:.1} MB).\n",
            cpu_model(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            mem_total_gib(),
            self.load.0,
            self.load.1,
            self.model.display(),
            self.cact_bytes as f64 / 1e6,
        );
        let mut header = "| metric |".to_string();
        let mut rule = "|---|".to_string();
        for t in self.threads {
            let _ = write!(header, " JAX {t}t |");
            rule.push_str("---:|");
            for v in self.variants {
                let _ = write!(header, " {v} {t}t | ×JAX |");
                rule.push_str("---:|---:|");
            }
        }
        let _ = writeln!(s, "{header}\n{rule}");
        for row in self.rows() {
            let _ = write!(s, "| {} |", row.label);
            for &t in self.threads {
                let bw = self.bandwidth.iter().find(|b| b.threads == t);
                let jax = self.jax.iter().find(|j| j.threads == t);
                let j = match (jax, bw) {
                    (Some(j), Some(bw)) => (row.jax)(j, bw),
                    _ => None,
                };
                let _ = write!(s, " {} |", show(j, row.fmt));
                for v in self.variants {
                    let ours = self.ours.iter().find(|c| c.threads == t && &c.variant == v);
                    let o = match (ours, bw) {
                        (Some(c), Some(bw)) => (row.ours)(c, bw),
                        _ => None,
                    };
                    let ratio = match (o, j) {
                        (Some(o), Some(j)) if j > 0.0 && row.ratio => Some(o / j),
                        _ => None,
                    };
                    let _ = write!(s, " {} | {} |", show(o, row.fmt), show(ratio, ratio_fmt));
                }
            }
            s.push('\n');
        }
        s.push('\n');
        s.push_str(&self.footnotes());
        s
    }

    fn rows(&self) -> Vec<Row<'_>> {
        let mut rows = vec![
            Row {
                label: "export .cact → ONNX bytes, s ¹".into(),
                ours: Box::new(|c, _| Some(c.export_s)),
                jax: Box::new(|j, _| Some(j.load_seconds)),
                fmt: secs,
                ratio: true,
            },
            Row {
                label: "session creation, s ²".into(),
                ours: Box::new(|c, _| Some(c.session_s)),
                jax: Box::new(|j, _| {
                    let key = format!("decode_{}", self.plan.decode_past.first()?);
                    j.compile_seconds.get(&key).copied()
                }),
                fmt: secs,
                ratio: true,
            },
        ];
        for &t in &self.plan.prefill {
            rows.push(Row {
                label: format!("prefill {t} tokens, tok/s"),
                ours: Box::new(move |c, _| {
                    c.prefill.iter().find(|p| p.0 == t).map(|p| t as f64 / p.1)
                }),
                jax: Box::new(move |j, _| j.prefill.get(&t.to_string()).map(|p| p.tokens_per_s)),
                fmt: rate,
                ratio: true,
            });
        }
        for &p in &self.plan.decode_past {
            rows.push(Row {
                label: format!("decode after {p} tokens, tok/s"),
                ours: Box::new(move |c, _| decode_rate(c, p)),
                jax: Box::new(move |j, _| j.decode.get(&p.to_string()).map(|d| d.tokens_per_s)),
                fmt: rate,
                ratio: true,
            });
        }
        for &p in &self.plan.decode_past {
            let weights = self.float_weight_bytes() as f64;
            rows.push(Row {
                label: format!("decode after {p}, % of memcpy bound ³"),
                ours: Box::new(move |c, bw| {
                    decode_rate(c, p)
                        .map(|r| 100.0 * r * c.weight_bytes_per_token as f64 / (bw.copy * 1e9))
                }),
                jax: Box::new(move |j, bw| {
                    j.decode
                        .get(&p.to_string())
                        .map(|d| 100.0 * d.tokens_per_s * weights / (bw.copy * 1e9))
                }),
                fmt: percent,
                ratio: true,
            });
        }
        let cact = self.cact_bytes as f64;
        rows.extend([
            Row {
                label: "peak RSS, whole process, MiB ⁴".into(),
                ours: Box::new(|c, _| {
                    Some(
                        c.peak_rss_export
                            .max(c.peak_rss_session)
                            .max(c.peak_rss_run) as f64
                            / MIB,
                    )
                }),
                jax: Box::new(|j, _| Some(j.peak_rss_bytes as f64 / MIB)),
                fmt: mib,
                ratio: true,
            },
            Row {
                label: "peak RSS while running, MiB ⁴".into(),
                ours: Box::new(|c, _| Some(c.peak_rss_run as f64 / MIB)),
                jax: Box::new(|j, _| Some(j.peak_rss_run_bytes as f64 / MIB)),
                fmt: mib,
                ratio: true,
            },
            Row {
                label: "model file, MB ⁵".into(),
                ours: Box::new(|c, _| Some(c.onnx_bytes as f64 / 1e6)),
                jax: Box::new(move |_, _| Some(cact / 1e6)),
                fmt: mb,
                ratio: true,
            },
            Row {
                label: "other processes' CPU meanwhile, cores ⁶".into(),
                ours: Box::new(|c, _| Some(c.others_cores)),
                jax: Box::new(|j, _| Some(j.others_cores)),
                fmt: cores,
                ratio: false,
            },
        ]);
        rows
    }

    /// Weight bytes per decode step of the exact (float) graphs, which JAX reads too.
    fn float_weight_bytes(&self) -> usize {
        self.ours
            .iter()
            .find(|c| !c.variant.contains('-'))
            .or(self.ours.first())
            .map_or(0, |c| c.weight_bytes_per_token)
    }

    fn footnotes(&self) -> String {
        let weights = self.float_weight_bytes();
        let mut s = String::new();
        let _ = writeln!(s, "×JAX = ours ÷ upstream JAX (higher is better for tok/s, lower for seconds and sizes); \"—\": not measured.");
        let _ = writeln!(s, "Prefill: best of {} after a warm-up run. Decode: {} timed one-token steps (greedy, logits copied out) after the prefill and one warm-up step.", self.plan.reps, self.plan.steps);
        if let Some(j) = self.jax.first() {
            let _ = writeln!(s, "Upstream: cactus-needle 2.0.15 `decode.forward_cached`, jax {}, float32 dequantized weights, XLA CPU.", j.jax);
        }
        let _ = writeln!(
            s,
            "¹ JAX: `read_export` + rebuild of the flax tree + transfer to JAX arrays."
        );
        let first_decode = format!(
            "decode_{}",
            self.plan.decode_past.first().copied().unwrap_or(0)
        );
        let how: Vec<String> = self
            .jax
            .iter()
            .map(|j| match j.compiled.get(&first_decode) {
                Some(true) => format!("{}t compiled", j.threads),
                Some(false) => format!(
                    "{}t loaded from JAX's persistent compilation cache",
                    j.threads
                ),
                None => format!("{}t unknown", j.threads),
            })
            .collect();
        let _ = writeln!(
            s,
            "² JAX: first call of the decode step minus a steady step: tracing, lowering and XLA compilation, or a load from target/bench/jax-cache when warm (this run: {}). Every shape pays it once; all JAX rates exclude it.",
            if how.is_empty() { "not run".to_string() } else { how.join(", ") },
        );
        let mut per_variant: Vec<String> = Vec::new();
        for v in self.variants {
            if let Some(c) = self.ours.iter().find(|c| &c.variant == v) {
                per_variant.push(format!(
                    "{v} {:.1} MB",
                    c.weight_bytes_per_token as f64 / 1e6
                ));
            }
        }
        let _ = writeln!(
            s,
            "³ Bound = memcpy bandwidth ÷ weight bytes per decode step: every initializer a node reads whole, the tied embedding once, gathered-only tables (engram, RoPE) left out ({}; JAX reads the float weights). Bandwidth:",
            per_variant.join(", "),
        );
        for b in self.bandwidth {
            let bound = b.copy * 1e9 / weights.max(1) as f64;
            let _ = writeln!(
                s,
                "  {}t: memcpy {:.1} GB/s ({} MiB copied, best of {}) → float bound {:.0} tok/s; read-only sum over the same size {:.1} GB/s; summing a {:.0} MB buffer (the weights' size) again and again, which a cache that held the weights would speed up, {:.1} GB/s → {:.0} tok/s (other processes meanwhile: {:.2} cores).",
                b.threads,
                b.copy,
                self.plan.copy_bytes >> 20,
                self.plan.copy_reps,
                bound,
                b.read,
                weights as f64 / 1e6,
                b.read_weights,
                b.read_weights * 1e9 / weights.max(1) as f64,
                b.others_cores,
            );
        }
        let _ = writeln!(s, "⁴ VmHWM of the configuration's own process. Whole process: ours includes export and session creation, JAX includes loading and jit compilation (or the persistent-cache load). While running: reset before the timed prefill/decode, so it is what a ready session (ours) or compiled function (JAX) needs to run.");
        let _ = writeln!(
            s,
            "⁵ Ours: the exported ONNX graph (fp32 activations); JAX column: the `.cact` it loads."
        );
        let _ = writeln!(s, "⁶ Contention: system-wide busy CPU time (steal included) minus this configuration's own, per second of its wall time; with 2 cores, anything near 1 disturbs the 2-thread figures.");
        s
    }
}

const MIB: f64 = 1024.0 * 1024.0;

fn decode_rate(c: &Config, past: usize) -> Option<f64> {
    c.decode
        .iter()
        .find(|d| d.0 == past)
        .map(|d| d.1 as f64 / d.2)
}

fn show(v: Option<f64>, fmt: fn(f64) -> String) -> String {
    v.map_or_else(|| "—".to_string(), fmt)
}

fn secs(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

fn rate(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn percent(v: f64) -> String {
    format!("{v:.0}%")
}

fn mib(v: f64) -> String {
    format!("{v:.0}")
}

fn cores(v: f64) -> String {
    format!("{v:.2}")
}

fn mb(v: f64) -> String {
    format!("{v:.1}")
}

fn ratio_fmt(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}×")
    } else {
        format!("{v:.0}×")
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}

fn mem_total_gib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / MIB)
}
