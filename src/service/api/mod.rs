//! The request APIs: the binary protocol (`binary`, pipelined by `batch`), the JSON
//! HTTP API (`http`), `/metrics` (`scrape`) and the status window and page (`status`).

pub mod batch;
pub mod binary;
pub mod http;
pub mod scrape;
pub mod status;
