//! `--stream` writes the text as it grows, decoded like the final text: a character spelled
//! by several byte-fallback pieces is written whole once its last byte arrives, never as
//! replacement characters.

use exporter::model::NeedleModel;
use exporter::tokenizer::NeedleTokenizer;
use runner::decode::TokenFilter;
use runner::stream::TextStream;
use std::process::Command;
use test_support::fixture;

#[test]
fn multibyte_characters_from_byte_pieces_are_written_whole() {
    let model = NeedleModel::read(&fixture("m64.cact")).unwrap();
    let tokenizer = NeedleTokenizer::from_spec(&model.tokenizer, true).unwrap();
    let text = "héllo wörld ✓ 東京";
    let ids = tokenizer.encode(text);
    let split = ids
        .windows(2)
        .any(|w| w.iter().all(|&id| tokenizer.is_byte_piece(id)));
    assert!(
        split,
        "the fixture should spell a character with byte pieces: {ids:?}"
    );
    let mut out = Vec::new();
    let mut stream = TextStream::new(&tokenizer, &mut out);
    for &id in &ids {
        stream.accept(id).unwrap();
    }
    stream.finish().unwrap();
    let written = String::from_utf8(out).unwrap();
    assert_eq!(written, format!("{}\n", tokenizer.decode(&ids)));
    assert!(!written.contains('\u{fffd}'), "{written:?}");
}

/// Through the binary: what is streamed to stderr is the result's text, byte for byte,
/// in raw mode (a random fixture, byte pieces included) and tool mode (the demo model).
#[test]
fn the_streamed_text_is_the_results_text() {
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_needle-run"))
            .args(["--provider", "cpu", "--stream"])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let result: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (String::from_utf8(o.stderr).unwrap(), result)
    };
    let m64 = fixture("m64.cact");
    let (streamed, result) = run(&[
        "--model",
        m64.to_str().unwrap(),
        "--raw",
        "hello",
        "--max-new-tokens",
        "24",
        "--json",
    ]);
    assert_eq!(streamed, format!("{}\n", result["text"].as_str().unwrap()));
    let (streamed, result) = run(&["--query", "turn on the kitchen lights"]);
    let reasoning = result["reasoning"].as_str().unwrap();
    assert!(
        streamed.contains(reasoning) && streamed.contains("<tool_call>"),
        "{streamed}"
    );
}
