//! Two-level collectives across hosts (decision 0033): how a
//! communicator's members form hosts, each host's group and each
//! cross-host group, and whether two levels beat the flat schedule, by a
//! latency/bandwidth model with separate within-host and between-host
//! costs (the role of NCCL's `graph/tuning.cc`).
//!
//! A two-level all-reduce of S bytes on N hosts of k ranks reduce-scatters
//! within each host, all-reduces each local rank's S/k shard across hosts
//! (k independent groups, one per local rank, side by side on the NIC),
//! and all-gathers within each host. Each host's link then carries
//! 2(N-1)/N S each way against a flat ring's 2(p-1)/p S, in 2(N-1)
//! between-host steps against 2(p-1).
//!
//! Pure: every rank computes the same answer from what every rank agrees
//! on (the members' hosts, the op's size, shared settings).

/// A communicator's members laid out as N hosts of k ranks each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Hosts, in order of their first member.
    pub hosts: usize,
    /// Members on each host (every host has as many).
    pub per_host: usize,
    /// `by_host[h * per_host + l]`: the member that is local rank `l` of
    /// host `h` (local ranks in member order).
    by_host: Vec<usize>,
    /// Each member's (host, local rank).
    place: Vec<(usize, usize)>,
    /// [`Grid::ring_crossings`], counted once.
    crossings: usize,
}

impl Grid {
    /// The grid of members whose hosts are `host_of` (any numbering, the
    /// same on every rank), if there are at least two hosts, each with the
    /// same number of members, at least two. Anything else runs flat: the
    /// shard a local rank carries across hosts must mean the same on every
    /// host.
    pub fn of(host_of: &[u32]) -> Option<Grid> {
        let mut order: Vec<u32> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        for (member, &host) in host_of.iter().enumerate() {
            match order.iter().position(|&h| h == host) {
                Some(h) => members[h].push(member),
                None => {
                    order.push(host);
                    members.push(vec![member]);
                }
            }
        }
        let per_host = members.first()?.len();
        if members.len() < 2 || per_host < 2 || members.iter().any(|m| m.len() != per_host) {
            return None;
        }
        let mut place = vec![(0, 0); host_of.len()];
        for (h, on_host) in members.iter().enumerate() {
            for (l, &m) in on_host.iter().enumerate() {
                place[m] = (h, l);
            }
        }
        let mut grid = Grid {
            hosts: members.len(),
            per_host,
            by_host: members.concat(),
            place,
            crossings: 0,
        };
        grid.crossings = grid.count_ring_crossings();
        Some(grid)
    }

    /// The member that is local rank `local` of host `host`.
    pub fn member(&self, host: usize, local: usize) -> usize {
        self.by_host[host * self.per_host + local]
    }

    /// Member `member`'s host and local rank.
    pub fn place(&self, member: usize) -> (usize, usize) {
        self.place[member]
    }

    /// The members of `member`'s host, by local rank.
    pub fn host_group(&self, member: usize) -> &[usize] {
        let (h, _) = self.place[member];
        &self.by_host[h * self.per_host..(h + 1) * self.per_host]
    }

    /// The members with `member`'s local rank, one per host, by host.
    pub fn cross_group(&self, member: usize) -> Vec<usize> {
        let (_, l) = self.place[member];
        (0..self.hosts)
            .map(|h| self.by_host[h * self.per_host + l])
            .collect()
    }

    /// The most ring edges (member r to r+1, wrapping) that leave any one
    /// host: the flows a flat ring puts on that host's link each step.
    pub fn ring_crossings(&self) -> usize {
        self.crossings
    }

    fn count_ring_crossings(&self) -> usize {
        let p = self.place.len();
        let mut leaving = vec![0usize; self.hosts];
        for r in 0..p {
            let (from, _) = self.place[r];
            let (to, _) = self.place[(r + 1) % p];
            if from != to {
                leaving[from] += 1;
            }
        }
        leaving.into_iter().max().unwrap_or(0)
    }
}

/// What moving data costs, within a host and between hosts: a latency per
/// step and a rate per link (one direction).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Microseconds per step between two ranks of a host.
    pub intra_step_us: f64,
    /// Bytes per microsecond one rank moves to another of its host.
    pub intra_bytes_per_us: f64,
    /// Microseconds per step between hosts.
    pub inter_step_us: f64,
    /// Bytes per microsecond a host's link carries each way, shared by
    /// every flow on it.
    pub inter_bytes_per_us: f64,
    /// Microseconds each op costs (a two-level all-reduce runs three per
    /// piece where a flat one runs one).
    pub phase_us: f64,
}

impl Costs {
    /// The defaults: shared memory within a host (measured: 1-3 us per
    /// small op, several GB/s per rank, docs/perf.md), a TCP link of
    /// `inter_gbps` gigabits per second with 25 us per step between hosts
    /// (loopback TCP's round trip here is 15-30 us; data-centre hops add
    /// 5-50 us).
    pub fn with_link_gbps(inter_gbps: f64) -> Costs {
        Costs {
            intra_step_us: 2.0,
            intra_bytes_per_us: 10_000.0,
            inter_step_us: 25.0,
            inter_bytes_per_us: inter_gbps * 1e9 / 8.0 / 1e6,
            phase_us: 3.0,
        }
    }
}

fn log2_ceil(n: usize) -> f64 {
    n.next_power_of_two().trailing_zeros() as f64
}

/// Estimated microseconds of a flat all-reduce of `bytes` over the grid's
/// members: the faster of a ring (2(p-1) steps, `ring_crossings` flows on
/// the busiest host link) and recursive doubling (log2 p rounds of the
/// whole buffer, log2 N of them between hosts, where all k ranks of a
/// host send at once).
pub fn flat_all_reduce_us(grid: &Grid, bytes: usize, c: &Costs) -> f64 {
    let p = (grid.hosts * grid.per_host) as f64;
    let s = bytes as f64;
    let flows = grid.ring_crossings().max(1) as f64;
    let ring = 2.0 * (p - 1.0) * (c.inter_step_us + flows * (s / p) / c.inter_bytes_per_us);
    let inter_rounds = log2_ceil(grid.hosts);
    let intra_rounds = (log2_ceil(grid.hosts * grid.per_host) - inter_rounds).max(0.0);
    let k = grid.per_host as f64;
    let doubling = inter_rounds * (c.inter_step_us + k * s / c.inter_bytes_per_us)
        + intra_rounds * (c.intra_step_us + s / c.intra_bytes_per_us);
    ring.min(doubling)
}

/// Two-level ops of at least twice this many bytes run in pieces of about
/// this size, pipelined: a piece's op across hosts runs while the host's
/// ops of the pieces around it do, so the link is not idle during the
/// host's phases (all-reduce, reduce-scatter, all-gather).
pub const PIECE_BYTES: usize = 4 << 20;

/// Pieces at most, so a huge op's pieces stay large.
pub const MAX_PIECES: usize = 16;

/// How many pieces a two-level all-reduce of `bytes` runs in.
pub fn pieces(bytes: usize) -> usize {
    (bytes / PIECE_BYTES).clamp(1, MAX_PIECES)
}

/// Estimated microseconds of the two-level all-reduce: a reduce-scatter
/// and an all-gather within each host (ring-like: k-1 steps, (k-1)/k of
/// the buffer each), and between them k side-by-side all-reduces of S/k
/// across hosts (ring or doubling), three ops' overhead per piece less
/// the flat op's one. In
/// pieces, the host's phases and the link's overlap: the slower of the
/// two sets the pace, plus one piece of the other.
pub fn two_level_all_reduce_us(grid: &Grid, bytes: usize, c: &Costs) -> f64 {
    let (n, k) = (grid.hosts as f64, grid.per_host as f64);
    let parts = pieces(bytes) as f64;
    let s = bytes as f64 / parts;
    let within = 2.0 * (k - 1.0) * (c.intra_step_us + (s / k) / c.intra_bytes_per_us);
    // k groups share the link: each moves S/k, so together S.
    let ring = 2.0 * (n - 1.0) * (c.inter_step_us + (s / n) / c.inter_bytes_per_us);
    let doubling = log2_ceil(grid.hosts) * (c.inter_step_us + s / c.inter_bytes_per_us);
    let across = ring.min(doubling);
    (3.0 * parts - 1.0) * c.phase_us + within.max(across) * parts + within.min(across)
}

/// Whether an all-reduce of `bytes` runs in two levels on this grid.
pub fn two_level_all_reduce_pays(grid: &Grid, bytes: usize, c: &Costs) -> bool {
    two_level_all_reduce_us(grid, bytes, c) < flat_all_reduce_us(grid, bytes, c)
}

/// Estimated microseconds of a flat reduce-scatter or all-gather moving
/// `bytes` in all (the reduce-scatter's input, the all-gather's output):
/// a ring of p-1 steps of S/p, `ring_crossings` flows on the busiest host
/// link.
pub fn flat_half_us(grid: &Grid, bytes: usize, c: &Costs) -> f64 {
    let p = (grid.hosts * grid.per_host) as f64;
    let flows = grid.ring_crossings().max(1) as f64;
    (p - 1.0) * (c.inter_step_us + flows * (bytes as f64 / p) / c.inter_bytes_per_us)
}

/// Estimated microseconds of a two-level reduce-scatter or all-gather of
/// `bytes` in all: one within the host (k-1 steps of S/k), one across
/// hosts (N-1 steps; k groups side by side, S/N on the link each step),
/// a copy of the whole buffer (blocks reordered between host-major and
/// rank order), two ops' overhead per piece less the flat op's one; in
/// pieces the host's part
/// and the link's overlap, as in the all-reduce.
pub fn two_level_half_us(grid: &Grid, bytes: usize, c: &Costs) -> f64 {
    let (n, k) = (grid.hosts as f64, grid.per_host as f64);
    let parts = pieces(bytes) as f64;
    let s = bytes as f64 / parts;
    let within =
        (k - 1.0) * (c.intra_step_us + (s / k) / c.intra_bytes_per_us) + s / c.intra_bytes_per_us;
    let across = (n - 1.0) * (c.inter_step_us + (s / n) / c.inter_bytes_per_us);
    (2.0 * parts - 1.0) * c.phase_us + within.max(across) * parts + within.min(across)
}

/// Whether a reduce-scatter or all-gather moving `bytes` in all runs in
/// two levels on this grid.
pub fn two_level_half_pays(grid: &Grid, bytes: usize, c: &Costs) -> bool {
    two_level_half_us(grid, bytes, c) < flat_half_us(grid, bytes, c)
}

/// The most flows any host's link carries in one round of a flat
/// broadcast from `root`, per round: the binomial tree's rounds
/// (`algo::broadcast_tree`: the root sends to p/2 first, then p/4, ...),
/// or the chain's one long round (root, root+1, ...).
fn broadcast_crossings(grid: &Grid, root: usize, tree: bool) -> Vec<usize> {
    let p = grid.place.len();
    let real = |v: usize| (v + root) % p;
    let busiest = |edges: &mut dyn Iterator<Item = (usize, usize)>| {
        let mut leaving = vec![0usize; grid.hosts];
        for (from, to) in edges {
            let (a, b) = (grid.place[real(from)].0, grid.place[real(to)].0);
            if a != b {
                leaving[a] += 1;
            }
        }
        leaving.into_iter().max().unwrap_or(0)
    };
    if !tree {
        return vec![busiest(&mut (0..p - 1).map(|v| (v, v + 1)))];
    }
    let top = p.next_power_of_two();
    std::iter::successors(Some(top >> 1), |m| Some(m >> 1))
        .take_while(|&m| m > 0)
        .map(|m| {
            busiest(
                &mut (0..p)
                    .step_by(2 * m)
                    .filter(|v| v + m < p)
                    .map(|v| (v, v + m)),
            )
        })
        .collect()
}

/// Estimated microseconds of a flat broadcast of `bytes` from `root`: the
/// faster of the binomial tree (each round a step within the host, or one
/// between hosts carrying the buffer once per flow on the busiest link)
/// and the pipelined chain (p-1 steps, the buffer once per flow on the
/// busiest link).
pub fn flat_broadcast_us(grid: &Grid, root: usize, bytes: usize, c: &Costs) -> f64 {
    let s = bytes as f64;
    let p = grid.place.len() as f64;
    let tree: f64 = broadcast_crossings(grid, root, true)
        .into_iter()
        .map(|flows| match flows {
            0 => c.intra_step_us + s / c.intra_bytes_per_us,
            f => c.inter_step_us + f as f64 * s / c.inter_bytes_per_us,
        })
        .sum();
    let flows = broadcast_crossings(grid, root, false)[0].max(1) as f64;
    let chain = (p - 1.0) * c.inter_step_us + flows * s / c.inter_bytes_per_us;
    tree.min(chain)
}

/// Estimated microseconds of the two-level broadcast: across hosts among
/// the root's local rank's group (tree or chain), then within each host
/// (tree or chain), one op's overhead more than flat.
pub fn two_level_broadcast_us(grid: &Grid, bytes: usize, c: &Costs) -> f64 {
    let s = bytes as f64;
    let (n, k) = (grid.hosts, grid.per_host);
    let level = |ranks: usize, step: f64, rate: f64| {
        let tree = log2_ceil(ranks) * (step + s / rate);
        let chain = (ranks - 1) as f64 * step + s / rate;
        tree.min(chain)
    };
    c.phase_us
        + level(n, c.inter_step_us, c.inter_bytes_per_us)
        + level(k, c.intra_step_us, c.intra_bytes_per_us)
}

/// Whether a broadcast of `bytes` from `root` runs in two levels.
pub fn two_level_broadcast_pays(grid: &Grid, root: usize, bytes: usize, c: &Costs) -> bool {
    two_level_broadcast_us(grid, bytes, c) < flat_broadcast_us(grid, root, bytes, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Free steps, a free host, a link of one byte per microsecond: time
    /// is the link's bytes.
    const LINK_ONLY: Costs = Costs {
        intra_step_us: 0.0,
        intra_bytes_per_us: f64::INFINITY,
        inter_step_us: 0.0,
        inter_bytes_per_us: 1.0,
        phase_us: 0.0,
    };

    #[test]
    fn a_grid_needs_two_hosts_of_equal_size_two_or_more() {
        assert_eq!(Grid::of(&[0, 0, 0, 0]), None, "one host");
        assert_eq!(Grid::of(&[0, 1, 2, 3]), None, "one rank per host");
        assert_eq!(Grid::of(&[0, 0, 1, 1, 1]), None, "uneven hosts");
        assert_eq!(Grid::of(&[]), None);
        let g = Grid::of(&[7, 7, 3, 3]).unwrap();
        assert_eq!((g.hosts, g.per_host), (2, 2));
    }

    #[test]
    fn groups_follow_hosts_in_order_of_their_first_member() {
        // Hosts interleaved: members 0, 2, 4 on host "5"; 1, 3, 5 on "9".
        let g = Grid::of(&[5, 9, 5, 9, 5, 9]).unwrap();
        assert_eq!((g.hosts, g.per_host), (2, 3));
        assert_eq!(g.host_group(4), &[0, 2, 4]);
        assert_eq!(g.host_group(3), &[1, 3, 5]);
        assert_eq!(g.place(3), (1, 1));
        assert_eq!(g.cross_group(2), vec![2, 3]);
        assert_eq!(g.cross_group(5), vec![4, 5]);
        assert_eq!((g.member(0, 2), g.member(1, 0)), (4, 1));
        // Every member is in exactly one group of each kind, and a host
        // group and a cross group meet in exactly one member.
        for m in 0..6 {
            assert!(g.host_group(m).contains(&m));
            assert!(g.cross_group(m).contains(&m));
            for other in 0..6 {
                let both = g
                    .host_group(m)
                    .iter()
                    .filter(|x| g.cross_group(other).contains(x))
                    .count();
                assert_eq!(both, 1, "host of {m}, cross group of {other}");
            }
        }
    }

    #[test]
    fn ring_crossings_count_the_busiest_hosts_flows() {
        // Contiguous: one edge leaves each host.
        assert_eq!(Grid::of(&[0, 0, 1, 1]).unwrap().ring_crossings(), 1);
        // Interleaved: every edge crosses, two leave each host.
        assert_eq!(Grid::of(&[0, 1, 0, 1]).unwrap().ring_crossings(), 2);
    }

    #[test]
    fn large_ops_run_in_two_levels_where_the_link_is_slower_than_the_host() {
        // 10 Gb/s against 10 GB/s within a host. (At 25 Gb/s 4 hosts of 8
        // keep 256 MiB flat: the two extra phases within the host, not
        // overlapped with the link, cost more than the link saves.)
        let c = Costs::with_link_gbps(10.0);
        for hosts in [vec![0, 0, 1, 1], vec![0, 0, 0, 0, 1, 1, 1, 1], {
            (0..32).map(|r| r / 8).collect()
        }] {
            let g = Grid::of(&hosts).unwrap();
            assert!(!two_level_all_reduce_pays(&g, 8, &c), "8 B on {hosts:?}");
            for bytes in [16 << 20, 256 << 20] {
                assert!(
                    two_level_all_reduce_pays(&g, bytes, &c),
                    "{bytes} B on {hosts:?}"
                );
            }
        }
    }

    #[test]
    fn two_levels_send_less_over_the_link_than_a_flat_ring() {
        // With free steps and a free host, time is the link's bytes: the
        // flat ring's 2(p-1)/p S against two levels' 2(N-1)/N S.
        let c = LINK_ONLY;
        let g = Grid::of(&[0, 0, 1, 1]).unwrap();
        let s = 1 << 20;
        assert_eq!(flat_all_reduce_us(&g, s, &c), 1.5 * s as f64);
        assert_eq!(two_level_all_reduce_us(&g, s, &c), s as f64);
        // 4 hosts of 8: 62/32 S against 6/4 S.
        let g = Grid::of(&(0..32).map(|r| r / 8).collect::<Vec<_>>()).unwrap();
        assert_eq!(flat_all_reduce_us(&g, s, &c), 62.0 / 32.0 * s as f64);
        assert_eq!(two_level_all_reduce_us(&g, s, &c), 1.5 * s as f64);
    }

    #[test]
    fn pieces_overlap_the_hosts_phases_with_the_link() {
        let c = Costs::with_link_gbps(10.0);
        let g = Grid::of(&[0, 0, 1, 1]).unwrap();
        // Below two pieces the phases add up; from there the host's
        // phases hide behind the link's (here the slower) but one piece.
        assert_eq!(pieces(PIECE_BYTES - 1), 1);
        assert_eq!(pieces(64 << 20), 16);
        assert_eq!(pieces(1 << 30), MAX_PIECES);
        let per_byte = |bytes: usize| two_level_all_reduce_us(&g, bytes, &c) / bytes as f64;
        let link_only = 1.0 / c.inter_bytes_per_us;
        assert!(per_byte(PIECE_BYTES - 1) > 1.1 * link_only);
        assert!(per_byte(64 << 20) < 1.1 * link_only);
    }

    #[test]
    fn reduce_scatter_and_all_gather_go_in_two_levels() {
        // Small: N-1 between-host steps against p-1 (1 against 3 at 2
        // hosts of 2). Large: (N-1)/N of the buffer on the link against
        // (p-1)/p.
        let c = Costs::with_link_gbps(10.0);
        for hosts in [vec![0, 0, 1, 1], (0..32).map(|r| r / 8).collect()] {
            let g = Grid::of(&hosts).unwrap();
            assert!(two_level_half_pays(&g, 64, &c), "64 B on {hosts:?}");
            assert!(two_level_half_pays(&g, 64 << 20, &c), "64 MiB on {hosts:?}");
        }
        // Where a host's steps cost more than the link's, small ones stay
        // flat.
        let slow_host = Costs {
            intra_step_us: 40.0,
            phase_us: 15.0,
            ..c
        };
        let g = Grid::of(&[0, 0, 1, 1]).unwrap();
        assert!(!two_level_half_pays(&g, 64, &slow_host));
        // The link's bytes alone: (p-1)/p S flat against (N-1)/N S.
        let free = LINK_ONLY;
        let g = Grid::of(&[0, 0, 1, 1]).unwrap();
        assert_eq!(flat_half_us(&g, 1 << 20, &free), 0.75 * (1 << 20) as f64);
        assert_eq!(
            two_level_half_us(&g, 1 << 20, &free),
            0.5 * (1 << 20) as f64
        );
    }

    #[test]
    fn broadcast_goes_in_two_levels_where_the_flat_one_crosses_hosts_more() {
        let c = Costs::with_link_gbps(10.0);
        // Hosts contiguous: the tree's first round is the only one across
        // (0 -> 2), the chain crosses once: flat is already two levels.
        let g = Grid::of(&[0, 0, 1, 1]).unwrap();
        assert_eq!(broadcast_crossings(&g, 0, true), vec![1, 0]);
        assert_eq!(broadcast_crossings(&g, 0, false), vec![1]);
        for bytes in [8, 64 << 10, 64 << 20] {
            assert!(!two_level_broadcast_pays(&g, 0, bytes, &c), "{bytes} B");
        }
        // Placed cyclically: the tree's last round sends two flows over
        // host 0's link, the chain crosses at every step.
        let g = Grid::of(&[0, 1, 0, 1]).unwrap();
        assert_eq!(broadcast_crossings(&g, 0, true), vec![0, 2]);
        assert_eq!(broadcast_crossings(&g, 1, false), vec![2]);
        let g = Grid::of(&[0, 1, 2, 3, 0, 1, 2, 3]).unwrap();
        assert_eq!(broadcast_crossings(&g, 0, true), vec![0, 2, 2]);
        for bytes in [64 << 10, 64 << 20] {
            assert!(two_level_broadcast_pays(&g, 0, bytes, &c), "{bytes} B");
        }
    }

    #[test]
    fn a_slow_host_and_a_fast_link_keep_mid_sizes_flat() {
        // Within-host copies slower than the link: the two extra phases
        // cost more than the link saves.
        let c = Costs {
            intra_bytes_per_us: 500.0,
            ..Costs::with_link_gbps(400.0)
        };
        let g = Grid::of(&[0, 0, 1, 1]).unwrap();
        assert!(!two_level_all_reduce_pays(&g, 4 << 20, &c));
    }

    #[test]
    fn many_hosts_of_many_ranks_save_between_host_steps_at_mid_sizes() {
        // 4 hosts of 8 at 256 KiB: 62 between-host steps against 6.
        let c = Costs::with_link_gbps(100.0);
        let g = Grid::of(&(0..32).map(|r| r / 8).collect::<Vec<_>>()).unwrap();
        let flat = flat_all_reduce_us(&g, 256 << 10, &c);
        let two = two_level_all_reduce_us(&g, 256 << 10, &c);
        assert!(two < flat / 2.0, "two levels {two} us, flat {flat} us");
    }
}
