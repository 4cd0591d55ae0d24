//! Bounds-checked little-endian reads that report what was being read and where.

use super::CactError;

/// A cursor over `bytes`, which start at file offset `base`.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], base: u64) -> Self {
        Reader {
            bytes,
            pos: 0,
            base,
        }
    }

    /// File offset of the next byte.
    pub(crate) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes, or `Truncated` naming `what`.
    pub(crate) fn take(
        &mut self,
        n: usize,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], CactError> {
        if n > self.remaining() {
            return Err(CactError::Truncated {
                what: what(),
                offset: self.offset(),
                needed: n as u64,
                available: self.remaining() as u64,
            });
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], CactError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, CactError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16, CactError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, CactError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn f32(&mut self, what: impl FnOnce() -> String) -> Result<f32, CactError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
}

/// The whole file at `path`.
pub(crate) fn read_file(path: &std::path::Path) -> Result<Vec<u8>, CactError> {
    std::fs::read(path).map_err(|e| CactError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}
