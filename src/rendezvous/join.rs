//! The rendezvous itself, once a [`Builder`] is resolved: find the store,
//! claim a rank, publish this rank's listen addresses and host, learn every
//! other rank's, number the hosts, and start the transport over the links
//! (the module above says what each step guarantees).

use super::{Builder, StoreAddr};
use crate::config::{LocalLinks, TransportKind, Tunables};
use crate::env::StoreKind;
use crate::error::Error;
use crate::net;
use crate::security::Security;
use crate::slots::JobKeys;
use crate::store::{Store, StoreClient, StoreError, StoreServer, TcpStoreClient};
use crate::transport::Transport;
use crate::transport::engine_cores::engine_thread_cores;
use crate::transport::mesh::{LocalPeers, Mesh, MeshConfig};
use crate::world::World;
use ringwire_uring::usable_core_ids;
use std::net::SocketAddr;
use std::time::Duration;

fn store_err(e: StoreError, what: &str) -> Error {
    match e {
        StoreError::Timeout { .. } => Error::Rendezvous(format!("{what}: {e}")),
        other => Error::Store(other),
    }
}

pub(super) fn rendezvous(
    b: &Builder,
    rank: usize,
    size: usize,
    t: &Tunables,
    sec: &Security,
) -> Result<World, Error> {
    // Connections refused from now on are named in a timeout's error.
    let started = std::time::Instant::now();
    let addrs = match &b.store {
        Some(StoreAddr::Resolved(a)) => vec![*a],
        Some(StoreAddr::HostPort(host, port)) => net::resolve(host, *port)?,
        None if size == 1 => {
            // One rank and no store: nothing to meet.
            let listener = net::bind_listener("127.0.0.1".parse().expect("literal"))?;
            let cores = engine_thread_cores(t.engine_threads, 0, 1, &usable_core_ids());
            let transport =
                start_transport(listener, None, 0, 0, Vec::new(), Vec::new(), t, sec, cores)?;
            return Ok(World {
                rank,
                size,
                job_id: 0,
                transport,
                store: None,
                hosted_store: None,
                home_core: None,
                local: None,
                crowded: false,
                crowded_anywhere: false,
                tcp_anywhere: false,
                arena_everywhere: false,
                local_name: None,
                local_ranks: vec![false],
                hosts: vec![0],
                inter_host_gbps: crate::config::DEFAULT_INTER_HOST_GBPS,
            });
        }
        None => {
            return Err(Error::Rendezvous(
                "no store address: call Builder::store or set MASTER_ADDR and MASTER_PORT".into(),
            ));
        }
    };
    let torch = b.store_kind == StoreKind::Torch;
    let store = if rank == 0 && !torch && b.host_store.unwrap_or(true) {
        let mut last = None;
        let mut server = None;
        for a in &addrs {
            match StoreServer::bind_with(*a, sec.clone()) {
                Ok(s) => {
                    server = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        match (server, last) {
            (Some(s), _) => Some(s),
            (None, Some(e)) => {
                let advice = match (&b.master_from, &b.attempt) {
                    (Some(from), _) => from.clone(),
                    (None, Some(_)) => {
                        "Under torchrun, whose agent hosts a TCPStore on MASTER_PORT, leave \
                                        RINGWIRE_STORE unset or set it to torch to join that store"
                            .into()
                    }
                    (None, None) => {
                        "Is MASTER_PORT in use by another job? Pick a free MASTER_PORT, or point \
                                     MASTER_ADDR at this host's own address"
                            .into()
                    }
                };
                return Err(Error::Rendezvous(format!(
                    "rank 0 could not start the store on {addrs:?}: {e}. {advice}"
                )));
            }
            (None, None) => None,
        }
    } else {
        None
    };
    let mut client = connect_store(b, rank, &addrs, t, sec)?;
    let prefix = job_prefix(b, size);
    let key = |k: &str| format!("{prefix}{k}");

    // Claim the rank: a second process with the same rank finds it taken.
    let nonce = unique_u64() ^ (rank as u64).rotate_left(17);
    let claim = nonce.to_le_bytes();
    let owner = client.compare_set(&key(&format!("rank/{rank}")), b"", &claim)?;
    if owner != claim {
        let elastic = if b.attempt.is_some() {
            " Under torchrun this is also what a new round after a membership change sees when it \
             keeps the last round's restart count and world size: set RINGWIRE_JOB_ID per round"
        } else {
            ""
        };
        return Err(Error::Rendezvous(format!(
            "two processes claim rank {rank}: give each process a distinct RANK (or RINGWIRE_RANK / \
             OMPI_COMM_WORLD_RANK / SLURM_PROCID), or use a fresh RINGWIRE_JOB_ID when reusing a store.{elastic}"
        )));
    }
    // A rank that cannot join publishes why in place of its address, so
    // the others fail at once with the reason instead of timing out.
    let refuse = |why: String| {
        let _ = client.set(&key(&format!("addr/{rank}")), format!("!{why}").as_bytes());
        Error::Rendezvous(why)
    };
    if rank == 0 {
        // Where a replacement finds this job (decision 0040).
        let running = JobKeys::running(
            b.job.as_deref().unwrap_or("default"),
            b.attempt.as_ref().map(|a| a.run_id.as_str()),
        );
        client.set(&running, prefix.as_bytes())?;
        client.set(&key("job"), &nonce.to_le_bytes())?;
        client.set(&key("settings"), t.shared().as_bytes())?;
        client.set(&key("world_size"), size.to_string().as_bytes())?;
    }
    let root_size = client
        .get(&key("world_size"), t.connect_timeout)
        .map_err(|e| store_err(e, "waiting for rank 0 to join"))?;
    if root_size != size.to_string().as_bytes() {
        return Err(refuse(format!(
            "rank {rank} has WORLD_SIZE={size} but rank 0 has WORLD_SIZE={}: every rank needs the same world size",
            String::from_utf8_lossy(&root_size)
        )));
    }
    // Rank 0 set this before the world size just read, so it is there
    // unless rank 0 runs a ringwire that does not publish it.
    let root_settings = client.try_get(&key("settings"))?.unwrap_or_default();
    if let Some(why) = t.disagreement(rank, &String::from_utf8_lossy(&root_settings)) {
        return Err(refuse(why));
    }

    let unix_links = t.local_links != LocalLinks::Tcp && sec.tls.is_none();
    let published = listen_and_publish(b, &*client, rank, &addrs, unix_links, &|what| {
        key(&format!("{what}/{rank}"))
    })?;
    let (listener, local, listen) = (published.listener, published.local, published.listen);
    let local_name = local.as_ref().map(|(_, name)| name.clone());
    let mut peers = Vec::with_capacity(size);
    let mut local_peers = Vec::with_capacity(size);
    let mut host_names: Vec<Vec<u8>> = Vec::with_capacity(size);
    let mut slowest_link: Option<f64> = None;
    for q in 0..size {
        let raw = client.get(&key(&format!("addr/{q}")), t.connect_timeout).map_err(|e| match e {
            StoreError::Timeout { .. } => Error::Rendezvous(format!(
                "rank {q} did not join within {:?}: it never published its address to the store at {}. \
                 Check that it started, and that it uses the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE{}",
                t.connect_timeout,
                client.server_addr(),
                crate::refusals::suffix_since(started)
            )),
            other => Error::Store(other),
        })?;
        let text = String::from_utf8_lossy(&raw);
        if let Some(why) = text.strip_prefix('!') {
            return Err(Error::Rendezvous(format!(
                "rank {q} could not join, so neither can this rank: {why}"
            )));
        }
        let addr: SocketAddr = text
            .parse()
            .map_err(|_| Error::Rendezvous(format!("rank {q} published a bad address {text:?}")))?;
        peers.push(addr);
        // Absent only from a ringwire that does not publish it: a host of
        // its own.
        host_names.push(
            client
                .try_get(&key(&format!("host/{q}")))?
                .unwrap_or_else(|| format!("rank {q}").into_bytes()),
        );
        let gbps = client
            .try_get(&key(&format!("gbps/{q}")))?
            .unwrap_or_default();
        if let Some(g) = std::str::from_utf8(&gbps)
            .ok()
            .and_then(|g| g.parse::<f64>().ok())
        {
            slowest_link = Some(slowest_link.map_or(g, |s: f64| s.min(g)));
        }
        let local_peer = match (&local, q == rank) {
            (Some((_, mine)), false) => client
                .try_get(&key(&format!("local/{q}")))?
                .and_then(|theirs| net::same_host_unix_addr(mine, &theirs)),
            _ => None,
        };
        local_peers.push(local_peer);
    }
    let job = client.get(&key("job"), t.connect_timeout)?;
    let job_id = u64::from_le_bytes(
        job.try_into()
            .map_err(|_| Error::Rendezvous("bad job id in the store".into()))?,
    );
    let tcp_links = (0..size).any(|q| q != rank && local_peers[q].is_none());
    let local_ranks: Vec<bool> = local_peers.iter().map(Option::is_some).collect();
    let crowded = b
        .local
        .is_some_and(|(_, on_host)| on_host > ringwire_uring::usable_cores());
    // Whether this host runs more ranks than it has cores, by the
    // launcher's count or the ranks found here: its waits should not spin.
    let found_here = 1 + local_peers.iter().flatten().count();
    let local = local.map(|(listener, _)| LocalPeers {
        listener,
        peers: local_peers,
        crowded: crowded || found_here > ringwire_uring::usable_cores(),
    });
    // Engine threads' cores: after those of the ranks found here (by the
    // launcher's count where it gave one).
    let (local_rank, on_host) = b.local.unwrap_or_else(|| {
        let before = local
            .as_ref()
            .map_or(0, |l| l.peers[..rank].iter().flatten().count());
        (before, found_here)
    });
    let cores = engine_thread_cores(t.engine_threads, local_rank, on_host, &usable_core_ids());
    let transport = start_transport(
        listener,
        local,
        rank,
        job_id,
        peers,
        Vec::new(),
        t,
        sec,
        cores,
    )?;

    // Whether some host is crowded, counted before the barrier so every
    // rank reads the same total after it: the algorithms it selects must
    // match on every rank.
    if crowded {
        client.add(&key("crowded_ranks"), 1)?;
    }
    // Likewise whether any link of the job is TCP: this rank's are where it
    // has no Unix address for the peer (both ends see a link alike).
    if tcp_links {
        client.add(&key("tcp_ranks"), 1)?;
    }
    // And whether every rank has an arena (its local links run on shared
    // memory and it could make one): communicators of one host then vote
    // on using it (comm/arena.rs), which every member must do alike.
    if transport.arena().is_some() {
        client.add(&key("arena_ranks"), 1)?;
    }

    // Store barrier: nobody leaves setup until everyone has every address.
    client.set(&key(&format!("ready/{rank}")), b"1")?;
    let ready: Vec<String> = (0..size).map(|q| key(&format!("ready/{q}"))).collect();
    let ready_refs: Vec<&str> = ready.iter().map(String::as_str).collect();
    if let Err(e) = client.wait(&ready_refs, t.connect_timeout) {
        let missing: Vec<usize> = (0..size)
            .filter(|&q| !matches!(client.try_get(&ready[q]), Ok(Some(_))))
            .collect();
        return Err(match e {
            StoreError::Timeout { .. } => Error::Rendezvous(format!(
                "ranks {missing:?} did not finish setup within {:?}{}",
                t.connect_timeout,
                crate::refusals::suffix_since(started)
            )),
            other => Error::Store(other),
        });
    }
    let crowded_anywhere = client.add(&key("crowded_ranks"), 0)? > 0;
    let tcp_anywhere = client.add(&key("tcp_ranks"), 0)? > 0;
    let arena_everywhere = client.add(&key("arena_ranks"), 0)? == size as i64;
    tracing::debug!(rank, %listen, "rendezvous complete");
    // Kept for failure reports only: a store that went away with its host
    // must not hold a failing op for a minute.
    client.set_reply_timeout(Duration::from_secs(2));
    Ok(World {
        rank,
        size,
        job_id,
        transport,
        store: Some((client, prefix)),
        hosted_store: store,
        home_core: None,
        local: None,
        crowded,
        crowded_anywhere,
        tcp_anywhere,
        arena_everywhere,
        local_name,
        local_ranks,
        hosts: number_hosts(&host_names),
        inter_host_gbps: slowest_link.unwrap_or(crate::config::DEFAULT_INTER_HOST_GBPS),
    })
}

/// The store at `addrs`: a client of ringwire's own, or of PyTorch's
/// TCPStore.
pub(super) fn connect_store(
    b: &Builder,
    rank: usize,
    addrs: &[SocketAddr],
    t: &Tunables,
    sec: &Security,
) -> Result<Box<dyn Store>, Error> {
    if b.store_kind == StoreKind::Torch {
        if sec.secret.is_some() || sec.tls.is_some() {
            tracing::warn!(
                rank,
                "the PyTorch TCPStore has no authentication or encryption: the job secret and TLS protect \
                 ringwire's links, not the store"
            );
        }
        Ok(Box::new(TcpStoreClient::connect(addrs, t.connect_timeout)?))
    } else {
        Ok(Box::new(StoreClient::connect_with(
            addrs,
            t.connect_timeout,
            sec,
        )?))
    }
}

/// The prefix of the job's keys at the store.
pub(super) fn job_prefix(b: &Builder, size: usize) -> String {
    let mut prefix = format!("ringwire/{}/", b.job.as_deref().unwrap_or("default"));
    if let Some(attempt) = &b.attempt {
        // The world size too: torchrun restarts every worker when nodes
        // join or leave without counting a restart, and such a round has
        // another world size.
        prefix.push_str(&format!(
            "{}/attempt_{}/world_{size}/",
            attempt.run_id, attempt.restart_count
        ));
    }
    prefix
}

/// This process's listeners, and what it published of them.
pub(super) struct Published {
    pub(super) listener: std::net::TcpListener,
    pub(super) local: Option<(std::os::unix::net::UnixListener, String)>,
    pub(super) listen: SocketAddr,
}

/// Binds this process's listeners (TCP on the address the store's
/// peers reach it at, and Unix for peers on this host) and publishes
/// them, its host and its link rate under `key("local")`, `key("host")`,
/// `key("gbps")`, then `key("addr")`: whoever reads the address finds the
/// rest.
pub(super) fn listen_and_publish(
    b: &Builder,
    client: &dyn Store,
    rank: usize,
    store_addrs: &[SocketAddr],
    unix_links: bool,
    key: &dyn Fn(&str) -> String,
) -> Result<Published, Error> {
    let ip = net::choose_local_ip(b.socket_ifname.as_deref(), store_addrs)?;
    let listener = net::bind_listener(ip)?;
    let listen = listener
        .local_addr()
        .map_err(|e| Error::io("reading the listener address", e))?;
    let local = unix_links.then(|| local_listener(rank)).flatten();
    if let Some((_, published)) = &local {
        client.set(&key("local"), published.as_bytes())?;
    }
    // The host this rank counts as (two-level collectives, decision 0033).
    let host = b
        .host_id
        .clone()
        .or_else(host_identity)
        .unwrap_or_else(|| format!("rank {rank}"));
    client.set(&key("host"), host.as_bytes())?;
    // And the rate of the interface it listens on (empty: not known).
    let gbps = net::link_gbps(ip).map_or_else(String::new, |g| g.to_string());
    client.set(&key("gbps"), gbps.as_bytes())?;
    client.set(&key("addr"), listen.to_string().as_bytes())?;
    Ok(Published {
        listener,
        local,
        listen,
    })
}

/// Each rank's host as a number, hosts numbered in order of their first
/// rank: every rank reads the same names, so every rank numbers alike.
fn number_hosts(names: &[Vec<u8>]) -> Vec<u32> {
    let mut seen: Vec<&[u8]> = Vec::new();
    names
        .iter()
        .map(
            |name| match seen.iter().position(|s| *s == name.as_slice()) {
                Some(h) => h as u32,
                None => {
                    seen.push(name);
                    (seen.len() - 1) as u32
                }
            },
        )
        .collect()
}

/// What this process shares with the ranks its Unix sockets can reach:
/// the kernel (boot id) and the network namespace, whose abstract socket
/// names it can connect to.
fn host_identity() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let netns = std::fs::metadata("/proc/self/ns/net").ok()?;
    Some(format!("{}:{}:{}", boot.trim(), netns.dev(), netns.ino()))
}

/// A Unix listener for same-host peers, on a fresh abstract name (nothing
/// in the file system to clean up), and what to publish for it: the host
/// identity and the name. `None` (TCP for every peer) where there is no
/// identity or the bind fails.
fn local_listener(rank: usize) -> Option<(std::os::unix::net::UnixListener, String)> {
    use std::os::linux::net::SocketAddrExt;
    let identity = host_identity()?;
    let name = format!(
        "ringwire/{}/{rank}/{:016x}",
        std::process::id(),
        unique_u64()
    );
    let bound = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|addr| std::os::unix::net::UnixListener::bind_addr(&addr));
    match bound {
        Ok(listener) => Some((listener, format!("{identity} {name}"))),
        Err(e) => {
            tracing::debug!(rank, error = %e, "no unix listener; local links use TCP");
            None
        }
    }
}

#[allow(clippy::too_many_arguments)] // who this rank is, and how its transport runs
pub(super) fn start_transport(
    listener: std::net::TcpListener,
    local: Option<LocalPeers>,
    rank: usize,
    job_id: u64,
    peers: Vec<SocketAddr>,
    incarnations: Vec<u32>,
    t: &Tunables,
    sec: &Security,
    thread_cores: Vec<usize>,
) -> Result<Box<dyn Transport>, Error> {
    let (uring, why) = t.transport.choose(sec.tls.is_some())?;
    let name = if uring { "uring" } else { "portable" };
    tracing::info!(rank, transport = name, %why, "transport chosen");
    let config = MeshConfig {
        uring,
        uring_required: t.transport == TransportKind::Uring,
        spin: t.spin,
        lanes: t.tcp_lanes,
        engine_threads: t.engine_threads,
        thread_cores,
        shm: t.local_links == LocalLinks::Shm && sec.tls.is_none(),
        max_payload: t.max_frame_bytes,
        handshake_timeout: t.connect_timeout.min(Duration::from_secs(10)),
        write_timeout: t.timeout,
        socket_buffer: t.socket_buffer,
        security: sec.clone(),
        heartbeat_interval: crate::config::HEARTBEAT_INTERVAL.min(t.heartbeat_timeout / 4),
        heartbeat_timeout: t.heartbeat_timeout,
        run_ahead_limit: t.run_ahead_bytes,
        run_ahead_total_limit: t.run_ahead_total_bytes,
    };
    let peers = if peers.is_empty() {
        vec![
            listener
                .local_addr()
                .map_err(|e| Error::io("listener address", e))?,
        ]
    } else {
        peers
    };
    Mesh::start(listener, local, rank, job_id, peers, incarnations, config)
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .map_err(|e| Error::io(format!("starting the {name} transport"), e))
        .inspect(|t| {
            if t.name() != name {
                tracing::info!(rank, transport = t.name(), "transport running");
            }
        })
}

/// A number no other process is likely to pick: from the kernel's random
/// source, else the clock and the process id.
fn unique_u64() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}
