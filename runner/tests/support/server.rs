//! `needle-run serve` as a test talks to it: the binary on a free port, and Python clients
//! run against it.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use test_support::{python, repo_root};

/// A running server; killed if the test ends without stopping it.
pub struct Server {
    pub child: Child,
    pub base_url: String,
    pub stderr: Arc<Mutex<String>>,
    /// Reads the server's stderr until it exits.
    pub reader: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with_env(extra, &[])
    }

    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
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

    /// Runs `scenario` of the official client with `spec`'s extra fields.
    pub fn client(&self, scenario: &str, spec: Value) -> Value {
        self.script("openai_client.py", scenario, spec)
    }

    /// Runs `scenario` of `tests/python/{script}` with `spec`'s extra fields.
    pub fn script(&self, script: &str, scenario: &str, mut spec: Value) -> Value {
        spec["scenario"] = json!(scenario);
        self.run(
            python(),
            &repo_root().join("tests/python").join(script),
            spec,
        )
    }

    /// Runs the Python `script` with `python`, `spec` (with the server's `base_url` and
    /// `pid`) on its stdin; what it prints is JSON.
    pub fn run(&self, mut python: Command, script: &Path, mut spec: Value) -> Value {
        spec["base_url"] = json!(self.base_url);
        spec["pid"] = json!(self.child.id());
        let what = script.display();
        let mut py = python
            .arg(script)
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
            "{what}: {}\nserver: {}",
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
