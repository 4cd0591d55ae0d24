//! `needle.Attention`: grouped-query attention over each row's cache, which it appends this
//! call's keys and values to, as `GroupQueryAttention` does with a shared past/present
//! buffer (the packed graphs' core; `kernel-ops/src/attention.rs` states the op).
//!
//! A row's keys are packed from slot 0 and counted by its attention mask: with `total`
//! real keys after this call and `sequence` new tokens, the new ones go to slots
//! `past = total − sequence` on (from 0 in a prompt's first call, when the mask has no
//! past columns and shorter rows are padded on the right). The query at slot `p` sees the
//! keys `p − window + 1 ..= p` (the window counting its own key; all earlier keys without
//! one), and query head `h` reads kv head `h / (heads / kv_heads)`.
//!
//! Why not onnxruntime's kernel: it scores every query head against every key of the
//! buffer, each head reading its kv head's keys again, and masks afterwards; here a kv
//! head's keys are read once for all the query heads that share it, and only within the
//! window. Scores are dot products ([`crate::math::dot`]) scaled, a softmax with the
//! maximum subtracted, and the values summed in key order.

use crate::isa::Isa;
use crate::math::{dot, exponentials, softmax};
use crate::small_matmul::{matmul, matmul_strided};
use crate::split::RowSplit;
use crate::transpose::{transpose, Strided};
use crate::ShapeError;

/// The heads and the window.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    /// Each head's width in the projections and the cache (the model's, or padded).
    pub width: usize,
    /// The scores' factor (`1 / √(query/key width)`).
    pub scale: f32,
    /// The keys a query sees, its own among them; `None`: every earlier key.
    pub window: Option<usize>,
}

impl Heads {
    /// One token's projections: its query heads, then its key heads, then its value heads.
    pub fn projections_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.width
    }

    fn check(&self) -> Result<(), ShapeError> {
        if self.heads == 0 || self.kv_heads == 0 || self.width == 0 {
            return Err(ShapeError(
                "attention needs heads, kv heads and a width".into(),
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ShapeError(format!(
                "{} query heads do not share {} kv heads evenly",
                self.heads, self.kv_heads
            )));
        }
        if self.window == Some(0) {
            return Err(ShapeError("a window of no keys".into()));
        }
        Ok(())
    }
}

/// Where each row's tokens are in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowKeys {
    /// Keys before this call's tokens (the first new token's slot).
    pub past: usize,
    /// Real keys after this call.
    pub total: usize,
}

impl RowKeys {
    /// Each row's keys from its attention-mask row (`[total_sequence]`: 1 for a real
    /// token) and this call's `sequence` new tokens: a mask as wide as the call is a
    /// prompt's first call, whose rows start at slot 0. A row of no real token counts one
    /// key, as `GroupQueryAttention`'s graphs clamp it (its outputs are padding).
    pub fn of_mask(mask: &[i64], sequence: usize) -> RowKeys {
        let total = (mask.iter().filter(|&&m| m != 0).count()).max(1);
        let first_call = mask.len() == sequence;
        RowKeys {
            past: match first_call {
                true => 0,
                false => total.saturating_sub(sequence),
            },
            total,
        }
    }
}

/// The cache of one side (keys or values): `[batch, kv_heads, capacity, width]`.
pub struct CacheSide<'a> {
    pub data: &'a mut [f32],
    pub capacity: usize,
}

/// Attention for `rows.len()` rows of `sequence` tokens: `projections` `[batch, sequence,
/// heads.projections_width()]`; the new keys and values written into `keys` and `values`
/// (which hold each row's past); `out` `[batch, sequence, heads · width]`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    isa: Isa,
    heads: &Heads,
    projections: &[f32],
    rows: &[RowKeys],
    sequence: usize,
    keys: CacheSide,
    values: CacheSide,
    out: &mut [f32],
    split: &dyn RowSplit,
) -> Result<(), ShapeError> {
    heads.check()?;
    let (batch, width) = (rows.len(), heads.width);
    let capacity = keys.capacity;
    let side = batch * heads.kv_heads * capacity * width;
    if projections.len() != batch * sequence * heads.projections_width()
        || out.len() != batch * sequence * heads.heads * width
        || keys.data.len() != side
        || values.data.len() != side
        || values.capacity != capacity
    {
        return Err(ShapeError(format!(
            "projections of {}, out of {}, caches of {} and {} values are not {batch} rows of \
             {sequence} tokens of {heads:?} with {capacity} slots",
            projections.len(),
            out.len(),
            keys.data.len(),
            values.data.len()
        )));
    }
    if let Some(row) = rows.iter().find(|r| r.past + sequence > capacity) {
        return Err(ShapeError(format!(
            "{} past keys and {sequence} new ones do not fit {capacity} slots",
            row.past
        )));
    }
    append(
        heads,
        projections,
        rows,
        sequence,
        keys.data,
        values.data,
        capacity,
    );
    let cache = Cache {
        keys: keys.data,
        values: values.data,
        capacity,
    };
    let out_rows = Output(out.as_mut_ptr());
    split.for_each(batch * heads.kv_heads, &|task| {
        let (b, g) = (task / heads.kv_heads, task % heads.kv_heads);
        let group = Group {
            isa,
            heads,
            projections,
            row: rows[b],
            b,
            g,
            sequence,
            cache: &cache,
            out: &out_rows,
        };
        match isa {
            #[cfg(target_arch = "x86_64")]
            // Sound: `Isa::available` offers AVX-512 only where AVX-512F was detected.
            Isa::Avx512 => unsafe { attend_avx512(&group) },
            #[cfg(target_arch = "x86_64")]
            // Sound: and AVX2 only where AVX2 and FMA were.
            Isa::Avx2 => unsafe { attend_avx2(&group) },
            _ => group.attend(),
        }
    });
    Ok(())
}

/// [`Group::attend`] compiled for AVX-512: its softmax's `exp`, the scaling and the key
/// transposition vectorize 16 wide (the same arithmetic, so the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_avx512(group: &Group) {
    group.attend()
}

/// [`Group::dot`]'s AVX-512 form.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn avx512_dot(q: &[f32], k: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    debug_assert!(q.len() == k.len() && q.len().is_multiple_of(16));
    let mut sums = _mm512_setzero_ps();
    for at in (0..q.len()).step_by(16) {
        // Sound: `at + 16 ≤ len` of both (the caller's promise).
        let (a, b) = unsafe {
            (
                _mm512_loadu_ps(q.as_ptr().add(at)),
                _mm512_loadu_ps(k.as_ptr().add(at)),
            )
        };
        sums = _mm512_fmadd_ps(a, b, sums);
    }
    _mm512_reduce_add_ps(sums)
}

/// [`Group::attend`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(group: &Group) {
    group.attend()
}

/// From this many tokens a call on, queries score their keys a block at a time as matrix
/// products ([`Group::attend_in_blocks`]): a prompt piece's 128 tokens one by one ran at
/// four fifths of onnxruntime's speed; one token at a time (decode) dots each key.
const BLOCKED_FROM: usize = 8;

/// Queries of a prompt that score together: the block's keys are those of its first
/// query's window to its last query.
const QUERY_BLOCK: usize = 32;

/// Writes each row's new keys and values at its slots.
fn append(
    heads: &Heads,
    projections: &[f32],
    rows: &[RowKeys],
    sequence: usize,
    keys: &mut [f32],
    values: &mut [f32],
    capacity: usize,
) {
    let width = heads.width;
    let token_width = heads.projections_width();
    for (b, row) in rows.iter().enumerate() {
        for i in 0..sequence {
            let token = &projections[(b * sequence + i) * token_width..][..token_width];
            for g in 0..heads.kv_heads {
                let slot = ((b * heads.kv_heads + g) * capacity + row.past + i) * width;
                let key = (heads.heads + g) * width;
                let value = (heads.heads + heads.kv_heads + g) * width;
                keys[slot..slot + width].copy_from_slice(&token[key..key + width]);
                values[slot..slot + width].copy_from_slice(&token[value..value + width]);
            }
        }
    }
}

/// The caches once this call's keys are in, read by every task.
struct Cache<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    capacity: usize,
}

/// `out`, written by the tasks at disjoint heads.
struct Output(*mut f32);
// Sound: each task writes only its own row's tokens' heads of kv group `g`.
unsafe impl Sync for Output {}

/// Row `b`'s query heads of kv head `g` (the `group` heads that share it), for each of its
/// `sequence` tokens.
struct Group<'a> {
    isa: Isa,
    heads: &'a Heads,
    projections: &'a [f32],
    row: RowKeys,
    b: usize,
    g: usize,
    sequence: usize,
    cache: &'a Cache<'a>,
    out: &'a Output,
}

impl Group<'_> {
    /// Query heads sharing the kv head.
    #[inline(always)]
    fn size(&self) -> usize {
        self.heads.heads / self.heads.kv_heads
    }

    /// Where slot `slot` of the kv head starts in the cache.
    #[inline(always)]
    fn slot(&self, slot: usize) -> usize {
        ((self.b * self.heads.kv_heads + self.g) * self.cache.capacity + slot) * self.heads.width
    }

    /// Query head `t` of the group for token `i`.
    #[inline(always)]
    fn query(&self, i: usize, t: usize) -> &[f32] {
        let width = self.heads.width;
        let token = (self.b * self.sequence + i) * self.heads.projections_width();
        &self.projections[token + (self.g * self.size() + t) * width..][..width]
    }

    /// The keys token `i` sees: `first..=last`, empty where `first > last`.
    #[inline(always)]
    fn seen(&self, i: usize) -> (usize, usize) {
        let query = self.row.past + i;
        let first = self
            .heads
            .window
            .map_or(0, |w| (query + 1).saturating_sub(w));
        (first, query.min(self.row.total - 1))
    }

    /// Writes token `i`'s heads of the group.
    #[inline(always)]
    fn write(&self, i: usize, heads: &[f32]) {
        let width = self.heads.width;
        let at =
            (self.b * self.sequence + i) * self.heads.heads * width + self.g * self.size() * width;
        // Sound: heads `g · size ..` of token `i` of row `b` are this task's alone, within
        // `out` (checked to be `[batch, sequence, heads · width]`).
        let dst = unsafe { std::slice::from_raw_parts_mut(self.out.0.add(at), heads.len()) };
        dst.copy_from_slice(heads);
    }

    /// The group's heads for every token of the call.
    #[inline(always)]
    fn attend(&self) {
        match self.sequence >= BLOCKED_FROM {
            true => self.attend_in_blocks(),
            false => self.attend_each(),
        }
    }

    /// `Σ q·k`: on AVX-512 one register of partial sums reduced as a tree, inlined into
    /// [`attend_avx512`] (the call and the sixteen sums added in a row of [`dot`] were most
    /// of a decode step's attention); elsewhere [`dot`].
    #[inline(always)]
    fn dot(&self, q: &[f32], k: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Avx512 && q.len().is_multiple_of(16) {
            // Sound: the AVX-512 path runs only where AVX-512F was detected; `q` and `k`
            // are as long, a multiple of 16.
            return unsafe { avx512_dot(q, k) };
        }
        dot(self.isa, q, k)
    }

    /// Each token alone: every key of its window dotted with each query head.
    #[inline(always)]
    fn attend_each(&self) {
        let (width, group) = (self.heads.width, self.size());
        let mut scores = vec![0.0f32; group * self.cache.capacity];
        let mut sums = vec![0.0f32; group * width];
        for i in 0..self.sequence {
            let (first, last) = self.seen(i);
            sums.fill(0.0);
            if first <= last {
                let seen = last + 1 - first;
                for t in 0..group {
                    self.score(i, t, first, &mut scores[t * seen..(t + 1) * seen]);
                }
                for t in 0..group {
                    softmax(&mut scores[t * seen..(t + 1) * seen]);
                }
                let values = &self.cache.values[self.slot(first)..][..seen * width];
                self.weigh(&scores[..group * seen], values, &mut sums);
            }
            self.write(i, &sums);
        }
    }

    /// `scores[j] = scale · (q · k)` of query head `t` of token `i` and the keys from slot
    /// `first` on. AVX-512 dots sixteen keys at once and adds their sixteen registers of
    /// partial sums across in one tree ([`avx512::dots`]: one key at a time, the reduction
    /// across lanes was most of a decode step's attention); the keys past the last
    /// sixteen, and other paths, one at a time ([`Group::dot`], the same bits).
    #[inline(always)]
    fn score(&self, i: usize, t: usize, first: usize, scores: &mut [f32]) {
        let (q, width, scale) = (self.query(i, t), self.heads.width, self.heads.scale);
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Avx512 && width.is_multiple_of(16) {
            for (k, sixteen) in scores.chunks_exact_mut(avx512::KEYS).enumerate() {
                let keys = &self.cache.keys[self.slot(first + k * avx512::KEYS)..];
                // Sound: AVX-512 runs only where it was detected; the 16 keys from the
                // chunk's first slot are within the cache (they are seen keys), each as
                // wide as `q`, a multiple of 16.
                let dots = unsafe { avx512::dots(q, &keys[..avx512::KEYS * width]) };
                for (score, dot) in sixteen.iter_mut().zip(dots) {
                    *score = dot * scale;
                }
                done += avx512::KEYS;
            }
        }
        for (j, score) in scores.iter_mut().enumerate().skip(done) {
            let key = &self.cache.keys[self.slot(first + j)..][..width];
            *score = self.dot(q, key) * scale;
        }
    }

    /// `sums[t] = Σ_j scores[t, j] · values[j]` for the group's heads (`scores` `[group,
    /// seen]`, `values` `[seen, width]`), each lane a product then a sum, key by key. AVX-512
    /// keeps the sums in registers, a 16-lane slice of every head at a time ([`avx512::weigh`]),
    /// where the loop kept them in memory.
    #[inline(always)]
    fn weigh(&self, scores: &[f32], values: &[f32], sums: &mut [f32]) {
        let (width, group) = (self.heads.width, self.size());
        let seen = values.len() / width;
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Avx512 && width.is_multiple_of(16) {
            // Sound: AVX-512 was detected; the shapes are as the caller's promise states.
            return unsafe { avx512::weigh(scores, values, group, width, sums) };
        }
        for (j, value) in values.chunks_exact(width).enumerate() {
            for t in 0..group {
                let p = scores[t * seen + j];
                let sum = &mut sums[t * width..(t + 1) * width];
                sum.iter_mut().zip(value).for_each(|(s, &v)| *s += p * v);
            }
        }
    }

    /// [`QUERY_BLOCK`] tokens at a time: their query heads times the block's keys
    /// (transposed), each row's window softmaxed (0 outside it), times the block's values.
    #[inline(always)]
    fn attend_in_blocks(&self) {
        // Taken out and put back, not used inside a closure: this body must stay inlined
        // into the caller's AVX-512 code (a closure is compiled on its own).
        let mut buffers = BLOCK_BUFFERS.with_borrow_mut(std::mem::take);
        self.attend_in_blocks_with(&mut buffers);
        BLOCK_BUFFERS.with_borrow_mut(|kept| *kept = buffers);
    }

    /// [`Group::attend_in_blocks`] in the thread's buffers.
    #[inline(always)]
    fn attend_in_blocks_with(&self, buffers: &mut BlockBuffers) {
        let (width, group, scale) = (self.heads.width, self.size(), self.heads.scale);
        let BlockBuffers {
            keys_t,
            queries,
            scores,
            inverses,
            heads,
        } = buffers;
        // Every key a query of the call sees, transposed once: each block's keys are a run
        // of its columns (transposing them a block at a time cost as much as the scores).
        let (first, _) = self.seen(0);
        let (_, last) = self.seen(self.sequence - 1);
        let all = (last + 1).saturating_sub(first);
        keys_t.resize(width * all, 0.0);
        let keys = Strided {
            data: &self.cache.keys[self.slot(first)..][..all * width],
            stride: width,
        };
        transpose(self.isa, keys, all, width, keys_t, all);
        for start in (0..self.sequence).step_by(QUERY_BLOCK) {
            let n = QUERY_BLOCK.min(self.sequence - start);
            let (lo, _) = self.seen(start);
            let (_, hi) = self.seen(start + n - 1);
            let rows = n * group;
            heads.clear();
            heads.resize(rows * width, 0.0);
            if lo <= hi {
                let m = hi + 1 - lo;
                // The queries scaled as they are gathered (a pass over the scores fewer;
                // the same products where the scale is a power of two, 1/8 for heads of 64).
                queries.clear();
                for i in start..start + n {
                    for t in 0..group {
                        queries.extend(self.query(i, t).iter().map(|&q| q * scale));
                    }
                }
                scores.resize(rows * m, 0.0);
                let scores = &mut scores[..rows * m];
                let keys = (&keys_t[lo - first..], all);
                matmul_strided(self.isa, queries, keys, scores, rows, width, m);
                // Each row's exponentials (0 outside its window); the weighted values are
                // scaled by the inverse of their sum after (64 products a row, not 256).
                inverses.clear();
                for (r, row) in scores.chunks_exact_mut(m).enumerate() {
                    let (first, last) = self.seen(start + r / group);
                    let from = first.clamp(lo, hi + 1);
                    let to = (last + 1).clamp(from, hi + 1);
                    let (before, rest) = row.split_at_mut(from - lo);
                    let (seen, after) = rest.split_at_mut(to - from);
                    before.fill(0.0);
                    after.fill(0.0);
                    inverses.push(match seen.is_empty() {
                        true => 0.0,
                        false => exponentials(seen),
                    });
                }
                let values = &self.cache.values[self.slot(lo)..][..m * width];
                matmul(self.isa, scores, values, heads, rows, m, width);
                for (row, &inverse) in heads.chunks_exact_mut(width).zip(inverses.iter()) {
                    row.iter_mut().for_each(|v| *v *= inverse);
                }
            }
            for (i, token) in heads.chunks_exact(group * width).enumerate() {
                self.write(start + i, token);
            }
        }
    }
}

/// A thread's buffers for [`Group::attend_in_blocks`], kept between calls: fresh ones (the
/// transposed keys alone ~100 KB a kv head) were mapped and faulted in every call, ~7% of
/// a prompt piece's attention.
#[derive(Default)]
struct BlockBuffers {
    keys_t: Vec<f32>,
    queries: Vec<f32>,
    scores: Vec<f32>,
    /// Each score row's inverse sum of exponentials.
    inverses: Vec<f32>,
    heads: Vec<f32>,
}

thread_local! {
    static BLOCK_BUFFERS: std::cell::RefCell<BlockBuffers> = std::cell::RefCell::new(BlockBuffers::default());
}

/// The one-token kernels of [`Group::attend_each`] on AVX-512.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Keys dotted at once: one register of sums each, added across together.
    pub const KEYS: usize = 16;
    /// Registers of sums [`weigh`] keeps at once (with the values it loads, within the 32).
    const SUMS: usize = 16;

    /// `q · kⱼ` for the 16 keys of `keys` (`[16, q.len()]`): each key's products summed
    /// in the lanes of one register, input chunk by input chunk, then the 16 registers'
    /// lanes added across by one tree (lane `l` and `l + 8`, then `+ 4`, `+ 2`, `+ 1`:
    /// the tree `_mm512_reduce_add_ps` adds one register by, so the same bits as
    /// `super::avx512_dot` of each key).
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `q.len()` is a multiple of 16 and `keys` holds 16 of it.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dots(q: &[f32], keys: &[f32]) -> [f32; KEYS] {
        let width = q.len();
        debug_assert!(width.is_multiple_of(16) && keys.len() == KEYS * width);
        let mut sums = [_mm512_setzero_ps(); KEYS];
        for at in (0..width).step_by(16) {
            let q = _mm512_loadu_ps(q.as_ptr().add(at));
            for (j, sum) in sums.iter_mut().enumerate() {
                let k = _mm512_loadu_ps(keys.as_ptr().add(j * width + at));
                *sum = _mm512_fmadd_ps(q, k, *sum);
            }
        }
        let mut out = [0.0f32; KEYS];
        _mm512_storeu_ps(out.as_mut_ptr(), add_across(sums));
        out
    }

    /// Lane `j` of the result: the sum of register `j`'s lanes. Each level adds a
    /// register's half-groups of lanes and packs two registers into one: `g` lanes a key
    /// become `g / 2`, the first register's keys before the second's.
    #[target_feature(enable = "avx512f")]
    fn add_across(sums: [__m512; KEYS]) -> __m512 {
        let eights: [__m512; 8] = std::array::from_fn(|i| pair(sums[2 * i], sums[2 * i + 1], 16));
        let fours: [__m512; 4] = std::array::from_fn(|i| pair(eights[2 * i], eights[2 * i + 1], 8));
        let twos: [__m512; 2] = std::array::from_fn(|i| pair(fours[2 * i], fours[2 * i + 1], 4));
        pair(twos[0], twos[1], 2)
    }

    /// One level of [`add_across`] on two registers of `g` lanes a key.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn pair(a: __m512, b: __m512, g: usize) -> __m512 {
        let level = HALVES[g.trailing_zeros() as usize - 1];
        // Sound: each table holds 16 ints.
        let (first, second) = unsafe {
            (
                _mm512_loadu_si512(level[0].as_ptr().cast()),
                _mm512_loadu_si512(level[1].as_ptr().cast()),
            )
        };
        _mm512_add_ps(
            _mm512_permutex2var_ps(a, first, b),
            _mm512_permutex2var_ps(a, second, b),
        )
    }

    /// For `g` = 2, 4, 8, 16 lanes a key: where output lane `o` of a level (`g / 2` lanes a
    /// key) finds its key's lane in the first half, and in the second half, of the two
    /// registers (`16 +` for the second register).
    const HALVES: [[[i32; 16]; 2]; 4] = {
        let mut tables = [[[0i32; 16]; 2]; 4];
        let mut level = 0;
        while level < 4 {
            let g = 2usize << level;
            let mut o = 0;
            while o < 16 {
                let (slot, r) = (o / (g / 2), o % (g / 2));
                let keys_per_register = 16 / g;
                let (register, slot) = (slot / keys_per_register, slot % keys_per_register);
                let lane = 16 * register + slot * g + r;
                tables[level][0][o] = lane as i32;
                tables[level][1][o] = (lane + g / 2) as i32;
                o += 1;
            }
            level += 1;
        }
        tables
    };

    /// `sums[t · width ..] = Σ_j scores[t · seen + j] · values[j]` for `group` heads, each
    /// lane a product then a sum (unfused), key by key, in registers: `C` 16-lane slices
    /// of each of the `G` heads' sums at a time, as many as [`SUMS`] registers hold. Each
    /// slice is one chain of dependent adds, so a pass needs several (`G · C` of 8 or more
    /// keep both adders busy; with one slice a head at a time it waited on each add). Head
    /// counts other than 1, 2 and 4 go one head at a time.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `width` is a multiple of 16, `values` is `[seen, width]`,
    /// `scores` `[group, seen]` and `sums` `[group, width]`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn weigh(
        scores: &[f32],
        values: &[f32],
        group: usize,
        width: usize,
        sums: &mut [f32],
    ) {
        debug_assert!(width.is_multiple_of(16));
        let slices = width / 16;
        // The widest pass of whole slices whose sums the registers hold.
        let per_pass = (0..=4)
            .rev()
            .map(|k| 1usize << k)
            .find(|&c| group * c <= SUMS && slices.is_multiple_of(c))
            .unwrap_or(1);
        macro_rules! passes {
            ($(($g:literal, $c:literal)),*) => {
                match (group, per_pass) {
                    $(($g, $c) => weigh_passes::<$g, $c>(scores, values, width, sums),)*
                    _ => {
                        let seen = values.len() / width;
                        for (t, sums) in sums.chunks_exact_mut(width).enumerate() {
                            weigh(&scores[t * seen..(t + 1) * seen], values, 1, width, sums);
                        }
                    }
                }
            };
        }
        passes!(
            (1, 16),
            (1, 8),
            (1, 4),
            (1, 2),
            (1, 1),
            (2, 8),
            (2, 4),
            (2, 2),
            (2, 1),
            (4, 4),
            (4, 2),
            (4, 1)
        )
    }

    /// [`weigh`] of `G` heads, `C` slices a pass.
    #[target_feature(enable = "avx512f")]
    unsafe fn weigh_passes<const G: usize, const C: usize>(
        scores: &[f32],
        values: &[f32],
        width: usize,
        sums: &mut [f32],
    ) {
        let seen = values.len() / width;
        debug_assert!(scores.len() == G * seen && sums.len() == G * width);
        for at in (0..width).step_by(16 * C) {
            let mut acc = [[_mm512_setzero_ps(); C]; G];
            for j in 0..seen {
                let row = values.as_ptr().add(j * width + at);
                let v: [__m512; C] = std::array::from_fn(|c| _mm512_loadu_ps(row.add(16 * c)));
                for (t, acc) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*scores.get_unchecked(t * seen + j));
                    for (acc, &v) in acc.iter_mut().zip(&v) {
                        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(p, v));
                    }
                }
            }
            for (t, acc) in acc.iter().enumerate() {
                for (c, &acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(sums.as_mut_ptr().add(t * width + at + 16 * c), acc);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    /// [`attention`] on one thread into `cache` (keys, values, their slots a kv head).
    fn run(
        isa: Isa,
        heads: &Heads,
        projections: &[f32],
        rows: &[RowKeys],
        sequence: usize,
        (keys, values, capacity): (&mut [f32], &mut [f32], usize),
        out: &mut [f32],
    ) {
        let keys = CacheSide {
            data: keys,
            capacity,
        };
        let values = CacheSide {
            data: values,
            capacity,
        };
        attention(
            isa,
            heads,
            projections,
            rows,
            sequence,
            keys,
            values,
            out,
            &Serial,
        )
        .unwrap();
    }

    /// Attention in f64 from the definition: each real query over its window's keys.
    fn reference(
        heads: &Heads,
        projections: &[f32],
        masks: &[Vec<i64>],
        sequence: usize,
    ) -> Vec<f64> {
        let (w, tw) = (heads.width, heads.projections_width());
        let group = heads.heads / heads.kv_heads;
        let mut out = vec![0.0; masks.len() * sequence * heads.heads * w];
        for (b, mask) in masks.iter().enumerate() {
            let row = RowKeys::of_mask(mask, sequence);
            // The row's past keys are projections of earlier tokens, given beside.
            for i in 0..sequence {
                let query = row.past + i;
                if query >= row.total {
                    continue;
                }
                let first = heads
                    .window
                    .map_or(0, |win| (query + 1).saturating_sub(win));
                let token = |t: usize| &projections[(b * sequence + t) * tw..][..tw];
                for h in 0..heads.heads {
                    let g = h / group;
                    let q = &token(i)[h * w..(h + 1) * w];
                    let keys: Vec<usize> = (first..=query).collect();
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|&s| {
                            let k = &token(s - row.past)[(heads.heads + g) * w..][..w];
                            q.iter()
                                .zip(k)
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum::<f64>()
                                * heads.scale as f64
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for (&s, p) in keys.iter().zip(&e) {
                        let v = &token(s - row.past)[(heads.heads + heads.kv_heads + g) * w..][..w];
                        for d in 0..w {
                            out[((b * sequence + i) * heads.heads + h) * w + d] +=
                                p / total * v[d] as f64;
                        }
                    }
                }
            }
        }
        out
    }

    /// A prompt's first call (rows of unequal length, right-padded) of every head layout
    /// and window, on every path: within float rounding of the definition, and the cache
    /// holding each row's keys from slot 0.
    #[test]
    fn a_first_call_attends_within_the_window_on_every_path() {
        // 7 tokens one at a time, 40 in blocks.
        for sequence in [7, 40] {
            first_call_on_every_path(sequence);
        }
    }

    fn first_call_on_every_path(sequence: usize) {
        // Widths of 20 (a tail past 16 lanes) and 32 (AVX-512's whole registers).
        for (h, kv, window, w) in [
            (4, 2, None, 20),
            (4, 2, Some(3), 32),
            (3, 1, Some(1), 20),
            (2, 2, Some(64), 32),
        ] {
            let heads = Heads {
                heads: h,
                kv_heads: kv,
                width: w,
                scale: 0.3,
                window,
            };
            let masks = vec![
                vec![1; sequence],
                [vec![1; sequence - 3], vec![0; 3]].concat(),
            ];
            let projections: Vec<f32> = (0..2 * sequence * heads.projections_width())
                .map(|i| ((i * 7919) % 61) as f32 * 0.05 - 1.5)
                .collect();
            let want = reference(&heads, &projections, &masks, sequence);
            let rows: Vec<RowKeys> = masks
                .iter()
                .map(|m| RowKeys::of_mask(m, sequence))
                .collect();
            for isa in Isa::available() {
                let capacity = sequence + 2;
                let mut keys = vec![0.0; 2 * kv * capacity * w];
                let mut values = keys.clone();
                let mut out = vec![0.0; 2 * sequence * h * w];
                let cache = (&mut keys[..], &mut values[..], capacity);
                run(isa, &heads, &projections, &rows, sequence, cache, &mut out);
                for (b, row) in rows.iter().enumerate() {
                    for i in 0..row.total {
                        let at = ((b * sequence + i) * h) * w;
                        for (x, y) in out[at..at + h * w].iter().zip(&want[at..at + h * w]) {
                            assert!(
                                (*x as f64 - y).abs() < 1e-5,
                                "{isa:?} {heads:?} row {b} token {i}: {x} vs {y}"
                            );
                        }
                    }
                }
                // Row 0's second token's key of kv head 0 is in slot 1.
                let token = &projections[heads.projections_width()..][..heads.projections_width()];
                assert_eq!(&keys[w..2 * w], &token[h * w..(h + 1) * w]);
            }
        }
    }

    /// Tokens fed in calls after the cache's past give the first call's outputs, on every
    /// path (one-token calls with more than sixteen keys take AVX-512's sixteen-key dots).
    #[test]
    fn calls_after_the_past_equal_the_whole_call() {
        let heads = Heads {
            heads: 4,
            kv_heads: 2,
            width: 16,
            scale: 0.25,
            window: Some(24),
        };
        let sequence = 40;
        let tw = heads.projections_width();
        let projections: Vec<f32> = (0..sequence * tw)
            .map(|i| ((i * 104_729) % 53) as f32 * 0.04 - 1.0)
            .collect();
        let capacity = 44;
        let run = |isa: Isa, calls: &[std::ops::Range<usize>]| {
            let mut keys = vec![0.0; 2 * capacity * 16];
            let mut values = keys.clone();
            let mut out = Vec::new();
            for call in calls {
                let n = call.len();
                let mask = vec![1; call.end];
                let rows = [RowKeys::of_mask(&mask, n)];
                let mut part = vec![0.0; n * 4 * 16];
                let tokens = &projections[call.start * tw..call.end * tw];
                let cache = (&mut keys[..], &mut values[..], capacity);
                run(isa, &heads, tokens, &rows, n, cache, &mut part);
                out.extend(part);
            }
            out
        };
        for isa in Isa::available() {
            let whole = run(isa, std::slice::from_ref(&(0..sequence)));
            let pieces = run(isa, &[0..3, 3..4, 4..20, 20..21, 21..38, 38..39, 39..40]);
            for (a, b) in whole.iter().zip(&pieces) {
                assert!((a - b).abs() < 1e-6, "{isa:?}: {a} vs {b}");
            }
        }
    }

    /// AVX-512's sixteen-key dots give each key's own dot, and its register sums of the
    /// weighted values the loop's sums, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_one_token_kernels_give_the_loops_bits() {
        if !Isa::available().contains(&Isa::Avx512) {
            return;
        }
        let data = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7919 + seed) % 97) as f32 * 0.013 - 0.6)
                .collect()
        };
        let width = 48;
        let (q, keys) = (data(width, 3), data(16 * width, 5));
        // Sound: AVX-512 is available; 16 keys as wide as `q`, a multiple of 16.
        let dots = unsafe { avx512::dots(&q, &keys) };
        for (j, dot) in dots.iter().enumerate() {
            // Sound: as above.
            let want = unsafe { avx512_dot(&q, &keys[j * width..(j + 1) * width]) };
            assert_eq!(dot.to_bits(), want.to_bits(), "key {j}: {dot} vs {want}");
        }
        // Passes of 4 slices of 2 heads, 2 of 4, 1 of 1, and a head count with no fixed pass.
        for (group, width) in [(2, 64), (4, 32), (1, 16), (3, 48)] {
            let seen = 21;
            let (scores, values) = (data(group * seen, 11), data(seen * width, 13));
            let mut sums = vec![f32::NAN; group * width];
            // Sound: AVX-512 is available; the shapes are as `weigh` needs.
            unsafe { avx512::weigh(&scores, &values, group, width, &mut sums) };
            for t in 0..group {
                for d in 0..width {
                    let mut want = 0.0f32;
                    for j in 0..seen {
                        want += scores[t * seen + j] * values[j * width + d];
                    }
                    let got = sums[t * width + d];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{group} heads of {width}: {t}, {d}"
                    );
                }
            }
        }
    }
}
