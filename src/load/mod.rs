//! Active load accounting and the request lifecycle (DESIGN §1 "Active load model").
pub mod agg;
pub mod predictor;
pub mod active;
