//! Prompts prefilled lately, each with its row of the cache at the prompt's end, so that
//! a conversation that comes back prefills only what it added: an agent framework sends
//! the whole history again after each tool run, and that history begins with the last
//! request's prompt. Only prompts are remembered, not what was generated after them: the
//! history a client sends back renders the model's answer in the trained form (its calls,
//! without the reasoning), which is not the token sequence the model generated.

use super::rows::RowCache;

/// Up to `most` prompts and their rows, the least recently used forgotten first.
pub struct PrefixStore {
    /// The most recently used last.
    entries: Vec<(Vec<u32>, RowCache)>,
    most: usize,
}

impl PrefixStore {
    /// A store of at most `most` prompts (none: it remembers nothing).
    pub fn new(most: usize) -> Self {
        PrefixStore {
            entries: Vec::new(),
            most,
        }
    }

    /// The longest remembered prompt that `prompt` continues with at least one more token
    /// (the logits that follow a prompt come from running its last token): its length and
    /// its row (fewer tokens where the cache slid, [`super::slide`]: the prompt's last).
    pub fn longest_prefix(&mut self, prompt: &[u32]) -> Option<(usize, &RowCache)> {
        let (best, _) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, (p, _))| p.len() < prompt.len() && prompt.starts_with(p))
            .max_by_key(|(_, (p, _))| p.len())?;
        let entry = self.entries.remove(best);
        self.entries.push(entry);
        self.entries.last().map(|(p, row)| (p.len(), row))
    }

    /// Remembers `prompt`'s `row`. The prompts it continues are forgotten (their rows are
    /// the beginning of this one), then the least recently used beyond `most`.
    pub fn remember(&mut self, prompt: Vec<u32>, row: RowCache) {
        if self.most == 0 {
            return;
        }
        self.entries.retain(|(p, _)| !prompt.starts_with(p));
        if self.entries.len() == self.most {
            self.entries.remove(0);
        }
        self.entries.push((prompt, row));
    }

    /// Prompts remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(len: usize) -> RowCache {
        RowCache::empty_of_len(len)
    }

    #[test]
    fn the_longest_prompt_continued_wins_and_an_equal_one_is_not_reused() {
        let mut store = PrefixStore::new(4);
        store.remember(vec![1, 2], row(2));
        store.remember(vec![7, 8, 9], row(3));
        assert_eq!(
            store.longest_prefix(&[1, 2, 3]).map(|(_, row)| row.len()),
            Some(2)
        );
        assert_eq!(
            store
                .longest_prefix(&[7, 8, 9, 1])
                .map(|(_, row)| row.len()),
            Some(3)
        );
        assert!(store.longest_prefix(&[7, 8, 9]).is_none());
        assert!(store.longest_prefix(&[1]).is_none());
        assert!(store.longest_prefix(&[2, 1, 3]).is_none());
    }

    #[test]
    fn a_continuing_prompt_replaces_what_it_continues() {
        let mut store = PrefixStore::new(4);
        store.remember(vec![1, 2], row(2));
        store.remember(vec![1, 2, 3, 4], row(4));
        assert_eq!(store.len(), 1);
        assert_eq!(
            store
                .longest_prefix(&[1, 2, 3, 4, 5])
                .map(|(_, row)| row.len()),
            Some(4)
        );
        assert!(store.longest_prefix(&[1, 2, 9]).is_none());
    }

    #[test]
    fn the_least_recently_used_is_forgotten_first() {
        let mut store = PrefixStore::new(2);
        store.remember(vec![1], row(1));
        store.remember(vec![2], row(1));
        assert!(store.longest_prefix(&[1, 0]).is_some());
        store.remember(vec![3], row(1));
        assert!(store.longest_prefix(&[1, 0]).is_some());
        assert!(store.longest_prefix(&[2, 0]).is_none());
        assert!(store.longest_prefix(&[3, 0]).is_some());
    }

    #[test]
    fn a_store_of_none_remembers_nothing() {
        let mut store = PrefixStore::new(0);
        store.remember(vec![1], row(1));
        assert!(store.is_empty());
    }
}
