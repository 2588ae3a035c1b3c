//! Registering metric families: one `name, help => metric;` line per family instead of a
//! five-line `register` call each. Every feature that owns metrics (the service, the
//! proxy, the endpoint picker, replicas) registers its families through this macro; it
//! imports nothing and holds no state.

/// Registers each `name, help => metric;` in the registry `r`, cloning the metric (a
/// family and its clone share storage, so the owner keeps updating the original).
macro_rules! register_all {
    ($r:expr; $($name:expr, $help:expr => $metric:expr;)*) => {{
        let r: &mut prometheus_client::registry::Registry = &mut *$r;
        $( r.register($name, $help, $metric.clone()); )*
    }};
}
pub(crate) use register_all;
