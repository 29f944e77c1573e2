//! `ncclGroupStart`/`ncclGroupEnd`: a per-thread, nestable collection of
//! calls that is put on a stream as one unit at the outermost end, so its
//! sends all go out before any of its receives wait (a ring of send/recv
//! pairs, or several comms driven from one thread, cannot deadlock).
//! Blocking inits inside a group are finished at its end, as in NCCL.

use crate::codes::{INVALID_USAGE, NcclResult, SUCCESS};
use crate::comm::Comm;
use crate::lasterror;
use crate::ops::{Op, Unit};
use crate::stream::Stream;
use std::cell::RefCell;
use std::sync::Arc;

#[derive(Default)]
struct Group {
    depth: u32,
    ops: Vec<Op>,
    stream: Option<Arc<Stream>>,
    inits: Vec<Arc<Comm>>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

pub(crate) fn start() -> NcclResult {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    SUCCESS
}

/// Whether the calling thread is inside a group.
pub(crate) fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Collects `op` if a group is open, else puts it on `stream` now.
pub(crate) fn submit(op: Op, stream: Arc<Stream>) -> NcclResult {
    let op = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Some(op);
        }
        g.stream.get_or_insert(stream.clone());
        g.ops.push(op);
        None
    });
    match op {
        Some(op) => enqueue(vec![op], &stream),
        None => SUCCESS,
    }
}

/// A blocking comm whose init was called inside the group.
pub(crate) fn defer_init(comm: Arc<Comm>) {
    GROUP.with(|g| g.borrow_mut().inits.push(comm));
}

pub(crate) fn end() -> NcclResult {
    let finished = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(());
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        let ops = std::mem::take(&mut g.ops);
        let inits = std::mem::take(&mut g.inits);
        Ok(Some((ops, g.stream.take(), inits)))
    });
    let (ops, stream, inits) = match finished {
        Err(()) => {
            lasterror::set("stand-in NCCL: ncclGroupEnd without ncclGroupStart");
            return INVALID_USAGE;
        }
        Ok(None) => return SUCCESS,
        Ok(Some(group)) => group,
    };
    let mut result = SUCCESS;
    for comm in inits {
        let code = comm.wait_setup();
        if result == SUCCESS {
            result = code;
        }
    }
    if let Some(stream) = stream {
        let code = enqueue(ops, &stream);
        if result == SUCCESS {
            result = code;
        }
    }
    result
}

fn enqueue(ops: Vec<Op>, stream: &Stream) -> NcclResult {
    let unit = Unit::new(ops);
    if stream.enqueue(Box::new(move || unit.run())) {
        SUCCESS
    } else {
        lasterror::set("stand-in NCCL: the stream is being destroyed");
        INVALID_USAGE
    }
}
