//! Tool calls as they are decoded: a scan of the `<tool_call>` block's JSON list so far
//! that finds each call's name once it is complete and its `arguments` value's text as it
//! grows, so that a stream can announce a call (id, name) and then send its arguments in
//! pieces, as OpenAI streams them (instructor's `create_partial` and the like read them so).
//! The arguments are the model's own text, which the final list parses to; the scan only
//! follows JSON's structure, strings and escapes, and stops where the text ends.

use crate::prompt::{IM_END, THINK_END, THINK_START, TOOL_CALL_END, TOOL_CALL_START};

/// A call of the list so far.
#[derive(Debug, PartialEq)]
pub struct PartialCall<'a> {
    /// Once its string is complete.
    pub name: Option<String>,
    /// The `arguments` value's text so far (to its end once complete).
    pub arguments: Option<&'a str>,
}

/// The calls of a growing answer `text`: the block after the reasoning, as
/// [`crate::prompt::parse_answer`] finds it.
pub fn partial_calls(text: &str) -> Vec<PartialCall<'_>> {
    let text = text.split(IM_END).next().unwrap_or_default();
    let after_reasoning = match text.find(THINK_START) {
        Some(start) => match text[start..].find(THINK_END) {
            Some(end) => &text[start + end + THINK_END.len()..],
            None => return Vec::new(),
        },
        None => text,
    };
    let Some(start) = after_reasoning.find(TOOL_CALL_START) else {
        return Vec::new();
    };
    let block = &after_reasoning[start + TOOL_CALL_START.len()..];
    let block = block.split(TOOL_CALL_END).next().unwrap_or_default();
    Scan { text: block, at: 0 }.list()
}

struct Scan<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scan<'a> {
    fn skip_whitespace(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// Takes `byte` if it comes next (after whitespace).
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_whitespace();
        let next = self.text.as_bytes().get(self.at) == Some(&byte);
        self.at += usize::from(next);
        next
    }

    /// The calls of `[ {…}, {…} …`, as far as the text goes.
    fn list(mut self) -> Vec<PartialCall<'a>> {
        let mut calls = Vec::new();
        if !self.eat(b'[') {
            return calls;
        }
        while self.eat(b'{') {
            let (call, complete) = self.call();
            calls.push(call);
            if !complete || !self.eat(b',') {
                break;
            }
        }
        calls
    }

    /// One call object after its `{`; whether it is complete.
    fn call(&mut self) -> (PartialCall<'a>, bool) {
        let mut call = PartialCall {
            name: None,
            arguments: None,
        };
        loop {
            if self.eat(b'}') {
                return (call, true);
            }
            self.skip_whitespace();
            let Some(key) = self.string() else {
                return (call, false);
            };
            if !self.eat(b':') {
                return (call, false);
            }
            self.skip_whitespace();
            let start = self.at;
            let end = self.value();
            match key.as_str() {
                "name" => {
                    call.name =
                        end.and_then(|end| serde_json::from_str(&self.text[start..end]).ok());
                }
                "arguments" => {
                    let end = end.unwrap_or(self.text.len());
                    call.arguments = Some(self.text[start..end].trim_end());
                }
                _ => {}
            }
            if end.is_none()
                || !(self.eat(b',') || self.text[self.at..].trim_start().starts_with('}'))
            {
                return (call, false);
            }
        }
    }

    /// A complete string literal, unescaped; `None` (at the text's end) if it is not one.
    fn string(&mut self) -> Option<String> {
        let start = self.at;
        let end = self.value()?;
        serde_json::from_str(&self.text[start..end]).ok()
    }

    /// Skips one JSON value; where it ends, or `None` when the text ends first.
    fn value(&mut self) -> Option<usize> {
        let bytes = self.text.as_bytes();
        let mut depth = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        while let Some(&b) = bytes.get(self.at) {
            self.at += 1;
            if in_string {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => {
                        in_string = false;
                        if depth == 0 {
                            return Some(self.at);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => {
                    self.at -= 1;
                    return Some(self.at);
                }
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(self.at);
                    }
                }
                b',' if depth == 0 => {
                    self.at -= 1;
                    return Some(self.at);
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = r#"<think>'5' -> minutes</think><tool_call>[{"name":"set_timer","arguments":{"minutes":5,"label":"tea \"now\", {x}"}},{"arguments":{"room":"kitchen"},"name":"set_lights"}]</tool_call>"#;

    #[test]
    fn every_prefix_gives_the_names_so_far_and_growing_arguments() {
        let whole = partial_calls(ANSWER);
        assert_eq!(
            whole,
            [
                PartialCall {
                    name: Some("set_timer".into()),
                    arguments: Some(r#"{"minutes":5,"label":"tea \"now\", {x}"}"#),
                },
                PartialCall {
                    name: Some("set_lights".into()),
                    arguments: Some(r#"{"room":"kitchen"}"#),
                },
            ]
        );
        let mut seen: Vec<String> = Vec::new();
        for end in (0..=ANSWER.len()).filter(|&i| ANSWER.is_char_boundary(i)) {
            let calls = partial_calls(&ANSWER[..end]);
            assert!(calls.len() <= 2);
            for (i, call) in calls.iter().enumerate() {
                if let Some(name) = &call.name {
                    assert_eq!(Some(name), whole[i].name.as_ref(), "{end}");
                }
                let args = call.arguments.unwrap_or_default();
                assert!(
                    whole[i].arguments.unwrap().starts_with(args),
                    "{end}: {args}"
                );
                if seen.len() <= i {
                    seen.push(String::new());
                }
                assert!(args.starts_with(seen[i].as_str()), "{end}: shrank");
                seen[i] = args.to_string();
            }
        }
        assert!(partial_calls("<think>[{\"name\":\"x\"").is_empty());
        assert!(partial_calls("no block").is_empty());
    }
}
