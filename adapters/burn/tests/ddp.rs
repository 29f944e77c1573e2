//! Ranks as threads: the averages, the broadcast start, and a layout that
//! differs across ranks.

use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use ringwire::Communicator;
use ringwire::store::StoreServer;
use ringwire::train::ReducerConfig;

fn group(world: usize) -> (StoreServer, Vec<Communicator>) {
    ringwire::testing::local_group(world, |_, b| b)
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

/// A 4-3 linear layer, its `Ddp` with `config`, and rank 0's weights.
fn linear(c: &Communicator, config: ReducerConfig) -> (Device, Linear, ringwire_burn::Ddp) {
    let device = Device::default().autodiff();
    let model = LinearConfig::new(4, 3).init(&device);
    let mut ddp = ringwire_burn::Ddp::new(c, &model, config).expect("ddp");
    let model = ddp.broadcast(model).expect("broadcast");
    (device, model, ddp)
}

/// Every rank's result (the second of its pair) is `want`, exactly.
fn each_rank_got<T>(out: &[(T, Vec<f32>)], want: &[f32]) {
    for (rank, o) in out.iter().enumerate() {
        assert_eq!(o.1, want, "rank {rank}");
    }
}

/// The reducer's average of two ranks' values: summed in f32, divided
/// once in f64.
fn avg2(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter()
        .zip(b)
        .map(|(&a, &b)| ((a + b) as f64 / 2.0) as f32)
        .collect()
}

/// The reducer's weighted average of two ranks' values: each scaled by its
/// count, summed, scaled by one over the total.
fn weighted2(a: &[f32], wa: f32, b: &[f32], wb: f32) -> Vec<f32> {
    let scale = (1.0 / (wa + wb) as f64) as f32;
    a.iter()
        .zip(b)
        .map(|(&a, &b)| (a * wa + b * wb) * scale)
        .collect()
}

/// Two ranks with different random weights and inputs: after `broadcast`
/// both hold rank 0's, and `sync` gives each the mean of the two ranks'
/// own gradients, exactly.
#[test]
fn two_ranks_start_equal_and_average_their_gradients() {
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
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

/// A module other than the one the `Ddp` was made from is refused, before
/// any communication.
#[test]
fn another_module_is_refused() {
    let (_store, comms) = group(1);
    let device = Device::default().autodiff();
    let small = LinearConfig::new(4, 3).init(&device);
    let mut ddp = ringwire_burn::Ddp::new(&comms[0], &small, Default::default()).expect("ddp");
    let other = Two::new(&device);
    let loss = other.l2.forward(other.l1.forward(input(0, &device))).sum();
    let e = ddp
        .sync(&other, loss.backward())
        .expect_err("another module");
    assert!(
        matches!(
            e,
            ringwire_burn::Error::ModuleChanged {
                expected: 2,
                got: 4
            }
        ),
        "{e}"
    );
}

/// A model that differs across ranks fails on every rank, naming it.
#[test]
fn a_layout_that_differs_fails_on_every_rank() {
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let device = Device::default().autodiff();
        let model = LinearConfig::new(4, 3 + c.rank()).init(&device);
        ringwire_burn::Ddp::new(c, &model, Default::default()).map(|_| ())
    });
    for o in out {
        let e = o.expect_err("layouts differ");
        assert!(e.to_string().contains("weight"), "{e}");
    }
}

/// The weight gradient of `model` for `rank`'s input, in one process.
fn own_weight_grad(model: &Linear, rank: usize, rows: usize, device: &Device) -> Vec<f32> {
    let loss = model.forward(input_rows(rank, rows, device)).mean();
    weight_grad(model, &GradientsParams::from_grads(loss.backward(), model))
}

/// `rows` rows of 4 inputs, different for each rank.
fn input_rows(rank: usize, rows: usize, device: &Device) -> Tensor<2> {
    let v: Vec<f32> = (0..rows * 4)
        .map(|i| ((i * 7 + rank * 13) % 11) as f32 / 5.0 - 1.0)
        .collect();
    Tensor::<1>::from_floats(v.as_slice(), device).reshape([rows, 4])
}

/// Two accumulated steps and a synchronised one give each rank the mean
/// across ranks of its three gradients' sum, exactly (summed in f32 into
/// bucket memory, averaged once).
#[test]
fn accumulated_steps_are_summed_then_averaged() {
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let (device, model, mut ddp) = linear(c, Default::default());
        let mut own = vec![0.0f32; 12];
        for step in 0..3 {
            let rows = 2 + step;
            let g = own_weight_grad(&model, c.rank() * 3 + step, rows, &device);
            own.iter_mut().zip(&g).for_each(|(s, g)| *s += g);
            let loss = model
                .forward(input_rows(c.rank() * 3 + step, rows, &device))
                .mean();
            if step < 2 {
                ddp.accumulate(&model, loss.backward()).expect("accumulate");
            } else {
                let avg = ddp.sync(&model, loss.backward()).expect("sync");
                return (own, weight_grad(&model, &avg));
            }
        }
        unreachable!("the third step syncs")
    });
    let want: Vec<f32> = avg2(&out[0].0, &out[1].0);
    each_rank_got(&out, &want);
}

/// An uneven last batch: rank 0 has three samples, rank 1 one. With the
/// sample counts set, each rank gets the mean over all four samples (the
/// gradient one process computes on the whole batch, within rounding),
/// not the mean of the two ranks' means.
#[test]
fn an_uneven_last_batch_is_weighted_by_its_samples() {
    let (_store, comms) = group(2);
    let rows = [3, 1];
    let out = ringwire::testing::on_all(&comms, |c| {
        let (device, model, mut ddp) = linear(c, Default::default());
        // The whole batch in one process: both ranks' rows, one mean.
        let whole = Tensor::cat(
            vec![
                input_rows(0, rows[0], &device),
                input_rows(1, rows[1], &device),
            ],
            0,
        );
        let loss = model.forward(whole).mean();
        let global = weight_grad(
            &model,
            &GradientsParams::from_grads(loss.backward(), &model),
        );
        let own = own_weight_grad(&model, c.rank(), rows[c.rank()], &device);
        ddp.set_sample_count(rows[c.rank()]);
        let loss = model
            .forward(input_rows(c.rank(), rows[c.rank()], &device))
            .mean();
        let avg = ddp.sync(&model, loss.backward()).expect("sync");
        (global, own, weight_grad(&model, &avg))
    });
    // The reducer's arithmetic: each rank scales by its count, the sum is
    // scaled by one over the total.
    let want: Vec<f32> = weighted2(&out[0].1, 3.0, &out[1].1, 1.0);
    let unweighted: Vec<f32> = out[0]
        .1
        .iter()
        .zip(&out[1].1)
        .map(|(&a, &b)| (a + b) / 2.0)
        .collect();
    assert_ne!(want, unweighted, "the weights matter for this batch");
    for (rank, o) in out.iter().enumerate() {
        assert_eq!(o.2, want, "rank {rank}");
        for (got, global) in o.2.iter().zip(&o.0) {
            assert!(
                (got - global).abs() <= 1e-5,
                "rank {rank}: {got} vs {global}"
            );
        }
    }
}

/// Two layers, for the frozen and unused cases.
#[derive(burn::module::Module, Debug)]
struct Two {
    l1: Linear,
    l2: Linear,
}

impl Two {
    fn new(device: &Device) -> Two {
        Two {
            l1: LinearConfig::new(4, 4).init(device),
            l2: LinearConfig::new(4, 2).init(device),
        }
    }
}

/// A frozen layer is left out of the reducer (its gradient-free
/// parameters are no error), and `broadcast` still gives it rank 0's
/// values, as PyTorch's DDP does its buffers.
#[test]
fn a_frozen_layer_is_left_out() {
    use burn::module::Module;
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let device = Device::default().autodiff();
        let mut model = Two::new(&device);
        model.l1 = model.l1.no_grad();
        let mut ddp = ringwire_burn::Ddp::new(c, &model, Default::default()).expect("ddp");
        let names: Vec<String> = ddp.names().iter().map(|s| s.to_string()).collect();
        let model = ddp.broadcast(model).expect("broadcast");
        let frozen = model
            .l1
            .weight
            .val()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let x = input_rows(c.rank(), 2, &device);
        let loss = model.l2.forward(model.l1.forward(x)).sum();
        let avg = ddp.sync(&model, loss.backward()).expect("sync");
        (names, frozen, avg.get::<2>(model.l2.weight.id).is_some())
    });
    assert_eq!(out[0].1, out[1].1, "the frozen layer is rank 0's too");
    for o in out {
        assert_eq!(o.0, ["l2.weight", "l2.bias"]);
        assert!(o.2, "the trained layer's average");
    }
}

/// A layer the loss does not use has no gradient: by default the step
/// fails on every rank naming it; with `Unused::Zero` it counts as zero.
#[test]
fn an_unused_layer_is_named_or_counts_as_zero() {
    use ringwire::train::Unused;
    for unused in [Unused::Error, Unused::Zero] {
        // A failed step aborts the communicator: each case a fresh group.
        let (_store, comms) = group(2);
        let out = ringwire::testing::on_all(&comms, |c| {
            let device = Device::default().autodiff();
            let model = Two::new(&device);
            let config = ReducerConfig {
                unused,
                ..Default::default()
            };
            let mut ddp = ringwire_burn::Ddp::new(c, &model, config).expect("ddp");
            let model = ddp.broadcast(model).expect("broadcast");
            // A step that uses l2 first, so its bucket memory holds a
            // non-zero average the next step must not keep.
            let both = model
                .l2
                .forward(model.l1.forward(input_rows(c.rank(), 2, &device)))
                .sum();
            ddp.sync(&model, both.backward())
                .expect("a step using both");
            let loss = model.l1.forward(input_rows(c.rank(), 2, &device)).sum();
            ddp.sync(&model, loss.backward()).map(|avg| {
                avg.get::<2>(model.l2.weight.id)
                    .expect("a zero gradient")
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap()
            })
        });
        for o in out {
            match unused {
                Unused::Error => {
                    let e = o.expect_err("l2 had no gradient");
                    assert!(e.to_string().contains("l2.weight"), "{e}");
                }
                _ => assert_eq!(o.expect("zero"), vec![0.0; 8]),
            }
        }
    }
}

/// bf16 on the wire: each rank gets the mean within bf16's rounding (8
/// bits of mantissa, twice: each rank's value and the sum), and every rank
/// the same values.
#[test]
fn bf16_on_the_wire_averages_within_its_rounding() {
    use ringwire::train::CommHook;
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let config = ReducerConfig {
            hook: CommHook::Bf16Wire,
            ..Default::default()
        };
        let (device, model, mut ddp) = linear(c, config);
        let own = own_weight_grad(&model, c.rank(), 3, &device);
        let loss = model.forward(input_rows(c.rank(), 3, &device)).mean();
        let avg = ddp.sync(&model, loss.backward()).expect("sync");
        (own, weight_grad(&model, &avg))
    });
    assert_eq!(out[0].1, out[1].1, "every rank the same values");
    let mut exact_everywhere = true;
    for ((a, b), got) in out[0].0.iter().zip(&out[1].0).zip(&out[0].1) {
        let want = (a + b) / 2.0;
        let bound = (a.abs() + b.abs()) / 2.0 * (2.0 / 256.0) + 1e-7;
        assert!((got - want).abs() <= bound, "{got} vs {want}");
        exact_everywhere &= got.to_bits() == want.to_bits();
    }
    assert!(!exact_everywhere, "bf16 rounded something");
}

/// A layer with gradients in an accumulated step but none in the synced
/// one keeps what it accumulated (it is not "unused"): its average is the
/// mean of the accumulated gradients.
#[test]
fn a_layer_seen_only_in_accumulated_steps_keeps_its_sum() {
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let device = Device::default().autodiff();
        let model = Two::new(&device);
        let mut ddp = ringwire_burn::Ddp::new(c, &model, Default::default()).expect("ddp");
        let model = ddp.broadcast(model).expect("broadcast");
        let x = input_rows(c.rank(), 2, &device);
        let both = model.l2.forward(model.l1.forward(x.clone())).sum();
        let own = GradientsParams::from_grads(both.backward(), &model);
        let own_l2 = own
            .get::<2>(model.l2.weight.id)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let both = model.l2.forward(model.l1.forward(x.clone())).sum();
        ddp.accumulate(&model, both.backward()).expect("accumulate");
        let only_l1 = model.l1.forward(x).sum();
        let avg = ddp.sync(&model, only_l1.backward()).expect("sync");
        let l2 = avg
            .get::<2>(model.l2.weight.id)
            .expect("l2's accumulated average")
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        (own_l2, l2)
    });
    let want: Vec<f32> = avg2(&out[0].0, &out[1].0);
    each_rank_got(&out, &want);
}

/// Steps after a sync start from nothing: bucket memory is overwritten, not
/// added to (no zeroing between steps), so the second of two synced steps
/// gives exactly its own average.
#[test]
fn each_synced_step_averages_only_its_own_gradients() {
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let (device, model, mut ddp) = linear(c, Default::default());
        let mut last = (Vec::new(), Vec::new());
        for step in 0..2 {
            let own = own_weight_grad(&model, c.rank() + 2 * step, 2, &device);
            let loss = model
                .forward(input_rows(c.rank() + 2 * step, 2, &device))
                .mean();
            let avg = ddp.sync(&model, loss.backward()).expect("sync");
            last = (own, weight_grad(&model, &avg));
        }
        last
    });
    let want: Vec<f32> = avg2(&out[0].0, &out[1].0);
    each_rank_got(&out, &want);
}

/// A sample count set before accumulated steps weighs the whole window at
/// the sync (it is not dropped by the accumulated steps).
#[test]
fn a_sample_count_weighs_the_accumulated_window() {
    let (_store, comms) = group(2);
    let weights = [3usize, 1];
    let out = ringwire::testing::on_all(&comms, |c| {
        let (device, model, mut ddp) = linear(c, Default::default());
        ddp.set_sample_count(weights[c.rank()]);
        let mut window = vec![0.0f32; 12];
        let mut avg = None;
        for step in 0..2 {
            let at = c.rank() * 2 + step;
            let g = own_weight_grad(&model, at, 2, &device);
            window.iter_mut().zip(&g).for_each(|(s, g)| *s += g);
            let loss = model.forward(input_rows(at, 2, &device)).mean();
            match step {
                0 => ddp.accumulate(&model, loss.backward()).expect("accumulate"),
                _ => {
                    avg = Some(weight_grad(
                        &model,
                        &ddp.sync(&model, loss.backward()).expect("sync"),
                    ))
                }
            }
        }
        (window, avg.expect("synced"))
    });
    let want: Vec<f32> = weighted2(&out[0].0, 3.0, &out[1].0, 1.0);
    let unweighted: Vec<f32> = avg2(&out[0].0, &out[1].0);
    assert_ne!(want, unweighted, "the weights matter here");
    each_rank_got(&out, &want);
}

/// A gradient of the wrong shape on one rank fails that rank before any
/// bucket is fed, and the others through an abort that names it, not
/// through their timeout.
#[test]
fn a_malformed_gradient_fails_every_rank_through_an_abort() {
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let (device, model, mut ddp) = linear(c, Default::default());
        let loss = model.forward(input_rows(c.rank(), 2, &device)).sum();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        if c.rank() == 1 {
            grads.remove::<2>(model.weight.id);
            grads.register::<2>(
                model.weight.id,
                Tensor::<2>::zeros([2, 2], &device.clone().inner()),
            );
        }
        ddp.sync_params(&model, grads).map(|_| ())
    });
    let e1 = out[1].as_ref().expect_err("rank 1's gradient is malformed");
    assert!(e1.to_string().contains("weight"), "{e1}");
    // Rank 0 hears of the abort (naming rank 1's reason), not of its
    // timeout.
    let e0 = out[0].as_ref().expect_err("rank 0 hears of it");
    assert!(e0.to_string().contains("called abort()"), "{e0}");
    assert!(e0.to_string().contains("weight"), "{e0}");
}

/// A frozen layer whose shape differs from rank 0's fails `broadcast` on
/// the differing rank, naming it, and aborts the communicator, so rank 0
/// (whose broadcast, as a root's, may already have ended) fails next.
#[test]
fn a_frozen_layer_unlike_rank_0s_fails_broadcast_everywhere() {
    use burn::module::Module;
    let (_store, comms) = group(2);
    let out = ringwire::testing::on_all(&comms, |c| {
        let device = Device::default().autodiff();
        let model = Two {
            l1: LinearConfig::new(4, 4 + c.rank()).init(&device).no_grad(),
            l2: LinearConfig::new(4, 2).init(&device),
        };
        let mut ddp = ringwire_burn::Ddp::new(c, &model, Default::default()).expect("ddp");
        let broadcast = ddp.broadcast(model).map(|_| ());
        // The root's broadcast may end before it hears; its next op does.
        let next = c.all_reduce(vec![1.0f32], ringwire::ReduceOp::Sum).wait();
        (broadcast, next.is_err())
    });
    let e1 = out[1].0.as_ref().expect_err("rank 1's l1 differs");
    assert!(e1.to_string().contains("l1.weight"), "{e1}");
    assert!(out[0].1, "rank 0 hears of it by its next op");
}
