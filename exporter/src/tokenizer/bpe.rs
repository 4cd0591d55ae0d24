//! The BPE model of a SentencePiece tokenizer as HF `tokenizers` runs it from a
//! `tokenizer.json` (`models::bpe`, no dropout, no subword prefixes, unknowns not
//! fused), so that `needle-run` and every user of the exported `tokenizer.json`
//! split a text into the same ids.
//!
//! A word starts as its characters (a character missing from the vocabulary becomes its
//! `<0xHH>` byte pieces, or `<unk>`); then the adjacent pair of lowest merge rank is
//! merged, leftmost first, until no pair has a merge. Like HF, the queue keeps entries
//! that went stale and accepts one whose pair still merges into the same piece.

use anyhow::{bail, Result};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A merge: the rank that orders it and the piece it makes.
#[derive(Clone, Copy)]
struct Merge {
    rank: u32,
    merged: u32,
}

pub(super) struct Bpe {
    vocab: HashMap<String, u32>,
    merges: HashMap<(u32, u32), Merge>,
    /// The id of `<0xHH>` for each byte, where byte fallback is on and the piece exists.
    byte_ids: [Option<u32>; 256],
    byte_fallback: bool,
    unk: u32,
}

impl Bpe {
    /// `merges` in rank order (first merges first), each a pair of piece texts whose
    /// concatenation is a piece too. A pair listed twice keeps its last rank, as HF does.
    pub(super) fn new(
        vocab: HashMap<String, u32>,
        merges: &[(String, String)],
        unk: u32,
        byte_fallback: bool,
    ) -> Result<Self> {
        let id = |text: &str| -> Result<u32> {
            match vocab.get(text) {
                Some(&id) => Ok(id),
                None => bail!("BPE merge piece {text:?} is not in the vocabulary"),
            }
        };
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, (left, right)) in merges.iter().enumerate() {
            let merge = Merge {
                rank: rank as u32,
                merged: id(&format!("{left}{right}"))?,
            };
            merge_map.insert((id(left)?, id(right)?), merge);
        }
        let mut byte_ids = [None; 256];
        for (byte, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab.get(&format!("<0x{byte:02X}>")).copied();
        }
        Ok(Bpe {
            vocab,
            merges: merge_map,
            byte_ids,
            byte_fallback,
            unk,
        })
    }

    pub(super) fn id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    /// Appends the ids of `word` (a stretch of normalized text between markers) to `out`.
    pub(super) fn tokenize(&self, word: &str, out: &mut Vec<u32>) {
        let mut symbols = self.symbols(word);
        self.merge_all(&mut symbols);
        out.extend(symbols.iter().filter(|s| s.live).map(|s| s.id));
    }

    /// The word's characters as pieces. A pending `<unk>` is written out only when the
    /// next character is a piece of its own or at the end: byte-fallback pieces of a
    /// later character go before it, as in HF.
    fn symbols(&self, word: &str) -> Vec<Symbol> {
        let mut ids = Vec::with_capacity(word.len());
        let mut pending_unk = false;
        let mut buf = [0u8; 4];
        for c in word.chars() {
            if let Some(id) = self.id(c.encode_utf8(&mut buf)) {
                if std::mem::take(&mut pending_unk) {
                    ids.push(self.unk);
                }
                ids.push(id);
                continue;
            }
            if self.byte_fallback {
                let bytes: Option<Vec<u32>> = buf[..c.len_utf8()]
                    .iter()
                    .map(|&b| self.byte_ids[b as usize])
                    .collect();
                if let Some(bytes) = bytes {
                    ids.extend(bytes);
                    continue;
                }
            }
            if std::mem::replace(&mut pending_unk, true) {
                ids.push(self.unk);
            }
        }
        if pending_unk {
            ids.push(self.unk);
        }
        let last = ids.len().saturating_sub(1);
        ids.iter()
            .enumerate()
            .map(|(i, &id)| Symbol {
                id,
                prev: i.checked_sub(1),
                next: (i < last).then_some(i + 1),
                live: true,
            })
            .collect()
    }

    fn merge_all(&self, symbols: &mut [Symbol]) {
        let mut queue: BinaryHeap<Candidate> = (0..symbols.len().saturating_sub(1))
            .filter_map(|pos| self.candidate(pos, symbols[pos].id, symbols[pos + 1].id))
            .collect();
        while let Some(top) = queue.pop() {
            let left = symbols[top.pos];
            let Some(next) = left.next.filter(|_| left.live) else {
                continue;
            };
            let right = symbols[next];
            let still_merges = self
                .merges
                .get(&(left.id, right.id))
                .is_some_and(|m| m.merged == top.merged);
            if !still_merges {
                continue;
            }
            symbols[top.pos].id = top.merged;
            symbols[top.pos].next = right.next;
            symbols[next].live = false;
            if let Some(after) = right.next {
                symbols[after].prev = Some(top.pos);
            }
            let current = symbols[top.pos];
            if let Some(prev) = current.prev {
                queue.extend(self.candidate(prev, symbols[prev].id, current.id));
            }
            if let Some(after) = current.next {
                queue.extend(self.candidate(top.pos, current.id, symbols[after].id));
            }
        }
    }

    fn candidate(&self, pos: usize, left: u32, right: u32) -> Option<Candidate> {
        self.merges.get(&(left, right)).map(|m| Candidate {
            pos,
            rank: m.rank,
            merged: m.merged,
        })
    }
}

/// A piece in a word being merged, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    live: bool,
}

/// A queued merge of the symbol at `pos` with its next one.
#[derive(PartialEq, Eq)]
struct Candidate {
    pos: usize,
    rank: u32,
    merged: u32,
}

/// The max-heap pops the lowest rank, then the leftmost position.
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
