//! What a GPU op reads and writes: [`DeviceBuffer`], implemented for
//! cudarc's `CudaSlice` (feature `cuda`; candle's and burn's CUDA storage
//! are `CudaSlice`s), for [`HostBuffer`] (the stand-in NCCL's "device"
//! memory in tests) and, for anything else, [`RawDeviceSlice`].
//!
//! Ops take buffers by value and give them back when the op is done, as the
//! CPU communicator does: the borrow checker then keeps the caller from
//! touching (or freeing) memory NCCL is still writing.
//!
//! `unsafe` here declares and implements [`DeviceBuffer`], whose contract
//! is what lets `enqueue` hand the addresses to NCCL.

#![allow(unsafe_code)]

use crate::nccl::codes::NcclDataType;
use crate::runtime::Memory;
use half::{bf16, f16};

mod sealed {
    #[allow(unnameable_types)]
    pub trait Sealed {}
}

/// An element type NCCL reduces: f32, f64, f16, bf16, i8, u8, i32, u32,
/// i64, u64.
pub trait DeviceElement: sealed::Sealed + Copy + Send + Sync + 'static {
    /// NCCL's code for the type.
    #[doc(hidden)]
    const NCCL: NcclDataType;
    /// The type's name, for errors.
    const NAME: &'static str;
}

macro_rules! element {
    ($($t:ty => $code:ident, $name:literal;)*) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceElement for $t {
            const NCCL: NcclDataType = NcclDataType::$code;
            const NAME: &'static str = $name;
        }
    )*};
}

element! {
    f32 => FLOAT32, "f32";
    f64 => FLOAT64, "f64";
    f16 => FLOAT16, "f16";
    bf16 => BFLOAT16, "bf16";
    i8 => INT8, "i8";
    u8 => UINT8, "u8";
    i32 => INT32, "i32";
    u32 => UINT32, "u32";
    i64 => INT64, "i64";
    u64 => UINT64, "u64";
}

/// Memory a GPU op may read and write.
///
/// # Safety
/// `device_ptr()` must address `len()` elements of `Elem` in the memory
/// `memory()` names, allocated for as long as the value lives and not
/// moved when the value moves; and the value must not free or reuse that
/// memory before work already queued on `stream()` (when it names one) has
/// run, since ops order themselves after that stream.
pub unsafe trait DeviceBuffer: Send + 'static {
    /// The element type.
    type Elem: DeviceElement;
    /// Elements in the buffer.
    fn len(&self) -> usize;
    /// Whether it holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The address of the first element.
    fn device_ptr(&self) -> u64;
    /// Where the memory is.
    fn memory(&self) -> Memory;
    /// The stream whose work produced the buffer's contents: ops wait for
    /// it (by an event, without blocking the host). `None`: the
    /// communicator's compute stream.
    fn stream(&self) -> Option<crate::Stream> {
        None
    }
}

/// Host memory standing in for device memory, for the stand-in NCCL.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBuffer<T>(Vec<T>);

impl<T: DeviceElement> HostBuffer<T> {
    /// A buffer holding `data`.
    pub fn new(data: Vec<T>) -> HostBuffer<T> {
        HostBuffer(data)
    }

    /// The contents.
    pub fn into_vec(self) -> Vec<T> {
        self.0
    }
}

impl<T> std::ops::Deref for HostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> std::ops::DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

// SAFETY: a Vec's heap block does not move when the Vec moves, the
// HostBuffer never resizes it, and it is freed only when dropped.
unsafe impl<T: DeviceElement> DeviceBuffer for HostBuffer<T> {
    type Elem = T;
    fn len(&self) -> usize {
        self.0.len()
    }
    fn device_ptr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    fn memory(&self) -> Memory {
        Memory::Host
    }
}

/// Device memory known only by address (from another framework), with
/// the caller's promise about its life.
#[derive(Debug)]
pub struct RawDeviceSlice<T> {
    ptr: u64,
    len: usize,
    memory: Memory,
    _elem: std::marker::PhantomData<T>,
}

impl<T: DeviceElement> RawDeviceSlice<T> {
    /// # Safety
    /// `ptr` addresses `len` elements of `T` in `memory`, which stay
    /// allocated, and untouched by anything else, until the op that takes
    /// this slice has finished (its handle waited for, or the stream it
    /// was made to wait on has passed it).
    pub unsafe fn new(ptr: u64, len: usize, memory: Memory) -> RawDeviceSlice<T> {
        RawDeviceSlice {
            ptr,
            len,
            memory,
            _elem: std::marker::PhantomData,
        }
    }
}

// SAFETY: the constructor's contract is this trait's.
unsafe impl<T: DeviceElement> DeviceBuffer for RawDeviceSlice<T> {
    type Elem = T;
    fn len(&self) -> usize {
        self.len
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn memory(&self) -> Memory {
        self.memory
    }
}
