//! What every frame arriving on an established link goes through, whichever
//! plane read it: its header is checked once ([`check_header`]: a bad one
//! fails the link), and the whole frame goes where it belongs
//! ([`deliver`]): data to its inbox, an abort to control, a heartbeat
//! nowhere (it only showed the peer alive). No sockets here.

use super::AlignedBuf;
use super::inbox::Inboxes;
use crate::wire::{self, FrameKind, Header, WireError};

/// Checks a frame header from an established link: a data frame up to
/// `max_payload` bytes, or a heartbeat or abort within the control-frame
/// cap; anything else is a bad frame, which fails the link.
pub(crate) fn check_header(head: &[u8], max_payload: u32) -> Result<Header, WireError> {
    let header = Header::decode(head, max_payload)?;
    match header.kind {
        FrameKind::Data => Ok(header),
        FrameKind::Heartbeat | FrameKind::Abort => {
            if header.payload_len > wire::MAX_CONTROL_PAYLOAD {
                return Err(WireError::ControlPayloadTooLarge {
                    kind: header.kind,
                    len: header.payload_len,
                    max: wire::MAX_CONTROL_PAYLOAD,
                });
            }
            Ok(header)
        }
        kind => Err(WireError::UnexpectedKind {
            kind,
            expected: "after the handshake only data, heartbeat and abort frames come",
        }),
    }
}

/// Where a frame from `peer` that passed [`check_header`] goes: a data
/// frame into its inbox (waking a receive sleeping there if `wake`), an
/// abort to `on_abort`, or a bad abort payload to `on_bad` (which fails the
/// link). Control payloads go back to the pool.
pub(crate) fn deliver(
    inboxes: &Inboxes,
    peer: usize,
    header: Header,
    payload: AlignedBuf,
    wake: bool,
    on_abort: impl FnOnce(wire::Abort),
    on_bad: impl FnOnce(WireError),
) {
    match header.kind {
        FrameKind::Data => inboxes.file(peer, header, payload, wake),
        FrameKind::Abort => {
            match wire::Abort::decode(payload.bytes()) {
                Ok(abort) => on_abort(abort),
                Err(e) => on_bad(e),
            }
            inboxes.recycle(payload);
        }
        _ => inboxes.recycle(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::wire::{HEADER_LEN, OpKind};
    use std::sync::Arc;

    fn inboxes() -> Inboxes {
        Inboxes::new(0, 3, (0, 0), Arc::new(|| {}))
    }

    fn data(comm: u64, seq: u64, payload: &[u8]) -> (Header, AlignedBuf) {
        let header = Header::data(comm, seq, OpKind::AllReduce, DType::U8)
            .with_payload_len(payload.len() as u32);
        let mut buf = AlignedBuf::default();
        buf.prepare(payload.len()).copy_from_slice(payload);
        (header, buf)
    }

    #[test]
    fn data_heartbeat_and_abort_headers_pass_and_the_rest_fail_typed() {
        let (header, _) = data(7, 1, &[1, 2, 3]);
        assert_eq!(check_header(&header.encode(), 1 << 20), Ok(header));
        let beat = wire::encode_heartbeat(0, 0);
        assert_eq!(
            check_header(&beat[..HEADER_LEN], 1 << 20).map(|h| h.kind),
            Ok(FrameKind::Heartbeat)
        );
        // Larger than this rank accepts.
        let big = Header::data(7, 1, OpKind::AllReduce, DType::U8).with_payload_len(4096);
        assert!(matches!(
            check_header(&big.encode(), 1024),
            Err(WireError::PayloadTooLarge { len: 4096, .. })
        ));
        // A handshake frame on an established link.
        let hello = Header::control(FrameKind::Handshake, 0, 0, 16);
        assert!(matches!(
            check_header(&hello.encode(), 1 << 20),
            Err(WireError::UnexpectedKind {
                kind: FrameKind::Handshake,
                ..
            })
        ));
        // An abort announcing more than any abort holds.
        let huge = Header::control(FrameKind::Abort, 0, 0, wire::MAX_CONTROL_PAYLOAD + 1);
        assert!(matches!(
            check_header(&huge.encode(), u32::MAX),
            Err(WireError::ControlPayloadTooLarge {
                kind: FrameKind::Abort,
                ..
            })
        ));
        // Not a ringwire frame at all.
        assert!(matches!(
            check_header(
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n.............................",
                1024
            ),
            Err(WireError::BadMagic(_))
        ));
    }

    #[test]
    fn data_goes_to_its_inbox_and_aborts_to_control() {
        let inboxes = inboxes();
        inboxes.begin(7, 1, None);
        let (header, payload) = data(7, 1, &[9, 8, 7]);
        let never = |_| panic!("not an abort");
        deliver(&inboxes, 2, header, payload, true, never, |e| panic!("{e}"));
        let got = inboxes
            .inbox(7, 2)
            .pop()
            .expect("filed in (comm 7, rank 2)");
        assert_eq!(got.payload.bytes(), &[9, 8, 7]);
        assert!(inboxes.inbox(7, 1).pop().is_none());

        let abort = wire::Abort::new(1, 5, "rank 1 failed");
        let frame = wire::encode_abort(7, 5, &abort);
        let header = check_header(&frame[..HEADER_LEN], 1024).unwrap();
        let mut payload = AlignedBuf::default();
        let at = header.payload_offset();
        payload
            .prepare(header.payload_len_usize())
            .copy_from_slice(&frame[at..at + header.payload_len_usize()]);
        let mut heard = None;
        deliver(
            &inboxes,
            1,
            header,
            payload,
            true,
            |a| heard = Some(a),
            |e| panic!("{e}"),
        );
        assert_eq!(heard.map(|a| (a.origin_rank, a.seq)), Some((1, 5)));
        assert!(inboxes.inbox(7, 1).pop().is_none(), "aborts are not data");
    }

    #[test]
    fn a_garbled_abort_is_a_bad_frame_and_files_nothing() {
        let inboxes = inboxes();
        let header = Header::control(FrameKind::Abort, 7, 5, 3);
        let mut payload = AlignedBuf::default();
        payload.prepare(3).copy_from_slice(&[0xff, 0xff, 0xff]);
        let mut bad = None;
        deliver(
            &inboxes,
            1,
            header,
            payload,
            true,
            |_| panic!("not a valid abort"),
            |e| bad = Some(e),
        );
        assert!(bad.is_some());
        assert_eq!(inboxes.count(), 0);
        // A heartbeat files nothing either.
        let beat = Header::control(FrameKind::Heartbeat, 0, 0, 0);
        deliver(
            &inboxes,
            1,
            beat,
            AlignedBuf::default(),
            true,
            |_| {},
            |_| {},
        );
        assert_eq!(inboxes.count(), 0);
    }
}
