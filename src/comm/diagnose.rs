//! What a failure is told with, kept out of the ops themselves: the debug
//! signature check (RINGWIRE_DEBUG=detail), who had not reached an op that
//! timed out (through the store), and the flight record's dump.

use super::context::{Ctx, Executor, OpPlan, debug_comm_id};
use crate::ReduceOp;
use crate::algo;
use crate::error::Error;
use crate::exec::{self, OpSignature};
use crate::wire::OpKind;
use std::time::{Duration, Instant};

/// RINGWIRE_DEBUG=detail: before each collective, the ranks all-gather the
/// op's signature and compare, so a mismatch is named precisely (kind, type,
/// count, reduce op, root) before any data moves.
pub(super) fn check_signature(cx: &mut Ctx<'_>, plan: &OpPlan) -> Result<(), Error> {
    let ex = cx.ex;
    let (rank, size) = (ex.rank, ex.size);
    let count = if plan.uniform_count {
        plan.count as i64
    } else {
        -1
    };
    let reduce = plan.reduce_op.map_or(0, |r| r as i64);
    let mine = [
        plan.kind as i64,
        plan.dtype as i64,
        count,
        reduce,
        i64::from(plan.root),
        cx.sig.seq as i64,
    ];
    let mut all = vec![0i64; mine.len() * size];
    all[rank * mine.len()..(rank + 1) * mine.len()].copy_from_slice(&mine);
    let sig = OpSignature {
        comm_id: debug_comm_id(ex.comm_id),
        seq: cx.sig.seq,
        op: plan.kind,
        dtype: crate::DType::I64,
        reduce_op: None,
        root: 0,
        count: Some(mine.len() as u64),
        send_seq: None,
        send_count: None,
    };
    // Its frames go on a communicator of their own: begun like any op's, or
    // they would count as run ahead for ever (decision 0019).
    ex.world.transport.begin(sig.comm_id, sig.seq, None);
    let steps = algo::schedule(|o| algo::all_gather_ring(o, rank, size, mine.len(), mine.len()));
    exec::run(
        &*ex.world.transport,
        &ex.members,
        &sig,
        &cx.op,
        &steps,
        &[],
        &mut all,
        cx.started,
        cx.timeout,
        &mut cx.traffic,
    )?;
    let describe = |s: &[i64]| {
        let kind = OpKind::from_u8(s[0] as u8).map_or("?", OpKind::name);
        let dtype = crate::DType::from_u8(s[1] as u8).map_or("?", crate::DType::name);
        let mut d = format!("{kind}({dtype}, ");
        d += &if s[2] < 0 {
            "uneven counts".to_string()
        } else {
            s[2].to_string()
        };
        if let Some(r) = ReduceOp::from_u8(s[3] as u8) {
            d += &format!(", {r}");
        }
        if matches!(
            OpKind::from_u8(s[0] as u8),
            Some(OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter)
        ) {
            d += &format!(", root {}", s[4]);
        }
        d + &format!(") as op #{}", s[5])
    };
    for r in 0..size {
        let theirs = &all[r * mine.len()..(r + 1) * mine.len()];
        if theirs != mine {
            return Err(Error::Mismatch {
                ctx: cx.op.clone(),
                peer: r,
                detail: format!(
                    "rank {rank} called {} but rank {r} called {}",
                    describe(&mine),
                    describe(theirs)
                ),
            });
        }
    }
    Ok(())
}

/// After a timeout: which ranks reached op `seq`? Each rank that times out
/// posts how far it got to the store; ranks that post nothing within a
/// moment are hung, stopped or dead (like torch's monitored_barrier).
pub(super) fn who_is_missing(ex: &Executor, seq: u64) -> String {
    let Some((store, prefix)) = &ex.world.store else {
        return String::new();
    };
    let key = |r: usize| progress_key(prefix, ex.comm_id, r);
    if !report_progress(ex, seq) {
        return String::new();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut behind: Vec<String>;
    loop {
        behind = Vec::new();
        for r in (0..ex.size).filter(|&r| r != ex.rank) {
            match store.try_get(&key(r)) {
                Ok(Some(v)) => {
                    let theirs: u64 = String::from_utf8_lossy(&v).parse().unwrap_or(0);
                    if theirs < seq {
                        behind.push(format!("rank {r} (at op #{theirs})"));
                    }
                }
                Ok(None) => behind.push(format!("rank {r} (no report: hung, stopped or dead?)")),
                Err(_) => return String::new(),
            }
        }
        if behind.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if behind.is_empty() {
        "; every rank reached this op".into()
    } else {
        format!(
            "; ranks that had not reached op #{seq}: {}",
            behind.join(", ")
        )
    }
}

pub(super) fn progress_key(prefix: &str, comm_id: u64, rank: usize) -> String {
    format!("{prefix}progress/{comm_id:016x}/{rank}")
}

/// Posts to the store that this rank reached op `seq` (and failed in it).
pub(super) fn report_progress(ex: &Executor, seq: u64) -> bool {
    let Some((store, prefix)) = &ex.world.store else {
        return false;
    };
    store
        .set(
            &progress_key(prefix, ex.comm_id, ex.rank),
            seq.to_string().as_bytes(),
        )
        .is_ok()
}

/// Logs the flight record (and writes it to RINGWIRE_FLIGHT_RECORDER_DIR
/// when set) after a failure.
pub(super) fn dump_flight_record(ex: &Executor) {
    let dump = ex.recorder.dump(ex.rank, ex.size);
    tracing::error!("{dump}");
    if let Some(dir) = &ex.tunables.flight_recorder_dir {
        let path = dir.join(format!("ringwire-{:016x}-rank{}.txt", ex.comm_id, ex.rank));
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &dump)) {
            tracing::warn!(path = %path.display(), error = %e, "could not write the flight record");
        }
    }
}
