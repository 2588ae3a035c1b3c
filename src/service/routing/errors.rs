//! One mapping from service errors to wire error codes (binary) and HTTP statuses, so
//! both APIs answer the same failure the same way, and the error type itself
//! ([`ApiError`]). A leaf of `routing`.

use crate::codec::ErrorCode;
use crate::engine::EngineError;
use crate::registry::RegistryError;
use crate::select::RouteError;

/// Errors of the service API: engine errors plus overload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("overloaded: {0}")]
    Overloaded(String),
}

/// The error code of a service error.
pub fn code(e: &ApiError) -> ErrorCode {
    match e {
        ApiError::Overloaded(_) => ErrorCode::Overloaded,
        ApiError::Engine(e) => match e {
            EngineError::BadRequest(_) => ErrorCode::BadRequest,
            EngineError::UnknownWorker(_) => ErrorCode::UnknownWorker,
            EngineError::UnknownRequest(_) => ErrorCode::UnknownRequest,
            EngineError::Duplicate(_) => ErrorCode::DuplicateRequest,
            EngineError::Registry(RegistryError::Invalid(_)) => ErrorCode::BadRequest,
            EngineError::Registry(RegistryError::Full(_)) => ErrorCode::Overloaded,
            EngineError::Registry(RegistryError::Conflict(_)) => ErrorCode::Conflict,
            EngineError::Route(r) => match r {
                RouteError::DirectNeedsPin => ErrorCode::BadRequest,
                RouteError::AllBusy { .. } => ErrorCode::AllBusy,
                RouteError::NoWorkers { .. }
                | RouteError::EmptyPool { .. }
                | RouteError::AllFiltered { .. }
                | RouteError::PinNotFound { .. }
                | RouteError::NoDecodeInDomain { .. } => ErrorCode::NoEligibleWorker,
            },
        },
    }
}

/// The code for a connection whose first frame could not be read (`conn::read_hello`'s
/// metric label): a framing error is `bad_request`; a timeout or a close before any
/// frame is a `protocol_violation` (docs/PROTOCOL.md §5).
pub fn hello_failure(label: &str) -> ErrorCode {
    match label {
        "oversized_frame" | "malformed_frame" | "unknown_kind" => ErrorCode::BadRequest,
        _ => ErrorCode::ProtocolViolation,
    }
}

/// HTTP status and machine-readable code of a service error.
pub fn classify(e: &ApiError) -> (u16, &'static str) {
    let c = code(e);
    (c.http_status(), c.name())
}
