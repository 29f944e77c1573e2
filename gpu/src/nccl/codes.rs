//! NCCL's numbers as plain integers: result codes, data types, reduce ops
//! and the version code, with their names.
//!
//! They are newtypes over `c_int`, not Rust enums, because the library may
//! be newer than this crate: NCCL 2.30 added `ncclTimeout = 8`, and a code
//! we do not know must read as "code 11", never as undefined behaviour or
//! as success (cudarc's enum maps an unknown code to `Ok`).

use std::ffi::c_int;
use std::fmt;

/// An `ncclResult_t`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct NcclResult(pub c_int);

impl NcclResult {
    /// `ncclSuccess`.
    pub const SUCCESS: NcclResult = NcclResult(0);
    /// `ncclUnhandledCudaError`.
    pub const UNHANDLED_CUDA_ERROR: NcclResult = NcclResult(1);
    /// `ncclSystemError`.
    pub const SYSTEM_ERROR: NcclResult = NcclResult(2);
    /// `ncclInternalError`.
    pub const INTERNAL_ERROR: NcclResult = NcclResult(3);
    /// `ncclInvalidArgument`.
    pub const INVALID_ARGUMENT: NcclResult = NcclResult(4);
    /// `ncclInvalidUsage`.
    pub const INVALID_USAGE: NcclResult = NcclResult(5);
    /// `ncclRemoteError`.
    pub const REMOTE_ERROR: NcclResult = NcclResult(6);
    /// `ncclInProgress`: a non-blocking call has not finished.
    pub const IN_PROGRESS: NcclResult = NcclResult(7);
    /// Since NCCL 2.30.
    pub const TIMEOUT: NcclResult = NcclResult(8);

    /// nccl.h's name for the code, or "ncclResult(N)" for one newer than
    /// this crate.
    pub fn name(self) -> String {
        match self.0 {
            0 => "ncclSuccess".into(),
            1 => "ncclUnhandledCudaError".into(),
            2 => "ncclSystemError".into(),
            3 => "ncclInternalError".into(),
            4 => "ncclInvalidArgument".into(),
            5 => "ncclInvalidUsage".into(),
            6 => "ncclRemoteError".into(),
            7 => "ncclInProgress".into(),
            8 => "ncclTimeout".into(),
            n => format!("ncclResult({n})"),
        }
    }

    /// Whether the communicator is unusable after this code (NCCL's
    /// fault-tolerance guide: CUDA, system, internal, remote errors and
    /// timeouts call for an abort; invalid argument or usage means the
    /// call had no effect). Unknown codes count as fatal.
    pub fn is_fatal(self) -> bool {
        !matches!(self.0, 0 | 4 | 5 | 7)
    }
}

impl fmt::Debug for NcclResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl fmt::Display for NcclResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An `ncclDataType_t`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(transparent)]
// Named only through the sealed DeviceElement.
#[allow(unnameable_types)]
pub struct NcclDataType(pub c_int);

impl NcclDataType {
    pub const INT8: NcclDataType = NcclDataType(0);
    pub const UINT8: NcclDataType = NcclDataType(1);
    pub const INT32: NcclDataType = NcclDataType(2);
    pub const UINT32: NcclDataType = NcclDataType(3);
    pub const INT64: NcclDataType = NcclDataType(4);
    pub const UINT64: NcclDataType = NcclDataType(5);
    pub const FLOAT16: NcclDataType = NcclDataType(6);
    pub const FLOAT32: NcclDataType = NcclDataType(7);
    pub const FLOAT64: NcclDataType = NcclDataType(8);
    pub const BFLOAT16: NcclDataType = NcclDataType(9);
}

/// An `ncclRedOp_t` (the built-in ones; 2.x codes them 0 to 4).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub(crate) struct NcclRedOp(pub c_int);

impl NcclRedOp {
    pub(crate) const SUM: NcclRedOp = NcclRedOp(0);
    pub(crate) const PROD: NcclRedOp = NcclRedOp(1);
    pub(crate) const MAX: NcclRedOp = NcclRedOp(2);
    pub(crate) const MIN: NcclRedOp = NcclRedOp(3);
    pub(crate) const AVG: NcclRedOp = NcclRedOp(4);

    /// ringwire's operator in NCCL's numbering.
    pub(crate) fn from_reduce_op(op: ringwire::ReduceOp) -> NcclRedOp {
        match op {
            ringwire::ReduceOp::Sum => NcclRedOp::SUM,
            ringwire::ReduceOp::Prod => NcclRedOp::PROD,
            ringwire::ReduceOp::Max => NcclRedOp::MAX,
            ringwire::ReduceOp::Min => NcclRedOp::MIN,
            ringwire::ReduceOp::Avg => NcclRedOp::AVG,
        }
    }
}

/// A version of NCCL, decoded from `ncclGetVersion`'s code.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct NcclVersion {
    /// Major version (2).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl NcclVersion {
    /// The oldest NCCL ringwire runs on: 2.14 brought `ncclConfig_t` and
    /// non-blocking communicators, which abort needs.
    pub const MINIMUM: NcclVersion = NcclVersion::new(2, 14, 3);

    /// The first NCCL with `ncclCommShrink`, which
    /// [`GpuCommunicator::shrink`](crate::GpuCommunicator::shrink) uses
    /// where the library has it.
    pub const SHRINK: NcclVersion = NcclVersion::new(2, 27, 3);

    /// The version `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> NcclVersion {
        NcclVersion {
            major,
            minor,
            patch,
        }
    }

    /// nccl.h's `NCCL_VERSION(X,Y,Z)`: `X*1000+Y*100+Z` up to 2.8, then
    /// `X*10000+Y*100+Z`.
    pub fn from_code(code: c_int) -> NcclVersion {
        let code = code.max(0) as u32;
        if code >= 10_000 {
            NcclVersion::new(code / 10_000, code / 100 % 100, code % 100)
        } else {
            NcclVersion::new(code / 1000, code / 100 % 10, code % 100)
        }
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_both_encodings() {
        assert_eq!(NcclVersion::from_code(23007), NcclVersion::new(2, 30, 7));
        assert_eq!(NcclVersion::from_code(21403), NcclVersion::new(2, 14, 3));
        assert_eq!(NcclVersion::from_code(2804), NcclVersion::new(2, 8, 4));
        assert_eq!(NcclVersion::from_code(2708), NcclVersion::new(2, 7, 8));
        assert!(NcclVersion::new(2, 12, 0) < NcclVersion::MINIMUM);
        assert!(NcclVersion::new(2, 30, 7) > NcclVersion::MINIMUM);
    }

    #[test]
    fn unknown_codes_are_named_by_number_and_count_as_fatal() {
        assert_eq!(NcclResult(8).name(), "ncclTimeout");
        assert_eq!(NcclResult(11).name(), "ncclResult(11)");
        assert!(NcclResult(11).is_fatal());
        assert!(NcclResult::REMOTE_ERROR.is_fatal());
        assert!(!NcclResult::INVALID_USAGE.is_fatal());
        assert!(!NcclResult::IN_PROGRESS.is_fatal());
    }
}
