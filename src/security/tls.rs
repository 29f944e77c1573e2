//! TLS and mutual TLS over the portable transport's TCP connections
//! (rustls with the `ring` provider, TLS 1.3 only).
//!
//! Links need a reader thread and concurrent writers on one session, so a
//! session is split into a [`TlsReader`] and a [`TlsWriter`] that share the
//! `rustls::Connection` behind a mutex but never hold it across blocking
//! socket I/O: the reader blocks on its own clone of the socket, then takes
//! the lock only to decrypt what arrived; the writer takes the lock only to
//! encrypt into a private buffer, then writes that buffer without it. (Holding
//! the lock across a blocking write would deadlock two ranks that both send
//! more than the socket buffers hold: each writer would wait for the other
//! side's reader, which would wait for its own writer's lock.) Only the writer
//! writes to the socket, so records never interleave; anything the reader's
//! processing queues for sending (a key update answer) goes out with the
//! next write.
//!
//! Name checks: ranks and the store are addressed by IP. A peer's
//! certificate must chain to the job's CA; if it lists IP addresses among its
//! subject alternative names, the peer's address must be one of them; if it
//! lists none (only DNS names, or no SAN), CA membership alone identifies it.
//! See docs/decisions/0004-security.md.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{CertificateError, ClientConnection, Connection, RootCertStore, ServerConnection};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use super::SecurityError;
use crate::refusals::Reason;

/// Whether TLS also authenticates the dialing side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlsMode {
    /// Encrypted; the accepting side (of a link, or the store) shows a
    /// certificate from the job's CA, the dialing side shows none.
    Tls,
    /// Encrypted, and both sides show a certificate from the job's CA.
    Mutual,
}

impl TlsMode {
    /// `tls` or `mtls`, as in RINGWIRE_TLS.
    pub fn name(self) -> &'static str {
        match self {
            TlsMode::Tls => "tls",
            TlsMode::Mutual => "mtls",
        }
    }
}

/// TLS settings: the mode, the job's CA, and this process's certificate
/// chain and private key (every rank accepts links, so every rank needs
/// one). Cheap to clone. `Debug` does not show the key.
#[derive(Clone)]
pub struct TlsConfig {
    mode: TlsMode,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsConfig {
    /// From PEM text: the CA certificate(s) peers must chain to, this
    /// process's certificate chain (leaf first), and its private key
    /// (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(
        mode: TlsMode,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<TlsConfig, SecurityError> {
        let err = |what: &str, e: &dyn fmt::Display| SecurityError(format!("TLS {what}: {e}"));
        let cas = CertificateDer::pem_slice_iter(ca_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("CA (RINGWIRE_TLS_CA)", &e))?;
        if cas.is_empty() {
            return Err(SecurityError(
                "TLS CA (RINGWIRE_TLS_CA): no PEM certificate found".into(),
            ));
        }
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("certificate (RINGWIRE_TLS_CERT)", &e))?;
        if chain.is_empty() {
            return Err(SecurityError(
                "TLS certificate (RINGWIRE_TLS_CERT): no PEM certificate found".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| err("private key (RINGWIRE_TLS_KEY)", &e))?;
        let mut roots = RootCertStore::empty();
        for ca in cas {
            roots.add(ca).map_err(|e| err("CA (RINGWIRE_TLS_CA)", &e))?;
        }
        let roots = Arc::new(roots);

        let verifier = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| err("CA (RINGWIRE_TLS_CA)", &e))?;
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| err("setup", &e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(IpSanPolicy { inner: verifier }));
        let mut client = match mode {
            TlsMode::Tls => client.with_no_client_auth(),
            TlsMode::Mutual => client
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| {
                    err(
                        "certificate or key (RINGWIRE_TLS_CERT, RINGWIRE_TLS_KEY)",
                        &e,
                    )
                })?,
        };
        client.resumption = rustls::client::Resumption::disabled();

        let server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| err("setup", &e))?;
        let server = match mode {
            TlsMode::Tls => server.with_no_client_auth(),
            TlsMode::Mutual => server.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(|e| err("CA (RINGWIRE_TLS_CA)", &e))?,
            ),
        };
        let mut server = server.with_single_cert(chain, key).map_err(|e| {
            err(
                "certificate or key (RINGWIRE_TLS_CERT, RINGWIRE_TLS_KEY)",
                &e,
            )
        })?;
        server.send_tls13_tickets = 0;
        Ok(TlsConfig {
            mode,
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// From PEM files (see [`TlsConfig::from_pem`]).
    pub fn from_files(
        mode: TlsMode,
        ca: impl AsRef<Path>,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<TlsConfig, SecurityError> {
        let read = |var: &str, p: &Path| {
            std::fs::read(p)
                .map_err(|e| SecurityError(format!("{var}: cannot read {}: {e}", p.display())))
        };
        TlsConfig::from_pem(
            mode,
            &read("RINGWIRE_TLS_CA", ca.as_ref())?,
            &read("RINGWIRE_TLS_CERT", cert.as_ref())?,
            &read("RINGWIRE_TLS_KEY", key.as_ref())?,
        )
    }

    /// The mode.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// Runs the client side of a handshake with the peer at `peer_ip`.
    /// `who` names the peer in errors ("rank 3", "the store at ...").
    pub(crate) fn connect(
        &self,
        sock: &TcpStream,
        peer_ip: IpAddr,
        who: &str,
    ) -> Result<Connection, HandshakeError> {
        let conn =
            ClientConnection::new(self.client.clone(), ServerName::IpAddress(peer_ip.into()))
                .map_err(|e| {
                    HandshakeError::plain(Reason::Tls, format!("TLS setup for {who}: {e}"))
                })?;
        drive(Connection::Client(conn), sock, peer_ip, who)
    }

    /// Runs the server side of a handshake with the peer at `peer_ip`.
    pub(crate) fn accept(
        &self,
        sock: &TcpStream,
        peer_ip: IpAddr,
        who: &str,
    ) -> Result<Connection, HandshakeError> {
        let conn = ServerConnection::new(self.server.clone())
            .map_err(|e| HandshakeError::plain(Reason::Tls, format!("TLS setup for {who}: {e}")))?;
        let conn = drive(Connection::Server(conn), sock, peer_ip, who)?;
        if self.mode == TlsMode::Mutual {
            // The client verifier checked the chain; apply the IP rule too.
            let leaf = conn.peer_certificates().and_then(|c| c.first());
            match leaf {
                None => {
                    return Err(HandshakeError::plain(
                        Reason::Certificate,
                        format!("{who} showed no client certificate, but this job uses mutual TLS"),
                    ));
                }
                Some(leaf) => {
                    if let Err(e) = check_ip(leaf, peer_ip) {
                        return Err(HandshakeError::plain(
                            Reason::Certificate,
                            describe(&e, who),
                        ));
                    }
                }
            }
        }
        Ok(conn)
    }
}

/// A failed handshake: what went wrong (and its kind, for the refusal
/// ledger), and the first bytes the peer sent if they were not TLS (a
/// plaintext peer's refusal, for the caller to decode).
#[derive(Debug)]
pub(crate) struct HandshakeError {
    pub(crate) reason: Reason,
    pub(crate) detail: String,
    pub(crate) plaintext: Option<Vec<u8>>,
}

impl HandshakeError {
    pub(crate) fn plain(reason: Reason, detail: String) -> HandshakeError {
        HandshakeError {
            reason,
            detail,
            plaintext: None,
        }
    }
}

/// Reads through to the socket, keeping a copy of the first bytes.
struct Recorder<'a> {
    sock: &'a TcpStream,
    seen: Vec<u8>,
}

const RECORD: usize = 8192;

impl Read for Recorder<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = crate::net::read_restarting(&mut &*self.sock, buf)?;
        let keep = n.min(RECORD.saturating_sub(self.seen.len()));
        self.seen.extend_from_slice(&buf[..keep]);
        Ok(n)
    }
}

impl Write for Recorder<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&mut &*self.sock).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn drive(
    mut conn: Connection,
    sock: &TcpStream,
    _peer_ip: IpAddr,
    who: &str,
) -> Result<Connection, HandshakeError> {
    let mut rec = Recorder {
        sock,
        seen: Vec::new(),
    };
    let result = (|| -> io::Result<()> {
        while conn.is_handshaking() {
            conn.complete_io(&mut rec)?;
        }
        while conn.wants_write() {
            conn.write_tls(&mut rec)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(conn),
        Err(e) => {
            // TLS records start with a content type of 20..=24. Anything else
            // is a peer that does not speak TLS: keep what it said (and read
            // the rest of it) so the caller can show its refusal.
            let plaintext = rec
                .seen
                .first()
                .is_some_and(|b| !(20..=24).contains(b))
                .then(|| {
                    let mut seen = rec.seen;
                    let mut buf = [0u8; 1024];
                    while seen.len() < RECORD {
                        match (&mut &*sock).read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen
                });
            let (reason, detail) = if plaintext.is_some() {
                (
                    Reason::TlsUnexpected,
                    format!("{who} answered in plaintext, not TLS: it does not use TLS"),
                )
            } else {
                let reason = match Reason::of_io(&e) {
                    Reason::HungUp => Reason::TlsHungUp,
                    other => other,
                };
                (reason, describe_io(&e, who))
            };
            Err(HandshakeError {
                reason,
                detail,
                plaintext,
            })
        }
    }
}

/// A readable message for an I/O error that may carry a rustls error.
pub(crate) fn describe_io(e: &io::Error, who: &str) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => describe(tls, who),
        None => match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => format!(
                "{who} closed the connection during the TLS handshake (does it use TLS with the same CA? see its log)"
            ),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!("{who} did not complete the TLS handshake in time")
            }
            _ => format!("TLS with {who} failed: {e}"),
        },
    }
}

/// A readable message for a TLS failure with `who`.
pub(crate) fn describe(e: &rustls::Error, who: &str) -> String {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(c) => {
            let why = match c {
                CertificateError::UnknownIssuer => {
                    "it is not signed by this job's CA (RINGWIRE_TLS_CA)".to_string()
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "it has expired".to_string()
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "it is not valid yet (check the clocks)".to_string()
                }
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    format!("it does not name the peer's address ({c:?})")
                }
                other => format!("{other:?}"),
            };
            format!("refused the certificate of {who}: {why}")
        }
        rustls::Error::NoCertificatesPresented => {
            format!("{who} showed no certificate, but this job uses mutual TLS (RINGWIRE_TLS=mtls)")
        }
        rustls::Error::AlertReceived(alert) => {
            let why = match alert {
                A::UnknownCA => "our certificate is not signed by its CA",
                A::CertificateExpired => "our certificate has expired",
                A::CertificateRequired => "it uses mutual TLS and this side showed no certificate",
                A::BadCertificate | A::UnsupportedCertificate | A::CertificateUnknown => {
                    "it does not accept our certificate"
                }
                _ => "TLS alert",
            };
            format!("{who} refused the TLS session: {why} ({alert:?})")
        }
        other => format!("TLS with {who} failed: {other}"),
    }
}

/// The IP rule (module docs): fine if the certificate names `ip`, or names
/// no IP address at all.
fn check_ip(leaf: &CertificateDer<'_>, ip: IpAddr) -> Result<(), rustls::Error> {
    let parsed = rustls::server::ParsedCertificate::try_from(leaf)?;
    match rustls::client::verify_server_name(&parsed, &ServerName::IpAddress(ip.into())) {
        Err(e) if !names_an_ip(&e) => Ok(()),
        other => other,
    }
}

/// Whether a name-mismatch error lists IP addresses among the presented
/// names (those certificates are bound to their addresses).
fn names_an_ip(e: &rustls::Error) -> bool {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            presented,
            ..
        }) => presented.iter().any(|n| n.starts_with("IpAddress")),
        // No list to look at: stay strict.
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => true,
        _ => true,
    }
}

/// The server-certificate check: webpki's chain and name check, with the IP
/// rule instead of the strict name match.
#[derive(Debug)]
struct IpSanPolicy {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for IpSanPolicy {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(
                e @ rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                ),
            ) => {
                if names_an_ip(&e) {
                    Err(e)
                } else {
                    // The chain, dates and usage were checked before the name.
                    Ok(ServerCertVerified::assertion())
                }
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn tls_io_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Plaintext bytes encrypted per lock hold (and per socket write).
const WRITE_BATCH: usize = 256 * 1024;
/// Ciphertext read from the socket per read call.
const READ_BATCH: usize = 256 * 1024;

/// Splits an established session into its reading and writing halves.
pub(crate) fn split(mut conn: Connection, sock: &TcpStream) -> io::Result<(TlsReader, TlsWriter)> {
    conn.set_buffer_limit(Some(WRITE_BATCH));
    let shared = Arc::new(Mutex::new(conn));
    Ok((
        TlsReader {
            conn: shared.clone(),
            sock: sock.try_clone()?,
            pending: Vec::with_capacity(READ_BATCH),
            start: 0,
        },
        TlsWriter {
            conn: shared,
            sock: sock.try_clone()?,
            out: Vec::new(),
        },
    ))
}

/// The reading half of a TLS session (see the module docs).
pub(crate) struct TlsReader {
    conn: Arc<Mutex<Connection>>,
    sock: TcpStream,
    /// Ciphertext read from the socket, not yet given to rustls.
    pending: Vec<u8>,
    start: usize,
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut conn = lock(&self.conn);
                loop {
                    match conn.reader().read(buf) {
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if self.start >= self.pending.len() {
                        break;
                    }
                    // Plaintext is drained, so rustls has room for more.
                    let mut rest = &self.pending[self.start..];
                    let used = conn.read_tls(&mut rest)?;
                    self.start += used;
                    conn.process_new_packets().map_err(tls_io_error)?;
                    if used == 0 {
                        break;
                    }
                }
            }
            // Block on the socket without the lock, so writers go on.
            self.pending.clear();
            self.start = 0;
            self.pending.resize(READ_BATCH, 0);
            let n = match crate::net::read_restarting(&mut self.sock, &mut self.pending) {
                Ok(n) => n,
                Err(e) => {
                    self.pending.clear();
                    return Err(e);
                }
            };
            self.pending.truncate(n);
            if n == 0 {
                // End of stream: let rustls decide between a clean close
                // (close_notify seen: Ok(0)) and a truncation (error).
                let mut conn = lock(&self.conn);
                conn.read_tls(&mut io::empty())?;
                conn.process_new_packets().map_err(tls_io_error)?;
                return match conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    other => other,
                };
            }
        }
    }
}

/// The writing half of a TLS session (see the module docs).
pub(crate) struct TlsWriter {
    conn: Arc<Mutex<Connection>>,
    sock: TcpStream,
    /// Ciphertext waiting to be written.
    out: Vec<u8>,
}

impl TlsWriter {
    /// Moves whatever rustls has queued into `out` (under the lock).
    fn collect(&mut self, plaintext: &[u8]) -> io::Result<usize> {
        let mut conn = lock(&self.conn);
        let n = if plaintext.is_empty() {
            0
        } else {
            conn.writer().write(plaintext)?
        };
        while conn.wants_write() {
            conn.write_tls(&mut self.out)?;
        }
        Ok(n)
    }

    fn send_out(&mut self) -> io::Result<()> {
        let result = self.sock.write_all(&self.out);
        self.out.clear();
        if self.out.capacity() > 4 * WRITE_BATCH {
            self.out = Vec::new();
        }
        result
    }
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.collect(&buf[..buf.len().min(WRITE_BATCH)])?;
        self.send_out()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.collect(&[])?;
        self.send_out()
    }
}
