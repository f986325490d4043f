//! The online endpoints: `POST /v1/embeddings`, `/v1/chat/completions`,
//! `/v1/completions`, `/v1/responses`, `/v1/rerank`, `/v1/classify` and `GET /v1/models`. Each request becomes one job on
//! the stream, published as the API key's tenant with a deadline, and is
//! answered from the job's result: a burst waits in the queue, inside the
//! consumers' memory budget, instead of in this process's memory.
//!
//! The deadline is the `Sluice-Deadline-Secs` header's, else
//! `--online-deadline-secs`; with `--max-queue-wait-secs` a request may wait
//! no longer than that to start. A job must start by then (it carries that
//! time as its deadline and TTL, so it never runs late): one that has not is
//! cancelled and its request answered 504 (`deadline_exceeded`), or 429 with
//! `Retry-After` when the queue limit was the nearer. A started job gets
//! `--online-grace-secs` more to answer. A client that disconnects cancels
//! its job, queued or running (a running generation stops before its next
//! step).
//!
//! `stream: true` (chat and completions) asks the job to stream
//! (`output.stream`): the request waits, as above, for the job's first
//! stream message, then answers Server-Sent Events in OpenAI's chunk format
//! as the consumer publishes each step's text, ending with `[DONE]` (and,
//! with `stream_options.include_usage`, a usage chunk before it). The
//! stream follows a redelivered job without repeating text, and falls back
//! to the result's text for a prompt whose stream lost a message.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{FromRequest, MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use sluice_schemas::{
    ErrorCode, FinishReason, Generation, Input, Job, JobResult, JobState, Outcome, Output,
    OutputOptions, Priority, StreamChunk, VERSION,
};

use crate::api_error::ApiError;
use crate::auth::Tenant;
use crate::extract::OpenAiJson;
use crate::openai::{self, Delta, Endpoint};
use crate::outputs::{self, Outputs};
use crate::state::{AppState, now};
use crate::traces::RequestTrace;

/// The header a caller sets its deadline with, in seconds from now.
pub const DEADLINE_HEADER: &str = "sluice-deadline-secs";

/// The models this deployment serves, in OpenAI's list shape, each with
/// its task and how many consumer processes serve it now (`live` when any:
/// a model with none takes jobs, which wait in the stream until one starts).
pub async fn models(State(state): State<AppState>, _tenant: Tenant) -> Json<Value> {
    let live = match sluice_connect::consumers::live_consumers(&state.js, &state.topology).await {
        Ok(live) => Some(live),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the live consumers");
            None
        }
    };
    let data: Vec<Value> = sluice_schemas::Task::ALL
        .iter()
        .flat_map(|&task| {
            state
                .served_models(task)
                .into_iter()
                .map(move |m| (task, m))
        })
        .map(|(task, m)| {
            let consumers = live
                .as_deref()
                .map(|live| sluice_schemas::consumers::serving(live, task.as_str(), &m));
            json!({
                "id": m,
                "object": "model",
                "created": 0,
                "owned_by": "sluice",
                "task": task.as_str(),
                "consumers": consumers,
                "live": consumers.map(|n| n > 0),
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// Cancels its job when dropped before [`CancelOnDrop::disarm`]: the
/// request's future (or its response stream) is dropped when its client
/// disconnects. A running job stops too: nobody will read its answer.
struct CancelOnDrop {
    /// The job's tenant's records.
    statuses: sluice_status::StatusStore,
    job_id: Option<String>,
}

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.job_id = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(job_id) = self.job_id.take() {
            let statuses = self.statuses.clone();
            tokio::spawn(async move {
                match statuses.cancel(&job_id).await {
                    Ok(true) => tracing::info!(job = %job_id, "client went away: job cancelled"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(job = %job_id, error = %e, "cannot cancel the job of a client that went away")
                    }
                }
            });
        }
    }
}

/// A message for a request: its job's result, or one of its stream messages.
enum Incoming {
    Result(async_nats::Message),
    Chunk(async_nats::Message),
}

type Messages = futures::stream::BoxStream<'static, Incoming>;

/// What a request asked of streaming.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Streaming {
    include_usage: bool,
}

/// When a job must have started, and what a request that it did not gets.
#[derive(Debug, Clone, Copy)]
struct StartBy {
    at: tokio::time::Instant,
    secs: f64,
    /// The queue limit, not the request's deadline, set `at`.
    by_queue_limit: bool,
    /// How long past `at` a job that started by then is waited for, and the
    /// knob that says so (`--online-grace-secs`; a transcription's
    /// `--online-transcribe-secs`).
    running: (Duration, &'static str),
}

/// One online request as its route, headers and body ask, checked against
/// the models this deployment serves; a request that is not one is refused
/// in OpenAI's error shape before anything is published.
pub struct OnlineRequest {
    endpoint: Endpoint,
    request: openai::Request,
    streaming: Option<Streaming>,
    deadline_secs: f64,
}

impl FromRequest<AppState> for OnlineRequest {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map(|r| r.as_str().to_string())
            .unwrap_or_default();
        let Some(endpoint) = Endpoint::parse(&route) else {
            return Err(ApiError::invalid(format!(
                "{route} is not an online endpoint"
            )));
        };
        let headers = req.headers().clone();
        let OpenAiJson(mut body) =
            OpenAiJson::<Map<String, Value>>::from_request(req, state).await?;
        let streaming = take_streaming(endpoint, &mut body)?;
        let deadline_secs = deadline_secs(state, &headers)?;
        let request =
            openai::parse_request(endpoint, body, &|task, model| state.serves(task, model))
                .map_err(|e| {
                    let mut error = ApiError::new(
                        StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
                        "invalid_request_error",
                        e.message,
                    )
                    .code(e.code);
                    error.param = e.param;
                    error
                })?;
        Ok(OnlineRequest {
            endpoint,
            request,
            streaming,
            deadline_secs,
        })
    }
}

/// One online request: `/v1/embeddings`, `/v1/chat/completions`,
/// `/v1/completions`, `/v1/responses`, `/v1/rerank` or `/v1/classify`, by
/// its route.
pub async fn answer(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Extension(trace): Extension<RequestTrace>,
    online: OnlineRequest,
) -> Result<Response, ApiError> {
    let asked = tokio::time::Instant::now();
    admit_tokens(&state, &tenant)?;
    let OnlineRequest {
        endpoint,
        request,
        streaming,
        deadline_secs,
    } = online;
    let start_by = start_by(&state, asked, deadline_secs);
    let job_id = uuid::Uuid::now_v7().to_string();
    let job = Job {
        version: VERSION,
        id: job_id.clone(),
        task: endpoint.task().as_str().into(),
        model: request.model.clone(),
        inputs: vec![Input::Inline {
            items: request.items.clone(),
        }],
        parameters: sluice_schemas::Parameters {
            embed: sluice_schemas::EmbedParameters {
                prompt_name: request.prompt_name.clone(),
                normalize: crate::openai::unit_vectors(endpoint.task()),
            },
            ..Default::default()
        },
        token_estimate: None,
        deadline: Some(time::OffsetDateTime::now_utc() + Duration::from_secs_f64(start_by.secs)),
        submitted_at: Some(time::OffsetDateTime::now_utc()),
        output: OutputOptions {
            stream: streaming.map(|_| true),
            ..OutputOptions::default()
        },
    };
    let (first, messages, guard) = publish_and_wait(
        &state,
        &tenant,
        &trace,
        &job,
        &start_by,
        streaming.is_some(),
    )
    .await?;
    let model = request.model.clone();
    if let Some(streaming) = streaming {
        let relay = Relay::new(
            &state, &request, &tenant, &job_id, streaming, start_by, asked, messages, guard,
        );
        return relay.respond(first).await;
    }
    let mut guard = guard;
    guard.disarm();
    let Incoming::Result(message) = first else {
        return Err(ApiError::unavailable(anyhow::anyhow!(
            "a stream message came for a request that did not stream"
        )));
    };
    let result = read_result(&message)?;
    charge_tokens(&state, &tenant, &result.usage);
    if let Some(ms) = result.timings_ms.queue {
        state
            .metrics
            .queue_wait(endpoint.as_str(), Duration::from_secs_f64(ms / 1e3));
    }
    match result.outcome {
        Outcome::Ok { output } => {
            let outputs = read_output(&state, &job_id, output).await?;
            let body = openai::answer_body(
                &request,
                &job_id,
                &model,
                now(),
                outputs.all(),
                result.usage.tokens,
            )
            .map_err(|e| ApiError::unavailable(anyhow::anyhow!("job {job_id}: {e}")))?;
            Ok(Json(body).into_response())
        }
        Outcome::Error { error } => Err(job_error(&job_id, &start_by, &error)),
    }
}

/// When a request's job must start: by its deadline, or by the queue
/// limit (`--max-queue-wait-secs`) where that is nearer.
fn start_by(state: &AppState, asked: tokio::time::Instant, deadline_secs: f64) -> StartBy {
    let running = (
        Duration::from_secs(state.config.online_grace_secs),
        "--online-grace-secs",
    );
    match state.config.max_queue_wait_secs {
        Some(limit) if limit < deadline_secs => StartBy {
            at: asked + Duration::from_secs_f64(limit),
            secs: limit,
            by_queue_limit: true,
            running,
        },
        _ => StartBy {
            at: asked + Duration::from_secs_f64(deadline_secs),
            secs: deadline_secs,
            by_queue_limit: false,
            running,
        },
    }
}

/// Publishes `job` as `tenant`'s on its route, answered on a fresh inbox
/// (and, `streaming`, under it on the job's stream subject); the first
/// message in time, the rest, and the guard that cancels the job if the
/// request goes away first.
async fn publish_and_wait(
    state: &AppState,
    tenant: &str,
    trace: &RequestTrace,
    job: &Job,
    start_by: &StartBy,
    streaming: bool,
) -> Result<(Incoming, Messages, CancelOnDrop), ApiError> {
    let nats = state.js.client();
    let subscribe_failed = |e| {
        ApiError::unavailable(anyhow::anyhow!(
            "cannot subscribe for the job's answer: {e}"
        ))
    };
    let inbox = nats.new_inbox();
    let results = nats
        .subscribe(inbox.clone())
        .await
        .map_err(subscribe_failed)?;
    let mut messages: Messages = if streaming {
        let chunks = nats
            .subscribe(state.topology.stream_subject_of(&job.id, Some(&inbox)))
            .await
            .map_err(subscribe_failed)?;
        futures::stream::select(results.map(Incoming::Result), chunks.map(Incoming::Chunk)).boxed()
    } else {
        results.map(Incoming::Result).boxed()
    };
    // Boxed: a large future that only needs to live while it runs (see
    // `read_output`).
    let route = state
        .models
        .route(job, Priority::Normal, Some(tenant))
        .await?;
    Box::pin(sluice_producer::publish(
        &state.js,
        &state.topology,
        &state.statuses,
        job,
        &route,
        &inbox,
        Some(&trace.0),
    ))
    .await?;
    let statuses = state.statuses_of(tenant);
    let guard = CancelOnDrop {
        statuses: statuses.clone(),
        job_id: Some(job.id.clone()),
    };
    let first = first_message(&statuses, &job.id, &mut messages, start_by).await?;
    Ok((first, messages, guard))
}

/// Runs `job` for an online request that waits for its whole answer (no
/// stream): its result's output, read back wherever it is, and usage; an
/// error result as the request's error. A job that started by its deadline
/// is waited for `running` more (seconds, and the knob that sets it). The
/// job is cancelled if the request goes away before it is answered.
pub(crate) async fn run_to_output(
    state: &AppState,
    tenant: &str,
    trace: &RequestTrace,
    mut job: Job,
    deadline_secs: f64,
    running: (u64, &'static str),
) -> Result<(Outputs, sluice_schemas::Usage), ApiError> {
    let asked = tokio::time::Instant::now();
    let mut start_by = start_by(state, asked, deadline_secs);
    start_by.running = (Duration::from_secs(running.0), running.1);
    job.deadline = Some(time::OffsetDateTime::now_utc() + Duration::from_secs_f64(start_by.secs));
    let (first, _, mut guard) =
        publish_and_wait(state, tenant, trace, &job, &start_by, false).await?;
    guard.disarm();
    let Incoming::Result(message) = first else {
        return Err(ApiError::unavailable(anyhow::anyhow!(
            "a stream message came for a request that did not stream"
        )));
    };
    let result = read_result(&message)?;
    charge_tokens(state, tenant, &result.usage);
    match result.outcome {
        Outcome::Ok { output } => Ok((read_output(state, &job.id, output).await?, result.usage)),
        Outcome::Error { error } => Err(job_error(&job.id, &start_by, &error)),
    }
}

/// Refuses a request of a tenant past its token rate.
pub(crate) fn admit_tokens(state: &AppState, tenant: &str) -> Result<(), ApiError> {
    if let Some(rate) = &state.token_rate
        && let Err(wait) = rate.admit(tenant, std::time::Instant::now())
    {
        return Err(ApiError::token_rate_limited(
            tenant,
            rate.per_minute(),
            wait,
        ));
    }
    Ok(())
}

/// Takes what an answered request used from its tenant's token rate.
fn charge_tokens(state: &AppState, tenant: &str, usage: &sluice_schemas::Usage) {
    if let Some(rate) = &state.token_rate {
        let used = usage.tokens + usage.completion_tokens;
        rate.charge(tenant, used, std::time::Instant::now());
    }
}

/// The first answer to a request: its result, or (streaming) its first
/// stream message. A job that has not started by its start-by time is
/// cancelled and the request refused; one that started just in time gets
/// `--online-grace-secs` more. `statuses`: the job's tenant's records.
async fn first_message(
    statuses: &sluice_status::StatusStore,
    job_id: &str,
    messages: &mut Messages,
    start_by: &StartBy,
) -> Result<Incoming, ApiError> {
    let closed = || ApiError::unavailable(anyhow::anyhow!("the answer subscription closed"));
    match tokio::time::timeout_at(start_by.at, messages.next()).await {
        Ok(Some(m)) => return Ok(m),
        Ok(None) => return Err(closed()),
        Err(_) => {}
    }
    // Cancelled now, or already expired (its queued record reads past the
    // deadline): either way it will not run.
    let stopped = statuses.cancel_queued(job_id).await.unwrap_or(false)
        || matches!(
            statuses.view(job_id).await,
            Ok(Some(r)) if matches!(r.state, JobState::Expired | JobState::Cancelled)
        );
    if stopped {
        return Err(not_started(job_id, start_by));
    }
    let grace = start_by.at + start_by.running.0;
    match tokio::time::timeout_at(grace, messages.next()).await {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(closed()),
        Err(_) => {
            let _ = statuses.cancel(job_id).await;
            Err(ran_too_long(job_id, start_by))
        }
    }
}

/// The answer to a request whose job did not start in time.
fn not_started(job_id: &str, start_by: &StartBy) -> ApiError {
    if !start_by.by_queue_limit {
        return deadline_passed(job_id, start_by.secs);
    }
    let retry = start_by.secs.ceil().max(1.0) as u64;
    let mut error = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        format!(
            "the queue is too long: the request waited {} s (--max-queue-wait-secs) without its job starting; \
             job {job_id} was cancelled and will not run; retry after {retry} s",
            start_by.secs
        ),
    )
    .code("queue_wait_exceeded");
    error.retry_after = Some(retry);
    error
}

/// A job's error result as the request's answer.
fn job_error(job_id: &str, start_by: &StartBy, error: &sluice_schemas::ErrorInfo) -> ApiError {
    if error.code == ErrorCode::DeadlineExceeded {
        return not_started(job_id, start_by);
    }
    let status = StatusCode::from_u16(crate::openai::http_status(error.code))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    let message = crate::job_errors::for_client(job_id, error.code, &error.message, false);
    ApiError::new(status, kind, message).code(error.code.as_str())
}

fn read_result(message: &async_nats::Message) -> Result<JobResult, ApiError> {
    serde_json::from_slice(&message.payload).map_err(|e| {
        ApiError::unavailable(anyhow::anyhow!("the job's result is not readable: {e}"))
    })
}

/// One prompt's stream, as relayed so far.
#[derive(Default)]
struct Choice {
    /// Bytes of its text sent to the client.
    sent: usize,
    /// The delivery whose messages are followed, and the bytes of its
    /// text seen (a redelivery streams again from the start).
    attempt: u32,
    attempt_bytes: usize,
    next_seq: u64,
    /// Logprobs sent to the client, and those seen of the followed
    /// delivery (skipped the same way as its text).
    logprobs_sent: usize,
    attempt_logprobs: usize,
    /// Characters of the sent logprobs' tokens (completions' `text_offset`).
    logprob_chars: usize,
    /// chat: the role chunk was sent.
    opened: bool,
    finished: bool,
    /// A message was lost: the rest comes from the result.
    lost: bool,
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// Turns a job's stream messages into OpenAI's SSE chunks (chat and
/// completions) or events (responses).
struct Relay {
    state: AppState,
    /// Whose token rate the answer is charged to.
    tenant: String,
    endpoint: Endpoint,
    job_id: String,
    model: String,
    created: i64,
    include_usage: bool,
    /// The request asked for logprobs: its chunks carry them.
    logprobs: bool,
    /// responses: the events made so far, numbered.
    events: Option<crate::openai::responses::Events>,
    start_by: StartBy,
    choices: Vec<Choice>,
    asked: tokio::time::Instant,
    first_text: bool,
    messages: Messages,
    pending: std::collections::VecDeque<Event>,
    done: bool,
    guard: CancelOnDrop,
}

impl Relay {
    #[allow(clippy::too_many_arguments)]
    fn new(
        state: &AppState,
        request: &openai::Request,
        tenant: &str,
        job_id: &str,
        streaming: Streaming,
        start_by: StartBy,
        asked: tokio::time::Instant,
        messages: Messages,
        guard: CancelOnDrop,
    ) -> Relay {
        let created = now();
        let logprobs = request
            .items
            .first()
            .is_some_and(|item| item.get("logprobs").is_some());
        let events = (request.endpoint == Endpoint::Responses).then(|| {
            crate::openai::responses::Events::new(
                job_id,
                created,
                &request.model,
                request.echo.clone().unwrap_or_default(),
                logprobs,
            )
        });
        Relay {
            state: state.clone(),
            tenant: tenant.to_string(),
            endpoint: request.endpoint,
            job_id: job_id.to_string(),
            model: request.model.clone(),
            created,
            include_usage: streaming.include_usage,
            logprobs,
            events,
            start_by,
            choices: (0..request.items.len().max(1))
                .map(|_| Choice::default())
                .collect(),
            asked,
            first_text: false,
            messages,
            pending: Default::default(),
            done: false,
            guard,
        }
    }

    /// The response: an error status when the job failed before it
    /// streamed anything, else the event stream.
    async fn respond(mut self, first: Incoming) -> Result<Response, ApiError> {
        if let Incoming::Result(message) = &first {
            let result = read_result(message)?;
            if let Outcome::Error { error } = &result.outcome {
                self.guard.disarm();
                return Err(job_error(&self.job_id, &self.start_by, error));
            }
        }
        if let Some(events) = &mut self.events {
            self.pending
                .extend(events.started().iter().map(named_event));
        }
        self.take(first).await;
        let events = futures::stream::unfold(self, |mut relay| async move {
            loop {
                if let Some(event) = relay.pending.pop_front() {
                    return Some((Ok::<Event, Infallible>(event), relay));
                }
                if relay.done {
                    return None;
                }
                let idle = Duration::from_secs(relay.state.config.online_stream_idle_secs);
                match tokio::time::timeout(idle, relay.messages.next()).await {
                    Ok(Some(message)) => relay.take(message).await,
                    Ok(None) => relay.fail("the stream's subscription closed"),
                    Err(_) => relay.fail(&format!(
                        "no stream message for {} s (--online-stream-idle-secs); the job was cancelled",
                        idle.as_secs()
                    )),
                }
            }
        });
        Ok(Sse::new(events).into_response())
    }

    async fn take(&mut self, message: Incoming) {
        match message {
            Incoming::Chunk(m) => match serde_json::from_slice::<StreamChunk>(&m.payload) {
                Ok(chunk) => self.chunk(chunk),
                Err(e) => {
                    tracing::warn!(job = %self.job_id, error = %e, "an unreadable stream message; skipped")
                }
            },
            Incoming::Result(m) => match read_result(&m) {
                Ok(result) => self.result(result).await,
                Err(e) => self.fail(&e.message),
            },
        }
    }

    fn chunk(&mut self, chunk: StreamChunk) {
        let Some(choice) = self.choices.get_mut(chunk.item as usize) else {
            return;
        };
        if choice.finished || choice.lost || chunk.attempt < choice.attempt {
            return;
        }
        if chunk.attempt > choice.attempt {
            choice.attempt = chunk.attempt;
            choice.attempt_bytes = 0;
            choice.attempt_logprobs = 0;
            choice.next_seq = 0;
        }
        if chunk.seq != choice.next_seq {
            tracing::warn!(job = %self.job_id, item = chunk.item, expected = choice.next_seq, got = chunk.seq, "a stream message was lost; the rest of this choice comes from the result");
            choice.lost = true;
            return;
        }
        choice.next_seq += 1;
        if chunk.seq == 0
            && chunk.item == 0
            && chunk.attempt <= 1
            && let Some(ms) = chunk.queue_ms
        {
            self.state
                .metrics
                .queue_wait(self.endpoint.as_str(), Duration::from_secs_f64(ms / 1e3));
        }
        // A redelivery's text is the same as the first delivery's: skip
        // what the client already has.
        let seen = choice.attempt_bytes;
        choice.attempt_bytes += chunk.text.len();
        let skip = choice.sent.saturating_sub(seen);
        let new = chunk.text.get(skip..).unwrap_or("").to_string();
        let logprobs = chunk.logprobs.unwrap_or_default();
        let seen = choice.attempt_logprobs;
        choice.attempt_logprobs += logprobs.len();
        let skip = choice.logprobs_sent.saturating_sub(seen);
        let new_logprobs = logprobs.get(skip..).unwrap_or_default();
        let index = chunk.item;
        self.text(index, &new, new_logprobs);
        if let (Some(reason), Some(usage)) = (chunk.finish_reason, chunk.usage) {
            self.finish(index, reason, usage.prompt_tokens, usage.completion_tokens);
        }
    }

    /// The job's result: fills in what lost messages left out, or ends the
    /// stream with the job's error.
    async fn result(&mut self, result: JobResult) {
        self.guard.disarm();
        charge_tokens(&self.state, &self.tenant, &result.usage);
        match result.outcome {
            Outcome::Error { error } => {
                let error = job_error(&self.job_id, &self.start_by, &error);
                self.error(&error);
            }
            Outcome::Ok { output } => {
                let output = read_output(&self.state, &self.job_id, output).await;
                let generations = match output {
                    Ok(Outputs::Lines { values, .. }) => {
                        match openai::read_lines::<Generation>(&values, "a generation") {
                            Ok(g) => g,
                            Err(e) => {
                                self.fail(&e);
                                return;
                            }
                        }
                    }
                    Ok(Outputs::Vectors { .. } | Outputs::Scores { .. }) => Vec::new(),
                    Err(e) => {
                        self.fail(&e.message);
                        return;
                    }
                };
                for (index, g) in generations.iter().enumerate() {
                    let Some(choice) = self.choices.get(index) else {
                        break;
                    };
                    if choice.finished {
                        continue;
                    }
                    let rest = g.text.get(choice.sent..).unwrap_or("").to_string();
                    let rest_logprobs = g
                        .logprobs
                        .as_deref()
                        .and_then(|l| l.get(choice.logprobs_sent..))
                        .unwrap_or_default();
                    self.text(index as u32, &rest, rest_logprobs);
                    self.finish(
                        index as u32,
                        g.finish_reason,
                        g.prompt_tokens,
                        g.completion_tokens,
                    );
                }
                self.end();
            }
        }
    }

    /// Sends a choice's new text and the logprobs of its new tokens.
    fn text(&mut self, index: u32, text: &str, logprobs: &[sluice_schemas::Logprob]) {
        let open = matches!(
            self.endpoint,
            Endpoint::ChatCompletions | Endpoint::Responses
        ) && !self.choices[index as usize].opened;
        if open {
            self.choices[index as usize].opened = true;
            match &mut self.events {
                Some(events) => self.pending.extend(events.opened().iter().map(named_event)),
                None => self.push(index, Delta::Role),
            }
        }
        // Logprobs come only where they were asked for.
        let logprobs = if self.logprobs { logprobs } else { &[] };
        if text.is_empty() && logprobs.is_empty() {
            return;
        }
        if !self.first_text && !text.is_empty() {
            self.first_text = true;
            self.state
                .metrics
                .first_token(self.endpoint.as_str(), self.asked.elapsed());
        }
        let choice = &mut self.choices[index as usize];
        choice.sent += text.len();
        choice.logprobs_sent += logprobs.len();
        let offset = choice.logprob_chars;
        choice.logprob_chars += logprobs
            .iter()
            .map(|l| l.token.chars().count())
            .sum::<usize>();
        match &mut self.events {
            Some(events) => {
                let delta = events.delta(text, logprobs);
                self.pending.push_back(named_event(&delta));
            }
            None => self.push(
                index,
                Delta::Text {
                    text,
                    logprobs: self.logprobs.then_some((logprobs, offset)),
                },
            ),
        }
    }

    fn finish(&mut self, index: u32, reason: FinishReason, prompt: u64, completion: u64) {
        let choice = &mut self.choices[index as usize];
        choice.finished = true;
        choice.prompt_tokens = prompt;
        choice.completion_tokens = completion;
        match &mut self.events {
            Some(events) => {
                let done = events.finished(reason, prompt, completion);
                self.pending.extend(done.iter().map(named_event));
            }
            None => self.push(index, Delta::Finish(reason)),
        }
        if self.choices.iter().all(|c| c.finished) {
            self.end();
        }
    }

    /// Every choice ended: the usage chunk if asked, then `[DONE]`
    /// (responses: `response.completed` carried the usage, and the stream
    /// just ends).
    fn end(&mut self) {
        if self.done {
            return;
        }
        self.guard.disarm();
        self.done = true;
        if self.events.is_some() {
            return;
        }
        if self.include_usage {
            let prompt = self.choices.iter().map(|c| c.prompt_tokens).sum();
            let completion = self.choices.iter().map(|c| c.completion_tokens).sum();
            let chunk = openai::usage_chunk(
                self.endpoint,
                &self.job_id,
                self.created,
                &self.model,
                prompt,
                completion,
            );
            self.pending.push_back(event(&chunk));
        }
        self.pending.push_back(Event::default().data("[DONE]"));
    }

    /// Ends the stream with an error event (the guard cancels the job).
    fn fail(&mut self, message: &str) {
        self.error(&ApiError::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            message,
        ));
    }

    /// Ends the stream with `error`: OpenAI's error body (chat and
    /// completions), or `response.failed` (responses).
    fn error(&mut self, error: &ApiError) {
        let event = match &mut self.events {
            Some(events) => {
                named_event(&events.failed(error.code.unwrap_or(error.kind), &error.message))
            }
            None => event(&error.body()),
        };
        self.pending.push_back(event);
        self.done = true;
    }

    fn push(&mut self, index: u32, delta: Delta<'_>) {
        let chunk = openai::stream_chunk(
            self.endpoint,
            &self.job_id,
            self.created,
            &self.model,
            index,
            delta,
            self.include_usage,
        );
        self.pending.push_back(event(&chunk));
    }
}

fn event(body: &Value) -> Event {
    Event::default().data(body.to_string())
}

/// A Responses event: named by its `type`, as OpenAI's are.
fn named_event(body: &Value) -> Event {
    let name = body["type"].as_str().unwrap_or("message");
    Event::default().event(name).data(body.to_string())
}

fn deadline_passed(job_id: &str, secs: f64) -> ApiError {
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "timeout",
        format!(
            "the request waited its whole deadline ({secs} s) in the queue; its job {job_id} was cancelled and will not run"
        ),
    )
    .code("deadline_exceeded")
}

/// The answer to a request whose job started by its deadline but was not
/// done in the time the request waits for a started job.
fn ran_too_long(job_id: &str, start_by: &StartBy) -> ApiError {
    let (running, knob) = start_by.running;
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "timeout",
        format!(
            "job {job_id} started within the request's deadline ({} s) but was not done {} s after it ({knob}); it was cancelled",
            start_by.secs,
            running.as_secs()
        ),
    )
    .code("deadline_exceeded")
}

/// `a`, `a and b`, `a, b and c`.
fn english_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// What the body asks of streaming (`stream`, `stream_options`), taken out
/// of it: `None` without `stream: true`.
fn take_streaming(
    endpoint: Endpoint,
    body: &mut Map<String, Value>,
) -> Result<Option<Streaming>, ApiError> {
    let stream = body.remove("stream");
    let options = body.remove("stream_options");
    match stream {
        None | Some(Value::Null) | Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => {}
        Some(_) => return Err(ApiError::invalid("`stream` must be a boolean").param("stream")),
    }
    if !endpoint.streams() {
        let streaming: Vec<&str> = Endpoint::ALL
            .into_iter()
            .filter(|e| e.streams())
            .map(Endpoint::as_str)
            .collect();
        return Err(ApiError::invalid(format!(
            "`stream` applies to {}, not to {}",
            english_list(&streaming),
            endpoint.as_str()
        ))
        .param("stream"));
    }
    let include_usage = match &options {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => o.get("include_usage"),
        Some(_) => {
            return Err(
                ApiError::invalid("`stream_options` must be an object").param("stream_options")
            );
        }
    };
    let include_usage = match include_usage {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(
                ApiError::invalid("`stream_options.include_usage` must be a boolean")
                    .param("stream_options"),
            );
        }
    };
    Ok(Some(Streaming { include_usage }))
}

/// The request's deadline in seconds: its header's, else the default.
pub(crate) fn deadline_secs(state: &AppState, headers: &HeaderMap) -> Result<f64, ApiError> {
    let Some(value) = headers.get(DEADLINE_HEADER) else {
        return Ok(state.config.online_deadline_secs as f64);
    };
    match value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        Some(secs) if secs > 0.0 && secs <= 86_400.0 => Ok(secs),
        _ => Err(ApiError::invalid(format!(
            "the {DEADLINE_HEADER} header must be a number of seconds, more than 0 and at most 86400"
        ))),
    }
}

/// The job's output: inline in its result, or read from S3 when it was too
/// large to travel inline.
async fn read_output(state: &AppState, job_id: &str, output: Output) -> Result<Outputs, ApiError> {
    match output {
        Output::S3(o) => {
            // Boxed: the S3 read's future is large, and it would otherwise be
            // part of every waiting request's future (their memory, each).
            Ok(Box::pin(outputs::read_output(state, job_id, &o, Vec::new())).await?)
        }
        inline => Ok(Outputs::inline(
            inline
                .inline_items()
                .unwrap_or(sluice_schemas::InlineItems::Lines(Vec::new())),
        )),
    }
}
