//! Reading frames out of a link's ring: where the reader is inside a frame
//! ([`Partial`]), the reading end ([`Rx`]) and a receive that takes its
//! frame straight into the caller's memory ([`Place`]). What a frame holds
//! is checked by the [`Fabric`] and filed in its inbox; this room only
//! cuts the byte stream into frames.

use super::super::Fabric;
use crate::error::link::LinkFailure;
use crate::transport::AlignedBuf;
use crate::wire::{FrameKind, HEADER_LEN, Header};
use ringwire_shm::{Consumer, MappedRing};
use std::sync::atomic::{AtomicBool, Ordering};

/// Where reading the ring is inside a frame.
pub(super) enum Partial {
    /// `n` bytes of the header so far.
    Head(usize, [u8; HEADER_LEN]),
    /// The header checked; `skip` pad bytes left, then the payload into
    /// `buf` (`got` bytes so far), then `trail` zeros. No `buf`: the
    /// payload goes straight to a [`Place`]'s destination, whose thread
    /// holds the reader until the frame is whole or `detach`ed.
    Body {
        header: Header,
        skip: usize,
        buf: Option<AlignedBuf>,
        got: usize,
        trail: usize,
    },
}

pub(super) struct Rx {
    pub(super) ring: Consumer<MappedRing>,
    pub(super) frame: Partial,
    pub(super) scratch: [u8; 64],
}

impl Rx {
    /// Whether a frame is part way into a placement's destination.
    pub(super) fn placing(&self) -> bool {
        matches!(self.frame, Partial::Body { buf: None, .. })
    }

    /// Moves a frame part way into `dest` to a buffer of its own, so the
    /// reader can be let go (its waiter stops: abort, deadline, failure).
    pub(super) fn detach(&mut self, dest: &[u8], fabric: &dyn Fabric) {
        if let Partial::Body {
            header,
            buf: slot @ None,
            got,
            ..
        } = &mut self.frame
        {
            let mut buf = fabric.inboxes().buffer();
            buf.prepare(header.payload_len_usize());
            buf.bytes_mut()[..*got].copy_from_slice(&dest[..*got]);
            *slot = Some(buf);
        }
    }
}

/// A copy receive whose frame, if it is next in the ring, is read straight
/// into `dest`: one copy, as the engine's placed receives (decision 0010).
pub(super) struct Place<'a> {
    pub(super) key: (u64, u64, u32, u32),
    pub(super) dest: &'a mut [u8],
    /// The frame's header once its whole payload is in `dest`.
    pub(super) placed: Option<Header>,
}

impl Place<'_> {
    pub(super) fn takes(&self, h: &Header) -> bool {
        self.placed.is_none()
            && h.kind == FrameKind::Data
            && (h.comm_id, h.seq, h.step, h.chunk) == self.key
            && h.payload_len_usize() == self.dest.len()
    }
}

impl Rx {
    /// Files every whole frame waiting in the ring with `fabric` (not while
    /// `peer`'s link is paused, decision 0019), reading the frame `place`
    /// takes into its destination (and stopping there) if it comes; stops
    /// once `dead` is set. Whether any byte was read, or why the stream
    /// cannot go on (a bad header, a placement that lost its destination).
    pub(super) fn read(
        &mut self,
        peer: usize,
        fabric: &dyn Fabric,
        mut place: Option<&mut Place<'_>>,
        dead: &AtomicBool,
    ) -> Result<bool, LinkFailure> {
        let mut any = false;
        while !dead.load(Ordering::Relaxed) {
            if matches!(self.frame, Partial::Head(0, _)) && fabric.inboxes().paused(peer) {
                break;
            }
            let Rx {
                ring,
                frame,
                scratch,
            } = self;
            let progressed = match frame {
                Partial::Head(n, head) => {
                    let got = ring.pop(&mut head[*n..]);
                    *n += got;
                    if *n == HEADER_LEN {
                        match fabric.header(peer, &head[..]) {
                            Ok(header) => {
                                let buf = match place.as_deref() {
                                    Some(p) if p.takes(&header) => None,
                                    _ => {
                                        let mut buf = fabric.inboxes().buffer();
                                        buf.prepare(header.payload_len_usize());
                                        Some(buf)
                                    }
                                };
                                *frame = Partial::Body {
                                    skip: usize::from(header.pad),
                                    trail: header.trail_len(),
                                    header,
                                    buf,
                                    got: 0,
                                };
                            }
                            Err(failure) => return Err(failure),
                        }
                    }
                    got > 0
                }
                Partial::Body {
                    header,
                    skip,
                    buf,
                    got,
                    trail,
                } => {
                    let mut moved = 0;
                    if *skip > 0 {
                        let n = ring.pop(&mut scratch[..*skip]);
                        *skip -= n;
                        moved += n;
                    }
                    if *skip == 0 {
                        let want = header.payload_len_usize();
                        if *got < want {
                            let into = match (buf.as_mut(), place.as_deref_mut()) {
                                (Some(buf), _) => &mut buf.bytes_mut()[*got..want],
                                (None, Some(p)) => &mut p.dest[*got..want],
                                (None, None) => {
                                    // The placing thread let go of the
                                    // reader without detaching: a bug, and
                                    // the stream cannot be resumed.
                                    let detail =
                                        "a frame part way into a placement lost its destination"
                                            .into();
                                    return Err(LinkFailure::Internal { detail });
                                }
                            };
                            let n = ring.pop(into);
                            *got += n;
                            moved += n;
                        }
                        if *got == want && *trail > 0 {
                            let n = ring.pop(&mut scratch[..*trail]);
                            *trail -= n;
                            moved += n;
                        }
                    }
                    if *skip == 0 && *got == header.payload_len_usize() && *trail == 0 {
                        let Partial::Body { header, buf, .. } =
                            std::mem::replace(frame, Partial::Head(0, [0; HEADER_LEN]))
                        else {
                            unreachable!("just matched");
                        };
                        match (buf, place.as_deref_mut()) {
                            (Some(buf), _) => fabric.arrived(peer, header, buf, true),
                            (None, Some(p)) => {
                                p.placed = Some(header);
                                any = true;
                                break;
                            }
                            (None, None) => unreachable!("failed above"),
                        }
                        true
                    } else {
                        moved > 0
                    }
                }
            };
            if !progressed {
                break;
            }
            any = true;
        }
        Ok(any)
    }
}
