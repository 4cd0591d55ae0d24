//! `needle-run serve` through the official `openai` Python client
//! (`tests/python/openai_client.py`): tool calls, plain answers, streaming, `tool_choice`,
//! 32 concurrent requests, refusals, limits and SIGTERM, each judged against `needle-run`'s
//! one-at-a-time answers (the in-process `Runner`, which the CLI tests check against
//! upstream) or against what the OpenAI API specifies.

use runner::answer::Runner;
use runner::load::{LoadOptions, ModelSource};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use test_support::{python, repo_root};

/// A running server; killed if the test ends without stopping it.
struct Server {
    child: Child,
    base_url: String,
    stderr: Arc<Mutex<String>>,
    /// Reads the server's stderr until it exits.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::start_with_env(extra, &[])
    }

    fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_needle-run"))
            .args(["serve", "--provider", "cpu", "--port", "0"])
            .args(extra)
            .env_remove("NEEDLE_API_KEY")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = BufReader::new(child.stderr.take().unwrap());
        let log = stderr.clone();
        let reader = std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let serving = line.starts_with("needle-run: serving ");
                if let Some(url) = serving
                    .then(|| line.split(" on ").nth(1))
                    .flatten()
                    .and_then(|s| s.split(' ').next())
                {
                    let _ = tx.send(url.to_string());
                }
                log.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let base_url = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("the server did not start: {}", stderr.lock().unwrap()));
        Server {
            child,
            base_url,
            stderr,
            reader: Some(reader),
        }
    }

    /// Runs `scenario` of the client with `spec`'s extra fields.
    fn client(&self, scenario: &str, mut spec: Value) -> Value {
        spec["base_url"] = json!(self.base_url);
        spec["scenario"] = json!(scenario);
        spec["pid"] = json!(self.child.id());
        let mut py = python()
            .arg(repo_root().join("tests/python/openai_client.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        py.stdin
            .take()
            .unwrap()
            .write_all(spec.to_string().as_bytes())
            .unwrap();
        let out = py.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "client {scenario}: {}\nserver: {}",
            String::from_utf8_lossy(&out.stderr),
            self.stderr.lock().unwrap()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The demo model's held-out queries (tools in Needle's flat form).
fn held_out(n: usize) -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|l| {
            let ex: Value = serde_json::from_str(l).unwrap();
            json!({"query": ex["query"], "tools": ex["tools"]})
        })
        .collect()
}

/// `needle-run`'s calls for `query`, as the client reports calls (`arguments` parsed).
fn one_at_a_time(runner: &mut Runner, q: &Value, system: Option<&str>) -> Vec<Value> {
    let query = q["query"].as_str().unwrap();
    let r = runner.complete(&q["tools"], query, system, 256).unwrap();
    r.function_calls
        .iter()
        .map(|c| json!({"name": c["name"], "arguments": c["arguments"]}))
        .collect()
}

/// The client's calls without their ids (checked separately).
fn calls(message: &Value) -> Vec<Value> {
    message["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"name": c["name"], "arguments": c["arguments"]}))
        .collect()
}

fn refused(r: &Value, status: u64, param: Option<&str>, says: &str) {
    assert_eq!(r["status"], status, "{r}");
    assert_eq!(r["param"].as_str(), param, "{r}");
    assert!(
        r["message"].as_str().unwrap_or_default().contains(says),
        "{r}"
    );
}

#[test]
fn the_openai_client_gets_needle_runs_answers() {
    let queries = held_out(32);
    let system = "You control a smart home.";
    let server = Server::start(&[]);
    let got = server.client("answers", json!({"queries": queries, "system": system}));
    let mut runner = Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap();
    let want = one_at_a_time(&mut runner, &queries[0], None);
    assert!(!want.is_empty(), "the first held-out query calls tools");

    assert_eq!(got["models"], json!(["needle-demo"]));
    let call = &got["tool_call"];
    assert_eq!(calls(call), want);
    assert_eq!(call["finish_reason"], "tool_calls");
    assert!(call["content"].is_null(), "{call}");
    let ids: Vec<&str> = call["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(ids.iter().all(|id| id.starts_with("call_")), "{ids:?}");
    assert!(ids.windows(2).all(|w| w[0] != w[1]), "{ids:?}");
    let usage = &call["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );
    assert_eq!(call["needle"]["success"], true);
    assert_eq!(call["needle"]["provider"], "cpu");
    assert!(call["needle"]["reasoning"]
        .as_str()
        .is_some_and(|r| !r.is_empty()));

    let mut constrained = Runner::new(&ModelSource::Demo, &LoadOptions::default())
        .unwrap()
        .constrained()
        .unwrap();
    assert_eq!(
        calls(&got["constrained"]),
        one_at_a_time(&mut constrained, &queries[0], None)
    );

    // Streamed: the same calls, reasoning and usage, in more than a handful of chunks.
    let stream = &got["stream"];
    assert_eq!(calls(stream), want);
    assert_eq!(stream["finish_reason"], "tool_calls");
    assert_eq!(stream["reasoning"], call["needle"]["reasoning"]);
    assert_eq!(stream["content"], "");
    assert_eq!(stream["usage"], call["usage"]);
    assert!(stream["chunks"].as_u64().unwrap() > 5, "{stream}");

    // tool_choice: none gives Needle's "respond" answer (an empty call list, no text);
    // required and a named function call.
    let none = &got["none"];
    assert_eq!(none["tool_calls"], json!([]));
    assert_eq!(none["content"], "", "{none}");
    assert_eq!(none["finish_reason"], "stop");
    assert_eq!(none["needle"]["success"], true);
    let required = &got["required"];
    assert!(!calls(required).is_empty());
    assert_eq!(required["finish_reason"], "tool_calls");
    let declared: Vec<&Value> = queries[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["name"])
        .collect();
    assert!(calls(required)
        .iter()
        .all(|c| declared.contains(&&c["name"])));
    let named = calls(&got["named"]);
    assert!(!named.is_empty());
    assert!(
        named.iter().all(|c| c["name"] == got["named_tool"]),
        "{named:?}"
    );

    // parallel_tool_calls false: the first query's two calls become one, under the grammar.
    assert_eq!(want.len(), 2);
    let one_call = calls(&got["one_call"]);
    assert_eq!(one_call.len(), 1, "{one_call:?}");
    assert!(declared.contains(&&one_call[0]["name"]));

    assert_eq!(
        calls(&got["system"]),
        one_at_a_time(&mut runner, &queries[0], Some(system))
    );

    // 32 requests at once: each gets its one-at-a-time answer, calls and reasoning and
    // length; the plain ("respond") answers among them have no calls and empty content.
    let concurrent = got["concurrent"].as_array().unwrap();
    assert_eq!(concurrent.len(), 32);
    let mut plain = 0;
    for (q, answer) in queries.iter().zip(concurrent) {
        let query = q["query"].as_str().unwrap();
        let alone = runner.complete(&q["tools"], query, None, 256).unwrap();
        assert_eq!(
            calls(answer),
            one_at_a_time(&mut runner, q, None),
            "{query}"
        );
        assert_eq!(
            answer["needle"]["reasoning"],
            alone.reasoning.as_str(),
            "{query}"
        );
        assert_eq!(
            answer["usage"]["completion_tokens"], alone.generated_tokens,
            "{query}"
        );
        let ran_out =
            alone.generated_tokens == 256 || alone.prompt_tokens + alone.generated_tokens == 512;
        let finish = match (alone.function_calls.is_empty(), ran_out) {
            (false, _) => "tool_calls",
            (true, false) => "stop",
            (true, true) => "length",
        };
        assert_eq!(answer["finish_reason"], finish, "{query}");
        if alone.function_calls.is_empty() {
            assert_eq!(answer["content"], alone.text.as_str(), "{query}");
            plain += usize::from(alone.success);
        }
    }
    assert!(
        plain > 0,
        "the first 32 held-out queries include plain answers"
    );

    let bad = &got["bad"];
    assert_eq!(bad["not_json"]["status"], 400);
    assert!(bad["not_json"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not JSON"));
    refused(&bad["no_messages"], 400, Some("messages"), "user message");
    refused(&bad["assistant_turn"], 400, Some("messages"), "assistant");
    refused(
        &bad["unknown_function"],
        400,
        Some("tool_choice"),
        "no_such_tool",
    );
    refused(&bad["n2"], 400, Some("n"), "n = 1");
    refused(&bad["bad_temperature"], 400, Some("temperature"), "0 to 2");
    refused(&bad["too_long"], 400, None, "context is 512 tokens");
    assert_eq!(got["health_after"]["status"], "ok");
}

#[test]
fn a_busy_server_refuses_with_429_times_out_with_504_and_limits_bodies_with_413() {
    let server = Server::start(&["--max-batch", "1", "--queue", "1", "--max-body", "4096"]);
    let got = server.client("limits", json!({"queries": held_out(1)}));
    let statuses: Vec<u64> = got["burst"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert!(
        statuses.iter().all(|s| [200, 429, 504].contains(s)),
        "{statuses:?}"
    );
    let busy = got["burst"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["status"] == 429)
        .unwrap_or_else(|| {
            panic!("12 requests at once on a batch of 1 and a queue of 1: {statuses:?}")
        });
    refused(busy, 429, None, "busy");
    assert_eq!(got["too_large"]["status"], 413, "{}", got["too_large"]);
    assert_eq!(got["quick_after"]["finish_reason"], "length");
    drop(server);
    // A millisecond is shorter than the demo's prefill on any machine.
    let server = Server::start(&["--request-timeout", "0.001"]);
    let got = server.client("timeout", json!({"queries": held_out(1)}));
    refused(&got["timeout"], 504, None, "--request-timeout");
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_then_stops() {
    let mut server = Server::start(&[]);
    let got = server.client("drain", json!({"queries": held_out(1)}));
    assert!(got["chunks"].as_u64().unwrap() > 2, "{got}");
    assert!(
        ["stop", "length"].contains(&got["finish_reason"].as_str().unwrap()),
        "{got}"
    );
    assert_eq!(got["after"], "refused");
    let status = server.child.wait().unwrap();
    server.reader.take().unwrap().join().unwrap();
    assert!(status.success(), "{}", server.stderr.lock().unwrap());
    assert!(server
        .stderr
        .lock()
        .unwrap()
        .contains("needle-run: stopped"));
}

/// A metric's value as prometheus_client's parser read it (`name{label=value,…}`); 0 when
/// the series is not there yet.
fn sample(scrape: &Value, key: &str) -> f64 {
    scrape["samples"][key].as_f64().unwrap_or(0.0)
}

fn requests(scrape: &Value, route: &str, status: u16) -> f64 {
    sample(
        scrape,
        &format!("needle_http_requests_total{{route={route},status={status}}}"),
    )
}

fn usage_sum(answers: &[Value], key: &str) -> f64 {
    answers
        .iter()
        .map(|a| a["usage"][key].as_f64().unwrap())
        .sum()
}

/// `GET /v1/models/{id}` as `client.models.retrieve` reads it, unknown model names 404
/// `model_not_found` as OpenAI's API answers them, and `/metrics` as a Prometheus server
/// scrapes it (read by prometheus_client's parser): each counter moves by what the requests
/// did, as their answers report it, and while eight long answers run on a batch of two, two
/// rows decode and the rest wait in the queue.
#[test]
fn models_by_id_unknown_models_and_metrics() {
    let server = Server::start(&["--max-batch", "2"]);
    let got = server.client("models_and_metrics", json!({"queries": held_out(1)}));
    assert_eq!(
        got["retrieved"],
        json!({"id": "needle-demo", "object": "model", "owned_by": "needle-onnx"})
    );
    for key in ["unknown_retrieve", "unknown_chat"] {
        let r = &got[key];
        refused(r, 404, Some("model"), "gpt-4o");
        assert_eq!(r["code"], "model_not_found", "{r}");
        assert_eq!(r["exception"], "NotFoundError", "{r}");
    }
    assert_eq!(got["no_route"], 404);

    let (before, after, end) = (&got["before"], &got["after"], &got["end"]);
    assert!(
        after["content_type"]
            .as_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{after}"
    );
    let chat = "/v1/chat/completions";
    let moved =
        |route: &str, status: u16| requests(after, route, status) - requests(before, route, status);
    assert_eq!(moved(chat, 200), 2.0);
    assert_eq!(moved(chat, 404), 1.0);
    assert_eq!(moved("/v1/models/{id}", 200), 1.0);
    assert_eq!(moved("/v1/models/{id}", 404), 1.0);
    assert_eq!(moved("unmatched", 404), 1.0);
    assert_eq!(
        moved("/metrics", 200),
        1.0,
        "the first scrape, counted once answered"
    );
    let answers = got["answers"].as_array().unwrap();
    let tokens = |s: &Value, kind: &str| sample(s, &format!("needle_{kind}_tokens_total{{}}"));
    for (kind, usage) in [
        ("prompt", "prompt_tokens"),
        ("completion", "completion_tokens"),
    ] {
        assert_eq!(
            tokens(after, kind) - tokens(before, kind),
            usage_sum(answers, usage),
            "{kind}"
        );
    }
    for name in ["time_to_first_token", "request_duration"] {
        let series = |s: &Value, part: &str| sample(s, &format!("needle_{name}_seconds_{part}"));
        assert_eq!(series(after, "count{}"), 2.0, "{name}");
        assert_eq!(series(after, "bucket{le=+Inf}"), 2.0, "{name}");
        assert!(series(after, "sum{}") > 0.0, "{name}");
    }
    assert!(
        sample(after, "needle_request_duration_seconds_sum{}")
            >= sample(after, "needle_time_to_first_token_seconds_sum{}")
    );

    let burst = got["burst"].as_array().unwrap();
    assert!(
        burst.iter().all(|a| a["finish_reason"] != Value::Null),
        "{burst:?}"
    );
    assert_eq!(got["seen"]["batch_rows"], 2.0, "{}", got["seen"]);
    assert!(
        got["seen"]["queue_depth"].as_f64().unwrap() >= 1.0,
        "{}",
        got["seen"]
    );
    assert_eq!(sample(end, "needle_batch_rows{}"), 0.0);
    assert_eq!(sample(end, "needle_queue_depth{}"), 0.0);
    assert_eq!(sample(end, "needle_batch_capacity{}"), 2.0);
    assert_eq!(
        tokens(end, "completion") - tokens(after, "completion"),
        usage_sum(burst, "completion_tokens")
    );
    assert_eq!(
        sample(end, "needle_time_to_first_token_seconds_count{}"),
        10.0
    );
}

/// `--api-key`: the official client with another key gets 401 `invalid_api_key` on every
/// route (`AuthenticationError`), and so does a request with no key; `/health` answers
/// anyone; with the key (here from NEEDLE_API_KEY) everything works. A non-loopback
/// `--host` warns only without a key, and an empty key is refused.
#[test]
fn an_api_key_guards_every_route_but_health() {
    let key = "sk-needle-test-4b1d";
    let server = Server::start_with_env(&["--host", "0.0.0.0"], &[("NEEDLE_API_KEY", key)]);
    let got = server.client("auth", json!({"queries": held_out(1), "key": key}));
    assert!(!server.stderr.lock().unwrap().contains("warning"));
    for (what, r) in got["wrong_key"].as_object().unwrap() {
        refused(r, 401, None, "API key");
        assert_eq!(r["code"], "invalid_api_key", "{what}: {r}");
        assert_eq!(r["exception"], "AuthenticationError", "{what}: {r}");
    }
    let no_key = &got["no_key"];
    assert_eq!(no_key["chat"]["status"], 401, "{no_key}");
    assert_eq!(no_key["chat"]["error"]["code"], "invalid_api_key");
    for route in ["metrics", "models", "unknown_route"] {
        assert_eq!(no_key[route], 401, "{route}: {no_key}");
    }
    assert_eq!(got["health"], 200);
    let with_key = &got["with_key"];
    assert_eq!(with_key["models"], json!(["needle-demo"]));
    let mut runner = Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap();
    let want = one_at_a_time(&mut runner, &held_out(1)[0], None);
    assert_eq!(calls(&with_key["answer"]), want);
    let metrics = json!({"samples": with_key["metrics"]});
    assert_eq!(
        requests(&metrics, "/v1/chat/completions", 401),
        3.0,
        "{metrics}"
    );
    assert_eq!(
        requests(&metrics, "/v1/chat/completions", 200),
        1.0,
        "{metrics}"
    );
    drop(server);

    let open = Server::start(&["--host", "0.0.0.0"]);
    let stderr = open.stderr.lock().unwrap().clone();
    assert!(
        stderr.contains("needle-run: warning: --host 0.0.0.0") && stderr.contains("--api-key"),
        "{stderr}"
    );
    drop(open);
    let empty = Command::new(env!("CARGO_BIN_EXE_needle-run"))
        .args(["serve", "--provider", "cpu", "--port", "0", "--api-key", ""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&empty.stderr);
    assert_eq!(empty.status.code(), Some(1), "{err}");
    assert!(
        err.contains("NEEDLE_API_KEY") && err.contains("empty"),
        "{err}"
    );
}

/// `stop`, as OpenAI specifies it: the answer ends before the first stop sequence in the
/// decoded text, which is not returned, with finish_reason `stop`, whole and streamed (where
/// a tail that could begin a sequence is held back). Judged against the one-at-a-time
/// answer's reasoning cut at the sequence's first occurrence, and its call block.
#[test]
fn stop_sequences_end_the_answer_before_them() {
    let queries = held_out(1);
    let q = &queries[0];
    let mut runner = Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap();
    let alone = runner
        .complete(&q["tools"], q["query"].as_str().unwrap(), None, 256)
        .unwrap();
    assert!(!alone.function_calls.is_empty(), "{}", alone.reasoning);
    let reasoning = alone.reasoning.as_str();
    let words: Vec<&str> = reasoning
        .split_whitespace()
        .filter(|w| w.len() >= 3)
        .collect();
    let word = words[words.len() / 2];
    assert!(!"<think>".contains(word), "{word}");
    let before_word = reasoning[..reasoning.find(word).unwrap()].trim();
    assert!(!before_word.is_empty(), "{reasoning}");
    let server = Server::start(&[]);
    let got = server.client(
        "stops",
        json!({"queries": queries, "stops": {
            "in_reasoning": word,
            "in_calls": ["never written by the model", "\"arguments\""],
        }}),
    );
    for mode in ["whole", "stream"] {
        let cut = &got["in_reasoning"][mode];
        let said = match mode {
            "whole" => &cut["needle"]["reasoning"],
            _ => &cut["reasoning"],
        };
        assert_eq!(said, before_word, "{mode}: {cut}");
        assert_eq!(cut["finish_reason"], "stop", "{mode}: {cut}");
        assert_eq!(cut["tool_calls"], json!([]), "{mode}: {cut}");
        assert_eq!(cut["content"], "", "{mode}: {cut}");
        let used = cut["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(used < alone.generated_tokens as u64, "{mode}: {cut}");

        let cut = &got["in_calls"][mode];
        let said = match mode {
            "whole" => &cut["needle"]["reasoning"],
            _ => &cut["reasoning"],
        };
        assert_eq!(said, reasoning, "{mode}: {cut}");
        assert_eq!(cut["finish_reason"], "stop", "{mode}: {cut}");
        assert_eq!(cut["tool_calls"], json!([]), "{mode}: {cut}");
        assert_eq!(cut["needle"]["success"], false, "{mode}: {cut}");
    }
    refused(&got["too_many"], 400, Some("stop"), "at most 4");
    refused(&got["empty"], 400, Some("stop"), "empty");
}
