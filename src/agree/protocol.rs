//! One agreement, as a pure state machine: messages in, messages out, no
//! clock, no sockets (decision 0039 has the algorithm and its proof
//! sketch).
//!
//! Each member of a communicator holds an [`Agreement`] for the same
//! instance. It learns of peers it can no longer reach through
//! [`Agreement::suspect`] (a closed link, silence past the heartbeat
//! timeout), takes the peers' messages through [`Agreement::receive`], and
//! hands what to send out of [`Agreement::next_message`]. It decides once:
//! [`Agreement::decision`] is then the [`Decision`] every member that
//! decides reaches, or [`Agreement::quorum_lost`] says it cannot decide.
//!
//! The protocol is single-decree Paxos: the lowest member a process does
//! not suspect leads; a leader gathers promises (with every promiser's
//! input) from a quorum and from every member it does not suspect,
//! proposes the value already accepted under the highest ballot if any,
//! else the AND of the promisers' inputs with the promisers as the members,
//! and the proposal is chosen once a quorum accepts it. The decision is
//! then spread by everyone who learns it.

/// A proposal number: a round, then the proposer's rank, compared in that
/// order, so two proposers never share one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ballot {
    /// The round (0: nothing proposed yet).
    pub round: u32,
    /// The proposer.
    pub rank: u32,
}

/// The highest round a ballot may have. Rounds grow by one each time a
/// leader tries again, so a real agreement stays far below; a message
/// with a higher one (a corrupt or hostile peer) is dropped, so no
/// arithmetic on rounds can overflow.
pub const MAX_ROUND: u32 = 1 << 30;

/// What an agreement decides: the members that go on, in rank order, and
/// the AND of their inputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// The AND of the members' inputs.
    pub value: u64,
    /// The members, ascending ranks of the old communicator.
    pub members: Vec<usize>,
}

/// A message of the protocol, between members of one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A leader asks for a promise not to accept lower ballots.
    Prepare {
        /// The leader's ballot.
        ballot: Ballot,
    },
    /// The promise, with what the member accepted before (if anything)
    /// and its own input.
    Promise {
        /// The ballot promised.
        ballot: Ballot,
        /// The highest-ballot proposal this member accepted.
        accepted: Option<Accepted>,
        /// This member's input.
        input: u64,
    },
    /// A refusal: the member promised a higher ballot.
    Nack {
        /// The ballot the member has promised.
        promised: Ballot,
    },
    /// A leader asks members to accept a proposal.
    Accept {
        /// The leader's ballot.
        ballot: Ballot,
        /// The proposal.
        decision: Decision,
    },
    /// The member accepted the proposal of `ballot`.
    Accepted {
        /// The ballot accepted.
        ballot: Ballot,
    },
    /// The decision, chosen by a quorum; whoever learns it passes it on.
    Decide {
        /// What was decided.
        decision: Decision,
    },
}

/// A proposal a member accepted: its ballot and what it proposed.
pub type Accepted = (Ballot, Decision);

/// A member's promise as a leader keeps it: what it accepted before, and
/// its input.
type Promised = (Option<Accepted>, u64);

impl Message {
    /// The highest round any ballot of the message names.
    fn highest_round(&self) -> u32 {
        match self {
            Message::Prepare { ballot }
            | Message::Nack { promised: ballot }
            | Message::Accepted { ballot }
            | Message::Accept { ballot, .. } => ballot.round,
            Message::Promise {
                ballot, accepted, ..
            } => ballot
                .round
                .max(accepted.as_ref().map_or(0, |(b, _)| b.round)),
            Message::Decide { .. } => 0,
        }
    }
}

/// Where a leader is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Lead {
    /// Not leading.
    Idle,
    /// Gathering promises for `ballot`.
    Preparing {
        ballot: Ballot,
        /// Per member: its promise (what it accepted, its input).
        promises: Vec<Option<Promised>>,
    },
    /// Gathering acceptances of `decision` under `ballot`.
    Accepting {
        ballot: Ballot,
        decision: Decision,
        accepted: Vec<bool>,
    },
}

/// Deliberate faults, for showing that the simulator catches a broken
/// protocol (each must make it fail).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// Propose at once, without gathering promises (no prepare round).
    SkipPrepare,
    /// Decide on the first acceptance, not a quorum's.
    TrustOneAcceptance,
    /// Ignore what promisers accepted before; always propose afresh.
    ForgetAccepted,
}

/// One member's state in one agreement.
#[derive(Clone, Debug)]
pub struct Agreement {
    me: usize,
    size: usize,
    quorum: usize,
    input: u64,
    suspected: Vec<bool>,
    /// The highest ballot promised, and the highest round seen anywhere.
    promised: Ballot,
    highest_round: u32,
    accepted: Option<Accepted>,
    lead: Lead,
    decided: Option<Decision>,
    outbox: std::collections::VecDeque<(usize, Message)>,
    #[cfg(test)]
    pub(crate) mutation: Option<Mutation>,
}

impl Agreement {
    /// Member `me` of `size` joins the agreement with `input`; a decision
    /// needs `quorum` members: a majority of `size` ([`Agreement::majority`])
    /// or more keeps every decision the same even when a partition or a
    /// hung member makes live members suspect each other; a smaller quorum
    /// (at least 1) lets fewer survivors go on, but only where that cannot
    /// happen (decision 0039).
    pub fn new(me: usize, size: usize, quorum: usize, input: u64) -> Agreement {
        assert!(me < size, "member {me} of {size}");
        assert!((1..=size).contains(&quorum), "quorum {quorum} of {size}");
        let mut a = Agreement {
            me,
            size,
            quorum,
            input,
            suspected: vec![false; size],
            promised: Ballot::default(),
            highest_round: 0,
            accepted: None,
            lead: Lead::Idle,
            decided: None,
            outbox: Default::default(),
            #[cfg(test)]
            mutation: None,
        };
        a.maybe_lead();
        a
    }

    /// The majority of `size` members: the default quorum.
    pub fn majority(size: usize) -> usize {
        size / 2 + 1
    }

    /// What was decided, once decided.
    pub fn decision(&self) -> Option<&Decision> {
        self.decided.as_ref()
    }

    /// Whether fewer than a quorum of members remain unsuspected: this
    /// member cannot decide unless someone who did tells it.
    pub fn quorum_lost(&self) -> bool {
        self.decided.is_none() && self.reachable() < self.quorum
    }

    /// How many members this one does not suspect (itself included).
    pub fn reachable(&self) -> usize {
        self.suspected.iter().filter(|s| !**s).count()
    }

    /// The members this one suspects.
    pub fn suspected(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.size).filter(|&r| self.suspected[r])
    }

    /// The next message to send, and to whom.
    pub fn next_message(&mut self) -> Option<(usize, Message)> {
        self.outbox.pop_front()
    }

    /// This member can no longer reach `peer` (its link failed): no message
    /// goes to it or is taken from it again.
    pub fn suspect(&mut self, peer: usize) {
        if peer == self.me || peer >= self.size || self.suspected[peer] {
            return;
        }
        self.suspected[peer] = true;
        self.outbox.retain(|(to, _)| *to != peer);
        if self.decided.is_some() {
            return;
        }
        self.maybe_lead();
        self.advance();
    }

    /// Nothing moved this member's lead on for a while: a message it sent
    /// or waits for went missing. A leader starts a new round with a
    /// higher ballot, which every member answers afresh; any proposer may
    /// do so at any time in Paxos, so this is safe whenever it is called.
    /// A member that does not lead, or has decided, does nothing.
    pub fn retry(&mut self) {
        if self.decided.is_none() && self.leads() {
            self.lead = Lead::Idle;
            self.prepare();
        }
    }

    /// A message from `from`.
    pub fn receive(&mut self, from: usize, message: Message) {
        if from >= self.size || from == self.me || self.suspected[from] {
            return;
        }
        if message.highest_round() > MAX_ROUND {
            return;
        }
        if let Some(decision) = &self.decided {
            // Chosen: whoever asks learns it.
            if matches!(message, Message::Prepare { .. } | Message::Accept { .. }) {
                let decision = decision.clone();
                self.send(from, Message::Decide { decision });
            }
            return;
        }
        match message {
            Message::Prepare { ballot } => self.on_prepare(from, ballot),
            Message::Promise {
                ballot,
                accepted,
                input,
            } => self.on_promise(from, ballot, accepted, input),
            Message::Nack { promised } => self.on_nack(promised),
            Message::Accept { ballot, decision } => self.on_accept(from, ballot, decision),
            Message::Accepted { ballot } => self.on_accepted(from, ballot),
            Message::Decide { decision } => self.decide(decision),
        }
    }

    fn send(&mut self, to: usize, message: Message) {
        if to != self.me && !self.suspected[to] {
            self.outbox.push_back((to, message));
        }
    }

    fn send_to_all(&mut self, message: &Message) {
        for peer in 0..self.size {
            self.send(peer, message.clone());
        }
    }

    /// Whether this member leads: the lowest one it does not suspect.
    fn leads(&self) -> bool {
        (0..self.me).all(|r| self.suspected[r])
    }

    /// Starts a prepare round if this member leads and is not leading yet.
    fn maybe_lead(&mut self) {
        if self.decided.is_none() && self.leads() && self.lead == Lead::Idle {
            self.prepare();
        }
    }

    fn prepare(&mut self) {
        let round = self.highest_round.max(self.promised.round) + 1;
        if round > MAX_ROUND {
            // Unreachable from real peers (their rounds are checked on
            // arrival): stay idle rather than wrap.
            return;
        }
        self.highest_round = round;
        let ballot = Ballot {
            round,
            rank: self.me as u32,
        };
        #[cfg(test)]
        if self.mutation == Some(Mutation::SkipPrepare) {
            // Propose this member's own view at once.
            let members: Vec<usize> = (0..self.size).filter(|&r| !self.suspected[r]).collect();
            let decision = Decision {
                value: self.input,
                members,
            };
            self.propose(ballot, decision);
            return;
        }
        let mut promises = vec![None; self.size];
        // A leader promises its own ballot.
        if ballot > self.promised {
            self.promised = ballot;
            promises[self.me] = Some((self.accepted.clone(), self.input));
        }
        self.lead = Lead::Preparing { ballot, promises };
        self.send_to_all(&Message::Prepare { ballot });
        self.advance();
    }

    fn on_prepare(&mut self, from: usize, ballot: Ballot) {
        self.highest_round = self.highest_round.max(ballot.round);
        if ballot > self.promised {
            self.promised = ballot;
            // A leader outbid gives way.
            if !matches!(self.lead, Lead::Idle) && self.lead_ballot() < Some(ballot) {
                self.lead = Lead::Idle;
            }
            let message = Message::Promise {
                ballot,
                accepted: self.accepted.clone(),
                input: self.input,
            };
            self.send(from, message);
        } else {
            let promised = self.promised;
            self.send(from, Message::Nack { promised });
        }
    }

    fn lead_ballot(&self) -> Option<Ballot> {
        match &self.lead {
            Lead::Idle => None,
            Lead::Preparing { ballot, .. } | Lead::Accepting { ballot, .. } => Some(*ballot),
        }
    }

    fn on_promise(
        &mut self,
        from: usize,
        ballot: Ballot,
        accepted: Option<Accepted>,
        input: u64,
    ) {
        if let Lead::Preparing {
            ballot: mine,
            promises,
        } = &mut self.lead
            && *mine == ballot
        {
            promises[from] = Some((accepted, input));
            self.advance();
        }
    }

    fn on_nack(&mut self, promised: Ballot) {
        self.highest_round = self.highest_round.max(promised.round);
        if self.lead_ballot().is_some_and(|b| b < promised) {
            // Outbid: try again above it, if still the leader.
            self.lead = Lead::Idle;
            self.maybe_lead();
        }
    }

    fn on_accept(&mut self, from: usize, ballot: Ballot, decision: Decision) {
        self.highest_round = self.highest_round.max(ballot.round);
        if ballot >= self.promised {
            self.promised = ballot;
            if self.lead_ballot().is_some_and(|b| b < ballot) {
                self.lead = Lead::Idle;
            }
            self.accepted = Some((ballot, decision));
            self.send(from, Message::Accepted { ballot });
        } else {
            let promised = self.promised;
            self.send(from, Message::Nack { promised });
        }
    }

    fn on_accepted(&mut self, from: usize, ballot: Ballot) {
        if let Lead::Accepting {
            ballot: mine,
            accepted,
            ..
        } = &mut self.lead
            && *mine == ballot
        {
            accepted[from] = true;
            self.advance();
        }
    }

    fn propose(&mut self, ballot: Ballot, decision: Decision) {
        let mut accepted = vec![false; self.size];
        if ballot >= self.promised {
            self.promised = ballot;
            self.accepted = Some((ballot, decision.clone()));
            accepted[self.me] = true;
        }
        self.lead = Lead::Accepting {
            ballot,
            decision: decision.clone(),
            accepted,
        };
        self.send_to_all(&Message::Accept { ballot, decision });
        self.advance();
    }

    /// Moves a lead on when what it waits for has come: every unsuspected
    /// member's promise (a quorum of them at least), or a quorum's
    /// acceptance.
    fn advance(&mut self) {
        match &self.lead {
            Lead::Idle => {}
            Lead::Preparing { ballot, promises } => {
                let heard = promises.iter().filter(|p| p.is_some()).count();
                let waiting = (0..self.size).any(|r| !self.suspected[r] && promises[r].is_none());
                if waiting || heard < self.quorum {
                    return;
                }
                let ballot = *ballot;
                let earlier = promises
                    .iter()
                    .flatten()
                    .filter_map(|(accepted, _)| accepted.clone())
                    .max_by_key(|(b, _)| *b);
                #[cfg(test)]
                let earlier = earlier.filter(|_| self.mutation != Some(Mutation::ForgetAccepted));
                let decision = match earlier {
                    Some((_, decision)) => decision,
                    None => {
                        let members: Vec<usize> =
                            (0..self.size).filter(|&r| promises[r].is_some()).collect();
                        let value = promises
                            .iter()
                            .flatten()
                            .fold(u64::MAX, |all, (_, input)| all & input);
                        Decision { value, members }
                    }
                };
                self.propose(ballot, decision);
            }
            Lead::Accepting {
                decision, accepted, ..
            } => {
                let count = accepted.iter().filter(|a| **a).count();
                #[cfg(test)]
                let count = if self.mutation == Some(Mutation::TrustOneAcceptance) && count > 0 {
                    self.quorum
                } else {
                    count
                };
                if count >= self.quorum {
                    let decision = decision.clone();
                    self.decide(decision);
                }
            }
        }
    }

    /// Takes the decision and passes it to every member not suspected, so
    /// it spreads even when its leader dies mid-way.
    fn decide(&mut self, decision: Decision) {
        if self.decided.is_some() {
            return;
        }
        self.lead = Lead::Idle;
        self.outbox.clear();
        self.decided = Some(decision.clone());
        self.send_to_all(&Message::Decide { decision });
    }
}
