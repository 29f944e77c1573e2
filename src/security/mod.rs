//! Authentication and encryption of links and store connections.
//!
//! Two independent layers, both optional, configured once per process
//! ([`Security`], from the builder or `RINGWIRE_SECRET` / `RINGWIRE_TLS*`):
//!
//! - a **job secret** (module `secret`): every link and every store connection
//!   runs a mutual HMAC-SHA256 challenge-response before anything else is
//!   accepted, so only processes that know the secret join the job;
//! - **TLS or mutual TLS** (module `tls`, rustls): the connection is encrypted,
//!   and the accepting side (TLS) or both sides (mTLS) show a certificate
//!   from the job's CA.
//!
//! With TLS the secret exchange runs inside the TLS session. Without either,
//! ringwire still works, and says once per process that it is
//! unauthenticated. Every mismatch (a plaintext peer at a TLS job, a
//! wrong or missing secret, a certificate from another CA) is refused on
//! both sides with an error that says which. See
//! docs/decisions/0004-security.md.

pub(crate) mod secret;
pub(crate) mod tls;

pub use tls::{TlsConfig, TlsMode};

use crate::refusals::Reason;
use crate::wire::handshake::{SECURITY_MTLS, SECURITY_SECRET, SECURITY_TLS};
use secret::Secret;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};

/// A security setting that could not be used (unreadable PEM file, bad
/// value of a variable, ...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SecurityError(pub String);

/// Who may talk to a job and how: an optional job secret and optional TLS.
/// The same setting must be used by every rank and by the store.
#[derive(Clone, Debug, Default)]
pub struct Security {
    pub(crate) secret: Option<Secret>,
    pub(crate) tls: Option<TlsConfig>,
}

impl Security {
    /// No secret, no TLS.
    pub fn none() -> Security {
        Security::default()
    }

    /// Requires the job secret `secret` on every connection (an empty
    /// secret means none).
    #[must_use]
    pub fn with_secret(mut self, secret: impl Into<Vec<u8>>) -> Security {
        self.secret = Secret::new(secret);
        self
    }

    /// Runs every connection inside TLS (`None`: plaintext).
    #[must_use]
    pub fn with_tls(mut self, tls: Option<TlsConfig>) -> Security {
        self.tls = tls;
        self
    }

    /// From the environment: `RINGWIRE_SECRET` (the secret itself) or
    /// `RINGWIRE_SECRET_FILE` (a file holding it), and `RINGWIRE_TLS`
    /// (`off`, `tls` or `mtls`) with `RINGWIRE_TLS_CA`, `RINGWIRE_TLS_CERT`
    /// and `RINGWIRE_TLS_KEY` (PEM files). If only the files are set, the
    /// mode is `mtls`.
    pub fn from_env() -> Result<Security, SecurityError> {
        Security::from_lookup(&|v| std::env::var(v).ok())
    }

    pub(crate) fn from_lookup(
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Security, SecurityError> {
        Ok(Security {
            secret: secret_from_lookup(lookup)?,
            tls: tls_from_lookup(lookup)?,
        })
    }

    /// Whether peers are authenticated (a secret, or mutual TLS).
    pub fn is_authenticated(&self) -> bool {
        self.secret.is_some()
            || self
                .tls
                .as_ref()
                .is_some_and(|t| t.mode() == TlsMode::Mutual)
    }

    /// The mode bits carried in the handshake.
    pub(crate) fn flags(&self) -> u8 {
        let mut f = 0;
        if self.secret.is_some() {
            f |= SECURITY_SECRET;
        }
        match self.tls.as_ref().map(TlsConfig::mode) {
            Some(TlsMode::Tls) => f |= SECURITY_TLS,
            Some(TlsMode::Mutual) => f |= SECURITY_TLS | SECURITY_MTLS,
            None => {}
        }
        f
    }

    /// "plaintext", "mtls+secret", ...
    pub fn describe(&self) -> String {
        crate::wire::handshake::security_name(self.flags())
    }

    /// Logs, once per process, that connections are not authenticated.
    pub(crate) fn warn_if_unauthenticated(&self) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !self.is_authenticated() && !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "ringwire links and store are unauthenticated: anyone who can reach their ports can join or disrupt the job; set RINGWIRE_SECRET (and/or RINGWIRE_TLS=mtls)"
            );
        }
    }
}

impl fmt::Display for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

pub(crate) fn secret_from_lookup(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Secret>, SecurityError> {
    if let Some(s) = lookup("RINGWIRE_SECRET").filter(|s| !s.is_empty()) {
        return Ok(Secret::new(s));
    }
    match lookup("RINGWIRE_SECRET_FILE").filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(path) => {
            let bytes = std::fs::read(&path).map_err(|e| {
                SecurityError(format!("RINGWIRE_SECRET_FILE={path}: cannot read it: {e}"))
            })?;
            // A trailing newline from `echo` is not part of the secret.
            let trimmed = bytes.trim_ascii_end().to_vec();
            match Secret::new(trimmed) {
                Some(s) => Ok(Some(s)),
                None => Err(SecurityError(format!(
                    "RINGWIRE_SECRET_FILE={path}: the file is empty"
                ))),
            }
        }
    }
}

pub(crate) fn tls_from_lookup(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<TlsConfig>, SecurityError> {
    let var = |v: &str| lookup(v).filter(|s| !s.trim().is_empty());
    let (ca, cert, key) = (
        var("RINGWIRE_TLS_CA"),
        var("RINGWIRE_TLS_CERT"),
        var("RINGWIRE_TLS_KEY"),
    );
    let any_file = ca.is_some() || cert.is_some() || key.is_some();
    let mode = match var("RINGWIRE_TLS").map(|m| m.trim().to_ascii_lowercase()) {
        None if any_file => TlsMode::Mutual,
        None => return Ok(None),
        Some(m) => match m.as_str() {
            "off" | "0" | "no" | "false" | "none" => return Ok(None),
            "tls" | "on" | "1" | "true" | "yes" => TlsMode::Tls,
            "mtls" | "mutual" => TlsMode::Mutual,
            other => {
                return Err(SecurityError(format!(
                    "RINGWIRE_TLS={other}: expected off, tls or mtls"
                )));
            }
        },
    };
    match (ca, cert, key) {
        (Some(ca), Some(cert), Some(key)) => TlsConfig::from_files(mode, ca, cert, key).map(Some),
        (ca, cert, key) => {
            let missing: Vec<&str> = [
                ("RINGWIRE_TLS_CA", ca.is_none()),
                ("RINGWIRE_TLS_CERT", cert.is_none()),
                ("RINGWIRE_TLS_KEY", key.is_none()),
            ]
            .into_iter()
            .filter_map(|(n, m)| m.then_some(n))
            .collect();
            Err(SecurityError(format!(
                "TLS mode {} needs {}: every rank and the store need the CA and their own certificate and key (PEM files)",
                mode.name(),
                missing.join(", ")
            )))
        }
    }
}

/// The two halves of an established connection: plain TCP clones, or a
/// split TLS session.
pub(crate) type ReadHalf = Box<dyn Read + Send>;
pub(crate) type WriteHalf = Box<dyn Write + Send>;

/// How a connection's first bytes identify its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// A TLS record (a ClientHello).
    Tls,
    /// Anything else: a plaintext protocol.
    Plain,
    /// Nothing arrived (closed or timed out).
    Nothing,
}

/// What a connection's first byte says about its sender (a TLS record
/// starts with 22, a handshake record).
pub(crate) fn opening_of(first: u8) -> Opening {
    if first == 22 {
        Opening::Tls
    } else {
        Opening::Plain
    }
}

/// Looks at the first bytes a dialer sent, without consuming them: a TLS
/// record starts 22, 3, then 1 to 4 (the record's version, 0x0301 to
/// 0x0304). One byte is not enough where plaintext starts with a length,
/// as the store's requests do: a first request of 22 bytes (or 278, ...)
/// starts with 22 too, and was refused as TLS.
pub(crate) fn peek_opening(sock: &TcpStream) -> Opening {
    let mut b = [0u8; 3];
    // The rest of a record's opening is waited for as long as a read
    // would be.
    let wait = sock.read_timeout().ok().flatten();
    let until = std::time::Instant::now() + wait.unwrap_or(std::time::Duration::from_secs(1));
    let seen = loop {
        match sock.peek(&mut b) {
            Ok(0) | Err(_) => return Opening::Nothing,
            // A first byte that is not TLS's decides at once.
            Ok(n) if n == b.len() || b[0] != 22 || std::time::Instant::now() >= until => break n,
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    };
    match (seen, b) {
        (3, [22, 3, 1..=4]) => Opening::Tls,
        (3, _) => Opening::Plain,
        (_, [first, ..]) => opening_of(first),
    }
}

/// Plain halves of `sock`.
pub(crate) fn plain_halves(sock: &TcpStream) -> io::Result<(ReadHalf, WriteHalf)> {
    Ok((Box::new(sock.try_clone()?), Box::new(sock.try_clone()?)))
}

/// Client side of TLS on `sock`, split into halves.
pub(crate) fn tls_connect(
    tls: &TlsConfig,
    sock: &TcpStream,
    peer: IpAddr,
    who: &str,
) -> Result<(ReadHalf, WriteHalf), tls::HandshakeError> {
    let conn = tls.connect(sock, peer, who)?;
    let (r, w) = tls::split(conn, sock).map_err(|e| {
        tls::HandshakeError::plain(Reason::of_io(&e), format!("TLS with {who}: {e}"))
    })?;
    Ok((Box::new(r), Box::new(w)))
}

/// Server side of TLS on `sock`, split into halves.
pub(crate) fn tls_accept(
    tls: &TlsConfig,
    sock: &TcpStream,
    peer: IpAddr,
    who: &str,
) -> Result<(ReadHalf, WriteHalf), tls::HandshakeError> {
    let conn = tls.accept(sock, peer, who)?;
    let (r, w) = tls::split(conn, sock).map_err(|e| {
        tls::HandshakeError::plain(Reason::of_io(&e), format!("TLS with {who}: {e}"))
    })?;
    Ok((Box::new(r), Box::new(w)))
}

/// A readable message for an I/O error on a (possibly TLS) connection.
pub(crate) fn describe_io(e: &io::Error, who: &str) -> String {
    tls::describe_io(e, who)
}

/// Whether an I/O error carries a TLS failure (rather than a plain socket error).
pub(crate) fn is_tls_error(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::env_lookup as vars;

    #[test]
    fn env_parsing() {
        let s = Security::from_lookup(&vars(&[])).unwrap();
        assert!(s.secret.is_none() && s.tls.is_none());
        assert_eq!(s.describe(), "plaintext");
        let s = Security::from_lookup(&vars(&[("RINGWIRE_SECRET", "x")])).unwrap();
        assert!(s.is_authenticated());
        assert_eq!(s.describe(), "plaintext+secret");
        let s = Security::from_lookup(&vars(&[("RINGWIRE_TLS", "off")])).unwrap();
        assert!(s.tls.is_none());
        let e = Security::from_lookup(&vars(&[("RINGWIRE_TLS", "maybe")])).unwrap_err();
        assert!(e.0.contains("RINGWIRE_TLS=maybe"), "{e}");
        let e = Security::from_lookup(&vars(&[("RINGWIRE_TLS", "mtls")])).unwrap_err();
        assert!(
            e.0.contains("RINGWIRE_TLS_CA, RINGWIRE_TLS_CERT, RINGWIRE_TLS_KEY"),
            "{e}"
        );
        let e = Security::from_lookup(&vars(&[("RINGWIRE_TLS_CA", "/nonexistent/ca.pem")]))
            .unwrap_err();
        assert!(e.0.contains("mtls needs RINGWIRE_TLS_CERT"), "{e}");
        let e = Security::from_lookup(&vars(&[
            ("RINGWIRE_TLS", "tls"),
            ("RINGWIRE_TLS_CA", "/nonexistent/ca.pem"),
            ("RINGWIRE_TLS_CERT", "/nonexistent/c.pem"),
            ("RINGWIRE_TLS_KEY", "/nonexistent/k.pem"),
        ]))
        .unwrap_err();
        assert!(e.0.contains("cannot read /nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn bad_pem_is_a_clear_error() {
        let e = TlsConfig::from_pem(TlsMode::Mutual, b"nope", b"", b"").unwrap_err();
        assert!(e.0.contains("CA"), "{e}");
    }
}
