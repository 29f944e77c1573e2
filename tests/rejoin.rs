//! A replacement takes a lost rank's place (issue 45, decision 0040): the
//! survivors shrink, a new process started with `Builder::rejoin` waits,
//! the survivors see it (`joiners_waiting`) and `admit` it, and the job
//! goes on at its old size, the newcomer at the lost rank's place. Ranks
//! are threads of this process over real links, with a standalone store
//! (a job whose ranks rejoin needs one that outlives them).

mod common;

use common::{on_all, seed};
use ringwire::store::{StoreClient, StoreServer};
use ringwire::testing::Rng;
use ringwire::train::{GradReducer, Layout, ReducerConfig, TrainError};
use ringwire::wire::{self, FrameKind, HEADER_LEN, Header, Hello, HelloAck};
use ringwire::{Builder, Communicator, DType, Error, ReduceOp};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn builder(addr: SocketAddr, rank: usize, world: usize) -> Builder {
    Communicator::builder()
        .rank(rank)
        .world_size(world)
        .store_addr(addr)
        .host_store(false)
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(20))
}

fn launch(addr: SocketAddr, world: usize) -> Vec<Communicator> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| s.spawn(move || builder(addr, rank, world).build().wait()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().expect("launch"))
            .collect()
    })
}

/// Each rank's own random values, and the sum every rank must get.
fn check_sum(comms: &[Communicator], rng_seed: u64, len: usize) {
    let inputs: Vec<Vec<i64>> = (0..comms.len())
        .map(|r| {
            let mut rng = Rng::new(rng_seed ^ r as u64);
            (0..len).map(|_| (rng.next_u64() % 1000) as i64).collect()
        })
        .collect();
    let want: Vec<i64> = (0..len)
        .map(|i| inputs.iter().map(|v| v[i]).sum())
        .collect();
    let got = on_all(comms, |c| {
        c.all_reduce(inputs[c.rank()].clone(), ReduceOp::Sum)
            .wait()
            .unwrap()
    });
    for (rank, g) in got.iter().enumerate() {
        assert_eq!(g, &want, "rank {rank}");
    }
}

/// Waits until every member sees `n` replacements waiting.
fn until_waiting(comms: &[Communicator], n: usize) {
    let until = Instant::now() + Duration::from_secs(20);
    for c in comms {
        while c.joiners_waiting().unwrap() != n {
            assert!(
                Instant::now() < until,
                "rank {} never saw {n} waiting",
                c.rank()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Drops rank `lost`, shrinks the others, starts its replacement and
/// admits it: the communicators of the whole world again, in rank order.
fn lose_and_replace(
    mut comms: Vec<Communicator>,
    lost: usize,
    addr: SocketAddr,
) -> Vec<Communicator> {
    let world = comms.len();
    drop(comms.remove(lost));
    let _ = on_all(&comms, |c| c.all_reduce(vec![1u8; 4], ReduceOp::Sum).wait());
    let survivors = on_all(&comms, |c| c.shrink().wait().unwrap());
    drop(comms);
    for c in &survivors {
        assert_eq!(c.joiners_waiting().unwrap(), 0);
    }
    let newcomer =
        std::thread::spawn(move || builder(addr, lost, world).rejoin(true).build().wait());
    until_waiting(&survivors, 1);
    let mut admitted = on_all(&survivors, |c| c.admit().wait().unwrap());
    let newcomer = newcomer
        .join()
        .unwrap()
        .expect("the replacement is admitted");
    assert_eq!((newcomer.rank(), newcomer.world_size()), (lost, world));
    admitted.insert(lost, newcomer);
    for (rank, c) in admitted.iter().enumerate() {
        assert_eq!((c.rank(), c.world_size()), (rank, world));
        assert_eq!(c.world_ranks(), (0..world).collect::<Vec<_>>());
        assert_eq!(c.joiners_waiting().unwrap(), 0);
        assert_eq!(c.newcomers(), [lost]);
    }
    admitted
}

#[test]
fn a_replacement_takes_a_lost_ranks_place_and_the_job_goes_on() {
    let seed = seed();
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    let world = 4;
    let mut comms = launch(addr, world);
    check_sum(&comms, seed, 1000);
    // Rank 2 is dialed by ranks 0 and 1 and dials rank 3; then rank 0,
    // which dials everyone; then rank 2 again (its third process).
    for (round, lost) in [2, 0, 2].into_iter().enumerate() {
        comms = lose_and_replace(comms, lost, addr);
        // Small (latency-bound schedules) and large (ring), uneven.
        check_sum(&comms, seed + round as u64, 7);
        check_sum(&comms, seed + round as u64, 300_001);
        // The newcomer's data reaches everyone, and everyone's it.
        let got = on_all(&comms, |c| {
            c.broadcast(vec![c.rank() as i32; 33], lost).wait().unwrap()
        });
        assert!(got.iter().all(|v| v == &vec![lost as i32; 33]));
        let gathered = on_all(&comms, |c| {
            let (_, out) = c
                .all_gather(vec![c.rank() as i32; 3], vec![0i32; 3 * world])
                .wait()
                .unwrap();
            out
        });
        let want: Vec<i32> = (0..world as i32).flat_map(|r| [r; 3]).collect();
        assert!(gathered.iter().all(|v| v == &want));
    }
}

/// What rank `to` answers a hello from rank `from`'s process `incarnation`
/// (the job's own id, world size and no secret): whether it accepts, and
/// why not.
fn hello_answer(store: SocketAddr, from: u32, incarnation: u32, to: usize) -> (bool, String) {
    let c = StoreClient::connect(&[store], Duration::from_secs(5)).unwrap();
    let get = |k: &str| {
        c.get(&format!("ringwire/default/{k}"), Duration::from_secs(5))
            .unwrap()
    };
    let job = u64::from_le_bytes(get("job").try_into().unwrap());
    let addr: SocketAddr = String::from_utf8(get(&format!("addr/{to}")))
        .unwrap()
        .parse()
        .unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = Hello {
        incarnation,
        ..Hello::new(job, from, 4)
    };
    s.write_all(&wire::encode_hello(0, 0, &hello).unwrap())
        .unwrap();
    let mut frame = vec![0u8; HEADER_LEN];
    s.read_exact(&mut frame).unwrap();
    let h = Header::decode(&frame, wire::MAX_CONTROL_PAYLOAD).unwrap();
    assert_eq!(h.kind, FrameKind::HandshakeAck);
    frame.resize(h.frame_len(), 0);
    s.read_exact(&mut frame[HEADER_LEN..]).unwrap();
    let start = h.payload_offset();
    let ack = HelloAck::decode(&frame[start..start + h.payload_len_usize()]).unwrap();
    (ack.accepted, ack.reason)
}

/// A process excluded as dead that wakes up (or any other with the old
/// incarnation) cannot link in its replacement's place; one claiming an
/// incarnation not admitted yet cannot either.
#[test]
fn the_process_a_replacement_took_the_place_of_cannot_link_again() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    // Lost before any link was made: its peers' dials are refused.
    let comms = lose_and_replace(launch(addr, 4), 2, addr);
    check_sum(&comms, 5, 10);
    let (accepted, why) = hello_answer(addr, 2, 0, 3);
    assert!(!accepted);
    assert!(
        why.contains("rank 2 (incarnation 0) was replaced by incarnation 1"),
        "{why}"
    );
    let (accepted, why) = hello_answer(addr, 2, 7, 3);
    assert!(!accepted);
    assert!(why.contains("is not admitted at rank 3 yet"), "{why}");
    // The job goes on.
    check_sum(&comms, 6, 10);
}

#[test]
fn admitting_with_nobody_waiting_keeps_the_members() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let comms = launch(store.local_addr(), 3);
    assert!(comms.iter().all(|c| c.joiners_waiting().unwrap() == 0));
    let same = on_all(&comms, |c| c.admit().wait().unwrap());
    for (rank, c) in same.iter().enumerate() {
        assert_eq!((c.rank(), c.world_size()), (rank, 3));
        assert!(c.newcomers().is_empty());
    }
    check_sum(&same, 7, 100);
}

#[test]
fn a_replacement_with_no_job_to_join_says_so() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let err = builder(store.local_addr(), 1, 4)
        .connect_timeout(Duration::from_millis(300))
        .job("nothing-runs-here")
        .rejoin(true)
        .build()
        .wait()
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Rendezvous(_)), "{err:?}");
    assert!(text.contains("no job \"nothing-runs-here\" runs"), "{text}");
}

#[test]
fn a_replacement_whose_store_is_gone_is_told_what_to_run() {
    // A store that was rank 0's went with it: nothing listens there now.
    let addr = {
        let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        store.local_addr()
    };
    let err = builder(addr, 0, 2)
        .connect_timeout(Duration::from_millis(300))
        .rejoin(true)
        .build()
        .wait()
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("could not reach the job's store"), "{text}");
    assert!(text.contains("ringwire-store"), "{text}");
}

/// Every test of this file, again on the portable transport.
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

/// Every other test of this file, again with local ranks linked over TCP.
#[test]
fn over_tcp_local_links_too() {
    common::rerun_over_tcp_local_links("over_tcp_local_links_too");
}

/// A state of parts of many lengths (some empty) crosses in pieces that
/// end anywhere in a part: every rank ends with the root's, bit for bit.
#[test]
fn the_state_reaches_every_rank_in_pieces() {
    let seed = seed();
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let comms = launch(store.local_addr(), 3);
    let lens = [0usize, 1, 37, 0, 1000, 3, 4096];
    for (root, piece_bytes) in [(2, 100), (0, 4), (1, 1 << 20)] {
        let states = on_all(&comms, |c| {
            let mut rng = Rng::new(seed ^ c.rank() as u64);
            let mut state: Vec<Vec<f64>> = lens
                .iter()
                .map(|&n| (0..n).map(|_| rng.unit()).collect())
                .collect();
            let mut parts: Vec<&mut [f64]> = state.iter_mut().map(Vec::as_mut_slice).collect();
            ringwire::testing::broadcast_state_in_pieces(c, root, &mut parts, piece_bytes).unwrap();
            state
        });
        for s in &states {
            assert!(s.iter().zip(&states[root]).all(|(a, b)| {
                a.iter()
                    .map(|x| x.to_bits())
                    .eq(b.iter().map(|x| x.to_bits()))
            }));
        }
    }
    // Lengths that differ fail on every rank, before anything moves.
    let errs = on_all(&comms, |c| {
        let mut state = vec![0f32; 10 + usize::from(c.rank() == 1)];
        ringwire::train::broadcast_state(c, 0, &mut [&mut state]).unwrap_err()
    });
    for e in errs {
        assert!(matches!(e, TrainError::StateDiffers { .. }), "{e}");
    }
}

/// Two steps of a data-parallel reducer (its buckets rebuilt after the
/// first), a rank lost and replaced: the replacement takes the members'
/// bucket order and the parameters, and every rank's parameters stay the
/// same as the job goes on.
#[test]
fn a_replacement_trains_on_with_the_members_state() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    let world = 3;
    let lost = 1;
    let layout = || {
        let mut l = Layout::new();
        for (name, len) in [("a", 300), ("b", 7), ("c", 5000)] {
            l.push(name, len, DType::F32);
        }
        l
    };
    let config = || ReducerConfig {
        bucket_cap_bytes: 4096,
        first_bucket_bytes: 1024,
        ..ReducerConfig::default()
    };
    // One step: gradient = the rank's number, backward in an order of its
    // own (so the rebuilt buckets differ from the first ones), then SGD.
    let step =
        |ddp: &mut GradReducer, params: &mut [Vec<f32>], rank: usize| -> Result<(), TrainError> {
            for id in [1usize, 0, 2] {
                let p = ddp.layout().id(["a", "b", "c"][id]).unwrap();
                ddp.grad_mut::<f32>(p)?.fill(rank as f32 + 1.0);
                ddp.mark_ready(p)?;
            }
            ddp.finish()?;
            for (id, param) in params.iter_mut().enumerate() {
                let g = ddp.grad::<f32>(ddp.layout().id(["a", "b", "c"][id]).unwrap())?;
                for (x, g) in param.iter_mut().zip(g) {
                    *x -= 0.1 * g;
                }
            }
            ddp.zero_grads();
            Ok(())
        };
    let fresh = || vec![vec![1f32; 300], vec![1f32; 7], vec![1f32; 5000]];
    let mut comms = launch(addr, world);
    let mut ranks: Vec<(GradReducer, Vec<Vec<f32>>)> = on_all(&comms, |c| {
        let mut ddp = GradReducer::new(c, layout(), config()).unwrap();
        let mut params = fresh();
        for _ in 0..2 {
            step(&mut ddp, &mut params, c.rank()).unwrap();
        }
        (ddp, params)
    })
    .into_iter()
    .collect();
    let before = ranks[0].1.clone();
    drop(comms.remove(lost));
    ranks.remove(lost);
    // The survivors' step fails; they shrink, and the reducers go on.
    let survivors: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(ranks.iter_mut())
            .map(|(c, (ddp, params))| {
                s.spawn(move || {
                    let mut kept = params.clone();
                    assert!(step(ddp, &mut kept, c.rank()).is_err());
                    let shrunk = c.shrink().wait().unwrap();
                    ddp.recover(&shrunk).unwrap();
                    shrunk
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let newcomer = std::thread::spawn(move || {
        let comm = builder(addr, lost, world)
            .rejoin(true)
            .build()
            .wait()
            .unwrap();
        let mut ddp = GradReducer::rejoin(&comm, layout(), config()).unwrap();
        let mut params = vec![vec![0f32; 300], vec![0f32; 7], vec![0f32; 5000]];
        {
            let mut parts: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
            ringwire::train::broadcast_state(&comm, 0, &mut parts).unwrap();
        }
        step(&mut ddp, &mut params, comm.rank()).unwrap();
        params
    });
    until_waiting(&survivors, 1);
    let after: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = survivors
            .iter()
            .zip(ranks.iter_mut())
            .map(|(c, (ddp, params))| {
                s.spawn(move || {
                    let admitted = c.admit().wait().unwrap();
                    ddp.recover(&admitted).unwrap();
                    let mut parts: Vec<&mut [f32]> =
                        params.iter_mut().map(Vec::as_mut_slice).collect();
                    ringwire::train::broadcast_state(&admitted, 0, &mut parts).unwrap();
                    step(ddp, params, admitted.rank()).unwrap();
                    params.clone()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let newcomers = newcomer.join().unwrap();
    // The step after: the average of 1, 2, 3 times 0.1 off what every
    // rank held, on every rank alike.
    let want: Vec<Vec<f32>> = before
        .iter()
        .map(|p| p.iter().map(|x| x - 0.1 * 2.0).collect())
        .collect();
    for got in after.iter().chain(std::iter::once(&newcomers)) {
        assert_eq!(got, &want);
    }
}

/// A communicator takes in only the ranks its own line lost: a split
/// that never had the rank sees nobody waiting, and where two
/// communicators lost it, the one that admits first takes the process.
#[test]
fn a_communicator_takes_in_only_ranks_of_its_own_line() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    let mut comms = launch(addr, 4);
    check_sum(&comms, 9, 10);
    // Halves {0, 1} and {2, 3}.
    let mut halves = on_all(&comms, |c| {
        c.split(Some((c.rank() / 2) as u32), 0).unwrap().unwrap()
    });
    drop(halves.remove(2));
    drop(comms.remove(2));
    let _ = on_all(&comms, |c| c.all_reduce(vec![1u8; 4], ReduceOp::Sum).wait());
    let survivors = on_all(&comms, |c| c.shrink().wait().unwrap());
    // Rank 3's half lost rank 2 too; alone, it shrinks with a quorum of 1.
    let _ = halves[2].all_reduce(vec![1u8; 4], ReduceOp::Sum).wait();
    let alone = halves[2].shrink_with_quorum(1).wait().unwrap();
    let newcomer = std::thread::spawn(move || builder(addr, 2, 4).rejoin(true).build().wait());
    until_waiting(&survivors, 1);
    assert_eq!(alone.joiners_waiting().unwrap(), 1);
    for half in &halves[..2] {
        assert_eq!(
            half.joiners_waiting().unwrap(),
            0,
            "the half {{0, 1}} never had rank 2"
        );
    }
    let mut whole = on_all(&survivors, |c| c.admit().wait().unwrap());
    whole.insert(2, newcomer.join().unwrap().unwrap());
    check_sum(&whole, 10, 1000);
    // Taken by the whole: rank 3's half no longer sees it waiting, and
    // its own admit goes on without it.
    assert_eq!(alone.joiners_waiting().unwrap(), 0);
    let still_alone = alone.admit().wait().unwrap();
    assert_eq!(still_alone.world_size(), 1);
}

/// A replacement whose `ReducerConfig` differs from the members' (other
/// bucket caps: other buckets) fails on every rank, naming it, instead of
/// reducing mismatched buckets later.
#[test]
fn a_replacement_with_another_reducer_config_is_refused_on_every_rank() {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    let (world, lost) = (3, 2);
    let layout = || {
        let mut l = Layout::new();
        l.push("w", 1000, DType::F32);
        l.push("b", 10, DType::F32);
        l
    };
    let config = |cap: usize| ReducerConfig {
        bucket_cap_bytes: cap,
        first_bucket_bytes: 1024,
        ..ReducerConfig::default()
    };
    let mut comms = launch(addr, world);
    let mut reducers: Vec<GradReducer> = on_all(&comms, |c| {
        GradReducer::new(c, layout(), config(2048)).unwrap()
    });
    drop(comms.remove(lost));
    reducers.remove(lost);
    let _ = on_all(&comms, |c| c.all_reduce(vec![1u8; 4], ReduceOp::Sum).wait());
    let survivors: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(reducers.iter_mut())
            .map(|(c, ddp)| {
                s.spawn(move || {
                    let shrunk = c.shrink().wait().unwrap();
                    ddp.recover(&shrunk).unwrap();
                    shrunk
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let newcomer = std::thread::spawn(move || {
        let comm = builder(addr, lost, world)
            .rejoin(true)
            .build()
            .wait()
            .unwrap();
        GradReducer::rejoin(&comm, layout(), config(8192)).map(drop)
    });
    until_waiting(&survivors, 1);
    let members: Vec<Result<(), TrainError>> = std::thread::scope(|s| {
        let hs: Vec<_> = survivors
            .iter()
            .zip(reducers.iter_mut())
            .map(|(c, ddp)| {
                s.spawn(move || {
                    let admitted = c.admit().wait().unwrap();
                    ddp.recover(&admitted)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for outcome in members.into_iter().chain([newcomer.join().unwrap()]) {
        match outcome {
            Err(TrainError::ConfigDiffers {
                rank,
                root,
                ref theirs,
                ..
            }) => {
                assert_eq!((rank, root), (lost, 0), "{outcome:?}");
                assert!(theirs.contains("bucket_cap_bytes 8192"), "{theirs}");
            }
            other => panic!("expected ConfigDiffers, got {other:?}"),
        }
    }
}
