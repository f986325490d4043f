//! The command line: every command and flag (clap derives `--help` from
//! these; `docs/cli.md` is that help).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use sluice_producer::batch::GatewayClient;
use sluice_schemas::{Priority, Task};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Submit inference jobs to sluice and follow them.",
    after_help = "Exit codes: 0 success; 1 a job failed or got no answer in time; \
2 bad usage, bad input, or NATS/S3 unreachable; 3 no such job or batch, or not cancelled \
(already finished).\n\nS3 credentials: --s3-access-key-id/--s3-secret-access-key, else the \
standard AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, instance or IRSA role)."
)]
pub(crate) struct Cli {
    /// NATS, its auth, the namespace, S3: the flags every sluice binary takes.
    #[command(flatten)]
    pub(crate) deployment: sluice_connect::DeploymentArgs,
    /// Bucket for inputs and outputs.
    #[arg(long, global = true, env = "SLUICE_BUCKET", default_value = "sluice")]
    pub(crate) bucket: String,
    /// Longest life of a presigned input URL, in seconds (a job with a
    /// deadline gets one that ends a minute after it).
    #[arg(long, global = true, env = "SLUICE_PRESIGN_SECS", default_value_t = 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..=7 * 24 * 3600))]
    pub(crate) presign_secs: u64,
    /// Print JSON (one object per line) for scripts instead of text for people.
    #[arg(long, global = true, env = "SLUICE_JSON")]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) log: sluice_connect::LogArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Create or update the job stream, consumer, dead-letter stream, status bucket and S3 bucket.
    /// Running it again changes only what differs from the settings.
    Init {
        /// Settings file (TOML; see deploy/sluice.toml for every key and its default).
        /// Without it, the built-in defaults, which deploy/sluice.toml spells out.
        #[arg(long, env = "SLUICE_SETTINGS")]
        settings: Option<PathBuf>,
    },
    /// Submit jobs: one job per JSONL file (of texts, or of prompts with --task
    /// generate), per .jsonl file in a directory, or from stdin ("-"), or over
    /// already-presigned URLs (--url).
    Submit {
        /// The task: embed (a JSON string or {"text": ...} per line), generate
        /// (a JSON string, {"prompt": ...} or {"messages": [...]} per line),
        /// rerank ({"query": ..., "document": ...} per line), classify (a
        /// JSON string or {"text": ...} per line) or transcribe (audio files:
        /// WAV, FLAC, MP3, Ogg Vorbis, M4A; one job each).
        #[arg(long, env = "SLUICE_TASK", default_value = "embed", value_parser = parse_task)]
        task: Task,
        /// JSONL files (audio files for transcribe), directories of .jsonl
        /// files, or "-" for stdin.
        paths: Vec<PathBuf>,
        /// Already-presigned URLs of JSONL inputs, one job each.
        #[arg(long = "url")]
        urls: Vec<String>,
        /// Job id (only with a single input); default: a fresh UUIDv7.
        #[arg(long)]
        id: Option<String>,
        /// The model to ask for: one of the task's `[[models]]` in the
        /// settings `sluice init` ran with (default: the task's first), else
        /// all-minilm-l6-v2 for embed, smollm2-135m-instruct for generate.
        #[arg(long, env = "SLUICE_MODEL")]
        model: Option<String>,
        /// Wait for every job's result (on this process's own inbox, falling
        /// back to the status record for results that were missed, e.g. of a
        /// job submitted again after it finished). Without it, the jobs are
        /// answered on their default subjects (`sluice.results.<job id>`).
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, env = "SLUICE_WAIT_TIMEOUT_SECS", default_value_t = 600)]
        timeout_secs: u64,
        /// With --wait: download S3 outputs into this directory as <job id>.npy
        /// (embed, rerank) or <job id>.jsonl (generate, classify).
        #[arg(long)]
        download: Option<PathBuf>,
        /// W3C trace context to continue (the jobs' spans join that trace);
        /// default: a new trace per job, whose id is printed.
        #[arg(long, env = "TRACEPARENT")]
        traceparent: Option<String>,
        /// Give each job a deadline this many seconds from now: a job still
        /// waiting then is removed from the stream by the server (a
        /// per-message TTL) and reads as `expired`; a consumer never runs it
        /// late.
        #[arg(long, env = "SLUICE_DEADLINE_SECS", value_parser = clap::value_parser!(u64).range(1..))]
        deadline_secs: Option<u64>,
        /// high, normal or low: consumers take higher levels first, and give
        /// each level with a backlog a guaranteed share (8 : 4 : 1 of their
        /// tokens), so low is never starved.
        #[arg(long, env = "SLUICE_PRIORITY", default_value = "normal")]
        priority: Priority,
        /// Publish as this tenant (its own subject): consumers give each
        /// tenant with a backlog an equal share of their token throughput
        /// (or its weight's, `[tenant_weights]` in the settings file).
        /// Default: the plain subjects, tenant `default`.
        #[arg(long, env = "SLUICE_TENANT", value_parser = parse_tenant)]
        tenant: Option<String>,
        /// Carry each input's items in the job message itself instead of
        /// uploading it to S3 (for small inputs: a job must fit the NATS
        /// server's max_payload, 1 MiB by default).
        #[arg(long)]
        inline: bool,
        /// One job per line of each input, carried inline (implies --inline).
        #[arg(long)]
        each_line: bool,
        /// Jobs in flight at once: published and not yet acknowledged by the
        /// stream. A job is reported submitted only after its ack.
        #[arg(long, env = "SLUICE_SUBMIT_WINDOW", default_value_t = sluice_producer::DEFAULT_SUBMIT_WINDOW as u32,
              value_parser = clap::value_parser!(u32).range(1..=65536))]
        window: u32,
        /// generate: print the text as the consumer generates it (one job;
        /// implies --wait). Several prompts print in order, the first as it
        /// comes, each after a `[prompt N]` line; with --json, each stream
        /// message is a line.
        #[arg(long)]
        stream: bool,
        /// embed: the prompt of the model's config_sentence_transformers.json
        /// to put before every text, by name (e5's and bge's "query" /
        /// "passage"); default: the model's default prompt, if it has one.
        /// A name the model lacks fails the job with invalid_parameters.
        #[arg(long, env = "SLUICE_PROMPT_NAME")]
        prompt_name: Option<String>,
        /// classify: keep each text's best N labels, best first (default:
        /// every label).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        top_k: Option<u32>,
        /// transcribe: the spoken language's code (en, fr, ...); default:
        /// detected on a multilingual model, English on an English-only one.
        #[arg(long, env = "SLUICE_LANGUAGE")]
        language: Option<String>,
        /// transcribe: translate the speech into English (a multilingual
        /// model's translate task).
        #[arg(long)]
        translate: bool,
    },
    /// Show a job's status record.
    Status {
        id: String,
        /// The tenant the job was submitted as (`submit --tenant`): its
        /// record is among that tenant's. Default: the plain subjects'.
        #[arg(long, env = "SLUICE_TENANT", value_parser = parse_tenant)]
        tenant: Option<String>,
    },
    /// Live counts: jobs by state, the job stream and consumer, dead letters.
    Watch {
        /// Seconds between readings.
        #[arg(long, default_value_t = 2)]
        interval_secs: u64,
        /// Print one reading and exit.
        #[arg(long)]
        once: bool,
    },
    /// Cancel a job that has not finished: a queued one is answered
    /// `cancelled` when pulled; a running generate job stops before its next
    /// decoding step (nothing is written for it).
    Cancel {
        id: String,
        /// The tenant the job was submitted as (`submit --tenant`).
        #[arg(long, env = "SLUICE_TENANT", value_parser = parse_tenant)]
        tenant: Option<String>,
    },
    /// Browse and replay the dead-letter stream.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// OpenAI batches on a sluice-gateway (its HTTP API, with a tenant's key).
    #[command(subcommand)]
    Batch(BatchCommand),
}

#[derive(Subcommand)]
pub(crate) enum BatchCommand {
    /// Show a batch: status, line counts, output and error files.
    Show {
        id: String,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Make a new batch of only the failed lines of an ended batch (the
    /// custom_ids in its error file), on the same endpoint, and print it.
    RetryFailed {
        id: String,
        /// The new batch's completion window (default: the original's).
        #[arg(long)]
        completion_window: Option<String>,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
}

#[derive(clap::Args)]
pub(crate) struct GatewayArgs {
    /// The gateway's base URL, as given to the OpenAI SDK.
    #[arg(
        long,
        env = "SLUICE_GATEWAY_URL",
        default_value = "http://127.0.0.1:8080/v1"
    )]
    pub(crate) gateway_url: String,
    /// The tenant's API key (default: $OPENAI_API_KEY, as the SDK reads it).
    #[arg(long, env = "SLUICE_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<sluice_schemas::Secret>,
}

impl GatewayArgs {
    pub(crate) fn client(&self) -> Result<GatewayClient> {
        let key = match &self.api_key {
            Some(k) => k.expose().to_string(),
            None => std::env::var("OPENAI_API_KEY").map_err(|_| {
                anyhow::anyhow!(
                    "no API key: pass --api-key, or set SLUICE_API_KEY or OPENAI_API_KEY"
                )
            })?,
        };
        Ok(GatewayClient::new(&self.gateway_url, &key))
    }
}

#[derive(Subcommand)]
pub(crate) enum DlqCommand {
    /// List dead letters (newest last).
    Ls {
        /// Only this error code (e.g. input_unavailable).
        #[arg(long)]
        code: Option<String>,
        /// Only those dead-lettered at or after this RFC 3339 instant.
        #[arg(long)]
        since: Option<String>,
    },
    /// Show one dead letter, with its original job.
    Show { seq: u64 },
    /// Republish dead-lettered jobs to their original subject with a new message id.
    Replay {
        /// DLQ sequences to replay.
        seqs: Vec<u64>,
        /// Replay every dead letter with this error code.
        #[arg(long)]
        code: Option<String>,
        /// Replay every dead letter dead-lettered at or after this RFC 3339 instant.
        #[arg(long)]
        since: Option<String>,
        /// Replay all dead letters.
        #[arg(long)]
        all: bool,
        /// Re-sign URL inputs that name their bucket and key (presigned URLs expire).
        #[arg(long)]
        refresh_urls: bool,
    },
}

/// Refuses an input the consumer would refuse as `input_invalid`, before
/// anything is uploaded (same parser as the consumer's).
pub(crate) fn parse_task(s: &str) -> std::result::Result<Task, String> {
    Task::parse(s).ok_or_else(|| {
        format!(
            "unknown task {s:?}; known tasks: {}",
            Task::ALL.map(Task::as_str).join(", ")
        )
    })
}

/// Uploads what must be uploaded (8 at a time), then publishes every job
/// through [`Producer::submit_pipelined`], printing each as its ack comes in.
/// Returns the ids of the jobs submitted; fails, after reporting those that
/// were stored, at the first job that was not.
pub(crate) fn parse_tenant(s: &str) -> Result<String, String> {
    if sluice_schemas::is_valid_tenant(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a tenant name: 1 to 64 of A-Z a-z 0-9 - _"
        ))
    }
}
