//! Payload storage shared by both transports: 8-byte-aligned, so a received
//! payload can be viewed as a slice of any element type without copying,
//! and reusable, so steady-state receives allocate nothing.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A received payload in 8-byte-aligned storage.
#[derive(Default)]
pub struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    /// An empty buffer.
    pub fn new() -> AlignedBuf {
        AlignedBuf::default()
    }

    /// Makes room for `len` bytes and returns them for filling.
    pub fn prepare(&mut self, len: usize) -> &mut [u8] {
        let words = len.div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        self.len = len;
        &mut self.words.as_mut_bytes()[..len]
    }

    /// The payload's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.words.as_bytes()[..self.len]
    }

    /// The payload's bytes, for filling in place after [`AlignedBuf::prepare`].
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.words.as_mut_bytes()[..len]
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of storage held (what pooling keeps alive).
    pub fn capacity(&self) -> usize {
        self.words.len() * 8
    }

    /// Views the payload as elements; `None` if the length is not a whole
    /// number of elements.
    pub fn as_slice<T: FromBytes + Immutable + KnownLayout>(&self) -> Option<&[T]> {
        <[T]>::ref_from_bytes(self.bytes()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::AlignedBuf;

    #[test]
    fn views_whole_elements_only() {
        let mut b = AlignedBuf::new();
        b.prepare(8)
            .copy_from_slice(&1.5f32.to_le_bytes().repeat(2));
        assert_eq!(b.as_slice::<f32>(), Some(&[1.5f32, 1.5][..]));
        b.prepare(6);
        assert!(b.as_slice::<f32>().is_none());
        assert_eq!(b.len(), 6);
        assert!(b.capacity() >= 8);
    }
}
