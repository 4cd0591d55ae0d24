//! `--constrain`: tool-mode decoding masked so the answer is always well-formed for the
//! declared tools. The answer's grammar (Needle's target format, upstream
//! `finetune.render_example`) is
//!
//! ```text
//! [<think> free text </think>] <tool_call> JSON list of calls </tool_call> <|im_end|>
//! ```
//! with optional spaces and newlines before `<think>` and `<tool_call>` (the answer's
//! first piece is sentencepiece's dummy-prefix `▁`).
//!
//! and, where the answer may be prose (after tool results, when no call is required),
//!
//! ```text
//! | text without markup (no `<`, `>`) <|im_end|>
//! ```
//!
//! the short confirmation the demo model is trained to give after a tool result.
//!
//! In the calls, each call is `{"name": <a declared tool>, "arguments": <its parameters' JSON
//! schema, every object closed to its declared keys>}` in the compact JSON the model was
//! trained on, and the empty list is the "respond" answer. llguidance (the engine behind
//! onnxruntime-genai's and llama.cpp's structured output) compiles it and computes the
//! allowed tokens each step over a token trie built from our tokenizer's pieces.

use crate::decode::TokenFilter;
use crate::prompt::{THINK_END, THINK_START, TOOL_CALL_END, TOOL_CALL_START};
use anyhow::{anyhow, bail, Result};
use exporter::tokenizer::{NeedleTokenizer, IM_END};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// What every constrained generation with one tokenizer shares: the token trie, the
/// grammar compiler's precomputed vocabulary slices, each token's text and the answer's
/// markers.
pub struct ConstraintFactory {
    factory: ParserFactory,
    texts: Arc<[Vec<u8>]>,
    markers: Markers,
}

/// The ids of the markers that move an answer from one part to the next.
#[derive(Clone, Copy)]
struct Markers {
    think_start: u32,
    think_end: u32,
    tool_call: u32,
    tool_call_end: u32,
    im_end: u32,
}

impl ConstraintFactory {
    pub fn new(tokenizer: &NeedleTokenizer) -> Result<Self> {
        let id = |marker: &str| {
            tokenizer
                .token_id(marker)
                .ok_or_else(|| anyhow!("--constrain: the tokenizer has no {marker} marker"))
        };
        let eos = id(IM_END)?;
        let markers = Markers {
            think_start: id(THINK_START)?,
            think_end: id(THINK_END)?,
            tool_call: id(TOOL_CALL_START)?,
            tool_call_end: id(TOOL_CALL_END)?,
            im_end: eos,
        };
        let pieces = tokenizer.text_bytes();
        let env: TokEnv = Arc::new(PieceTrie::new(tokenizer, &pieces, eos));
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        let texts = pieces.into_iter().map(Option::unwrap_or_default).collect();
        Ok(ConstraintFactory {
            factory,
            texts,
            markers,
        })
    }

    /// The constraint of one answer with `calls` calls of the tools of `tools`
    /// (a JSON list) that must end within `max_new_tokens`; with `prose` (and no call
    /// required) the answer may instead be plain text.
    pub fn for_tools(
        &self,
        tools: &Value,
        calls: CallCount,
        prose: bool,
        max_new_tokens: usize,
    ) -> Result<ToolConstraint> {
        let prose = prose && calls.at_least == 0;
        let grammar =
            TopLevelGrammar::from_lark(answer_grammar(tools, calls, prose, self.markers)?);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| anyhow!("--constrain: {e}"))?;
        Ok(ToolConstraint {
            matcher: Matcher::new(Ok(parser)),
            texts: self.texts.clone(),
            markers: self.markers,
            phase: Phase::Start,
            json: JsonScan::default(),
            left: max_new_tokens,
            closing_from: max_new_tokens.min(CLOSING_TOKENS),
            ran_on: false,
        })
    }
}

/// The most tokens an answer keeps for closing itself (see [`ToolConstraint`]).
const CLOSING_TOKENS: usize = 48;

/// Where the JSON of the calls is, as far as closing it goes: inside a string or not.
#[derive(Clone, Copy, Default)]
struct JsonScan {
    in_string: bool,
    escaped: bool,
}

impl JsonScan {
    fn push(&mut self, byte: u8) {
        match (self.in_string, self.escaped, byte) {
            (true, true, _) => self.escaped = false,
            (true, false, b'\\') => self.escaped = true,
            (true, false, b'"') | (false, _, b'"') => self.in_string = !self.in_string,
            _ => {}
        }
    }

    /// How far `text` takes the JSON from here towards its end: most when it ends
    /// strings, objects or lists and starts nothing (2 + how many it ends), some when it
    /// is punctuation that moves on to the next item, key or value (1: a number or word
    /// that goes on would not end), nothing for content that only extends a value.
    fn closing(mut self, text: &[u8]) -> u8 {
        let (mut closed, mut moves_on) = (0u8, false);
        for &byte in text {
            let was_in_string = self.in_string;
            self.push(byte);
            match (was_in_string, self.in_string, byte) {
                (true, false, _) => closed = closed.saturating_add(1),
                (true, true, _) => {}
                (false, true, _) | (false, false, b'{' | b'[' | b',' | b':') => moves_on = true,
                (false, false, b'}' | b']') => closed = closed.saturating_add(1),
                (false, false, _) => {}
            }
        }
        match (closed, moves_on) {
            (0, false) => 0,
            (_, true) => 1,
            (closed, false) => closed.saturating_add(2),
        }
    }
}

/// Where an answer is.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    /// Before `<tool_call>`, outside the reasoning.
    Start,
    /// In the free reasoning.
    Reasoning,
    /// In the `<tool_call>` list.
    Calls,
    /// In a prose answer.
    Prose,
}

/// The state of one constrained answer. A model can run away inside the free reasoning
/// or a string (repeating a word until the token budget ends) and leave the answer
/// unfinished; so in its last `closing_from` tokens the answer closes itself: of the
/// allowed tokens only those that take it furthest are left to the model, the longest of
/// them — `<tool_call>` at the start, `</think>` in the reasoning, `<|im_end|>` in prose,
/// in the calls the tokens
/// that end the most strings, objects and lists without starting anything, else
/// punctuation that moves on (see [`JsonScan::closing`]).
pub struct ToolConstraint {
    matcher: Matcher,
    texts: Arc<[Vec<u8>]>,
    markers: Markers,
    phase: Phase,
    json: JsonScan,
    /// Tokens left in the budget.
    left: usize,
    closing_from: usize,
    /// Whether closing overrode the model's own pick (see [`TokenFilter::ran_on`]).
    ran_on: bool,
}

impl ToolConstraint {
    /// How much token `id` closes in the current phase.
    fn closes(&self, id: usize) -> u8 {
        let marker = match self.phase {
            Phase::Start => self.markers.tool_call,
            Phase::Reasoning => self.markers.think_end,
            Phase::Prose => self.markers.im_end,
            Phase::Calls => return self.json.closing(&self.texts[id]),
        };
        2 * u8::from(id == marker as usize)
    }
}

impl ToolConstraint {
    /// Whether `token` writes more than spaces and newlines (a marker writes nothing).
    fn is_text(&self, token: u32) -> bool {
        let is_marker = [
            self.markers.think_start,
            self.markers.think_end,
            self.markers.tool_call,
            self.markers.tool_call_end,
            self.markers.im_end,
        ]
        .contains(&token);
        let text = self.texts.get(token as usize).map_or(&[][..], |t| t);
        !is_marker && text.iter().any(|b| !matches!(b, b' ' | b'\n'))
    }
}

impl TokenFilter for ToolConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        // Once the answer is complete only `<|im_end|>` (the trie's EOS) may follow.
        let allowed = self.matcher.compute_mask_or_eos().map_err(grammar_error)?;
        // A model may score more ids than its tokenizer has pieces (a padded output
        // vocabulary): those are no text, so never allowed.
        let pieces = self.texts.len();
        let allowed = |id: usize| id < pieces && allowed.is_allowed(id as u32);
        // Closing: the allowed tokens that take the answer furthest, longest first (a key
        // the grammar forces goes in one token, not letter by letter).
        let rank = |id: usize| (self.closes(id), self.texts[id].len());
        let best = match self.left <= self.closing_from {
            true => (0..logits.len()).filter(|&id| allowed(id)).map(rank).max(),
            false => None,
        };
        // The model's own pick among the allowed tokens: closing overrode it if it ranks
        // below the best.
        let overridden = best.is_some_and(|best| {
            (0..logits.len())
                .filter(|&id| allowed(id))
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .is_some_and(|own| rank(own) < best)
        });
        for (id, logit) in logits.iter_mut().enumerate() {
            if !allowed(id) || best.is_some_and(|best| rank(id) < best) {
                *logit = f32::NEG_INFINITY;
            }
        }
        self.ran_on |= overridden;
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        self.left = self.left.saturating_sub(1);
        if self.phase == Phase::Calls {
            for &byte in self.texts.get(token as usize).map_or(&[][..], |t| t) {
                self.json.push(byte);
            }
        } else if token == self.markers.think_start {
            self.phase = Phase::Reasoning;
        } else if token == self.markers.think_end {
            self.phase = Phase::Start;
        } else if token == self.markers.tool_call {
            self.phase = Phase::Calls;
        } else if self.phase == Phase::Start && self.is_text(token) {
            self.phase = Phase::Prose;
        }
        self.matcher.consume_token(token).map_err(grammar_error)
    }

    fn ran_on(&self) -> bool {
        self.ran_on
    }
}

fn grammar_error(e: anyhow::Error) -> anyhow::Error {
    anyhow!("--constrain: the grammar matcher failed: {e}")
}

/// The Lark grammar of an answer (see the module docs).
fn answer_grammar(
    tools: &Value,
    count: CallCount,
    prose: bool,
    markers: Markers,
) -> Result<String> {
    let calls = serde_json::to_string(&calls_schema(tools, count)?)?;
    let Markers {
        think_start,
        think_end,
        tool_call,
        tool_call_end,
        ..
    } = markers;
    let prose = match prose {
        true => " | SPACE? PROSE",
        false => "",
    };
    Ok(format!(
        r#"start: answer{prose}
answer: SPACE? think? <[{tool_call}]> calls <[{tool_call_end}]>
PROSE: /[^<> \n][^<>]*/
think: <[{think_start}]> REASONING? <[{think_end}]> SPACE?
REASONING: /(.|\n)+/
SPACE: /[ \n]+/
calls: %json {calls}
"#
    ))
}

/// How many calls an answer may make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallCount {
    pub at_least: usize,
    pub at_most: Option<usize>,
}

impl CallCount {
    /// Any number, none included (`--constrain`).
    pub const ANY: CallCount = CallCount {
        at_least: 0,
        at_most: None,
    };
}

/// The schema of the `<tool_call>` list: `count` calls of the declared tools, in the
/// compact separators of the training data.
pub fn calls_schema(tools: &Value, count: CallCount) -> Result<Value> {
    // A tool list given as the text to render verbatim (needle-run --tools) is read here
    // as JSON: the schema needs its structure, not Python's spelling of its numbers.
    let parsed;
    let tools = match tools {
        Value::String(text) => {
            parsed = serde_json::from_str(text)
                .map_err(|e| anyhow!("--constrain: the tool list is not JSON: {e}"))?;
            &parsed
        }
        other => other,
    };
    let Value::Array(tools) = tools else {
        bail!("--constrain: the tool list is not a JSON array");
    };
    let calls = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| call_schema(tool).map_err(|e| anyhow!("--constrain: tool {i}: {e}")))
        .collect::<Result<Vec<_>>>()?;
    if calls.is_empty() && count.at_least > 0 {
        bail!("--constrain: a call is required but no tools are declared");
    }
    let mut schema = match calls.is_empty() {
        true => json!({"type": "array", "maxItems": 0}),
        false => {
            let mut list =
                json!({"type": "array", "items": {"anyOf": calls}, "minItems": count.at_least});
            if let Some(at_most) = count.at_most {
                list["maxItems"] = json!(at_most);
            }
            list
        }
    };
    schema["x-guidance"] = json!({
        "item_separator": ",",
        "key_separator": ":",
        "whitespace_flexible": false,
    });
    Ok(schema)
}

/// `{"name": <the tool's name>, "arguments": <its parameters>}` for a tool in Needle's flat
/// form (`{name, description, parameters}`) or OpenAI's (`{"type": "function",
/// "function": {…}}`). Parameters are a JSON schema (`{"type": "object", "properties":
/// …}`), or a bare map of property schemas, as some Needle tool lists write them.
fn call_schema(tool: &Value) -> Result<Value> {
    let tool = match tool.get("function") {
        Some(function) if tool.get("type").and_then(Value::as_str) == Some("function") => function,
        _ => tool,
    };
    let name = tool
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("no \"name\" string"))?;
    let arguments = match tool.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(Value::Object(p)) if p.contains_key("type") || p.contains_key("properties") => {
            Value::Object(p.clone())
        }
        Some(Value::Object(properties)) => json!({"type": "object", "properties": properties}),
        Some(other) => bail!("\"parameters\" of {name:?} is not an object: {other}"),
    };
    Ok(json!({
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": closed(arguments)},
        "required": ["name", "arguments"],
        "additionalProperties": false,
    }))
}

/// `schema` with every object schema that does not say otherwise closed to its declared
/// properties (`additionalProperties: false`): argument keys must be declared ones; and
/// every number bounded to what its readers hold ([`bound_numbers`]).
fn closed(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        let is_object = map.get("type").and_then(Value::as_str) == Some("object")
            || map.contains_key("properties");
        if is_object && !map.contains_key("additionalProperties") {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
        bound_numbers(map);
        for key in ["properties", "$defs", "definitions", "patternProperties"] {
            if let Some(Value::Object(children)) = map.get_mut(key) {
                close_all(children);
            }
        }
        for key in ["items", "additionalProperties", "not"] {
            if let Some(child) = map.get_mut(key) {
                *child = closed(child.take());
            }
        }
        for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
            if let Some(Value::Array(children)) = map.get_mut(key) {
                for child in children.iter_mut() {
                    *child = closed(child.take());
                }
            }
        }
    }
    schema
}

/// Bounds a number or integer schema that is not bounded on a side to ±10^18: a JSON
/// number past a double's range (`1e999`, 310 digits) is infinity to Python and an error
/// to serde_json, so a model that runs on writing digits or an exponent would give a call
/// nobody can read. llguidance writes a bounded number in decimal notation (no exponent)
/// and builds its range only within i64's; within ±10^18 every reader holds an integer
/// exactly and a number as a double.
fn bound_numbers(map: &mut Map<String, Value>) {
    let types: Vec<&str> = match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return,
    };
    // 10^18: i64's range, rounded down to where llguidance's range regexes still build.
    let (low, high) = if types.contains(&"number") {
        (json!(-1e18), json!(1e18))
    } else if types.contains(&"integer") {
        (
            json!(-1_000_000_000_000_000_000i64),
            json!(1_000_000_000_000_000_000i64),
        )
    } else {
        return;
    };
    if !map.contains_key("minimum") && !map.contains_key("exclusiveMinimum") {
        map.insert("minimum".into(), low);
    }
    if !map.contains_key("maximum") && !map.contains_key("exclusiveMaximum") {
        map.insert("maximum".into(), high);
    }
}

fn close_all(children: &mut Map<String, Value>) {
    for child in children.values_mut() {
        *child = closed(child.take());
    }
}

/// The token trie of a Needle tokenizer: each piece's text bytes; control pieces,
/// `<unk>` and the chat markers are special tokens (never text: a string that held
/// `</tool_call>` would end the block for every parser), `<|im_end|>` the end of the
/// answer.
struct PieceTrie {
    trie: TokTrie,
}

impl PieceTrie {
    /// `pieces`: the tokenizer's [`NeedleTokenizer::text_bytes`].
    fn new(tokenizer: &NeedleTokenizer, pieces: &[Option<Vec<u8>>], eos: u32) -> Self {
        let words: Vec<Vec<u8>> = pieces
            .iter()
            .enumerate()
            .map(|(id, bytes)| match bytes {
                Some(text) if !tokenizer.is_marker(id as u32) && id as u32 != eos => text.clone(),
                _ => special(id),
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        PieceTrie {
            trie: TokTrie::from(&info, &words),
        }
    }
}

/// A special token's trie entry: the marker byte, then a name no text can spell.
fn special(id: usize) -> Vec<u8> {
    [
        &[TokTrie::SPECIAL_TOKEN_MARKER][..],
        format!("[{id}]").as_bytes(),
    ]
    .concat()
}

impl TokenizerEnv for PieceTrie {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::DEMO_CACT;
    use exporter::model::NeedleModel;

    fn demo_tokenizer() -> NeedleTokenizer {
        let model = NeedleModel::from_bytes("needle-demo.cact", DEMO_CACT).unwrap();
        NeedleTokenizer::from_spec(&model.tokenizer, false).unwrap()
    }

    fn tools() -> Value {
        json!([{"name": "set_lights", "parameters": {"type": "object",
            "properties": {"room": {"type": "string"}, "on": {"type": "boolean"}},
            "required": ["room", "on"]}}])
    }

    /// Whether `c` allows token `id` next.
    fn allows(c: &mut ToolConstraint, id: u32, vocab: usize) -> bool {
        let mut logits = vec![0.0; vocab];
        c.mask(&mut logits).unwrap();
        logits[id as usize].is_finite()
    }

    /// Feeds `ids`, each of which must be allowed.
    fn feed(c: &mut ToolConstraint, ids: &[u32], vocab: usize) {
        for &id in ids {
            assert!(allows(c, id, vocab), "token {id} refused");
            c.accept(id).unwrap();
        }
    }

    /// After tool results the answer may be prose up to `<|im_end|>`, never markup in it;
    /// calls stay possible; elsewhere prose is refused.
    #[test]
    fn prose_is_an_answer_only_where_asked_for() {
        let tok = demo_tokenizer();
        let factory = ConstraintFactory::new(&tok).unwrap();
        let vocab = tok.vocab_size();
        let eos = tok.token_id(IM_END).unwrap();
        let tool_call = tok.token_id(TOOL_CALL_START).unwrap();
        let prose = tok.encode("The kitchen lights are off.");

        let mut c = factory
            .for_tools(&tools(), CallCount::ANY, true, 64)
            .unwrap();
        feed(&mut c, &prose, vocab);
        assert!(allows(&mut c, eos, vocab));
        assert!(!allows(&mut c, tool_call, vocab));
        let angle = tok
            .encode("<")
            .into_iter()
            .find(|&id| tok.decode(&[id]).contains('<'));
        assert!(!allows(&mut c, angle.unwrap(), vocab));

        let mut c = factory
            .for_tools(&tools(), CallCount::ANY, true, 64)
            .unwrap();
        let call = tok.encode(r#"<tool_call>[{"name":"set_lights","arguments":{"room":"kitchen","on":false}}]</tool_call>"#);
        feed(&mut c, &call, vocab);
        assert!(allows(&mut c, eos, vocab));

        let mut c = factory
            .for_tools(&tools(), CallCount::ANY, false, 64)
            .unwrap();
        let first_word = *prose
            .iter()
            .find(|&&id| tok.decode(&[id]).trim() != "")
            .unwrap();
        assert!(!allows(&mut c, first_word, vocab));

        let required = CallCount {
            at_least: 1,
            at_most: None,
        };
        let mut c = factory.for_tools(&tools(), required, true, 64).unwrap();
        assert!(!allows(&mut c, first_word, vocab));
    }

    /// A number argument is one every JSON reader holds: decimal, within i64's range
    /// (`1e999` is infinity to Python and an error to serde_json).
    #[test]
    fn numbers_stay_within_a_doubles_range() {
        let tok = demo_tokenizer();
        let factory = ConstraintFactory::new(&tok).unwrap();
        let vocab = tok.vocab_size();
        let level = json!([{"name": "set_lights", "parameters": {"type": "object",
            "properties": {"level": {"type": "number"}, "count": {"type": "integer"}},
            "required": ["level", "count"]}}]);
        let head = r#"<tool_call>[{"name":"set_lights","arguments":{"level":"#;
        let texts: Vec<String> = (0..vocab as u32).map(|id| tok.decode(&[id])).collect();
        // Whether the grammar lets `text` be written, whichever tokens it takes: each step
        // the allowed token that writes the longest part of what is left.
        let fits = |text: &str| {
            let mut c = factory
                .for_tools(&level, CallCount::ANY, false, 400)
                .unwrap();
            let mut left = format!("{head}{text}");
            while !left.is_empty() {
                let mut logits = vec![0.0; vocab];
                c.mask(&mut logits).unwrap();
                let next = (0..vocab)
                    .filter(|&id| logits[id].is_finite() && !texts[id].is_empty())
                    .filter(|&id| left.starts_with(&texts[id]))
                    .max_by_key(|&id| texts[id].len());
                let Some(id) = next else { return false };
                c.accept(id as u32).unwrap();
                left.drain(..texts[id].len());
            }
            true
        };
        assert!(fits(r#"-12.5,"count":7}}]</tool_call>"#));
        assert!(fits(r#"0.0005,"count":-3}}]</tool_call>"#));
        assert!(!fits("1e999"));
        assert!(!fits(&format!(
            r#"2{},"count":1}}}}]</tool_call>"#,
            "0".repeat(310)
        )));
        assert!(!fits(&format!(
            r#"1,"count":1{}}}}}]</tool_call>"#,
            "0".repeat(310)
        )));
    }

    /// Logits past the tokenizer's pieces (a model whose output vocabulary is padded, as
    /// the full-size random Needle 3 of `bench/make_full_needle3.py`) are masked, not
    /// looked up past the end of the grammar's token set.
    #[test]
    fn ids_past_the_pieces_are_never_allowed() {
        let tok = demo_tokenizer();
        let factory = ConstraintFactory::new(&tok).unwrap();
        let vocab = tok.vocab_size();
        let mut c = factory
            .for_tools(&tools(), CallCount::ANY, true, 64)
            .unwrap();
        let mut logits = vec![0.0; vocab + 100];
        c.mask(&mut logits).unwrap();
        assert!(logits[vocab..].iter().all(|l| *l == f32::NEG_INFINITY));
        assert!(logits[..vocab].iter().any(|l| l.is_finite()));
    }

    /// Prose that runs into the end of its budget closes with `<|im_end|>`; the answer ran
    /// on when the model would have written more, not when it ends there itself.
    #[test]
    fn prose_closes_at_the_end_of_its_budget() {
        let tok = demo_tokenizer();
        let factory = ConstraintFactory::new(&tok).unwrap();
        let vocab = tok.vocab_size();
        let prose = tok.encode("The kitchen lights");
        let im_end = tok.token_id(IM_END).unwrap() as usize;
        let more = tok
            .encode(" are")
            .into_iter()
            .find(|&id| !tok.decode(&[id]).trim().is_empty())
            .unwrap() as usize;
        for (favoured, ran_on) in [(more, true), (im_end, false)] {
            let mut c = factory
                .for_tools(&tools(), CallCount::ANY, true, prose.len() + CLOSING_TOKENS)
                .unwrap();
            feed(&mut c, &prose, vocab);
            assert!(!c.ran_on());
            let mut logits = vec![0.0; vocab];
            logits[favoured] = 10.0;
            c.mask(&mut logits).unwrap();
            let allowed: Vec<usize> = (0..vocab).filter(|&i| logits[i].is_finite()).collect();
            assert_eq!(allowed, vec![im_end]);
            assert_eq!(c.ran_on(), ran_on, "the model favouring {favoured}");
        }
    }
}
