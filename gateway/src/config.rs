//! Every knob of the gateway, its flag and env var, and its checks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use sluice_schemas::{Secret, Task, Topology};

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "sluice-gateway",
    version,
    about = "OpenAI-compatible Files and Batches APIs over sluice's job queue"
)]
pub struct Config {
    /// Address the HTTP API listens on.
    #[arg(long, env = "SLUICE_GATEWAY_ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// NATS, its auth, the namespace (the consumers'), S3: the flags every
    /// sluice binary takes.
    #[command(flatten)]
    pub deployment: sluice_connect::DeploymentArgs,
    /// Bucket for uploaded files, batch outputs and the chunks' inputs (the
    /// consumers' output bucket, so their outputs can be read back).
    #[arg(long, env = "SLUICE_GATEWAY_BUCKET", default_value = "sluice")]
    pub bucket: String,
    /// Key prefix of everything the gateway writes.
    #[arg(long, env = "SLUICE_GATEWAY_PREFIX", default_value = "gateway/")]
    pub prefix: String,

    /// File of API keys: one `TENANT KEY` pair per line (`#` comments).
    #[arg(long, env = "SLUICE_GATEWAY_KEYS_FILE")]
    pub keys_file: Option<PathBuf>,
    /// API keys inline: `TENANT:KEY` pairs, comma-separated.
    #[arg(long, env = "SLUICE_GATEWAY_KEYS", hide_env_values = true)]
    pub keys: Option<Secret>,

    /// Models the embed consumers serve (a batch line naming another fails).
    #[arg(long, env = "SLUICE_EMBED_MODELS", value_delimiter = ',', default_value = Task::Embed.default_model())]
    pub embed_models: Vec<String>,
    /// Models the generate consumers serve.
    #[arg(long, env = "SLUICE_GENERATE_MODELS", value_delimiter = ',', default_value = Task::Generate.default_model())]
    pub generate_models: Vec<String>,
    /// Models the rerank consumers serve (default none: no reranker ships
    /// with sluice; name yours, or list it in `sluice init`'s `[[models]]`).
    #[arg(long, env = "SLUICE_RERANK_MODELS", value_delimiter = ',')]
    pub rerank_models: Vec<String>,
    /// Models the classify consumers serve (default none, as for rerank).
    #[arg(long, env = "SLUICE_CLASSIFY_MODELS", value_delimiter = ',')]
    pub classify_models: Vec<String>,
    /// Models the transcribe consumers serve (default whisper-tiny-en,
    /// the one `scripts/setup` installs).
    #[arg(
        long,
        env = "SLUICE_TRANSCRIBE_MODELS",
        value_delimiter = ',',
        default_value = Task::Transcribe.default_model()
    )]
    pub transcribe_models: Vec<String>,

    /// Largest file accepted by `POST /v1/files` (OpenAI's: 200 MB).
    #[arg(long, env = "SLUICE_MAX_FILE_BYTES", default_value_t = 200_000_000)]
    pub max_file_bytes: u64,
    /// Most bytes of uploaded files one tenant may hold at once (files not
    /// deleted or expired; batch output files do not count); 0: no limit.
    /// An upload past it is refused 413 `storage_quota_exceeded`.
    #[arg(
        long,
        env = "SLUICE_MAX_TENANT_FILE_BYTES",
        default_value_t = 100_000_000_000
    )]
    pub max_tenant_file_bytes: u64,
    /// Most requests (lines) in one batch file (OpenAI's: 50,000).
    #[arg(long, env = "SLUICE_MAX_BATCH_LINES", default_value_t = 50_000)]
    pub max_batch_lines: u64,
    /// Largest request line; a longer one fails alone (`request_too_large`).
    #[arg(long, env = "SLUICE_MAX_LINE_BYTES", default_value_t = 1_000_000)]
    pub max_line_bytes: usize,
    /// Most lines in one chunk job.
    #[arg(long, env = "SLUICE_CHUNK_LINES", default_value_t = 200)]
    pub chunk_lines: usize,
    /// Most embedding texts in one chunk job (at most the embed consumers'
    /// --max-items-per-job).
    #[arg(long, env = "SLUICE_CHUNK_TEXTS", default_value_t = 2_000)]
    pub chunk_texts: usize,
    /// Most prompts in one chunk job (at most the generate consumers'
    /// --max-items-per-job, 64 by default).
    #[arg(long, env = "SLUICE_CHUNK_PROMPTS", default_value_t = 32)]
    pub chunk_prompts: usize,
    /// How often the batch driver looks at unfinished batches, in milliseconds.
    #[arg(long, env = "SLUICE_DRIVER_INTERVAL_MS", default_value_t = 500)]
    pub driver_interval_ms: u64,
    /// How long a driver's claim on a batch (validating or finalizing) lasts
    /// without renewal before another gateway may take the batch over.
    #[arg(long, env = "SLUICE_LEASE_SECS", default_value_t = 30)]
    pub lease_secs: u64,
    /// Days an uploaded batch file, or a batch's output or error file,
    /// lives when it does not say (`expires_after`, `output_expires_after`),
    /// and days a batch's record is kept after the batch ended. 0: kept
    /// until deleted.
    #[arg(long, env = "SLUICE_RETENTION_DAYS", default_value_t = 30)]
    pub retention_days: u64,
    /// How often the sweeper removes expired files and old batch records.
    #[arg(long, env = "SLUICE_SWEEP_INTERVAL_SECS", default_value_t = 60)]
    pub sweep_interval_secs: u64,
    /// How long after its expiry a file's bytes are removed (it answers 404
    /// from its expiry): covers a batch created from it just before.
    #[arg(long, env = "SLUICE_EXPIRY_GRACE_SECS", default_value_t = 300)]
    pub expiry_grace_secs: u64,
    /// Where the consumers write job outputs under `--bucket` (their
    /// `--output-prefix`): the gateway reads and deletes a job's output only
    /// at `<prefix><job id>.`, whatever its status record or result says.
    #[arg(long, env = "SLUICE_OUTPUT_PREFIX", default_value = "outputs/")]
    pub output_prefix: String,
    /// Longest lifetime of the presigned URLs of chunk inputs, in seconds;
    /// a URL lives no longer than its job can run (the batch's window end,
    /// plus 5 minutes).
    #[arg(long, env = "SLUICE_PRESIGN_SECS", default_value_t = 7 * 24 * 3600)]
    pub presign_secs: u64,

    /// Online requests (`/v1/embeddings`, `/v1/chat/completions`,
    /// `/v1/completions`): how long one may wait in the queue, in seconds,
    /// when it does not say (header `Sluice-Deadline-Secs`). Past it the
    /// request is answered 504 and its job cancelled.
    #[arg(long, env = "SLUICE_ONLINE_DEADLINE_SECS", default_value_t = 60)]
    pub online_deadline_secs: u64,
    /// How long past its deadline an online request waits for a job that
    /// started just before it, in seconds.
    #[arg(long, env = "SLUICE_ONLINE_GRACE_SECS", default_value_t = 30)]
    pub online_grace_secs: u64,
    /// Online transcriptions (`/v1/audio/transcriptions`, `translations`):
    /// how long past its deadline a request waits for a job that started by
    /// it, in seconds (a recording's time to transcribe grows with its
    /// length, which the gateway does not know; the default is the OpenAI
    /// SDKs' own request timeout). Past it the job is cancelled and the
    /// request answered 504.
    #[arg(long, env = "SLUICE_ONLINE_TRANSCRIBE_SECS", default_value_t = 600)]
    pub online_transcribe_secs: u64,
    /// Online requests: refuse a request whose job has not started after
    /// this many seconds in the queue with 429 and `Retry-After` (its job
    /// cancelled, never run), instead of letting it wait out its deadline.
    /// Off by default: the queue absorbs bursts.
    #[arg(long, env = "SLUICE_MAX_QUEUE_WAIT_SECS")]
    pub max_queue_wait_secs: Option<f64>,
    /// Streamed online requests: the longest a started stream waits for its
    /// next message before it ends with an error event (a consumer that died
    /// mid-job is replaced by a redelivery, which the stream follows, after
    /// the consumer's ack wait).
    #[arg(long, env = "SLUICE_ONLINE_STREAM_IDLE_SECS", default_value_t = 120)]
    pub online_stream_idle_secs: u64,

    /// Connections served at once; one more is answered 503 with
    /// `Retry-After` and closed.
    #[arg(long, env = "SLUICE_GATEWAY_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// How long a request's headers may take to arrive, in seconds, and how
    /// long a kept-alive connection may wait for its next request (longer
    /// than the usual client pools keep an idle connection, so a client
    /// rarely sends on a connection the gateway is closing).
    #[arg(long, env = "SLUICE_GATEWAY_HEADER_TIMEOUT_SECS", default_value_t = 30)]
    pub header_timeout_secs: u64,
    /// A request body (an upload included) that sends no bytes for this
    /// many seconds is answered 408 (an upload's parts are removed).
    #[arg(long, env = "SLUICE_GATEWAY_BODY_IDLE_SECS", default_value_t = 30)]
    pub body_idle_secs: u64,

    /// Online requests (`/v1/embeddings`, `/v1/chat/completions`, ...) this
    /// gateway answers at once, streams included; one more is answered 503
    /// `too_many_requests_in_flight` with `Retry-After`, before any job is
    /// published.
    #[arg(long, env = "SLUICE_MAX_ONLINE_REQUESTS", default_value_t = 1024)]
    pub max_online_requests: usize,
    /// Requests a second each tenant may send (all its keys together), on
    /// average; past it a request is answered 429 `rate_limit_exceeded`
    /// with `Retry-After`. 0: no limit.
    #[arg(long, env = "SLUICE_RATE_LIMIT_RPS", default_value_t = 200.0)]
    pub rate_limit_rps: f64,
    /// Requests a tenant may send at once after a quiet spell (the rate's
    /// bucket size).
    #[arg(long, env = "SLUICE_RATE_LIMIT_BURST", default_value_t = 400)]
    pub rate_limit_burst: u32,
    /// Model tokens a minute each tenant's online requests may use (prompt
    /// and completion, as each answer reports them; all its keys
    /// together), as many at once after a quiet minute. A request is
    /// admitted while its tenant has not used more; past it, it is
    /// answered 429 `rate_limit_exceeded` (type `tokens`) with
    /// `Retry-After`. Batches do not count. 0: no limit.
    #[arg(
        long,
        env = "SLUICE_TOKEN_RATE_LIMIT_TPM",
        default_value_t = 10_000_000
    )]
    pub token_rate_limit_tpm: u64,

    #[command(flatten)]
    pub otlp: sluice_connect::otlp::OtlpArgs,

    #[command(flatten)]
    pub log: sluice_connect::LogArgs,
}

impl Config {
    pub fn topology(&self) -> Topology {
        self.deployment.topology()
    }

    pub fn driver_interval(&self) -> Duration {
        Duration::from_millis(self.driver_interval_ms)
    }

    /// The models `task`'s consumers serve by the flags (`--embed-models`,
    /// `--generate-models`, `--rerank-models`, `--classify-models`,
    /// `--transcribe-models`): what
    /// the gateway routes when `sluice init` deployed none of the task's.
    pub fn models_of(&self, task: Task) -> &[String] {
        match task {
            Task::Embed => &self.embed_models,
            Task::Generate => &self.generate_models,
            Task::Rerank => &self.rerank_models,
            Task::Classify => &self.classify_models,
            Task::Transcribe => &self.transcribe_models,
        }
    }

    /// The HTTP server's bounds.
    pub fn bounds(&self) -> crate::bounds::Bounds {
        crate::bounds::Bounds {
            max_connections: self.max_connections,
            header_timeout: Duration::from_secs(self.header_timeout_secs),
            body_idle: Duration::from_secs(self.body_idle_secs),
        }
    }

    /// Checks the knobs together; the error names the knob.
    pub fn validate(&self) -> Result<()> {
        self.deployment.validate()?;
        if self.chunk_lines == 0 || self.chunk_texts == 0 || self.chunk_prompts == 0 {
            bail!("--chunk-lines, --chunk-texts and --chunk-prompts must be at least 1");
        }
        if self.sweep_interval_secs == 0 {
            bail!("--sweep-interval-secs must be at least 1");
        }
        if self.online_deadline_secs == 0 {
            bail!("--online-deadline-secs must be at least 1");
        }
        if self.online_stream_idle_secs == 0 {
            bail!("--online-stream-idle-secs must be at least 1");
        }
        if !(self.rate_limit_rps.is_finite() && self.rate_limit_rps >= 0.0) {
            bail!("--rate-limit-rps must be 0 (no limit) or more");
        }
        if self.rate_limit_burst == 0 {
            bail!("--rate-limit-burst must be at least 1");
        }
        if self.max_online_requests == 0 {
            bail!("--max-online-requests must be at least 1");
        }
        if self.max_connections == 0 {
            bail!("--max-connections must be at least 1");
        }
        if self.header_timeout_secs == 0 || self.body_idle_secs == 0 {
            bail!("--header-timeout-secs and --body-idle-secs must be at least 1");
        }
        if let Some(secs) = self.max_queue_wait_secs
            && !(secs > 0.0 && secs <= 86_400.0)
        {
            bail!(
                "--max-queue-wait-secs must be more than 0 and at most 86400 seconds, not {secs}"
            );
        }
        if let Some(endpoint) = self.otlp.bad_endpoint() {
            bail!(
                "invalid config: {} = {endpoint}: {}",
                sluice_connect::otlp::OtlpArgs::ENDPOINT_KEY,
                sluice_connect::otlp::OtlpArgs::ENDPOINT_FIX
            );
        }
        if self
            .embed_models
            .iter()
            .chain(&self.generate_models)
            .any(|m| m.is_empty())
        {
            bail!("--embed-models and --generate-models must not name an empty model");
        }
        Ok(())
    }
}
