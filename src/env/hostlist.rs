//! Slurm's compressed host lists (`node[01-04,07]`, `a1,b[2-3]`,
//! `rack[1-2]-n3`), as in `SLURM_JOB_NODELIST`: read whole, so a malformed
//! one is an error naming where, and only the first host made (where Slurm
//! starts rank 0).

/// One piece of a host name pattern in a Slurm host list.
#[derive(Debug)]
enum HostPiece<'a> {
    /// Characters taken as they are.
    Text(&'a str),
    /// A bracket group, `[01-04,7]`: each range's first and last number and
    /// the digits its first number was written with (zero padding is kept).
    Ranges(Vec<(u64, u64, usize)>),
}

/// Parses a Slurm host list, as in `SLURM_JOB_NODELIST`: comma-separated
/// items, each a host name in which bracket groups stand for numbers
/// (`node[01-04,07]`, `a1,b[2-3]`, `rack[1-2]-n3`, `r[1-2]n[01-02]`).
/// Returns the items' patterns, or why the list is malformed.
fn parse_hostlist(list: &str) -> Result<Vec<Vec<HostPiece<'_>>>, String> {
    let bytes = list.as_bytes();
    let mut items = Vec::new();
    let mut pieces = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i <= bytes.len() {
        match bytes.get(i) {
            None | Some(b',') => {
                if text_start < i {
                    pieces.push(HostPiece::Text(&list[text_start..i]));
                }
                if pieces.is_empty() {
                    return Err(format!("an empty host name at byte {i}"));
                }
                items.push(std::mem::take(&mut pieces));
                text_start = i + 1;
            }
            Some(b'[') => {
                if text_start < i {
                    pieces.push(HostPiece::Text(&list[text_start..i]));
                }
                let Some(close) = list[i + 1..].find(['[', ']']).map(|k| i + 1 + k) else {
                    return Err(format!("the '[' at byte {i} is never closed"));
                };
                if bytes[close] == b'[' {
                    return Err(format!("a '[' at byte {close} inside brackets"));
                }
                pieces.push(HostPiece::Ranges(parse_ranges(&list[i + 1..close])?));
                i = close;
                text_start = close + 1;
            }
            Some(b']') => return Err(format!("the ']' at byte {i} closes no '['")),
            Some(b) if b.is_ascii_whitespace() || b.is_ascii_control() => {
                return Err(format!("a space or control character at byte {i}"));
            }
            Some(_) => {}
        }
        i += 1;
    }
    Ok(items)
}

/// The inside of a bracket group: `01-04,07`.
fn parse_ranges(inside: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    if inside.is_empty() {
        return Err("empty brackets []".to_owned());
    }
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    inside
        .split(',')
        .map(|part| {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            match (number(lo), number(hi)) {
                (Some(first), Some(last)) if first <= last => Ok((first, last, lo.len())),
                (Some(_), Some(_)) => Err(format!("the range {part} in [{inside}] runs backwards")),
                _ => Err(format!(
                    "{part:?} in [{inside}] is neither a number nor a range such as 01-04"
                )),
            }
        })
        .collect()
}

/// The first host of a Slurm host list (where Slurm starts rank 0), once
/// the whole list parses.
pub(super) fn first_host(list: &str) -> Result<String, String> {
    let items = parse_hostlist(list)?;
    Ok(items[0]
        .iter()
        .map(|piece| match piece {
            HostPiece::Text(text) => (*text).to_owned(),
            HostPiece::Ranges(ranges) => {
                let (first, _, width) = ranges[0];
                format!("{first:0width$}")
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_host_lists() {
        let expand = |list: &str| expand_hostlist(list).map_err(|e| format!("{list}: {e}"));
        for (list, hosts) in [
            ("node07", &["node07"][..]),
            (
                "node[01-04,07]",
                &["node01", "node02", "node03", "node04", "node07"],
            ),
            ("n[8-11]", &["n8", "n9", "n10", "n11"]),
            ("n[008-010]", &["n008", "n009", "n010"]),
            ("a1,b[2-3]", &["a1", "b2", "b3"]),
            ("b[2-3],a1", &["b2", "b3", "a1"]),
            ("rack[1-2]-n3", &["rack1-n3", "rack2-n3"]),
            ("r[1-2]n[01-02]", &["r1n01", "r1n02", "r2n01", "r2n02"]),
            (
                "gpu-a100.cluster[3,5]",
                &["gpu-a100.cluster3", "gpu-a100.cluster5"],
            ),
            ("[1-2]", &["1", "2"]),
            ("x[5]", &["x5"]),
        ] {
            assert_eq!(expand(list).unwrap(), hosts, "{list}");
            assert_eq!(first_host(list).unwrap(), hosts[0], "{list}");
        }
        // The first host needs no expansion of the rest.
        assert_eq!(first_host("n[0-99999999999]").unwrap(), "n0");
        for (list, why) in [
            ("", "empty host name"),
            ("a,,b", "empty host name at byte 2"),
            ("a,", "empty host name"),
            (",a", "empty host name at byte 0"),
            ("node[01-", "'[' at byte 4 is never closed"),
            ("node[1[2]]", "'[' at byte 6 inside brackets"),
            ("node]1", "']' at byte 4 closes no '['"),
            ("node[]", "empty brackets"),
            ("node[1-]", "neither a number nor a range"),
            ("node[-3]", "neither a number nor a range"),
            ("node[1,,2]", "neither a number nor a range"),
            ("node[a-c]", "neither a number nor a range"),
            ("node[1-2-3]", "neither a number nor a range"),
            ("node[+1]", "neither a number nor a range"),
            ("node[99999999999999999999]", "neither a number nor a range"),
            ("node[4-1]", "runs backwards"),
            ("node1 node2", "space or control character at byte 5"),
        ] {
            let e = first_host(list).unwrap_err();
            assert!(e.contains(why), "{list:?}: {e:?} lacks {why:?}");
        }
    }

    /// Every host of a list, for the tests (ringwire needs only the first).
    fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
        let mut hosts = Vec::new();
        for item in parse_hostlist(list)? {
            let mut names = vec![String::new()];
            for piece in &item {
                names = match piece {
                    HostPiece::Text(text) => names.into_iter().map(|n| n + text).collect(),
                    HostPiece::Ranges(ranges) => names
                        .iter()
                        .flat_map(|n| {
                            ranges.iter().flat_map(move |&(first, last, width)| {
                                (first..=last).map(move |v| format!("{n}{v:0width$}"))
                            })
                        })
                        .collect(),
                };
            }
            hosts.extend(names);
        }
        Ok(hosts)
    }
}
