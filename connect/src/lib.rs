//! How sluice reaches its servers, shared by the consumer, the gateway and
//! the `sluice` CLI so all take the same flags: NATS with any of its auth
//! methods (user/password, token, NKey seed, `.creds` file) and TLS with a
//! custom CA or client certificate; S3 through the standard AWS chain; an
//! OpenTelemetry collector over OTLP/HTTP (`otlp`). `DeploymentArgs` and
//! `LogArgs` (`deployment.rs`) gather them into the flags all three take;
//! `models.rs` reads the deployed models `sluice init` recorded,
//! `consumers.rs` the consumers that serve them now; `lookup.rs` finds what
//! `sluice init` made at start-up, waiting out a cluster's election.

pub mod consumers;
pub mod deployment;
pub mod lookup;
pub mod models;
pub mod otlp;

pub use deployment::{ConfigError, DeploymentArgs, LogArgs, LogFormat};

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_schemas::Secret;

/// NATS authentication and TLS. At most one auth method; none is the
/// default (a server without auth). Secrets are never printed: their env
/// values are hidden from `--help` and their Debug form is redacted.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NatsAuth {
    /// User name (with --nats-password).
    #[arg(long, global = true, env = "NATS_USER")]
    pub nats_user: Option<String>,
    /// Password (with --nats-user).
    #[arg(long, global = true, env = "NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<Secret>,
    /// Authentication token.
    #[arg(long, global = true, env = "NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<Secret>,
    /// File holding an NKey user seed (SU...).
    #[arg(long, global = true, env = "NATS_NKEY_SEED_FILE")]
    pub nats_nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file (user JWT and seed, decentralized auth).
    #[arg(long, global = true, env = "NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// PEM file of the CA(s) that signed the server's certificate; implies TLS.
    #[arg(long, global = true, env = "NATS_CA")]
    pub nats_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --nats-key).
    #[arg(long, global = true, env = "NATS_CERT")]
    pub nats_cert: Option<PathBuf>,
    /// PEM private key of --nats-cert.
    #[arg(long, global = true, env = "NATS_KEY")]
    pub nats_key: Option<PathBuf>,
    /// Refuse to connect without TLS (also implied by --nats-ca, --nats-cert
    /// and tls:// URLs).
    #[arg(long, global = true, env = "NATS_TLS")]
    pub nats_tls: bool,
    /// The subject prefix of this client's reply inboxes (default
    /// `_INBOX`): a role whose permissions let it subscribe only to its own
    /// prefix (`_INBOX_gateway.>` in deploy/nats/permissions.conf) cannot
    /// read another client's replies.
    #[arg(long, global = true, env = "NATS_INBOX_PREFIX")]
    pub nats_inbox_prefix: Option<String>,
}

impl NatsAuth {
    /// Checks the combination before anything connects; the error names the flags.
    pub fn validate(&self) -> Result<()> {
        let methods = [
            self.nats_user.is_some() || self.nats_password.is_some(),
            self.nats_token.is_some(),
            self.nats_nkey_seed_file.is_some(),
            self.nats_creds.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            bail!(
                "give one NATS auth method: --nats-user/--nats-password, --nats-token, \
                 --nats-nkey-seed-file or --nats-creds"
            );
        }
        if self.nats_user.is_some() != self.nats_password.is_some() {
            bail!("--nats-user and --nats-password go together");
        }
        if self.nats_cert.is_some() != self.nats_key.is_some() {
            bail!("--nats-cert and --nats-key go together");
        }
        if let Some(prefix) = &self.nats_inbox_prefix
            && !is_inbox_prefix(prefix)
        {
            bail!(
                "--nats-inbox-prefix {prefix:?} must be a subject of plain tokens (letters, digits, '_', '-', '.' between tokens; no wildcards)"
            );
        }
        for (flag, path) in [
            ("--nats-nkey-seed-file", &self.nats_nkey_seed_file),
            ("--nats-creds", &self.nats_creds),
            ("--nats-ca", &self.nats_ca),
            ("--nats-cert", &self.nats_cert),
            ("--nats-key", &self.nats_key),
        ] {
            if let Some(p) = path
                && !p.is_file()
            {
                bail!("{flag} {}: no such file", p.display());
            }
        }
        Ok(())
    }

    /// Connect options for a client named `name`.
    pub async fn options(&self, name: &str) -> Result<async_nats::ConnectOptions> {
        self.validate()?;
        let mut o = match (
            &self.nats_user,
            &self.nats_password,
            &self.nats_token,
            &self.nats_nkey_seed_file,
            &self.nats_creds,
        ) {
            (Some(user), Some(pass), ..) => async_nats::ConnectOptions::with_user_and_password(
                user.clone(),
                pass.expose().to_string(),
            ),
            (_, _, Some(token), ..) => {
                async_nats::ConnectOptions::with_token(token.expose().to_string())
            }
            (_, _, _, Some(seed_file), _) => {
                let seed = std::fs::read_to_string(seed_file).with_context(|| {
                    format!("cannot read --nats-nkey-seed-file {}", seed_file.display())
                })?;
                async_nats::ConnectOptions::with_nkey(seed.trim().to_string())
            }
            (_, _, _, _, Some(creds)) => async_nats::ConnectOptions::with_credentials_file(creds)
                .await
                .with_context(|| format!("cannot read --nats-creds {}", creds.display()))?,
            _ => async_nats::ConnectOptions::new(),
        };
        o = o.name(name);
        if let Some(prefix) = &self.nats_inbox_prefix {
            o = o.custom_inbox_prefix(prefix.clone());
        }
        if let Some(ca) = &self.nats_ca {
            o = o.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&self.nats_cert, &self.nats_key) {
            o = o
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        if self.nats_tls {
            o = o.require_tls(true);
        }
        // The server reports a denied publish or subscribe only as an event
        // (the request itself just times out): say so where people look.
        o = o.event_callback(|event| async move {
            match event {
                async_nats::Event::ServerError(e) => {
                    tracing::warn!(error = %e, "the NATS server refused an operation (check this user's permissions)");
                }
                async_nats::Event::Disconnected => tracing::warn!("disconnected from NATS; reconnecting"),
                async_nats::Event::Connected => tracing::debug!("connected to NATS"),
                other => tracing::debug!(event = %other, "NATS"),
            }
        });
        Ok(o)
    }
}

/// Connects to `url` (comma-separated for a cluster) within `timeout`.
/// `retry` keeps trying while the server is not up yet (for services that
/// start alongside it); without it, a refused connection fails at once.
/// Either way, a refused login or a failed TLS handshake fails at once: no
/// retry can fix those.
/// Whether `prefix` can begin inbox subjects: dot-separated tokens of
/// letters, digits, `_` and `-`.
fn is_inbox_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.split('.').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

pub async fn connect_nats(
    url: &str,
    auth: &NatsAuth,
    name: &str,
    retry: bool,
    timeout: Duration,
) -> Result<async_nats::Client> {
    let servers: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if servers.is_empty() {
        bail!("no NATS server URL given (--nats-url / NATS_URL)");
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let too_slow = || {
        anyhow::anyhow!(
            "cannot reach NATS at {url} within {} s (--nats-url / NATS_URL)",
            timeout.as_secs()
        )
    };
    let failed = |e: async_nats::ConnectError| {
        anyhow::anyhow!("cannot connect to NATS at {url}: {e}{}", auth_hint(&e))
    };
    let first = tokio::time::timeout_at(
        deadline,
        auth.options(name).await?.connect(servers.as_slice()),
    )
    .await
    .map_err(|_| too_slow())?;
    match first {
        Ok(client) => Ok(client),
        Err(e) if retry && refusal(&e) == Refusal::Other => {
            let options = auth.options(name).await?.retry_on_initial_connect();
            tokio::time::timeout_at(deadline, options.connect(servers.as_slice()))
                .await
                .map_err(|_| too_slow())?
                .map_err(failed)
        }
        Err(e) => Err(failed(e)),
    }
}

/// What went wrong, as far as the user can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The server refused the login.
    Auth,
    /// The TLS handshake failed (an untrusted or missing certificate).
    Tls,
    /// Anything else (down, unreachable): worth retrying.
    Other,
}

fn refusal(e: &async_nats::ConnectError) -> Refusal {
    use async_nats::ConnectErrorKind as Kind;
    // rustls' handshake errors arrive as I/O errors: read the message too.
    let text = e.to_string().to_lowercase();
    match e.kind() {
        Kind::Authentication | Kind::AuthorizationViolation => Refusal::Auth,
        Kind::Tls => Refusal::Tls,
        _ if text.contains("authorization") || text.contains("authentication") => Refusal::Auth,
        _ if ["certificate", "tls", "handshake"]
            .iter()
            .any(|w| text.contains(w)) =>
        {
            Refusal::Tls
        }
        _ => Refusal::Other,
    }
}

/// A hint for the errors users most often cause.
fn auth_hint(e: &async_nats::ConnectError) -> &'static str {
    match refusal(e) {
        Refusal::Auth => {
            " (check --nats-user/--nats-password, --nats-token, --nats-nkey-seed-file or --nats-creds)"
        }
        Refusal::Tls => {
            " (check --nats-ca, --nats-cert/--nats-key, and that the server speaks TLS)"
        }
        Refusal::Other => "",
    }
}

/// Where S3 is and how to sign for it (part of `DeploymentArgs`).
#[derive(Debug, Clone, clap::Args)]
pub struct S3Args {
    /// S3 endpoint URL (SeaweedFS, MinIO, ...). Unset: AWS's default endpoint for the region.
    #[arg(long, global = true, env = "AWS_ENDPOINT_URL")]
    pub s3_endpoint: Option<String>,
    #[arg(long, global = true, env = "AWS_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    /// S3 access key id. Unset: the standard AWS chain (env, profile,
    /// instance or IRSA role).
    #[arg(long, global = true, env = "AWS_ACCESS_KEY_ID")]
    pub s3_access_key_id: Option<String>,
    /// S3 secret key, with --s3-access-key-id.
    #[arg(
        long,
        global = true,
        env = "AWS_SECRET_ACCESS_KEY",
        hide_env_values = true
    )]
    pub s3_secret_access_key: Option<Secret>,
}

impl Default for S3Args {
    fn default() -> Self {
        S3Args {
            s3_endpoint: None,
            s3_region: "us-east-1".into(),
            s3_access_key_id: None,
            s3_secret_access_key: None,
        }
    }
}

impl S3Args {
    /// Both keys or neither: the error says how to fix it.
    pub fn check(&self) -> std::result::Result<(), &'static str> {
        if self.s3_access_key_id.is_some() != self.s3_secret_access_key.is_some() {
            return Err(
                "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (--s3-access-key-id, --s3-secret-access-key) or neither (to use the AWS chain)",
            );
        }
        Ok(())
    }

    pub async fn client(&self) -> aws_sdk_s3::Client {
        let credentials = self
            .s3_access_key_id
            .as_deref()
            .zip(self.s3_secret_access_key.as_ref());
        s3_client(self.s3_endpoint.as_deref(), &self.s3_region, credentials).await
    }
}

/// An S3 client from the standard AWS chain (env, profile, instance or IRSA
/// role), or explicit credentials, plus an optional endpoint (path-style,
/// for SeaweedFS, MinIO and the like).
pub async fn s3_client(
    endpoint: Option<&str>,
    region: &str,
    credentials: Option<(&str, &Secret)>,
) -> aws_sdk_s3::Client {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()));
    if let Some((id, secret)) = credentials {
        loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
            id,
            secret.expose(),
            None,
            None,
            "sluice-config",
        ));
    }
    let shared = loader.load().await;
    let mut builder = aws_sdk_s3::config::Builder::from(&shared);
    if let Some(endpoint) = endpoint {
        builder = builder.endpoint_url(endpoint).force_path_style(true);
    }
    aws_sdk_s3::Client::from_conf(builder.build())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn auth_combinations_are_checked_naming_the_flags() {
        let two = NatsAuth {
            nats_token: Some(Secret::new("t")),
            nats_user: Some("u".into()),
            nats_password: Some(Secret::new("p")),
            ..NatsAuth::default()
        };
        assert!(
            two.validate()
                .unwrap_err()
                .to_string()
                .contains("one NATS auth method")
        );
        let half = NatsAuth {
            nats_user: Some("u".into()),
            ..NatsAuth::default()
        };
        assert!(
            half.validate()
                .unwrap_err()
                .to_string()
                .contains("--nats-password")
        );
        let missing = NatsAuth {
            nats_ca: Some("/no/such/ca.pem".into()),
            ..NatsAuth::default()
        };
        assert!(
            missing
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--nats-ca /no/such/ca.pem: no such file")
        );
        assert!(NatsAuth::default().validate().is_ok());
    }

    /// An inbox prefix is plain tokens: a wildcard or an empty token would
    /// make replies land where the permissions do not expect them.
    #[test]
    fn an_inbox_prefix_is_plain_subject_tokens() {
        for (prefix, ok) in [
            ("_INBOX_gateway", true),
            ("_INBOX.team-a", true),
            ("_INBOX.>", false),
            ("_INBOX.*", false),
            ("a..b", false),
            ("", false),
            ("has space", false),
        ] {
            let auth = NatsAuth {
                nats_inbox_prefix: Some(prefix.into()),
                ..NatsAuth::default()
            };
            assert_eq!(auth.validate().is_ok(), ok, "{prefix:?}");
        }
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let auth = NatsAuth {
            nats_user: Some("u".into()),
            nats_password: Some(Secret::new("hunter2")),
            ..NatsAuth::default()
        };
        assert!(!format!("{auth:?}").contains("hunter2"));
    }
}
