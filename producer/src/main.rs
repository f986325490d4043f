//! `sluice`: set up a deployment, submit jobs, follow them.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use sluice_producer::batch::{self, GatewayClient};
use sluice_producer::dlq::Filter;
use sluice_producer::provision::{self, Settings};
use sluice_producer::watch::{Counts, Watcher};
use sluice_producer::{Producer, ProducerConfig, trace_id_of};
use sluice_schemas::{
    ErrorCode, Input, InputFormat, JobResult, JobState, JsonlError, Outcome, Output, Priority,
    S3Output, StatusRecord, Task,
};

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
struct Cli {
    /// NATS, its auth, the namespace, S3: the flags every sluice binary takes.
    #[command(flatten)]
    deployment: sluice_connect::DeploymentArgs,
    /// Bucket for inputs and outputs.
    #[arg(long, global = true, env = "SLUICE_BUCKET", default_value = "sluice")]
    bucket: String,
    /// Print JSON (one object per line) for scripts instead of text for people.
    #[arg(long, global = true, env = "SLUICE_JSON")]
    json: bool,
    #[command(flatten)]
    log: sluice_connect::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
        /// (a JSON string, {"prompt": ...} or {"messages": [...]} per line) or
        /// rerank ({"query": ..., "document": ...} per line).
        #[arg(long, env = "SLUICE_TASK", default_value = "embed", value_parser = parse_task)]
        task: Task,
        /// JSONL files, directories of .jsonl files, or "-" for stdin.
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
        /// Wait for every job's result (on the result subject, falling back to
        /// the status record for results that were missed, e.g. of a job
        /// submitted again after it finished).
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, env = "SLUICE_WAIT_TIMEOUT_SECS", default_value_t = 600)]
        timeout_secs: u64,
        /// With --wait: download S3 outputs into this directory as <job id>.npy
        /// (embed) or <job id>.jsonl (generate).
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
    },
    /// Show a job's status record.
    Status { id: String },
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
    Cancel { id: String },
    /// Browse and replay the dead-letter stream.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// OpenAI batches on a sluice-gateway (its HTTP API, with a tenant's key).
    #[command(subcommand)]
    Batch(BatchCommand),
}

#[derive(Subcommand)]
enum BatchCommand {
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
struct GatewayArgs {
    /// The gateway's base URL, as given to the OpenAI SDK.
    #[arg(
        long,
        env = "SLUICE_GATEWAY_URL",
        default_value = "http://127.0.0.1:8080/v1"
    )]
    gateway_url: String,
    /// The tenant's API key (default: $OPENAI_API_KEY, as the SDK reads it).
    #[arg(long, env = "SLUICE_API_KEY", hide_env_values = true)]
    api_key: Option<sluice_schemas::Secret>,
}

impl GatewayArgs {
    fn client(&self) -> Result<GatewayClient> {
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
enum DlqCommand {
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

async fn batch_command(cmd: BatchCommand, json: bool) -> Result<ExitCode> {
    let answer = match &cmd {
        BatchCommand::Show { id, gateway } => gateway.client()?.batch(id).await,
        BatchCommand::RetryFailed {
            id,
            completion_window,
            gateway,
        } => {
            gateway
                .client()?
                .retry_failed(id, completion_window.as_deref())
                .await
        }
    };
    match answer {
        Ok(b) => {
            if json {
                println!("{b}");
            } else {
                println!("{}", batch::describe(&b));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if e.is_not_found() => {
            eprintln!("sluice: {e}");
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e.into()),
    }
}

fn parse_filter(code: Option<String>, since: Option<String>) -> Result<Filter> {
    let code = match code {
        Some(c) => Some(
            serde_json::from_value::<ErrorCode>(serde_json::Value::String(c.clone())).map_err(
                |_| {
                    anyhow::anyhow!(
                        "unknown error code {c:?}; known: {}",
                        ErrorCode::ALL.map(|c| c.as_str()).join(", ")
                    )
                },
            )?,
        ),
        None => None,
    };
    let since = match since {
        Some(t) => Some(
            time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339)
                .with_context(|| {
                    format!("--since {t:?} is not an RFC 3339 time (e.g. 2026-11-29T17:00:00Z)")
                })?,
        ),
        None => None,
    };
    Ok(Filter {
        code,
        job_id: None,
        since,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Warnings only by default (a refused permission, a lost connection), on stderr.
    if let Err(e) = cli.log.init_cli() {
        eprintln!("sluice: error: {e:#}");
        return ExitCode::from(2);
    }
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let config = ProducerConfig {
        deployment: cli.deployment.clone(),
        bucket: cli.bucket.clone(),
        ..ProducerConfig::default()
    };
    match cli.command {
        Command::Init { settings } => {
            let settings = match settings {
                Some(path) => Settings::load(&path)?,
                None => Settings::default(),
            };
            let p = Producer::connect(&config).await?;
            let changes =
                provision::ensure(&p.js, Some(&p.s3), &config.bucket, &p.topology, &settings)
                    .await?;
            if cli.json {
                for c in &changes {
                    println!("{}", c.to_json());
                }
            } else {
                for c in &changes {
                    println!("{c}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { id } => {
            let p = Producer::connect(&config).await?;
            match p.status(&id).await? {
                Some(record) => {
                    if cli.json {
                        println!("{}", serde_json::to_string(&record)?);
                    } else {
                        println!(
                            "{id}: {} (attempts {}, replays {}, updated {})",
                            record.state.as_str(),
                            record.attempts,
                            record.replays,
                            record
                                .updated_at
                                .format(&time::format_description::well_known::Rfc3339)
                                .unwrap_or_default()
                        );
                        if let Some(o) = &record.output {
                            println!("  output: s3://{}/{} ({} bytes)", o.bucket, o.key, o.bytes);
                        }
                        if let Some(e) = &record.error {
                            println!("  error: {} {}", e.code, e.message);
                        }
                    }
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("sluice: no status for job {id}");
                    Ok(ExitCode::from(3))
                }
            }
        }
        Command::Cancel { id } => {
            let p = Producer::connect(&config).await?;
            let cancelled = p.cancel(&id).await?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"job_id": id, "cancelled": cancelled})
                );
            } else if cancelled {
                println!("{id}: cancelled");
            } else {
                println!("{id}: already finished; not cancelled");
            }
            Ok(if cancelled {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            })
        }
        Command::Watch {
            interval_secs,
            once,
        } => {
            let p = Producer::connect(&config).await?;
            let mut watcher = Watcher::start(&p).await?;
            loop {
                let counts = watcher.read().await?;
                report_counts(cli.json, &counts);
                if once {
                    return Ok(ExitCode::SUCCESS);
                }
                tokio::select! {
                    r = watcher.follow(Duration::from_secs(interval_secs.max(1))) => r?,
                    _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
                }
            }
        }
        Command::Dlq(cmd) => {
            let p = Producer::connect(&config).await?;
            dlq(&p, cmd, cli.json).await
        }
        Command::Batch(cmd) => batch_command(cmd, cli.json).await,
        Command::Submit {
            task,
            paths,
            urls,
            id,
            model,
            wait,
            timeout_secs,
            download,
            traceparent,
            inline,
            each_line,
            window,
            deadline_secs,
            priority,
            tenant,
            stream,
            prompt_name,
        } => {
            if prompt_name.is_some() && task != Task::Embed {
                bail!(
                    "--prompt-name applies to --task embed (a prompt of the model's sentence-transformers files)"
                );
            }
            if stream && task != Task::Generate {
                bail!("--stream applies to --task generate (the {task} task's output comes whole)");
            }
            let inputs = collect_inputs(&paths)?;
            if inputs.is_empty() && urls.is_empty() {
                bail!(
                    "nothing to submit: give JSONL files, directories, \"-\" for stdin, or --url"
                );
            }
            for (name, body) in &inputs {
                check_jsonl(task, name, body)?;
            }
            for url in &urls {
                check_url(url)?;
            }
            if (inline || each_line) && !urls.is_empty() {
                bail!("--inline and --each-line apply to files and stdin, not to --url inputs");
            }
            let sources = job_sources(inputs, urls, inline || each_line, each_line)?;
            if id.is_some() && sources.len() != 1 {
                bail!("--id applies to a single job; {} given", sources.len());
            }
            if stream && sources.len() != 1 {
                bail!(
                    "--stream follows a single job; {} given (one input, without --each-line)",
                    sources.len()
                );
            }
            let wait = wait || stream;
            let id = match (id, stream) {
                (None, true) => Some(uuid::Uuid::now_v7().to_string()),
                (id, _) => id,
            };
            if let Some(tp) = &traceparent
                && !is_traceparent(tp)
            {
                bail!(
                    "--traceparent {tp:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"
                );
            }
            let mut p = Producer::connect(&config).await?;
            // Before any upload: a model nobody deploys is refused here
            // (exit 2, naming the deployed ones), never published.
            let deployed = p.models.models().await?;
            p.config.model = match model {
                Some(model) => model,
                None => deployed
                    .of_task(task.as_str())
                    .next()
                    .map_or(task.default_model(), |m| m.model.as_str())
                    .to_string(),
            };
            deployed.route(task.as_str(), &p.config.model)?;
            let mut results = if wait {
                Some(p.subscribe_results().await?)
            } else {
                None
            };
            let printer = match (&id, stream) {
                (Some(id), true) => Some(StreamPrinter::start(
                    p.subscribe_stream(id).await?,
                    cli.json,
                )),
                _ => None,
            };
            let deadline =
                deadline_secs.map(|s| time::OffsetDateTime::now_utc() + Duration::from_secs(s));
            let ids = submit_sources(
                &p,
                task,
                sources,
                JobOptions {
                    id,
                    traceparent,
                    deadline,
                    priority,
                    tenant,
                    stream,
                    prompt_name,
                },
                window as usize,
                cli.json,
            )
            .await?;
            let Some(results) = results.as_mut() else {
                return Ok(ExitCode::SUCCESS);
            };
            let progress = !cli.json && std::io::stderr().is_terminal() && ids.len() > 1;
            let waited = wait_for(
                &p,
                results,
                &ids,
                Duration::from_secs(timeout_secs),
                progress,
            )
            .await?;
            if let Some(printer) = printer {
                let prompts = ids
                    .first()
                    .and_then(|id| waited.get(id))
                    .and_then(Answer::prompts);
                printer.finish(prompts).await;
            }
            let mut failed = 0;
            for id in &ids {
                match waited.get(id) {
                    Some(answer) => {
                        if !answer.is_ok() {
                            failed += 1;
                        }
                        if let (Some(dir), Some(o)) = (&download, answer.s3_output()) {
                            download_output(&p, dir, id, &o.bucket, &o.key).await?;
                        }
                        answer.report(cli.json);
                    }
                    None => {
                        failed += 1;
                        eprintln!(
                            "sluice: {id}: no result within {timeout_secs} s (see `sluice status {id}`)"
                        );
                    }
                }
            }
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

async fn dlq(p: &Producer, cmd: DlqCommand, json: bool) -> Result<ExitCode> {
    match cmd {
        DlqCommand::Ls { code, since } => {
            let letters = p.dead_letters(&parse_filter(code, since)?).await?;
            for (seq, l) in &letters {
                if json {
                    println!("{}", serde_json::json!({"seq": seq, "dead_letter": l}));
                } else {
                    println!(
                        "{seq:>6}  {}  {:<24} {:<22} attempts {}  {}",
                        l.dead_lettered_at
                            .format(&time::format_description::well_known::Rfc3339)
                            .unwrap_or_default(),
                        l.job_id.as_deref().unwrap_or("-"),
                        l.error.code.as_str(),
                        l.attempts,
                        l.error.message
                    );
                }
            }
            if !json {
                eprintln!("{} dead letter(s)", letters.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Show { seq } => {
            let l = p.dead_letter(seq).await?;
            println!("{}", serde_json::to_string_pretty(&l)?);
            if !json {
                match p.dead_letter_payload(seq, &l).await {
                    Ok(bytes) => {
                        println!("original payload:\n{}", String::from_utf8_lossy(&bytes))
                    }
                    Err(e) => eprintln!("sluice: {e:#}"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Replay {
            seqs,
            code,
            since,
            all,
            refresh_urls,
        } => {
            let selected: Vec<(u64, sluice_schemas::DeadLetter)> = if !seqs.is_empty() {
                let mut v = Vec::new();
                for seq in seqs {
                    v.push((seq, p.dead_letter(seq).await?));
                }
                v
            } else if all || code.is_some() || since.is_some() {
                p.dead_letters(&parse_filter(code, since)?).await?
            } else {
                bail!("say which dead letters to replay: sequences, --code, --since or --all");
            };
            for (seq, letter) in &selected {
                let r = p.replay(*seq, letter, refresh_urls).await?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    println!(
                        "replayed {seq} ({}) to {} as stream sequence {}{}",
                        r.job_id.as_deref().unwrap_or("no job id"),
                        r.subject,
                        r.stream_sequence,
                        if r.refreshed_urls > 0 {
                            format!(", {} URL(s) re-signed", r.refreshed_urls)
                        } else {
                            String::new()
                        }
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Refuses an input the consumer would refuse as `input_invalid`, before
/// anything is uploaded (same parser as the consumer's).
fn parse_task(s: &str) -> std::result::Result<Task, String> {
    Task::parse(s).ok_or_else(|| {
        format!(
            "unknown task {s:?}; known tasks: {}",
            Task::ALL.map(Task::as_str).join(", ")
        )
    })
}

fn check_jsonl(task: Task, name: &str, body: &[u8]) -> Result<()> {
    let mut items = Vec::new();
    match sluice_schemas::parse_jsonl(task, body, &mut items, u64::MAX) {
        Ok(()) if items.is_empty() => match task {
            Task::Embed => {
                bail!("{name}: no items (expected one JSON string or {{\"text\": ...}} per line)")
            }
            Task::Generate => bail!(
                "{name}: no items (expected one JSON string, {{\"prompt\": ...}} or {{\"messages\": [...]}} per line)"
            ),
            Task::Rerank => bail!(
                "{name}: no items (expected one {{\"query\": ..., \"document\": ...}} per line)"
            ),
        },
        Ok(()) => Ok(()),
        Err(JsonlError::Invalid(m)) => bail!("{name}: {m}"),
        Err(JsonlError::TooManyItems(_)) => Ok(()), // no limit asked for here
    }
}

fn check_url(url: &str) -> Result<()> {
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        Ok(u) => bail!(
            "--url {url:?}: only http:// and https:// URLs with a host are accepted (got scheme {:?})",
            u.scheme()
        ),
        Err(e) => bail!("--url {url:?} is not a URL: {e}"),
    }
}

/// Reads every input named on the command line: (display name, bytes).
fn collect_inputs(paths: &[PathBuf]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for path in paths {
        if path == Path::new("-") {
            let mut body = Vec::new();
            std::io::stdin()
                .read_to_end(&mut body)
                .context("reading stdin")?;
            out.push(("stdin".to_string(), body));
        } else if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("cannot list {}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            files.sort();
            for f in files {
                let body =
                    std::fs::read(&f).with_context(|| format!("cannot read {}", f.display()))?;
                out.push((f.display().to_string(), body));
            }
        } else {
            let body =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            out.push((path.display().to_string(), body));
        }
    }
    Ok(out)
}

/// How a waited-for job ended: its result message, or (when that was
/// missed) its final status record.
enum Answer {
    Result(JobResult),
    Status(StatusRecord),
}

impl Answer {
    fn is_ok(&self) -> bool {
        match self {
            Answer::Result(r) => matches!(r.outcome, Outcome::Ok { .. }),
            Answer::Status(s) => s.state == JobState::Done,
        }
    }

    fn s3_output(&self) -> Option<&S3Output> {
        match self {
            Answer::Result(r) => match &r.outcome {
                Outcome::Ok {
                    output: Output::S3(o),
                } => Some(o),
                _ => None,
            },
            Answer::Status(s) => s.output.as_ref(),
        }
    }

    /// The prompts of a generate job that ended well (None otherwise).
    fn prompts(&self) -> Option<usize> {
        if !self.is_ok() {
            return None;
        }
        match self {
            Answer::Result(r) => Some(r.usage.items as usize),
            Answer::Status(s) => s.usage.as_ref().map(|u| u.items as usize),
        }
    }

    fn report(&self, json: bool) {
        match self {
            Answer::Result(r) => report_result(json, r),
            Answer::Status(s) if json => {
                if let Ok(text) = serde_json::to_string(&serde_json::json!({"status_record": s})) {
                    println!("{text}");
                }
            }
            Answer::Status(s) => match (&s.output, &s.error) {
                (Some(o), _) => println!(
                    "{}: done (from the status record) -> s3://{}/{} ({} bytes, shape {:?})",
                    s.job_id, o.bucket, o.key, o.bytes, o.shape
                ),
                (None, Some(e)) => println!(
                    "{}: {} (from the status record): {} {}",
                    s.job_id,
                    s.state.as_str(),
                    e.code,
                    e.message
                ),
                (None, None) => println!(
                    "{}: {} (from the status record; an inline output travels only in the \
                     result message, which this wait did not see)",
                    s.job_id,
                    s.state.as_str()
                ),
            },
        }
    }
}

/// `sluice submit --stream`: prints a job's text as its stream messages
/// come, prompt by prompt in order (the first as it comes, the others
/// buffered until their turn).
struct StreamPrinter {
    task: tokio::task::JoinHandle<()>,
    prompts: tokio::sync::oneshot::Sender<Option<usize>>,
}

impl StreamPrinter {
    fn start(mut chunks: sluice_producer::JobStream, json: bool) -> StreamPrinter {
        let (prompts, mut told) = tokio::sync::oneshot::channel::<Option<usize>>();
        let task = tokio::spawn(async move {
            use std::io::Write;
            let mut texts: Vec<(String, bool)> = Vec::new(); // (buffered text, finished)
            let mut current = 0usize;
            let mut headed = 0usize;
            let mut stdout = std::io::stdout();
            // Once the result is in: the prompts to wait for, and how long.
            let mut until: Option<(usize, tokio::time::Instant)> = None;
            loop {
                if let Some((n, _)) = until
                    && current >= n
                {
                    break;
                }
                let next = async {
                    match until {
                        Some((_, at)) => tokio::time::timeout_at(at, chunks.next_chunk())
                            .await
                            .ok()
                            .flatten(),
                        None => chunks.next_chunk().await,
                    }
                };
                let chunk = tokio::select! {
                    chunk = next => chunk,
                    n = &mut told, if until.is_none() => {
                        let n = n.ok().flatten().unwrap_or(0);
                        until = Some((n, tokio::time::Instant::now() + Duration::from_secs(2)));
                        continue;
                    }
                };
                let Some(chunk) = chunk else { break };
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("sluice: {e:#}");
                        continue;
                    }
                };
                if json
                    && let Ok(line) = serde_json::to_string(&serde_json::json!({"stream": chunk}))
                {
                    println!("{line}");
                }
                let item = chunk.item as usize;
                if texts.len() <= item {
                    texts.resize(item + 1, (String::new(), false));
                }
                texts[item].0.push_str(&chunk.text);
                texts[item].1 |= chunk.is_last();
                // Show the current prompt's text; move on past finished ones.
                // (with --json the lines above are the output)
                while let Some((text, finished)) = texts.get_mut(current) {
                    let text = std::mem::take(text);
                    if !json {
                        if current > 0 && headed < current && (!text.is_empty() || *finished) {
                            let _ = writeln!(stdout, "[prompt {current}]");
                            headed = current;
                        }
                        let _ = write!(stdout, "{text}");
                        let _ = stdout.flush();
                    }
                    if !*finished {
                        break;
                    }
                    if !json {
                        let _ = writeln!(stdout);
                    }
                    current += 1;
                }
            }
        });
        StreamPrinter { task, prompts }
    }

    /// The job ended with `prompts` prompts (None: it failed): prints what
    /// is left, waiting at most 2 s for the stream to catch up.
    async fn finish(self, prompts: Option<usize>) {
        let _ = self.prompts.send(prompts);
        let _ = self.task.await;
    }
}

/// How often pending jobs' status records are checked while waiting.
const STATUS_POLL: Duration = Duration::from_secs(2);
/// Status records checked per poll (round robin over the pending jobs).
const STATUS_POLL_BATCH: usize = 64;
/// A final record must be this old before it stands in for the result: the
/// consumer writes the record just before it publishes the result.
const RESULT_GRACE: Duration = Duration::from_secs(5);

async fn wait_for(
    p: &Producer,
    results: &mut sluice_producer::Results,
    ids: &[String],
    timeout: Duration,
    progress: bool,
) -> Result<BTreeMap<String, Answer>> {
    let mut pending: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut got = BTreeMap::new();
    let mut failed = 0usize;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + STATUS_POLL, STATUS_POLL);
    let mut cursor = 0usize;
    while !pending.is_empty() {
        let answer = tokio::select! {
            r = results.next_result() => match r {
                Ok(r) => Some(Answer::Result(r)),
                Err(e) => {
                    eprintln!("sluice: {e:#}");
                    break;
                }
            },
            _ = poll.tick() => {
                let mut found = None;
                let now = time::OffsetDateTime::now_utc();
                for _ in 0..STATUS_POLL_BATCH.min(pending.len()) {
                    cursor = (cursor + 1) % pending.len();
                    if let Some(record) = p.status(pending[cursor]).await?
                        && record.state.is_final()
                        && now - record.updated_at > RESULT_GRACE
                    {
                        found = Some(Answer::Status(record));
                        break;
                    }
                }
                found
            }
            _ = tokio::time::sleep_until(deadline) => break,
        };
        let Some(answer) = answer else { continue };
        let id = match &answer {
            Answer::Result(r) => r.job_id.clone(),
            Answer::Status(s) => Some(s.job_id.clone()),
        };
        let Some(id) = id else {
            continue; // a message that carried no id (it names none of ours)
        };
        let Some(at) = pending.iter().position(|p| *p == id) else {
            continue; // someone else's job, or answered twice
        };
        pending.swap_remove(at);
        if !answer.is_ok() {
            failed += 1;
        }
        got.insert(id, answer);
        if progress {
            eprint!(
                "\r{} / {} answered, {failed} failed   ",
                got.len(),
                ids.len()
            );
        }
    }
    if progress {
        eprintln!();
    }
    Ok(got)
}

fn report_counts(json: bool, c: &Counts) {
    if json {
        if let Ok(text) = serde_json::to_string(c) {
            println!("{text}");
        }
        return;
    }
    let now = time::OffsetDateTime::now_utc();
    println!(
        "{:02}:{:02}:{:02}  queued {}  running {}  done {}  failed {}  cancelled {}  expired {}  dead-lettered {}  \
         | stream {} jobs ({} bytes): pending {} (high {}, normal {}, low {}), in flight {}, redelivered {}, waiting pulls {}",
        now.hour(),
        now.minute(),
        now.second(),
        c.queued,
        c.running,
        c.done,
        c.failed,
        c.cancelled,
        c.expired,
        c.dead_lettered,
        c.stream.messages,
        c.stream.bytes,
        c.stream.pending,
        c.stream.pending_by_priority.high,
        c.stream.pending_by_priority.normal,
        c.stream.pending_by_priority.low,
        c.stream.in_flight,
        c.stream.redelivered,
        c.stream.waiting_pulls
    );
    // Tenants other than the default, when there are any.
    let tenants: Vec<String> = c
        .stream
        .pending_by_tenant
        .iter()
        .filter(|(t, n)| t.as_str() != sluice_schemas::DEFAULT_TENANT && **n > 0)
        .map(|(t, n)| format!("{t} {n}"))
        .collect();
    if !tenants.is_empty() {
        println!("          pending by tenant: {}", tenants.join(", "));
    }
    for m in &c.models {
        println!(
            "          {}/{}: pending {}, in flight {}, consumers {}",
            m.task,
            m.model.as_deref().unwrap_or("(any model)"),
            m.pending,
            m.in_flight,
            m.consumers
        );
    }
}

async fn download_output(
    p: &Producer,
    dir: &Path,
    id: &str,
    bucket: &str,
    key: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let obj =
        p.s3.get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot get s3://{bucket}/{key}: {}",
                    aws_sdk_s3::error::DisplayErrorContext(e)
                )
            })?;
    let bytes = obj.body.collect().await?.into_bytes();
    let extension = key
        .rsplit('.')
        .next()
        .filter(|e| *e == "jsonl")
        .unwrap_or("npy");
    let path = dir.join(format!("{id}.{extension}"));
    std::fs::write(&path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Where one job's items come from.
enum JobSource {
    /// A file's bytes, uploaded to S3 and fetched by the consumer.
    Upload { name: String, body: Vec<u8> },
    /// Items carried in the job message.
    Inline {
        name: String,
        items: Vec<serde_json::Value>,
    },
    /// An already-presigned URL.
    Url(String),
}

impl JobSource {
    fn name(&self) -> &str {
        match self {
            JobSource::Upload { name, .. } | JobSource::Inline { name, .. } => name,
            JobSource::Url(_) => "url",
        }
    }
}

/// The jobs the command line asks for: one per input (uploaded, or inline),
/// one per line with `each_line`, one per URL. Inputs are checked already.
fn job_sources(
    inputs: Vec<(String, Vec<u8>)>,
    urls: Vec<String>,
    inline: bool,
    each_line: bool,
) -> Result<Vec<JobSource>> {
    let mut sources = Vec::new();
    for (name, body) in inputs {
        if !inline {
            sources.push(JobSource::Upload { name, body });
            continue;
        }
        let text = std::str::from_utf8(&body).with_context(|| format!("{name}: not UTF-8"))?;
        let mut items = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let item: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{name}: line {}: not JSON", n + 1))?;
            if each_line {
                sources.push(JobSource::Inline {
                    name: format!("{name}:{}", n + 1),
                    items: vec![item],
                });
            } else {
                items.push(item);
            }
        }
        if !each_line {
            sources.push(JobSource::Inline { name, items });
        }
    }
    sources.extend(urls.into_iter().map(JobSource::Url));
    Ok(sources)
}

/// Uploads what must be uploaded (8 at a time), then publishes every job
/// through [`Producer::submit_pipelined`], printing each as its ack comes in.
/// Returns the ids of the jobs submitted; fails, after reporting those that
/// were stored, at the first job that was not.
fn parse_tenant(s: &str) -> Result<String, String> {
    if sluice_schemas::is_valid_tenant(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a tenant name: 1 to 64 of A-Z a-z 0-9 - _"
        ))
    }
}

/// What the command line sets on every job it submits.
struct JobOptions {
    /// The job id (only with one job); else a fresh UUIDv7 each.
    id: Option<String>,
    /// The trace every job joins; else a new one each.
    traceparent: Option<String>,
    deadline: Option<time::OffsetDateTime>,
    priority: Priority,
    tenant: Option<String>,
    /// generate: the job streams its text (`output.stream`).
    stream: bool,
    /// embed: `parameters.prompt_name`.
    prompt_name: Option<String>,
}

async fn submit_sources(
    p: &Producer,
    task: Task,
    sources: Vec<JobSource>,
    options: JobOptions,
    window: usize,
    json: bool,
) -> Result<Vec<String>> {
    let JobOptions {
        id,
        traceparent,
        deadline,
        priority,
        tenant,
        stream,
        prompt_name,
    } = options;
    use futures::StreamExt;
    let max_payload = p.nats.server_info().max_payload;
    let jobs: Vec<(String, sluice_schemas::Job)> = futures::stream::iter(sources)
        .map(|source| {
            let job_id = id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
            let prompt_name = prompt_name.clone();
            async move {
                let name = source.name().to_string();
                let input = match source {
                    JobSource::Upload { name, body } => p
                        .upload_input(&format!("{job_id}.jsonl"), body)
                        .await
                        .with_context(|| format!("uploading {name}"))?,
                    JobSource::Inline { items, .. } => Input::Inline { items },
                    JobSource::Url(url) => Input::Url {
                        url,
                        format: InputFormat::Jsonl,
                        object: None,
                    },
                };
                let mut job = p.job(task, &job_id, vec![input]);
                job.deadline = deadline;
                job.parameters.embed.prompt_name = prompt_name;
                job.output.stream = stream.then_some(true);
                Ok::<_, anyhow::Error>((name, job))
            }
        })
        .buffered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    // Checked before anything is published: all or nothing on this count.
    for (name, job) in &jobs {
        let size = job.to_bytes().len();
        if size > max_payload {
            bail!(
                "{name}: the job is {size} bytes with its items inline, over the NATS server's \
                 max_payload of {max_payload}; submit it without --inline/--each-line (uploaded to S3)"
            );
        }
    }
    let (names, submissions): (Vec<String>, Vec<_>) = jobs
        .into_iter()
        .map(|(name, job)| {
            let mut s = sluice_producer::Submission::new(&p.topology, job, traceparent.clone());
            s.priority = priority;
            s.tenant = tenant.clone();
            (name, s)
        })
        .unzip();
    let mut submitted = p.submit_pipelined(submissions, window).await?;
    let mut ids = Vec::with_capacity(names.len());
    let mut first_error = None;
    let mut names = names.into_iter();
    while let Some(s) = submitted.next().await {
        let name = names.next().unwrap_or_default();
        match s.ack {
            Ok(ack) => {
                report_submit(
                    json,
                    &s.job_id,
                    &name,
                    &ack,
                    s.traceparent.as_deref().unwrap_or(""),
                );
                ids.push(s.job_id);
            }
            Err(e) if first_error.is_none() => {
                first_error = Some(e.context(format!("{}: {name} was not submitted", s.job_id)))
            }
            Err(_) => {}
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(ids),
    }
}

fn report_submit(
    json: bool,
    id: &str,
    name: &str,
    ack: &async_nats::jetstream::publish::PublishAck,
    traceparent: &str,
) {
    let trace_id = trace_id_of(traceparent).unwrap_or("-");
    if json {
        println!(
            "{}",
            serde_json::json!({"event": "submitted", "job_id": id, "input": name,
                "sequence": ack.sequence, "duplicate": ack.duplicate, "trace_id": trace_id})
        );
    } else if ack.duplicate {
        println!("{id}: {name} was already submitted (duplicate id; not queued again)");
    } else {
        println!(
            "{id}: submitted {name} (stream sequence {}, trace {trace_id})",
            ack.sequence
        );
    }
}

fn is_traceparent(value: &str) -> bool {
    sluice_schemas::TraceParent::parse(value).is_some()
}

fn report_result(json: bool, r: &JobResult) {
    if json {
        if let Ok(text) = serde_json::to_string(r) {
            println!("{text}");
        }
        return;
    }
    let total = r.timings_ms.total.unwrap_or(0.0);
    let id = r.job_id.as_deref().unwrap_or("(no job id)");
    match &r.outcome {
        Outcome::Ok {
            output: Output::S3(o),
        } => println!(
            "{}: ok, {} items, {} tokens, {:.0} ms -> s3://{}/{} ({} bytes, shape {:?})",
            id, r.usage.items, r.usage.tokens, total, o.bucket, o.key, o.bytes, o.shape
        ),
        Outcome::Ok {
            output: Output::Inline { scores, .. },
        } if !scores.is_empty() => {
            println!(
                "{}: ok, {} pairs, {} tokens, {:.0} ms -> inline",
                id, r.usage.items, r.usage.tokens, total
            );
            for (i, score) in scores.iter().enumerate() {
                println!("  [{i}] {score}");
            }
        }
        Outcome::Ok {
            output:
                Output::Inline {
                    embeddings,
                    generations,
                    ..
                },
        } if generations.is_empty() => println!(
            "{}: ok, {} items, {} tokens, {:.0} ms -> inline, {} vectors of {}",
            id,
            r.usage.items,
            r.usage.tokens,
            total,
            embeddings.len(),
            embeddings.first().map_or(0, Vec::len)
        ),
        Outcome::Ok {
            output: Output::Inline { generations, .. },
        } => {
            println!(
                "{}: ok, {} prompts, {} prompt + {} generated tokens, {:.0} ms -> inline",
                id, r.usage.items, r.usage.tokens, r.usage.completion_tokens, total
            );
            for (i, g) in generations.iter().enumerate() {
                println!("  [{i}] ({}) {}", g.finish_reason.as_str(), g.text);
            }
        }
        Outcome::Error { error } => println!(
            "{}: error {} ({}): {}",
            id,
            error.code,
            if error.retryable {
                "retryable"
            } else {
                "permanent"
            },
            error.message
        ),
    }
}
