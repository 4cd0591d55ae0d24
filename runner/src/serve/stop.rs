//! OpenAI's `stop`: up to four sequences that end the answer where one first appears in
//! the decoded text (the whole text the model writes: reasoning, call block and answer
//! alike), the sequence itself not returned. The decoding thread watches the text so the
//! row leaves the batch at once ([`StopWatch`]); the handler cuts the text it answers with
//! at the same place, and while streaming holds back a tail that could still become one.

use crate::decode::TokenFilter;
use crate::stream::stable_text;
use anyhow::Result;
use exporter::tokenizer::NeedleTokenizer;
use std::sync::Arc;

/// The stop sequences of a request (none empty).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StopTexts(pub Vec<String>);

impl StopTexts {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` up to where a stop sequence first begins, and whether one did.
    pub fn cut<'a>(&self, text: &'a str) -> (&'a str, bool) {
        match self
            .0
            .iter()
            .filter_map(|stop| text.find(stop.as_str()))
            .min()
        {
            Some(at) => (&text[..at], true),
            None => (text, false),
        }
    }

    /// The part of a growing `text` that may be shown: up to the first stop sequence, or,
    /// without one, all but a tail that a stop sequence could begin with.
    pub fn shown<'a>(&self, text: &'a str) -> &'a str {
        let (cut, stopped) = self.cut(text);
        if stopped {
            return cut;
        }
        let unsure = self
            .0
            .iter()
            .flat_map(|stop| {
                stop.char_indices()
                    .skip(1)
                    .map(|(i, _)| &stop[..i])
                    .filter(|prefix| text.ends_with(prefix))
                    .map(str::len)
            })
            .max()
            .unwrap_or(0);
        &text[..text.len() - unsure]
    }
}

/// Ends a row once its decoded text holds a stop sequence.
pub struct StopWatch {
    tokenizer: Arc<NeedleTokenizer>,
    stops: StopTexts,
    ids: Vec<u32>,
    stopped: bool,
}

impl StopWatch {
    pub fn new(tokenizer: Arc<NeedleTokenizer>, stops: StopTexts) -> Self {
        StopWatch {
            tokenizer,
            stops,
            ids: Vec::new(),
            stopped: false,
        }
    }
}

impl TokenFilter for StopWatch {
    fn mask(&mut self, _logits: &mut [f32]) -> Result<()> {
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        self.ids.push(token);
        // The stable text: the bytes of a character still being completed could not hold
        // a whole sequence the full text would not.
        let text = stable_text(&self.tokenizer, &self.ids);
        self.stopped = self.stops.cut(&text).1;
        Ok(())
    }

    fn complete(&self) -> bool {
        self.stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_ends_before_the_first_stop_and_a_possible_start_is_held_back() {
        let stops = StopTexts(vec!["END".into(), "\n\n".into(), "é!".into()]);
        assert_eq!(stops.cut("a\n\nb END"), ("a", true));
        assert_eq!(stops.cut("no stop here"), ("no stop here", false));
        assert_eq!(stops.shown("almost EN"), "almost ");
        assert_eq!(stops.shown("line\n"), "line");
        assert_eq!(stops.shown("café"), "caf");
        assert_eq!(stops.shown("café!x"), "caf");
        assert_eq!(stops.shown("done."), "done.");
    }
}
