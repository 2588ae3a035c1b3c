//! Ingest: KV events in, index operations out. Binary event connections (`events`),
//! the ZMQ subscribers of vLLM/SGLang (`zmq`, `zmq_reach`), the engines file
//! (`engines_file`), cutting a worker's operations into bounded batches
//! (`index_batch`) and applying one batch preemptibly (`slice`).

pub mod engines_file;
pub mod events;
pub mod index_batch;
pub mod slice;
pub mod zmq;
pub mod zmq_reach;
