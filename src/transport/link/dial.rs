//! The dialing side of link making: connect (retried until the deadline),
//! then the handshake (TLS if configured, hello, job-secret proofs), then
//! the lanes the acceptor agreed to (decision 0018).

use super::{
    Established, Halves, LaneConns, Linker, Slot, describe_unix, link_context, plain_halves,
    plaintext_refusal, read_ack,
};
use crate::error::link::LinkFailure;
use crate::refusals;
use crate::security;
use crate::security::secret::{self, NONCE_LEN, Role};
use crate::transport::LinkError;
use crate::transport::conn::Conn;
use crate::transport::framing::{control_header, write_frame};
use crate::transport::link::open_files;
use crate::transport::plane::PlaneKind;
use crate::wire::handshake::security_mismatch;
use crate::wire::{self, Channel, FrameKind, Hello, HelloAck};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::time::{Duration, Instant};

impl Linker {
    /// Where `peer` is dialed (its Unix listener when local, else TCP),
    /// as shown in errors.
    fn dial_address(&self, peer: usize) -> (SocketAddr, Option<UnixAddr>, String) {
        let Slot { addr, local, .. } = self.slot(peer);
        let shown = match &local {
            Some(a) => describe_unix(a),
            None => addr.to_string(),
        };
        (addr, local, shown)
    }

    /// A connection to `peer`, retried with backoff until `deadline`.
    fn connect(&self, peer: usize, deadline: Instant) -> Result<Conn, LinkError> {
        self.connect_with(peer, deadline, true)
    }

    /// A connection to `peer` within `deadline`, retried with backoff if
    /// `retry` (a network that drops the first tries). A refused one is
    /// not retried: every rank listens before setup ends (its transport
    /// starts before the store barrier, and a replacement's before it
    /// says it waits), so a refusal says the peer's process is gone, and
    /// retrying it held the op until its timeout.
    fn connect_with(&self, peer: usize, deadline: Instant, retry: bool) -> Result<Conn, LinkError> {
        let (addr, local, shown) = self.dial_address(peer);
        let mut backoff = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let connected = match &local {
                Some(unix) => UnixStream::connect_addr(unix).map(Conn::Unix),
                None => TcpStream::connect_timeout(
                    &addr,
                    left.clamp(Duration::from_millis(1), Duration::from_secs(5)),
                )
                .map(Conn::Tcp),
            };
            match connected {
                Ok(s) => return Ok(s),
                // Out of descriptors is not a peer that is still starting:
                // say so now rather than at the deadline.
                Err(e)
                    if retry
                        && Instant::now() + backoff < deadline
                        && !open_files::ran_out(&e)
                        && e.kind() != io::ErrorKind::ConnectionRefused =>
                {
                    tracing::debug!(peer, addr = %shown, error = %e, "connect failed, retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => {
                    return Err(LinkError::Connect {
                        addr: shown,
                        detail: open_files::describe(&e)
                            + &refusals::suffix_since_at(self.epoch, self.place()),
                        failure: LinkFailure::of_io(&e, false),
                    });
                }
            }
        }
    }

    /// Dials `peer` (a higher rank) and runs the handshake, with its lanes
    /// where the link's plane takes them and the acceptor agrees.
    /// A refused connection is retried until `deadline` only if `retry` (a
    /// peer known to have listened once and refusing now is gone).
    pub(crate) fn dial_with(
        &self,
        peer: usize,
        deadline: Instant,
        retry: bool,
    ) -> Result<Established, LinkError> {
        let (_, _, shown) = self.dial_address(peer);
        let refused = |failure: LinkFailure, prefix: &str| LinkError::Connect {
            addr: shown.clone(),
            detail: format!("{prefix}{}", words(&failure)),
            failure,
        };
        let conn = self.connect_with(peer, deadline, retry)?;
        let who = format!("rank {peer} ({shown})");
        let plane = self.plane(conn.kind());
        let channel = if plane == PlaneKind::Shm {
            Channel::MainWithShm
        } else if self.config.lanes > 0 && plane.takes_lanes(conn.kind()) {
            Channel::MainWithLanes(self.config.lanes.min(wire::MAX_LANES))
        } else {
            Channel::Main
        };
        let (halves, taken) = self
            .dial_handshake(peer, &conn, &who, channel, self.config.handshake_timeout)
            .map_err(|f| refused(f, ""))?;
        let lanes = match channel {
            Channel::MainWithLanes(asked) if taken > 0 => {
                let open = |channel| -> Result<Conn, LinkError> {
                    let lane = self.connect(peer, deadline)?;
                    self.dial_handshake(peer, &lane, &who, channel, self.config.handshake_timeout)
                        .map_err(|f| refused(f, "opening a lane: "))?;
                    Ok(lane)
                };
                let mut conns = LaneConns {
                    send: Vec::new(),
                    recv: Vec::new(),
                };
                for i in 0..taken.min(asked) {
                    conns.send.push(open(Channel::LaneFromDialer(i))?);
                    conns.recv.push(open(Channel::LaneToDialer(i))?);
                }
                Some(conns)
            }
            _ => None,
        };
        Ok(Established {
            dialed: true,
            shm: taken > 0 && channel == Channel::MainWithShm,
            conn,
            halves,
            lanes,
        })
    }

    /// Whether `peer`'s process is alive, without making a link: one
    /// connection attempt (no retry: a member that joined once and refuses
    /// now is gone), and a handshake as a [`Channel::Probe`], which the
    /// peer answers (after the job's secret and TLS checks) and closes.
    pub(crate) fn probe(&self, peer: usize, deadline: Instant) -> Result<(), LinkError> {
        let (_, _, shown) = self.dial_address(peer);
        let conn = self.connect_with(peer, deadline, false)?;
        let who = format!("rank {peer} ({shown})");
        // A stopped process's kernel still accepts the connection: only
        // the handshake's silence shows it, within the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = self
            .config
            .handshake_timeout
            .min(left)
            .max(Duration::from_millis(1));
        self.dial_handshake(peer, &conn, &who, Channel::Probe, timeout)
            .map(drop)
            .map_err(|failure| LinkError::Connect {
                addr: shown,
                detail: words(&failure),
                failure,
            })
    }

    /// The dialing side of a handshake on `stream` (TLS if configured,
    /// hello as `channel`, secret check); the link's byte streams, and
    /// what the acceptor takes of what a main connection asked for (lanes
    /// each way, or 1 for shared memory; 0: none).
    fn dial_handshake(
        &self,
        peer: usize,
        stream: &Conn,
        who: &str,
        channel: Channel,
        timeout: Duration,
    ) -> Result<(Halves, u8), LinkFailure> {
        let addr = self.addr(peer);
        let hs = |e: io::Error| handshake_error(&e, who);
        self.configure(stream).map_err(hs)?;
        stream.set_read_timeout(Some(timeout)).map_err(hs)?;
        let sec = &self.config.security;
        let mine = sec.flags();
        let (mut reader, mut writer) = match (&sec.tls, &stream) {
            (Some(tls), Conn::Tcp(tcp)) => security::tls_connect(tls, tcp, addr.ip(), who)
                .map_err(
                    |e| match e.plaintext.as_deref().and_then(plaintext_refusal) {
                        Some(reason) => LinkFailure::Refused {
                            reason: format!("{}; it said: {reason}", e.detail),
                        },
                        None => LinkFailure::Handshake { reason: e.detail },
                    },
                )?,
            (Some(_), Conn::Unix(_)) => {
                return Err(LinkFailure::Handshake {
                    reason: "TLS runs over TCP links only (unix links are plaintext)".into(),
                });
            }
            (None, _) => plain_halves(stream).map_err(hs)?,
        };
        let client_nonce = match &sec.secret {
            Some(_) => Some(secret::nonce().map_err(hs)?),
            None => None,
        };
        let hello = Hello {
            security: mine,
            channel,
            auth: client_nonce.map(|n| n.to_vec()).unwrap_or_default(),
            incarnation: self.incarnation,
            ..Hello::new(self.job_id, self.me as u32, self.world as u32)
        };
        let payload = hello.encode().map_err(|e| LinkFailure::Handshake {
            reason: e.to_string(),
        })?;
        write_frame(
            &mut *writer,
            &control_header(FrameKind::Handshake, payload.len()),
            &payload,
        )
        .map_err(hs)?;
        let ack = read_ack(&mut *reader)
            .map_err(hs)?
            .map_err(|reason| LinkFailure::Handshake { reason })?;
        // Lanes or shared memory, as the channel asked.
        let lanes = match channel {
            Channel::MainWithLanes(_) | Channel::MainWithShm => ack.lanes,
            _ => 0,
        };
        if !ack.accepted {
            return Err(LinkFailure::Refused {
                reason: format!("rank {peer} refused the connection: {}", ack.reason),
            });
        }
        if let Some(why) = security_mismatch(ack.security, mine) {
            return Err(LinkFailure::Refused {
                reason: format!("rank {peer} answered, but {why}"),
            });
        }
        if let (Some(secret), Some(client_nonce)) = (&sec.secret, client_nonce) {
            let context = link_context(self.job_id, self.me, peer);
            let server_ok = ack.auth.len() == 2 * NONCE_LEN && {
                let (server_nonce, proof) = ack.auth.split_at(NONCE_LEN);
                secret.verify(Role::Server, &context, &client_nonce, server_nonce, proof)
            };
            // Without a valid proof from the acceptor, send none back:
            // it refuses and logs, and this side reports the mismatch.
            let proof = if server_ok {
                secret
                    .proof(
                        Role::Client,
                        &context,
                        &client_nonce,
                        &ack.auth[..NONCE_LEN],
                    )
                    .to_vec()
            } else {
                Vec::new()
            };
            let answer = HelloAck::accept()
                .with_security(mine)
                .with_auth(proof)
                .encode();
            write_frame(
                &mut *writer,
                &control_header(FrameKind::HandshakeAck, answer.len()),
                &answer,
            )
            .map_err(hs)?;
            let verdict = read_ack(&mut *reader)
                .map_err(hs)?
                .map_err(|reason| LinkFailure::Handshake { reason })?;
            if !server_ok {
                return Err(LinkFailure::Refused {
                    reason: format!(
                        "rank {peer} failed the job-secret check: it does not know this job's secret (RINGWIRE_SECRET differs between ranks?)"
                    ),
                });
            }
            if !verdict.accepted {
                return Err(LinkFailure::Refused {
                    reason: format!("rank {peer} refused the connection: {}", verdict.reason),
                });
            }
        }
        Ok(((reader, writer), lanes))
    }
}

/// A dial-side handshake failure, readable.
fn handshake_error(e: &io::Error, who: &str) -> LinkFailure {
    let reason = if security::is_tls_error(e) {
        security::describe_io(e, who)
    } else {
        format!("handshake with {who} failed: {e}")
    };
    LinkFailure::Handshake { reason }
}

/// The words of a failure to make a link, as its error's detail.
fn words(failure: &LinkFailure) -> String {
    match failure {
        LinkFailure::Refused { reason } | LinkFailure::Handshake { reason } => reason.clone(),
        other => format!("{other:?}"),
    }
}
