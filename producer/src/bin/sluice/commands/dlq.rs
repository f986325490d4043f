//! `sluice dlq`: the dead letters: list, show, replay, purge.

use std::process::ExitCode;

use crate::args::*;
use anyhow::{Context, Result, bail};
use sluice_producer::Producer;
use sluice_producer::dlq::Filter;
use sluice_schemas::ErrorCode;

pub(crate) async fn dlq(p: &Producer, cmd: DlqCommand, json: bool) -> Result<ExitCode> {
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

pub(crate) fn parse_filter(code: Option<String>, since: Option<String>) -> Result<Filter> {
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
