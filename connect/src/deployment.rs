//! The flags that say which deployment a binary belongs to (where its NATS
//! and S3 are, how it logs in, which namespace it uses) and how it logs:
//! declared once here and flattened into the consumer, the gateway and the
//! `sluice` CLI, so the three take the same flags, read the same
//! environment variables and are checked by the same code.

use anyhow::Result;
use sluice_schemas::Topology;

use crate::{NatsAuth, S3Args};

/// A config error: which key, which value, and what to do. Every binary's
/// start-up checks answer with one.
#[derive(Debug)]
pub struct ConfigError {
    /// The knob, as `name (--flag)`.
    pub key: &'static str,
    /// What it was set to; empty where a combination of flags is wrong.
    pub value: String,
    pub fix: String,
}

impl ConfigError {
    pub fn new(key: &'static str, value: impl ToString, fix: impl Into<String>) -> ConfigError {
        ConfigError {
            key,
            value: value.to_string(),
            fix: fix.into(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.value.as_str() {
            "" => write!(f, "invalid config: {}: {}", self.key, self.fix),
            value => write!(f, "invalid config: {} = {value}: {}", self.key, self.fix),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The NATS URL every binary uses when none is given.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// Which deployment: NATS (URL, auth, TLS), the namespace of its names, S3.
/// `global`, so the CLI takes them before or after its verb.
#[derive(Debug, Clone, clap::Args)]
pub struct DeploymentArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(
        long,
        global = true,
        env = "NATS_URL",
        hide_env_values = true,
        default_value = DEFAULT_NATS_URL
    )]
    pub nats_url: String,
    #[command(flatten)]
    pub nats_auth: NatsAuth,
    /// Prefix worked into every stream, consumer, bucket and subject name, so
    /// several deployments can share one NATS server. Empty: the standard names.
    #[arg(long, global = true, env = "SLUICE_NAMESPACE", default_value = "")]
    pub namespace: String,
    #[command(flatten)]
    pub s3: S3Args,
}

impl Default for DeploymentArgs {
    fn default() -> Self {
        DeploymentArgs {
            nats_url: DEFAULT_NATS_URL.into(),
            nats_auth: NatsAuth::default(),
            namespace: String::new(),
            s3: S3Args::default(),
        }
    }
}

impl DeploymentArgs {
    /// Checks the flags together before anything connects; the error names
    /// the flag and says what to do.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.nats_auth
            .validate()
            .map_err(|e| ConfigError::new("nats auth (--nats-*)", "", format!("{e:#}")))?;
        if self.nats_url.split(',').all(|s| s.trim().is_empty()) {
            return Err(ConfigError::new(
                "nats_url (--nats-url)",
                "",
                "give a NATS server URL",
            ));
        }
        if !self.namespace.is_empty() && !sluice_schemas::names::is_valid_job_id(&self.namespace) {
            return Err(ConfigError::new(
                "namespace (--namespace)",
                &self.namespace,
                "use letters, digits, '-' or '_'",
            ));
        }
        if let Err(fix) = self.s3.check() {
            return Err(ConfigError::new(
                "s3_access_key_id / s3_secret_access_key",
                "one of the two",
                fix,
            ));
        }
        Ok(())
    }

    /// The stream, consumer, bucket and subject names of this namespace.
    pub fn topology(&self) -> Topology {
        Topology::for_namespace(&self.namespace)
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event, for people.
    #[default]
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// How a binary logs: to stderr, human lines or JSON, filtered.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log format: `human` lines or `json` (one object per line).
    #[arg(
        long,
        global = true,
        env = "SLUICE_LOG_FORMAT",
        value_enum,
        default_value = "human"
    )]
    pub log_format: LogFormat,
    /// Which events to log, in `RUST_LOG`'s syntax (`info`,
    /// `sluice_consumer=debug,warn`). Unset: the binary's default (`info`
    /// for the servers, `warn` for the CLI).
    #[arg(long, global = true, env = "RUST_LOG")]
    pub log_filter: Option<String>,
}

impl LogArgs {
    /// Installs a server's logger (`default_filter` where no filter is
    /// given). A filter that does not parse is an error naming the flag,
    /// not a silent fall-back.
    pub fn init(&self, default_filter: &str) -> Result<()> {
        self.install(default_filter, false)
    }

    /// Installs the CLI's logger: warnings by default, and human lines
    /// without the time and the module, which a person at a terminal
    /// does not need.
    pub fn init_cli(&self) -> Result<()> {
        self.install("warn", true)
    }

    fn install(&self, default_filter: &str, terse: bool) -> Result<()> {
        use std::io::IsTerminal;
        use tracing_subscriber::EnvFilter;
        let spec = self.log_filter.as_deref().unwrap_or(default_filter);
        let filter = EnvFilter::try_new(spec).map_err(|e| {
            anyhow::anyhow!("invalid config: log_filter (--log-filter, RUST_LOG) = {spec}: {e}")
        })?;
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr);
        // A second init in one process (tests) keeps the first logger.
        let _ = match (self.log_format, terse) {
            (LogFormat::Json, _) => builder.json().try_init(),
            (LogFormat::Human, false) => builder.try_init(),
            (LogFormat::Human, true) => builder.with_target(false).without_time().try_init(),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        deployment: DeploymentArgs,
        #[command(flatten)]
        log: LogArgs,
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn each_bad_combination_is_refused_naming_its_flag() {
        for (args, says) in [
            (&["--namespace=a.b"][..], "--namespace"),
            (&["--nats-url= , "], "--nats-url"),
            (&["--s3-access-key-id=k"], "--s3-secret-access-key"),
            (&["--nats-user=u"], "--nats-password"),
        ] {
            let err = parse(args).deployment.validate().unwrap_err().to_string();
            assert!(err.contains(says), "{args:?}: {err}");
        }
        let good = parse(&["--namespace=team-a_1", "--log-format=json"]);
        assert!(good.deployment.validate().is_ok());
        assert_eq!(good.log.log_format, LogFormat::Json);
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let d = DeploymentArgs::default();
        assert_eq!(
            (d.nats_url.as_str(), d.namespace.as_str()),
            (DEFAULT_NATS_URL, "")
        );
    }

    #[test]
    fn a_log_filter_that_does_not_parse_names_the_flag() {
        let log = LogArgs {
            log_filter: Some("sluice=loud".into()),
            ..LogArgs::default()
        };
        let err = log.init("info").unwrap_err().to_string();
        assert!(err.contains("--log-filter"), "{err}");
    }
}
