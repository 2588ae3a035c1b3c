//! Wire layout of [`WorkerSpec`], shared by the event `Hello` and the request
//! `Register` messages.
//!
//! The codec checks only what the bytes can say (lengths, UTF-8, enum discriminants);
//! semantic rules (id charset, `dp_ranks.lo <= hi`, capacity > 0) stay with
//! `WorkerSpec::validate`, which the registry runs on every spec whatever its source.

use crate::types::{DeviceClass, DpRanks, Role, WorkerSpec};

use super::wire::{Reader, Writer};
use super::CodecError;

/// Reads the fields in the order of docs/PROTOCOL.md §WorkerSpec.
pub(crate) fn read_spec(r: &mut Reader<'_>) -> Result<WorkerSpec, CodecError> {
    Ok(WorkerSpec {
        id: r.string("spec.id")?,
        role: r.enum_u8("spec.role", Role::from_u8)?,
        device: r.enum_u8("spec.device", DeviceClass::from_u8)?,
        model: r.string("spec.model")?,
        dp_ranks: DpRanks {
            lo: r.u32("spec.dp_lo")?,
            hi: r.u32("spec.dp_hi")?,
        },
        taints: r.string_list("spec.taints")?,
        topology: r.string("spec.topology")?,
        capacity_blocks: r.u64("spec.capacity_blocks")?,
        epoch: r.u64("spec.epoch")?,
        // Not on the wire (docs/PROTOCOL.md §WorkerSpec): HTTP and TOML only.
        throughput_weight: None,
        url: read_extensions(r)?,
    })
}

/// Extension tag of the upstream URL (docs/PROTOCOL.md §1.3 "Extensions").
const EXT_URL: u8 = 0x01;

/// The optional extensions after `spec.epoch` (the spec ends its frame): none from a
/// client that predates them; else tagged fields, `0x01` the upstream URL, at most
/// once. Any other byte (a repeated tag included) is left unread, so the frame fails as
/// `TrailingBytes` (an unknown extension's length is unknowable), and the encoding
/// stays canonical: one spec, one byte string (the `event_frames` fuzz target found
/// two URL tags decoding to the spec of one).
fn read_extensions(r: &mut Reader<'_>) -> Result<Option<String>, CodecError> {
    if r.peek_u8() != Some(EXT_URL) {
        return Ok(None);
    }
    r.u8("spec.ext")?;
    Ok(Some(r.string("spec.url")?))
}

/// Writes the fields in the order [`read_spec`] reads them.
pub(crate) fn write_spec(w: &mut Writer<'_>, s: &WorkerSpec) -> Result<(), CodecError> {
    w.string("spec.id", &s.id)?;
    w.u8(s.role as u8);
    w.u8(s.device as u8);
    w.string("spec.model", &s.model)?;
    w.u32(s.dp_ranks.lo);
    w.u32(s.dp_ranks.hi);
    w.string_list("spec.taints", &s.taints)?;
    w.string("spec.topology", &s.topology)?;
    w.u64(s.capacity_blocks);
    w.u64(s.epoch);
    // Written only when set, so a spec without one is byte-identical to the old layout.
    if let Some(u) = &s.url {
        w.u8(EXT_URL);
        w.string("spec.url", u)?;
    }
    Ok(())
}
