//! The hierarchical all-reduce on the stand-in NCCL: four ranks on two
//! "hosts" (distinct host ids, two ranks each), so the within-host phases
//! run on NCCL and the across-host phase on ringwire's transport, against
//! the f64 reference of all four ranks' inputs: lengths that do not divide
//! by the ranks per host (the leftover path), chunks smaller than a shard
//! (the staging pipeline), every reduce operator, several dtypes.

mod common;

use common::{cpu_group, on_all, seed, standin};
use ringwire::testing::{Rng, check_close, random_data, reference_reduce};
use ringwire::{Element, ReduceOp};
use ringwire_gpu::{Device, DeviceElement, GpuError, HierarchicalAllReduce, HostBuffer};
use std::time::Duration;

fn group(
    world: usize,
    hosts: impl Fn(usize) -> String + Sync,
) -> (
    ringwire::store::StoreServer,
    Vec<Result<HierarchicalAllReduce, GpuError>>,
) {
    let (store, cpu) = cpu_group(world, Duration::from_secs(30));
    let lib = standin();
    let device = Device::standin_host(&lib).unwrap();
    // Small chunks: a 1000-element shard crosses in several.
    let hier = on_all(&cpu, |c| {
        HierarchicalAllReduce::builder(c, &device)
            .host(hosts(c.rank()))
            .chunk_bytes(4096)
            .library(lib.clone())
            .build()
    });
    (store, hier)
}

fn sweep<T: Element + DeviceElement>(hier: &[HierarchicalAllReduce], rng: &mut Rng) {
    let world = hier.len();
    for op in ReduceOp::ALL {
        for len in [0usize, 1, 5, 1000, 4097] {
            let data: Vec<Vec<T>> = (0..world).map(|_| random_data(rng, len, op)).collect();
            let reference = reference_reduce(&data, op);
            let got = on_all(hier, |h| (h.local().rank(), h.cross().rank()));
            // Global rank r is local rank r % 2 on host r / 2 (hosts by rank).
            assert_eq!(got, (0..world).map(|r| (r % 2, r / 2)).collect::<Vec<_>>());
            let got = on_all(hier, |h| {
                let rank = h.cross().rank() * 2 + h.local().rank();
                h.all_reduce(HostBuffer::new(data[rank].clone()), op)
                    .wait()
                    .expect("hierarchical all_reduce")
                    .into_vec()
            });
            for (rank, out) in got.iter().enumerate() {
                check_close(out, &reference, world)
                    .unwrap_or_else(|e| panic!("{} {op:?} of {len}, rank {rank}: {e}", T::NAME));
            }
        }
    }
}

#[test]
fn two_hosts_of_two_ranks_match_the_reference() {
    let (_store, hier) = group(4, |rank| format!("host-{}", rank / 2));
    let hier: Vec<_> = hier.into_iter().map(|h| h.expect("make")).collect();
    assert!(format!("{:?}", hier[3]).contains("local rank 1 of 2, 2 hosts"));
    let mut rng = Rng::new(seed());
    sweep::<f32>(&hier, &mut rng);
    sweep::<f64>(&hier, &mut rng);
    sweep::<i32>(&hier, &mut rng);
    sweep::<half::bf16>(&hier, &mut rng);
    sweep::<u8>(&hier, &mut rng);
}

#[test]
fn hosts_of_unequal_size_are_refused_on_every_rank() {
    let (_store, hier) = group(3, |rank| if rank < 2 { "a".into() } else { "b".into() });
    for (rank, h) in hier.into_iter().enumerate() {
        let err = h.expect_err("unequal hosts");
        assert!(
            err.to_string()
                .contains("as many ranks on every host; ranks per host, by rank: [2, 2, 1]"),
            "rank {rank}: {err}"
        );
    }
}
