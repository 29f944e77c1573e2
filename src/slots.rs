//! The store keys of a running job's slots, and what members tell a
//! replacement they admit (decision 0040).
//!
//! A job's ranks at launch are slots `0..N`. The rendezvous publishes
//! each rank's listen addresses under the job's prefix (`addr/{r}`,
//! `local/{r}`, `host/{r}`); a replacement of slot `r` claims the next
//! incarnation of it (`slot/{r}/incarnation`, counted up), publishes its
//! own under `slot/{r}/{inc}/`, and says it waits (`rejoin/{r}` = its
//! incarnation). Members that admit it pick one incarnation per slot by
//! compare-and-set (`admit/{comm}/{r}`), tell it the communicator
//! (`slot/{r}/{inc}/admitted`) and count themselves ready to link with it
//! (`slot/{r}/{inc}/ready`). Rank 0 writes the job's prefix under a key
//! outside torchrun's attempt (`running`), where a replacement, whose
//! agent counts its own restarts, finds it.

use crate::error::Error;
use crate::store::{Store, StoreError};

/// The keys of one job, under its prefix (`ringwire/{job}/...`, ending in
/// `/`).
pub(crate) struct JobKeys<'a> {
    pub(crate) prefix: &'a str,
}

impl JobKeys<'_> {
    /// Where rank 0 writes the prefix of the job it launched: under the
    /// job's name and torchrun's run id, not its restart count.
    pub(crate) fn running(job: &str, run_id: Option<&str>) -> String {
        match run_id {
            Some(run) => format!("ringwire/{job}/{run}/running"),
            None => format!("ringwire/{job}/running"),
        }
    }

    /// A key of the job.
    pub(crate) fn key(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }

    /// What `slot`'s process `incarnation` published as `what` (`addr`,
    /// `local`, `host`, `gbps`): the rendezvous's key for the process
    /// launched (incarnation 0), its own for a replacement.
    pub(crate) fn place(&self, what: &str, slot: usize, incarnation: u32) -> String {
        match incarnation {
            0 => self.key(&format!("{what}/{slot}")),
            inc => self.key(&format!("slot/{slot}/{inc}/{what}")),
        }
    }

    /// The count of `slot`'s incarnations claimed.
    pub(crate) fn incarnations(&self, slot: usize) -> String {
        self.key(&format!("slot/{slot}/incarnation"))
    }

    /// The incarnation of `slot` that waits to be admitted, if one does.
    pub(crate) fn waiting(&self, slot: usize) -> String {
        self.key(&format!("rejoin/{slot}"))
    }

    /// Which incarnation of `slot` the admission that makes communicator
    /// `comm_id` takes (the first member to write it decides).
    pub(crate) fn admitting(&self, comm_id: u64, slot: usize) -> String {
        self.key(&format!("admit/{comm_id:016x}/{slot}"))
    }

    /// Which communicator took `slot`'s process `incarnation` in (the
    /// first admission to write it: two communicators that both lost the
    /// rank do not both take the same process).
    pub(crate) fn taken(&self, slot: usize, incarnation: u32) -> String {
        self.key(&format!("slot/{slot}/{incarnation}/taken"))
    }

    /// What the members tell `slot`'s process `incarnation` once they
    /// admitted it: an [`Admission`].
    pub(crate) fn admitted(&self, slot: usize, incarnation: u32) -> String {
        self.key(&format!("slot/{slot}/{incarnation}/admitted"))
    }

    /// How many members are ready to link with `slot`'s process
    /// `incarnation`.
    pub(crate) fn ready(&self, slot: usize, incarnation: u32) -> String {
        self.key(&format!("slot/{slot}/{incarnation}/ready"))
    }

    /// The incarnation of `slot` waiting to be admitted that is newer than
    /// `current` and no communicator took yet, if any.
    pub(crate) fn waiting_incarnation(
        &self,
        store: &dyn Store,
        slot: usize,
        current: u32,
    ) -> Result<Option<u32>, StoreError> {
        let waiting = store
            .try_get(&self.waiting(slot))?
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u32>().ok())
            .filter(|&inc| inc > current);
        match waiting {
            Some(inc) if store.try_get(&self.taken(slot, inc))?.is_none() => Ok(Some(inc)),
            _ => Ok(None),
        }
    }
}

/// What the members of an admission tell the replacements: the
/// communicator they made (its id, its members as world ranks in order),
/// which incarnation of every slot each of them links with, and which
/// slots this admission took in (the other members count themselves
/// ready under each of those).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Admission {
    pub(crate) comm_id: u64,
    pub(crate) members: Vec<usize>,
    pub(crate) incarnations: Vec<u32>,
    pub(crate) joined: Vec<usize>,
    /// The world ranks of the communicator the members' line began with
    /// (the places later admissions may fill).
    pub(crate) line: Vec<usize>,
}

impl Admission {
    /// As stored: `{comm_id:016x} {members} {incarnations} {joined}
    /// {line}`, each list comma-separated.
    pub(crate) fn encode(&self) -> String {
        let list = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(",");
        format!(
            "{:016x} {} {} {} {}",
            self.comm_id,
            list(&mut self.members.iter().map(usize::to_string)),
            list(&mut self.incarnations.iter().map(u32::to_string)),
            list(&mut self.joined.iter().map(usize::to_string)),
            list(&mut self.line.iter().map(usize::to_string)),
        )
    }

    /// Reads [`Admission::encode`]'s text.
    pub(crate) fn decode(text: &[u8]) -> Result<Admission, Error> {
        let bad = || {
            Error::Rendezvous(format!(
                "the store holds a bad admission {:?}",
                String::from_utf8_lossy(text)
            ))
        };
        let text = std::str::from_utf8(text).map_err(|_| bad())?;
        let mut parts = text.split(' ');
        let (Some(id), Some(members), Some(incs), Some(joined), Some(line), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        let ranks = |list: &str| {
            list.split(',')
                .map(|m| m.parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| bad())
        };
        let joined = ranks(joined)?;
        let line = ranks(line)?;
        let comm_id = u64::from_str_radix(id, 16).map_err(|_| bad())?;
        let members = ranks(members)?;
        let incarnations = incs
            .split(',')
            .map(|m| m.parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad())?;
        if members.iter().any(|&m| m >= incarnations.len())
            || joined.iter().any(|j| !members.contains(j))
            || members.iter().any(|m| !line.contains(m))
        {
            return Err(bad());
        }
        Ok(Admission {
            comm_id,
            members,
            incarnations,
            joined,
            line,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admission_reads_back_and_a_bad_one_is_an_error() {
        let a = Admission {
            comm_id: 0xfeed_0000_0000_0001,
            members: vec![0, 1, 3],
            incarnations: vec![0, 0, 0, 2],
            joined: vec![3],
            line: vec![0, 1, 2, 3],
        };
        assert_eq!(a.encode(), "feed000000000001 0,1,3 0,0,0,2 3 0,1,2,3");
        assert_eq!(Admission::decode(a.encode().as_bytes()).unwrap(), a);
        for bad in [
            "",
            "x 0 0 0 0",
            "01 0,1 0,0 0",
            "01 0,5 0,0 0 0,5",
            "01 0 0 1 0,1",
            "01 0,1 0,0 1 0",
            "01 0 0 0 0 extra",
        ] {
            assert!(Admission::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_replacement_publishes_under_its_slot_and_incarnation() {
        let keys = JobKeys {
            prefix: "ringwire/j/",
        };
        assert_eq!(keys.place("addr", 2, 0), "ringwire/j/addr/2");
        assert_eq!(keys.place("addr", 2, 1), "ringwire/j/slot/2/1/addr");
        assert_eq!(JobKeys::running("j", None), "ringwire/j/running");
        assert_eq!(JobKeys::running("j", Some("r")), "ringwire/j/r/running");
    }
}
