//! A replacement joins a running job (decision 0040): it finds the job at
//! the store, claims the next incarnation of its rank's slot, listens and
//! publishes where, says it waits, and waits until the members admit it
//! (`Communicator::admit`); then it starts its transport with every
//! member's place and makes the communicator the members made.

use super::join::{connect_store, job_prefix, listen_and_publish};
use super::{Builder, StoreAddr};
use crate::config::{LocalLinks, Tunables};
use crate::error::Error;
use crate::net;
use crate::security::Security;
use crate::slots::{Admission, JobKeys};
use crate::store::StoreError;
use crate::transport::mesh::LocalPeers;
use crate::world::World;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How often a replacement looks whether every member is ready to link.
const READY_POLL: Duration = Duration::from_millis(10);

/// Joins the running job as `rank`'s replacement: the world it shares with
/// the members, and what they told it.
pub(super) fn rejoin(
    b: &Builder,
    rank: usize,
    size: usize,
    t: &Tunables,
    sec: &Security,
) -> Result<(World, Admission), Error> {
    let addrs = match &b.store {
        Some(StoreAddr::Resolved(a)) => vec![*a],
        Some(StoreAddr::HostPort(host, port)) => net::resolve(host, *port)?,
        None => {
            return Err(Error::Rendezvous(
                "rejoining needs the store the job met at: call Builder::store or set \
                 MASTER_ADDR and MASTER_PORT"
                    .into(),
            ));
        }
    };
    let unreachable = |e: Error| {
        Error::Rendezvous(format!(
            "rank {rank} could not reach the job's store at {addrs:?} to rejoin: {e}. If the job's \
             store was ringwire's own on rank 0 (the default outside torchrun), it ended with \
             rank 0's process: a job whose ranks rejoin needs a store that outlives them \
             (`ringwire-store` with RINGWIRE_HOST_STORE=0 on the ranks, or torchrun's agent \
             store)"
        ))
    };
    let mut client = connect_store(b, rank, &addrs, t, sec).map_err(unreachable)?;
    let job = b.job.as_deref().unwrap_or("default");
    let running = JobKeys::running(job, b.attempt.as_ref().map(|a| a.run_id.as_str()));
    let prefix = match client.get(&running, t.connect_timeout) {
        Ok(p) => String::from_utf8_lossy(&p).into_owned(),
        Err(StoreError::Timeout { .. }) => {
            return Err(Error::Rendezvous(format!(
                "no job {job:?} runs at the store at {} (nothing under {running:?} within {:?}): \
                 rejoining needs the job's RINGWIRE_JOB_ID and store; the job's rank 0 writes it \
                 at launch",
                client.server_addr(),
                t.connect_timeout
            )));
        }
        Err(e) => return Err(Error::Store(e)),
    };
    // The job under torchrun's attempt of the launch, which a restarted
    // agent's count does not name.
    if prefix != job_prefix(b, size) {
        tracing::info!(rank, %prefix, "rejoining the job launched under another attempt");
    }
    let keys = JobKeys { prefix: &prefix };
    let their_size = client.get(&keys.key("world_size"), t.connect_timeout)?;
    if their_size != size.to_string().as_bytes() {
        return Err(Error::Rendezvous(format!(
            "rank {rank} has WORLD_SIZE={size} but the running job has {}: a replacement takes \
             a rank of the job's world",
            String::from_utf8_lossy(&their_size)
        )));
    }
    let settings = client.try_get(&keys.key("settings"))?.unwrap_or_default();
    if let Some(why) = t.disagreement(rank, &String::from_utf8_lossy(&settings)) {
        return Err(Error::Rendezvous(why));
    }
    let job_id = client.get(&keys.key("job"), t.connect_timeout)?;
    let job_id = u64::from_le_bytes(
        job_id
            .try_into()
            .map_err(|_| Error::Rendezvous("bad job id in the store".into()))?,
    );
    let incarnation = u32::try_from(client.add(&keys.incarnations(rank), 1)?)
        .map_err(|_| Error::Rendezvous(format!("rank {rank}'s incarnations ran out")))?;
    let unix_links = t.local_links != LocalLinks::Tcp && sec.tls.is_none();
    let published = listen_and_publish(b, &*client, rank, &addrs, unix_links, &|what| {
        keys.place(what, rank, incarnation)
    })?;
    client.set(&keys.waiting(rank), incarnation.to_string().as_bytes())?;
    tracing::info!(
        rank,
        incarnation,
        "waiting to be admitted (the members call Communicator::admit)"
    );
    let admission = match client.get(&keys.admitted(rank, incarnation), t.connect_timeout) {
        Ok(a) => a,
        Err(StoreError::Timeout { .. }) => {
            // No longer waiting (unless a newer replacement is): the
            // members must not admit a process that gave up.
            let _ =
                client.compare_set(&keys.waiting(rank), incarnation.to_string().as_bytes(), b"");
            return Err(Error::Rendezvous(format!(
                "rank {rank} (incarnation {incarnation}) was not admitted within {:?}: the \
                 members take a replacement in when they call Communicator::admit (and \
                 another replacement of the rank may have been taken instead)",
                t.connect_timeout
            )));
        }
        Err(other) => return Err(Error::Store(other)),
    };
    let admission = Admission::decode(&admission)?;
    // Every member that was there before points its transport here
    // before it counts itself ready; only then may this process dial.
    let before = admission.members.len() - admission.joined.len();
    let until = Instant::now() + t.connect_timeout;
    loop {
        let ready = client.add(&keys.ready(rank, incarnation), 0)?;
        if ready >= before as i64 {
            break;
        }
        if Instant::now() >= until {
            return Err(Error::Rendezvous(format!(
                "rank {rank} was admitted, but only {ready} of the {before} members got ready \
                 to link with it within {:?} (a member was lost meanwhile?)",
                t.connect_timeout
            )));
        }
        std::thread::sleep(READY_POLL);
    }

    // Every slot's place as the members know it (a slot left out keeps
    // its last known place: nothing dials it).
    let local_name = published.local.as_ref().map(|(_, name)| name.clone());
    let mut peers: Vec<SocketAddr> = Vec::with_capacity(size);
    let mut local_peers = Vec::with_capacity(size);
    let mut incarnations = admission.incarnations.clone();
    incarnations[rank] = incarnation;
    for (q, &inc) in incarnations.iter().enumerate() {
        if q == rank {
            peers.push(published.listen);
            local_peers.push(None);
            continue;
        }
        let raw = client
            .try_get(&keys.place("addr", q, inc))?
            .unwrap_or_default();
        let addr = String::from_utf8_lossy(&raw)
            .parse()
            .unwrap_or(published.listen);
        peers.push(addr);
        let local = match &local_name {
            Some(mine) => client
                .try_get(&keys.place("local", q, inc))?
                .and_then(|theirs| net::same_host_unix_addr(mine, &theirs)),
            None => None,
        };
        local_peers.push(local);
    }
    let local_ranks: Vec<bool> = local_peers.iter().map(Option::is_some).collect();
    let found_here = 1 + local_ranks.iter().filter(|&&l| l).count();
    let crowded = b
        .local
        .is_some_and(|(_, on_host)| on_host > ringwire_uring::usable_cores());
    let local = published.local.map(|(listener, _)| LocalPeers {
        listener,
        peers: local_peers,
        crowded: crowded || found_here > ringwire_uring::usable_cores(),
    });
    let (local_rank, on_host) = b.local.unwrap_or((found_here - 1, found_here));
    let cores = crate::transport::engine_cores::engine_thread_cores(
        t.engine_threads,
        local_rank,
        on_host,
        &ringwire_uring::usable_core_ids(),
    );
    let transport = super::join::start_transport(
        published.listener,
        local,
        rank,
        job_id,
        peers,
        incarnations,
        t,
        sec,
        cores,
    )?;
    // The facts the members' algorithm choices read, as the launch
    // counted them: the admitted communicator must choose alike.
    let crowded_anywhere = client.add(&keys.key("crowded_ranks"), 0)? > 0;
    let tcp_anywhere = client.add(&keys.key("tcp_ranks"), 0)? > 0;
    client.set_reply_timeout(Duration::from_secs(2));
    let world = World {
        rank,
        size,
        job_id,
        transport,
        store: Some((client, prefix.clone())),
        hosted_store: None,
        home_core: None,
        local: None,
        crowded,
        crowded_anywhere,
        tcp_anywhere,
        // The admitted communicator, and every one made from it, is flat.
        arena_everywhere: false,
        local_name,
        local_ranks,
        hosts: (0..size as u32).collect(),
        inter_host_gbps: crate::config::DEFAULT_INTER_HOST_GBPS,
    };
    tracing::info!(rank, incarnation, members = ?admission.members, "admitted");
    Ok((world, admission))
}
