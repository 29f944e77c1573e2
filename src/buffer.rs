//! Buffers collectives take by value and hand back.
//!
//! Ownership moves into the collective and comes back with the result (the
//! io_uring ownership model): while the op runs nothing else can touch the
//! memory, and a dropped `PendingCollective` cannot leave the transport
//! writing into freed memory, because the executor owns the buffer until the
//! op ends.

use crate::Element;

/// Anything a collective can own for the duration of an op: [`Buffer`],
/// `Vec<T>`, `Box<[T]>`, and `bytes::BytesMut` (as `u8` elements).
pub trait CollectiveBuffer<T: Element>: Send + 'static {
    /// The elements.
    fn as_slice(&self) -> &[T];
    /// The elements, to write.
    fn as_mut_slice(&mut self) -> &mut [T];
}

impl<T: Element> CollectiveBuffer<T> for Vec<T> {
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Element> CollectiveBuffer<T> for Box<[T]> {
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

impl CollectiveBuffer<u8> for bytes::BytesMut {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

/// Memory allocated by a communicator for collectives ([`crate::Communicator::alloc`]).
///
/// Ordinary heap memory, zeroed: an owned buffer like `Vec<T>`, which works
/// as well. (The engine's registered memory is its own staging buffers; the
/// caller's memory is not registered.)
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer<T: Element> {
    data: Vec<T>,
}

impl<T: Element> Buffer<T> {
    pub(crate) fn zeroed(len: usize) -> Buffer<T> {
        Buffer {
            data: vec![T::default(); len],
        }
    }

    /// Copies `values` into a new buffer.
    pub fn from_slice(values: &[T]) -> Buffer<T> {
        Buffer {
            data: values.to_vec(),
        }
    }

    /// The elements as a vector.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }
}

impl<T: Element> From<Vec<T>> for Buffer<T> {
    fn from(data: Vec<T>) -> Buffer<T> {
        Buffer { data }
    }
}

impl<T: Element> std::ops::Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T: Element> std::ops::DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
}

impl<T: Element> CollectiveBuffer<T> for Buffer<T> {
    fn as_slice(&self) -> &[T] {
        &self.data
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }
}
