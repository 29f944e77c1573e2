//! Command-line arguments, parsed by hand (the flags follow nccl-tests).

use crate::bench_op::BenchOp;
use ringwire::{DType, ReduceOp};
use std::time::Duration;

/// Which kinds of link between local ranks a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinksChoice {
    Unix,
    Tcp,
    Shm,
    All,
}

/// Where the op's buffers live and what moves them (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceChoice {
    /// Host buffers, moved by ringwire's transports.
    Cpu,
    /// CUDA device buffers (the rank's local rank's GPU), moved by NCCL.
    Cuda,
    /// The stand-in NCCL (`RINGWIRE_NCCL_LIB`) on its host "device":
    /// the device path without a GPU, for tests.
    Standin,
}

impl DeviceChoice {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
            DeviceChoice::Standin => "standin",
        }
    }
}

/// Which transports a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TransportChoice {
    Portable,
    Uring,
    All,
}

#[derive(Clone, Debug)]
pub(crate) struct Args {
    /// The op this sweep measures: the first of `ops`, or the one
    /// [`Args::for_op`] set.
    pub(crate) op: BenchOp,
    /// Every op the run measures, in order (`all_reduce,all_gather` or `all`).
    pub(crate) ops: Vec<BenchOp>,
    pub(crate) ranks: Option<usize>,
    pub(crate) min_bytes: usize,
    pub(crate) max_bytes: usize,
    pub(crate) factor: usize,
    pub(crate) iters: usize,
    pub(crate) warmup: usize,
    pub(crate) max_seconds: f64,
    pub(crate) dtype: DType,
    pub(crate) redop: ReduceOp,
    pub(crate) root: usize,
    pub(crate) check: bool,
    pub(crate) transport: TransportChoice,
    pub(crate) links: LinksChoice,
    pub(crate) link_limit: bool,
    /// Bytes each side of the link limit streams from / into (cycled).
    pub(crate) link_buffer: usize,
    /// `--link-buffer op`: the limits around a size stream from buffers as
    /// large as that size's payload (the limit before the sweep keeps
    /// `link_buffer`).
    pub(crate) link_buffer_op: bool,
    /// SO_SNDBUF / SO_RCVBUF of the link limit's sockets (`None`: the
    /// kernel's defaults, as plain sockets have).
    pub(crate) link_socket_buffer: Option<usize>,
    /// Where in a 4 KiB page the op's buffers start (`None`: wherever the
    /// allocator puts a `Vec`).
    pub(crate) buffer_offset: Option<usize>,
    pub(crate) json: Option<String>,
    pub(crate) csv: Option<String>,
    pub(crate) plot: Option<String>,
    /// `--timeout`; `None`: not given (see [`Args::op_timeout`]).
    pub(crate) timeout: Option<Duration>,
    /// Test hook: corrupt this rank's checked result so #wrong is non-zero.
    pub(crate) inject_wrong: bool,
    /// Call the blocking slice forms (`all_reduce_slice`, ...), as MPI's
    /// blocking calls are, instead of owned buffers and `wait()`.
    pub(crate) blocking: bool,
    /// Run every link (and the store) over mutual TLS.
    pub(crate) tls: bool,
    /// Job secret for every link and the store.
    pub(crate) secret: Option<String>,
    /// Where the op's buffers live (`--device`).
    pub(crate) device: DeviceChoice,
}

pub(crate) const USAGE: &str = "\
usage: ringwire-bench <op> [options]

ops: all_reduce broadcast reduce all_gather reduce_scatter all_to_all gather scatter barrier sendrecv pingpong;
     (sendrecv as nccl-tests: every rank sends to the next and receives from the previous
     at once; pingpong: ranks 0 and 1 bounce a buffer, timed one way);
     several separated by commas (all_reduce,all_gather), or `all` for every one, run
     in turn on the same ranks and links, a table each (--json/--csv/--plot files get
     the op's name before their extension: r.json -> r.all_gather.json)
     (or `ringwire-bench core-round-trip`: print the core-to-core round trip and exit;
     `ringwire-bench memcpy-bandwidth`: one core's copy rate at 1, 16 and 64 MiB)

  -h, --help         print this help and exit
  --ranks N          start N local rank processes (else join via RANK, WORLD_SIZE,
                     MASTER_ADDR, MASTER_PORT or the Open MPI / Slurm / PMI variables)
  -b, --minbytes S   smallest size (default 8); suffixes K, M, G
  -e, --maxbytes S   largest size (default 32M)
  -f, --stepfactor F multiply the size by F each step (default 2)
  -n, --iters N      timed iterations per size (default 20; fewer for large sizes,
                     see --max-seconds)
  -w, --warmup N     untimed iterations per size (default 5)
      --max-seconds T  cap the timed iterations of one size near T seconds (default 1; 0 = no cap)
  -d, --datatype T   f32 f64 f16 bf16 i32 i64 u8 (default f32)
  -o, --op OP        sum prod min max avg (default sum)
  -r, --root R       root of broadcast, reduce, gather and scatter (default 0)
  -c, --check 0|1    check results against a reference (default 1)
      --transport T  portable, uring or all (default all: every available one, interleaved size by size)
      --blocking     call the blocking forms on borrowed slices (all_reduce_slice, ...:
                     as MPI's blocking calls), not owned buffers and wait()
      --local-links L  shm, unix, tcp or all: what links ranks on the same host (default shm,
                     as ringwire does; rows are labelled uring (Unix sockets), uring-shm,
                     uring-tcp, ...)
      --link-limit   measure the ring link limit first (over each kind of link measured)
                     and show busbw as a percentage of it; from 1 MiB, of the mean of
                     two limits measured just before and just after that size
      --link-buffer S  buffer the link limit streams from and into (default 4M: fits in
                     cache; as large as the op, e.g. 256M, it streams memory like the op;
                     `op`: from 1 MiB, each size's limits stream from buffers of its size)
      --link-socket-buffer S  SO_SNDBUF/SO_RCVBUF of the link limit's sockets (default:
                     the kernel's, as plain sockets have; ringwire's engine sets 1M on
                     Unix links, see docs/decisions/0015)
      --buffer-offset B  start the op's buffers B bytes into a 4 KiB page (default: where
                     the allocator puts them); the kernel's copies slow down at some
                     source/destination alignments, see docs/perf.md
      --json FILE    write the rows as JSON
      --csv FILE     write the rows as CSV
      --plot FILE    write busbw against size as SVG
      --timeout S    per-op timeout in seconds (default: RINGWIRE_TIMEOUT, else 120)
      --tls          mutual TLS on every link and the store; with --ranks, a throwaway
                     CA and certificates are generated (else RINGWIRE_TLS_CA/CERT/KEY)
      --secret S     job secret on every link and the store (or RINGWIRE_SECRET)
      --device D     cpu, cuda or standin (default cpu: host buffers over ringwire's
                     transports). cuda: buffers on the GPU of each rank's local rank,
                     moved by NCCL (found as ringwire-gpu finds it: RINGWIRE_NCCL_LIB,
                     libnccl.so.2, ...); needs a build with --features cuda and one GPU
                     per local rank. standin: the stand-in NCCL named by RINGWIRE_NCCL_LIB
                     (libringwire_nccl_standin.so) on host memory, for tests. The same
                     sweep, columns and checks; each op is timed from its submission to
                     its wait() returning (the device done). The transport and link
                     options then only choose the CPU communicator NCCL starts from
                     (the first of them); --link-limit and --buffer-offset are refused
";

/// The bench's op timeout where neither `--timeout` nor RINGWIRE_TIMEOUT
/// says: longer than the library's minute, for large sizes on slow hosts.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

impl Args {
    /// The timeout the bench sets on its communicators: `--timeout`, else
    /// [`DEFAULT_TIMEOUT`] unless RINGWIRE_TIMEOUT is set, which the
    /// library then reads (and refuses, naming it, if it is not a number).
    pub(crate) fn op_timeout(&self) -> Option<Duration> {
        self.timeout.or_else(|| {
            std::env::var_os("RINGWIRE_TIMEOUT")
                .is_none()
                .then_some(DEFAULT_TIMEOUT)
        })
    }
}

/// `--device cuda` in a build without CUDA support.
pub(crate) const CUDA_FEATURE_MISSING: &str = "--device cuda: this ringwire-bench was built \
without CUDA support; rebuild it with `--features cuda` (cargo build --release -p ringwire-bench \
--features cuda)";

/// The page size `--buffer-offset` counts within.
pub(crate) const PAGE: usize = 4096;

/// Parses `64`, `4K`, `16M`, `1G` (binary multiples), as ringwire's
/// `RINGWIRE_*_BYTES` variables do.
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    ringwire::env::parse_bytes(text)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{text:?} is not a size (use e.g. 8, 64K, 16M, 1G)"))
}

pub(crate) fn parse(args: &[String]) -> Result<Args, String> {
    let mut it = args.iter();
    let op_name = it.next().ok_or("missing <op> (try --help)")?;
    if op_name == "-h" || op_name == "--help" {
        return Err(USAGE.to_string());
    }
    let ops = parse_ops(op_name)?;
    let mut a = Args {
        op: ops[0],
        ops,
        ranks: None,
        min_bytes: 8,
        max_bytes: 32 << 20,
        factor: 2,
        iters: 20,
        warmup: 5,
        max_seconds: 1.0,
        dtype: DType::F32,
        redop: ReduceOp::Sum,
        root: 0,
        check: true,
        transport: TransportChoice::All,
        links: LinksChoice::Shm,
        link_limit: false,
        link_buffer: 4 << 20,
        link_buffer_op: false,
        link_socket_buffer: None,
        buffer_offset: None,
        json: None,
        csv: None,
        plot: None,
        timeout: None,
        inject_wrong: false,
        blocking: false,
        tls: false,
        secret: None,
        device: DeviceChoice::Cpu,
    };
    while let Some(flag) = it.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (flag.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let number = |v: String, what: &str| -> Result<usize, String> {
            v.parse::<usize>()
                .map_err(|_| format!("{what}: {v:?} is not a whole number"))
        };
        match flag {
            "--ranks" => a.ranks = Some(number(value()?, "--ranks")?),
            "-b" | "--minbytes" => a.min_bytes = parse_size(&value()?)?,
            "-e" | "--maxbytes" => a.max_bytes = parse_size(&value()?)?,
            "-f" | "--stepfactor" => a.factor = number(value()?, "-f")?,
            "-n" | "--iters" => a.iters = number(value()?, "-n")?,
            "-w" | "--warmup" => a.warmup = number(value()?, "-w")?,
            "--max-seconds" => {
                let v = value()?;
                a.max_seconds = v
                    .parse()
                    .map_err(|_| format!("--max-seconds: {v:?} is not a number"))?;
            }
            "-d" | "--datatype" => {
                let v = value()?;
                a.dtype = DType::parse(&v).ok_or_else(|| {
                    format!("-d: unknown type {v:?} (f32 f64 f16 bf16 i32 i64 u8)")
                })?;
            }
            "-o" | "--op" => {
                let v = value()?;
                a.redop = ReduceOp::parse(&v)
                    .ok_or_else(|| format!("-o: unknown reduce op {v:?} (sum prod min max avg)"))?;
            }
            "-r" | "--root" => a.root = number(value()?, "-r")?,
            "-c" | "--check" => {
                a.check = match value()?.as_str() {
                    "0" => false,
                    "1" => true,
                    v => return Err(format!("-c: expected 0 or 1, got {v:?}")),
                }
            }
            "--transport" => {
                a.transport = match value()?.as_str() {
                    "portable" => TransportChoice::Portable,
                    "uring" => TransportChoice::Uring,
                    "all" => TransportChoice::All,
                    // Both transports run over TCP; "tcp" used to mean the
                    // portable one, which misled (it is the link, not the plane).
                    "tcp" => {
                        return Err("--transport: tcp is not a transport (both run over TCP \
                                    between hosts); for TCP links between local ranks add \
                                    --local-links tcp, for the portable transport say \
                                    --transport portable"
                            .into());
                    }
                    v => {
                        return Err(format!(
                            "--transport: expected portable, uring or all, got {v:?}"
                        ));
                    }
                }
            }
            "--link-limit" => a.link_limit = true,
            "--link-buffer" => match value()?.as_str() {
                "op" => a.link_buffer_op = true,
                v => {
                    a.link_buffer = parse_size(v)?;
                    if a.link_buffer == 0 {
                        return Err("--link-buffer: must be at least 1 byte".into());
                    }
                }
            },
            "--link-socket-buffer" => a.link_socket_buffer = Some(parse_size(&value()?)?),
            "--buffer-offset" => a.buffer_offset = Some(number(value()?, "--buffer-offset")?),
            "--blocking" => a.blocking = true,
            "--local-links" => {
                a.links = match value()?.as_str() {
                    "unix" => LinksChoice::Unix,
                    "tcp" => LinksChoice::Tcp,
                    "shm" => LinksChoice::Shm,
                    "all" => LinksChoice::All,
                    v => {
                        return Err(format!(
                            "--local-links: expected shm, unix, tcp or all, got {v:?}"
                        ));
                    }
                }
            }
            "--json" => a.json = Some(value()?),
            "--csv" => a.csv = Some(value()?),
            "--plot" => a.plot = Some(value()?),
            "--timeout" => {
                let v = value()?;
                let secs: f64 = v
                    .parse()
                    .map_err(|_| format!("--timeout: {v:?} is not a number"))?;
                a.timeout = Some(Duration::from_secs_f64(secs.max(0.001)));
            }
            "--inject-wrong" => a.inject_wrong = true,
            "--tls" => a.tls = true,
            "--secret" => a.secret = Some(value()?),
            "--device" => {
                a.device = match value()?.as_str() {
                    "cpu" => DeviceChoice::Cpu,
                    "cuda" => DeviceChoice::Cuda,
                    "standin" | "stand-in" => DeviceChoice::Standin,
                    v => {
                        return Err(format!(
                            "--device: expected cpu, cuda or standin, got {v:?}"
                        ));
                    }
                }
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown option {other:?} (try --help)")),
        }
    }
    if a.factor < 2 {
        return Err("-f must be at least 2".into());
    }
    if a.min_bytes > a.max_bytes {
        return Err(format!(
            "-b {} is larger than -e {}",
            a.min_bytes, a.max_bytes
        ));
    }
    if let Some(offset) = a.buffer_offset {
        let element = a.dtype.size();
        if offset >= PAGE || offset % element != 0 {
            return Err(format!(
                "--buffer-offset {offset}: must be below {PAGE} and a multiple of the \
                 {element}-byte element"
            ));
        }
    }
    if a.ranks == Some(0) {
        return Err("--ranks must be at least 1".into());
    }
    if a.device != DeviceChoice::Cpu {
        // Both measure host sockets and host pages, which device buffers
        // moved by NCCL never touch.
        if a.link_limit {
            return Err(format!(
                "--link-limit measures ringwire's host links; it has no meaning with --device {}",
                a.device.name()
            ));
        }
        if a.buffer_offset.is_some() {
            return Err(format!(
                "--buffer-offset places host buffers in a page; it has no meaning with --device {}",
                a.device.name()
            ));
        }
    }
    if a.device == DeviceChoice::Cuda && !cfg!(feature = "cuda") {
        return Err(CUDA_FEATURE_MISSING.into());
    }
    Ok(a)
}

/// `all`, one op, or several separated by commas (each once, in order).
fn parse_ops(text: &str) -> Result<Vec<BenchOp>, String> {
    if text == "all" {
        return Ok(BenchOp::ALL.to_vec());
    }
    let mut ops = Vec::new();
    for name in text.split(',') {
        let op = BenchOp::parse(name).ok_or_else(|| format!("unknown op {name:?}\n\n{USAGE}"))?;
        if ops.contains(&op) {
            return Err(format!("op {name:?} is named twice in {text:?}"));
        }
        ops.push(op);
    }
    Ok(ops)
}

impl Args {
    /// These arguments for one op of the run. With several ops, output
    /// files get the op's name before their extension, so each op's rows
    /// keep the one-op format (`r.json` -> `r.all_gather.json`).
    pub(crate) fn for_op(&self, op: BenchOp) -> Args {
        let several = self.ops.len() > 1;
        let path = |p: &Option<String>| {
            p.as_ref().map(|p| {
                if several {
                    with_op(p, op.name())
                } else {
                    p.clone()
                }
            })
        };
        Args {
            op,
            json: path(&self.json),
            csv: path(&self.csv),
            plot: path(&self.plot),
            ..self.clone()
        }
    }
}

/// `path` with `.name` before its extension (or at its end without one).
fn with_op(path: &str, name: &str) -> String {
    let file_start = path.rfind('/').map_or(0, |i| i + 1);
    match path[file_start..].rfind('.') {
        Some(dot) if dot > 0 => {
            let dot = file_start + dot;
            format!("{}.{name}{}", &path[..dot], &path[dot..])
        }
        _ => format!("{path}.{name}"),
    }
}

/// The sizes of the sweep: min, min*f, ... up to max (max itself included).
pub(crate) fn sizes(a: &Args) -> Vec<usize> {
    if a.op == BenchOp::Barrier {
        return vec![0];
    }
    let mut out = Vec::new();
    let mut s = a.min_bytes;
    while s < a.max_bytes {
        out.push(s);
        s = s.saturating_mul(a.factor);
    }
    out.push(a.max_bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flags the parser takes that `--help` leaves out on purpose.
    const HIDDEN: &[&str] = &[
        // A test hook: corrupts this rank's result so #wrong is non-zero.
        "--inject-wrong",
    ];

    /// The flag literals (`"-b"`, `"--minbytes"`) of this file's code.
    fn parser_flags() -> Vec<String> {
        let source = include_str!("args.rs");
        let code = &source[..source.find("#[cfg(test)]").expect("the tests")];
        code.split('"')
            .skip(1)
            .step_by(2)
            .filter(|lit| {
                let name = lit.trim_start_matches('-');
                lit.starts_with('-')
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            })
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn help_lists_every_flag_the_parser_takes_and_no_other() {
        let flags = parser_flags();
        assert!(flags.len() > 30, "{flags:?}");
        // The flags of the option lines: `  -b, --minbytes S   ...`.
        let listed: Vec<&str> = USAGE
            .lines()
            .filter(|l| l.trim_start().starts_with('-'))
            .flat_map(|l| {
                l.split_whitespace()
                    .map(|w| w.trim_end_matches(','))
                    .take_while(|w| w.starts_with('-'))
            })
            .collect();
        for flag in &flags {
            assert!(
                listed.contains(&flag.as_str()) || HIDDEN.contains(&flag.as_str()),
                "the parser takes {flag}, which --help does not list"
            );
        }
        for flag in &listed {
            assert!(
                flags.iter().any(|f| f == flag),
                "--help lists {flag}, which the parser does not take"
            );
        }
    }

    fn args(v: &[&str]) -> Result<Args, String> {
        parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn flags_parse_like_nccl_tests() {
        let a = args(&[
            "all_reduce",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "4",
            "-d",
            "bf16",
            "-o",
            "max",
            "-c",
            "0",
            "--ranks=3",
        ])
        .unwrap();
        assert_eq!(a.op, BenchOp::AllReduce);
        assert_eq!((a.min_bytes, a.max_bytes, a.factor), (8, 1 << 20, 4));
        assert_eq!(
            (a.dtype, a.redop, a.check, a.ranks),
            (DType::BF16, ReduceOp::Max, false, Some(3))
        );
        assert_eq!(
            sizes(&a),
            vec![8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 1 << 20]
        );
        assert!(args(&["all_reduce", "-f", "1"]).is_err());
        assert!(args(&["nope"]).unwrap_err().contains("unknown op"));
        assert!(
            args(&["all_reduce", "--bogus"])
                .unwrap_err()
                .contains("--bogus")
        );
        assert!(args(&["all_reduce", "-c", "2"]).is_err());
        let tcp = args(&["all_reduce", "--transport", "tcp"]).unwrap_err();
        assert!(tcp.contains("--local-links tcp"), "{tcp}");
        assert_eq!(args(&["all_reduce"]).unwrap().link_buffer, 4 << 20);
        let big = args(&["all_reduce", "--link-buffer", "256M"]).unwrap();
        assert_eq!(big.link_buffer, 256 << 20);
        assert!(args(&["all_reduce", "--link-buffer", "0"]).is_err());
        assert_eq!(args(&["all_reduce"]).unwrap().buffer_offset, None);
        let placed = args(&["all_reduce", "--buffer-offset", "48"]).unwrap();
        assert_eq!(placed.buffer_offset, Some(48));
        assert!(args(&["all_reduce", "--buffer-offset", "4096"]).is_err());
        assert!(args(&["all_reduce", "--buffer-offset", "6"]).is_err());
        assert!(args(&["all_reduce", "-d", "u8", "--buffer-offset", "7"]).is_ok());
        let op = args(&["all_reduce", "--link-buffer", "op"]).unwrap();
        assert!(op.link_buffer_op && !big.link_buffer_op);
        assert_eq!(op.link_buffer, 4 << 20);
        assert_eq!(args(&["all_reduce"]).unwrap().link_socket_buffer, None);
        let sized = args(&["all_reduce", "--link-socket-buffer", "1M"]).unwrap();
        assert_eq!(sized.link_socket_buffer, Some(1 << 20));
        assert!(args(&["all_reduce", "--link-socket-buffer", "lots"]).is_err());
    }

    #[test]
    fn several_ops_run_in_turn_each_with_its_own_files() {
        let a = args(&[
            "all_reduce,all-gather",
            "--json",
            "out/r.json",
            "--csv",
            "r",
        ])
        .unwrap();
        assert_eq!(a.ops, vec![BenchOp::AllReduce, BenchOp::AllGather]);
        assert_eq!(a.op, BenchOp::AllReduce);
        let gather = a.for_op(BenchOp::AllGather);
        assert_eq!(gather.op, BenchOp::AllGather);
        assert_eq!(gather.json.as_deref(), Some("out/r.all_gather.json"));
        assert_eq!(gather.csv.as_deref(), Some("r.all_gather"));
        assert_eq!(gather.plot, None);
        // One op keeps the names it was given.
        let one = args(&["broadcast", "--json", "b.json"]).unwrap();
        assert_eq!(
            one.for_op(BenchOp::Broadcast).json.as_deref(),
            Some("b.json")
        );
        assert_eq!(with_op("./dir.v2/run", "reduce"), "./dir.v2/run.reduce");
        assert_eq!(with_op(".hidden", "reduce"), ".hidden.reduce");
        let all = args(&["all"]).unwrap();
        assert_eq!(all.ops, BenchOp::ALL.to_vec());
        assert!(args(&["all_reduce,nope"]).unwrap_err().contains("\"nope\""));
        assert!(
            args(&["all_reduce,all_reduce"])
                .unwrap_err()
                .contains("twice")
        );
        assert!(args(&["all_reduce,"]).is_err());
    }

    #[test]
    fn device_parses_and_refuses_host_only_options() {
        assert_eq!(args(&["all_reduce"]).unwrap().device, DeviceChoice::Cpu);
        let s = args(&["all_reduce", "--device", "standin"]).unwrap();
        assert_eq!(s.device, DeviceChoice::Standin);
        assert!(
            args(&["all_reduce", "--device=gpu"])
                .unwrap_err()
                .contains("cuda")
        );
        let limit = args(&["all_reduce", "--device", "standin", "--link-limit"]).unwrap_err();
        assert!(limit.contains("--link-limit"), "{limit}");
        let placed = ["all_reduce", "--device", "standin", "--buffer-offset", "64"];
        assert!(args(&placed).unwrap_err().contains("--buffer-offset"));
        let cuda = args(&["all_reduce", "--device", "cuda"]);
        if cfg!(feature = "cuda") {
            assert_eq!(cuda.unwrap().device, DeviceChoice::Cuda);
        } else {
            assert!(cuda.unwrap_err().contains("--features cuda"));
        }
    }

    #[test]
    fn the_sweep_ends_at_max_even_off_the_grid() {
        let a = args(&["broadcast", "-b", "3", "-e", "20"]).unwrap();
        assert_eq!(sizes(&a), vec![3, 6, 12, 20]);
        let a = args(&["barrier"]).unwrap();
        assert_eq!(sizes(&a), vec![0]);
    }
}
