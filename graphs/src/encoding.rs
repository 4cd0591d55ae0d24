//! A model's bytes written to a file a chunk at a time (a full-size model encodes to
//! ~175 MB: `encode_to_vec` held all of it, 175 MB of fresh pages faulted in, only for a
//! `write` to copy it again into the page cache), and its large initializers moved to a
//! data file beside it (ONNX external data).

use crate::onnx::{ModelProto, StringStringEntryProto, EXTERNAL};
use bytes::buf::UninitSlice;
use bytes::BufMut;
use prost::Message;
use std::io::{self, Write};

/// Bytes gathered before each write.
const CHUNK: usize = 1 << 20;

/// Writes `model`'s encoding to `out`; returns its length.
pub fn write_model(model: &ModelProto, out: &mut impl Write) -> io::Result<usize> {
    let mut sink = ChunkSink {
        out,
        pending: Vec::with_capacity(CHUNK),
        written: 0,
        error: None,
    };
    model
        .encode(&mut sink)
        .map_err(|e| io::Error::other(e.to_string()))?;
    sink.drain();
    match sink.error {
        Some(e) => Err(e),
        None => Ok(sink.written),
    }
}

/// Where each external initializer starts in its data file: a multiple of the allocation
/// granularity (4 KiB on Linux and macOS, 64 KiB on Windows), which onnxruntime needs to
/// memory-map an initializer on the CPU instead of reading it into its own memory.
pub const EXTERNAL_ALIGNMENT: usize = 64 << 10;

/// The smallest initializer moved out (bytes): smaller ones stay in the graph, where the
/// alignment's padding would outweigh them.
pub const EXTERNAL_FROM: usize = EXTERNAL_ALIGNMENT;

/// The bytes of the initializers [`externalize`] moved out of a graph, each at its offset.
pub struct ExternalData {
    pieces: Vec<(usize, Vec<u8>)>,
}

/// Moves the bytes of `model`'s initializers of at least [`EXTERNAL_FROM`] bytes out of it,
/// each at the next multiple of [`EXTERNAL_ALIGNMENT`] of a data file named `location`
/// (relative to the graph's folder, as ONNX resolves it), and records where in its tensor.
pub fn externalize(model: &mut ModelProto, location: &str) -> ExternalData {
    let mut pieces: Vec<(usize, Vec<u8>)> = Vec::new();
    let initializers = model.graph.iter_mut().flat_map(|g| &mut g.initializer);
    for tensor in initializers.filter(|t| t.raw_data.len() >= EXTERNAL_FROM) {
        let end = pieces
            .last()
            .map_or(0, |(offset, bytes)| offset + bytes.len());
        let offset = end.next_multiple_of(EXTERNAL_ALIGNMENT);
        let bytes = std::mem::take(&mut tensor.raw_data);
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: key.into(),
            value,
        };
        tensor.external_data = vec![
            entry("location", location.into()),
            entry("offset", offset.to_string()),
            entry("length", bytes.len().to_string()),
        ];
        tensor.data_location = EXTERNAL;
        pieces.push((offset, bytes));
    }
    ExternalData { pieces }
}

impl ExternalData {
    /// Writes the data file: each initializer's bytes at its offset, zeros between.
    pub fn write(&self, out: &mut impl Write) -> io::Result<usize> {
        let zeros = [0u8; EXTERNAL_ALIGNMENT];
        let mut at = 0;
        for (offset, bytes) in &self.pieces {
            out.write_all(&zeros[..offset - at])?;
            out.write_all(bytes)?;
            at = offset + bytes.len();
        }
        Ok(at)
    }
}

/// Why the data file `location` of `data_len` bytes cannot hold what `model`'s initializers
/// say they keep there (onnxruntime finds that out deep in session creation, logging its
/// own error besides); initializers in other files are not checked.
pub fn check_external(model: &ModelProto, location: &str, data_len: u64) -> Result<(), String> {
    let initializers = model.graph.iter().flat_map(|g| &g.initializer);
    for tensor in initializers.filter(|t| t.data_location == EXTERNAL) {
        let field = |key: &str| tensor.external_data.iter().find(|e| e.key == key);
        if field("location").map(|e| e.value.as_str()) != Some(location) {
            continue;
        }
        let number = |key: &str| -> Result<u64, String> {
            let value = field(key).map_or("0", |e| e.value.as_str());
            value.parse().map_err(|_| {
                format!(
                    "initializer {}: its {key} {value:?} is not a number",
                    tensor.name
                )
            })
        };
        let (offset, length) = (number("offset")?, number("length")?);
        if offset.checked_add(length).is_none_or(|end| end > data_len) {
            return Err(format!(
                "holds {data_len} bytes; the graph's initializer {} needs {length} at offset {offset} (not the data file exported with this graph)",
                tensor.name
            ));
        }
    }
    Ok(())
}

/// A [`BufMut`] that writes through: prost's encoder cannot fail on a buffer, so the
/// first write error is kept (and later bytes dropped) for [`write_model`] to return.
struct ChunkSink<'a, W: Write> {
    out: &'a mut W,
    pending: Vec<u8>,
    written: usize,
    error: Option<io::Error>,
}

impl<W: Write> ChunkSink<'_, W> {
    fn drain(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.write(&pending);
        self.pending = pending;
        self.pending.clear();
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            match self.out.write_all(bytes) {
                Ok(()) => self.written += bytes.len(),
                Err(e) => self.error = Some(e),
            }
        }
    }
}

// Sound: `chunk_mut` hands out only the vector's spare capacity, and `advance_mut` marks
// as written no more than was handed out (`BufMut`'s contract on the caller).
unsafe impl<W: Write> BufMut for ChunkSink<'_, W> {
    fn remaining_mut(&self) -> usize {
        isize::MAX as usize - self.written - self.pending.len()
    }

    unsafe fn advance_mut(&mut self, count: usize) {
        let len = self.pending.len() + count;
        debug_assert!(len <= self.pending.capacity());
        // Sound: the caller initialized `count` bytes of the spare capacity it was given.
        unsafe { self.pending.set_len(len) };
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        if self.pending.len() == self.pending.capacity() {
            self.drain();
        }
        UninitSlice::uninit(self.pending.spare_capacity_mut())
    }

    /// A weight's bytes go to the writer as they are, not through the chunk.
    fn put_slice(&mut self, src: &[u8]) {
        if src.len() >= CHUNK {
            self.drain();
            self.write(src);
        } else {
            let room = self.pending.capacity() - self.pending.len();
            if src.len() > room {
                self.drain();
            }
            self.pending.extend_from_slice(src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::{GraphProto, TensorProto};

    fn model_with(raw: Vec<Vec<u8>>) -> ModelProto {
        ModelProto {
            ir_version: 10,
            producer_name: "test".into(),
            graph: Some(GraphProto {
                name: "g".into(),
                initializer: raw
                    .into_iter()
                    .enumerate()
                    .map(|(i, raw_data)| TensorProto {
                        name: format!("w{i}"),
                        dims: vec![raw_data.len() as i64],
                        data_type: 2,
                        raw_data,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Small fields, a weight past a chunk and weights that straddle chunks: the same
    /// bytes as prost's own `encode_to_vec`.
    #[test]
    fn writes_what_encode_to_vec_gives() {
        let raw = vec![
            (0..=255u8).cycle().take(CHUNK + 17).collect(),
            vec![7u8; CHUNK - 3],
            vec![9u8; 5],
            vec![1u8; CHUNK / 2 + 1],
        ];
        let model = model_with(raw);
        let mut out = Vec::new();
        let len = write_model(&model, &mut out).unwrap();
        assert_eq!(out, model.encode_to_vec());
        assert_eq!(len, out.len());
    }

    /// Large initializers leave the graph for aligned places in the data file, small ones
    /// stay; each records where its bytes are.
    #[test]
    fn externalize_moves_large_initializers_to_aligned_offsets() {
        let (big, small, odd) = (
            vec![1u8; EXTERNAL_FROM],
            vec![2u8; EXTERNAL_FROM - 1],
            vec![3u8; EXTERNAL_FROM + 5],
        );
        let mut model = model_with(vec![big.clone(), small.clone(), odd.clone(), big.clone()]);
        let data = externalize(&mut model, "m.onnx.data");
        let mut file = Vec::new();
        let len = data.write(&mut file).unwrap();
        assert_eq!(len, file.len());
        let tensors = &model.graph.as_ref().unwrap().initializer;
        let at = |i: usize| -> Option<(usize, usize)> {
            let t = &tensors[i];
            let value = |key: &str| {
                let e = t.external_data.iter().find(|e| e.key == key)?;
                Some(e.value.clone())
            };
            if t.data_location != EXTERNAL {
                return None;
            }
            assert_eq!(value("location").as_deref(), Some("m.onnx.data"));
            assert!(t.raw_data.is_empty());
            Some((
                value("offset")?.parse().ok()?,
                value("length")?.parse().ok()?,
            ))
        };
        assert_eq!(at(0), Some((0, big.len())));
        assert_eq!((at(1), &tensors[1].raw_data), (None, &small));
        assert_eq!(at(2), Some((EXTERNAL_ALIGNMENT, odd.len())));
        assert_eq!(at(3), Some((3 * EXTERNAL_ALIGNMENT, big.len())));
        for (i, want) in [(0, &big), (2, &odd), (3, &big)] {
            let (offset, length) = at(i).unwrap();
            assert_eq!(&file[offset..offset + length], &want[..], "tensor {i}");
        }
        assert!(file[big.len()..EXTERNAL_ALIGNMENT].iter().all(|&b| b == 0));
    }

    /// A data file shorter than what an initializer names, or an offset that is not a
    /// number, is refused; one that holds everything passes.
    #[test]
    fn check_external_refuses_a_data_file_too_short() {
        let mut model = model_with(vec![vec![1u8; EXTERNAL_FROM]; 2]);
        let data = externalize(&mut model, "m.onnx.data");
        let mut file = Vec::new();
        let len = data.write(&mut file).unwrap() as u64;
        assert_eq!(check_external(&model, "m.onnx.data", len), Ok(()));
        let err = check_external(&model, "m.onnx.data", len - 1).unwrap_err();
        assert!(
            err.contains("w1") && err.contains(&format!("{}", len - 1)),
            "{err}"
        );
        assert_eq!(check_external(&model, "other.data", 0), Ok(()));
        let tensor = &mut model.graph.as_mut().unwrap().initializer[0];
        tensor.external_data[1].value = "x".into();
        assert!(check_external(&model, "m.onnx.data", len)
            .unwrap_err()
            .contains("offset"));
    }

    /// A writer that fails: the error comes back, after what fitted was written.
    #[test]
    fn returns_the_first_write_error() {
        let model = model_with(vec![vec![3u8; 3 * CHUNK]]);
        let mut room = [0u8; 100];
        let mut out: &mut [u8] = &mut room;
        let err = write_model(&model, &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WriteZero);
    }
}
