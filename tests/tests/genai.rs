//! `needle-export --genai` folders in stock onnxruntime-genai 0.18 (`.venv-genai`,
//! `tests/python/genai_*.py`), genai's own tokenizer and chat template included:
//! - genai's tokenizer gives sentencepiece's ids on the tokenizer cases (`m64.cact` carries
//!   their `tokenizer.model`; all but texts that start or end with a space, and the literal
//!   BOS spelling, which is genai's one added token) and on every rendered tool prompt;
//! - the chat template renders the BOS piece, then upstream `render_example`'s prompts byte
//!   for byte, but for one float's last digit;
//! - the demo model's 100 held-out tool queries, chat template → genai's ordinary encode
//!   (nothing prepended, as genai's example programs do) → greedy generation → genai decode,
//!   give `needle-run`'s prompt ids (one BOS) and function calls, one by one and in batches
//!   of 4 unequal prompts;
//! - the README's genai snippet (`examples/genai/generate.py`) generates `needle-run`'s
//!   tokens up to the end of the turn (genai leaves the stop token out);
//! - `needle-run` still reads the folder's graph, with the plain `model.tokenizer.json`;
//! - genai's partial `rewind_to` (into the answer, into the prompt, then an edited prompt)
//!   continues exactly as an unrewound or fresh generator, both variants (the token
//!   history the engram reads is a KV-cache pair, which genai crops).

use exporter::model::NeedleModel;
use exporter::output::ExportFiles;
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget};
use needle_tests::{fixture, python_in, repo_root, scratch};
use runner::answer::Runner;
use runner::load::{LoadOptions, ModelSource, DEMO_CACT};
use runner::prompt::{parse_answer, render_prompt, IM_END};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const MAX_NEW_TOKENS: usize = 128;
/// Tokenizer cases (of 200) where genai's ids equal sentencepiece's; the others start or end
/// with a space, which onnxruntime-extensions keeps, or are the BOS piece's spelling, which
/// genai reads as the BOS (exporter `genai::tokenizer`).
const TOKENIZER_CASES_EQUAL: usize = 180;
/// sentencepiece's spelling of Needle's BOS piece (id 2), which the chat template writes first.
const BOS_PIECE: &str = "<s>";
/// The prompt case whose tools hold a float that genai's template engine (minja, through
/// nlohmann's shortest digits) writes as 1234567890123456.7 where Python writes .8.
const FLOAT_DIGITS_CASE: &str = "writer_numbers";

/// A genai folder of `model` (fused fp32 graph) in a fresh scratch directory `name`, with
/// the tokenizer our runner uses for it.
fn genai_folder(name: &str, model: &NeedleModel) -> (PathBuf, NeedleTokenizer) {
    genai_folder_of(name, model, AttentionKind::FUSED)
}

/// [`genai_folder`] with the `attention` graph.
fn genai_folder_of(
    name: &str,
    model: &NeedleModel,
    attention: AttentionKind,
) -> (PathBuf, NeedleTokenizer) {
    genai_folder_as(name, model, |dir| ExportFiles::genai_folder(dir, attention))
}

/// A genai folder `name` of `model`, as `files` lays it out in the folder.
fn genai_folder_as(
    name: &str,
    model: &NeedleModel,
    files: impl FnOnce(&Path) -> ExportFiles,
) -> (PathBuf, NeedleTokenizer) {
    let dir = scratch(name);
    let tokenizer = NeedleTokenizer::from_spec(&model.tokenizer, true).unwrap();
    files(&dir)
        .write(
            model,
            &tokenizer,
            Precision::Fp32,
            MatMulWeights::Float,
            RuntimeTarget::Since1_24,
        )
        .unwrap();
    (dir, tokenizer)
}

fn demo() -> NeedleModel {
    NeedleModel::from_bytes("needle-demo.cact", DEMO_CACT).unwrap()
}

/// Runs `tests/python/<script>` in `.venv-genai` on the folder `dir` with `input` (written
/// as JSON beside it) and the further `args`; its stdout as JSON.
fn genai_script(script: &str, dir: &Path, input: &Value, args: &[String]) -> Value {
    let path = dir.join(format!("{script}.input.json"));
    std::fs::write(&path, input.to_string()).unwrap();
    let o = python_in(".venv-genai")
        .arg(repo_root().join("tests/python").join(script))
        .arg(dir)
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Chat messages for upstream `render_example`'s `system` and `query`.
fn messages(system: Option<&str>, query: &str) -> Value {
    let mut messages: Vec<Value> = system
        .map(|s| json!({"role": "system", "content": s}))
        .into_iter()
        .collect();
    messages.push(json!({"role": "user", "content": query}));
    Value::from(messages)
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn read_json(relative: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join(relative)).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn genai_tokenizer_gives_sentencepieces_ids_on_the_cases_and_every_tool_prompt() {
    let m64 = NeedleModel::read(&fixture("m64.cact")).unwrap();
    let (dir, _) = genai_folder("genai-tokenizer-m64", &m64);
    let cases = read_json("tests/fixtures/tokenizer.cases.json");
    let cases = cases.as_array().unwrap();
    let texts: Vec<&Value> = cases.iter().map(|c| &c["text"]).collect();
    let got = genai_script(
        "genai_tokenizer.py",
        &dir,
        &json!({"texts": texts, "chats": []}),
        &[],
    );
    let mut differing = Vec::new();
    for (case, got) in cases.iter().zip(got["ids"].as_array().unwrap()) {
        if ids(got) != ids(&case["sp_ids"]) {
            differing.push(case["text"].as_str().unwrap().to_string());
        }
    }
    let equal = cases.len() - differing.len();
    println!(
        "genai tokenizer: {equal}/{} cases equal sentencepiece",
        cases.len()
    );
    println!("differing: {differing:?}");
    assert_eq!(equal, TOKENIZER_CASES_EQUAL);
    let at_the_edges = |t: &str| t.starts_with(' ') || t.ends_with([' ', '\u{2581}']);
    let explained = |t: &str| at_the_edges(t) || t.contains(BOS_PIECE);
    assert!(differing.iter().all(|t| explained(t)), "{differing:?}");

    let (dir, _) = genai_folder("genai-tokenizer-demo", &demo());
    let cases = read_json("tests/fixtures/prompt.cases.json");
    let cases = cases["cases"].as_array().unwrap();
    let prompts: Vec<&Value> = cases.iter().map(|c| &c["prompt"]).collect();
    let got = genai_script(
        "genai_tokenizer.py",
        &dir,
        &json!({"texts": prompts, "chats": []}),
        &[],
    );
    for (case, got) in cases.iter().zip(got["ids"].as_array().unwrap()) {
        assert_eq!(ids(got), ids(&case["prompt_ids"]), "{}", case["name"]);
    }
    println!(
        "genai tokenizer: {0}/{0} tool prompts equal sentencepiece",
        cases.len()
    );
}

#[test]
fn genai_chat_template_renders_upstream_render_example() {
    let (dir, _) = genai_folder("genai-template", &demo());
    let cases = read_json("tests/fixtures/prompt.cases.json");
    let cases = cases["cases"].as_array().unwrap();
    let chat = |case: &Value, tools: &Value| {
        let query = case["query"].as_str().unwrap();
        json!({"messages": messages(case["system"].as_str(), query), "tools": tools})
    };
    let mut chats: Vec<Value> = cases.iter().map(|c| chat(c, &c["tools"])).collect();
    // The tools as upstream writes them, handed over as one JSON string, come out verbatim.
    let float_case = cases
        .iter()
        .find(|c| c["name"] == FLOAT_DIGITS_CASE)
        .unwrap();
    let prompt = float_case["prompt"].as_str().unwrap();
    let written = prompt
        .split("<tools>")
        .nth(1)
        .unwrap()
        .split("</tools>")
        .next();
    chats.push(chat(float_case, &Value::from(written.unwrap())));
    let got = genai_script(
        "genai_tokenizer.py",
        &dir,
        &json!({"texts": [], "chats": chats}),
        &[],
    );
    let got = got["prompts"].as_array().unwrap();
    let after_bos = |case: &Value| format!("{BOS_PIECE}{}", case["prompt"].as_str().unwrap());
    let mut differing = Vec::new();
    for (case, got) in cases.iter().zip(got) {
        if got.as_str() != Some(after_bos(case).as_str()) {
            differing.push(case["name"].as_str().unwrap());
        }
    }
    println!(
        "genai chat template: {}/{} prompts equal render_example's",
        cases.len() - differing.len(),
        cases.len()
    );
    assert_eq!(differing, [FLOAT_DIGITS_CASE]);
    assert_eq!(
        got[cases.len()].as_str(),
        Some(after_bos(float_case).as_str())
    );
}

/// The demo model's held-out examples (`runner/demo/eval.jsonl`).
fn eval_examples() -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    let examples: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(examples.len(), 100);
    examples
}

/// `render_example`'s prompt for eval example `ex`.
fn render(ex: &Value) -> String {
    render_prompt(&ex["tools"], ex["query"].as_str().unwrap(), None)
}

/// A folder exported with `--external-data` (`model.onnx.data` beside `model.onnx`) runs
/// in stock genai and generates what the folder with the weights inside does.
#[test]
fn stock_genai_runs_a_folder_with_external_data_as_the_one_without() {
    let model = demo();
    let (inside, _) = genai_folder("genai-inside", &model);
    let (beside, _) = genai_folder_as("genai-external", &model, |dir| {
        ExportFiles::genai_folder(dir, AttentionKind::FUSED).with_external_data()
    });
    assert!(beside.join("model.onnx.data").is_file());
    let chats: Vec<Value> = eval_examples()[..8]
        .iter()
        .map(|ex| {
            let query = ex["query"].as_str().unwrap();
            json!({"messages": messages(None, query), "tools": ex["tools"]})
        })
        .collect();
    let args = [MAX_NEW_TOKENS.to_string(), "4".to_string()];
    let generate =
        |dir: &Path| genai_script("genai_generate.py", dir, &Value::from(chats.clone()), &args);
    let (want, got) = (generate(&inside), generate(&beside));
    let ids = |runs: &Value| -> Vec<Value> {
        runs.as_array()
            .unwrap()
            .iter()
            .map(|r| r["generated_ids"].clone())
            .collect()
    };
    assert_eq!(ids(&got), ids(&want));
    assert!(ids(&want).iter().all(|g| !g.as_array().unwrap().is_empty()));
}

#[test]
fn stock_genai_gives_needle_runs_calls_on_the_demo_held_out_set() {
    let (dir, tokenizer) = genai_folder("genai-demo", &demo());
    let examples = eval_examples();
    let mut runner = Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap();
    let mut chats = Vec::new();
    let mut expected = Vec::new();
    for ex in &examples {
        let query = ex["query"].as_str().unwrap();
        chats.push(json!({"messages": messages(None, query), "tools": ex["tools"]}));
        let answer = runner
            .complete(&ex["tools"], query, None, MAX_NEW_TOKENS)
            .unwrap();
        expected.push(Value::from(answer.function_calls));
    }
    let generate = |batch: usize| -> Vec<Value> {
        let args = [MAX_NEW_TOKENS.to_string(), batch.to_string()];
        let out = genai_script(
            "genai_generate.py",
            &dir,
            &Value::from(chats.clone()),
            &args,
        );
        out.as_array().unwrap().clone()
    };

    let single = generate(1);
    let mut same_prompt_ids = 0;
    for (ex, run) in examples.iter().zip(&single) {
        let prompt = render(ex);
        assert_eq!(run["prompt"], format!("{BOS_PIECE}{prompt}"));
        let needle_ids = [vec![tokenizer.bos_id()], tokenizer.encode(&prompt)].concat();
        same_prompt_ids += usize::from(ids(&run["prompt_ids"]) == needle_ids);
    }
    println!("genai ordinary encode: {same_prompt_ids}/100 prompts give needle-run's ids");
    assert_eq!(same_prompt_ids, 100);
    let calls = |run: &Value| {
        let answer = parse_answer(run["text"].as_str().unwrap());
        Value::from(answer.function_calls().to_vec())
    };
    let same = single
        .iter()
        .zip(&expected)
        .filter(|(run, want)| calls(run) == **want)
        .count();
    println!("genai single runs: {same}/100 calls equal needle-run's");
    assert_eq!(same, 100);

    let batched = generate(4);
    let equal = batched
        .iter()
        .zip(&single)
        .filter(|(b, s)| b["generated_ids"] == s["generated_ids"])
        .count();
    println!("genai batches of 4: {equal}/100 generations equal the single runs");
    assert_eq!(equal, 100);

    let end_of_turn = tokenizer.token_id(IM_END).unwrap();
    for ex in &examples[..3] {
        let tools = dir.join("tools.json");
        std::fs::write(&tools, ex["tools"].to_string()).unwrap();
        let o = python_in(".venv-genai")
            .arg(repo_root().join("examples/genai/generate.py"))
            .arg(&dir)
            .arg(&tools)
            .arg(ex["query"].as_str().unwrap())
            .arg(MAX_NEW_TOKENS.to_string())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let stdout = String::from_utf8(o.stdout).unwrap();
        let got: Vec<u32> = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
        let prompt = render(ex);
        let raw = runner.continue_raw(&prompt, MAX_NEW_TOKENS).unwrap();
        let turn = raw.generated_ids.iter().position(|&t| t == end_of_turn);
        let want = &raw.generated_ids[..turn.unwrap_or(raw.generated_ids.len())];
        assert_eq!(got, want, "{prompt}");
    }

    // needle-run reads the folder too: its graph's metadata names model.tokenizer.json.
    let folder = ModelSource::Path(dir.join(exporter::genai::MODEL_FILE));
    let mut folder_runner = Runner::new(&folder, &LoadOptions::default()).unwrap();
    let ex = &examples[0];
    let query = ex["query"].as_str().unwrap();
    let answer = folder_runner.complete(&ex["tools"], query, None, MAX_NEW_TOKENS);
    assert_eq!(Value::from(answer.unwrap().function_calls), expected[0]);
}

#[test]
fn stock_genai_rewinds_to_any_length() {
    let examples = eval_examples();
    let chats: Vec<Value> = examples[..8]
        .iter()
        .map(|ex| json!({"messages": messages(None, ex["query"].as_str().unwrap()), "tools": ex["tools"]}))
        .collect();
    // Fused: genai shares one past/present buffer; reference: genai copies the cropped pasts.
    for attention in [AttentionKind::FUSED, AttentionKind::Reference] {
        let (dir, _) = genai_folder_of(&format!("genai-rewind-{attention}"), &demo(), attention);
        let args = [MAX_NEW_TOKENS.to_string()];
        let out = genai_script("genai_rewind.py", &dir, &Value::from(chats.clone()), &args);
        for (chat, result) in out.as_array().unwrap().iter().enumerate() {
            assert!(result["answer_tokens"].as_u64().unwrap() >= 8, "{result}");
            for check in ["answer", "prompt", "edit"] {
                let r = &result[check];
                println!("{attention} chat {chat} {check}: {r}");
                assert_eq!(r["equal"], true, "{attention} chat {chat} {check}: {r}");
                assert!(r["steps"].as_u64().unwrap() >= 4, "{r}");
                // Logits of the same positions computed in other chunks: float rounding only.
                assert!(r["max_logit_error"].as_f64().unwrap() <= 1e-4, "{r}");
            }
        }
    }
}
