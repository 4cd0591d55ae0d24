//! `needle-run` end to end: the demo query, raw mode against upstream's greedy
//! generations (through the tokenizer), `.onnx` input, providers, bad input.

mod support;

use exporter::model::NeedleModel;
use exporter::output::ExportFiles;
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget};
use serde_json::Value;
use std::process::{Command, Output};
use support::generate_refs;
use test_support::{fixture, scratch};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_needle-run"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn fails_with(o: &Output, says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "expected failure, got {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(err.contains(says), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("stack backtrace"),
        "{err}"
    );
}

#[test]
fn the_first_readme_command_answers_with_the_right_call() {
    let r = json_out(&run(&["--query", "turn off the kitchen lights"]));
    assert_eq!(r["type"], "call");
    assert_eq!(
        r["function_calls"],
        serde_json::json!([{"name": "set_lights", "arguments": {"room": "kitchen", "on": false}}])
    );
    for key in [
        "reasoning",
        "text",
        "provider",
        "prompt_tokens",
        "generated_tokens",
        "prefill_tps",
        "decode_tps",
        "peak_ram_mb",
        "confidence",
    ] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    assert!(r["confidence"].is_null());
    // Rates and sizes print with one decimal, as the README shows them.
    for key in ["prefill_tps", "decode_tps", "peak_ram_mb"] {
        let printed = r[key].to_string();
        let decimals = printed.split_once('.').map_or(0, |(_, d)| d.len());
        assert!(decimals <= 1, "{key} printed as {printed}");
    }
}

/// `auto` says in one short line which providers it skipped; `--verbose` adds
/// onnxruntime's reasons. (Where auto takes the first provider it tries, there is no line.)
#[test]
fn skipped_providers_are_one_short_line_unless_verbose() {
    let skip_line = |o: &Output| {
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .find(|l| l.contains("unavailable:"))
            .map(str::to_string)
    };
    let query = ["--query", "turn off the kitchen lights"];
    let quiet = run(&query);
    json_out(&quiet);
    let Some(line) = skip_line(&quiet) else {
        return;
    };
    assert!(line.len() <= 100, "{line}");
    assert!(line.ends_with("(--verbose says why)"), "{line}");
    let verbose = run(&[query[0], query[1], "--verbose"]);
    json_out(&verbose);
    let line = skip_line(&verbose).expect("the same providers are skipped");
    assert!(line.contains(" (") && !line.contains("--verbose"), "{line}");
}

/// Exports the fixture `model` as a fused fp32 graph for `runtime` to `onnx`, beside its
/// tokenizer, as needle-export does.
fn export_fused(model: &str, onnx: &std::path::Path, runtime: RuntimeTarget) {
    export_fused_as(
        model,
        ExportFiles::beside(onnx, &[AttentionKind::FUSED]),
        runtime,
    )
}

/// Exports the fixture `model` as a fused fp32 graph for `runtime` into `files`.
fn export_fused_as(model: &str, files: ExportFiles, runtime: RuntimeTarget) {
    let exported = NeedleModel::read(&fixture(&format!("{model}.cact"))).unwrap();
    let tokenizer = NeedleTokenizer::from_spec(&exported.tokenizer, true).unwrap();
    files
        .write(
            &exported,
            &tokenizer,
            Precision::Fp32,
            MatMulWeights::Float,
            runtime,
        )
        .unwrap();
}

/// From the `.cact`, its exported graph, and that graph with its weights in a data file
/// beside it (`--external-data`, which onnxruntime reads from the graph's folder).
#[test]
fn raw_mode_reproduces_upstream_generations_from_cact_and_from_exported_onnx() {
    let dir = scratch("run-raw");
    for model in ["m48", "m64", "m96"] {
        let cact = fixture(&format!("{model}.cact"));
        let onnx = dir.join(format!("{model}.onnx"));
        export_fused(model, &onnx, RuntimeTarget::Since1_24);
        let external = dir.join(format!("{model}.external.onnx"));
        let files = ExportFiles::beside(&external, &[AttentionKind::FUSED]).with_external_data();
        export_fused_as(model, files, RuntimeTarget::Since1_24);
        assert!(dir.join(format!("{model}.external.onnx.data")).exists());
        let models = [&cact, &onnx, &external].map(|p| p.display().to_string());
        for m in models {
            for r in generate_refs(model) {
                let prompt = r["prompt"].as_str().unwrap();
                let got = json_out(&run(&[
                    "--model",
                    &m,
                    "--provider",
                    "cpu",
                    "--raw",
                    prompt,
                    "--json",
                    "--max-new-tokens",
                    "32",
                ]));
                assert_eq!(
                    got["prompt_ids"], r["prompt_ids"],
                    "{m}: tokenizer differs from sentencepiece"
                );
                assert_eq!(got["generated_ids"], r["generated_ids"], "{m}");
                assert_eq!(got["text"], r["generated_text"], "{m}");
            }
        }
    }
}

/// A fused graph written for onnxruntime 1.20–1.23 runs in needle-run's onnxruntime as
/// exported, unless its sliding window binds: that one would see one key fewer, so it is
/// refused in one line.
#[test]
fn an_onnxruntime_1_20_graph_runs_unless_its_window_would_narrow() {
    let dir = scratch("run-onnxruntime-1.20");
    let export = |model: &str| {
        let onnx = dir.join(format!("{model}.onnx"));
        export_fused(model, &onnx, RuntimeTarget::From1_20To1_23);
        onnx.display().to_string()
    };
    let m64 = export("m64");
    let r = &generate_refs("m64")[0];
    let prompt = r["prompt"].as_str().unwrap();
    let raw = ["--raw", prompt, "--json", "--max-new-tokens", "32"];
    let got = json_out(&run(&[&["--model", m64.as_str()], &raw[..]].concat()));
    assert_eq!(got["generated_ids"], r["generated_ids"]);
    let m64w = export("m64w");
    let o = run(&[&["--model", m64w.as_str()], &raw[..]].concat());
    fails_with(&o, "--onnxruntime");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr)
            .trim_end()
            .lines()
            .count(),
        1
    );
}

#[test]
fn a_named_provider_that_cannot_register_is_an_error_unless_fallback() {
    let o = run(&["--provider", "cuda", "--query", "play Coldplay"]);
    fails_with(&o, "cuda");
    let r = json_out(&run(&[
        "--provider",
        "cuda",
        "--fallback",
        "--query",
        "play Coldplay",
    ]));
    assert_eq!(r["provider"], "cpu");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = scratch("run-bad");
    let not_json = dir.join("tools.json");
    std::fs::write(&not_json, "[{\"name\": ").unwrap();
    let not_list = dir.join("object.json");
    std::fs::write(&not_list, "{\"name\": \"x\"}").unwrap();
    let nameless = dir.join("nameless.json");
    std::fs::write(&nameless, "[{\"description\": \"x\"}]").unwrap();
    let not_model = dir.join("model.cact");
    std::fs::write(&not_model, "hello").unwrap();
    let (nj, nl, nn, nm) = (
        not_json.display().to_string(),
        not_list.display().to_string(),
        nameless.display().to_string(),
        not_model.display().to_string(),
    );
    fails_with(&run(&["--tools", &nj, "--query", "hi"]), "not valid JSON");
    fails_with(&run(&["--tools", &nl, "--query", "hi"]), "JSON array");
    fails_with(&run(&["--tools", &nn, "--query", "hi"]), "name");
    fails_with(&run(&["--query", "  "]), "query");
    fails_with(
        &run(&["--query", "hi", "--max-new-tokens", "0"]),
        "max-new-tokens",
    );
    fails_with(&run(&["--provider", "tpu", "--query", "hi"]), "tpu");
    fails_with(
        &run(&["--model", "/nonexistent/model.cact", "--query", "hi"]),
        "/nonexistent/model.cact",
    );
    fails_with(
        &run(&["--model", &nm, "--provider", "cpu", "--query", "hi"]),
        "model.cact",
    );
    let long = "word ".repeat(600);
    fails_with(&run(&["--provider", "cpu", "--raw", &long]), "max_seq_len");
}

/// A graph exported with `--external-data` whose data file is cut short, or gone, is one
/// error line naming the data file, before onnxruntime gets it.
#[test]
fn an_external_data_graph_without_its_whole_data_file_is_one_error_line() {
    let dir = scratch("run-external-short");
    let onnx = dir.join("m64.onnx");
    let files = ExportFiles::beside(&onnx, &[AttentionKind::FUSED]).with_external_data();
    export_fused_as("m64", files, RuntimeTarget::Since1_24);
    let data = dir.join("m64.onnx.data");
    let len = std::fs::metadata(&data).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    file.set_len(len - 1).unwrap();
    let m = onnx.display().to_string();
    let args = ["--model", &m, "--provider", "cpu", "--raw", "hi"];
    let o = run(&args);
    fails_with(&o, &format!("{}: holds {} bytes", data.display(), len - 1));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    std::fs::remove_file(&data).unwrap();
    let o = run(&args);
    fails_with(&o, &data.display().to_string());
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
}

#[test]
fn an_onnx_that_needle_export_did_not_write_is_a_clear_error() {
    use graphs::builder::{Dim, GraphBuilder, Opset};
    use graphs::onnx::data_type;
    use prost::Message;
    let mut b = GraphBuilder::new(Opset::V21, Precision::Fp32);
    let x = b.input("x", data_type::FLOAT, &[Dim::Fixed(1)]);
    b.output(&x, "y", data_type::FLOAT, &[Dim::Fixed(1)]);
    let dir = scratch("run-foreign");
    let path = dir.join("identity.onnx");
    std::fs::write(
        &path,
        b.finish("identity", String::new(), Vec::new())
            .encode_to_vec(),
    )
    .unwrap();
    let p = path.display().to_string();
    fails_with(
        &run(&["--model", &p, "--provider", "cpu", "--query", "hi"]),
        "not a needle-export graph",
    );
}

/// Sampling options that would do nothing, or nothing sensible, are refused by clap with
/// one line and exit 2 instead of being ignored.
#[test]
fn sampling_options_that_do_nothing_are_errors() {
    let query = [
        "--query",
        "turn on the kitchen lights",
        "--max-new-tokens",
        "4",
    ];
    for (extra, says) in [
        (&["--seed", "7"][..], "--temperature"),
        (&["--temperature=-1"][..], "not a positive number"),
        (&["--temperature", "NaN"][..], "not a positive number"),
        (&["--temperature", "0"][..], "not a positive number"),
    ] {
        let o = run(&[&query[..], extra].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    let o = run(&[&query[..], &["--temperature", "0.7", "--seed", "7"]].concat());
    assert!(json_out(&o)["success"].is_boolean());
}

/// `--weights` chooses how a `.cact` is exported; with an exported graph it would do
/// nothing, so it is an error naming the file.
#[test]
fn weights_with_an_exported_graph_is_an_error() {
    let onnx = scratch("weights-onnx").join("m64.onnx");
    export_fused("m64", &onnx, RuntimeTarget::Since1_24);
    let path = onnx.to_str().unwrap();
    let o = run(&["--model", path, "--raw", "hi", "--weights", "int4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("m64.onnx: --weights picks how a .cact is exported"),
        "{err}"
    );
    let plain = run(&["--model", path, "--raw", "hi", "--max-new-tokens", "2"]);
    assert!(plain.status.success());
}

/// `--constrain` with a `--tools` file (read as Python reads it and rendered verbatim).
#[test]
fn constrain_reads_a_tools_file() {
    let tools = scratch("constrain-tools").join("tools.json");
    std::fs::write(&tools, runner::load::DEMO_TOOLS).unwrap();
    let o = run(&[
        "--tools",
        tools.to_str().unwrap(),
        "--query",
        "turn on the kitchen lights",
        "--constrain",
    ]);
    let answer = json_out(&o);
    assert_eq!(answer["success"], true, "{answer}");
    assert_eq!(
        answer["function_calls"][0]["name"], "set_lights",
        "{answer}"
    );
}

/// An OpenAI-form tool file (what `serve` takes) answers as the same tools in Needle's flat
/// form do, prompt and calls alike, unconstrained, under the grammar and on a `--batch`
/// line; a tool the prompt cannot name is one error naming the file and the tool.
#[test]
fn tools_files_in_openai_form_answer_as_the_flat_form() {
    let dir = scratch("openai-tools");
    let flat_tools: Value = serde_json::from_str(runner::load::DEMO_TOOLS).unwrap();
    let wrapped: Vec<Value> = flat_tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| serde_json::json!({"type": "function", "function": t}))
        .collect();
    let (flat, openai) = (dir.join("flat.json"), dir.join("openai.json"));
    std::fs::write(&flat, runner::load::DEMO_TOOLS).unwrap();
    std::fs::write(&openai, Value::Array(wrapped.clone()).to_string()).unwrap();
    let query = "turn off the bedroom lights and set a timer for 5 minutes";
    for extra in [&[][..], &["--constrain"][..]] {
        let answer = |tools: &std::path::Path| {
            let args = [
                &["--tools", tools.to_str().unwrap(), "--query", query][..],
                extra,
            ];
            json_out(&run(&args.concat()))
        };
        let (want, got) = (answer(&flat), answer(&openai));
        assert!(
            !want["function_calls"].as_array().unwrap().is_empty(),
            "{want}"
        );
        for key in ["function_calls", "reasoning", "prompt_tokens", "success"] {
            assert_eq!(got[key], want[key], "{extra:?} {key}");
        }
    }
    let file = dir.join("queries.jsonl");
    let line = serde_json::json!({"query": query, "tools": wrapped});
    std::fs::write(&file, line.to_string()).unwrap();
    let batched = json_out(&run(&["--batch", file.to_str().unwrap()]));
    let alone = json_out(&run(&["--query", query]));
    assert_eq!(batched["function_calls"], alone["function_calls"]);

    std::fs::write(
        &openai,
        r#"[{"type": "function", "function": {"description": "x"}}]"#,
    )
    .unwrap();
    let o = run(&["--tools", openai.to_str().unwrap(), "--query", "hi"]);
    fails_with(&o, "openai.json: tools[0]: no string \"name\"");
    std::fs::write(
        &openai,
        r#"[{"name": "a"}, {"type": "function", "function": {"name": "a"}}]"#,
    )
    .unwrap();
    let o = run(&["--tools", openai.to_str().unwrap(), "--query", "hi"]);
    fails_with(&o, "tools[1]: \"a\" is declared twice");
}

/// `--batch`: one answer a line, in order, each what `--query` answers alone; a bad line
/// is one error naming the file and line.
#[test]
fn batch_answers_each_line_as_query_would() {
    let dir = scratch("batch-cli");
    let queries = [
        "turn on the kitchen lights",
        "set the thermostat to 21 on heat",
        "what's the weather in Paris",
        "tell me a joke",
        "turn off the bedroom lights and set a timer for 5 minutes",
    ];
    let file = dir.join("queries.jsonl");
    let mut lines: Vec<String> = queries
        .iter()
        .map(|q| serde_json::json!({ "query": q }).to_string())
        .collect();
    lines.insert(2, String::new());
    std::fs::write(&file, lines.join("\n")).unwrap();
    let o = run(&["--batch", file.to_str().unwrap(), "--batch-size", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let answers: Vec<Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), queries.len());
    for (q, batched) in queries.iter().zip(&answers) {
        let alone = json_out(&run(&["--query", q]));
        for key in ["function_calls", "reasoning", "text", "generated_tokens"] {
            assert_eq!(batched[key], alone[key], "{q}: {key}");
        }
    }
    std::fs::write(&file, "{\"query\": \"hi\"}\n{\"tools\": []}\n").unwrap();
    let o = run(&["--batch", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("queries.jsonl:2: no \"query\" string"),
        "{err}"
    );
}

/// `--top-tools K` through the binary: a 120-tool catalogue too long for the context runs
/// when only the best 3 are rendered (their ranking against upstream's is tested in
/// tests/tests/needle2_heads.rs); a model without the contrastive head is one error line.
#[test]
fn top_tools_renders_only_the_best_k() {
    let dir = scratch("top-tools");
    let text = std::fs::read_to_string(fixture("m48h.retrieval.json")).unwrap();
    let catalogue: Value = serde_json::from_str(&text).unwrap();
    let tools = dir.join("tools.json");
    std::fs::write(&tools, catalogue["tools"].to_string()).unwrap();
    let query = catalogue["cases"][0]["query"].as_str().unwrap();
    let m48h = fixture("m48h.cact");
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            "--provider".to_string(),
            "cpu".to_string(),
            "--model".to_string(),
            m48h.to_str().unwrap().to_string(),
            "--tools".to_string(),
            tools.to_str().unwrap().to_string(),
            "--query".to_string(),
            query.to_string(),
            "--max-new-tokens".to_string(),
            "4".to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run_owned = |a: Vec<String>| run(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let whole = run_owned(args(&[]));
    assert_eq!(whole.status.code(), Some(1));
    let answer = json_out(&run_owned(args(&["--top-tools", "3"])));
    assert!(answer["prompt_tokens"].as_u64().unwrap() < 512, "{answer}");
    let m48 = fixture("m48.cact");
    let o = run(&[
        "--provider",
        "cpu",
        "--model",
        m48.to_str().unwrap(),
        "--query",
        "hi",
        "--top-tools",
        "2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// `--messages` continues a conversation as `needle-run serve` does: the prompt is the
/// query's upstream prompt followed by the call and its result in the conversation format
/// (`runner/src/prompt.rs`), written out here by hand; a conversation that ends with the
/// assistant's turn, or a file that is not one, is one error line.
#[test]
fn messages_continue_a_conversation() {
    let dir = scratch("messages");
    let path = dir.join("loop.json");
    let calls = r#"[{"name":"set_lights","arguments":{"room":"kitchen","on":false}}]"#;
    std::fs::write(
        &path,
        serde_json::to_string(&serde_json::json!([
            {"role": "user", "content": "turn off the kitchen lights"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
              "function": {"name": "set_lights", "arguments": "{\"room\":\"kitchen\",\"on\":false}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"},
        ]))
        .unwrap(),
    )
    .unwrap();
    let got = json_out(&run(&["--messages", path.to_str().unwrap()]));
    let tools: Value = serde_json::from_str(runner::load::DEMO_TOOLS).unwrap();
    let history = format!(
        "{}<tool_call>{calls}</tool_call><|im_end|>\n<|im_start|>user\n<tool_result>[{{\"ok\":true}}]</tool_result><|im_end|>\n<|im_start|>assistant\n",
        runner::prompt::render_prompt(&tools, "turn off the kitchen lights", None),
    );
    let model = runner::load::load(
        &runner::load::ModelSource::Demo,
        &runner::load::LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(
        got["prompt_tokens"].as_u64(),
        Some(1 + model.tokenizer.encode(&history).len() as u64),
        "{got}"
    );

    let ends_with_assistant = dir.join("assistant.json");
    std::fs::write(
        &ends_with_assistant,
        r#"[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]"#,
    )
    .unwrap();
    fails_with(
        &run(&["--messages", ends_with_assistant.to_str().unwrap()]),
        "nothing to answer",
    );
    let not_json = dir.join("not.json");
    std::fs::write(&not_json, "{oops").unwrap();
    fails_with(
        &run(&["--messages", not_json.to_str().unwrap()]),
        "not JSON",
    );
}
