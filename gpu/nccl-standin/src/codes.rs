//! nccl.h's numbers: result codes and their strings, data types, reduction
//! operators and the version code. The consumer compiles against the real
//! header's values, so these must match it exactly.

use std::ffi::{CStr, c_int};

/// `ncclResult_t`.
pub type NcclResult = c_int;

/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const IN_PROGRESS: NcclResult = 7;
/// `ncclTimeout (NCCL 2.30)`.
pub const TIMEOUT: NcclResult = 8;

/// `cudaSuccess`: what the host stream API returns when a call worked.
pub const CUDA_SUCCESS: c_int = 0;
/// `cudaErrorInvalidValue`: a handle or argument the host stream API refuses.
pub const CUDA_ERROR_INVALID_VALUE: c_int = 1;
/// `cudaErrorNotReady`: work queued on a host stream has not finished.
pub const CUDA_ERROR_NOT_READY: c_int = 600;

/// `ncclGetErrorString`, word for word as NCCL 2.30 says it.
pub fn error_string(code: NcclResult) -> &'static CStr {
    match code {
        SUCCESS => c"no error",
        UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        IN_PROGRESS => c"NCCL operation in progress",
        TIMEOUT => c"timeout",
        _ => c"unknown result code",
    }
}

/// `ncclDataType_t` values this stand-in supports (fp8, 10 and 11, is not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// `ncclInt8`.
    Int8 = 0,
    /// `ncclUint8`.
    Uint8 = 1,
    /// `ncclInt32`.
    Int32 = 2,
    /// `ncclUint32`.
    Uint32 = 3,
    /// `ncclInt64`.
    Int64 = 4,
    /// `ncclUint64`.
    Uint64 = 5,
    /// `ncclFloat16`.
    Float16 = 6,
    /// `ncclFloat32`.
    Float32 = 7,
    /// `ncclFloat64`.
    Float64 = 8,
    /// `ncclBfloat16`.
    Bfloat16 = 9,
}

impl DataType {
    /// Every supported type, in nccl.h's order.
    pub const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
    ];

    /// The type for nccl.h's value, if supported.
    pub fn from_raw(raw: c_int) -> Option<DataType> {
        usize::try_from(raw)
            .ok()
            .and_then(|i| DataType::ALL.get(i).copied())
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }
}

/// `ncclRedOp_t`'s built-in operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    /// `ncclSum`.
    Sum = 0,
    /// `ncclProd`.
    Prod = 1,
    /// `ncclMax`.
    Max = 2,
    /// `ncclMin`.
    Min = 3,
    /// `ncclAvg`.
    Avg = 4,
}

impl RedOp {
    /// Every built-in operator, in nccl.h's order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The operator for nccl.h's value, if built in.
    pub fn from_raw(raw: c_int) -> Option<RedOp> {
        usize::try_from(raw)
            .ok()
            .and_then(|i| RedOp::ALL.get(i).copied())
    }
}

/// The version reported when `RINGWIRE_STANDIN_NCCL_VERSION` is not set.
pub const DEFAULT_VERSION: (u32, u32, u32) = (2, 30, 7);

/// `NCCL_VERSION(x, y, z)`: the code `ncclGetVersion` reports. Releases up
/// to 2.8 used the older `x*1000 + y*100 + z`.
pub fn version_code((x, y, z): (u32, u32, u32)) -> c_int {
    let code = if x <= 2 && y <= 8 {
        x * 1000 + y * 100 + z
    } else {
        x * 10000 + y * 100 + z
    };
    c_int::try_from(code).unwrap_or(c_int::MAX)
}

/// "X.Y.Z" as three numbers; `None` for anything else.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_follow_nccl_h() {
        assert_eq!(version_code((2, 30, 7)), 23007);
        assert_eq!(version_code((2, 12, 0)), 21200);
        assert_eq!(version_code((2, 8, 4)), 2804);
        assert_eq!(parse_version("2.12.0"), Some((2, 12, 0)));
        assert_eq!(parse_version(" 2.30.7 "), Some((2, 30, 7)));
        assert_eq!(parse_version("2.12"), None);
        assert_eq!(parse_version("2.12.0.1"), None);
        assert_eq!(parse_version("two"), None);
    }

    #[test]
    fn raw_values_map_to_nccl_h() {
        assert_eq!(DataType::from_raw(9), Some(DataType::Bfloat16));
        assert_eq!(DataType::from_raw(10), None);
        assert_eq!(DataType::from_raw(-1), None);
        assert_eq!(RedOp::from_raw(4), Some(RedOp::Avg));
        assert_eq!(RedOp::from_raw(5), None);
        for (i, d) in DataType::ALL.iter().enumerate() {
            assert_eq!(*d as usize, i);
        }
    }
}
