//! Ranks as threads: the averages, the broadcast start, and a layout that
//! differs across ranks.

use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use ringwire::Communicator;
use ringwire::store::StoreServer;
use std::time::Duration;

fn group(world: usize) -> (StoreServer, Vec<Communicator>) {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = store.local_addr();
    let comms = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let b = Communicator::builder()
                    .rank(rank)
                    .world_size(world)
                    .store_addr(addr)
                    .host_store(false)
                    .timeout(Duration::from_secs(30));
                s.spawn(move || b.build().wait().expect("communicator"))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (store, comms)
}

fn on_all<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = items.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn input(rank: usize, device: &Device) -> Tensor<2> {
    let v: Vec<f32> = (0..8)
        .map(|i| (i as f32 + 1.0) * (rank as f32 + 1.0) / 8.0)
        .collect();
    Tensor::<1>::from_floats(v.as_slice(), device).reshape([2, 4])
}

fn weight_grad(model: &Linear, grads: &GradientsParams) -> Vec<f32> {
    grads
        .get::<2>(model.weight.id)
        .expect("a weight gradient")
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

/// Two ranks with different random weights and inputs: after `broadcast`
/// both hold rank 0's, and `sync` gives each the mean of the two ranks'
/// own gradients, exactly.
#[test]
fn two_ranks_start_equal_and_average_their_gradients() {
    let (_store, comms) = group(2);
    let out = on_all(&comms, |c| {
        let device = Device::default().autodiff();
        let model = LinearConfig::new(4, 3).init(&device);
        let mut ddp = ringwire_burn::Ddp::new(c, &model, Default::default()).expect("ddp");
        assert_eq!(ddp.names(), ["weight", "bias"]);
        let model = ddp.broadcast(model).expect("broadcast");
        let weights = model.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let own = {
            let loss = model.forward(input(c.rank(), &device)).sum();
            GradientsParams::from_grads(loss.backward(), &model)
        };
        let own = weight_grad(&model, &own);
        let loss = model.forward(input(c.rank(), &device)).sum();
        let avg = ddp.sync(&model, loss.backward()).expect("sync");
        (weights, own, weight_grad(&model, &avg))
    });
    assert_eq!(out[0].0, out[1].0, "rank 0's weights everywhere");
    let want: Vec<f32> = out[0]
        .1
        .iter()
        .zip(&out[1].1)
        .map(|(a, b)| (a + b) / 2.0)
        .collect();
    assert_ne!(out[0].1, out[1].1, "the ranks' own gradients differ");
    for (rank, o) in out.iter().enumerate() {
        assert_eq!(o.2, want, "rank {rank}");
    }
}

/// A model that differs across ranks fails on every rank, naming it.
#[test]
fn a_layout_that_differs_fails_on_every_rank() {
    let (_store, comms) = group(2);
    let out = on_all(&comms, |c| {
        let device = Device::default().autodiff();
        let model = LinearConfig::new(4, 3 + c.rank()).init(&device);
        ringwire_burn::Ddp::new(c, &model, Default::default()).map(|_| ())
    });
    for o in out {
        let e = o.expect_err("layouts differ");
        assert!(e.to_string().contains("weight"), "{e}");
    }
}
