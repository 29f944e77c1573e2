//! NCCL through its C ABI, opened at run time (decision 0026): the numbers
//! ([`codes`]) and the library ([`library`]).

pub(crate) mod codes;
pub(crate) mod library;
