//! [`World`]: what every communicator of one process shares, made once by
//! rendezvous and read by the communicators, their metrics and the
//! algorithm choice (the facts every rank agreed on).

use crate::algo::select::Shape;
use crate::store::{Store, StoreServer};
use crate::transport::Transport;

/// What every communicator of one process shares: its place in the world,
/// the links, and (on rank 0) the store it hosts.
pub(crate) struct World {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) job_id: u64,
    pub(crate) transport: Box<dyn Transport>,
    /// The rendezvous store, kept for failure reports ("who has not
    /// arrived"), with this job's key prefix.
    pub(crate) store: Option<(Box<dyn Store>, String)>,
    /// The store this rank hosts (rank 0 unless a store runs apart),
    /// kept alive as long as any communicator is (never read).
    #[allow(dead_code)]
    pub(crate) hosted_store: Option<StoreServer>,
    /// The core index this rank's polling threads move to when they find
    /// their core shared (`ringwire_uring::poll_yield`): the local rank
    /// (modulo the usable cores), when the launcher says how many ranks
    /// share this host.
    pub(crate) home_core: Option<usize>,
    /// This process's local rank and local world size, as the launcher or
    /// `Builder::local_ranks` gave them.
    pub(crate) local: Option<(usize, usize)>,
    /// This host's ranks outnumber its usable cores: homes then hold for
    /// small ops only (see `comm::execute`).
    pub(crate) crowded: bool,
    /// Some host of the job is crowded (agreed by every rank at
    /// rendezvous): small all-reduces then run as a tree reduce and
    /// broadcast, not recursive doubling (decision 0013).
    pub(crate) crowded_anywhere: bool,
    /// Some rank of the job links some peer over TCP (another host, local
    /// links set to TCP, or TLS; agreed by every rank at rendezvous):
    /// mid-size all-reduces then run halving-doubling (decision 0022).
    pub(crate) tcp_anywhere: bool,
    /// Every rank of the job has an arena (`crate::arena`; agreed at
    /// rendezvous): a communicator whose members share one host may run
    /// its small collectives there, once its members voted.
    pub(crate) arena_everywhere: bool,
    /// What this rank published of its Unix listener (host identity and
    /// name), to tell whether a replacement runs on this host (decision
    /// 0040).
    pub(crate) local_name: Option<String>,
    /// Which world ranks this rank reaches over Unix sockets (this host).
    pub(crate) local_ranks: Vec<bool>,
    /// Each world rank's host, numbered from 0 in order of first rank
    /// (boot id and network namespace, or `Builder::host_id`; the same on
    /// every rank): two-level collectives group by it (decision 0033).
    pub(crate) hosts: Vec<u32>,
    /// The slowest link rate any rank's interface reports (Gb/s; agreed
    /// at rendezvous), else `DEFAULT_INTER_HOST_GBPS`: the two-level cost
    /// model's, unless RINGWIRE_INTER_HOST_GBPS says.
    pub(crate) inter_host_gbps: f64,
}

impl World {
    /// The shape algorithm choices depend on, for a communicator of
    /// `ranks` ranks of this world (facts every rank agreed on at
    /// rendezvous, and the shared small-message threshold).
    pub(crate) fn shape(&self, ranks: usize, small_message_bytes: usize) -> Shape {
        Shape {
            ranks,
            crowded_anywhere: self.crowded_anywhere,
            tcp_anywhere: self.tcp_anywhere,
            small_message_bytes,
        }
    }
}
