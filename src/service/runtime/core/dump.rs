//! A core's part of a snapshot ([`Core::dump`], for `Msg::Snapshot`).

use super::Core;
use crate::service::runtime::dump::ShardDump;
use crate::snapshot::{SavedRequest, SavedReroute};

impl Core {
    /// Dumps this core's shard and requests (runs on the core, for `Msg::Snapshot`).
    pub fn dump(&self) -> ShardDump {
        let core = self;
        let st = core.st.borrow();
        let mut entries = Vec::new();
        // Replicated: every core holds the same entries; core 0 writes them.
        if core.shared.reports_index(core.id) {
            st.index.for_each_live(|h, w, t| entries.push((w, t, h)));
        }
        let requests = st
            .tracker
            .carry(core.shared.now_us())
            .into_iter()
            .map(|c| {
                let reroute = st.retained.get(&c.id).map(|r| SavedReroute {
                    filters: r.prepared.filters.clone(),
                    mode: r.mode,
                });
                SavedRequest {
                    proxied_here: c.local && crate::ids::is_proxy_id(&c.id),
                    request: c,
                    reroute,
                }
            })
            .collect();
        ShardDump { entries, requests }
    }
}
