//! Structure-aware mutations, mixed half and half with libFuzzer's own byte
//! mutations. Byte flips rarely keep a tokenizer blob's records in step (one
//! changed length desynchronizes every later piece), so they almost never
//! reach the tokenizer builder with odd pieces; these parse the input, change
//! the pieces, header ids, directory records or header fields, and write it back.

use exporter::cact::layout::{
    record_element_offset, record_field_offset, FieldType, RecordField, RECORD_BYTES,
};
use exporter::cact::layout::HeaderLayout;
use exporter::cact::{file_generation, needle2, needle3};
use graphs::contract::Generation;
use exporter::cact::{Piece, PieceKind, TokenizerSpec};

const RECORD: usize = RECORD_BYTES as usize;

/// xorshift64*, seeded from libFuzzer's seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u32) -> Self {
        Rng(u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Bits of text that matter to the tokenizer: spaces and `▁` (which the
/// normalizers rewrite or drop), regex metacharacters (markers become regex
/// alternatives), multi-byte and odd Unicode, byte-piece spellings.
const ATOMS: &[&str] = &[
    "",
    " ",
    "  ",
    "\u{2581}",
    "\u{2581}\u{2581}",
    "a",
    "b",
    "ab",
    "<",
    ">",
    "|",
    "<|im_start|>",
    "<|im_end|>",
    "\\",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "?",
    "*",
    "+",
    ".",
    "^",
    "$",
    "#",
    "-",
    "\n",
    "\t",
    "\r",
    "\u{0}",
    "\u{f6}",
    "\u{65e5}",
    "\u{1F600}",
    "\u{301}",
    "\u{FEFF}",
    "\u{2047}",
    "\u{FFFD}",
    "<0x41>",
    "<0x0A>",
    "<0xC3>",
    "<unk>",
    "<s>",
    "</s>",
    "(?",
    "\\z",
    "\\A",
];

/// The blob bytes of `spec`, as upstream writes them.
pub fn tokenizer_blob(spec: &TokenizerSpec) -> Vec<u8> {
    let mut out = Vec::new();
    let n = spec.pieces.len() as u32;
    for v in [n, spec.pad_id, spec.eos_id, spec.bos_id, spec.unk_id] {
        out.extend(v.to_le_bytes());
    }
    out.extend([spec.add_dummy_prefix as u8, spec.byte_fallback as u8, 0, 0]);
    for p in &spec.pieces {
        let text = &p.text.as_bytes()[..p.text.len().min(u16::MAX as usize)];
        out.extend(p.score.to_le_bytes());
        out.push(match p.kind {
            PieceKind::Normal => 0,
            PieceKind::Unknown => 1,
            PieceKind::Control => 2,
            PieceKind::UserDefined => 3,
            PieceKind::Byte => 4,
        });
        out.extend((text.len() as u16).to_le_bytes());
        out.extend(text);
    }
    out
}

fn random_text(rng: &mut Rng) -> String {
    (0..1 + rng.below(3)).map(|_| *rng.pick(ATOMS)).collect()
}

fn random_kind(rng: &mut Rng) -> PieceKind {
    *rng.pick(&[
        PieceKind::Normal,
        PieceKind::Normal,
        PieceKind::Unknown,
        PieceKind::Control,
        PieceKind::UserDefined,
        PieceKind::UserDefined,
        PieceKind::Byte,
    ])
}

fn random_piece(rng: &mut Rng) -> Piece {
    let kind = random_kind(rng);
    let text = if kind == PieceKind::Byte {
        format!("<0x{:02X}>", rng.below(256))
    } else {
        random_text(rng)
    };
    Piece {
        text,
        score: -(rng.below(100) as f32),
        kind,
    }
}

/// One structural change to a parsed tokenizer.
pub fn mutate_spec(spec: &mut TokenizerSpec, rng: &mut Rng) {
    let n = spec.pieces.len();
    if n == 0 {
        spec.pieces.push(random_piece(rng));
        return;
    }
    let i = rng.below(n);
    let j = rng.below(n);
    let k = rng.below(n);
    match rng.below(12) {
        0 => {
            let kind = random_kind(rng);
            spec.pieces[i].kind = kind;
            if kind == PieceKind::Byte {
                spec.pieces[i].text = format!("<0x{:02X}>", rng.below(256));
            }
        }
        1 | 2 => spec.pieces[i].text = random_text(rng),
        3 => {
            let text = format!("{}{}", spec.pieces[j].text, spec.pieces[k].text);
            spec.pieces[i].text = text;
        }
        4 => spec.pieces[i].text = spec.pieces[j].text.clone(),
        5 => {
            let piece = random_piece(rng);
            spec.pieces.insert(i, piece);
        }
        6 => {
            spec.pieces.remove(i);
        }
        7 => {
            let id = rng.below(n + 2) as u32;
            match rng.below(4) {
                0 => spec.pad_id = id,
                1 => spec.eos_id = id,
                2 => spec.bos_id = id,
                _ => spec.unk_id = id,
            }
        }
        8 => match rng.below(2) {
            0 => spec.add_dummy_prefix = !spec.add_dummy_prefix,
            _ => spec.byte_fallback = !spec.byte_fallback,
        },
        9 => {
            spec.pieces[i].score = *rng.pick(&[
                0.0,
                -1.0,
                1e30,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::MIN_POSITIVE,
            ])
        }
        10 => {
            let text = &spec.pieces[i].text;
            let cuts: Vec<usize> = text.char_indices().map(|(c, _)| c).collect();
            if let Some(&cut) = cuts.get(rng.below(cuts.len())) {
                let (a, b) = text.split_at(cut);
                spec.pieces[i].text = if rng.below(2) == 0 { a } else { b }.to_string();
            }
        }
        _ => {
            let piece = spec.pieces.remove(i);
            spec.pieces.insert(j.min(n - 1), piece);
        }
    }
}

/// 1–3 structural changes to a tokenizer blob; `None` when it does not parse.
pub fn mutate_blob(blob: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
    let mut spec = TokenizerSpec::parse(blob).ok()?;
    for _ in 0..1 + rng.below(3) {
        mutate_spec(&mut spec, rng);
    }
    Some(tokenizer_blob(&spec))
}

fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// `(offset in the record, width)` of every element of every record field but the padding.
fn record_elements() -> Vec<(usize, usize)> {
    RecordField::ALL
        .into_iter()
        .filter(|&f| f != RecordField::Pad)
        .flat_map(|f| {
            let spec = f.spec();
            (0..spec.count).map(move |element| {
                let at = record_element_offset(f, element) as usize;
                (at, spec.ty.bytes() as usize)
            })
        })
        .collect()
}

/// The header layout of the generation the file's tag names (Needle 2's for any other).
fn header_layout(file: &[u8]) -> HeaderLayout {
    match file_generation(file) {
        Ok(Generation::Needle3) => needle3::layout::HEADER,
        _ => needle2::layout::HEADER,
    }
}

/// File offsets of the header's u32 words after the tag.
fn header_words(layout: &HeaderLayout) -> Vec<usize> {
    layout
        .fields
        .iter()
        .filter(|f| f.name != "tag" && f.ty == FieldType::U32)
        .flat_map(|f| (0..f.count).map(|element| layout.element_offset(f.name, element) as usize))
        .collect()
}

fn interesting(rng: &mut Rng, current: u64, file_len: usize) -> u64 {
    match rng.below(8) {
        0 => *rng.pick(&[0, 1, 2, 3, 4, 5, 7, 8, 16, 64, 128, 256, 1024, 2048]),
        1 => *rng.pick(&[
            u32::MAX as u64,
            u32::MAX as u64 - 1,
            1 << 31,
            u16::MAX as u64 + 1,
        ]),
        2 => *rng.pick(&[u64::MAX, u64::MAX - 63, 1 << 63, 1 << 32]),
        3 => file_len as u64 - rng.below(2) as u64,
        4 => current.wrapping_add(1),
        5 => current.wrapping_sub(1),
        6 => current.wrapping_mul(2),
        _ => current.wrapping_add(64),
    }
}

/// One structural change to a `.cact`: the tokenizer blob when it is the last
/// thing in the file (its record's `nbytes` follows), a directory record field,
/// or a header field, laid out as the file's generation lays them out. `None` when the
/// directory cannot be located.
pub fn mutate_cact(file: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
    let layout = header_layout(file);
    let n = get_u32(file, layout.offset("num_tensors") as usize)? as usize;
    let codebook_len = get_u32(file, layout.offset("codebook_len") as usize)?;
    let dir = layout.directory_start(codebook_len) as usize;
    let blob_offset = record_field_offset(RecordField::BlobOffset) as usize;
    let nbytes_at = record_field_offset(RecordField::NBytes) as usize;
    let mut out = file.to_vec();
    match rng.below(3) {
        0 => {
            let last = dir.checked_add(n.checked_sub(1)?.checked_mul(RECORD)?)?;
            let offset = get_u64(file, last + blob_offset)? as usize;
            let nbytes = get_u64(file, last + nbytes_at)? as usize;
            if offset.checked_add(nbytes)? != file.len() {
                return None;
            }
            let blob = mutate_blob(&file[offset..], rng)?;
            out.truncate(offset);
            out.extend(&blob);
            let len = (blob.len() as u64).to_le_bytes();
            out[last + nbytes_at..last + nbytes_at + len.len()].copy_from_slice(&len);
        }
        1 => {
            let record = dir.checked_add(rng.below(n).checked_mul(RECORD)?)?;
            let (at, width) = *rng.pick(&record_elements());
            let field = out.get_mut(record + at..record + at + width)?;
            let mut current = [0u8; 8];
            current[..width].copy_from_slice(field);
            let value = interesting(rng, u64::from_le_bytes(current), file.len());
            field.copy_from_slice(&value.to_le_bytes()[..width]);
        }
        _ => {
            let at = *rng.pick(&header_words(&layout));
            let value = interesting(rng, get_u32(file, at)? as u64, file.len()) as u32;
            out.get_mut(at..at + 4)?
                .copy_from_slice(&value.to_le_bytes());
        }
    }
    Some(out)
}

/// The custom mutator of both targets: half libFuzzer's byte mutations, half
/// `structural` (falling back to bytes when it declines or the result is too long).
pub fn mutate(
    data: &mut [u8],
    size: usize,
    max_size: usize,
    seed: u32,
    structural: fn(&[u8], &mut Rng) -> Option<Vec<u8>>,
) -> usize {
    let mut rng = Rng::new(seed);
    if rng.below(2) == 0 {
        if let Some(out) = structural(&data[..size], &mut rng) {
            if out.len() <= max_size {
                data[..out.len()].copy_from_slice(&out);
                return out.len();
            }
        }
    }
    libfuzzer_sys::fuzzer_mutate(data, size, max_size)
}
