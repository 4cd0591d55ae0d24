//! A model's bytes written to a file a chunk at a time. A full-size model encodes to
//! ~175 MB: `encode_to_vec` held all of it (175 MB of fresh pages faulted in) only for a
//! `write` to copy it again into the page cache.

use crate::onnx::ModelProto;
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
