//! Waiting for answers (`submit --wait`, `watch`, `status`): results,
//! streamed text, counts, outputs downloaded.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_producer::Producer;
use sluice_producer::watch::Counts;
use sluice_schemas::{JobResult, JobState, Outcome, Output, S3Output, StatusRecord};

/// How a waited-for job ended: its result message, or (when that was
/// missed) its final status record.
pub(crate) enum Answer {
    Result(JobResult),
    Status(StatusRecord),
}

impl Answer {
    pub(crate) fn is_ok(&self) -> bool {
        match self {
            Answer::Result(r) => matches!(r.outcome, Outcome::Ok { .. }),
            Answer::Status(s) => s.state == JobState::Done,
        }
    }

    pub(crate) fn s3_output(&self) -> Option<&S3Output> {
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
    pub(crate) fn prompts(&self) -> Option<usize> {
        if !self.is_ok() {
            return None;
        }
        match self {
            Answer::Result(r) => Some(r.usage.items as usize),
            Answer::Status(s) => s.usage.as_ref().map(|u| u.items as usize),
        }
    }

    pub(crate) fn report(&self, json: bool) {
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
pub(crate) struct StreamPrinter {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) prompts: tokio::sync::oneshot::Sender<Option<usize>>,
}

impl StreamPrinter {
    pub(crate) fn start(mut chunks: sluice_producer::JobStream, json: bool) -> StreamPrinter {
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
    pub(crate) async fn finish(self, prompts: Option<usize>) {
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

/// Waits for the results of `ids` (submitted as `tenant`; `None`: on the
/// plain subjects). A status record that is final for a while stands in for
/// a lost result; a user that may not read status records (a tenant's
/// publisher) waits for results alone.
pub(crate) async fn wait_for(
    p: &Producer,
    results: &mut sluice_producer::Results,
    tenant: Option<&str>,
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
    let mut polling = true;
    while !pending.is_empty() {
        let answer = tokio::select! {
            r = results.next_result() => match r {
                Ok(r) => Some(Answer::Result(r)),
                Err(e) => {
                    eprintln!("sluice: {e:#}");
                    break;
                }
            },
            _ = poll.tick(), if polling => {
                let mut found = None;
                let now = time::OffsetDateTime::now_utc();
                for _ in 0..STATUS_POLL_BATCH.min(pending.len()) {
                    cursor = (cursor + 1) % pending.len();
                    match p.status_in(tenant, pending[cursor]).await {
                        Ok(Some(record))
                            if record.state.is_final() && now - record.updated_at > RESULT_GRACE =>
                        {
                            found = Some(Answer::Status(record));
                            break;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            eprintln!("sluice: cannot read status records ({e:#}); waiting for the results alone");
                            polling = false;
                            break;
                        }
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

pub(crate) fn report_counts(json: bool, c: &Counts) {
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

pub(crate) async fn download_output(
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

pub(crate) fn report_result(json: bool, r: &JobResult) {
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
            output: Output::Inline { transcripts, .. },
        } if !transcripts.is_empty() => {
            println!(
                "{}: ok, {} recordings, {:.1} s of audio, {:.0} ms -> inline",
                id,
                r.usage.items,
                r.usage.audio_ms as f64 / 1000.0,
                total
            );
            for (i, t) in transcripts.iter().enumerate() {
                println!(
                    "  [{i}] ({}, {:.1} s, {} segments) {}",
                    t.language,
                    t.duration,
                    t.segments.len(),
                    t.text.trim()
                );
            }
        }
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
            output: Output::Inline {
                classifications, ..
            },
        } if !classifications.is_empty() => {
            println!(
                "{}: ok, {} texts, {} tokens, {:.0} ms -> inline",
                id, r.usage.items, r.usage.tokens, total
            );
            for (i, labels) in classifications.iter().enumerate() {
                let labels: Vec<String> = labels
                    .iter()
                    .map(|l| format!("{} {}", l.label, l.score))
                    .collect();
                println!("  [{i}] {}", labels.join(", "));
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
