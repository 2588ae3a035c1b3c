//! The proxy on one core ([`Front`]): the routing handle of that core
//! (`service::routing::handle`, the proxy's only door into routing) and the proxy's
//! process-wide state (`state::ProxyShared`: admission count, keys, metrics). Cheap to
//! clone; the service builds one per core when it starts the proxy's listener.

use super::state::ProxyShared;
use crate::service::routing::handle::Handle;
use std::sync::Arc;

#[derive(Clone)]
pub struct Front {
    pub handle: Handle,
    pub state: Arc<ProxyShared>,
}
