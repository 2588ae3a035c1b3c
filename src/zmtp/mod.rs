//! A small ZeroMQ (ZMTP 3.x, NULL mechanism, TCP) implementation for the engine event
//! path: vLLM / SGLang publish KV events on a libzmq PUB socket and answer replays on a
//! ROUTER socket.
//!
//! Why not the `zeromq` crate: its frame decoder allocates whatever a frame header
//! claims (a 2^62 claim aborted the whole router; a 2^40 claim left the subscriber
//! waiting forever) and it has no frame or message limit. Here:
//! - [`codec`]: sans-I/O greeting, commands and a frame decoder that checks each
//!   header's length against the message limit *before* any buffer grows, and assembles
//!   multipart messages under a byte and frame-count limit;
//! - [`conn`]: a blocking, timeout-bounded connection (SUB or DEALER client side, and
//!   the server side of an accepted peer) over `std::net`;
//! - [`publisher`]: a listening PUB helper for tools and tests;
//! - [`spare`]: the large frame buffers a decoder keeps for reuse.
//!
//! Subscriptions are sent in the ZMTP 3.0 form (a `\x01topic` data message), which 3.0
//! and 3.1 publishers (libzmq 4.x) both accept.

pub mod codec;
pub mod conn;
pub mod publisher;
pub mod spare;

pub use codec::{Decoder, Item, Limits, ZmtpError};
pub use conn::{Conn, ConnError};
pub use publisher::Publisher;
