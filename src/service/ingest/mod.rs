//! Ingest: KV events in, index operations out, for every event source: binary event
//! connections (`events`), the ZMQ subscribers of vLLM/SGLang (`zmq`, with
//! `zmq_reach` for their heartbeats) and the engines file (`engines_file`). Every
//! source cuts a worker's operations with `runtime::index_batch` and hands them to the
//! cores' mailboxes; registry writes go through `routing::control`.
//!
//! May import: `state`, `cluster`, `routing`, `runtime`, `net`, `metrics`, the pure
//! library. Imported by: `api` (none today) and the top.

pub mod engines_file;
pub mod events;
pub mod zmq;
pub mod zmq_reach;
