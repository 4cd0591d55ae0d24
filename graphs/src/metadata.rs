//! Typed reads of `metadata_props` and the one reader/writer of a generation's geometry:
//! each config lists its fields once ([`GeometryFields::fields`]), in the order the
//! metadata writes them, and both directions walk that list.

use crate::contract::{parse_spelled, Spelled};
use std::str::FromStr;

/// Typed reads of `metadata_props`, each error naming its key.
pub(crate) struct Metadata<'a, F: Fn(&str) -> Option<String>>(pub &'a F);

impl<F: Fn(&str) -> Option<String>> Metadata<'_, F> {
    pub fn text(&self, key: &str) -> Result<String, String> {
        (self.0)(key).ok_or_else(|| format!("metadata key {key} is missing"))
    }

    pub fn parsed<T: FromStr>(&self, key: &str) -> Result<T, String> {
        let text = self.text(key)?;
        text.parse()
            .map_err(|_| format!("metadata key {key} has the malformed value {text:?}"))
    }

    pub fn spelled<T: Spelled>(&self, key: &str) -> Result<T, String> {
        parse_spelled(&self.text(key)?).map_err(|e| format!("metadata key {key}: {e}"))
    }

    pub fn names(&self, key: &str) -> Result<Vec<String>, String> {
        let text = self.text(key)?;
        Ok(text
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect())
    }

    pub fn list(&self, key: &str) -> Result<Vec<usize>, String> {
        let text = self.text(key)?;
        if text.is_empty() {
            return Ok(Vec::new());
        }
        text.split(',')
            .map(|x| {
                x.parse()
                    .map_err(|_| format!("metadata key {key} is not a list of numbers"))
            })
            .collect()
    }
}

/// One geometry value, borrowed from its config so that it can be written or read.
pub enum Field<'a> {
    Count(&'a mut usize),
    /// Written comma-separated.
    Counts(&'a mut Vec<usize>),
    Real(&'a mut f32),
    Bits(&'a mut u32),
}

impl Field<'_> {
    fn spell(&self) -> String {
        match self {
            Field::Count(v) => v.to_string(),
            Field::Counts(v) => v
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(","),
            Field::Real(v) => v.to_string(),
            Field::Bits(v) => v.to_string(),
        }
    }

    fn read<F: Fn(&str) -> Option<String>>(
        self,
        metadata: &Metadata<'_, F>,
        key: &str,
    ) -> Result<(), String> {
        match self {
            Field::Count(v) => *v = metadata.parsed(key)?,
            Field::Counts(v) => *v = metadata.list(key)?,
            Field::Real(v) => *v = metadata.parsed(key)?,
            Field::Bits(v) => *v = metadata.parsed(key)?,
        }
        Ok(())
    }
}

/// A generation's config as `metadata_props` entries.
pub trait GeometryFields: Clone + Default {
    /// Every recorded field with its key, in the order the metadata lists them.
    fn fields(&mut self) -> Vec<(&'static str, Field<'_>)>;

    /// Sets what the metadata does not record but the fields imply.
    fn complete(&mut self) {}

    /// The geometry as `metadata_props` entries.
    fn to_metadata(&self) -> Vec<(String, String)> {
        let mut config = self.clone();
        config
            .fields()
            .into_iter()
            .map(|(key, field)| (key.to_string(), field.spell()))
            .collect()
    }

    /// Reads the geometry back; `get` looks a key up. The error names the missing or
    /// malformed key.
    fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let metadata = Metadata(&get);
        let mut config = Self::default();
        for (key, field) in config.fields() {
            field.read(&metadata, key)?;
        }
        config.complete();
        Ok(config)
    }
}
