//! Ranks in separate processes: the test binary runs itself as ranks 1
//! and 2 (the `child_rank` test, which does nothing unless told to), with
//! the real environment variables.

use crate::collectives::{input, reference};
use crate::common::*;
use ringwire_nccl_standin::abi::*;
use ringwire_nccl_standin::codes::{DataType, RedOp, SUCCESS};
use std::process::{Command, Stdio};

const CHILD: &str = "STANDIN_TEST_CHILD";
const N: usize = 3;

/// What every rank does: an all-reduce and an all-gather, checked.
fn rank_work(r: &Rank) {
    let dt = DataType::Int64;
    let inputs: Vec<Vec<u8>> = (0..N).map(|q| input(dt, q, 100)).collect();
    let mut mem = inputs[r.rank].clone();
    assert_eq!(r.all_reduce(&mut mem, 0, 0, 100, dt, RedOp::Sum), SUCCESS);
    assert_eq!(mem, reference(dt, RedOp::Sum, &inputs));
    let mut mem = inputs[r.rank].clone();
    mem.resize(800 * (N + 1), 0);
    assert_eq!(r.all_gather(&mut mem, 0, 800, 100, dt), SUCCESS);
    assert_eq!(mem[800..], inputs.concat()[..]);
}

#[test]
fn child_rank() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (rank, hex) = spec.split_once(',').unwrap();
    let mut id = NcclUniqueId { internal: [0; 128] };
    for (i, byte) in id.internal.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap() as std::ffi::c_char;
    }
    let mut version = 0;
    // SAFETY: a writable int.
    assert_eq!(unsafe { ncclGetVersion(&mut version) }, SUCCESS);
    assert_eq!(version, 21200, "RINGWIRE_STANDIN_NCCL_VERSION is read");
    let r = Rank::init(id, N, rank.parse().unwrap());
    rank_work(&r);
    r.destroy();
}

#[test]
fn ranks_in_separate_processes() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let id = unique_id();
    let hex: String = id
        .internal
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect();
    let children: Vec<_> = (1..N)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "processes::child_rank",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, format!("{rank},{hex}"))
                .env("RINGWIRE_STANDIN_NCCL_VERSION", "2.12.0")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let r = Rank::init(id, N, 0);
    rank_work(&r);
    r.destroy();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }
}
