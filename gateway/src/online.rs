//! The online endpoints: `POST /v1/embeddings`, `/v1/chat/completions`,
//! `/v1/completions` and `GET /v1/models`. Each request becomes one job on
//! the stream, published as the API key's tenant with a deadline, and is
//! answered from the job's result: a burst waits in the queue, inside the
//! consumers' memory budget, instead of in this process's memory.
//!
//! The deadline is the `Sluice-Deadline-Secs` header's, else
//! `--online-deadline-secs`. A request whose deadline passes in the queue is
//! answered 504 and its job cancelled; the job also carries the deadline as
//! its TTL, so it never runs late. A client that disconnects cancels its job
//! if it has not started.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{MatchedPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use sluice_schemas::{
    ErrorCode, Input, Job, JobResult, JobState, Outcome, Output, OutputOptions, Priority, VERSION,
};

use crate::api_error::ApiError;
use crate::auth::Tenant;
use crate::driver::{self, Outputs};
use crate::openai::{self, Endpoint};
use crate::state::{AppState, now};
use crate::traces::RequestTrace;

/// The header a caller sets its deadline with, in seconds from now.
pub const DEADLINE_HEADER: &str = "sluice-deadline-secs";

/// The models this deployment serves, in OpenAI's list shape.
pub async fn models(State(state): State<AppState>, _tenant: Tenant) -> Json<Value> {
    let data: Vec<Value> = state
        .config
        .embed_models
        .iter()
        .chain(&state.config.generate_models)
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "sluice"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// Cancels its job when dropped before [`CancelOnDrop::disarm`]: the
/// request's future is dropped when its client disconnects.
struct CancelOnDrop {
    state: AppState,
    job_id: Option<String>,
}

impl CancelOnDrop {
    fn disarm(mut self) {
        self.job_id = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(job_id) = self.job_id.take() {
            let statuses = self.state.statuses.clone();
            tokio::spawn(async move {
                match statuses.cancel_queued(&job_id).await {
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

/// One online request: `/v1/embeddings`, `/v1/chat/completions` or
/// `/v1/completions`, by its route.
pub async fn answer(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Extension(trace): Extension<RequestTrace>,
    route: MatchedPath,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let Some(endpoint) = Endpoint::parse(route.as_str()) else {
        return Err(ApiError::invalid(format!(
            "{} is not an online endpoint",
            route.as_str()
        )));
    };
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(&body) else {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    };
    refuse_streaming(&mut body)?;
    let deadline_secs = deadline_secs(&state, &headers)?;
    let request = openai::parse_request(endpoint, body, &|task, model| state.serves(task, model))
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
    let job_id = uuid::Uuid::now_v7().to_string();
    let deadline = time::OffsetDateTime::now_utc() + Duration::from_secs_f64(deadline_secs);
    let job = Job {
        version: VERSION,
        id: job_id.clone(),
        task: endpoint.task().as_str().into(),
        model: request.model.clone(),
        inputs: vec![Input::Inline {
            items: request.items.clone(),
        }],
        parameters: Default::default(),
        token_estimate: None,
        deadline: Some(deadline),
        submitted_at: Some(time::OffsetDateTime::now_utc()),
        output: OutputOptions {
            presign_get_secs: None,
            always_s3: None,
            item_tokens: None,
        },
    };
    let nats = state.js.client();
    let inbox = nats.new_inbox();
    let mut results = nats.subscribe(inbox.clone()).await.map_err(|e| {
        ApiError::unavailable(anyhow::anyhow!("cannot subscribe for the result: {e}"))
    })?;
    sluice_producer::publish(
        &state.js,
        &state.topology,
        &state.statuses,
        &job,
        Priority::Normal,
        Some(&tenant),
        &inbox,
        Some(&trace.0),
    )
    .await?;
    let guard = CancelOnDrop {
        state: state.clone(),
        job_id: Some(job_id.clone()),
    };
    // The job cannot start after its deadline; one that started just before
    // it gets a grace period to finish.
    let give_up = tokio::time::Instant::now()
        + Duration::from_secs_f64(deadline_secs)
        + Duration::from_secs(state.config.online_grace_secs);
    let message = tokio::time::timeout_at(give_up, results.next()).await;
    guard.disarm();
    let message = match message {
        Ok(Some(m)) => m,
        Ok(None) => {
            return Err(ApiError::unavailable(anyhow::anyhow!(
                "the result subscription closed"
            )));
        }
        Err(_) => {
            // Cancelled now, or already expired (its queued record read past
            // the deadline): either way it will not run.
            let stopped = state.statuses.cancel(&job_id).await.unwrap_or(false)
                || matches!(
                    state.statuses.view(&job_id).await,
                    Ok(Some(r)) if matches!(r.state, JobState::Expired | JobState::Cancelled)
                );
            return Err(deadline_passed(&job_id, deadline_secs, stopped));
        }
    };
    let result: JobResult = serde_json::from_slice(&message.payload).map_err(|e| {
        ApiError::unavailable(anyhow::anyhow!("the job's result is not readable: {e}"))
    })?;
    match result.outcome {
        Outcome::Ok { output } => {
            let outputs = read_output(&state, output).await?;
            let model = request.model.as_str();
            Ok(Json(match outputs {
                Outputs::Vectors { dim, values, .. } => {
                    let rows: Vec<&[f32]> = values.chunks(dim.max(1)).collect();
                    openai::embeddings_body(model, &rows, result.usage.tokens, request.base64)
                }
                Outputs::Generations(generations) => {
                    openai::generation_body(endpoint, &job_id, now(), model, &generations)
                }
            }))
        }
        Outcome::Error { error } if error.code == ErrorCode::DeadlineExceeded => {
            Err(deadline_passed(&job_id, deadline_secs, true))
        }
        Outcome::Error { error } => {
            let status = StatusCode::from_u16(driver::http_status(error.code))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let kind = if status.is_server_error() {
                "server_error"
            } else {
                "invalid_request_error"
            };
            Err(ApiError::new(status, kind, error.message).code(error.code.as_str()))
        }
    }
}

fn deadline_passed(job_id: &str, secs: f64, stopped: bool) -> ApiError {
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "timeout",
        format!(
            "the request waited its whole deadline ({secs} s) in the queue; its job {job_id} {}",
            if stopped {
                "was cancelled and will not run"
            } else {
                "had already started"
            }
        ),
    )
    .code("deadline_exceeded")
}

/// `stream: true` is refused (the online endpoints answer whole); `stream:
/// false` and `stream_options` without streaming are accepted and dropped.
fn refuse_streaming(body: &mut Map<String, Value>) -> Result<(), ApiError> {
    let stream = body.remove("stream");
    body.remove("stream_options");
    match stream {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(Value::Bool(true)) => Err(ApiError::invalid(
            "`stream: true` is not supported by this gateway yet: ask without streaming",
        )
        .param("stream")),
        Some(_) => Err(ApiError::invalid("`stream` must be a boolean").param("stream")),
    }
}

/// The request's deadline in seconds: its header's, else the default.
fn deadline_secs(state: &AppState, headers: &HeaderMap) -> Result<f64, ApiError> {
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
async fn read_output(state: &AppState, output: Output) -> Result<Outputs, ApiError> {
    Ok(match output {
        Output::Inline {
            embeddings,
            generations,
        } if generations.is_empty() => Outputs::Vectors {
            dim: embeddings.first().map_or(0, Vec::len),
            values: embeddings.concat(),
            tokens: Vec::new(),
        },
        Output::Inline { generations, .. } => Outputs::Generations(generations),
        Output::S3(o) => driver::read_output(state, &o, Vec::new()).await?,
    })
}
