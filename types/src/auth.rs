//! Who may call the API: tenants, scopes, API keys and the [`Caller`] a request runs as.
//!
//! A key is `aq_<id>_<secret>`: the id is public (it names the key in listings and in
//! `agentq keys revoke`), the secret is 256 bits from the OS's random source. Only the
//! SHA-256 of the whole key is stored ([`hash_key`]); a presented key is checked against
//! the stored hash of the row its id names, in constant time ([`verify`]).

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The tenant of sessions created before tenants existed, and of a keyless `agentq dev`.
pub const DEFAULT_TENANT: &str = "default";

/// Longest tenant name (it is stored on every session and shown in listings).
pub const MAX_TENANT: usize = 64;

/// Prefix of every key; tells an agentq key apart from another service's at a glance.
const KEY_PREFIX: &str = "aq_";
/// Random bytes of a key's public id (hex: twice as many characters).
const ID_BYTES: usize = 6;
/// Random bytes of a key's secret.
const SECRET_BYTES: usize = 32;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scope {
    /// Create sessions (one or a batch), post messages, cancel.
    #[serde(rename = "sessions:write")]
    SessionsWrite,
    /// Read sessions: get, list, transcript, events, tree.
    #[serde(rename = "sessions:read")]
    SessionsRead,
    /// Decide on held tool calls.
    #[serde(rename = "approvals:write")]
    ApprovalsWrite,
    /// Manage the tenant's webhook endpoints (`/v1/webhooks`): where its events are
    /// sent, their signing secrets, redrives.
    #[serde(rename = "webhooks")]
    Webhooks,
    /// Everything, for every tenant.
    #[serde(rename = "admin")]
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::SessionsWrite,
        Scope::SessionsRead,
        Scope::ApprovalsWrite,
        Scope::Webhooks,
        Scope::Admin,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::SessionsWrite => "sessions:write",
            Scope::SessionsRead => "sessions:read",
            Scope::ApprovalsWrite => "approvals:write",
            Scope::Webhooks => "webhooks",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == s)
    }

    /// A comma-separated list (`sessions:read,sessions:write`); at least one, no unknown
    /// name. Sorted and without repeats.
    pub fn parse_list(s: &str) -> Result<Vec<Scope>> {
        let mut scopes = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let scope = Scope::parse(part).ok_or_else(|| Error::Invalid {
                field: "scopes".into(),
                message: format!(
                    "unknown scope {part:?} (expected {})",
                    Scope::ALL.map(|s| s.as_str()).join(", ")
                ),
            })?;
            scopes.push(scope);
        }
        if scopes.is_empty() {
            return Err(Error::Invalid {
                field: "scopes".into(),
                message: "name at least one scope".into(),
            });
        }
        scopes.sort_unstable();
        scopes.dedup();
        Ok(scopes)
    }

    /// The stored form of a list: comma-separated names.
    pub fn join(scopes: &[Scope]) -> String {
        scopes
            .iter()
            .map(Scope::as_str)
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who a request runs as: the tenant and scopes of the key it presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    pub scopes: Vec<Scope>,
    /// The key's public id; `None` for the operator's admin key and for a keyless
    /// loopback `agentq dev`.
    pub key_id: Option<String>,
}

impl Caller {
    /// The operator (the `AGENTQ_ADMIN_KEY`): every scope, every tenant.
    pub fn admin() -> Self {
        Caller {
            tenant: DEFAULT_TENANT.to_string(),
            scopes: vec![Scope::Admin],
            key_id: None,
        }
    }

    /// A keyless loopback `agentq dev`: the tenant `default` with every scope but `admin`.
    pub fn local() -> Self {
        Caller {
            tenant: DEFAULT_TENANT.to_string(),
            scopes: vec![
                Scope::SessionsWrite,
                Scope::SessionsRead,
                Scope::ApprovalsWrite,
                Scope::Webhooks,
            ],
            key_id: None,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.scopes.contains(&Scope::Admin)
    }

    /// Whether the caller holds `scope` (`admin` holds every scope).
    pub fn allows(&self, scope: Scope) -> bool {
        self.is_admin() || self.scopes.contains(&scope)
    }

    /// Whether the caller may see a session of `tenant` (`admin` sees every tenant).
    pub fn sees(&self, tenant: &str) -> bool {
        self.is_admin() || self.tenant == tenant
    }

    /// The tenant a listing is limited to: `None` (every tenant) for `admin`.
    pub fn tenant_filter(&self) -> Option<String> {
        (!self.is_admin()).then(|| self.tenant.clone())
    }
}

/// Whether `name` may be a tenant: `[A-Za-z0-9_.-]{1,64}`.
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A stored API key (never the key itself: its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: String,
    pub tenant: String,
    pub scopes: Vec<Scope>,
    pub label: Option<String>,
    /// Hex SHA-256 of the whole key.
    pub secret_hash: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl ApiKey {
    /// Why the key may not be used at `now`, if it may not.
    pub fn unusable(&self, now: DateTime<Utc>) -> Option<&'static str> {
        if self.revoked_at.is_some() {
            Some("the API key was revoked")
        } else if self.expires_at.is_some_and(|t| t <= now) {
            Some("the API key has expired")
        } else {
            None
        }
    }

    pub fn caller(&self) -> Caller {
        Caller {
            tenant: self.tenant.clone(),
            scopes: self.scopes.clone(),
            key_id: Some(self.id.clone()),
        }
    }
}

/// A key to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    pub id: String,
    pub tenant: String,
    pub scopes: Vec<Scope>,
    pub label: Option<String>,
    pub secret_hash: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A fresh key for `tenant`: what to store, and the key to hand out (once).
pub fn generate(
    tenant: &str,
    mut scopes: Vec<Scope>,
    label: Option<String>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<(NewApiKey, String)> {
    if !valid_tenant(tenant) {
        return Err(Error::Invalid {
            field: "tenant".into(),
            message: format!(
                "invalid tenant {tenant:?}: use 1 to {MAX_TENANT} of A-Z a-z 0-9 _ . -"
            ),
        });
    }
    if scopes.is_empty() {
        return Err(Error::Invalid {
            field: "scopes".into(),
            message: "name at least one scope".into(),
        });
    }
    // As the stored list reads back.
    scopes.sort_unstable();
    scopes.dedup();
    let id = hex(&random::<ID_BYTES>()?);
    let secret = hex(&random::<SECRET_BYTES>()?);
    let key = format!("{KEY_PREFIX}{id}_{secret}");
    Ok((
        NewApiKey {
            id,
            tenant: tenant.to_string(),
            scopes,
            label,
            secret_hash: hash_key(&key),
            expires_at,
        },
        key,
    ))
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf)
        .map_err(|e| Error::Config(format!("the OS random source failed: {e}")))?;
    Ok(buf)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Hex SHA-256 of `text`.
pub fn digest(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// Hex SHA-256 of a key: what is stored and compared.
pub fn hash_key(key: &str) -> String {
    digest(key)
}

/// The public id a key names (`aq_<id>_<secret>`), if it has the shape of one.
pub fn key_id(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex_of = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex_of(id, ID_BYTES * 2) && hex_of(secret, SECRET_BYTES * 2)).then_some(id)
}

/// Whether two byte strings are equal, in time that depends only on their lengths: a
/// timing difference must not tell an attacker how much of a hash they guessed.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `key` is the key whose hash is `stored_hash` (constant time).
pub fn matches_hash(key: &str, stored_hash: &str) -> bool {
    constant_time_eq(hash_key(key).as_bytes(), stored_hash.as_bytes())
}

/// Why a presented key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRejected {
    #[error("the API key is not valid")]
    Unknown,
    #[error("{0}")]
    Unusable(&'static str),
}

/// Check `key` against `stored` (the row its id names, if any) at `now`.
pub fn verify(
    key: &str,
    stored: Option<&ApiKey>,
    now: DateTime<Utc>,
) -> std::result::Result<Caller, KeyRejected> {
    let Some(stored) = stored else {
        return Err(KeyRejected::Unknown);
    };
    if !matches_hash(key, &stored.secret_hash) {
        return Err(KeyRejected::Unknown);
    }
    if let Some(why) = stored.unusable(now) {
        return Err(KeyRejected::Unusable(why));
    }
    Ok(stored.caller())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn stored(key: &NewApiKey) -> ApiKey {
        ApiKey {
            id: key.id.clone(),
            tenant: key.tenant.clone(),
            scopes: key.scopes.clone(),
            label: key.label.clone(),
            secret_hash: key.secret_hash.clone(),
            created_at: Utc::now(),
            expires_at: key.expires_at,
            revoked_at: None,
        }
    }

    #[test]
    fn scopes_parse_and_print() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(
            Scope::parse_list("sessions:write, sessions:read,sessions:write").unwrap(),
            vec![Scope::SessionsWrite, Scope::SessionsRead]
        );
        assert!(Scope::parse_list("sessions:delete").is_err());
        assert!(Scope::parse_list(" , ").is_err());
        let all = Scope::join(&Scope::ALL);
        assert_eq!(Scope::parse_list(&all).unwrap(), Scope::ALL.to_vec());
    }

    #[test]
    fn admin_allows_everything_and_every_tenant() {
        let admin = Caller::admin();
        let reader = Caller {
            tenant: "a".into(),
            scopes: vec![Scope::SessionsRead],
            key_id: Some("x".into()),
        };
        for s in Scope::ALL {
            assert!(admin.allows(s));
        }
        assert!(reader.allows(Scope::SessionsRead));
        assert!(!reader.allows(Scope::SessionsWrite));
        assert!(!reader.allows(Scope::Admin));
        assert!(admin.sees("b") && reader.sees("a") && !reader.sees("b"));
        assert_eq!(admin.tenant_filter(), None);
        assert_eq!(reader.tenant_filter().as_deref(), Some("a"));
        assert!(!Caller::local().is_admin());
    }

    #[test]
    fn generated_keys_verify_and_others_do_not() {
        let (new, key) = generate("acme", vec![Scope::SessionsRead], None, None).unwrap();
        assert_eq!(key_id(&key), Some(new.id.as_str()));
        assert!(!new.secret_hash.contains(&key[3..]));
        let row = stored(&new);
        let now = Utc::now();
        assert_eq!(verify(&key, Some(&row), now).unwrap().tenant, "acme");
        // One character of the secret changed: the id still names the row.
        let mut forged = key.clone();
        let last = if forged.ends_with('0') { "1" } else { "0" };
        forged.replace_range(forged.len() - 1.., last);
        assert_eq!(key_id(&forged), Some(new.id.as_str()));
        assert_eq!(verify(&forged, Some(&row), now), Err(KeyRejected::Unknown));
        assert_eq!(verify(&key, None, now), Err(KeyRejected::Unknown));
        let (_, other) = generate("acme", vec![Scope::SessionsRead], None, None).unwrap();
        assert_ne!(key, other);
    }

    #[test]
    fn expired_and_revoked_keys_are_refused() {
        let past = Utc::now() - chrono::Duration::seconds(1);
        let (new, key) = generate("t", vec![Scope::Admin], None, Some(past)).unwrap();
        let row = stored(&new);
        assert!(matches!(
            verify(&key, Some(&row), Utc::now()),
            Err(KeyRejected::Unusable(_))
        ));
        let (new, key) = generate("t", vec![Scope::Admin], None, None).unwrap();
        let mut row = stored(&new);
        row.revoked_at = Some(Utc::now());
        assert!(matches!(
            verify(&key, Some(&row), Utc::now()),
            Err(KeyRejected::Unusable(_))
        ));
    }

    #[test]
    fn key_shapes() {
        assert_eq!(key_id("garbage"), None);
        assert_eq!(key_id("aq_zz_00"), None);
        assert_eq!(
            key_id(&format!("aq_{}_{}", "a".repeat(12), "b".repeat(63))),
            None
        );
        assert!(key_id(&format!("aq_{}_{}", "a".repeat(12), "b".repeat(64))).is_some());
        assert!(generate("bad tenant", vec![Scope::Admin], None, None).is_err());
        assert!(generate(&"x".repeat(65), vec![Scope::Admin], None, None).is_err());
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
