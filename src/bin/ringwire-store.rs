//! `ringwire-store`: a standalone rendezvous store, for jobs where no rank
//! should host it (or to debug rendezvous by hand).
//!
//! Prints `ringwire-store listening on ADDR` once it accepts connections and
//! serves until killed (SIGTERM, ctrl-c), or, with `--exit-on-stdin-close`,
//! until its standard input closes (handy when a supervisor holds a pipe).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::process::ExitCode;

use ringwire::store::StoreServer;

const HELP: &str = "\
ringwire-store: standalone rendezvous store for ringwire jobs

USAGE:
    ringwire-store --addr HOST:PORT [--exit-on-stdin-close]
    ringwire-store --host HOST --port PORT [--exit-on-stdin-close]

OPTIONS:
    --addr HOST:PORT        Address to listen on, e.g. 10.0.0.1:29500 or [::1]:29500
    --host HOST             Host name or IP address to listen on; 0.0.0.0 (or ::)
                            listens on every IPv4 (IPv6) address of this machine
    --port PORT             TCP port to listen on (0 picks a free one)
    --exit-on-stdin-close   Exit when standard input reaches end of file
    -h, --help              Print this help

Ranks find the store through MASTER_ADDR and MASTER_PORT (or RINGWIRE_MASTER_ADDR
and RINGWIRE_MASTER_PORT). The store runs until it is killed. It uses the same
RINGWIRE_SECRET and RINGWIRE_TLS, RINGWIRE_TLS_CA, RINGWIRE_TLS_CERT and
RINGWIRE_TLS_KEY settings as the ranks. It logs warnings to standard error
(a client refused for another secret or TLS setting, with its address);
RINGWIRE_LOG=info (or any tracing filter, e.g. ringwire=debug) shows more.
";

struct Args {
    host: String,
    port: u16,
    exit_on_stdin_close: bool,
}

fn main() -> ExitCode {
    // Warnings (a client refused for its secret, ...) on stderr; RINGWIRE_LOG.
    #[cfg(feature = "logging")]
    ringwire::logging::init_from_env();
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("ringwire-store: {msg}\n\nRun `ringwire-store --help` for usage.");
            return ExitCode::from(2);
        }
    };
    // The same RINGWIRE_SECRET / RINGWIRE_TLS* settings as the ranks.
    let security = match ringwire::Security::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringwire-store: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A name may resolve to several addresses; it serves on the first that binds.
    let server = match StoreServer::bind_host(&args.host, args.port, security) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("ringwire-store: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("ringwire-store listening on {}", server.local_addr());
    let _ = io::stdout().flush();

    if args.exit_on_stdin_close {
        let mut sink = [0u8; 1024];
        let mut stdin = io::stdin().lock();
        loop {
            match stdin.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        server.shutdown();
        return ExitCode::SUCCESS;
    }
    loop {
        std::thread::park();
    }
}

/// `Ok(None)` means help was asked for.
fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut addr: Option<String> = None;
    let mut host: Option<String> = None;
    let mut port: Option<String> = None;
    let mut exit_on_stdin_close = false;
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--addr" => addr = Some(value("--addr")?),
            "--host" => host = Some(value("--host")?),
            "--port" => port = Some(value("--port")?),
            "--exit-on-stdin-close" => exit_on_stdin_close = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let (host, port) = match (addr, host, port) {
        (Some(addr), None, None) => split_addr(&addr)?,
        (Some(_), _, _) => return Err("give either --addr or --host and --port, not both".into()),
        (None, Some(host), Some(port)) => (host, port),
        (None, None, Some(_)) => {
            return Err(
                "--host is missing (use 0.0.0.0 to listen on every IPv4 address of this machine)"
                    .into(),
            );
        }
        (None, _, None) => return Err("say where to listen with --addr HOST:PORT".into()),
    };
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("port {port:?} is not a TCP port number (0 to 65535)"))?;
    Ok(Some(Args {
        host,
        port,
        exit_on_stdin_close,
    }))
}

/// Splits `HOST:PORT`, `[V6]:PORT` or a bare `V6:ADDR:PORT`.
fn split_addr(addr: &str) -> Result<(String, String), String> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok((sa.ip().to_string(), sa.port().to_string()));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() => Ok((host.to_owned(), port.to_owned())),
        _ => Err(format!("--addr {addr:?} is not HOST:PORT")),
    }
}
