//! A deterministic simulator for the agreement: members with their own
//! start times, links with random delays, crashes at any step, partitions
//! that make live members suspect each other; after every run it checks
//! what the protocol promises (decision 0039):
//!
//! - agreement: every member that decides, decides the same (with a
//!   quorum below a majority, every member that decides and lives: such a
//!   quorum holds only where no partition or hang makes live members
//!   suspect each other, so those runs have none);
//! - validity: the decision's value is the AND of its members' inputs,
//!   its members started, and there are at least a quorum of them;
//! - termination: at the end, every member still alive has decided or
//!   knows it has lost its quorum (so the caller fails it, saying why).
//!
//! The same runs with a deliberately broken protocol ([`Mutation`]) must
//! fail, which shows the checks can fail.

use super::protocol::{Agreement, Decision, Message, Mutation};
use crate::testing::Rng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One simulated run's plan.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    pub(crate) size: usize,
    pub(crate) quorum: usize,
    pub(crate) inputs: Vec<u64>,
    /// When each member starts the agreement.
    pub(crate) starts: Vec<u64>,
    /// Member and the number of events it handles before it crashes.
    pub(crate) crashes: Vec<(usize, usize)>,
    /// At this time, links between the two sides are cut.
    pub(crate) partition: Option<(u64, Vec<usize>)>,
    pub(crate) seed: u64,
    pub(crate) mutation: Option<Mutation>,
    /// Links (from, to) whose first message is lost.
    pub(crate) losses: Vec<(usize, usize)>,
    /// When every member is asked to retry (`Agreement::retry`: a leader
    /// that heard nothing for a while).
    pub(crate) retries: Vec<u64>,
}

#[derive(Debug)]
enum Event {
    Start(usize),
    Deliver {
        from: usize,
        to: usize,
        message: Message,
    },
    Suspect {
        who: usize,
        of: usize,
    },
    Partition(Vec<usize>),
    Retry(usize),
}

struct Member {
    agreement: Option<Agreement>,
    /// Messages that came before it started.
    early: Vec<(usize, Message)>,
    handled: usize,
    crash_after: Option<usize>,
    crashed: bool,
}

/// What one run ended with, per member: crashed, or its decision, or
/// whether it lost its quorum.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) decisions: Vec<Option<Decision>>,
    pub(crate) crashed: Vec<bool>,
    pub(crate) quorum_lost: Vec<bool>,
}

/// Runs `plan` to the end (no event left).
pub(crate) fn run(plan: &Plan) -> Outcome {
    let mut rng = Rng::new(plan.seed);
    let n = plan.size;
    let mut members: Vec<Member> = (0..n)
        .map(|i| Member {
            agreement: None,
            early: Vec::new(),
            handled: 0,
            crash_after: plan.crashes.iter().find(|(r, _)| *r == i).map(|(_, k)| *k),
            crashed: false,
        })
        .collect();
    // (time, sequence) orders events; ties keep their order of scheduling.
    let mut queue: BTreeMap<(u64, u64), Event> = BTreeMap::new();
    let mut seq = 0u64;
    let mut schedule = |queue: &mut BTreeMap<(u64, u64), Event>, at: u64, event: Event| {
        seq += 1;
        queue.insert((at, seq), event);
    };
    for (i, &at) in plan.starts.iter().enumerate() {
        schedule(&mut queue, at, Event::Start(i));
    }
    if let Some((at, side)) = &plan.partition {
        schedule(&mut queue, *at, Event::Partition(side.clone()));
    }
    for &at in &plan.retries {
        for i in 0..n {
            schedule(&mut queue, at, Event::Retry(i));
        }
    }
    let mut losses: BTreeSet<(usize, usize)> = plan.losses.iter().copied().collect();
    let mut closed: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut events = 0;
    while let Some(((now, _), event)) = queue.pop_first() {
        events += 1;
        assert!(events < 200_000, "the run does not end: {plan:?}");
        // Which member handles this event (crashes count its events).
        let at = match &event {
            Event::Start(i) => Some(*i),
            Event::Deliver { to, .. } => Some(*to),
            Event::Suspect { who, .. } => Some(*who),
            Event::Retry(i) => Some(*i),
            Event::Partition(_) => None,
        };
        if let Some(i) = at {
            if members[i].crashed {
                continue;
            }
            if members[i].crash_after == Some(members[i].handled) {
                members[i].crashed = true;
                // Its peers see the link go (a closed socket, or silence
                // past the heartbeat timeout), each in its own time.
                for j in 0..n {
                    if j != i {
                        let delay = 1 + rng.below(40);
                        schedule(&mut queue, now + delay, Event::Suspect { who: j, of: i });
                    }
                }
                continue;
            }
            members[i].handled += 1;
        }
        match event {
            Event::Start(i) => {
                let mut a = Agreement::new(i, n, plan.quorum, plan.inputs[i]);
                a.mutation = plan.mutation;
                for peer in 0..n {
                    if closed.contains(&(i, peer)) {
                        a.suspect(peer);
                    }
                }
                for (from, message) in std::mem::take(&mut members[i].early) {
                    a.receive(from, message);
                }
                members[i].agreement = Some(a);
            }
            Event::Deliver { from, to, message } => {
                if closed.contains(&(from, to)) || losses.remove(&(from, to)) {
                    continue;
                }
                match &mut members[to].agreement {
                    Some(a) => a.receive(from, message),
                    None => members[to].early.push((from, message)),
                }
            }
            Event::Suspect { who, of } => {
                if !closed.contains(&(who, of)) {
                    // Closing a link is seen from both ends.
                    closed.insert((who, of));
                    closed.insert((of, who));
                    let delay = 1 + rng.below(20);
                    schedule(&mut queue, now + delay, Event::Suspect { who: of, of: who });
                }
                if let Some(a) = &mut members[who].agreement {
                    a.suspect(of);
                }
            }
            Event::Retry(i) => {
                if let Some(a) = &mut members[i].agreement {
                    a.retry();
                }
            }
            Event::Partition(side) => {
                for &a in &side {
                    for b in (0..n).filter(|b| !side.contains(b)) {
                        let delay = 1 + rng.below(40);
                        schedule(&mut queue, now + delay, Event::Suspect { who: a, of: b });
                        let delay = 1 + rng.below(40);
                        schedule(&mut queue, now + delay, Event::Suspect { who: b, of: a });
                        // Nothing crosses a cut link any more.
                        closed.insert((a, b));
                        closed.insert((b, a));
                    }
                }
            }
        }
        // Whatever the member has to send leaves now, each message with
        // its own delay (links keep their order: a later message never
        // arrives before an earlier one on the same link).
        if let Some(i) = at
            && let Some(a) = members[i].agreement.as_mut()
        {
            let mut outgoing = VecDeque::new();
            while let Some(m) = a.next_message() {
                outgoing.push_back(m);
            }
            let mut last: BTreeMap<usize, u64> = BTreeMap::new();
            for (to, message) in outgoing {
                let earliest = last.get(&to).copied().unwrap_or(now);
                let arrive = earliest.max(now) + 1 + rng.below(10);
                last.insert(to, arrive);
                schedule(&mut queue, arrive, Event::Deliver { from: i, to, message });
            }
        }
    }
    Outcome {
        decisions: members
            .iter()
            .map(|m| m.agreement.as_ref().and_then(|a| a.decision().cloned()))
            .collect(),
        crashed: members.iter().map(|m| m.crashed).collect(),
        quorum_lost: members
            .iter()
            .map(|m| m.agreement.as_ref().is_some_and(Agreement::quorum_lost))
            .collect(),
    }
}

/// The properties of decision 0039 on one outcome; `Err` names the first
/// broken one.
pub(crate) fn check(plan: &Plan, outcome: &Outcome) -> Result<(), String> {
    let decided: Vec<(usize, &Decision)> = outcome
        .decisions
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.as_ref().map(|d| (i, d)))
        .collect();
    // Uniform with a majority quorum; among the living below it.
    let uniform = plan.quorum > plan.size / 2;
    let decided: Vec<(usize, &Decision)> = decided
        .into_iter()
        .filter(|(i, _)| uniform || !outcome.crashed[*i])
        .collect();
    if let Some((first, d0)) = decided.first() {
        for (i, d) in &decided {
            if d != d0 {
                return Err(format!(
                    "agreement: member {first} decided {d0:?}, member {i} decided {d:?}"
                ));
            }
        }
        let value = d0
            .members
            .iter()
            .fold(u64::MAX, |all, &m| all & plan.inputs[m]);
        if value != d0.value {
            return Err(format!(
                "validity: {d0:?} is not the AND of its members' inputs ({value:#x})"
            ));
        }
        if d0.members.len() < plan.quorum || d0.members.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "validity: {d0:?} has fewer than {} members, or not in order",
                plan.quorum
            ));
        }
    }
    for i in 0..plan.size {
        let stuck = !outcome.crashed[i] && outcome.decisions[i].is_none() && !outcome.quorum_lost[i];
        if stuck {
            return Err(format!(
                "termination: member {i} is alive, undecided and still has its quorum"
            ));
        }
    }
    Ok(())
}

/// A random plan of `size` members: random starts, 0 to `size - quorum +
/// 1` crashes at random steps, and sometimes a partition.
pub(crate) fn random_plan(seed: u64, size: usize, mutation: Option<Mutation>) -> Plan {
    let mut rng = Rng::new(seed);
    let quorum = if rng.below(4) == 0 {
        1 + rng.below(size as u64) as usize
    } else {
        Agreement::majority(size)
    };
    let inputs = (0..size)
        .map(|_| {
            // Mostly all ones, some with bits cleared: the AND matters.
            if rng.below(3) == 0 {
                !(1u64 << rng.below(8))
            } else {
                u64::MAX
            }
        })
        .collect();
    let starts = (0..size).map(|_| rng.below(30)).collect();
    let crash_count = rng.below((size - quorum.min(size) + 2) as u64) as usize;
    let mut crashes = Vec::new();
    for _ in 0..crash_count {
        let who = rng.below(size as u64) as usize;
        if crashes.iter().all(|(r, _)| *r != who) {
            crashes.push((who, rng.below(12) as usize));
        }
    }
    // A quorum below a majority is safe only without false suspicions.
    let partition = (quorum > size / 2 && rng.below(4) == 0).then(|| {
        let side: Vec<usize> = (0..size).filter(|_| rng.below(2) == 0).collect();
        (rng.below(60), side)
    });
    // Sometimes a lost message, which only a retry after it makes good;
    // sometimes retries anyway (a slow round), which must change nothing.
    let losses: Vec<(usize, usize)> = (0..rng.below(3))
        .map(|_| (rng.below(size as u64) as usize, rng.below(size as u64) as usize))
        .filter(|(a, b)| a != b)
        .collect();
    let mut retries: Vec<u64> = (0..rng.below(3)).map(|_| rng.below(80)).collect();
    if !losses.is_empty() {
        retries.extend([200, 400, 600]);
    }
    Plan {
        size,
        quorum,
        inputs,
        starts,
        crashes,
        partition,
        seed,
        mutation,
        losses,
        retries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_and_check(plan: &Plan) -> Result<Outcome, String> {
        let outcome = run(plan);
        check(plan, &outcome).map(|()| outcome)
    }

    #[test]
    fn everyone_alive_decides_all_members_and_the_and_of_inputs() {
        for size in 1..=7 {
            let plan = Plan {
                size,
                quorum: Agreement::majority(size),
                inputs: (0..size).map(|i| !(1u64 << i)).collect(),
                starts: vec![0; size],
                crashes: vec![],
                partition: None,
                seed: size as u64,
                mutation: None,
                ..Plan::default()
            };
            let outcome = run_and_check(&plan).unwrap();
            let want = Decision {
                value: (0..size).fold(u64::MAX, |v, i| v & !(1u64 << i)),
                members: (0..size).collect(),
            };
            for d in &outcome.decisions {
                assert_eq!(d.as_ref(), Some(&want), "size {size}");
            }
        }
    }

    #[test]
    fn a_lost_message_is_made_good_by_the_leaders_retry() {
        for lost in [(0, 2), (2, 0), (1, 0)] {
            let plan = Plan {
                size: 3,
                quorum: 2,
                inputs: vec![u64::MAX; 3],
                starts: vec![0; 3],
                seed: 7,
                losses: vec![lost],
                ..Plan::default()
            };
            // Without a retry the leader waits for the lost message.
            let outcome = run(&plan);
            assert!(outcome.decisions.iter().all(Option::is_none), "{lost:?}");
            let plan = Plan {
                retries: vec![500],
                ..plan
            };
            let outcome = run_and_check(&plan).unwrap();
            for d in &outcome.decisions {
                assert_eq!(d.as_ref().map(|d| d.members.clone()), Some(vec![0, 1, 2]));
            }
        }
    }

    #[test]
    fn a_crash_at_every_step_of_every_member_keeps_the_survivors_agreed() {
        let mut runs = 0;
        for size in 2..=5 {
            for victim in 0..size {
                for step in 0..16 {
                    for seed in 0..3 {
                        let plan = Plan {
                            size,
                            quorum: Agreement::majority(size),
                            inputs: (0..size).map(|i| !(1u64 << (i % 3))).collect(),
                            starts: (0..size).map(|i| (i as u64 * seed) % 7).collect(),
                            crashes: vec![(victim, step)],
                            partition: None,
                            seed: seed * 1000 + step as u64,
                            mutation: None,
                            ..Plan::default()
                        };
                        let outcome = run_and_check(&plan)
                            .unwrap_or_else(|e| panic!("{e}\nplan: {plan:?}"));
                        // With a majority left, every survivor decides a
                        // set without the victim unless it joined first.
                        if size > Agreement::majority(size) {
                            for (i, d) in outcome.decisions.iter().enumerate() {
                                if i != victim {
                                    assert!(d.is_some(), "member {i} undecided: {plan:?}");
                                }
                            }
                        }
                        runs += 1;
                    }
                }
            }
        }
        assert!(runs > 500);
    }

    #[test]
    fn two_crashes_at_every_pair_of_steps_of_the_first_two_leaders() {
        // The leader dies mid-way, then the next one does too.
        for size in [4, 5] {
            for first in 0..10 {
                for second in 0..10 {
                    let plan = Plan {
                        size,
                        quorum: Agreement::majority(size),
                        inputs: vec![u64::MAX; size],
                        starts: vec![0; size],
                        crashes: vec![(0, first), (1, second)],
                        partition: None,
                        seed: (first * 10 + second) as u64,
                        mutation: None,
                        ..Plan::default()
                    };
                    run_and_check(&plan).unwrap_or_else(|e| panic!("{e}\nplan: {plan:?}"));
                }
            }
        }
    }

    #[test]
    fn a_minority_cut_off_never_decides_apart_from_the_majority() {
        for seed in 0..300 {
            let size = 3 + (seed % 5) as usize;
            // Fewer than half: the rest hold a majority.
            let minority: Vec<usize> =
                (0..(size - 1) / 2).map(|i| (i + seed as usize) % size).collect();
            let plan = Plan {
                size,
                quorum: Agreement::majority(size),
                inputs: vec![u64::MAX; size],
                starts: vec![0; size],
                crashes: vec![],
                // Cut before anything could be decided.
                partition: Some((0, minority.clone())),
                seed,
                mutation: None,
                ..Plan::default()
            };
            let outcome = run_and_check(&plan).unwrap_or_else(|e| panic!("{e}\nplan: {plan:?}"));
            for i in 0..size {
                if minority.contains(&i) {
                    // Either it heard the majority's decision before the cut
                    // closed its links, or it knows it lost its quorum.
                    let d = &outcome.decisions[i];
                    assert!(
                        d.as_ref().is_none_or(|d| !d.members.contains(&i)) || outcome.quorum_lost[i],
                        "minority member {i}: {d:?}"
                    );
                } else {
                    assert!(outcome.decisions[i].is_some(), "majority member {i} undecided");
                }
            }
        }
    }

    #[test]
    fn random_runs_with_crashes_partitions_and_late_starts() {
        let seed0 = Rng::fresh_seed();
        for k in 0..3000u64 {
            let seed = seed0.wrapping_add(k);
            let size = 1 + (seed % 8) as usize;
            let plan = random_plan(seed, size, None);
            if let Err(e) = run_and_check(&plan) {
                panic!("seed {seed}: {e}\nplan: {plan:?}");
            }
        }
    }

    /// Runs random plans with `mutation` until one breaks a property.
    fn a_broken_protocol_is_caught(mutation: Mutation) -> String {
        for seed in 0..20_000u64 {
            let size = 2 + (seed % 6) as usize;
            let plan = random_plan(seed, size, Some(mutation));
            if let Err(e) = run_and_check(&plan) {
                return e;
            }
        }
        panic!("{mutation:?} broke nothing in 20000 runs: the checks cannot fail");
    }

    #[test]
    fn skipping_the_prepare_round_is_caught() {
        let e = a_broken_protocol_is_caught(Mutation::SkipPrepare);
        assert!(e.starts_with("agreement") || e.starts_with("validity"), "{e}");
    }

    #[test]
    fn trusting_one_acceptance_is_caught() {
        let e = a_broken_protocol_is_caught(Mutation::TrustOneAcceptance);
        assert!(e.starts_with("agreement") || e.starts_with("validity"), "{e}");
    }

    #[test]
    fn forgetting_what_was_accepted_is_caught() {
        let e = a_broken_protocol_is_caught(Mutation::ForgetAccepted);
        assert!(e.starts_with("agreement"), "{e}");
    }
}
