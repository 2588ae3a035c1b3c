//! ZMTP 3.x wire format, sans I/O: the greeting, NULL-mechanism commands (READY with
//! properties, ERROR, PING/PONG, SUBSCRIBE/CANCEL) and a frame decoder that assembles
//! multipart messages under byte limits.
//!
//! Guarantees (the reason this exists instead of the `zeromq` crate, whose decoder
//! allocates whatever a frame header claims):
//! - a frame's declared length is checked against [`Limits`] on the header, *before* any
//!   buffer is reserved; the body buffer is then reserved once at exactly that length
//!   (untouched pages cost no RSS until the peer's bytes arrive);
//! - a multipart message never holds more than `max_message_bytes` of bodies nor more
//!   than `max_frames` frames; a command frame never exceeds [`MAX_COMMAND`];
//! - never panics on any byte string; every violation is an error value, after which
//!   the caller closes the connection (ZMTP has no way to resynchronise).

use super::spare::Spares;
use std::fmt;

/// Size of a ZMTP 3.x greeting.
pub const GREETING_LEN: usize = 64;
/// Largest command frame accepted (READY properties are small: a socket type and an
/// identity of at most 255 bytes).
pub const MAX_COMMAND: usize = 64 * 1024;

const FLAG_MORE: u8 = 1;
const FLAG_LONG: u8 = 2;
const FLAG_COMMAND: u8 = 4;

/// Bounds of one connection's decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sum of the frame bodies of one multipart message.
    pub max_message_bytes: usize,
    /// Frames in one multipart message (empty frames cost no bytes but still count).
    pub max_frames: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 4 << 20,
            max_frames: 16,
        }
    }
}

/// Why a peer's bytes were refused; the connection must be closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ZmtpError {
    /// Not a ZMTP 3.x greeting (bad signature or version below 3).
    BadGreeting(&'static str),
    /// The peer wants a mechanism other than NULL.
    Mechanism(String),
    /// A frame header announced more than the message limit allows.
    FrameTooLarge {
        claimed: u64,
        limit: usize,
    },
    /// The multipart message grew past a limit.
    MessageTooLarge {
        limit: usize,
    },
    TooManyFrames {
        limit: usize,
    },
    /// A malformed command, flags or property.
    Protocol(&'static str),
    /// The peer sent an ERROR command.
    PeerError(String),
    /// The peer's socket type cannot talk to ours.
    SocketType(String),
}

impl fmt::Display for ZmtpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZmtpError::BadGreeting(w) => write!(f, "bad ZMTP greeting: {w}"),
            ZmtpError::Mechanism(m) => write!(f, "unsupported security mechanism {m:?}"),
            ZmtpError::FrameTooLarge { claimed, limit } => {
                write!(f, "frame header claims {claimed} bytes, limit {limit}")
            }
            ZmtpError::MessageTooLarge { limit } => {
                write!(f, "multipart message larger than {limit} bytes")
            }
            ZmtpError::TooManyFrames { limit } => {
                write!(f, "multipart message of more than {limit} frames")
            }
            ZmtpError::Protocol(w) => write!(f, "ZMTP protocol error: {w}"),
            ZmtpError::PeerError(r) => write!(f, "peer sent ERROR {r:?}"),
            ZmtpError::SocketType(t) => write!(f, "incompatible peer socket type {t:?}"),
        }
    }
}

impl std::error::Error for ZmtpError {}

/// Our greeting: ZMTP 3.1, NULL mechanism.
pub fn greeting(as_server: bool) -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 1;
    g[12..16].copy_from_slice(b"NULL");
    g[32] = as_server as u8;
    g
}

/// The peer's greeting: `(major, minor)` if it is ZMTP 3.x with the NULL mechanism.
pub fn parse_greeting(g: &[u8]) -> Result<(u8, u8), ZmtpError> {
    if g.len() < GREETING_LEN {
        return Err(ZmtpError::BadGreeting("short"));
    }
    if g[0] != 0xFF || g[9] & 1 != 1 {
        return Err(ZmtpError::BadGreeting("bad signature"));
    }
    if g[10] < 3 {
        return Err(ZmtpError::BadGreeting("ZMTP version below 3.0"));
    }
    let mech = &g[12..32];
    let end = mech.iter().position(|&b| b == 0).unwrap_or(mech.len());
    if &mech[..end] != b"NULL" {
        return Err(ZmtpError::Mechanism(
            String::from_utf8_lossy(&mech[..end]).into_owned(),
        ));
    }
    Ok((g[10], g[11]))
}

/// Encodes one frame (header + body) onto `out`.
pub fn encode_frame(out: &mut Vec<u8>, body: &[u8], more: bool, command: bool) {
    let mut flags = 0u8;
    if more {
        flags |= FLAG_MORE;
    }
    if command {
        flags |= FLAG_COMMAND;
    }
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

/// Encodes a multipart message.
pub fn encode_message<F: AsRef<[u8]>>(out: &mut Vec<u8>, frames: &[F]) {
    for (i, f) in frames.iter().enumerate() {
        encode_frame(out, f.as_ref(), i + 1 < frames.len(), false);
    }
}

/// A READY command frame with `Socket-Type` and, if given, `Identity`.
pub fn ready(socket_type: &str, identity: Option<&[u8]>) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(5);
    body.extend_from_slice(b"READY");
    let mut prop = |name: &str, value: &[u8]| {
        body.push(name.len() as u8);
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&(value.len() as u32).to_be_bytes());
        body.extend_from_slice(value);
    };
    prop("Socket-Type", socket_type.as_bytes());
    if let Some(id) = identity {
        prop("Identity", id);
    }
    let mut out = Vec::with_capacity(body.len() + 9);
    encode_frame(&mut out, &body, false, true);
    out
}

/// A PONG answering a PING's context.
pub fn pong(context: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(5 + context.len());
    body.push(4);
    body.extend_from_slice(b"PONG");
    body.extend_from_slice(context);
    let mut out = Vec::new();
    encode_frame(&mut out, &body, false, true);
    out
}

/// The subscription message in its ZMTP 3.0 form (`\x01topic` as a data frame), which
/// both 3.0 and 3.1 publishers accept.
pub fn subscribe(topic: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + topic.len());
    body.push(1);
    body.extend_from_slice(topic);
    let mut out = Vec::new();
    encode_frame(&mut out, &body, false, false);
    out
}

/// A decoded command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// READY: its properties (name, value).
    Ready(Vec<(String, Vec<u8>)>),
    Error(String),
    /// PING: the context to echo in the PONG (TTL stripped).
    Ping(Vec<u8>),
    Pong,
    /// ZMTP 3.1 SUBSCRIBE / CANCEL commands.
    Subscribe(Vec<u8>),
    Cancel(Vec<u8>),
    /// Anything else (ignored by the drivers).
    Other(String),
}

impl Command {
    /// A READY's property, by case-insensitive name.
    pub fn property(&self, name: &str) -> Option<&[u8]> {
        match self {
            Command::Ready(p) => p
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_slice()),
            _ => None,
        }
    }
}

/// Parses a command frame's body.
pub fn parse_command(body: &[u8]) -> Result<Command, ZmtpError> {
    let (&n, rest) = body
        .split_first()
        .ok_or(ZmtpError::Protocol("empty command"))?;
    let n = n as usize;
    if rest.len() < n {
        return Err(ZmtpError::Protocol("command name past the frame"));
    }
    let (name, data) = rest.split_at(n);
    Ok(match name {
        b"READY" => Command::Ready(parse_properties(data)?),
        b"ERROR" => {
            let (&len, r) = data.split_first().unwrap_or((&0, &[]));
            let r = r.get(..len as usize).unwrap_or(r);
            Command::Error(String::from_utf8_lossy(r).into_owned())
        }
        b"PING" => Command::Ping(data.get(2..).unwrap_or(&[]).to_vec()),
        b"PONG" => Command::Pong,
        b"SUBSCRIBE" => Command::Subscribe(data.to_vec()),
        b"CANCEL" => Command::Cancel(data.to_vec()),
        other => Command::Other(String::from_utf8_lossy(other).into_owned()),
    })
}

fn parse_properties(mut d: &[u8]) -> Result<Vec<(String, Vec<u8>)>, ZmtpError> {
    let mut out = Vec::new();
    while let Some((&n, rest)) = d.split_first() {
        let n = n as usize;
        if rest.len() < n + 4 {
            return Err(ZmtpError::Protocol("truncated property"));
        }
        let name = String::from_utf8_lossy(&rest[..n]).into_owned();
        let mut len = [0u8; 4];
        len.copy_from_slice(&rest[n..n + 4]);
        let len = u32::from_be_bytes(len) as usize;
        let rest = &rest[n + 4..];
        if rest.len() < len {
            return Err(ZmtpError::Protocol("property value past the frame"));
        }
        out.push((name, rest[..len].to_vec()));
        d = &rest[len..];
    }
    Ok(out)
}

/// Whether a socket of type `ours` may talk to a peer announcing `peer` (ZMTP 3.1
/// socket-type rules, for the types kvroute uses).
pub fn compatible(ours: &str, peer: &[u8]) -> bool {
    let ok: &[&[u8]] = match ours {
        "SUB" | "XSUB" => &[b"PUB", b"XPUB"],
        "PUB" | "XPUB" => &[b"SUB", b"XSUB"],
        "DEALER" => &[b"ROUTER", b"DEALER", b"REP"],
        "ROUTER" => &[b"DEALER", b"REQ", b"ROUTER"],
        _ => &[],
    };
    ok.contains(&peer)
}

/// What the decoder produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A complete multipart message.
    Message(Vec<Vec<u8>>),
    Command(Command),
}

#[derive(Debug)]
enum State {
    /// Collecting a header: flags plus 1 or 8 length bytes.
    Header { buf: [u8; 9], have: usize },
    /// Collecting a body of `len` bytes.
    Body {
        flags: u8,
        len: usize,
        body: Vec<u8>,
    },
}

/// Incremental frame decoder of one connection (after the greeting).
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    state: State,
    frames: Vec<Vec<u8>>,
    msg_bytes: usize,
    /// Buffers of handed-back frames ([`Decoder::recycle`]).
    spare: Spares,
}

impl Decoder {
    pub fn new(limits: Limits) -> Decoder {
        Decoder {
            limits,
            state: State::Header {
                buf: [0; 9],
                have: 0,
            },
            frames: Vec::new(),
            msg_bytes: 0,
            spare: Spares::default(),
        }
    }

    /// Hands back the frames of a message the caller is done with: their large
    /// buffers may carry later frames ([`super::spare`]).
    pub fn recycle(&mut self, frames: Vec<Vec<u8>>) {
        frames.into_iter().for_each(|f| self.spare.put(f));
    }

    /// Frees the kept buffers (the stream went quiet).
    pub fn drop_spares(&mut self) {
        self.spare.clear();
    }

    /// Bytes of the message being assembled (frames so far plus the current body).
    pub fn buffered(&self) -> usize {
        let cur = match &self.state {
            State::Body { body, .. } => body.len(),
            State::Header { .. } => 0,
        };
        self.msg_bytes + cur
    }

    /// Consumes bytes from `input` until one item is complete or the input is used up.
    /// Returns how many bytes were consumed and the item, if one completed. After an
    /// error the decoder must be dropped.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Item>), ZmtpError> {
        let mut used = 0;
        loop {
            match &mut self.state {
                State::Header { buf, have } => {
                    let need = if *have >= 1 && buf[0] & FLAG_LONG != 0 {
                        9
                    } else {
                        2
                    };
                    if *have < need {
                        let take = (need - *have).min(input.len() - used);
                        if take == 0 {
                            return Ok((used, None));
                        }
                        buf[*have..*have + take].copy_from_slice(&input[used..used + take]);
                        *have += take;
                        used += take;
                        continue;
                    }
                    let flags = buf[0];
                    if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 {
                        return Err(ZmtpError::Protocol("reserved flag bits set"));
                    }
                    let claimed = if flags & FLAG_LONG != 0 {
                        let mut l = [0u8; 8];
                        l.copy_from_slice(&buf[1..9]);
                        u64::from_be_bytes(l)
                    } else {
                        buf[1] as u64
                    };
                    let command = flags & FLAG_COMMAND != 0;
                    let len = self.check_len(claimed, command)?;
                    if command && flags & FLAG_MORE != 0 {
                        return Err(ZmtpError::Protocol("command frame with MORE"));
                    }
                    if command && !self.frames.is_empty() {
                        return Err(ZmtpError::Protocol("command inside a multipart message"));
                    }
                    if !command && self.frames.len() >= self.limits.max_frames {
                        return Err(ZmtpError::TooManyFrames {
                            limit: self.limits.max_frames,
                        });
                    }
                    // At least `len` (already within the limit): no growth copies, and
                    // fresh pages are only committed as the peer's bytes are written in.
                    let body = self.spare.take(len);
                    self.state = State::Body { flags, len, body };
                }
                State::Body { flags, len, body } => {
                    let take = (*len - body.len()).min(input.len() - used);
                    body.extend_from_slice(&input[used..used + take]);
                    used += take;
                    if body.len() < *len {
                        return Ok((used, None));
                    }
                    let flags = *flags;
                    let body = std::mem::take(body);
                    self.state = State::Header {
                        buf: [0; 9],
                        have: 0,
                    };
                    if flags & FLAG_COMMAND != 0 {
                        return Ok((used, Some(Item::Command(parse_command(&body)?))));
                    }
                    self.msg_bytes += body.len();
                    self.frames.push(body);
                    if flags & FLAG_MORE == 0 {
                        self.msg_bytes = 0;
                        let msg = std::mem::take(&mut self.frames);
                        return Ok((used, Some(Item::Message(msg))));
                    }
                }
            }
        }
    }

    /// The header's claim against the limits, before anything is allocated for it.
    fn check_len(&self, claimed: u64, command: bool) -> Result<usize, ZmtpError> {
        let limit = if command {
            MAX_COMMAND
        } else {
            self.limits.max_message_bytes.saturating_sub(self.msg_bytes)
        };
        if claimed > limit as u64 {
            if !command && self.msg_bytes > 0 && claimed <= self.limits.max_message_bytes as u64 {
                return Err(ZmtpError::MessageTooLarge {
                    limit: self.limits.max_message_bytes,
                });
            }
            return Err(ZmtpError::FrameTooLarge {
                claimed,
                limit: if command {
                    MAX_COMMAND
                } else {
                    self.limits.max_message_bytes
                },
            });
        }
        Ok(claimed as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zmtp::spare::SPARE_MIN;

    fn decode_all(d: &mut Decoder, mut input: &[u8]) -> Result<Vec<Item>, ZmtpError> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let (n, item) = d.decode(input)?;
            input = &input[n..];
            out.extend(item);
            if n == 0 && out.is_empty() {
                break;
            }
        }
        Ok(out)
    }

    #[test]
    fn greeting_roundtrip_and_refusals() {
        assert_eq!(parse_greeting(&greeting(false)), Ok((3, 1)));
        let mut g = greeting(true);
        g[10] = 2;
        assert!(parse_greeting(&g).is_err());
        let mut g = greeting(true);
        g[12..17].copy_from_slice(b"PLAIN");
        assert!(matches!(parse_greeting(&g), Err(ZmtpError::Mechanism(_))));
        assert!(parse_greeting(&[0xFF; 10]).is_err());
    }

    #[test]
    fn multipart_and_commands_byte_by_byte() {
        let mut wire = ready("PUB", Some(b"id"));
        encode_message(&mut wire, &[&b""[..], &[7u8; 8][..], &[9u8; 300][..]]);
        wire.extend(pong(b"ctx"));
        let mut d = Decoder::new(Limits::default());
        let mut items = Vec::new();
        for b in &wire {
            let (n, item) = d.decode(std::slice::from_ref(b)).unwrap();
            assert_eq!(n, 1);
            items.extend(item);
        }
        assert_eq!(items.len(), 3);
        let Item::Command(c) = &items[0] else {
            panic!()
        };
        assert_eq!(c.property("socket-type"), Some(&b"PUB"[..]));
        assert_eq!(c.property("Identity"), Some(&b"id"[..]));
        assert_eq!(
            items[1],
            Item::Message(vec![vec![], vec![7; 8], vec![9; 300]])
        );
        assert_eq!(items[2], Item::Command(Command::Pong));
    }

    #[test]
    fn recycled_buffers_carry_later_large_frames() {
        let big = vec![5u8; SPARE_MIN + 10];
        let mut wire = Vec::new();
        encode_message(&mut wire, &[&b"t"[..], &big[..]]);
        let mut d = Decoder::new(Limits::default());
        let Ok(Some(Item::Message(m))) = decode_all(&mut d, &wire).map(|mut v| v.pop()) else {
            panic!("no message")
        };
        let at = m[1].as_ptr();
        // Only the large frame is kept; a later (smaller) large body lands in it.
        d.recycle(m);
        assert_eq!(d.spare.len(), 1);
        wire.clear();
        encode_message(&mut wire, &[&b"t"[..], &big[..SPARE_MIN]]);
        let out = decode_all(&mut d, &wire).unwrap();
        let want = vec![b"t".to_vec(), big[..SPARE_MIN].to_vec()];
        assert!(matches!(&out[..], [Item::Message(m)] if *m == want && m[1].as_ptr() == at));
        d.drop_spares();
        assert!(d.spare.is_empty());
    }

    #[test]
    fn oversized_claims_fail_on_the_header() {
        let lim = Limits {
            max_message_bytes: 1000,
            max_frames: 4,
        };
        for claim in [1u64 << 62, 1 << 40, 1001] {
            let mut d = Decoder::new(lim);
            let mut h = vec![FLAG_LONG];
            h.extend_from_slice(&claim.to_be_bytes());
            assert!(matches!(d.decode(&h), Err(ZmtpError::FrameTooLarge { .. })));
        }
        // Two frames of 600 each: the second is refused on its header.
        let mut d = Decoder::new(lim);
        let mut w = Vec::new();
        encode_frame(&mut w, &[0; 600], true, false);
        encode_frame(&mut w, &[0; 600], false, false);
        assert!(matches!(
            decode_all(&mut d, &w),
            Err(ZmtpError::MessageTooLarge { .. })
        ));
        // Too many empty frames.
        let mut d = Decoder::new(lim);
        let w: Vec<u8> = [FLAG_MORE, 0].repeat(5);
        assert!(matches!(
            decode_all(&mut d, &w),
            Err(ZmtpError::TooManyFrames { .. })
        ));
        // A long command.
        let mut d = Decoder::new(lim);
        let mut h = vec![FLAG_LONG | FLAG_COMMAND];
        h.extend_from_slice(&((MAX_COMMAND as u64) + 1).to_be_bytes());
        assert!(d.decode(&h).is_err());
    }

    #[test]
    fn subscribe_is_a_data_frame() {
        let s = subscribe(b"kv");
        assert_eq!(s, vec![0, 3, 1, b'k', b'v']);
        assert!(compatible("SUB", b"XPUB"));
        assert!(!compatible("SUB", b"ROUTER"));
    }
}
