//! Going on after a lost rank (issue 45, decision 0039): `revoke`,
//! `lost_ranks`, and the two ops the survivors run together, `agree` and
//! `shrink`, both one run of the agreement of `crate::agree` over the
//! members' links.
//!
//! An agreement's messages travel as data frames of a communicator of
//! their own (its id derived from this one's and the instance), so the
//! transport carries them as any op's frames and a revoked communicator's
//! abort does not touch them. A thread per peer sends to it and another
//! receives from it, so a peer that is slow to answer, or whose link is
//! still being made, holds no one else; a link that fails (or a message
//! that does not decode) makes its peer suspected.

use super::context::{CommKind, Communicator, mix};
use crate::DType;
use crate::agree::codec;
use crate::agree::protocol::{Agreement, Decision, Message};
use crate::error::Error;
use crate::error::link::LinkFailure;
use crate::locks::lock;
use crate::pending::{PendingCollective, pending};
use crate::transport::LinkError;
use crate::wire::{Header, OpKind};
use crate::world::World;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Salts of the communicator ids an agreement and a shrunk communicator
/// get, so neither meets an id of `split` or of the two levels.
const AGREE_SALT: u64 = 0x4147_5245_4545_3435; // "AGREEE45"
const SHRINK_SALT: u64 = 0x5348_5249_4e4b_3435; // "SHRINK45"

/// How long a receiving thread waits per turn before it looks whether the
/// agreement is over.
const RECEIVE_TURN: Duration = Duration::from_millis(20);

/// How long a sending thread waits per turn for a lower rank's dial
/// before it looks whether the agreement is over.
const SEND_TURN: Duration = Duration::from_millis(100);

/// A member not linked after this long is asked whether it lives
/// (`Transport::probe`), and again as often while it stays unlinked.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// How long a leader hears nothing before it starts a new round. Links
/// do not lose messages, but chaos trials in debug builds saw a message
/// of an agreement never reach its receiver (about one agreement in
/// 20 000; its cause in the transport is not found yet): the round it
/// belonged to would wait for the op timeout.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long one probe may take (a dead host shows only by the connect
/// timing out; a dead process on a live host refuses at once).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What [`Communicator::agree`] decides: the AND of the members' values,
/// and the members (ranks of the communicator it ran on, ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agreed {
    /// The bitwise AND of every member's value.
    pub value: u64,
    /// The members that took part: every rank of the communicator that was
    /// alive and reachable, at least a quorum of them.
    pub members: Vec<usize>,
}

/// What a peer's threads tell the agreement.
enum Event {
    Message(usize, Message),
    Suspect(usize),
}

impl Communicator {
    /// Marks this communicator failed on every member, as a lost rank does:
    /// their running and later ops end with [`Error::Aborted`] naming this
    /// rank. The links among the members stay up: [`Communicator::shrink`]
    /// then makes a communicator of the members that are left (as
    /// `MPIX_Comm_revoke`).
    pub fn revoke(&self) {
        self.abort("revoked the communicator");
    }

    /// The ranks of this communicator whose links have failed (a closed
    /// connection, silence past the heartbeat timeout, a bad frame), in
    /// rank order. A rank this one never linked with is not listed until a
    /// link to it is tried.
    pub fn lost_ranks(&self) -> Vec<usize> {
        let transport = &self.inner.world.transport;
        (0..self.inner.size)
            .filter(|&r| r != self.inner.rank)
            .filter(|&r| transport.link_failure(self.inner.members[r]).is_some())
            .collect()
    }

    /// Agrees on `value` with every live member: the result is the bitwise
    /// AND of the values of the members that took part, and those members
    /// (as `MPIX_Comm_agree`). Every member that gets a result gets the
    /// same one, even when members fail during it; it needs a majority of
    /// this communicator's members alive and reachable (see
    /// [`Communicator::agree_with_quorum`]).
    ///
    /// Collective over the live members, and it works on a communicator
    /// that failed or was revoked: what a program uses to decide "every
    /// live rank finished step k". Fails with [`Error::QuorumLost`] on a
    /// member cut off from the majority, and [`Error::Excluded`] on one the
    /// others decided without (taken for dead).
    pub fn agree(&self, value: u64) -> PendingCollective<Agreed> {
        self.agree_with_quorum(value, Agreement::majority(self.inner.size))
    }

    /// [`Communicator::agree`] deciding with `quorum` members: a majority or
    /// more keeps every result the same even when a partition or a hung
    /// rank makes live members suspect each other; fewer lets fewer
    /// survivors go on, but only where that cannot happen (one host).
    pub fn agree_with_quorum(&self, value: u64, quorum: usize) -> PendingCollective<Agreed> {
        let comm = self.clone();
        spawn_recovery("ringwire-agree", move || {
            let decision = comm.run_agreement(value, quorum)?;
            Ok(Agreed {
                value: decision.value,
                members: decision.members,
            })
        })
    }

    /// A communicator of the members that are left, in the same order and
    /// renumbered from 0, with an id of its own (as `MPIX_Comm_shrink`);
    /// the members agree on who is left as [`Communicator::agree`] does,
    /// with the same guarantees and errors. Use it once an op failed with a
    /// lost rank ([`Error::PeerLost`] or [`Error::Aborted`]), or after
    /// [`Communicator::revoke`]; with every member alive it returns them
    /// all.
    pub fn shrink(&self) -> PendingCollective<Communicator> {
        self.shrink_with_quorum(Agreement::majority(self.inner.size))
    }

    /// [`Communicator::shrink`] deciding with `quorum` members (see
    /// [`Communicator::agree_with_quorum`]).
    pub fn shrink_with_quorum(&self, quorum: usize) -> PendingCollective<Communicator> {
        let comm = self.clone();
        spawn_recovery("ringwire-shrink", move || {
            let instance = comm.next_recovery();
            let decision = comm.run_agreement_instance(u64::MAX, quorum, instance)?;
            let rank = decision
                .members
                .iter()
                .position(|&m| m == comm.inner.rank)
                .expect("run_agreement returns only decisions that include this rank");
            let members: Vec<usize> = decision
                .members
                .iter()
                .map(|&m| comm.inner.members[m])
                .collect();
            let comm_id = mix(mix(comm.inner.comm_id, SHRINK_SALT), instance);
            Communicator::start_group(
                comm.inner.world.clone(),
                comm.inner.tunables.clone(),
                rank,
                comm_id,
                Arc::new(members),
                CommKind::shrunk(comm.inner.flat, comm.inner.line.clone()),
            )
            .map(|mut c| {
                c.timeout = comm.timeout;
                c
            })
        })
    }

    /// The next agreement's number on this communicator: every member
    /// counts its own calls, and they call in the same order.
    pub(super) fn next_recovery(&self) -> u64 {
        let mut n = lock(&self.inner.recoveries);
        *n += 1;
        *n
    }

    fn run_agreement(&self, value: u64, quorum: usize) -> Result<Decision, Error> {
        let instance = self.next_recovery();
        self.run_agreement_instance(value, quorum, instance)
    }

    /// Runs agreement `instance` to its decision, which includes this rank.
    pub(super) fn run_agreement_instance(
        &self,
        value: u64,
        quorum: usize,
        instance: u64,
    ) -> Result<Decision, Error> {
        let size = self.inner.size;
        if !(1..=size).contains(&quorum) {
            return Err(Error::InvalidArgument {
                op: OpKind::None,
                detail: format!("a quorum of {quorum} of {size} members (1 to {size})"),
            });
        }
        let me = self.inner.rank;
        let world = self.inner.world.clone();
        let transport = &world.transport;
        let members = self.inner.members.clone();
        let comm_id = mix(mix(self.inner.comm_id, AGREE_SALT), instance);
        // The agreements before this one are over on every member that
        // calls this one: what they left goes.
        for ended in std::mem::take(&mut *lock(&self.inner.agreements_ended)) {
            transport.forget(ended);
        }
        // Every frame of the agreement is "op 0" of its communicator, begun
        // now: none counts as run ahead (decision 0019).
        transport.begin(comm_id, 0, None);
        let deadline = Instant::now() + self.timeout;
        let silent_limit = self.inner.tunables.heartbeat_timeout;
        let mut agreement = Agreement::new(me, size, quorum, value);
        let (events_tx, events) = mpsc::channel::<Event>();
        let stop = Arc::new(AtomicBool::new(false));
        let mut senders: Vec<Option<mpsc::Sender<Message>>> = vec![None; size];
        // Each sender says here when it has handed its last message over.
        let (sent_tx, sent) = mpsc::channel::<usize>();
        for peer in (0..size).filter(|&p| p != me) {
            let world_peer = members[peer];
            if transport.link_failure(world_peer).is_some() {
                agreement.suspect(peer);
                continue;
            }
            let (tx, outbox) = mpsc::channel::<Message>();
            senders[peer] = Some(tx);
            let link = Arc::new(PeerLink {
                world: world.clone(),
                peer,
                world_peer,
                size,
                comm_id,
                deadline,
                silent_limit,
                events: events_tx.clone(),
                stop: stop.clone(),
            });
            let (to, sent_tx) = (link.clone(), sent_tx.clone());
            spawn_peer_thread("ringwire-agree-send", move || {
                to.send_all(outbox);
                let _ = sent_tx.send(peer);
            });
            spawn_peer_thread("ringwire-agree-recv", move || link.receive_all());
        }
        drop(events_tx);
        // When a message last came: a leader that hears nothing for a
        // while starts a new round (`Agreement::retry`).
        let mut moved = Instant::now();
        let outcome = loop {
            post(&mut agreement, &senders);
            if let Some(decision) = agreement.decision() {
                break Ok(decision.clone());
            }
            if agreement.quorum_lost() {
                break Err(Error::QuorumLost {
                    rank: me,
                    reachable: agreement.reachable(),
                    needed: quorum,
                    size,
                    lost: agreement.suspected().collect(),
                });
            }
            let now = Instant::now();
            if now >= moved + RETRY_AFTER {
                agreement.retry();
                moved = now;
                continue;
            }
            if now >= deadline {
                break Err(Error::AgreementTimeout {
                    rank: me,
                    instance,
                    waited: self.timeout,
                    suspected: agreement.suspected().collect(),
                });
            }
            match events.recv_timeout((deadline - now).min(RECEIVE_TURN)) {
                Ok(Event::Message(from, message)) => {
                    moved = Instant::now();
                    agreement.receive(from, message)
                }
                Ok(Event::Suspect(peer)) => agreement.suspect(peer),
                Err(_) => {
                    // Links failed under no thread of ours (heartbeats).
                    for peer in (0..size).filter(|&p| p != me) {
                        if transport.link_failure(members[peer]).is_some() {
                            agreement.suspect(peer);
                        }
                    }
                }
            }
        };
        // The decision goes on to every member still reachable (it was put
        // in the outbox on deciding).
        post(&mut agreement, &senders);
        drop(senders);
        drop(sent_tx);
        stop.store(true, Ordering::Relaxed);
        lock(&self.inner.agreements_ended).push(comm_id);
        let decision = outcome?;
        // The decision reaches the other members before this one returns:
        // a member that learned it from this one and exits at once must
        // not leave the rest to decide again without it (at two members,
        // without a quorum).
        let mut waiting: Vec<usize> = decision
            .members
            .iter()
            .copied()
            .filter(|&m| m != me && transport.link_failure(members[m]).is_none())
            .collect();
        while !waiting.is_empty() {
            let now = Instant::now();
            match sent.recv_timeout(deadline.saturating_duration_since(now)) {
                Ok(peer) => waiting.retain(|&m| m != peer),
                Err(_) => break,
            }
        }
        if !decision.members.contains(&me) {
            return Err(Error::Excluded {
                rank: me,
                members: decision.members,
            });
        }
        Ok(decision)
    }
}

/// Hands what the agreement puts out to each addressee's sending thread.
fn post(agreement: &mut Agreement, senders: &[Option<mpsc::Sender<Message>>]) {
    while let Some((to, message)) = agreement.next_message() {
        if let Some(tx) = &senders[to] {
            let _ = tx.send(message);
        }
    }
}

/// One peer as an agreement's two threads for it see it.
struct PeerLink {
    world: Arc<World>,
    /// Its rank in the communicator, and in the world transport.
    peer: usize,
    world_peer: usize,
    /// The communicator's size (what messages are coded for).
    size: usize,
    /// The agreement's own communicator id.
    comm_id: u64,
    deadline: Instant,
    /// How long an unlinked peer may leave probes unanswered.
    silent_limit: Duration,
    events: mpsc::Sender<Event>,
    /// Set once the agreement is over.
    stop: Arc<AtomicBool>,
}

impl PeerLink {
    fn suspect(&self) {
        let _ = self.events.send(Event::Suspect(self.peer));
    }

    /// Sends each message of `outbox` until it closes; a peer that cannot
    /// be reached for a sign of death is suspected.
    fn send_all(&self, outbox: mpsc::Receiver<Message>) {
        let t = &self.world.transport;
        for message in outbox {
            let bytes = codec::encode(&message, self.size);
            let header = Header::data(self.comm_id, 0, OpKind::None, DType::U8)
                .with_payload_len(bytes.len() as u32);
            // In turns, so a thread waiting for a lower rank's dial (one
            // that may be dead) ends soon after the agreement does, and
            // lets the transport go.
            loop {
                let turn = (Instant::now() + SEND_TURN).min(self.deadline);
                match t.send(self.world_peer, &header, &bytes, turn) {
                    Ok(()) => break,
                    // Not dialed yet, or a dial that ran out of its turn (a
                    // loaded host): not a sign of death.
                    Err(LinkError::Connect { failure, .. })
                        if Instant::now() < self.deadline && !says_gone(&failure) =>
                    {
                        if self.stop.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                    Err(_) => return self.suspect(),
                }
            }
        }
    }

    /// Receives the peer's messages into the agreement's events until it
    /// is over; a failed link, bytes that are not a message, or (while
    /// unlinked) a probe that says the process is gone or silence for the
    /// heartbeat timeout make the peer suspected.
    fn receive_all(&self) {
        let t = &self.world.transport;
        // The first probe at once: a dead member refuses it in
        // microseconds, where a dial to it retries for a while.
        let mut next_probe = Instant::now();
        let mut unanswered_since: Option<Instant> = None;
        while !self.stop.load(Ordering::Relaxed) {
            // Receiving would make the link (dial, or wait for the peer's
            // dial) under a short deadline, and take that running out for
            // a failure: the first message either way makes it, so wait
            // for it to be up.
            if t.link_kind(self.world_peer).is_none() {
                if t.link_failure(self.world_peer).is_some() {
                    return self.suspect();
                }
                if Instant::now() >= self.deadline {
                    return;
                }
                // A peer not linked yet may be gone (a process that died
                // refuses at once), stopped or hung (it never answers:
                // after the heartbeat timeout it counts as lost, as a
                // silent link does), or merely slow to link.
                if Instant::now() >= next_probe {
                    let asked = Instant::now();
                    let until = (asked + PROBE_TIMEOUT.min(self.silent_limit)).min(self.deadline);
                    match t.probe(self.world_peer, until) {
                        Ok(()) => unanswered_since = None,
                        Err(LinkError::Connect { failure, .. }) if says_gone(&failure) => {
                            return self.suspect();
                        }
                        Err(_) => {
                            let since = *unanswered_since.get_or_insert(asked);
                            if since.elapsed() >= self.silent_limit {
                                return self.suspect();
                            }
                        }
                    }
                    next_probe = Instant::now() + PROBE_EVERY;
                }
                std::thread::sleep(RECEIVE_TURN);
                continue;
            }
            let turn = (Instant::now() + RECEIVE_TURN).min(self.deadline);
            match t.recv(self.comm_id, self.world_peer, turn) {
                Ok(incoming) => {
                    let bytes = incoming.payload.bytes();
                    let decoded = match bytes.len() <= codec::MAX_PAYLOAD {
                        true => codec::decode(bytes, self.size).ok(),
                        false => None,
                    };
                    t.recycle(incoming.payload);
                    // Bytes that are not a message: the peer is broken, and
                    // counts as lost.
                    let Some(message) = decoded else {
                        return self.suspect();
                    };
                    if self
                        .events
                        .send(Event::Message(self.peer, message))
                        .is_err()
                    {
                        return;
                    }
                }
                Err(LinkError::Timeout) if Instant::now() < self.deadline => {}
                Err(LinkError::Timeout) => return,
                Err(_) => return self.suspect(),
            }
        }
    }
}

/// Whether a failed connection attempt says the peer's process is gone:
/// nothing listens at its address any more (refused, or its socket file
/// gone), or it reset or closed the connection. A timeout or a refused
/// handshake says no such thing (a loaded host answers late).
fn says_gone(failure: &LinkFailure) -> bool {
    use rustix::io::Errno;
    match failure {
        LinkFailure::Closed => true,
        LinkFailure::Io {
            errno: Some(errno), ..
        } => [
            Errno::CONNREFUSED,
            Errno::CONNRESET,
            Errno::NOENT,
            Errno::PIPE,
        ]
        .iter()
        .any(|e| e.raw_os_error() == *errno),
        _ => false,
    }
}

/// Runs `work` on a thread of its own and hands its result to the handle.
pub(super) fn spawn_recovery<R: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> Result<R, Error> + Send + 'static,
) -> PendingCollective<R> {
    let (handle, completer) = pending(OpKind::None);
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || completer.complete(work()));
    match spawned {
        Ok(_) => handle,
        Err(e) => PendingCollective::ready(Err(Error::io("starting a recovery thread", e))),
    }
}

fn spawn_peer_thread(name: &str, work: impl FnOnce() + Send + 'static) {
    // A thread that cannot start leaves its peer silent: the agreement then
    // suspects it at the timeout at worst.
    let _ = std::thread::Builder::new().name(name.into()).spawn(work);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    /// The failure a real connection attempt to `addr` gives.
    fn dial(addr: std::net::SocketAddr) -> LinkFailure {
        let e = std::net::TcpStream::connect(addr).expect_err("nothing listens there");
        LinkFailure::of_io(&e, false)
    }

    #[test]
    fn only_signs_of_death_suspect_a_member() {
        // Nothing listens on a port just let go: refused, the process gone.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(says_gone(&dial(port)));
        assert!(says_gone(&LinkFailure::Closed));
        let reset = LinkFailure::of_io(
            &io::Error::from_raw_os_error(rustix::io::Errno::CONNRESET.raw_os_error()),
            false,
        );
        assert!(says_gone(&reset));
        // A loaded host answering late, or a peer refusing this job's
        // hello, is not dead.
        let late = LinkFailure::of_io(
            &io::Error::from_raw_os_error(rustix::io::Errno::AGAIN.raw_os_error()),
            false,
        );
        assert!(!says_gone(&late));
        assert!(!says_gone(&LinkFailure::NotDialed));
        assert!(!says_gone(&LinkFailure::Handshake {
            reason: "timed out".into()
        }));
        assert!(!says_gone(&LinkFailure::Refused {
            reason: "another job".into()
        }));
    }
}
