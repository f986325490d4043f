//! `sluice submit`: inputs checked and uploaded, jobs published.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sluice_producer::{Producer, trace_id_of};
use sluice_schemas::{Input, InputFormat, JsonlError, Priority, Task};

pub(crate) fn check_jsonl(task: Task, name: &str, body: &[u8]) -> Result<()> {
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
            Task::Classify => {
                bail!("{name}: no items (expected one JSON string or {{\"text\": ...}} per line)")
            }
            Task::Transcribe => bail!(
                "{name}: no items (expected one {{\"audio_base64\": ...}} per line; an audio file is submitted as it is)"
            ),
        },
        Ok(()) => Ok(()),
        Err(JsonlError::Invalid(m)) => bail!("{name}: {m}"),
        Err(JsonlError::TooManyItems(_)) => Ok(()), // no limit asked for here
    }
}

pub(crate) fn check_url(url: &str) -> Result<()> {
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
pub(crate) fn collect_inputs(paths: &[PathBuf]) -> Result<Vec<(String, Vec<u8>)>> {
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

/// Where one job's items come from.
pub(crate) enum JobSource {
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
    pub(crate) fn name(&self) -> &str {
        match self {
            JobSource::Upload { name, .. } | JobSource::Inline { name, .. } => name,
            JobSource::Url(_) => "url",
        }
    }
}

/// The jobs the command line asks for: one per input (uploaded, or inline),
/// one per line with `each_line`, one per URL. Inputs are checked already.
pub(crate) fn job_sources(
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

/// What the command line sets on every job it submits.
pub(crate) struct JobOptions {
    /// The job id (only with one job); else a fresh UUIDv7 each.
    pub(crate) id: Option<String>,
    /// The trace every job joins; else a new one each.
    pub(crate) traceparent: Option<String>,
    pub(crate) deadline: Option<time::OffsetDateTime>,
    pub(crate) priority: Priority,
    pub(crate) tenant: Option<String>,
    /// generate: the job streams its text (`output.stream`).
    pub(crate) stream: bool,
    /// embed: `parameters.prompt_name`.
    pub(crate) prompt_name: Option<String>,
    /// classify: `parameters.top_k`.
    pub(crate) top_k: Option<u32>,
    /// transcribe: `parameters.language`, `parameters.translate`.
    pub(crate) language: Option<String>,
    pub(crate) translate: bool,
    /// This process waits for the results: they come to its own inbox.
    /// Else they go to the default subjects (`sluice.results.<job id>`),
    /// for whoever listens there.
    pub(crate) wait: bool,
}

pub(crate) async fn submit_sources(
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
        top_k,
        language,
        translate,
        wait,
    } = options;
    use futures::StreamExt;
    let max_payload = p.nats.server_info().max_payload;
    let jobs: Vec<(String, sluice_schemas::Job)> = futures::stream::iter(sources)
        .map(|source| {
            let job_id = id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
            let prompt_name = prompt_name.clone();
            let language = language.clone();
            async move {
                let name = source.name().to_string();
                let input = match source {
                    JobSource::Upload { name, body } if task == Task::Transcribe => {
                        // The file as it is, under its own extension.
                        let extension = Path::new(&name)
                            .extension()
                            .and_then(|e| e.to_str())
                            .filter(|e| e.chars().all(|c| c.is_ascii_alphanumeric()))
                            .unwrap_or("audio")
                            .to_ascii_lowercase();
                        p.upload_input_as(
                            &format!("{job_id}.{extension}"),
                            body,
                            InputFormat::Audio,
                            deadline,
                        )
                        .await
                        .with_context(|| format!("uploading {name}"))?
                    }
                    JobSource::Upload { name, body } => p
                        .upload_input_until(&format!("{job_id}.jsonl"), body, deadline)
                        .await
                        .with_context(|| format!("uploading {name}"))?,
                    JobSource::Inline { items, .. } => Input::Inline { items },
                    JobSource::Url(url) => Input::Url {
                        url,
                        format: if task == Task::Transcribe {
                            InputFormat::Audio
                        } else {
                            InputFormat::Jsonl
                        },
                        object: None,
                    },
                };
                let mut job = p.job(task, &job_id, vec![input]);
                job.deadline = deadline;
                job.parameters.embed.prompt_name = prompt_name;
                job.parameters.classify.top_k = top_k;
                job.parameters.transcribe.language = language;
                job.parameters.transcribe.translate = translate.then_some(true);
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
            let mut s = sluice_producer::Submission::new(p, job, traceparent.clone());
            if !wait {
                s.reply_to = p.topology.result_subject(&s.job.id);
            }
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

pub(crate) fn report_submit(
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

pub(crate) fn is_traceparent(value: &str) -> bool {
    sluice_schemas::TraceParent::parse(value).is_some()
}
