//! API keys: `Authorization: Bearer <key>`, as the OpenAI SDKs send it. Each
//! key names a tenant; a tenant sees only its own files and batches.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use sluice_schemas::Secret;

use crate::api_error::ApiError;
use crate::rate::RequestRate;

/// What the shipped examples put where a key goes: refused as a key, so
/// an example copied as is never serves anyone.
pub const PLACEHOLDER: &str = "change-me";

/// Key digests to tenant names. Keys are kept only as SHA-256 digests, so a
/// lookup compares digests, not the secrets themselves.
#[derive(Clone, Default)]
pub struct Keys {
    tenants: HashMap<[u8; 32], String>,
    /// Each tenant's request rate (none: unlimited).
    rate: Option<Arc<RequestRate>>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} keys)", self.tenants.len())
    }
}

impl Keys {
    /// Limits each tenant's requests to `rate`.
    pub fn with_rate(mut self, rate: Option<RequestRate>) -> Keys {
        self.rate = rate.map(Arc::new);
        self
    }

    /// From a keys file (`TENANT KEY` per line, `#` comments) and/or an
    /// inline list (`TENANT:KEY,...`). At least one key is required.
    pub fn load(file: Option<&Path>, inline: Option<&Secret>) -> Result<Keys> {
        let mut keys = Keys::default();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the keys file {}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let mut parts = line.split_whitespace();
                let (Some(tenant), Some(key), None) = (parts.next(), parts.next(), parts.next())
                else {
                    bail!("{} line {}: expected `TENANT KEY`", path.display(), n + 1);
                };
                keys.add(tenant, key)
                    .with_context(|| format!("{} line {}", path.display(), n + 1))?;
            }
        }
        if let Some(list) = inline {
            for pair in list
                .expose()
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
            {
                let Some((tenant, key)) = pair.split_once(':') else {
                    bail!("SLUICE_GATEWAY_KEYS: expected TENANT:KEY pairs, comma-separated");
                };
                keys.add(tenant.trim(), key.trim())
                    .context("SLUICE_GATEWAY_KEYS")?;
            }
        }
        if keys.tenants.is_empty() {
            bail!(
                "no API keys: give --keys-file (or SLUICE_GATEWAY_KEYS_FILE) or \
                 SLUICE_GATEWAY_KEYS=TENANT:KEY,..."
            );
        }
        Ok(keys)
    }

    fn add(&mut self, tenant: &str, key: &str) -> Result<()> {
        if !valid_tenant(tenant) {
            bail!("tenant {tenant:?}: use 1 to 64 letters, digits, `-` and `_`");
        }
        if key.len() < 8 || key.chars().any(char::is_whitespace) {
            bail!("the key of tenant {tenant} must be 8 or more characters without spaces");
        }
        if key.to_ascii_lowercase().contains(PLACEHOLDER) {
            bail!(
                "the key of tenant {tenant} is a placeholder (it contains `{PLACEHOLDER}`), \
                 which anyone who read the example knows; generate one, e.g. \
                 `openssl rand -hex 32`"
            );
        }
        if self
            .tenants
            .insert(digest(key), tenant.to_string())
            .is_some()
        {
            bail!("a key is given twice");
        }
        Ok(())
    }

    pub fn tenant_of(&self, key: &str) -> Option<&str> {
        self.tenants.get(&digest(key)).map(String::as_str)
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn valid_tenant(t: &str) -> bool {
    (1..=64).contains(&t.len())
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The caller's tenant, from its bearer key; 401 in OpenAI's shape otherwise.
pub struct Tenant(pub String);

impl<S> FromRequestParts<S> for Tenant
where
    S: Send + Sync,
    Arc<Keys>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Tenant, ApiError> {
        let keys = Arc::<Keys>::from_ref(state);
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let Some(key) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
            return Err(ApiError::unauthorized(
                "You didn't provide an API key: send `Authorization: Bearer <key>`.",
            ));
        };
        let Some(tenant) = keys.tenant_of(key.trim()) else {
            return Err(ApiError::unauthorized("Incorrect API key provided."));
        };
        if let Some(rate) = &keys.rate
            && let Err(wait) = rate.admit(tenant, std::time::Instant::now())
        {
            return Err(ApiError::rate_limited(tenant, wait));
        }
        Ok(Tenant(tenant.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_come_from_a_file_and_the_environment_and_map_to_tenants() {
        let dir = std::env::temp_dir().join(format!("sluice-keys-{}", std::process::id()));
        std::fs::write(
            &dir,
            "# team keys\nteam-a sk-aaaaaaaa\n\nteam-b   sk-bbbbbbbb\n",
        )
        .unwrap();
        let keys = Keys::load(Some(&dir), Some(&Secret::new("team-c:sk-cccccccc"))).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(keys.tenant_of("sk-aaaaaaaa"), Some("team-a"));
        assert_eq!(keys.tenant_of("sk-bbbbbbbb"), Some("team-b"));
        assert_eq!(keys.tenant_of("sk-cccccccc"), Some("team-c"));
        assert_eq!(keys.tenant_of("sk-dddddddd"), None);
    }

    #[test]
    fn bad_keys_are_refused_with_the_reason() {
        let err = |s: &str| Keys::load(None, Some(&Secret::new(s))).unwrap_err();
        assert!(format!("{:#}", err("a:short")).contains("8 or more"));
        assert!(format!("{:#}", err("bad tenant:sk-aaaaaaaa")).contains("letters, digits"));
        assert!(format!("{:#}", err("a:sk-aaaaaaaa,b:sk-aaaaaaaa")).contains("twice"));
        assert!(format!("{:#}", err("nocolon")).contains("TENANT:KEY"));
        for placeholder in ["local:sk-local-change-me", "team-a:Change-Me-team-a-key"] {
            assert!(
                format!("{:#}", err(placeholder)).contains("is a placeholder"),
                "{placeholder}"
            );
        }
        assert!(format!("{:#}", Keys::load(None, None).unwrap_err()).contains("no API keys"));
    }
}
