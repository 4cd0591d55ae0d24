//! `--stream`: the answer's text written as it is generated. Each step writes what the
//! text gained, decoded exactly as the final text is: byte-fallback pieces at the end are
//! held back until a piece that is not one follows (or generation ends), since they may be
//! the first bytes of a character the next pieces complete.

use crate::decode::TokenFilter;
use anyhow::Result;
use exporter::tokenizer::NeedleTokenizer;
use std::io::Write;

/// Writes the growing text of a generation to `out`.
pub struct TextStream<'a, W: Write> {
    tokenizer: &'a NeedleTokenizer,
    ids: Vec<u32>,
    written: usize,
    out: W,
}

impl<'a, W: Write> TextStream<'a, W> {
    pub fn new(tokenizer: &'a NeedleTokenizer, out: W) -> Self {
        TextStream {
            tokenizer,
            ids: Vec::new(),
            written: 0,
            out,
        }
    }

    /// Writes the rest of the text (the held-back bytes) and a newline.
    pub fn finish(mut self) -> Result<()> {
        let text = self.tokenizer.decode(&self.ids);
        self.write_from(&text)?;
        writeln!(self.out)?;
        self.out.flush()?;
        Ok(())
    }

    fn write_from(&mut self, text: &str) -> Result<()> {
        // A text a later piece changes (never expected) is not rewritten: the final text
        // is in the result.
        if let Some(new) = text.get(self.written..) {
            self.out.write_all(new.as_bytes())?;
            self.written = text.len();
        }
        self.out.flush()?;
        Ok(())
    }
}

impl<W: Write> TokenFilter for TextStream<'_, W> {
    fn mask(&mut self, _logits: &mut [f32]) -> Result<()> {
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        self.ids.push(token);
        let stable = stable_text(self.tokenizer, &self.ids);
        self.write_from(&stable)
    }
}

/// The text of `ids` that no later piece can change: byte-fallback pieces at the end are
/// left out, since they may be the first bytes of a character the next pieces complete.
pub fn stable_text(tokenizer: &NeedleTokenizer, ids: &[u32]) -> String {
    let pending = ids
        .iter()
        .rev()
        .take_while(|&&id| tokenizer.is_byte_piece(id))
        .count();
    tokenizer.decode(&ids[..ids.len() - pending])
}

/// Two filters in turn: `first` masks first and sees each token first.
pub struct Both<'a>(pub &'a mut dyn TokenFilter, pub &'a mut dyn TokenFilter);

impl TokenFilter for Both<'_> {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        self.0.mask(logits)?;
        self.1.mask(logits)
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        self.0.accept(token)?;
        self.1.accept(token)
    }

    fn complete(&self) -> bool {
        self.0.complete() || self.1.complete()
    }

    fn ran_on(&self) -> bool {
        self.0.ran_on() || self.1.ran_on()
    }
}
