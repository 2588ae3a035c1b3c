//! What a replica accepts from NATS, checked (`--cluster`, `cluster.secret`): the one
//! place the NATS tasks (`cluster::nats`, `cluster::peers`) open sealed messages
//! (`cluster::auth`), turn registry entries into apply items under HTTP's ownership
//! rule, and count what they refuse (`kvroute_cluster_refused_total{kind,reason}`,
//! with a log line at the 1st, 2nd, 4th, 8th... refusal of each kind and reason).
//!
//! Guarantees: nothing reaches the apply thread unless its tag verified (or the tier
//! runs `unauthenticated`), its origin is a replica incarnation, and (registry) its
//! worker is the key's and the change is one the credentials of this replica allow
//! the principal the accepting door authenticated (`Credentials::principal_may_act_on`:
//! a worker with its own token is changed only by that token). A replica's own
//! registry entries, echoed back by the bucket, are skipped (it applied them when its
//! door accepted them).

use crate::cluster::auth::Kind;
use crate::cluster::entry::{By, RegEntry};
use crate::cluster::names::worker_key;
use crate::credentials::Principal;
use crate::service::cluster::apply::Apply;
use crate::service::runtime::cluster_link::{Cluster, Out};
use crate::service::runtime::cluster_metrics::RefusedLabel;
use crate::service::runtime::shared::Shared;

/// Counts (and now and then logs) one refused message.
pub fn refuse(sh: &Shared, kind: &'static str, reason: &'static str, what: &str) {
    let c = sh
        .cluster_metrics()
        .refused
        .get_or_create(&RefusedLabel { kind, reason });
    let n = c.inc() + 1;
    if n.is_power_of_two() {
        eprintln!(
            "kvroute: cluster: refused a {kind} from NATS ({reason}{}): {n} so far",
            if what.is_empty() {
                String::new()
            } else {
                format!(", {what}")
            }
        );
    }
}

/// The payload of a sealed message of `kind`, or `None` (refused and counted).
pub fn open<'a>(
    sh: &Shared,
    cl: &Cluster,
    kind: Kind,
    context: &[u8],
    msg: &'a [u8],
) -> Option<&'a [u8]> {
    match cl.sealer.open(kind, context, msg) {
        Ok(p) => Some(p),
        Err(r) => {
            refuse(sh, kind.label(), r.label(), "");
            None
        }
    }
}

/// Whom this replica's doors authenticated for a change of worker `id`: only its own
/// token may change a worker that has one (the doors enforce it), else the shared one.
fn by(sh: &Shared, id: &str) -> By {
    if sh.creds.principal_may_act_on(&Principal::Admin, id) {
        By::Admin
    } else {
        By::Worker
    }
}

/// The KV key and sealed value of a registry change this replica's doors accepted
/// (`None` for event records).
pub fn registry_value(sh: &Shared, cl: &Cluster, out: &Out) -> Option<(String, bytes::Bytes)> {
    let origin = cl.origin.clone();
    let entry = match out {
        Out::Worker(spec) => RegEntry::Put {
            origin,
            by: by(sh, &spec.id),
            spec: spec.clone(),
        },
        Out::Removed(id) => RegEntry::Remove {
            origin,
            by: by(sh, id),
            id: id.clone(),
        },
        Out::Events { .. } => return None,
    };
    let key = worker_key(entry.id());
    let value = cl
        .sealer
        .seal(Kind::Registry, key.as_bytes(), entry.encode());
    Some((key, value.into()))
}

/// A put of the registry bucket as an apply item: `None` when refused (counted) or
/// when it is this replica's own entry.
pub fn registry_item(sh: &Shared, cl: &Cluster, key: &str, value: &[u8]) -> Option<Apply> {
    let payload = open(sh, cl, Kind::Registry, key.as_bytes(), value)?;
    let entry = match RegEntry::decode(key, payload) {
        Ok(e) => e,
        Err(e) => {
            refuse(sh, "registry", e.label(), key);
            return None;
        }
    };
    if entry.origin() == cl.origin {
        return None;
    }
    let who = match entry.by() {
        By::Admin => Principal::Admin,
        By::Worker => Principal::Worker(entry.id().to_string()),
    };
    if !sh.creds.principal_may_act_on(&who, entry.id()) {
        let what = format!("worker {:?} needs its own token", entry.id());
        refuse(sh, "registry", "owner", &what);
        return None;
    }
    Some(match entry {
        RegEntry::Put { spec, .. } => Apply::Worker(spec),
        RegEntry::Remove { id, .. } => Apply::Removed(id),
    })
}

/// A KV delete or purge of the registry bucket: replicas remove workers with sealed
/// tombstones ([`registry_value`]), so with a secret a bare delete (it can carry no
/// tag) is refused; unauthenticated, it removes the worker as before.
pub fn registry_delete(sh: &Shared, cl: &Cluster, key: &str) -> Option<Apply> {
    if cl.sealer.enabled() {
        refuse(sh, "registry", "missing_tag", key);
        return None;
    }
    crate::cluster::names::worker_id_of_key(key).map(Apply::Removed)
}

/// Whether a decoded message's `origin` is a replica incarnation (else refused and
/// counted under `kind`).
pub fn origin_ok(sh: &Shared, kind: Kind, origin: &str) -> bool {
    let ok = crate::cluster::names::is_origin(origin);
    if !ok {
        refuse(sh, kind.label(), "origin", "");
    }
    ok
}
