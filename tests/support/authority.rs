//! A unix-socket relay in front of the fake CRI runtime for gRPC clients that send the socket's
//! path as HTTP/2 `:authority` (kruise-daemon's CRI client does): the Rust server's h2 refuses
//! such a request with `PROTOCOL_ERROR`, Go's servers (containerd, CRI-O) accept it
//! (hyperium/h2#487). The relay rewrites the `:authority` of every request to `localhost`, and
//! tells the client the server keeps no HPACK dynamic table (`SETTINGS_HEADER_TABLE_SIZE` 0 in
//! the server's settings), so that the rewritten value, shorter than the client's, never makes
//! the two ends' tables disagree. Everything else passes unchanged. Test infrastructure.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
/// The HEADERS frame flag that ends a header block.
pub const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const ACK: u8 = 0x1;
const HEADER_TABLE_SIZE: u16 = 0x1;

/// Serves `listen`, relaying every connection to the server at `upstream`; runs until the task
/// is dropped (aborted).
pub fn relay(listen: &Path, upstream: &Path) -> tokio::task::JoinHandle<()> {
    let _ = std::fs::remove_file(listen);
    let listener = UnixListener::bind(listen).expect("bind the relay's socket");
    let upstream: PathBuf = upstream.to_path_buf();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = UnixStream::connect(&upstream).await else {
                    return;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let up = pump(cr, sw, true);
                let down = pump(sr, cw, false);
                let _ = tokio::join!(up, down);
            });
        }
    })
}

/// Copies frames from `from` to `to`, rewriting them: requests (`client` side) get a valid
/// `:authority`, the server's settings no dynamic table.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    client: bool,
) -> std::io::Result<()> {
    if client {
        let mut preface = [0u8; PREFACE.len()];
        from.read_exact(&mut preface).await?;
        to.write_all(&preface).await?;
    }
    loop {
        let mut head = [0u8; 9];
        if from.read_exact(&mut head).await.is_err() {
            return to.shutdown().await;
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        let (kind, flags) = (head[3], head[4]);
        let payload = match (client, kind) {
            (true, HEADERS) if flags & END_HEADERS != 0 => {
                rewrite_headers(&payload, flags).unwrap_or(payload)
            }
            (false, SETTINGS) if flags & ACK == 0 => no_dynamic_table(&payload),
            _ => payload,
        };
        let n = u32::try_from(payload.len()).expect("a frame's length fits 24 bits");
        head[..3].copy_from_slice(&n.to_be_bytes()[1..]);
        to.write_all(&head).await?;
        to.write_all(&payload).await?;
    }
}

/// The server's settings with `SETTINGS_HEADER_TABLE_SIZE` 0.
pub fn no_dynamic_table(payload: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = payload
        .chunks_exact(6)
        .filter(|s| u16::from_be_bytes([s[0], s[1]]) != HEADER_TABLE_SIZE)
        .flatten()
        .copied()
        .collect();
    out.extend_from_slice(&HEADER_TABLE_SIZE.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out
}

/// A HEADERS frame's payload with every `:authority` literal set to `localhost`; `None` when
/// the block cannot be read (it is then passed as it is).
pub fn rewrite_headers(payload: &[u8], flags: u8) -> Option<Vec<u8>> {
    let mut at = 0;
    let pad = if flags & PADDED != 0 {
        at = 1;
        usize::from(*payload.first()?)
    } else {
        0
    };
    if flags & PRIORITY != 0 {
        at += 5;
    }
    let block = payload.get(at..payload.len().checked_sub(pad)?)?;
    let mut out = payload[..at].to_vec();
    let mut i = 0;
    while i < block.len() {
        let b = block[i];
        if b & 0x80 != 0 || b & 0xE0 == 0x20 {
            // an indexed field (7-bit prefix) or a dynamic table size update (5-bit)
            let (_, n) = integer(&block[i..], if b & 0x80 != 0 { 7 } else { 5 })?;
            out.extend_from_slice(&block[i..i + n]);
            i += n;
        } else {
            // a literal: with incremental indexing (6-bit name index), else 4-bit
            let prefix = if b & 0xC0 == 0x40 { 6 } else { 4 };
            let start = i;
            let (index, n) = integer(&block[i..], prefix)?;
            i += n;
            if index == 0 {
                i += string_len(&block[i..])?;
            }
            let value = string_len(&block[i..])?;
            let name_end = i;
            i += value;
            out.extend_from_slice(&block[start..name_end]);
            if index == 1 {
                // :authority (static table entry 1): a plain, valid one
                out.push(9);
                out.extend_from_slice(b"localhost");
            } else {
                out.extend_from_slice(&block[name_end..i]);
            }
        }
    }
    out.extend_from_slice(payload.get(payload.len() - pad..)?);
    Some(out)
}

/// An HPACK integer with an `n`-bit prefix at the start of `b`: its value and its length.
fn integer(b: &[u8], n: u32) -> Option<(u64, usize)> {
    let max = (1u64 << n) - 1;
    let mut v = u64::from(*b.first()?) & max;
    if v < max {
        return Some((v, 1));
    }
    let mut shift = 0;
    for (k, byte) in b.iter().enumerate().skip(1) {
        v += u64::from(byte & 0x7F) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some((v, k + 1));
        }
        if shift > 56 {
            return None;
        }
    }
    None
}

/// The length, in bytes, of the HPACK string literal at the start of `b`.
fn string_len(b: &[u8]) -> Option<usize> {
    let (len, n) = integer(b, 7)?;
    let end = n + usize::try_from(len).ok()?;
    (end <= b.len()).then_some(end)
}
