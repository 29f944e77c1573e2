//! Why a connection was refused ([`Reason`]), classified from what the
//! handshake saw: a hello that failed its checks, security bits that
//! differ, a TLS or I/O error. Below both the ledger and the security
//! layer, which report refusals in these terms.

use std::fmt;
use std::io;

use crate::wire::WireError;
use crate::wire::handshake::{SECURITY_MTLS, SECURITY_SECRET, SECURITY_TLS};

/// Why a connection was refused. Its text says what differs and what to
/// check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// Both sides have a job secret, and they differ.
    WrongSecret,
    /// This side requires a job secret; the peer has none.
    MissingSecret,
    /// The peer has a job secret; this side has none.
    UnexpectedSecret,
    /// This side requires TLS; the peer spoke plaintext.
    TlsRequired,
    /// The peer started TLS; this side has TLS off.
    TlsUnexpected,
    /// Both use TLS, in different modes (tls and mtls).
    TlsModeDiffers,
    /// A certificate was not accepted, by this side or by the peer (another
    /// CA, expired, not naming the address, none shown).
    Certificate,
    /// The peer closed the connection during the TLS handshake (a peer
    /// that refuses this side's certificate often looks so: its alert may
    /// be lost to the connection's reset).
    TlsHungUp,
    /// Another TLS failure.
    Tls,
    /// A hello from another job (another job id).
    OtherJob,
    /// A hello with another world size.
    OtherWorldSize,
    /// Another protocol version or byte order.
    OtherVersion,
    /// A rank this one did not expect: out of range, itself, a higher rank
    /// dialing, one already linked, a lane nobody waits for.
    UnexpectedRank,
    /// Bytes that are not the handshake.
    Malformed,
    /// Nothing sent, or the handshake not finished in time.
    Timeout,
    /// The peer closed the connection mid-handshake.
    HungUp,
    /// An I/O error on this side's socket.
    Io,
}

impl Reason {
    /// The reason for a security-mode mismatch (`Hello::security` bits),
    /// or `None` if the modes agree.
    pub(crate) fn of_security(theirs: u8, mine: u8) -> Option<Reason> {
        let differ = theirs ^ mine;
        if differ & SECURITY_SECRET != 0 {
            Some(if mine & SECURITY_SECRET != 0 {
                Reason::MissingSecret
            } else {
                Reason::UnexpectedSecret
            })
        } else if differ & SECURITY_TLS != 0 {
            Some(if mine & SECURITY_TLS != 0 {
                Reason::TlsRequired
            } else {
                Reason::TlsUnexpected
            })
        } else if differ & SECURITY_MTLS != 0 {
            Some(Reason::TlsModeDiffers)
        } else {
            None
        }
    }

    /// The reason a hello failed `validate_hello` (or its decoding).
    pub(crate) fn of_hello(e: &WireError) -> Reason {
        match e {
            WireError::JobMismatch { .. } => Reason::OtherJob,
            WireError::WorldSizeMismatch { .. } => Reason::OtherWorldSize,
            WireError::UnsupportedVersion { .. } | WireError::EndiannessMismatch { .. } => {
                Reason::OtherVersion
            }
            WireError::RankOutOfRange { .. } | WireError::SelfConnect { .. } => {
                Reason::UnexpectedRank
            }
            _ => Reason::Malformed,
        }
    }

    /// The reason for an I/O error that ended a handshake: a TLS failure
    /// (certificate or other), a timeout, a peer that hung up, bytes that
    /// were not a frame, or a local error.
    pub(crate) fn of_io(e: &io::Error) -> Reason {
        if let Some(reason) = of_tls(e) {
            return reason;
        }
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Reason::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Reason::HungUp,
            io::ErrorKind::InvalidData => Reason::Malformed,
            _ => Reason::Io,
        }
    }

    /// What happened and what to check.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Reason::WrongSecret => {
                "wrong job secret (the peer's RINGWIRE_SECRET differs from this side's)"
            }
            Reason::MissingSecret => {
                "no job secret (this side requires RINGWIRE_SECRET, the peer has none)"
            }
            Reason::UnexpectedSecret => {
                "unexpected job secret (the peer has RINGWIRE_SECRET, this side has none)"
            }
            Reason::TlsRequired => {
                "plaintext at a TLS listener (RINGWIRE_TLS differs: set it alike everywhere)"
            }
            Reason::TlsUnexpected => {
                "TLS at a plaintext listener (RINGWIRE_TLS differs: set it alike everywhere)"
            }
            Reason::TlsModeDiffers => "another TLS mode (tls against mtls: RINGWIRE_TLS differs)",
            Reason::Certificate => {
                "certificate not accepted (check that RINGWIRE_TLS_CERT is signed by the job's \
                 RINGWIRE_TLS_CA, is valid now and names the host's address)"
            }
            Reason::TlsHungUp => {
                "it closed the connection during the TLS handshake (did it refuse this side's \
                 certificate? check RINGWIRE_TLS_CA and RINGWIRE_TLS_CERT; see its log)"
            }
            Reason::Tls => "TLS handshake failed",
            Reason::OtherJob => {
                "another job id (a rank of another job, or of an earlier run, reached this port)"
            }
            Reason::OtherWorldSize => "another world size (WORLD_SIZE differs)",
            Reason::OtherVersion => {
                "another ringwire protocol version or byte order (mixed ringwire versions?)"
            }
            Reason::UnexpectedRank => {
                "a rank this one did not expect (out of range, its own, or already linked: two \
                 processes with one RANK?)"
            }
            Reason::Malformed => "not a ringwire handshake (something else reached this port?)",
            Reason::Timeout => "sent nothing, or did not finish the handshake in time",
            Reason::HungUp => "it closed the connection during the handshake (see its log)",
            Reason::Io => "an I/O error on this side during the handshake",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// What kind of refusal an I/O error carrying a TLS failure is: a
/// certificate this side or the peer did not accept, or another TLS error;
/// `None` if it carries none.
fn of_tls(e: &io::Error) -> Option<Reason> {
    use rustls::AlertDescription as A;
    let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(match tls {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::AlertReceived(
            A::UnknownCA
            | A::CertificateExpired
            | A::CertificateRequired
            | A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateUnknown
            | A::CertificateRevoked,
        ) => Reason::Certificate,
        _ => Reason::Tls,
    })
}
