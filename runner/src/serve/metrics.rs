//! `GET /metrics`: what an operator watches and autoscales on, in Prometheus' text
//! exposition format (version 0.0.4, what a Prometheus server scrapes): requests by route
//! and status, prompt and completion tokens, the queue's depth, the batch's occupancy, and
//! histograms of the time to the first token and of the whole request. The handlers and
//! the decoding thread write these as they go; a scrape only reads them.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds, in seconds, of both latency histograms' buckets: from one decode step of
/// a small model to a long answer on a loaded server.
const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The server's counters, gauges and histograms.
pub struct Metrics {
    /// Answers by (route, status); the route is the pattern matched (`/v1/models/{id}`),
    /// so that a client cannot make up label values.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    queued: AtomicU64,
    batch_rows: AtomicU64,
    batch_capacity: u64,
    first_token: Histogram,
    request_duration: Histogram,
}

struct Histogram {
    /// Per bucket (not cumulative), then the sum of every observation.
    counts: Mutex<([u64; LATENCY_BUCKETS.len()], u64, f64)>,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: Mutex::new(([0; LATENCY_BUCKETS.len()], 0, 0.0)),
        }
    }

    fn observe(&self, seconds: f64) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&le| seconds <= le) {
            c.0[i] += 1;
        }
        c.1 += 1;
        c.2 += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let (buckets, count, sum) = *self.counts.lock().unwrap_or_else(|e| e.into_inner());
        header(out, name, help, "histogram");
        let mut cumulative = 0;
        for (le, n) in LATENCY_BUCKETS.iter().zip(buckets) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the text format writes it.
fn label(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

impl Metrics {
    /// Metrics of a server decoding up to `batch_capacity` rows together.
    pub fn new(batch_capacity: usize) -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            batch_rows: AtomicU64::new(0),
            batch_capacity: batch_capacity as u64,
            first_token: Histogram::new(),
            request_duration: Histogram::new(),
        }
    }

    /// A job entered the queue.
    pub fn queued(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// The decoding thread took a job out of the queue.
    pub fn dequeued(&self) {
        let _ = self
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Rows in the batch now.
    pub fn batch_rows(&self, rows: usize) {
        self.batch_rows.store(rows as u64, Ordering::Relaxed);
    }

    /// A row finished with these token counts (`cached`: prompt tokens not run).
    pub fn tokens(&self, prompt: usize, cached: usize, completion: usize) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.cached_prompt_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion as u64, Ordering::Relaxed);
    }

    /// A completion request's first token arrived `after` it did.
    pub fn first_token(&self, after: Duration) {
        self.first_token.observe(after.as_secs_f64());
    }

    /// A completion request's answer was finished `after` it arrived.
    pub fn request_done(&self, after: Duration) {
        self.request_duration.observe(after.as_secs_f64());
    }

    fn answered(&self, route: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests.entry((route.to_string(), status)).or_default() += 1;
    }

    /// Everything, in the text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let name = "needle_http_requests_total";
        header(
            &mut out,
            name,
            "HTTP requests answered, by route pattern and status.",
            "counter",
        );
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for ((route, status), n) in requests.iter() {
            let route = label(route);
            let _ = writeln!(out, "{name}{{route=\"{route}\",status=\"{status}\"}} {n}");
        }
        drop(requests);
        let load = |v: &AtomicU64| v.load(Ordering::Relaxed);
        for (name, help, kind, value) in [
            (
                "needle_prompt_tokens_total",
                "Prompt tokens of the finished rows.",
                "counter",
                load(&self.prompt_tokens),
            ),
            (
                "needle_prompt_tokens_cached_total",
                "Prompt tokens of the finished rows taken from a prompt they continue, not run.",
                "counter",
                load(&self.cached_prompt_tokens),
            ),
            (
                "needle_completion_tokens_total",
                "Tokens generated by the finished rows.",
                "counter",
                load(&self.completion_tokens),
            ),
            (
                "needle_queue_depth",
                "Rows waiting for a place in the batch.",
                "gauge",
                load(&self.queued),
            ),
            (
                "needle_batch_rows",
                "Rows decoding in the batch.",
                "gauge",
                load(&self.batch_rows),
            ),
            (
                "needle_batch_capacity",
                "Rows the batch may hold (--max-batch).",
                "gauge",
                self.batch_capacity,
            ),
        ] {
            header(&mut out, name, help, kind);
            let _ = writeln!(out, "{name} {value}");
        }
        self.first_token.write(
            &mut out,
            "needle_time_to_first_token_seconds",
            "From a completion request's arrival to its first generated token.",
        );
        self.request_duration.write(
            &mut out,
            "needle_request_duration_seconds",
            "From a completion request's arrival to its answer's end (the last event of a stream).",
        );
        out
    }
}

/// The middleware that counts every answer by route and status.
pub async fn count_requests(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    metrics.answered(&route, response.status().as_u16());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_end_with_every_observation() {
        let m = Metrics::new(4);
        for s in [0.003, 0.2, 0.2, 500.0] {
            m.first_token(Duration::from_secs_f64(s));
        }
        let text = m.render();
        for line in [
            "needle_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
            "needle_time_to_first_token_seconds_bucket{le=\"0.1\"} 1",
            "needle_time_to_first_token_seconds_bucket{le=\"0.25\"} 3",
            "needle_time_to_first_token_seconds_bucket{le=\"120\"} 3",
            "needle_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4",
            "needle_time_to_first_token_seconds_count 4",
            "needle_batch_capacity 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        assert_eq!(label("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
