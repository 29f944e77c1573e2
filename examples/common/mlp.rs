//! The model the training examples share: an MLP 64-128-64-10 (ReLU,
//! softmax cross-entropy) on the 1797 8x8 handwritten digits smartcore
//! embeds (nothing is downloaded), with backpropagation written out and
//! SGD with momentum.

#![allow(dead_code)] // each example uses its part

use ringwire::DType;
use ringwire::train::Layout;

/// Layer sizes: 64 inputs, two hidden layers, 10 classes.
pub(crate) const SIZES: [usize; 4] = [64, 128, 64, 10];

/// Samples: inputs (64 per sample) and labels.
pub(crate) type Samples = (Vec<f32>, Vec<usize>);

/// The digits, features scaled to 0..1: train then test.
pub(crate) fn digits() -> (Samples, Samples) {
    let d = smartcore::dataset::digits::load_dataset();
    let x: Vec<f32> = d.data.iter().map(|v| v / 16.0).collect();
    let y: Vec<usize> = d.target.iter().map(|&c| c as usize).collect();
    let split = 1500;
    let (xf, n) = (d.num_features, d.num_samples);
    assert_eq!((xf, n), (64, 1797), "the digits data set changed");
    (
        (x[..split * xf].to_vec(), y[..split].to_vec()),
        (x[split * xf..].to_vec(), y[split..].to_vec()),
    )
}

/// xorshift64*: the same stream on every rank for the same seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The parameters in definition order: w1, b1, w2, b2, w3, b3 (weights
/// `in x out`, row-major).
pub(crate) fn init_params(seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed | 1);
    let mut params = Vec::new();
    for l in 0..3 {
        let (fan_in, fan_out) = (SIZES[l], SIZES[l + 1]);
        let scale = (6.0 / (fan_in + fan_out) as f32).sqrt();
        params.push(
            (0..fan_in * fan_out)
                .map(|_| (rng.uniform() * 2.0 - 1.0) * scale)
                .collect(),
        );
        params.push(vec![0.0; fan_out]);
    }
    params
}

pub(crate) fn layout() -> Layout {
    let mut layout = Layout::new();
    for l in 0..3 {
        layout.push(
            format!("layer{}.weight", l + 1),
            SIZES[l] * SIZES[l + 1],
            DType::F32,
        );
        layout.push(format!("layer{}.bias", l + 1), SIZES[l + 1], DType::F32);
    }
    layout
}

/// Where backward puts each parameter's gradient, and tells it is done.
pub(crate) trait GradSink {
    fn grad(&mut self, param: usize) -> &mut [f32];
    fn ready(&mut self, param: usize);
}

/// Forward over a batch of `n` samples; the activations of each layer
/// (the input first), the last being the logits.
pub(crate) fn forward(params: &[Vec<f32>], x: &[f32], n: usize) -> Vec<Vec<f32>> {
    let mut acts = vec![x.to_vec()];
    for l in 0..3 {
        let (fi, fo) = (SIZES[l], SIZES[l + 1]);
        let (w, b) = (&params[2 * l], &params[2 * l + 1]);
        let input = &acts[l];
        let mut out = vec![0.0f32; n * fo];
        for s in 0..n {
            let row = &mut out[s * fo..(s + 1) * fo];
            row.copy_from_slice(b);
            for i in 0..fi {
                let xi = input[s * fi + i];
                for (o, wv) in row.iter_mut().zip(&w[i * fo..(i + 1) * fo]) {
                    *o += xi * wv;
                }
            }
            if l < 2 {
                row.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
        acts.push(out);
    }
    acts
}

/// Mean softmax cross-entropy of the logits, and its gradient.
pub(crate) fn loss_and_grad(logits: &[f32], y: &[usize]) -> (f32, Vec<f32>) {
    let (n, c) = (y.len(), SIZES[3]);
    let mut grad = vec![0.0f32; n * c];
    let mut loss = 0.0f32;
    for s in 0..n {
        let row = &logits[s * c..(s + 1) * c];
        let max = row.iter().cloned().fold(f32::MIN, f32::max);
        let exp: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = exp.iter().sum();
        loss -= (exp[y[s]] / sum).ln();
        for k in 0..c {
            let p = exp[k] / sum;
            grad[s * c + k] = (p - if k == y[s] { 1.0 } else { 0.0 }) / n as f32;
        }
    }
    (loss / n as f32, grad)
}

/// Backward from the loss gradient, last layer first: each layer's weight
/// and bias gradients go into `sink` and are marked ready before the
/// layer below is computed.
pub(crate) fn backward(
    params: &[Vec<f32>],
    acts: &[Vec<f32>],
    mut dout: Vec<f32>,
    n: usize,
    sink: &mut dyn GradSink,
) {
    for l in (0..3).rev() {
        let (fi, fo) = (SIZES[l], SIZES[l + 1]);
        let input = &acts[l];
        {
            let dw = sink.grad(2 * l);
            dw.fill(0.0);
            for s in 0..n {
                for i in 0..fi {
                    let xi = input[s * fi + i];
                    for (g, d) in dw[i * fo..(i + 1) * fo]
                        .iter_mut()
                        .zip(&dout[s * fo..(s + 1) * fo])
                    {
                        *g += xi * d;
                    }
                }
            }
        }
        sink.ready(2 * l);
        {
            let db = sink.grad(2 * l + 1);
            db.fill(0.0);
            for s in 0..n {
                for (g, d) in db.iter_mut().zip(&dout[s * fo..(s + 1) * fo]) {
                    *g += d;
                }
            }
        }
        sink.ready(2 * l + 1);
        if l == 0 {
            break;
        }
        let w = &params[2 * l];
        let mut din = vec![0.0f32; n * fi];
        for s in 0..n {
            for i in 0..fi {
                let mut acc = 0.0f32;
                for (d, wv) in dout[s * fo..(s + 1) * fo]
                    .iter()
                    .zip(&w[i * fo..(i + 1) * fo])
                {
                    acc += d * wv;
                }
                // Through the ReLU of the layer below.
                din[s * fi + i] = if input[s * fi + i] > 0.0 { acc } else { 0.0 };
            }
        }
        dout = din;
    }
}

/// SGD with momentum 0.9.
pub(crate) fn sgd(params: &mut [Vec<f32>], velocity: &mut [Vec<f32>], grads: &[&[f32]], lr: f32) {
    for ((p, v), g) in params.iter_mut().zip(velocity.iter_mut()).zip(grads) {
        for ((p, v), g) in p.iter_mut().zip(v.iter_mut()).zip(g.iter()) {
            *v = 0.9 * *v + g;
            *p -= lr * *v;
        }
    }
}

/// The sample order of `epoch`, the same on every rank.
pub(crate) fn permutation(n: usize, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng(0x5eed_0000 + epoch as u64);
    for i in (1..n).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    order
}

/// The inputs and labels of samples `idx`.
pub(crate) fn batch(x: &[f32], y: &[usize], idx: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let xs = idx
        .iter()
        .flat_map(|&i| x[i * 64..(i + 1) * 64].iter().copied())
        .collect();
    (xs, idx.iter().map(|&i| y[i]).collect())
}

pub(crate) fn accuracy(params: &[Vec<f32>], x: &[f32], y: &[usize]) -> f32 {
    let logits = forward(params, x, y.len()).pop().expect("logits");
    let right = (0..y.len())
        .filter(|&s| {
            let row = &logits[s * 10..(s + 1) * 10];
            let best = (0..10)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .expect("10 classes");
            best == y[s]
        })
        .count();
    right as f32 / y.len() as f32
}

/// Gradients in plain vectors (the one-process reference).
pub(crate) struct Local(pub(crate) Vec<Vec<f32>>);

impl GradSink for Local {
    fn grad(&mut self, param: usize) -> &mut [f32] {
        &mut self.0[param]
    }

    fn ready(&mut self, _: usize) {}
}
