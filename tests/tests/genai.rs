//! A `needle-export --genai` folder of the demo model in stock onnxruntime-genai 0.18
//! (`.venv-genai`, `tests/python/genai_generate.py`): the 100 held-out tool queries give
//! `needle-run`'s function calls, one by one and in batches of 4 unequal prompts.
//! Prompt ids come from our tokenizer: genai's own does not split the tool prompts like
//! sentencepiece (README). The README's genai snippet (`examples/genai/generate.py`)
//! continues tool prompts like `needle-run --raw` up to the end of the turn (genai leaves
//! the stop token out).

use exporter::model::NeedleModel;
use exporter::output::ExportFiles;
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{AttentionKind, MatMulWeights, Precision};
use needle_tests::{python_in, repo_root, scratch};
use runner::answer::Runner;
use runner::load::{LoadOptions, ModelSource, DEMO_CACT};
use runner::prompt::{parse_answer, render_prompt, IM_END};
use serde_json::Value;
use std::path::Path;

const MAX_NEW_TOKENS: usize = 128;

/// Greedy generations of `prompts` through genai from the folder `dir`, `batch` at a time.
fn genai_generate(dir: &Path, prompts: &[Vec<u32>], batch: usize) -> Vec<Vec<u32>> {
    let input = dir.join(format!("prompts-{batch}.json"));
    std::fs::write(&input, serde_json::to_string(prompts).unwrap()).unwrap();
    let o = python_in(".venv-genai")
        .arg(repo_root().join("tests/python/genai_generate.py"))
        .arg(dir)
        .arg(&input)
        .arg(MAX_NEW_TOKENS.to_string())
        .arg(batch.to_string())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn stock_genai_gives_needle_runs_calls_on_the_demo_held_out_set() {
    let dir = scratch("genai-demo");
    let model = NeedleModel::from_bytes("needle-demo.cact", DEMO_CACT).unwrap();
    let tokenizer = NeedleTokenizer::from_spec(&model.tokenizer, true).unwrap();
    ExportFiles::genai_folder(&dir, AttentionKind::FUSED)
        .write(&model, &tokenizer, Precision::Fp32, MatMulWeights::Float)
        .unwrap();

    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    let examples: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(examples.len(), 100);
    let mut runner = Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap();
    let mut prompts = Vec::new();
    let mut expected = Vec::new();
    for ex in &examples {
        let query = ex["query"].as_str().unwrap();
        let prompt = render_prompt(&ex["tools"], query, None);
        prompts.push([vec![tokenizer.bos_id()], tokenizer.encode(&prompt)].concat());
        let answer = runner
            .complete(&ex["tools"], query, None, MAX_NEW_TOKENS)
            .unwrap();
        expected.push(Value::from(answer.function_calls));
    }

    let single = genai_generate(&dir, &prompts, 1);
    let calls = |ids: &[u32]| {
        let answer = parse_answer(&tokenizer.decode(ids));
        Value::from(answer.function_calls().to_vec())
    };
    let same = single
        .iter()
        .zip(&expected)
        .filter(|(ids, want)| calls(ids) == **want)
        .count();
    println!("genai single runs: {same}/100 calls equal needle-run's");
    assert_eq!(same, 100);

    let batched = genai_generate(&dir, &prompts, 4);
    let equal = batched.iter().zip(&single).filter(|(b, s)| b == s).count();
    println!("genai batches of 4: {equal}/100 generations equal the single runs");
    assert_eq!(equal, 100);

    let end_of_turn = tokenizer.token_id(IM_END).unwrap();
    for ex in &examples[..3] {
        let prompt = render_prompt(&ex["tools"], ex["query"].as_str().unwrap(), None);
        let o = python_in(".venv-genai")
            .arg(repo_root().join("examples/genai/generate.py"))
            .arg(&dir)
            .arg(&prompt)
            .arg(MAX_NEW_TOKENS.to_string())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let stdout = String::from_utf8(o.stdout).unwrap();
        let got: Vec<u32> = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
        let raw = runner.continue_raw(&prompt, MAX_NEW_TOKENS).unwrap();
        let turn = raw.generated_ids.iter().position(|&t| t == end_of_turn);
        let want = &raw.generated_ids[..turn.unwrap_or(raw.generated_ids.len())];
        assert_eq!(got, want, "{prompt}");
    }
}
