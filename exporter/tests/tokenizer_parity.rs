//! `NeedleTokenizer` against independent references: sentencepiece's own ids and
//! decodes (`tests/fixtures/tokenizer.cases.json`, for the tokenizer embedded in
//! `m64.cact`) and upstream `RefTokenizer` plus sentencepiece's whitespace rule
//! on rendered demo prompts (`tests/fixtures/prompt.cases.json`).

use exporter::cact::Needle2File;
use exporter::cact::Needle3File;
use exporter::tokenizer::NeedleTokenizer;
use serde::Deserialize;
use std::path::PathBuf;
use test_support::{python, repo_root};

/// A Needle 3 tokenizer case (sentencepiece's ids and decode of `text`).
#[derive(Deserialize)]
struct Needle3Case {
    text: String,
    sp_ids: Vec<u32>,
    sp_decode: String,
}

#[derive(Deserialize)]
struct SpCase {
    text: String,
    sp_ids: Vec<u32>,
    sp_pieces: Vec<String>,
    sp_decode: String,
}

#[derive(Deserialize)]
struct PromptCases {
    demo_model: String,
    cases: Vec<PromptCase>,
}

#[derive(Deserialize)]
struct PromptCase {
    name: String,
    prompt: String,
    prompt_ids: Vec<u32>,
    target: String,
    target_ids: Vec<u32>,
    target_decode: String,
}

fn read_json<T: for<'de> Deserialize<'de>>(relative: &str) -> T {
    let path = repo_root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn tokenizer(cact: &str) -> NeedleTokenizer {
    let file = Needle2File::read(repo_root().join(cact)).expect("fixture .cact parses");
    NeedleTokenizer::from_spec(file.tokenizer(), true).expect("tokenizer builds")
}

fn sp_cases() -> Vec<SpCase> {
    read_json("tests/fixtures/tokenizer.cases.json")
}

fn prompt_cases() -> PromptCases {
    read_json("tests/fixtures/prompt.cases.json")
}

/// Fails with every mismatch listed, after printing the score.
fn report(what: &str, total: usize, failures: Vec<String>) {
    println!("{what}: {}/{total} match", total - failures.len());
    assert!(
        failures.is_empty(),
        "{what}: {} mismatches\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn encode_matches_sentencepiece() {
    let tok = tokenizer("tests/fixtures/m64.cact");
    let cases = sp_cases();
    let failures = cases
        .iter()
        .filter_map(|c| {
            let ids = tok.encode(&c.text);
            (ids != c.sp_ids)
                .then(|| format!("{:?}: got {ids:?}, sentencepiece {:?}", c.text, c.sp_ids))
        })
        .collect();
    report("m64 encode vs sentencepiece", cases.len(), failures);
}

#[test]
fn decode_matches_sentencepiece() {
    let tok = tokenizer("tests/fixtures/m64.cact");
    let cases = sp_cases();
    let failures = cases
        .iter()
        .filter_map(|c| {
            let text = tok.decode(&c.sp_ids);
            (text != c.sp_decode).then(|| {
                format!(
                    "{:?}: got {text:?}, sentencepiece {:?}",
                    c.sp_ids, c.sp_decode
                )
            })
        })
        .collect();
    report("m64 decode vs sentencepiece", cases.len(), failures);
}

#[test]
fn demo_prompts_match_upstream_reference() {
    let fixture = prompt_cases();
    let tok = tokenizer(&fixture.demo_model);
    let mut failures = Vec::new();
    for c in &fixture.cases {
        let prompt_ids = tok.encode(&c.prompt);
        if prompt_ids != c.prompt_ids {
            failures.push(format!(
                "{} prompt: got {prompt_ids:?}, reference {:?}",
                c.name, c.prompt_ids
            ));
        }
        let target_ids = tok.encode(&c.target);
        if target_ids != c.target_ids {
            failures.push(format!(
                "{} target: got {target_ids:?}, reference {:?}",
                c.name, c.target_ids
            ));
        }
        let decoded = tok.decode(&c.target_ids);
        if decoded != c.target_decode {
            failures.push(format!(
                "{} decode: got {decoded:?}, reference {:?}",
                c.name, c.target_decode
            ));
        }
    }
    report(
        "demo prompt/target encode + decode",
        3 * fixture.cases.len(),
        failures,
    );
}

#[test]
fn chat_marker_ids() {
    let tok = tokenizer("runner/demo/needle-demo.cact");
    let markers = [
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tools>",
        "</tools>",
    ];
    let ids: Vec<Option<u32>> = markers.iter().map(|m| tok.token_id(m)).collect();
    assert_eq!(ids, [4, 5, 6, 7, 8, 9].map(Some));
    assert_eq!((tok.pad_id(), tok.eos_id(), tok.bos_id()), (0, 1, 2));
}

/// Runs `script` with the project venv's python on `input` (as JSON, path in
/// `sys.argv[1]`) and parses what it prints as JSON.
fn run_python<T: for<'de> Deserialize<'de>>(
    script: &str,
    input: &serde_json::Value,
    tag: &str,
) -> T {
    let input_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}.input.json"));
    std::fs::write(&input_path, input.to_string()).unwrap();
    let out = python()
        .args(["-c", script])
        .arg(&input_path)
        .output()
        .expect("venv python runs");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("python prints JSON")
}

const HF_ENCODE: &str = r#"
import json, sys
from tokenizers import Tokenizer
input = json.load(open(sys.argv[1], encoding="utf-8"))
tok = Tokenizer.from_str(input["tokenizer"])
print(json.dumps([tok.encode(t, add_special_tokens=False).ids for t in input["texts"]]))
"#;

/// Ids from the HF `tokenizers` Python package for `texts`, with `json` loaded
/// through `Tokenizer.from_str`.
fn python_tokenizers_encode(json: &str, texts: &[&str], tag: &str) -> Vec<Vec<u32>> {
    run_python(
        HF_ENCODE,
        &serde_json::json!({"tokenizer": json, "texts": texts}),
        tag,
    )
}

/// Upstream `needle.model.tokenizer.CHAT_MARKERS`.
const CHAT_MARKERS: [&str; 10] = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tools>",
    "</tools>",
    "<tool_call>",
    "</tool_call>",
    "<tool_result>",
    "</tool_result>",
];

/// What the serialized tokenizer should give: sentencepiece's ids, except for a
/// text that is one chat marker after the whitespace rule (pieces `▁`, marker),
/// where HF's added-token matching cannot emit the dummy `▁`.
fn expected_from_tokenizer_json(case: &SpCase) -> &[u32] {
    match &case.sp_pieces[..] {
        [space, marker] if space == "▁" && CHAT_MARKERS.contains(&marker.as_str()) => {
            &case.sp_ids[1..]
        }
        _ => &case.sp_ids,
    }
}

#[test]
fn tokenizer_json_encodes_like_sentencepiece_in_python() {
    let tok = tokenizer("tests/fixtures/m64.cact");
    let cases = sp_cases();
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let got = python_tokenizers_encode(&tok.to_json(), &texts, "m64");
    let mut lone_markers = 0;
    let failures = cases
        .iter()
        .zip(got)
        .filter_map(|(c, ids)| {
            let expected = expected_from_tokenizer_json(c);
            lone_markers += usize::from(expected != c.sp_ids);
            (ids != expected)
                .then(|| format!("{:?}: python {ids:?}, sentencepiece {:?}", c.text, c.sp_ids))
        })
        .collect();
    println!("texts that are a lone chat marker (no leading ▁ in tokenizer.json): {lone_markers}");
    report(
        "m64 tokenizer.json (python) vs sentencepiece",
        cases.len(),
        failures,
    );
}

#[test]
fn demo_tokenizer_json_encodes_like_upstream_in_python() {
    let fixture = prompt_cases();
    let tok = tokenizer(&fixture.demo_model);
    let texts: Vec<&str> = fixture
        .cases
        .iter()
        .flat_map(|c| [c.prompt.as_str(), c.target.as_str()])
        .collect();
    let expected: Vec<&Vec<u32>> = fixture
        .cases
        .iter()
        .flat_map(|c| [&c.prompt_ids, &c.target_ids])
        .collect();
    let got = python_tokenizers_encode(&tok.to_json(), &texts, "demo");
    let failures = texts
        .iter()
        .zip(expected.iter().zip(got))
        .filter_map(|(text, (want, ids))| {
            (&ids != *want).then(|| format!("{text:?}: python {ids:?}, reference {want:?}"))
        })
        .collect();
    report(
        "demo tokenizer.json (python) vs upstream",
        texts.len(),
        failures,
    );
}

/// A deterministic xorshift generator for the randomized comparison.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Random texts from fragments that stress the normalizer, the marker matcher
/// and byte fallback, and random id lists over the whole vocabulary.
fn random_inputs(vocab: usize) -> (Vec<String>, Vec<Vec<u32>>) {
    let fragments = [
        "a",
        "e",
        "th",
        "the",
        "ing",
        "name",
        "Q",
        "Z",
        "7",
        "42",
        " ",
        "  ",
        "   ",
        "\n",
        "\t",
        "▁",
        "▁▁",
        "\u{a0}",
        "\u{3000}",
        "é",
        "東京",
        "🙂",
        "✈️",
        "{\"",
        "\":",
        "<",
        ">",
        "|",
        "<s>",
        "</s>",
        "<unk>",
        "<0x41>",
        "<|im_start",
        "<think>",
        "</think>",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_result>",
        "<<tools>>",
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let texts = (0..3000)
        .map(|_| {
            (0..rng.below(12))
                .map(|_| fragments[rng.below(fragments.len())])
                .collect()
        })
        .collect();
    let ids = (0..3000)
        .map(|_| {
            (0..rng.below(10))
                .map(|_| rng.below(vocab) as u32)
                .collect()
        })
        .collect();
    (texts, ids)
}

/// sentencepiece's `Encode` and `Decode` with its `remove_extra_whitespaces`
/// normalizer option on and off.
const SP_BOTH_RULES: &str = r#"
import json, sys
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb
input = json.load(open(sys.argv[1], encoding="utf-8"))
proto = pb.ModelProto()
proto.ParseFromString(open(input["model"], "rb").read())
out = {}
for rule in (True, False):
    proto.normalizer_spec.remove_extra_whitespaces = rule
    sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    out[str(rule)] = {"encode": [sp.Encode(t) for t in input["texts"]],
                      "decode": [sp.Decode(i) for i in input["ids"]]}
print(json.dumps(out))
"#;

#[test]
fn random_texts_and_ids_match_sentencepiece() {
    let file = Needle2File::read(repo_root().join("tests/fixtures/m64.cact"))
        .expect("fixture .cact parses");
    let (texts, ids) = random_inputs(file.tokenizer().pieces.len());
    let model = repo_root().join("tests/fixtures/tokenizer.model");
    let input = serde_json::json!({"model": model, "texts": texts, "ids": ids});
    let reference: std::collections::HashMap<String, SpOutputs> =
        run_python(SP_BOTH_RULES, &input, "random");
    for rule in [true, false] {
        let tok = NeedleTokenizer::from_spec(file.tokenizer(), rule).expect("tokenizer builds");
        let sp = &reference[if rule { "True" } else { "False" }];
        let mut failures: Vec<String> = texts
            .iter()
            .zip(&sp.encode)
            .filter(|(text, want)| &tok.encode(text) != *want)
            .map(|(text, want)| {
                format!(
                    "encode {text:?}: got {:?}, sentencepiece {want:?}",
                    tok.encode(text)
                )
            })
            .collect();
        failures.extend(
            ids.iter()
                .zip(&sp.decode)
                .filter(|(ids, want)| &tok.decode(ids) != *want)
                .map(|(ids, want)| {
                    format!(
                        "decode {ids:?}: got {:?}, sentencepiece {want:?}",
                        tok.decode(ids)
                    )
                }),
        );
        report(
            &format!("random inputs, remove_extra_whitespaces={rule}"),
            texts.len() + ids.len(),
            failures,
        );
    }
}

#[derive(Deserialize)]
struct SpOutputs {
    encode: Vec<Vec<u32>>,
    decode: Vec<String>,
}

/// Needle 3's tokenizers (six more markers, `add_dummy_prefix` from the blob) against
/// sentencepiece: `needle3/tokenizer.cases.json` is for `tokenizer.model` (n3a's),
/// `tokenizer_nodummy.cases.json` for the one without a dummy prefix (n3b's).
#[test]
fn needle3_tokenizers_match_sentencepiece() {
    for (cact, cases) in [
        ("n3a", "tokenizer.cases.json"),
        ("n3b", "tokenizer_nodummy.cases.json"),
    ] {
        let path = repo_root().join(format!("tests/fixtures/needle3/{cact}.cact"));
        let file = Needle3File::parse(&std::fs::read(path).unwrap()).unwrap();
        let tok = NeedleTokenizer::from_spec(file.tokenizer(), true).unwrap();
        let cases: Vec<Needle3Case> = read_json(&format!("tests/fixtures/needle3/{cases}"));
        let mut failures = Vec::new();
        for c in &cases {
            let ids = tok.encode(&c.text);
            if ids != c.sp_ids {
                failures.push(format!(
                    "{:?}: got {ids:?}, sentencepiece {:?}",
                    c.text, c.sp_ids
                ));
            }
            let text = tok.decode(&c.sp_ids);
            if text != c.sp_decode {
                failures.push(format!(
                    "{:?}: decoded {text:?}, sentencepiece {:?}",
                    c.sp_ids, c.sp_decode
                ));
            }
        }
        report(
            &format!("{cact} tokenizer vs sentencepiece"),
            cases.len(),
            failures,
        );
    }
}

/// `tokenizer.json` read back encodes like the tokenizer it was written from (the prompt
/// cases' ids, from upstream), and only with the settings it was written for: its
/// normalizer is what encoding follows, so a document written for other settings is
/// refused rather than encoding otherwise.
#[test]
fn tokenizer_json_reads_back_only_with_its_own_settings() {
    let fixture = prompt_cases();
    let file = Needle2File::read(repo_root().join(&fixture.demo_model)).unwrap();
    let spec = file.tokenizer();
    let special = exporter::tokenizer::SpecialIds {
        pad: spec.pad_id,
        eos: spec.eos_id,
        bos: spec.bos_id,
        unk: spec.unk_id,
    };
    let json = NeedleTokenizer::from_spec(spec, true).unwrap().to_json();
    let back = NeedleTokenizer::from_json(&json, special, spec.add_dummy_prefix, true).unwrap();
    for c in &fixture.cases {
        assert_eq!(back.encode(&c.prompt), c.prompt_ids, "{} prompt", c.name);
    }
    let other = NeedleTokenizer::from_json(&json, special, spec.add_dummy_prefix, false);
    let error = other
        .err()
        .expect("other whitespace settings are refused")
        .to_string();
    assert!(error.contains("remove_extra_whitespaces false"), "{error}");
    let other_unk = exporter::tokenizer::SpecialIds {
        unk: spec.pad_id,
        ..special
    };
    let error = NeedleTokenizer::from_json(&json, other_unk, spec.add_dummy_prefix, true)
        .err()
        .expect("another unk id is refused")
        .to_string();
    assert!(error.contains("unk_token"), "{error}");
}
