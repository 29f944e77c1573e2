//! The exported C functions, called through the rlib with ranks as threads
//! (and, in `processes`, as child processes of the test binary).

#![allow(unsafe_code)]

mod collectives;
mod common;
mod errors;
mod faults;
mod lifecycle;
mod p2p;
mod processes;
mod shrink;
mod streams;
