//! A frame's bytes on a byte stream: the header, the pad that keeps a
//! payload's alignment (decision 0016), the payload and the zeros that end
//! the frame on a whole line, written with one `writev` and read with as
//! few reads as the stream allows. Used by the handshakes and by the
//! portable plane; the engine lays frames out the same way itself.

use crate::wire::{self, FrameKind, HEADER_LEN, Header};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};

/// The header of a control frame (handshake, abort, heartbeat) of `len`
/// payload bytes.
pub(crate) fn control_header(kind: FrameKind, len: usize) -> Header {
    Header::control(kind, 0, 0, len as u32)
}

/// Zeros for the padding around payloads.
static ZEROS: [u8; wire::FRAME_ALIGN] = [0; wire::FRAME_ALIGN];

/// Payloads from this size on are sent at their own alignment (the header's
/// `pad`, decision 0016); below it a slow copy costs less than the pad.
pub(crate) const ALIGN_PAYLOADS_FROM: usize = 1024;

/// `header` with the pad that keeps `payload`'s alignment in the socket's
/// buffer, for payloads large enough to be worth it.
pub(crate) fn aligned_for(header: &Header, payload: &[u8]) -> Header {
    match payload.len() >= ALIGN_PAYLOADS_FROM {
        true => header.with_pad(wire::aligning_pad(payload.as_ptr() as usize)),
        false => header.with_pad(0),
    }
}

/// The header and its pad, as the frame starts.
pub(crate) fn padded_head(header: &Header) -> ([u8; HEADER_LEN + wire::FRAME_ALIGN], usize) {
    let mut head = [0; HEADER_LEN + wire::FRAME_ALIGN];
    head[..HEADER_LEN].copy_from_slice(&header.encode());
    (head, header.payload_offset())
}

/// Writes a whole frame (header, pad, payload, trailing zeros) with one
/// `writev` (retried on short writes): one syscall per frame and no copy
/// into a staging buffer.
pub(crate) fn write_frame(
    stream: &mut dyn Write,
    header: &Header,
    payload: &[u8],
) -> io::Result<()> {
    write_frame_from(stream, header, payload, &mut 0)
}

/// `write_all`, counting in `*written` what went out.
pub(crate) fn write_counted(
    stream: &mut dyn Write,
    bytes: &[u8],
    written: &mut usize,
) -> io::Result<()> {
    while *written < bytes.len() {
        match stream.write(&bytes[*written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes the frame from byte `*written` on, counting in `*written` what
/// went out (so a caller can tell whether any of it did, and resume).
pub(crate) fn write_frame_from(
    stream: &mut dyn Write,
    header: &Header,
    payload: &[u8],
    written: &mut usize,
) -> io::Result<()> {
    let (head, head_len) = padded_head(header);
    let mut slices = [
        IoSlice::new(&head[..head_len]),
        IoSlice::new(payload),
        IoSlice::new(&ZEROS[..header.trail_len()]),
    ];
    let mut bufs = &mut slices[..];
    // Drops empty slices too: a write of nothing but them would return 0.
    IoSlice::advance_slices(&mut bufs, *written);
    while !bufs.is_empty() {
        match stream.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written += n;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one control frame (bounded by the control payload cap).
pub(crate) fn read_control(stream: &mut dyn Read) -> io::Result<(Header, Vec<u8>)> {
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head)?;
    let header = Header::decode(&head, wire::MAX_CONTROL_PAYLOAD).map_err(io::Error::other)?;
    let mut payload = vec![0u8; header.payload_len_usize()];
    read_payload(stream, &header, &mut payload)?;
    Ok((header, payload))
}

/// Reads the rest of a frame after its header: the pad, the payload (into
/// `payload`, as long as the header says) and the trailing zeros, with as
/// few reads as the stream allows.
pub(crate) fn read_payload(
    stream: &mut dyn Read,
    header: &Header,
    payload: &mut [u8],
) -> io::Result<()> {
    let mut pad = [0u8; wire::FRAME_ALIGN];
    let mut tail = [0u8; wire::FRAME_ALIGN];
    let mut slices = [
        IoSliceMut::new(&mut pad[..usize::from(header.pad)]),
        IoSliceMut::new(payload),
        IoSliceMut::new(&mut tail[..header.trail_len()]),
    ];
    let mut bufs = &mut slices[..];
    IoSliceMut::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match stream.read_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::transport::conn::Conn;
    use crate::wire::OpKind;
    use std::os::unix::net::UnixStream;

    fn data_header(len: usize) -> Header {
        Header::data(1, 2, OpKind::Broadcast, DType::U8).with_payload_len(len as u32)
    }

    #[test]
    fn large_payloads_keep_their_alignment_and_small_ones_get_no_pad() {
        let memory = vec![7u8; 8192];
        for offset in 0..128 {
            let payload = &memory[offset..offset + 4096];
            let h = aligned_for(&data_header(4096), payload);
            assert_eq!(
                h.payload_offset() % wire::FRAME_ALIGN,
                payload.as_ptr() as usize % wire::FRAME_ALIGN,
                "offset {offset}"
            );
            let small = &memory[offset..offset + ALIGN_PAYLOADS_FROM - 1];
            assert_eq!(aligned_for(&data_header(small.len()), small).pad, 0);
        }
    }

    #[test]
    fn a_written_frame_is_whole_lines_with_the_payload_at_its_own_alignment() {
        let memory: Vec<u8> = (0..8192).map(|i| (i % 251 + 1) as u8).collect();
        for (offset, len) in [(0, 5000), (9, 1024), (40, 1500), (63, 3000), (5, 100)] {
            let payload = &memory[offset..offset + len];
            let header = aligned_for(&data_header(len), payload);
            let mut wire_bytes = Vec::new();
            write_frame(&mut wire_bytes, &header, payload).unwrap();
            let at = header.payload_offset();
            assert_eq!(wire_bytes.len() % wire::FRAME_ALIGN, 0, "{offset}/{len}");
            assert_eq!(wire_bytes.len(), header.frame_len());
            assert_eq!(Header::decode(&wire_bytes, u32::MAX), Ok(header));
            assert!(wire_bytes[HEADER_LEN..at].iter().all(|&b| b == 0));
            assert!(wire_bytes[at..at + len] == *payload);
            assert!(wire_bytes[at + len..].iter().all(|&b| b == 0));
            if len >= ALIGN_PAYLOADS_FROM {
                assert_eq!(at % 64, payload.as_ptr() as usize % 64, "{offset}/{len}");
            } else {
                assert_eq!(at, HEADER_LEN);
            }
        }
    }

    #[test]
    fn frames_written_padded_read_back_whole_over_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut writer, mut reader) = (Conn::Unix(a), Conn::Unix(b));
        let memory: Vec<u8> = (0..20_000).map(|i| (i * 7 + 3) as u8).collect();
        let cases: Vec<(usize, usize)> = (0..64)
            .map(|i| (i * 5 % 64, [0, 1, 63, 64, 1000, 1024, 4099, 12_345][i % 8]))
            .collect();
        let expected = cases.clone();
        let sender = std::thread::spawn(move || {
            for (offset, len) in cases {
                let payload = &memory[offset..offset + len];
                let header = aligned_for(&data_header(len), payload);
                write_frame(&mut writer, &header, payload).unwrap();
            }
            // Then a control frame: the stream is still in step.
            let abort = wire::Abort::new(0, 1, "done").encode();
            write_frame(
                &mut writer,
                &control_header(FrameKind::Abort, abort.len()),
                &abort,
            )
            .unwrap();
            memory
        });
        let mut got = Vec::new();
        for _ in &expected {
            let mut head = [0u8; HEADER_LEN];
            reader.read_exact(&mut head).unwrap();
            let header = Header::decode(&head, u32::MAX).unwrap();
            let mut payload = vec![0u8; header.payload_len_usize()];
            read_payload(&mut reader, &header, &mut payload).unwrap();
            got.push(payload);
        }
        let (header, payload) = read_control(&mut reader).unwrap();
        assert_eq!(header.kind, FrameKind::Abort);
        assert_eq!(wire::Abort::decode(&payload).unwrap().reason, "done");
        let memory = sender.join().unwrap();
        for ((offset, len), payload) in expected.into_iter().zip(got) {
            assert!(
                payload == memory[offset..offset + len],
                "offset {offset}, len {len}"
            );
        }
    }
}
