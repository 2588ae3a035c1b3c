//! A request the stream wants routed, before the gateway's subset hint is applied:
//! [`Route::resolve`] turns the hint into the picker's allow list against the current
//! endpoints (the one place where "the subset names no known worker" becomes the
//! protocol's 503).

use super::pick::{EndpointInfo, NoPick, PickRequest};
use super::subset::Subset;

#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// `allow` is `None` here; [`Route::resolve`] fills it.
    pub request: PickRequest,
    pub subset: Option<Subset>,
}

/// What resolving a subset found.
#[derive(Debug, PartialEq)]
pub struct Resolved {
    pub request: Result<PickRequest, NoPick>,
    /// Subset entries naming no known endpoint (ignored, counted).
    pub unknown: usize,
}

impl Route {
    pub fn resolve(self, endpoints: &[EndpointInfo]) -> Resolved {
        let Some(subset) = self.subset else {
            return Resolved {
                request: Ok(self.request),
                unknown: 0,
            };
        };
        let r = subset.resolve(endpoints);
        let request = if r.allow.is_empty() {
            Err(NoPick::NoEndpoint(format!(
                "no known endpoint in the gateway's subset hint ({} entries, {} unknown)",
                subset.entries.len() + subset.malformed,
                r.unknown
            )))
        } else {
            let mut req = self.request;
            req.allow = Some(r.allow);
            Ok(req)
        };
        Resolved {
            request,
            unknown: r.unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epp::subset::Entry;

    fn req() -> PickRequest {
        PickRequest {
            endpoint: None,
            request: None,
            body_len: 0,
            client_id: "c".into(),
            allow: None,
        }
    }

    #[test]
    fn subsets_become_allow_lists_or_a_503() {
        let eps = vec![EndpointInfo {
            worker: "w1".into(),
            endpoint: "10.0.0.1:80".into(),
        }];
        let none = Route {
            request: req(),
            subset: None,
        };
        assert_eq!(none.resolve(&eps).request.unwrap().allow, None);
        let entry = |h: &str| Entry {
            host: h.into(),
            port: None,
        };
        let some = Route {
            request: req(),
            subset: Some(Subset {
                entries: vec![entry("10.0.0.1"), entry("10.0.0.9")],
                malformed: 0,
            }),
        };
        let r = some.resolve(&eps);
        assert_eq!(r.request.unwrap().allow, Some(vec!["w1".to_string()]));
        assert_eq!(r.unknown, 1);
        let empty = Route {
            request: req(),
            subset: Some(Subset::default()),
        };
        let r = empty.resolve(&eps);
        assert!(matches!(r.request, Err(NoPick::NoEndpoint(_))));
    }
}
