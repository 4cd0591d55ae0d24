//! Steps 1–3 of the module docs: the text sentencepiece's normalizer makes, and the
//! chat markers cut out of it, as the `tokenizer.json` this crate writes has HF do it
//! (a `Sequence` normalizer, then normalized added tokens matched leftmost-longest).

use serde_json::{json, Value};

/// sentencepiece's meta symbol for a space.
pub(super) const SPACE: char = '▁';

pub(super) struct Normalizer {
    remove_extra_whitespaces: bool,
    add_dummy_prefix: bool,
    /// The chat markers as spelled.
    markers: Vec<String>,
    /// Each chat marker as it is matched in normalized text (itself normalized), and its id.
    patterns: Vec<(String, u32)>,
}

/// A stretch of normalized text: BPE input, or one chat marker's id.
pub(super) enum Segment<'a> {
    Text(&'a str),
    Marker(u32),
}

impl Normalizer {
    /// `markers`: each chat marker's text and id.
    pub(super) fn new(
        remove_extra_whitespaces: bool,
        add_dummy_prefix: bool,
        markers: &[(&str, u32)],
    ) -> Self {
        let mut normalizer = Normalizer {
            remove_extra_whitespaces,
            add_dummy_prefix,
            markers: markers.iter().map(|&(m, _)| m.to_string()).collect(),
            patterns: Vec::new(),
        };
        normalizer.patterns = markers
            .iter()
            .map(|&(m, id)| (normalizer.normalize(m), id))
            .collect();
        normalizer
    }

    /// The markers' matched forms; one that is empty could match anywhere.
    pub(super) fn marker_patterns(&self) -> impl Iterator<Item = (&str, u32)> {
        self.patterns.iter().map(|(m, id)| (m.as_str(), *id))
    }

    /// 1. with `remove_extra_whitespaces`: runs of U+0020 collapse to one, a leading
    ///    U+0020 goes, and so does the trailing run of U+0020 and `▁`;
    /// 2. U+0020 becomes `▁`, and a non-empty text gets the dummy `▁` first, except a
    ///    text that is then exactly `▁` and one marker (HF normalizes each marker with
    ///    these same rules to get the form it matches, which must stay the bare marker).
    pub(super) fn normalize(&self, text: &str) -> String {
        let mut text = text.to_string();
        if self.remove_extra_whitespaces {
            text = collapse_spaces(&text);
            if let Some(rest) = text.strip_prefix(' ') {
                text = rest.to_string();
            }
            let kept = text.trim_end_matches([' ', SPACE]).len();
            text.truncate(kept);
        }
        let mut text = text.replace(' ', &SPACE.to_string());
        if self.add_dummy_prefix && !text.is_empty() {
            let is_one_marker = self.markers.contains(&text);
            if !is_one_marker {
                text.insert(0, SPACE);
            }
        }
        text
    }

    /// `normalized` cut at each marker: at every position the longest marker that starts
    /// there (of equal ones, the first), the text between them as it is.
    pub(super) fn split<'a>(&self, normalized: &'a str) -> Vec<Segment<'a>> {
        let mut segments = Vec::new();
        let (mut start, mut at) = (0, 0);
        while at < normalized.len() {
            let rest = &normalized[at..];
            let longest = self
                .patterns
                .iter()
                .filter(|(m, _)| !m.is_empty() && rest.starts_with(m.as_str()))
                .min_by_key(|(m, _)| std::cmp::Reverse(m.len()));
            match longest {
                Some((marker, id)) => {
                    if start < at {
                        segments.push(Segment::Text(&normalized[start..at]));
                    }
                    segments.push(Segment::Marker(*id));
                    at += marker.len();
                    start = at;
                }
                None => at += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
        if start < normalized.len() {
            segments.push(Segment::Text(&normalized[start..]));
        }
        segments
    }

    /// The `normalizer` of `tokenizer.json` that does [`Self::normalize`].
    pub(super) fn to_json(&self) -> Value {
        let regex = |pattern: String, content: &str| json!({"type": "Replace", "pattern": {"Regex": pattern}, "content": content});
        let mut steps = Vec::new();
        if self.remove_extra_whitespaces {
            steps.push(regex(" {2,}".into(), " "));
            steps.push(regex(r"\A ".into(), ""));
            steps.push(regex(format!("(?<![ {SPACE}])[ {SPACE}]+\\z"), ""));
        }
        steps.push(
            json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE.to_string()}),
        );
        if self.add_dummy_prefix {
            steps.push(json!({"type": "Prepend", "prepend": SPACE.to_string()}));
            if !self.markers.is_empty() {
                let alternatives: Vec<String> =
                    self.markers.iter().map(|m| regex_escape(m)).collect();
                steps.push(regex(
                    format!("\\A{SPACE}(?=(?:{})\\z)", alternatives.join("|")),
                    "",
                ));
            }
        }
        json!({"type": "Sequence", "normalizers": steps})
    }
}

/// Runs of two or more U+0020 as one.
fn collapse_spaces(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !(c == ' ' && out.ends_with(' ')) {
            out.push(c);
        }
    }
    out
}

/// `text` as a regex that matches it literally (the escapes onig and ECMAScript share).
pub(crate) fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\^$.|?*+()[]{}".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}
