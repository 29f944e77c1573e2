//! Prometheus metrics: `Communicator::metrics` text, and the
//! `RINGWIRE_METRICS_ADDR` server scraped over HTTP by Python's urllib and
//! parsed by the Prometheus project's own parser (the `prometheus_client`
//! package), for a group of 3 ranks that ran ops of several kinds and one
//! that failed.
//!
//! The server is process-wide and starts with the first communicator, so
//! the tests that need it run in a child of this binary with the variable
//! set.

mod common;

use common::launchers::python_with;
use common::{
    expected_local_link, local_group, on_all, rerun_on_portable, rerun_over_tcp_local_links,
};
use ringwire::{Communicator, ReduceOp};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// Set in a child that runs one test with `RINGWIRE_METRICS_ADDR`.
const CHILD: &str = "RINGWIRE_METRICS_TEST_CHILD";

#[test]
fn on_the_portable_transport_too() {
    rerun_on_portable("on_the_portable_transport_too");
}

#[test]
fn over_tcp_local_links_too() {
    rerun_over_tcp_local_links("over_tcp_local_links_too");
}

/// One sample of the text: its name, labels and value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// What every rank runs: each op kind's count is known (send_recv: rank 0
/// sends to rank 1), then an all-reduce whose sizes differ (a typed error
/// on every rank), then a barrier that the failed communicator refuses.
/// Returns each rank's error kind for the failed op.
fn run_ops(comms: &[Communicator]) -> Vec<&'static str> {
    on_all(comms, |c| {
        for _ in 0..3 {
            c.all_reduce(vec![1f32; 1000], ReduceOp::Sum)
                .wait()
                .unwrap();
        }
        for _ in 0..2 {
            c.broadcast(vec![7u8; 100], 0).wait().unwrap();
        }
        c.barrier().wait().unwrap();
        c.all_gather(vec![1i32; 10], vec![0i32; 30]).wait().unwrap();
        match c.rank() {
            0 => drop(c.send(vec![1f64; 4], 1).wait().unwrap()),
            1 => drop(c.recv(vec![0f64; 4], 0).wait().unwrap()),
            _ => {}
        }
        // The receive ends before the mismatch below aborts the
        // communicator (on the arena, rank 2 sees it as soon as rank 0
        // arrives).
        c.barrier().wait().unwrap();
        let n = if c.rank() == 2 { 999 } else { 1000 };
        let e = c
            .all_reduce(vec![1f32; n], ReduceOp::Sum)
            .wait()
            .unwrap_err();
        assert!(
            matches!(e.kind(), "mismatch" | "aborted"),
            "rank {}: {e}",
            c.rank()
        );
        let later = c.barrier().wait().unwrap_err();
        assert_eq!(later.kind(), "failed", "rank {}: {later}", c.rank());
        e.kind()
    })
}

/// How many ops of `op` rank `rank` completed in [`run_ops`].
fn expected_ops(rank: usize, op: &str) -> f64 {
    match op {
        "all_reduce" => 3.0,
        "broadcast" | "barrier" => 2.0,
        "all_gather" => 1.0,
        "send_recv" if rank < 2 => 1.0,
        _ => 0.0,
    }
}

const OPS: [&str; 10] = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "barrier",
    "send_recv",
    "gather",
    "scatter",
];

/// The communicator id as the metrics label it (`comm_id` of `Debug`).
fn comm_label(c: &Communicator) -> String {
    let debug = format!("{c:?}");
    let (_, rest) = debug.split_once("comm_id: ").expect(&debug);
    rest.chars().take_while(char::is_ascii_hexdigit).collect()
}

/// Checks the samples of `comms` (ranks of one communicator that ran
/// [`run_ops`], whose failed op ended with `failed_kinds`, by rank)
/// against what they ran and what their API says.
fn check(samples: &[Sample], comms: &[Communicator], failed_kinds: &[&str]) {
    let comm = comm_label(&comms[0]);
    assert_eq!(comm.len(), 16, "{comm}");
    // Every series once.
    let mut seen = BTreeSet::new();
    for s in samples {
        assert!(seen.insert((&s.name, &s.labels)), "twice: {s:?}");
        assert_eq!(s.label("comm"), comm, "{s:?}");
    }
    let find = |name: &str, rank: usize, extra: &[(&str, &str)]| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| {
                s.name == name
                    && s.label("rank") == rank.to_string()
                    && extra.iter().all(|(k, v)| s.label(k) == *v)
            })
            .collect()
    };
    let one = |name: &str, rank: usize, extra: &[(&str, &str)]| -> f64 {
        let found = find(name, rank, extra);
        assert_eq!(found.len(), 1, "{name} rank {rank} {extra:?}: {found:?}");
        found[0].value
    };
    for c in comms {
        let rank = c.rank();
        // Ops per kind, each op kind once.
        assert_eq!(find("ringwire_ops_total", rank, &[]).len(), OPS.len());
        let (mut sent, mut received) = (0.0, 0.0);
        for op in OPS {
            let ops = one("ringwire_ops_total", rank, &[("op", op)]);
            assert_eq!(ops, expected_ops(rank, op), "rank {rank} {op}");
            sent += one("ringwire_bytes_sent_total", rank, &[("op", op)]);
            received += one("ringwire_bytes_received_total", rank, &[("op", op)]);
            // The histogram: count = ops, cumulative buckets, +Inf = count.
            let count = one("ringwire_op_latency_seconds_count", rank, &[("op", op)]);
            assert_eq!(count, ops, "rank {rank} {op}");
            let sum = one("ringwire_op_latency_seconds_sum", rank, &[("op", op)]);
            assert_eq!(sum > 0.0, ops > 0.0, "rank {rank} {op}: sum {sum}");
            let mut buckets: Vec<(f64, f64)> =
                find("ringwire_op_latency_seconds_bucket", rank, &[("op", op)])
                    .iter()
                    .map(|s| (s.label("le").parse::<f64>().unwrap(), s.value))
                    .collect();
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert_eq!(buckets.len(), 16, "rank {rank} {op}: {buckets:?}");
            assert_eq!(buckets[0].0, 1e-5);
            assert!(
                buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                "rank {rank} {op}: not cumulative: {buckets:?}"
            );
            assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, count));
        }
        let stats = c.stats();
        assert_eq!(sent, stats.bytes_sent as f64, "rank {rank}");
        assert_eq!(received, stats.bytes_received as f64, "rank {rank}");
        assert!(
            one("ringwire_bytes_sent_total", rank, &[("op", "all_reduce")]) >= 3.0 * 4000.0 / 3.0,
            "rank {rank}"
        );
        // Failures by kind: the failed op's, and the refused barrier.
        for kind in [failed_kinds[rank], "failed"] {
            assert_eq!(one("ringwire_failures_total", rank, &[("kind", kind)]), 1.0);
        }
        let failures = find("ringwire_failures_total", rank, &[]);
        assert!(failures.len() >= 9, "{failures:?}");
        for f in failures {
            let kind = f.label("kind");
            let want = u8::from(kind == failed_kinds[rank]) + u8::from(kind == "failed");
            assert_eq!(f.value, f64::from(want), "rank {rank} {kind}");
        }
        // Gauges.
        let held = one("ringwire_held_ahead_bytes", rank, &[]);
        assert!(one("ringwire_held_ahead_peak_bytes", rank, &[]) >= held);
        // The failed communicator's inboxes went with its abort.
        assert_eq!(
            one("ringwire_inboxes", rank, &[]),
            c.stats().inboxes as f64,
            "rank {rank}"
        );
        // A link to every peer, of the kind the API says.
        let links = find("ringwire_link_info", rank, &[]);
        assert_eq!(links.len(), c.world_size() - 1, "rank {rank}: {links:?}");
        for peer in (0..c.world_size()).filter(|&p| p != rank) {
            let kind = c.link_kind(peer).expect("linked");
            assert_eq!(kind, expected_local_link());
            let peer = peer.to_string();
            assert_eq!(
                one(
                    "ringwire_link_info",
                    rank,
                    &[("peer", &peer), ("kind", kind)]
                ),
                1.0
            );
        }
    }
}

/// Parses Prometheus text lines of the form `name{k="v",...} value` (as
/// ringwire writes them: no escapes, no timestamps), checking that every
/// other line is a `# HELP` or `# TYPE` comment.
fn parse_text(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect(line);
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().expect(line),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').expect(line)),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect(line);
                let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
                (k.to_string(), v.expect(line).to_string())
            })
            .collect();
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    samples
}

#[test]
fn communicator_metrics_count_each_op_kind_failures_and_links() {
    let (_store, comms) = local_group(3, |b| b);
    let failed = run_ops(&comms);
    for c in &comms {
        let text = c.metrics();
        for ty in [
            "ringwire_ops_total counter",
            "ringwire_op_latency_seconds histogram",
            "ringwire_failures_total counter",
            "ringwire_link_info gauge",
        ] {
            assert_eq!(text.matches(&format!("# TYPE {ty}\n")).count(), 1, "{text}");
        }
        let samples = parse_text(&text);
        // This communicator's series only: this rank's.
        assert!(
            samples
                .iter()
                .all(|s| s.label("rank") == c.rank().to_string())
        );
        check(&samples, std::slice::from_ref(c), &failed);
    }
}

/// Runs test `name` in a child of this binary with
/// `RINGWIRE_METRICS_ADDR=addr`, and asserts that it passed there.
fn in_child_with_metrics_addr(name: &str, addr: &str) {
    ringwire::testing::in_a_child_with(name, CHILD, &[("RINGWIRE_METRICS_ADDR", addr)]);
}

/// Scrapes `base`/metrics with urllib and parses it with
/// `prometheus_client.parser`; also asks for another path and POSTs.
/// Prints tab-separated lines: `get STATUS CONTENT-TYPE`, `other STATUS`,
/// `post STATUS`, `family NAME TYPE`, `sample NAME k=v,... VALUE`.
const SCRAPE: &str = r#"
import sys, urllib.request, urllib.error
from prometheus_client.parser import text_string_to_metric_families

base = sys.argv[1]

def fetch(req):
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()

status, ctype, text = fetch(base + "/metrics")
print("get", status, ctype, sep="\t")
print("other", fetch(base + "/other")[0], sep="\t")
post = urllib.request.Request(base + "/metrics", data=b"x=1", method="POST")
print("post", fetch(post)[0], sep="\t")
for family in text_string_to_metric_families(text):
    print("family", family.name, family.type, sep="\t")
    for s in family.samples:
        for k, v in s.labels.items():
            assert not any(c in k + v for c in "\t,="), (k, v)
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        print("sample", s.name, labels, repr(float(s.value)), sep="\t")
"#;

#[test]
fn the_metrics_server_is_scraped_and_parsed_by_prometheus_client() {
    let Some(python) = python_with(&["prometheus_client"]) else {
        return;
    };
    if std::env::var_os(CHILD).is_none() {
        return in_child_with_metrics_addr(
            "the_metrics_server_is_scraped_and_parsed_by_prometheus_client",
            "127.0.0.1:0",
        );
    }
    assert_eq!(
        ringwire::metrics::server_addr(),
        None,
        "no communicator yet"
    );
    let (_store, comms) = local_group(3, |b| b);
    let addr = ringwire::metrics::server_addr().expect("the server is up");
    assert_eq!(addr.ip(), Ipv4Addr::LOCALHOST, "{addr}");
    assert_ne!(addr.port(), 0);
    // Bound to 127.0.0.1 only: another loopback address of this host is
    // refused (it would be taken by a 0.0.0.0 listener).
    let elsewhere = SocketAddr::from(([127, 0, 0, 2], addr.port()));
    let e = TcpStream::connect_timeout(&elsewhere, Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");

    // A stranger that says nothing holds no scrape up (it is cut off after
    // the request deadline, checked below); one that sends too much is
    // answered 431.
    let idle = TcpStream::connect(addr).unwrap();
    let opened = Instant::now();
    let mut big = TcpStream::connect(addr).unwrap();
    let head = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
    big.write_all(head.as_bytes()).unwrap();
    let mut reply = String::new();
    big.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 431 "), "{reply}");

    let failed = run_ops(&comms);
    let out = Command::new(&python)
        .args(["-c", SCRAPE, &format!("http://{addr}")])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut samples = Vec::new();
    let mut families = BTreeMap::new();
    let mut http = BTreeMap::new();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields[..] {
            ["sample", name, labels, value] => samples.push(Sample {
                name: name.to_string(),
                labels: labels
                    .split(',')
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap();
                        (k.to_string(), v.to_string())
                    })
                    .collect(),
                value: value.parse().expect(line),
            }),
            ["family", name, ty] => {
                assert!(families.insert(name, ty).is_none(), "{name} twice");
            }
            [what, ref rest @ ..] => {
                http.insert(what, rest.join(" "));
            }
            [] => {}
        }
    }
    assert_eq!(
        http["get"], "200 text/plain; version=0.0.4; charset=utf-8",
        "{stdout}"
    );
    assert_eq!(http["other"], "404");
    assert_eq!(http["post"], "405");
    for (name, ty) in [
        ("ringwire_ops", "counter"),
        ("ringwire_bytes_sent", "counter"),
        ("ringwire_bytes_received", "counter"),
        ("ringwire_op_latency_seconds", "histogram"),
        ("ringwire_failures", "counter"),
        ("ringwire_held_ahead_bytes", "gauge"),
        ("ringwire_held_ahead_peak_bytes", "gauge"),
        ("ringwire_inboxes", "gauge"),
        ("ringwire_link_info", "gauge"),
    ] {
        assert_eq!(families.get(name), Some(&ty), "{name}: {families:?}");
    }
    // One series per rank of the one communicator.
    let series: BTreeSet<(&str, &str)> = samples
        .iter()
        .filter(|s| s.name == "ringwire_held_ahead_bytes")
        .map(|s| (s.label("rank"), s.label("comm")))
        .collect();
    let comm = comm_label(&comms[0]);
    let want: BTreeSet<(&str, &str)> = [("0", &*comm), ("1", &comm), ("2", &comm)].into();
    assert_eq!(series, want);
    check(&samples, &comms, &failed);

    // The silent connection was closed by the server (after its 5 s; 15
    // allows for a loaded machine).
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!((&idle).read(&mut [0u8; 16]).unwrap(), 0);
    let took = opened.elapsed();
    assert!(took < Duration::from_secs(15), "{took:?}");

    // Dropped communicators leave the page.
    drop(comms);
    let text = ringwire::metrics::gather();
    assert!(text.contains("# TYPE ringwire_ops_total counter"), "{text}");
    assert!(parse_text(&text).is_empty(), "{text}");
}

#[test]
fn a_metrics_address_that_does_not_bind_is_no_error() {
    if std::env::var_os(CHILD).is_none() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        in_child_with_metrics_addr("a_metrics_address_that_does_not_bind_is_no_error", &addr);
        return in_child_with_metrics_addr(
            "a_metrics_address_that_does_not_bind_is_no_error",
            "not an address",
        );
    }
    let (_store, comms) = local_group(2, |b| b);
    on_all(&comms, |c| c.barrier().wait().unwrap());
    assert_eq!(ringwire::metrics::server_addr(), None);
    assert!(comms[0].metrics().contains("ringwire_ops_total{"));
}
