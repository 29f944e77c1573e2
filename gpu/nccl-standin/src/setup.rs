//! A rank's comm setup, run on the caller's thread (blocking init) or a
//! thread of its own (non-blocking): register with the root, then build
//! the mesh. Every wait checks the comm's abort flag.

use crate::codes::{NcclResult, SYSTEM_ERROR};
use crate::comm::Comm;
use crate::mesh::{self, Mesh};
use crate::rendezvous::{self, BootstrapId};
use std::net::{Ipv4Addr, TcpListener};

/// Sets the comm up and records the outcome on it.
pub(crate) fn run(comm: &Comm, id: BootstrapId) {
    comm.finish_setup(establish(comm, id));
}

fn establish(comm: &Comm, id: BootstrapId) -> Result<Mesh, (NcclResult, String)> {
    let stop = || comm.is_aborted();
    if comm.faults.init_stall {
        comm.wait_aborted();
        return Err((SYSTEM_ERROR, "stand-in NCCL: injected init stall".into()));
    }
    let system = |e: std::io::Error| {
        let text = format!("stand-in NCCL: cannot open a data listener on 127.0.0.1: {e}");
        (SYSTEM_ERROR, text)
    };
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(system)?;
    let port = listener.local_addr().map_err(system)?.port();
    let ports = rendezvous::register(id, comm.nranks, comm.rank, port, &stop)?;
    let shared = std::sync::Arc::clone(&comm.shared);
    let deliver: mesh::Deliver =
        std::sync::Arc::new(move |peer, tag, payload| shared.deliver(peer, tag, payload));
    mesh::build(&listener, &ports, comm.rank, id.nonce, &deliver, &stop)
        .map_err(|text| (SYSTEM_ERROR, text))
}
