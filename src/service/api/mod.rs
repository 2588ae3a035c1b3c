//! The request APIs: the binary protocol (`binary`, its pipelined reads answered by
//! `batch`), the JSON HTTP API (`http`), `/metrics` (`scrape`) and the status window
//! and page (`status`, `ui/`). Each answers through `routing` and maps errors with
//! `routing::errors`, so both APIs answer a failure the same way.
//!
//! May import: every service layer below it and the pure library; only the top
//! imports it.

pub mod batch;
pub mod binary;
pub mod http;
pub mod scrape;
pub mod status;
