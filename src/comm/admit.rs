//! Taking replacements in (issue 45, decision 0040): `joiners_waiting`, a
//! store read a program may make every step, and `admit`, which the
//! members run together at a point they choose.
//!
//! `admit` is one run of the survivors' agreement (`recovery`): each
//! member's value is a bit per slot missing from the communicator whose
//! replacement it saw waiting, so the AND is the slots every member saw
//! (one seen by some only waits for the next `admit`). Every member then,
//! in the same order: takes the incarnation of each slot the first
//! member to write it chose, points its transport at that process,
//! tells it the communicator, counts itself ready, and makes the
//! communicator: the members the agreement kept and the admitted slots,
//! in slot order. The replacement makes the same one from what it was
//! told (`rendezvous::rejoin`).

use super::context::{CommKind, Communicator, mix};
use crate::agree::protocol::Agreement;
use crate::error::Error;
use crate::pending::PendingCollective;
use crate::slots::{Admission, JobKeys};
use crate::store::Store;
use crate::transport::PeerPlace;
use crate::world::World;
use std::sync::Arc;

/// Salt of the ids of communicators `admit` makes.
const ADMIT_SALT: u64 = 0x4144_4d49_5434_3530; // "ADMIT450"

impl Communicator {
    /// How many replacement processes wait to take the place of ranks
    /// this communicator lost (started with [`Builder::rejoin`]); a store
    /// read or two per missing rank, cheap enough to ask every step. Then
    /// [`Communicator::admit`] takes them in. Members read the store at
    /// different moments, so they may get different counts: decide
    /// together whether to admit (with [`Communicator::agree`], as the
    /// guide's loop does).
    ///
    /// [`Builder::rejoin`]: crate::Builder::rejoin
    pub fn joiners_waiting(&self) -> Result<usize, Error> {
        let (store, keys) = store_of(&self.inner.world)?;
        let mut waiting = 0;
        for slot in self.missing_slots() {
            let current = self.inner.world.transport.incarnation(slot);
            if keys.waiting_incarnation(store, slot, current)?.is_some() {
                waiting += 1;
            }
        }
        Ok(waiting)
    }

    /// A communicator of the members that are left and the replacements
    /// that wait to take lost ranks' places (processes started with
    /// [`Builder::rejoin`]), in world-rank order, with an id of its own.
    /// Collective over the live members, at a point the program chooses
    /// (a step boundary); the members agree on who is admitted as
    /// [`Communicator::shrink`] agrees on who is left, with the same
    /// guarantees and errors, and a member lost meanwhile is left out.
    /// With nobody waiting it is `shrink`.
    ///
    /// The places it fills are those this communicator's line lost: the
    /// world's ranks, or a split's, that are not members now (at most 64
    /// per call). Where two communicators lost the same rank, the first
    /// to admit its replacement takes it; the other goes on without.
    ///
    /// The new communicator runs its collectives over the links alone (no
    /// shared-memory arena and no two-level algorithms, whose facts a
    /// replacement on another host does not share), as does any
    /// communicator split or shrunk from it. Training state moves to the
    /// newcomers with a broadcast.
    ///
    /// [`Builder::rejoin`]: crate::Builder::rejoin
    pub fn admit(&self) -> PendingCollective<Communicator> {
        self.admit_with_quorum(Agreement::majority(self.inner.size))
    }

    /// [`Communicator::admit`] deciding with `quorum` members (see
    /// [`Communicator::agree_with_quorum`]).
    pub fn admit_with_quorum(&self, quorum: usize) -> PendingCollective<Communicator> {
        let comm = self.clone();
        super::recovery::spawn_recovery("ringwire-admit", move || comm.run_admit(quorum))
    }

    /// The ranks of this communicator that [`Communicator::admit`] took
    /// in when it made it (replacements, which hold no training state
    /// yet), in order; empty for any other communicator. The first rank
    /// not listed is a member that was there before: the one to send the
    /// state from.
    pub fn newcomers(&self) -> &[usize] {
        &self.inner.newcomers
    }

    /// The world ranks of this communicator's line (the communicator it
    /// was shrunk or admitted from, back to the world or a split) that
    /// are not members now, in order: the places a replacement may take
    /// (at most 64 per admission: one bit each). The same on every member.
    fn missing_slots(&self) -> Vec<usize> {
        let members = &self.inner.members;
        self.inner
            .line
            .iter()
            .copied()
            .filter(|w| !members.contains(w))
            .take(64)
            .collect()
    }

    fn run_admit(&self, quorum: usize) -> Result<Communicator, Error> {
        let world = &self.inner.world;
        let transport = &world.transport;
        // Counted first: a member that fails below must not run its next
        // agreements one behind the others'.
        let instance = self.next_recovery();
        let (store, keys) = store_of(world)?;
        let missing = self.missing_slots();
        // What this member saw waiting: a bit per missing slot (a read
        // that fails counts as nothing seen: the AND leaves it out).
        let mut seen = Vec::with_capacity(missing.len());
        let mut mask = 0u64;
        for (bit, &slot) in missing.iter().enumerate() {
            let current = transport.incarnation(slot);
            let waiting = keys
                .waiting_incarnation(store, slot, current)
                .unwrap_or_else(|e| {
                    tracing::warn!(rank = world.rank, slot, error = %e, "could not read who waits");
                    None
                });
            if waiting.is_some() {
                mask |= 1 << bit;
            }
            seen.push(waiting);
        }
        let decision = self.run_agreement_instance(mask, quorum, instance)?;
        let comm_id = mix(mix(self.inner.comm_id, ADMIT_SALT), instance);
        let mut joined = Vec::new();
        for (bit, &slot) in missing.iter().enumerate() {
            if decision.value & (1 << bit) == 0 {
                continue;
            }
            // Set in the AND, so this member saw it too.
            let mine = seen[bit].expect("a slot every member saw waiting");
            // A second replacement of the slot may have come between two
            // members' reads: the first member to write picks one.
            let taken = store.compare_set(
                &keys.admitting(comm_id, slot),
                b"",
                mine.to_string().as_bytes(),
            )?;
            let incarnation = std::str::from_utf8(&taken)
                .ok()
                .and_then(|t| t.parse::<u32>().ok())
                .ok_or_else(|| {
                    Error::Rendezvous(format!("a bad incarnation for rank {slot} at the store"))
                })?;
            // Another communicator that lost the rank may have taken this
            // process first; every member here reads the same answer.
            let mine = format!("{comm_id:016x}");
            let owner = store.compare_set(&keys.taken(slot, incarnation), b"", mine.as_bytes())?;
            if owner != mine.as_bytes() {
                continue;
            }
            let place = place_of(world, store, &keys, slot, incarnation)?;
            transport
                .replace_peer(slot, place)
                .map_err(|_| Error::ShutDown(crate::wire::OpKind::None))?;
            joined.push(slot);
        }
        let mut members: Vec<usize> = decision
            .members
            .iter()
            .map(|&m| self.inner.members[m])
            .chain(joined.iter().copied())
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&w| w == world.rank)
            .expect("the agreement's decision includes this rank");
        if !joined.is_empty() {
            let admission = Admission {
                comm_id,
                members: members.clone(),
                incarnations: (0..world.size).map(|q| transport.incarnation(q)).collect(),
                joined: joined.clone(),
                line: self.inner.line.to_vec(),
            };
            let told = admission.encode();
            for &slot in &joined {
                let incarnation = transport.incarnation(slot);
                store.set(&keys.admitted(slot, incarnation), told.as_bytes())?;
                store.add(&keys.ready(slot, incarnation), 1)?;
            }
            tracing::info!(
                rank = world.rank,
                joined = ?joined,
                members = ?members,
                "admitted replacements"
            );
        }
        let line = self.inner.line.clone();
        let kind = match joined.is_empty() {
            true => CommKind::shrunk(self.inner.flat, line),
            false => CommKind::admitted(
                joined
                    .iter()
                    .map(|j| {
                        members
                            .iter()
                            .position(|m| m == j)
                            .expect("joined are members")
                    })
                    .collect(),
                line,
            ),
        };
        Communicator::start_group(
            world.clone(),
            self.inner.tunables.clone(),
            rank,
            comm_id,
            Arc::new(members),
            kind,
        )
        .map(|mut c| {
            c.timeout = self.timeout;
            c
        })
    }

    /// The communicator a replacement makes once admitted: the members'
    /// (decision 0040).
    pub(crate) fn start_admitted(
        world: Arc<World>,
        tunables: crate::config::Tunables,
        admission: &Admission,
    ) -> Result<Communicator, Error> {
        let rank = admission
            .members
            .iter()
            .position(|&w| w == world.rank)
            .ok_or_else(|| {
                Error::Rendezvous(format!(
                    "the admission names members {:?}, not this rank ({})",
                    admission.members, world.rank
                ))
            })?;
        let newcomers = admission
            .joined
            .iter()
            .filter_map(|j| admission.members.iter().position(|m| m == j))
            .collect();
        Communicator::start_group(
            world,
            tunables,
            rank,
            admission.comm_id,
            Arc::new(admission.members.clone()),
            CommKind::admitted(newcomers, Arc::new(admission.line.clone())),
        )
    }
}

/// The store the job met at, and its keys.
fn store_of(world: &World) -> Result<(&dyn Store, JobKeys<'_>), Error> {
    match &world.store {
        Some((store, prefix)) => Ok((&**store, JobKeys { prefix })),
        None => Err(Error::Rendezvous(
            "taking in a replacement needs the store the job met at; this job has none \
             (one rank without a store)"
                .into(),
        )),
    }
}

/// Where `slot`'s process `incarnation` listens, as it published.
pub(crate) fn place_of(
    world: &World,
    store: &dyn Store,
    keys: &JobKeys<'_>,
    slot: usize,
    incarnation: u32,
) -> Result<PeerPlace, Error> {
    let raw = store.try_get(&keys.place("addr", slot, incarnation))?;
    let text = raw.as_deref().map(String::from_utf8_lossy);
    let addr = text
        .as_deref()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| {
            Error::Rendezvous(format!(
                "rank {slot} (incarnation {incarnation}) published no address to the store \
                 ({text:?})"
            ))
        })?;
    let local = match &world.local_name {
        Some(mine) => store
            .try_get(&keys.place("local", slot, incarnation))?
            .and_then(|theirs| crate::net::same_host_unix_addr(mine, &theirs)),
        None => None,
    };
    Ok(PeerPlace {
        addr,
        local,
        incarnation,
    })
}
