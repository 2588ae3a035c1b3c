//! `[cluster]` settings (flags `--cluster*`, env `KVROUTE_CLUSTER*`): where NATS is,
//! how to authenticate to it, the tier secret every replica seals what it publishes
//! with (`cluster::auth`), the stream's limits. `url` unset (the default) = no
//! cluster: the router runs exactly as a single node.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// NATS server (`nats://HOST:PORT`, comma-separated for several). Default none.
    pub url: Option<String>,
    /// Names the stream, subjects and bucket shared by one tier. Default `kvroute`.
    pub name: String,
    /// This replica's id in the log (its records' origin). Default `HOSTNAME-PID`.
    pub replica_id: Option<String>,
    /// NATS token authentication. Default none.
    pub token: Option<String>,
    /// NATS user/password authentication (both or neither). Default none.
    pub user: Option<String>,
    pub password: Option<String>,
    /// NATS credentials file (JWT + NKey seed). Default none.
    pub creds_file: Option<String>,
    /// The tier secret (at least 16 bytes, the same on every replica): everything a
    /// replica publishes carries an HMAC-SHA256 tag made with it, and everything it
    /// receives without a valid tag is refused (`cluster::auth`). Required with `url`
    /// unless `unauthenticated`. Default none.
    pub secret: Option<String>,
    /// File holding the tier secret (its first line), instead of `secret`.
    pub secret_file: Option<String>,
    /// Run the tier without a secret: nothing is sealed or checked, so any client of
    /// the NATS server can forge records, registrations and load. Default false.
    pub unauthenticated: bool,
    /// Event records older than this leave the stream. Default 86,400,000 ms (1 day).
    pub max_age_ms: u64,
    /// The stream keeps at most this many bytes (oldest records go first).
    /// Default 1 GiB.
    pub max_bytes: u64,
    /// Event records buffered for publication (while NATS is slow or down); when full,
    /// new records are dropped, counted, and their workers asked to resync.
    /// Default 65,536.
    pub publish_buffer: usize,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            url: None,
            name: "kvroute".into(),
            replica_id: None,
            token: None,
            user: None,
            password: None,
            creds_file: None,
            secret: None,
            secret_file: None,
            unauthenticated: false,
            max_age_ms: 86_400_000,
            max_bytes: 1 << 30,
            publish_buffer: 65_536,
        }
    }
}

impl ClusterSettings {
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    pub fn validate(&self) -> Result<(), String> {
        let Some(url) = &self.url else {
            return Ok(());
        };
        if url.trim().is_empty() {
            return Err("cluster: the NATS url is empty".into());
        }
        super::names::check_cluster_name(&self.name)?;
        if let Some(id) = &self.replica_id {
            crate::ids::check("cluster replica_id", id)?;
        }
        if self.user.is_some() != self.password.is_some() {
            return Err("cluster: user and password go together".into());
        }
        let methods = [
            self.token.is_some(),
            self.user.is_some(),
            self.creds_file.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return Err("cluster: use one of token, user/password, creds_file".into());
        }
        if self.max_age_ms == 0 || self.max_bytes == 0 || self.publish_buffer == 0 {
            return Err("cluster: max_age_ms, max_bytes and publish_buffer must be > 0".into());
        }
        let keyed = self.secret.is_some() || self.secret_file.is_some();
        if self.secret.is_some() && self.secret_file.is_some() {
            return Err("cluster: use one of secret, secret_file".into());
        }
        if keyed && self.unauthenticated {
            return Err("cluster: a secret and unauthenticated exclude each other".into());
        }
        if !keyed && !self.unauthenticated {
            return Err(
                "cluster: set cluster.secret or cluster.secret_file (the same \
                        on every replica; e.g. `openssl rand -hex 32`), or pass \
                        --cluster-unauthenticated to let any NATS client forge the tier's \
                        state"
                    .into(),
            );
        }
        if let Some(s) = &self.secret {
            check_secret(s)?;
        }
        Ok(())
    }

    /// The tier secret: `secret`, or the first line of `secret_file` (trimmed);
    /// `None` when unauthenticated.
    pub fn resolve_secret(&self) -> Result<Option<String>, String> {
        if let Some(s) = &self.secret {
            return Ok(Some(s.clone()));
        }
        let Some(path) = &self.secret_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cluster: reading secret_file {path}: {e}"))?;
        let s = text.lines().next().unwrap_or("").trim().to_string();
        check_secret(&s).map_err(|e| format!("{e} (secret_file {path})"))?;
        Ok(Some(s))
    }
}

fn check_secret(s: &str) -> Result<(), String> {
    let min = super::auth::MIN_SECRET_LEN;
    if s.len() < min {
        return Err(format!(
            "cluster: the secret must be at least {min} bytes (e.g. `openssl rand -hex 32`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_off_and_valid() {
        let c = ClusterSettings::default();
        assert!(!c.enabled());
        c.validate().unwrap();
        let on = ClusterSettings {
            url: Some("nats://127.0.0.1:4222".into()),
            secret: Some("0123456789abcdef".into()),
            ..Default::default()
        };
        on.validate().unwrap();
        let bad = ClusterSettings {
            user: Some("u".into()),
            ..on.clone()
        };
        assert!(bad.validate().is_err());
        let bad = ClusterSettings {
            token: Some("t".into()),
            creds_file: Some("f".into()),
            ..on.clone()
        };
        assert!(bad.validate().is_err());
        let bad = ClusterSettings {
            name: "a.b".into(),
            ..on
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn a_cluster_needs_a_secret_or_the_explicit_opt_out() {
        let url = ClusterSettings {
            url: Some("nats://127.0.0.1:4222".into()),
            ..Default::default()
        };
        let e = url.validate().unwrap_err();
        assert!(e.contains("secret") && e.contains("unauthenticated"), "{e}");
        let open = ClusterSettings {
            unauthenticated: true,
            ..url.clone()
        };
        open.validate().unwrap();
        assert_eq!(open.resolve_secret(), Ok(None));
        let short = ClusterSettings {
            secret: Some("short".into()),
            ..url.clone()
        };
        assert!(short.validate().unwrap_err().contains("16 bytes"));
        let both = ClusterSettings {
            secret: Some("0123456789abcdef".into()),
            unauthenticated: true,
            ..url.clone()
        };
        assert!(both.validate().is_err());
        let dir = std::env::temp_dir().join(format!("kvroute-secret-{}", std::process::id()));
        std::fs::write(&dir, "  0123456789abcdef0123 \nignored\n").unwrap();
        let file = ClusterSettings {
            secret_file: Some(dir.to_string_lossy().into_owned()),
            ..url.clone()
        };
        file.validate().unwrap();
        assert_eq!(
            file.resolve_secret(),
            Ok(Some("0123456789abcdef0123".to_string()))
        );
        std::fs::write(&dir, "short\n").unwrap();
        assert!(file.resolve_secret().is_err());
        let _ = std::fs::remove_file(&dir);
        let two = ClusterSettings {
            secret: Some("0123456789abcdef".into()),
            ..file
        };
        assert!(two.validate().is_err());
    }
}
