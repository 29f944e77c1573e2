//! Rows of results and how they are printed: an nccl-tests-style table with
//! latency percentiles, CPU cost and the share of the link limit, plus JSON,
//! CSV and the closing averages.

use serde::Serialize;
use std::fmt::Write as _;

/// One measured (size, transport) point.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Row {
    pub(crate) transport: String,
    pub(crate) size_bytes: usize,
    pub(crate) count: usize,
    pub(crate) dtype: String,
    pub(crate) redop: String,
    pub(crate) root: Option<usize>,
    pub(crate) iters: usize,
    pub(crate) time_us: f64,
    pub(crate) algbw_gbps: f64,
    pub(crate) busbw_gbps: f64,
    pub(crate) wrong: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
    /// CPU seconds (user + sys, all ranks) per GB of op payload moved.
    pub(crate) cpu_s_per_gb: Option<f64>,
    /// busbw as a percentage of the ring link limit.
    pub(crate) link_pct: Option<f64>,
    /// The link limit the percentage is taken of (GB/s): the mean of the
    /// limits measured just before and after this size where it was
    /// bracketed, else the limit measured before the sweep.
    pub(crate) link_limit_gbps: Option<f64>,
    /// That limit's own CPU seconds (all ranks) per GB each rank streamed;
    /// set beside `cpu_s_per_gb` over the op's bus factor, it shows how much
    /// more CPU a byte of the op's bus traffic costs than a plain stream's.
    pub(crate) link_cpu_s_per_gb: Option<f64>,
    /// Bytes of the buffers that limit streamed from and into.
    pub(crate) link_buffer_bytes: Option<usize>,
    /// The kind of link (tcp, unix) this row's ring ran over.
    pub(crate) link_kind: String,
    /// Peak resident memory (KiB) of the rank with the most, after this row.
    pub(crate) max_rss_kib: u64,
    /// The op ran in two levels, within each host and across hosts
    /// (RINGWIRE_TWO_LEVEL; decision 0033).
    pub(crate) two_level: bool,
}

/// algbw in GB/s (1e9 bytes) from bytes and seconds.
pub(crate) fn algbw(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

pub(crate) fn header() -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#{:>9} {:>12} {:>11} {:>5} {:>5} {:>4} {:>10} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>8} {:>6} {:>7}",
        "transport",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "p50",
        "p99",
        "max",
        "cpu",
        "link",
        "rss"
    );
    let _ = write!(
        s,
        "#{:>9} {:>12} {:>11} {:>5} {:>5} {:>4} {:>10} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>8} {:>6} {:>7}",
        "",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(us)",
        "(us)",
        "(s/GB)",
        "(%)",
        "(MiB)"
    );
    s
}

fn opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ => "-".into(),
    }
}

pub(crate) fn format_row(r: &Row) -> String {
    format!(
        " {:>9} {:>12} {:>11} {:>5} {:>5} {:>4} {:>10.1} {:>7.3} {:>7.3} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>6} {:>7.1}",
        r.transport,
        r.size_bytes,
        r.count,
        r.dtype,
        r.redop,
        r.root.map_or("-".to_string(), |x| x.to_string()),
        r.time_us,
        r.algbw_gbps,
        r.busbw_gbps,
        r.wrong,
        r.p50_us,
        r.p99_us,
        r.max_us,
        opt(r.cpu_s_per_gb, 3),
        opt(r.link_pct, 1),
        r.max_rss_kib as f64 / 1024.0,
    )
}

/// The line under the table on how a link's lanes shared its bytes
/// (decision 0034): each lane's share of the bytes, its pieces and the
/// bytes it last held unacknowledged; then the lanes' SEND_ZC sends and
/// how many the kernel copied after all. `None` without lanes.
pub(crate) fn lane_shares(stats: &[ringwire::LaneStats]) -> Option<String> {
    let total: u64 = stats.iter().map(|l| l.bytes_sent).sum();
    if stats.is_empty() || total == 0 {
        return None;
    }
    let mut line = format!("{} lanes carried {} B:", stats.len(), total);
    for (i, l) in stats.iter().enumerate() {
        let share = 100.0 * l.bytes_sent as f64 / total as f64;
        let _ = write!(
            line,
            " lane {i} {share:.1}% ({} pieces, {} B unacked",
            l.pieces_sent, l.unacked_bytes
        );
        if l.delivery_rate > 0 {
            let _ = write!(line, ", {:.1} MB/s", l.delivery_rate as f64 / 1e6);
        }
        line.push(')');
    }
    let zero_copy: u64 = stats.iter().map(|l| l.zero_copy_sends).sum();
    let copied: u64 = stats.iter().map(|l| l.copied_sends).sum();
    let _ = write!(line, "; {zero_copy} SEND_ZC sends, {copied} copied");
    Some(line)
}

/// The line under the table on what rank 0's engine threads did
/// (decision 0036): per thread, its core, the bytes it moved, its CPU
/// seconds per GB moved and how much of a core it used over `elapsed`.
/// `None` without
/// engine threads.
pub(crate) fn engine_threads(
    stats: &[ringwire::EngineThreadStats],
    elapsed: std::time::Duration,
) -> Option<String> {
    if stats.is_empty() {
        return None;
    }
    let mut line = format!("{} engine threads:", stats.len());
    for (i, t) in stats.iter().enumerate() {
        let core = t
            .core
            .map_or("unpinned".to_string(), |c| format!("core {c}"));
        let per_gb = match t.bytes {
            0 => "-".to_string(),
            b => format!("{:.3}", t.cpu.as_secs_f64() / (b as f64 / 1e9)),
        };
        let busy = 100.0 * t.cpu.as_secs_f64() / elapsed.as_secs_f64().max(1e-9);
        let _ = write!(
            line,
            " thread {i} ({core}) {} B, {per_gb} CPU s/GB, {busy:.0}% of a core;",
            t.bytes
        );
    }
    line.pop();
    Some(line)
}

/// Per transport, the sizes whose op ran in two levels, as ranges of
/// consecutive rows ("16777216-67108864"), for the line under the table.
pub(crate) fn two_level_sizes(rows: &[Row]) -> Vec<(String, String)> {
    /// One transport's ranges so far, and whether its last row ran in two
    /// levels.
    struct Seen {
        transport: String,
        ranges: Vec<(usize, usize)>,
        previous: bool,
    }
    let mut seen: Vec<Seen> = Vec::new();
    for r in rows {
        let i = match seen.iter().position(|s| s.transport == r.transport) {
            Some(i) => i,
            None => {
                seen.push(Seen {
                    transport: r.transport.clone(),
                    ranges: Vec::new(),
                    previous: false,
                });
                seen.len() - 1
            }
        };
        let s = &mut seen[i];
        if r.two_level {
            match s.ranges.last_mut() {
                Some((_, hi)) if s.previous => *hi = r.size_bytes,
                _ => s.ranges.push((r.size_bytes, r.size_bytes)),
            }
        }
        s.previous = r.two_level;
    }
    let out = seen.into_iter().map(|s| (s.transport, s.ranges));
    out.filter(|(_, ranges)| !ranges.is_empty())
        .map(|(t, ranges)| {
            let text: Vec<String> = ranges
                .iter()
                .map(|&(lo, hi)| match lo == hi {
                    true => lo.to_string(),
                    false => format!("{lo}-{hi}"),
                })
                .collect();
            (t, text.join(", "))
        })
        .collect()
}

/// `avg bus bandwidth` per transport, over the rows of that transport (as
/// nccl-tests averages over sizes).
pub(crate) fn averages(rows: &[Row]) -> Vec<(String, f64)> {
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        if !names.contains(&r.transport) {
            names.push(r.transport.clone());
        }
    }
    names
        .into_iter()
        .map(|t| {
            let bws: Vec<f64> = rows
                .iter()
                .filter(|r| r.transport == t)
                .map(|r| r.busbw_gbps)
                .collect();
            let avg = bws.iter().sum::<f64>() / bws.len().max(1) as f64;
            (t, avg)
        })
        .collect()
}

/// With several transports: per size, each transport's busbw divided by the
/// first transport's.
pub(crate) fn ratios(rows: &[Row]) -> Option<String> {
    let avgs = averages(rows);
    if avgs.len() < 2 {
        return None;
    }
    let base = &avgs[0].0;
    let mut s = format!("# busbw ratio to {base}, per size:\n#{:>12}", "size (B)");
    for (t, _) in &avgs[1..] {
        let _ = write!(s, " {t:>10}");
    }
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.size_bytes).collect();
    sizes.dedup();
    for size in sizes {
        let bw = |t: &str| {
            rows.iter()
                .find(|r| r.size_bytes == size && r.transport == t)
                .map(|r| r.busbw_gbps)
        };
        let _ = write!(s, "\n {size:>12}");
        for (t, _) in &avgs[1..] {
            let ratio = match (bw(t), bw(base)) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            let _ = write!(s, " {ratio:>10}");
        }
    }
    Some(s)
}

pub(crate) fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "transport,size_bytes,count,dtype,redop,root,iters,time_us,algbw_gbps,busbw_gbps,wrong,p50_us,p99_us,max_us,cpu_s_per_gb,link_pct,link_limit_gbps,link_cpu_s_per_gb,link_buffer_bytes,link_kind,max_rss_kib\n",
    );
    for r in rows {
        let o = |v: Option<f64>| v.map_or(String::new(), |x| x.to_string());
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.transport,
            r.size_bytes,
            r.count,
            r.dtype,
            r.redop,
            r.root.map_or(String::new(), |x| x.to_string()),
            r.iters,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            r.wrong,
            r.p50_us,
            r.p99_us,
            r.max_us,
            o(r.cpu_s_per_gb),
            o(r.link_pct),
            o(r.link_limit_gbps),
            o(r.link_cpu_s_per_gb),
            r.link_buffer_bytes.map_or(String::new(), |b| b.to_string()),
            r.link_kind,
            r.max_rss_kib
        );
    }
    s
}

/// `n` bytes as "4 MiB", "512 KiB" or "100 B" (exact units only).
pub(crate) fn human_bytes(n: usize) -> String {
    for (unit, div) in [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= div && n.is_multiple_of(div) {
            return format!("{} {unit}", n / div);
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_shares_say_what_each_lane_carried() {
        assert_eq!(lane_shares(&[]), None);
        let lane = |bytes_sent, pieces_sent, unacked_bytes| ringwire::LaneStats {
            bytes_sent,
            pieces_sent,
            unacked_bytes,
            zero_copy_sends: 1,
            copied_sends: 1,
            delivery_rate: unacked_bytes * 1000,
        };
        assert_eq!(lane_shares(&[lane(0, 0, 0)]), None, "nothing laned yet");
        let line = lane_shares(&[lane(300, 3, 0), lane(100, 1, 4096)]).unwrap();
        assert_eq!(
            line,
            "2 lanes carried 400 B: lane 0 75.0% (3 pieces, 0 B unacked) \
             lane 1 25.0% (1 pieces, 4096 B unacked, 4.1 MB/s); 2 SEND_ZC sends, 2 copied"
        );
    }

    #[test]
    fn the_engine_threads_line_says_what_each_moved_and_at_what_cost() {
        use std::time::Duration;
        assert_eq!(engine_threads(&[], Duration::from_secs(1)), None);
        let pinned = ringwire::EngineThreadStats {
            core: Some(5),
            entries: 10,
            bytes: 2_000_000_000,
            wakeups: 4,
            cpu: Duration::from_millis(600),
        };
        let idle = ringwire::EngineThreadStats::default();
        let line = engine_threads(&[pinned, idle], Duration::from_secs(2)).unwrap();
        assert_eq!(
            line,
            "2 engine threads: thread 0 (core 5) 2000000000 B, 0.300 CPU s/GB, 30% of a core; \
             thread 1 (unpinned) 0 B, - CPU s/GB, 0% of a core"
        );
    }

    fn row(t: &str, size: usize, busbw: f64) -> Row {
        Row {
            transport: t.into(),
            size_bytes: size,
            count: size / 4,
            dtype: "f32".into(),
            redop: "sum".into(),
            root: None,
            iters: 10,
            time_us: 1.0,
            algbw_gbps: busbw,
            busbw_gbps: busbw,
            wrong: 0,
            p50_us: 1.0,
            p99_us: 2.0,
            max_us: 3.0,
            cpu_s_per_gb: Some(0.5),
            link_pct: None,
            link_limit_gbps: None,
            link_cpu_s_per_gb: None,
            link_buffer_bytes: None,
            link_kind: "tcp".into(),
            max_rss_kib: 1,
            two_level: false,
        }
    }

    #[test]
    fn two_level_sizes_are_ranges_per_transport() {
        let mut rows = Vec::new();
        for (t, size, two) in [
            ("a", 1, false),
            ("b", 1, false),
            ("a", 2, true),
            ("b", 2, false),
            ("a", 4, true),
            ("b", 4, true),
            ("a", 8, false),
            ("a", 16, true),
        ] {
            let mut r = row(t, size, 1.0);
            r.two_level = two;
            rows.push(r);
        }
        assert_eq!(
            two_level_sizes(&rows),
            vec![("a".into(), "2-4, 16".into()), ("b".into(), "4".into())]
        );
    }

    #[test]
    fn algbw_is_bytes_per_second_in_gb() {
        assert_eq!(algbw(1_000_000_000, 2.0), 0.5);
        assert_eq!(algbw(10, 0.0), 0.0);
    }

    #[test]
    fn averages_and_ratios_per_transport() {
        let rows = vec![
            row("portable", 8, 1.0),
            row("uring", 8, 2.0),
            row("portable", 16, 3.0),
            row("uring", 16, 3.0),
        ];
        let avg = averages(&rows);
        assert_eq!(
            avg,
            vec![("portable".to_string(), 2.0), ("uring".to_string(), 2.5)]
        );
        let r = ratios(&rows).unwrap();
        assert!(r.contains("2.00") && r.contains("1.00"), "{r}");
        assert!(ratios(&rows[..1]).is_none());
        let c = csv(&rows);
        assert_eq!(c.lines().count(), 5);
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .starts_with("portable,8,2,f32,sum,,10,")
        );
        assert!(format_row(&rows[0]).contains("portable"));
    }
}
