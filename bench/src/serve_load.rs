//! `needle-bench --serve`: a bounded load test of `needle-run serve` on loopback. For each
//! concurrency level, that many clients send the demo's held-out tool queries (OpenAI
//! form) back to back until a fixed number of requests is done (or a time cap passes);
//! each request's latency is from its first byte sent to its last byte read. The same
//! load at the highest level also runs against a server decoding one request at a time
//! (`--max-batch 1`), which is what batching is measured against.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one run measures.
pub struct LoadPlan {
    pub clients: Vec<usize>,
    /// Requests per level.
    pub requests: usize,
    /// No request starts after this long into a level.
    pub time_cap: Duration,
    pub max_tokens: usize,
    pub threads: usize,
}

struct Level {
    server_batch: usize,
    clients: usize,
    requests: usize,
    secs: f64,
    latencies_ms: Vec<f64>,
    completion_tokens: u64,
}

/// Runs the plan against `needle-run serve` (beside this binary) on `model` (`None`: the
/// built-in demo model) and returns the markdown table.
pub fn run(bin: &Path, model: Option<&Path>, queries: &[Value], plan: &LoadPlan) -> Result<String> {
    let most = plan.clients.iter().copied().max().unwrap_or(1);
    let mut levels = Vec::new();
    for (server_batch, clients) in plan.clients.iter().map(|&c| (16, c)).chain([(1, most)]) {
        eprintln!("needle-bench: serve --max-batch {server_batch}, {clients} clients");
        let server = Server::start(bin, model, server_batch, plan)?;
        let measured = level(server.addr(), server_batch, clients, queries, plan)?;
        eprint!("{}", row(&measured));
        levels.push(measured);
    }
    Ok(table(&levels, model, plan))
}

struct Server(Child, SocketAddr);

impl Server {
    fn start(
        bin: &Path,
        model: Option<&Path>,
        max_batch: usize,
        plan: &LoadPlan,
    ) -> Result<Server> {
        let mut cmd = Command::new(super::peer::sibling(bin, "needle-run")?);
        cmd.args([
            "serve",
            "--provider",
            "cpu",
            "--port",
            "0",
            "--queue",
            "256",
        ])
        .args([
            "--max-batch",
            &max_batch.to_string(),
            "--threads",
            &plan.threads.to_string(),
        ])
        .stderr(Stdio::piped());
        if let Some(m) = model {
            cmd.arg("--model").arg(m);
        }
        let mut child = cmd.spawn().context("cannot start needle-run serve")?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let addr = loop {
            let line = lines
                .next()
                .ok_or_else(|| anyhow!("needle-run serve exited before listening"))??;
            if let Some(url) = line.split("http://").nth(1) {
                break url.split('/').next().unwrap_or_default().parse()?;
            }
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || lines.for_each(drop));
        let server = Server(child, addr);
        server.warm_up()?;
        Ok(server)
    }

    fn warm_up(&self) -> Result<()> {
        let body = json!({
            "messages": [{"role": "user", "content": "warm up"}],
            "tools": [{"type": "function", "function": {"name": "noop"}}],
            "max_tokens": 4,
        });
        post(self.1, &body.to_string()).map(drop)
    }

    fn addr(&self) -> SocketAddr {
        self.1
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn level(
    addr: SocketAddr,
    server_batch: usize,
    clients: usize,
    queries: &[Value],
    plan: &LoadPlan,
) -> Result<Level> {
    let bodies: Arc<Vec<String>> = Arc::new(
        queries
            .iter()
            .map(|q| {
                let tools: Vec<Value> = q["tools"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| json!({"type": "function", "function": t}))
                    .collect();
                // No `model`: the server answers as its one model, and refuses any other name.
                json!({
                    "messages": [{"role": "user", "content": q["query"]}],
                    "tools": tools,
                    "max_tokens": plan.max_tokens,
                })
                .to_string()
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (bodies, next, requests, cap) =
                (bodies.clone(), next.clone(), plan.requests, plan.time_cap);
            std::thread::spawn(move || -> Result<Vec<(f64, u64)>> {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests || start.elapsed() > cap {
                        return Ok(done);
                    }
                    let sent = Instant::now();
                    let answer = post(addr, &bodies[i % bodies.len()])?;
                    let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                    done.push((sent.elapsed().as_secs_f64() * 1e3, tokens));
                }
            })
        })
        .collect();
    let mut latencies_ms = Vec::new();
    let mut completion_tokens = 0;
    for w in workers {
        for (ms, tokens) in w
            .join()
            .map_err(|_| anyhow!("a client thread panicked"))??
        {
            latencies_ms.push(ms);
            completion_tokens += tokens;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Level {
        server_batch,
        clients,
        requests: latencies_ms.len(),
        secs,
        latencies_ms,
        completion_tokens,
    })
}

/// One `POST /v1/chat/completions` over a fresh connection; the answer's JSON.
fn post(addr: SocketAddr, body: &str) -> Result<Value> {
    let mut stream = TcpStream::connect(addr)?;
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, json) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("not an HTTP response: {response:.200}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!(
            "the server answered {}: {json:.300}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(serde_json::from_str(json)?)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => sorted[((n as f64 * p).ceil() as usize).clamp(1, n) - 1],
    }
}

fn row(l: &Level) -> String {
    format!(
        "| {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.0} |\n",
        l.server_batch,
        l.clients,
        l.requests,
        l.requests as f64 / l.secs,
        percentile(&l.latencies_ms, 0.5),
        percentile(&l.latencies_ms, 0.99),
        l.completion_tokens as f64 / l.secs,
    )
}

fn table(levels: &[Level], model: Option<&Path>, plan: &LoadPlan) -> String {
    let name = model.map_or("the built-in demo model".to_string(), |m| {
        m.display().to_string()
    });
    let mut out = format!(
        "\n### needle-run serve on {name}: {} requests a level, max_tokens {}, {} thread(s)\n\n\
         | server --max-batch | clients | requests | req/s | p50 ms | p99 ms | completion tok/s |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
        plan.requests, plan.max_tokens, plan.threads
    );
    for l in levels {
        out += &row(l);
    }
    let rate = |l: &Level| l.requests as f64 / l.secs;
    if let (Some(batched), Some(single)) = (
        levels.iter().rev().find(|l| l.server_batch > 1),
        levels.iter().find(|l| l.server_batch == 1),
    ) {
        out += &format!(
            "\nAt {} clients, continuous batching serves {:.2}× the requests/s of one request at a time.\n",
            batched.clients,
            rate(batched) / rate(single)
        );
    }
    out
}
