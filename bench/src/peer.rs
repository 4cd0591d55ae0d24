//! The peer runtime needle-rs side by side with needle-run, both as black-box processes
//! on the same `.cact`.
//!
//! In-process figures (the main table) cannot be had from needle-rs, and they leave out
//! what a user of either command pays: process start, model load, graph optimization. So
//! both are timed the same way: one process answers one tool query, wall time from spawn
//! to exit, peak RSS from `wait4` (in a small timer process of its own,
//! [`timed_process`], so that it is not needle-bench's). Three points per column, each the median of `reps`
//! runs, give a linear model: T(short prompt, 1 token) is start → first token,
//! T(long, 1) − T(short, 1) prices the extra prompt tokens, T(short, N) − T(short, 1)
//! the decode steps.

use anyhow::{bail, Context, Result};
use exporter::output::data_file;
use runner::prompt::parse_answer;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Instant;

/// The needle-rs release compared against (`cargo install needle-rs-cli --version`).
pub const NEEDLE_RS_VERSION: &str = "0.3.1";

/// A typical tool query; the long prompt adds tools, not words, as longer real prompts do.
const QUERY: &str = "What's the weather in Paris?";

/// Generated tokens of a typical tool call (`<tool_call>[{"name":…,"arguments":…}]</tool_call>`).
const ANSWER_TOKENS: usize = 30;

/// The column whose answers needle-rs's are compared with (the same `.cact`, in memory).
const NEEDLE_RUN_CACT: &str = "needle-run .cact";

/// How much one peer run measures.
pub struct PeerPlan {
    /// Runs per point; the median is kept.
    pub reps: usize,
    /// N, the generation cap of the long-answer point.
    pub max_tokens: usize,
    /// Tools the long prompt has besides the short prompt's one.
    pub extra_tools: usize,
    pub threads: Vec<usize>,
}

impl PeerPlan {
    pub fn new(quick: bool, threads: &[usize], max_tokens: Option<usize>) -> PeerPlan {
        PeerPlan {
            reps: if quick { 1 } else { 3 },
            // Decode is the difference of two whole-process times over N − 1 tokens; at 256
            // start-up noise is a few percent of it (at 64 the same graph read 57 to 96 tok/s).
            max_tokens: max_tokens.unwrap_or(if quick { 8 } else { 256 }),
            // m64's max_seq_len of 256 leaves room for one more tool only.
            extra_tools: if quick { 1 } else { 3 },
            threads: threads.to_vec(),
        }
    }
}

/// Installs needle-rs under `target/bench/needle-rs` unless it is there (as the
/// full-size model is written on first use); returns its binary.
fn needle_rs(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/bench/needle-rs");
    let exe = dir.join("bin/needle-rs");
    if exe.exists() {
        return Ok(exe);
    }
    eprintln!(
        "needle-bench: installing needle-rs-cli {NEEDLE_RS_VERSION} into {}",
        dir.display()
    );
    // Its own target dir: the workspace's may be locked by the cargo that runs us.
    let status = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
        .args(["install", "needle-rs-cli", "--locked", "--version"])
        .arg(NEEDLE_RS_VERSION)
        .arg("--root")
        .arg(&dir)
        .arg("--target-dir")
        .arg(root.join("target/bench/needle-rs-build"))
        .status()
        .context("cannot run cargo to install needle-rs-cli")?;
    if !status.success() || !exe.exists() {
        bail!("cargo install needle-rs-cli {NEEDLE_RS_VERSION} failed ({status})");
    }
    Ok(exe)
}

/// What answers a query: needle-rs, or needle-run on a `.cact` or an exported `.onnx`.
#[derive(Clone)]
enum Engine {
    NeedleRs(PathBuf),
    /// `cache`: needle-run's graph cache folder, or `None` for `--no-cache`.
    NeedleRun {
        exe: PathBuf,
        model: PathBuf,
        cache: Option<PathBuf>,
    },
}

/// One column: an engine at one thread count.
struct Column {
    label: String,
    engine: Engine,
    threads: usize,
    /// Bytes of the model file it loads.
    file_bytes: u64,
}

/// One finished process.
struct Run {
    secs: f64,
    peak_rss: u64,
    /// needle-run's count; needle-rs prints none.
    prompt_tokens: Option<usize>,
    /// needle-run's count; needle-rs prints none (see [`fix_counts`]).
    generated: Option<usize>,
    /// `type`, `function_calls`, `reasoning` and `text` of the answer, as needle-run
    /// prints them or as its parser reads needle-rs's completion.
    answer: Value,
    /// Whether needle-run computed the model's confidence head.
    confidence: bool,
}

/// One point: its runs' median time and largest peak RSS; counts and answer of the first.
struct Point {
    secs: f64,
    peak_rss: u64,
    generated: usize,
    /// needle-rs only: its answer differs from needle-run's (whose count it takes
    /// otherwise), so `generated` is the cap it was given, an upper bound.
    estimated: bool,
    answer: Value,
}

/// The three points of one column: (short prompt, 1 token), (long, 1), (short, N).
struct Measured {
    short1: Point,
    long1: Point,
    short_n: Point,
}

/// What needle-run's tool mode prints (the fields used here).
#[derive(Deserialize)]
struct RunOutput {
    #[serde(rename = "type")]
    kind: String,
    function_calls: Vec<Value>,
    reasoning: String,
    text: String,
    prompt_tokens: usize,
    generated_tokens: usize,
    confidence: Option<f64>,
}

/// Measures every column on `model` and renders the section.
pub fn run(root: &Path, model: &Path, plan: &PeerPlan) -> Result<String> {
    let dir = root.join("target/bench/peer");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tool_lists = [tools(0), tools(plan.extra_tools)];
    let tool_files = [dir.join("tools-short.json"), dir.join("tools-long.json")];
    for (list, file) in tool_lists.iter().zip(&tool_files) {
        std::fs::write(file, list).with_context(|| format!("cannot write {}", file.display()))?;
    }
    let bin = std::env::current_exe()?
        .parent()
        .context("needle-bench's binary has no folder")?
        .to_path_buf();
    let needle_run = sibling(&bin, "needle-run")?;
    let needle_export = sibling(&bin, "needle-export")?;
    let needle_rs = needle_rs(root)?;

    let mut engines = vec![
        (
            "needle-rs",
            Engine::NeedleRs(needle_rs),
            model.to_path_buf(),
        ),
        (
            NEEDLE_RUN_CACT,
            Engine::NeedleRun {
                exe: needle_run.clone(),
                model: model.to_path_buf(),
                cache: None,
            },
            model.to_path_buf(),
        ),
    ];
    // The cached column's cache is filled by an unmeasured run first (below), so every
    // measured run is a hit: exporting holds the model's tensors and would set its peak RSS.
    let cache = dir.join("graph-cache");
    if cache.exists() {
        std::fs::remove_dir_all(&cache)
            .with_context(|| format!("cannot empty {}", cache.display()))?;
    }
    engines.push((
        "needle-run .cact cached",
        Engine::NeedleRun {
            exe: needle_run.clone(),
            model: model.to_path_buf(),
            cache: Some(cache),
        },
        model.to_path_buf(),
    ));
    let mut notes = Vec::new();
    let stem = model.file_stem().unwrap_or_default().to_string_lossy();
    for (label, flags, file) in [
        (
            "needle-run .onnx fp32",
            &["--weights", "float"][..],
            format!("{stem}.onnx"),
        ),
        (
            "needle-run .onnx fp32 external data",
            &["--weights", "float", "--external-data"],
            format!("{stem}.external.onnx"),
        ),
        (
            "needle-run .onnx packed",
            &["--weights", "packed"],
            format!("{stem}.packed.onnx"),
        ),
        (
            "needle-run .onnx cq",
            &["--weights", "cq"],
            format!("{stem}.cq.onnx"),
        ),
        (
            "needle-run .onnx int4",
            &["--weights", "int4"],
            format!("{stem}.int4.onnx"),
        ),
    ] {
        let onnx = dir.join(file);
        match export(&needle_export, model, &onnx, flags) {
            Ok(()) => engines.push((
                label,
                Engine::NeedleRun {
                    exe: needle_run.clone(),
                    model: onnx.clone(),
                    cache: None,
                },
                onnx,
            )),
            Err(e) => notes.push(format!("{label}: not measured: {e:#}")),
        }
    }
    let mut columns = Vec::new();
    for &threads in &plan.threads {
        for (label, engine, file) in &engines {
            // A graph with external data is two files.
            let data_bytes = std::fs::metadata(data_file(file)).map_or(0, |m| m.len());
            columns.push(Column {
                label: label.to_string(),
                engine: engine.clone(),
                threads,
                file_bytes: std::fs::metadata(file)?.len() + data_bytes,
            });
        }
    }

    for c in &columns {
        if matches!(&c.engine, Engine::NeedleRun { cache: Some(dir), .. } if !dir.exists()) {
            eprintln!("needle-bench: peer {}: filling its graph cache", c.label);
            c.run(model, (tool_files[0].as_path(), tool_lists[0].as_str()), 1)?;
        }
    }
    // Interleaved: each repetition runs every column once, so a slow spell of the machine
    // lands on all columns alike instead of on one.
    let points = [(0, 1), (1, 1), (0, plan.max_tokens)];
    let mut runs: Vec<[Vec<Run>; 3]> = columns.iter().map(|_| Default::default()).collect();
    for rep in 1..=plan.reps {
        for (c, column_runs) in columns.iter().zip(&mut runs) {
            eprintln!(
                "needle-bench: peer {} with {} thread(s), run {rep} of {}",
                c.label, c.threads, plan.reps
            );
            for (&(tools, max_tokens), runs) in points.iter().zip(column_runs.iter_mut()) {
                let tools = (&tool_files[tools], tool_lists[tools].as_str());
                runs.push(c.run(model, (tools.0.as_path(), tools.1), max_tokens)?);
            }
        }
    }
    // Every needle-run column must have read the same prompt (an `.onnx` brings its own
    // tokenizer file), or the prefill figures would mix lengths.
    let prompt = |i: usize| -> Result<usize> {
        let mut lengths: Vec<usize> = runs
            .iter()
            .flat_map(|r| &r[i])
            .filter_map(|r| r.prompt_tokens)
            .collect();
        lengths.sort_unstable();
        lengths.dedup();
        match lengths[..] {
            [n] => Ok(n),
            _ => bail!("needle-run read the same prompt as {lengths:?} tokens"),
        }
    };
    let prompt_tokens = (prompt(0)?, prompt(1)?);
    if runs.iter().flatten().flatten().any(|r| r.confidence) {
        notes.push("needle-run also computed the model's confidence head (the output's `confidence`); needle-rs's CLI computes none. The stock graphs (fp32, cq, int4) run one more forward of prompt + answer for it, which is in their times (prefill's above all); the packed graphs carry the head's running pools through prefill and decode and feed the answer's last token in one more step.".to_string());
    }
    let measured = fix_counts(&columns, runs, &mut notes, plan.max_tokens);
    Ok(render(
        model,
        plan,
        prompt_tokens,
        &columns,
        &measured,
        &notes,
    ))
}

/// Points of every column. needle-rs prints no token counts: where its answer is
/// needle-run's (`.cact`, same threads), so are its tokens; otherwise the cap it was
/// given stands in, marked as an upper bound. Notes whether the answers agree.
fn fix_counts(
    columns: &[Column],
    runs: Vec<[Vec<Run>; 3]>,
    notes: &mut Vec<String>,
    max_tokens: usize,
) -> Vec<Measured> {
    let mut points: Vec<[Point; 3]> = runs
        .into_iter()
        .map(|[short1, long1, short_n]| {
            [
                point(short1, 1),
                point(long1, 1),
                point(short_n, max_tokens),
            ]
        })
        .collect();
    for (i, c) in columns.iter().enumerate() {
        if !c.is_peer() {
            continue;
        }
        let Some(j) = columns
            .iter()
            .position(|o| o.threads == c.threads && o.label == NEEDLE_RUN_CACT)
        else {
            continue;
        };
        let reference: Vec<(usize, Value)> = points[j]
            .iter()
            .map(|p| (p.generated, p.answer.clone()))
            .collect();
        for (p, (generated, answer)) in points[i].iter_mut().zip(reference) {
            if p.answer == answer {
                p.generated = generated;
                p.estimated = false;
            }
        }
        let (rs, ours) = (&points[i][2].answer, &points[j][2].answer);
        notes.push(if rs == ours {
            format!("{}t: needle-rs and needle-run give the same answer at {max_tokens} tokens.", c.threads)
        } else {
            format!(
                "{}t: the answers at {max_tokens} tokens differ (with random weights the logits nearly tie, so small numeric differences can flip a token), so needle-rs's token counts are not known: needle-rs {}, needle-run {}.",
                c.threads,
                excerpt(rs),
                excerpt(ours)
            )
        });
    }
    points
        .into_iter()
        .map(|[short1, long1, short_n]| Measured {
            short1,
            long1,
            short_n,
        })
        .collect()
}

/// An answer's text fields, cut to a readable length.
fn excerpt(answer: &Value) -> String {
    let s = format!("{} {}", answer["reasoning"], answer["text"]);
    let cut: String = s.chars().take(60).collect();
    if cut.len() < s.len() {
        format!("`{cut}…`")
    } else {
        format!("`{cut}`")
    }
}

/// `max_tokens`: the cap the runs had, the count taken where they print none.
fn point(mut runs: Vec<Run>, max_tokens: usize) -> Point {
    let peak_rss = runs.iter().map(|r| r.peak_rss).max().unwrap_or(0);
    let mut secs: Vec<f64> = runs.iter().map(|r| r.secs).collect();
    secs.sort_by(f64::total_cmp);
    let first = runs.swap_remove(0);
    Point {
        secs: secs[secs.len() / 2],
        peak_rss,
        generated: first.generated.unwrap_or(max_tokens),
        estimated: first.generated.is_none(),
        answer: first.answer,
    }
}

impl Column {
    /// Whether this is needle-rs, the reference of the ratios.
    fn is_peer(&self) -> bool {
        matches!(self.engine, Engine::NeedleRs(_))
    }

    /// One process answering [`QUERY`] with `tools` (its file and its JSON).
    fn run(&self, model: &Path, tools: (&Path, &str), max_tokens: usize) -> Result<Run> {
        let (cmd, name) = match &self.engine {
            Engine::NeedleRs(exe) => {
                let mut cmd = Command::new(exe);
                cmd.arg("--max-tokens")
                    .arg(max_tokens.to_string())
                    .arg(model)
                    .arg(QUERY)
                    .arg(tools.1)
                    // needle-rs parallelizes with rayon's global pool and has no option.
                    .env("RAYON_NUM_THREADS", self.threads.to_string());
                (cmd, "needle-rs")
            }
            Engine::NeedleRun { exe, model, cache } => {
                let mut cmd = Command::new(exe);
                match cache {
                    Some(dir) => cmd.env("NEEDLE_ONNX_CACHE", dir),
                    None => cmd.arg("--no-cache"),
                };
                cmd.args(["--provider", "cpu", "--model"])
                    .arg(model)
                    .arg("--tools")
                    .arg(tools.0)
                    .args(["--query", QUERY, "--max-new-tokens"])
                    .arg(max_tokens.to_string())
                    .arg("--threads")
                    .arg(self.threads.to_string());
                (cmd, "needle-run")
            }
        };
        let (stdout, stderr, secs, peak_rss, status) = timed(&cmd)?;
        if !status.success() {
            let last = stderr.lines().last().unwrap_or_default();
            bail!("{name} failed ({status}): {last}");
        }
        Ok(match &self.engine {
            Engine::NeedleRs(_) => {
                // It prints the completion and a newline.
                let text = stdout.strip_suffix('\n').unwrap_or(&stdout);
                let a = parse_answer(text);
                Run {
                    secs,
                    peak_rss,
                    prompt_tokens: None,
                    generated: None,
                    answer: json!({"type": a.kind(), "function_calls": a.function_calls(),
                                   "reasoning": a.reasoning, "text": a.text}),
                    confidence: false,
                }
            }
            Engine::NeedleRun { .. } => {
                let line = stdout.lines().last().unwrap_or_default();
                let o: RunOutput = serde_json::from_str(line)
                    .with_context(|| format!("needle-run printed {line:?}"))?;
                Run {
                    secs,
                    peak_rss,
                    prompt_tokens: Some(o.prompt_tokens),
                    generated: Some(o.generated_tokens),
                    answer: json!({"type": o.kind, "function_calls": o.function_calls,
                                   "reasoning": o.reasoning, "text": o.text}),
                    confidence: o.confidence.is_some(),
                }
            }
        })
    }
}

/// The hidden first argument that makes needle-bench the timer of one process.
pub const TIMED: &str = "--timed-process";

/// `needle-bench --timed-process PROGRAM ARGS…`: runs PROGRAM with this process's stdin,
/// stdout and stderr, reaps it with `wait4` (which, unlike `Child::wait`, returns its
/// `ru_maxrss`), then appends one line to stderr: `--timed-process SECONDS PEAK_RSS
/// WAIT_STATUS`. A fresh process in between because Linux counts a child's peak RSS from
/// its parent's memory at the spawn (vfork shares the parent's high-water mark, fork
/// copies its resident set, and exec keeps the larger), and needle-bench is large after
/// its in-process measurements; this one is a few MiB.
pub fn timed_process(args: &[std::ffi::OsString]) -> Result<()> {
    let (program, args) = args
        .split_first()
        .context("--timed-process needs a program")?;
    let start = Instant::now();
    let child = Command::new(program)
        .args(args)
        .spawn()
        .with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data, for which all zeros is a valid value; wait4 writes
    // through both pointers, which outlive the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    while unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            bail!("cannot wait for process {pid}: {e}");
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Linux reports ru_maxrss in KiB.
    let peak_rss = usage.ru_maxrss.max(0) as u64 * 1024;
    eprintln!("{TIMED} {secs} {peak_rss} {status}");
    Ok(())
}

/// Runs `cmd` under [`timed_process`]: its stdout, its stderr, wall time, peak RSS and
/// exit status.
fn timed(cmd: &Command) -> Result<(String, String, f64, u64, ExitStatus)> {
    let out = Command::new(std::env::current_exe()?)
        .arg(TIMED)
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .context("cannot run needle-bench --timed-process")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.trim_end();
    let (child_err, line) = stderr.rsplit_once('\n').unwrap_or(("", stderr));
    let fields: Vec<&str> = line
        .strip_prefix(TIMED)
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    let [secs, rss, status] = fields[..] else {
        bail!("needle-bench --timed-process failed: {}", line.trim());
    };
    Ok((
        String::from_utf8(out.stdout).context("the output is not UTF-8")?,
        child_err.to_string(),
        secs.parse()?,
        rss.parse()?,
        ExitStatus::from_raw(status.parse()?),
    ))
}

/// A binary of the workspace beside needle-bench's, built first when it is missing (into
/// needle-bench's target folder and profile, so a fresh clone needs no build by hand).
pub(crate) fn sibling(bin: &Path, name: &str) -> Result<PathBuf> {
    let exe = bin.join(name);
    if exe.exists() {
        return Ok(exe);
    }
    let target_dir = bin
        .parent()
        .context("needle-bench's folder has no parent")?;
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .args(["build", "--quiet", "--bin", name, "--target-dir"])
        .arg(target_dir)
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"));
    match bin.file_name().and_then(|p| p.to_str()) {
        Some("debug") => {}
        Some(profile) => {
            cargo.args(["--profile", profile]);
        }
        None => bail!("needle-bench's folder {} names no profile", bin.display()),
    }
    eprintln!("needle-bench: building {name} (it is not beside needle-bench yet)");
    let status = cargo.status().context("cannot run cargo")?;
    if !status.success() || !exe.exists() {
        bail!("cannot build {name} into {} ({status})", bin.display());
    }
    Ok(exe)
}

/// `needle-export MODEL ONNX FLAGS` (fused attention, fp32), replacing an earlier export
/// so a changed model or exporter is what is measured.
fn export(exe: &Path, model: &Path, onnx: &Path, flags: &[&str]) -> Result<()> {
    eprintln!(
        "needle-bench: needle-export {} → {}",
        flags.join(" "),
        onnx.display()
    );
    let out = Command::new(exe)
        .arg(model)
        .arg(onnx)
        .args(flags)
        .arg("--force")
        .output()
        .context("cannot run needle-export")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{}", err.lines().last().unwrap_or("needle-export failed"));
    }
    Ok(())
}

/// The short prompt's one tool plus `extra` more, as compact JSON.
fn tools(extra: usize) -> String {
    let string = |d: &str| json!({"type": "string", "description": d});
    let all = [
        json!({"name": "get_weather", "description": "Get the current weather for a city",
               "parameters": {"type": "object", "properties": {"city": string("City name")},
                              "required": ["city"]}}),
        json!({"name": "set_alarm", "description": "Set an alarm for a time of day",
               "parameters": {"type": "object", "properties": {"time": string("Time as HH:MM"),
                              "label": string("What the alarm is for")}, "required": ["time"]}}),
        json!({"name": "send_message", "description": "Send a text message to a contact",
               "parameters": {"type": "object", "properties": {"to": string("Contact name"),
                              "body": string("Message text")}, "required": ["to", "body"]}}),
        json!({"name": "play_music", "description": "Play a song, an artist or a playlist",
               "parameters": {"type": "object", "properties": {"query": string("What to play"),
                              "shuffle": {"type": "boolean", "description": "Shuffle the queue"}},
                              "required": ["query"]}}),
    ];
    Value::Array(all[..=extra.min(all.len() - 1)].to_vec()).to_string()
}

/// The figures of one column, from its three points (None where a difference is not positive).
struct Figures {
    first_token: f64,
    prefill: Option<f64>,
    decode: Option<f64>,
    answer: Option<f64>,
}

impl Measured {
    fn figures(&self, prompt_tokens: (usize, usize)) -> Figures {
        let rate = |tokens: f64, secs: f64| (tokens > 0.0 && secs > 0.0).then(|| tokens / secs);
        let prefill = rate(
            prompt_tokens.1 as f64 - prompt_tokens.0 as f64,
            self.long1.secs - self.short1.secs,
        );
        let decode = rate(
            self.short_n.generated as f64 - self.short1.generated as f64,
            self.short_n.secs - self.short1.secs,
        );
        Figures {
            first_token: self.short1.secs,
            prefill,
            decode,
            answer: decode.map(|d| self.short1.secs + (ANSWER_TOKENS - 1) as f64 / d),
        }
    }

    fn peak_rss(&self) -> u64 {
        self.short1
            .peak_rss
            .max(self.long1.peak_rss)
            .max(self.short_n.peak_rss)
    }
}

/// The section: a header line, the table (needle-run columns with their ratio to
/// needle-rs at the same thread count) and the notes.
fn render(
    model: &Path,
    plan: &PeerPlan,
    prompt_tokens: (usize, usize),
    columns: &[Column],
    measured: &[Measured],
    notes: &[String],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n### Whole processes: needle-rs {NEEDLE_RS_VERSION} and needle-run on `{}`\n",
        model.display()
    );
    let _ = writeln!(
        s,
        "Query {QUERY:?}; short prompt {} tokens (1 tool), long {} tokens ({} tools); N = {} generated tokens; each point the median of {} run(s).\n",
        prompt_tokens.0,
        prompt_tokens.1,
        plan.extra_tools + 1,
        plan.max_tokens,
        plan.reps,
    );
    let figures: Vec<Figures> = measured.iter().map(|m| m.figures(prompt_tokens)).collect();
    // Label, the figure of column i, its format.
    type Row<'a> = (
        String,
        Box<dyn Fn(usize) -> Option<f64> + 'a>,
        fn(f64) -> String,
    );
    let rows: Vec<Row> = vec![
        (
            format!("start → first token, s ({}-token prompt)", prompt_tokens.0),
            Box::new(|i| Some(figures[i].first_token)),
            secs,
        ),
        (
            format!(
                "prefill, tok/s (+{} prompt tokens)",
                prompt_tokens.1.saturating_sub(prompt_tokens.0)
            ),
            Box::new(|i| figures[i].prefill),
            rate,
        ),
        (
            format!("decode, tok/s ({} tokens)", plan.max_tokens),
            Box::new(|i| figures[i].decode),
            rate,
        ),
        (
            format!("start → {ANSWER_TOKENS}-token answer, s"),
            Box::new(|i| figures[i].answer),
            secs,
        ),
        (
            "peak RSS, MiB".to_string(),
            Box::new(|i| Some(measured[i].peak_rss() as f64 / (1024.0 * 1024.0))),
            whole,
        ),
        (
            "model file, MB".to_string(),
            Box::new(|i| Some(columns[i].file_bytes as f64 / 1e6)),
            mb,
        ),
        (
            "T(long, 1 token), s".to_string(),
            Box::new(|i| Some(measured[i].long1.secs)),
            secs,
        ),
        (
            format!("T(short, {} tokens), s", plan.max_tokens),
            Box::new(|i| Some(measured[i].short_n.secs)),
            secs,
        ),
    ];
    // One table per thread count, the ratios against its needle-rs column.
    for &threads in &plan.threads {
        let cols: Vec<usize> = (0..columns.len())
            .filter(|&i| columns[i].threads == threads)
            .collect();
        let mut header = "| metric |".to_string();
        let mut rule = "|---|".to_string();
        for &i in &cols {
            let _ = write!(header, " {} {threads}t |", columns[i].label);
            rule.push_str("---:|");
            if !columns[i].is_peer() {
                header.push_str(" ×rs |");
                rule.push_str("---:|");
            }
        }
        let _ = writeln!(s, "{header}\n{rule}");
        for (label, get, fmt) in &rows {
            let _ = write!(s, "| {label} |");
            let mut reference = None;
            for &i in &cols {
                let v = get(i);
                let _ = write!(s, " {} |", v.map_or("—".to_string(), fmt));
                if columns[i].is_peer() {
                    reference = v;
                } else {
                    let ratio = match (v, reference) {
                        (Some(v), Some(r)) if r > 0.0 => format!("{:.2}×", v / r),
                        _ => "—".to_string(),
                    };
                    let _ = write!(s, " {ratio} |");
                }
            }
            s.push('\n');
        }
        let _ = write!(s, "| generated tokens at N |");
        for &i in &cols {
            let p = &measured[i].short_n;
            let mark = if p.estimated { "≤" } else { "" };
            let _ = write!(s, " {mark}{} |", p.generated);
            if !columns[i].is_peer() {
                s.push_str(" |");
            }
        }
        s.push_str("\n\n");
    }
    let _ = writeln!(s, "×rs = needle-run ÷ needle-rs at the same thread count (higher is better for tok/s, lower for seconds and sizes). Every run is one process, timed from spawn to exit; peak RSS is the process's `ru_maxrss` (`wait4` in a timer process, whose own ~3 MiB are the floor), the largest of its column's runs. Start → first token = T(short, 1); prefill = extra prompt tokens ÷ (T(long, 1) − T(short, 1)); decode = (generated at N − 1) ÷ (T(short, N) − T(short, 1)); start → answer = T(short, 1) + {} ÷ decode.", ANSWER_TOKENS - 1);
    let _ = writeln!(s, "Threads: needle-run `--threads` (onnxruntime intra-op); needle-rs `RAYON_NUM_THREADS` (its rayon pool; it has no option). needle-rs prints no token counts: its prompt is needle-run's (same template and tokenizer); its generated count is needle-run's where the answers agree, else the cap it was given (≤: it stops earlier only at EOS or `<|im_end|>`, and its decode rate is then an upper bound).");
    for n in notes {
        let _ = writeln!(s, "{n}");
    }
    s
}

fn secs(v: f64) -> String {
    format!("{v:.2}")
}

fn rate(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn whole(v: f64) -> String {
    format!("{v:.0}")
}

fn mb(v: f64) -> String {
    format!("{v:.1}")
}
