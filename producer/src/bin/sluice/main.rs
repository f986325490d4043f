//! `sluice`: set up a deployment, submit jobs, follow them.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use sluice_producer::provision::{self, Settings};
use sluice_producer::watch::Watcher;
use sluice_producer::{Producer, ProducerConfig};
use sluice_schemas::Task;

mod args;
mod commands;

use crate::args::*;
use crate::commands::batch::*;
use crate::commands::dlq::*;
use crate::commands::submit::*;
use crate::commands::wait::*;

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
        presign_secs: cli.presign_secs,
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
        Command::Status { id, tenant } => {
            let p = Producer::connect(&config).await?;
            match p.status_in(tenant.as_deref(), &id).await? {
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
        Command::Cancel { id, tenant } => {
            let p = Producer::connect(&config).await?;
            let cancelled = p.cancel_in(tenant.as_deref(), &id).await?;
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
            top_k,
            language,
            translate,
        } => {
            if (language.is_some() || translate) && task != Task::Transcribe {
                bail!("--language and --translate apply to --task transcribe");
            }
            if task == Task::Transcribe && each_line {
                bail!(
                    "--each-line reads JSONL; an audio file is one recording (give several files)"
                );
            }
            if top_k.is_some() && task != Task::Classify {
                bail!("--top-k applies to --task classify (the labels it keeps per text)");
            }
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
                if task != Task::Transcribe {
                    check_jsonl(task, name, body)?;
                } else if body.is_empty() {
                    bail!("{name}: the file is empty (0 bytes), not a recording");
                }
            }
            for url in &urls {
                check_url(url)?;
            }
            if (inline || each_line) && !urls.is_empty() {
                bail!("--inline and --each-line apply to files and stdin, not to --url inputs");
            }
            let sources = if task == Task::Transcribe && inline {
                inputs
                    .into_iter()
                    .map(|(name, body)| JobSource::Inline {
                        name,
                        items: vec![serde_json::json!({
                            "audio_base64": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, body)
                        })],
                    })
                    .chain(urls.into_iter().map(JobSource::Url))
                    .collect()
            } else {
                job_sources(inputs, urls, inline || each_line, each_line)?
            };
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
                    tenant: tenant.clone(),
                    stream,
                    prompt_name,
                    top_k,
                    language,
                    translate,
                    wait,
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
                tenant.as_deref(),
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
