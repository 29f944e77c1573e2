//! All-to-all by pairwise exchange, barrier by dissemination, and
//! point-to-point send and receive.

use super::{Action, Step};

/// Pairwise all-to-all with per-peer counts. Work buffer: the input
/// (`sum(send_counts)` elements) followed by the output (`sum(recv_counts)`);
/// block j of the input goes to rank j, block j of the output comes from rank
/// j. In step k rank r sends to r+k and receives from r-k, so every step is a
/// perfect matching and no link carries two steps at once. This rank's own
/// block is a copy the caller makes.
pub fn all_to_all_v(
    out: &mut Vec<Step>,
    rank: usize,
    send_counts: &[usize],
    recv_counts: &[usize],
    chunk: usize,
) {
    let world = send_counts.len();
    debug_assert_eq!(world, recv_counts.len());
    // Block j of `counts`, placed after `base`.
    let block = |counts: &[usize], base: usize, j: usize| {
        let start = base + counts[..j].iter().sum::<usize>();
        start..start + counts[j]
    };
    let input_len: usize = send_counts.iter().sum();
    for k in 1..world {
        let to = (rank + k) % world;
        let from = (rank + world - k) % world;
        super::push_sends(out, to, block(send_counts, 0, to), chunk, k as u32);
        super::push_recvs(
            out,
            from,
            block(recv_counts, input_len, from),
            chunk,
            k as u32,
            Action::Copy,
        );
    }
}

#[cfg(any(test, feature = "internals"))]
/// Equal-split all-to-all (the tests' reference shape): `per_peer` elements to and from every rank.
pub fn all_to_all(out: &mut Vec<Step>, rank: usize, world: usize, per_peer: usize, chunk: usize) {
    let counts = vec![per_peer; world];
    all_to_all_v(out, rank, &counts, &counts, chunk);
}

/// Dissemination barrier: in round k rank r signals r+2^k and waits for
/// r-2^k; after ceil(log2 p) rounds every rank has transitively heard from
/// every other. Frames are empty (work buffer of length zero).
pub fn barrier(out: &mut Vec<Step>, rank: usize, world: usize) {
    let mut dist = 1;
    let mut round = 0;
    while dist < world {
        out.push(Step::Send {
            peer: (rank + dist) % world,
            range: 0..0,
            step: round,
            chunk: 0,
        });
        out.push(Step::Recv {
            peer: (rank + world - dist) % world,
            range: 0..0,
            step: round,
            chunk: 0,
            action: Action::Copy,
        });
        dist <<= 1;
        round += 1;
    }
}

/// Point-to-point send of `len` elements to `peer`.
pub fn send(out: &mut Vec<Step>, peer: usize, len: usize, chunk: usize) {
    super::push_sends(out, peer, 0..len, chunk, 0);
}

/// Point-to-point exchange (`send_recv`): `send_len` elements, the
/// schedule's read-only input, to `to`, then `recv_len` from `from` into
/// the work buffer after it. Its frames are numbered as [`send`]'s and
/// [`recv`]'s, so either side may be a plain send or receive. Sends come
/// first, so the exchange never waits on `from` before `to` has its data
/// (a peer that receives before it sends is served); the executor posts
/// the receives ahead, so on the uring plane they land in place while the
/// sends go.
pub fn exchange(
    out: &mut Vec<Step>,
    to: usize,
    send_len: usize,
    from: usize,
    recv_len: usize,
    chunk: usize,
) {
    super::push_sends(out, to, 0..send_len, chunk, 0);
    super::push_recvs(
        out,
        from,
        send_len..send_len + recv_len,
        chunk,
        0,
        Action::Copy,
    );
}

/// Point-to-point receive of `len` elements from `peer`.
pub fn recv(out: &mut Vec<Step>, peer: usize, len: usize, chunk: usize) {
    super::push_recvs(out, peer, 0..len, chunk, 0, Action::Copy);
}
