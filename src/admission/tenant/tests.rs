//! Tenants: identity and its precedence, pinned priorities, both limits and the
//! refusal naming one, the bounded table and its overflow bucket, bounded labels.

use super::*;
use proptest::prelude::*;

const S: u64 = 1_000_000;

fn spec(name: &str, key: Option<&str>, value: Option<&str>) -> TenantSpec {
    TenantSpec {
        name: name.into(),
        api_key: key.map(Into::into),
        header_value: value.map(Into::into),
        priority: None,
        requests_per_s: None,
        prompt_tokens_per_s: None,
    }
}

fn settings() -> AdmissionSettings {
    AdmissionSettings {
        tenant_requests_per_s: Some(2.0),
        tenant_burst_ms: 1000,
        ..Default::default()
    }
}

#[test]
fn off_unless_configured() {
    let mut t = Tenants::new(&AdmissionSettings::default(), Vec::new());
    assert!(!t.enabled());
    assert_eq!(t.identify(Some("k"), Some(b"v")), None);
}

#[test]
fn identity_is_a_named_key_then_the_header_then_the_key() {
    let s = AdmissionSettings {
        tenant_header: Some("X-Tenant".into()),
        ..settings()
    };
    let named = vec![
        TenantSpec {
            priority: Some(-4),
            ..spec("gold", Some("kg"), None)
        },
        spec("team-a", None, Some("A")),
    ];
    let mut t = Tenants::new(&s, named);
    assert_eq!(t.header(), Some("x-tenant"));
    let gold = t.identify(Some("kg"), Some(b"A")).unwrap();
    assert_eq!((gold.named, gold.pinned), (Some(0), Some(-4)));
    assert_eq!(t.labels()[gold.label as usize], "gold");
    let a = t.identify(Some("other-key"), Some(b"A")).unwrap();
    assert_eq!((a.named, a.pinned), (Some(1), None));
    assert_eq!(t.labels()[a.label as usize], "team-a");
    let h = t.identify(None, Some(b"team b/2")).unwrap();
    assert_eq!(h.named, None);
    assert_eq!(t.labels()[h.label as usize], "team_b_2");
    let k = t.identify(Some("secret"), None).unwrap();
    let label = &t.labels()[k.label as usize];
    assert!(label.starts_with("key-") && label.len() == 12 && !label.contains("secret"));
    assert_ne!(k.id, h.id);
    assert_eq!(t.identify(Some("secret"), Some(b"")).unwrap(), k);
    assert_eq!(t.identify(None, None), None);
    assert_eq!(t.identify(Some(""), None), None);
    // The same identity always gets the same tenant and label.
    assert_eq!(t.identify(None, Some(b"team b/2")), Some(h));
}

#[test]
fn a_tenant_over_its_request_rate_is_refused_naming_the_limit_and_others_pass() {
    let mut t = Tenants::new(&settings(), Vec::new());
    let a = t.identify(Some("a"), None).unwrap();
    let b = t.identify(Some("b"), None).unwrap();
    t.check(&a, 10, 0).unwrap();
    t.check(&a, 10, 0).unwrap();
    let e = t.check(&a, 10, 0).unwrap_err();
    assert_eq!(e.limit, Limit::Requests);
    assert_eq!(e.limit.name(), "requests_per_s");
    assert_eq!(e.retry_after_us, S / 2);
    t.check(&b, 10, 0).unwrap();
    t.check(&a, 10, S / 2).unwrap();
}

#[test]
fn prompt_tokens_have_their_own_bucket_and_a_refusal_charges_nothing() {
    let s = AdmissionSettings {
        tenant_prompt_tokens_per_s: Some(1000.0),
        ..settings()
    };
    let mut t = Tenants::new(&s, Vec::new());
    let a = t.identify(Some("a"), None).unwrap();
    t.check(&a, 800, 0).unwrap();
    let e = t.check(&a, 800, 0).unwrap_err();
    assert_eq!(e.limit, Limit::PromptTokens);
    assert_eq!(e.retry_after_us, 600_000);
    // The refused request took no request token: one more small one passes.
    t.check(&a, 100, 0).unwrap();
    assert_eq!(t.check(&a, 1, 0).unwrap_err().limit, Limit::Requests);
}

#[test]
fn named_tenants_have_their_own_limits_or_none() {
    let named = vec![
        TenantSpec {
            requests_per_s: Some(1.0),
            ..spec("slow", Some("ks"), None)
        },
        spec("dflt", Some("kd"), None),
    ];
    let s = AdmissionSettings {
        tenant_requests_per_s: None,
        ..settings()
    };
    let mut t = Tenants::new(&s, named);
    assert!(t.enabled());
    let slow = t.identify(Some("ks"), None).unwrap();
    let dflt = t.identify(Some("kd"), None).unwrap();
    t.check(&slow, 0, 0).unwrap();
    assert!(t.check(&slow, 0, 0).is_err());
    for _ in 0..100 {
        t.check(&dflt, 0, 0).unwrap();
    }
    assert_eq!(t.tracked(), 0, "named tenants are not in the bounded table");
}

#[test]
fn the_table_forgets_full_buckets_first_and_overflow_is_shared() {
    let s = AdmissionSettings {
        max_tenants: 2,
        ..settings()
    };
    let mut t = Tenants::new(&s, Vec::new());
    let ids: Vec<Tenant> = (0..4)
        .map(|i| t.identify(Some(&format!("k{i}")), None).unwrap())
        .collect();
    t.check(&ids[0], 0, 0).unwrap();
    t.check(&ids[1], 0, 0).unwrap();
    assert_eq!(t.tracked(), 2);
    // Both tracked tenants are mid-burst: newcomers share the overflow bucket.
    t.check(&ids[2], 0, 0).unwrap();
    t.check(&ids[3], 0, 0).unwrap();
    assert!(
        t.check(&ids[2], 0, 0).is_err(),
        "overflow holds one bucket for all"
    );
    // Once a tracked tenant's bucket is full again (1 s at 2/s for 1 request), it is
    // forgotten for a newcomer.
    t.check(&ids[2], 0, 2 * S).unwrap();
    assert_eq!(t.tracked(), 2);
    assert!(t.tracked() <= 2);
}

#[test]
fn labels_are_bounded() {
    let s = AdmissionSettings {
        max_tenant_labels: 3,
        tenant_header: Some("x-t".into()),
        ..settings()
    };
    let mut t = Tenants::new(&s, vec![spec("n", None, Some("named"))]);
    for i in 0..10 {
        t.identify(None, Some(format!("t{i}").as_bytes())).unwrap();
    }
    // A header value equal to a named tenant's name gets no second label.
    let dup = t.identify(None, Some(b"n")).unwrap();
    assert_eq!(dup.label, OTHER);
    assert_eq!(t.labels(), ["other", "n", "t0", "t1", "t2"]);
    let late = t.identify(None, Some(b"t9")).unwrap();
    assert_eq!(late.label, OTHER);
}

proptest! {
    /// Whatever the identities and times, the table stays bounded, labels stay
    /// bounded, and each tenant's admitted requests respect burst + rate × time
    /// (tenants sharing the overflow bucket are counted together).
    #[test]
    fn bounded_and_never_over_the_rate(
        calls in prop::collection::vec((0u8..12, 0u64..300_000), 1..300),
    ) {
        let s = AdmissionSettings { max_tenants: 4, max_tenant_labels: 5, ..settings() };
        let mut t = Tenants::new(&s, Vec::new());
        let mut now = 0;
        let mut admitted = 0u64;
        for &(who, dt) in &calls {
            now += dt;
            let ten = t.identify(Some(&format!("k{who}")), None).unwrap();
            if t.check(&ten, 0, now).is_ok() {
                admitted += 1;
            }
            prop_assert!(t.tracked() <= 4);
            prop_assert!(t.labels().len() <= 6);
        }
        // 12 identities: at most 4 tracked + 1 overflow bucket at a time, but over
        // time every identity may have its own burst: bound by bursts + rate.
        let bound = 12.0 * 2.0 + 12.0 * 2.0 * now as f64 / 1e6 + 1.0;
        prop_assert!((admitted as f64) <= bound);
    }
}
