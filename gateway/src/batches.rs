//! The Batches API: `POST /v1/batches`, `GET /v1/batches/{id}`, `GET
//! /v1/batches`, `POST /v1/batches/{id}/cancel`. Handlers only record what
//! the client asked; the driver (`driver/`) does the work.

use std::collections::HashSet;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::api_error::ApiError;
use crate::auth::Tenant;
use crate::batch_record::{BatchRecord, BatchStatus, Counts, window_secs};
use crate::extract::{BodyName, OpenAiJson};
use crate::file_record::{FileRecord, new_file_id};
use crate::files;
use crate::objects::{self, ObjectWriter};
use crate::openai::Endpoint;
use crate::records;
use crate::state::{AppState, now};
use crate::traces::RequestTrace;

/// The body of `POST /v1/batches`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    output_expires_after: Option<Value>,
}

impl BodyName for CreateBatch {
    const NAME: &'static str = "a valid batch";
}

pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Extension(trace): Extension<RequestTrace>,
    OpenAiJson(request): OpenAiJson<CreateBatch>,
) -> Result<Json<Value>, ApiError> {
    let output_expires_after = match &request.output_expires_after {
        None | Some(Value::Null) => None,
        Some(policy) => Some(
            crate::lifecycle::expires_after(
                policy.get("anchor").and_then(Value::as_str),
                policy.get("seconds"),
            )
            .map_err(|e| ApiError::invalid(format!("output_{e}")).param("output_expires_after"))?,
        ),
    };
    if Endpoint::parse(&request.endpoint).is_none() {
        return Err(ApiError::invalid(format!(
            "endpoint {:?} is not supported; use one of: {}",
            request.endpoint,
            Endpoint::list()
        ))
        .param("endpoint"));
    }
    let Some(window) = window_secs(&request.completion_window) else {
        return Err(ApiError::invalid(format!(
            "completion_window {:?} is not a duration like 24h (s, m, h or d; at most 7 days)",
            request.completion_window
        ))
        .param("completion_window"));
    };
    if window > state.max_window_secs {
        return Err(ApiError::invalid(format!(
            "completion_window {:?} is longer than this deployment can finish: its job status \
             records are kept {} s (status_max_age_secs in `sluice init`'s settings), and a batch \
             needs them a day past its window; use at most {} s, or raise status_max_age_secs",
            request.completion_window,
            state.max_window_secs + crate::lifecycle::FINALIZE_MARGIN_SECS,
            state.max_window_secs
        ))
        .param("completion_window"));
    }
    // OpenAI's limits: 16 pairs, keys of 64 characters, values of 512.
    if let Some(metadata) = &request.metadata
        && (metadata.len() > 16
            || metadata.keys().any(|k| k.chars().count() > 64)
            || metadata
                .values()
                .any(|v| v.as_str().is_none_or(|v| v.chars().count() > 512)))
    {
        return Err(ApiError::invalid(
            "metadata holds at most 16 pairs: keys of at most 64 characters, string values of at most 512",
        )
        .param("metadata"));
    }
    let mut file = files::find(&state, &tenant, &request.input_file_id).await?;
    let retry_of = request
        .metadata
        .as_ref()
        .and_then(|m| m.get(RETRY_FAILED_OF))
        .and_then(Value::as_str);
    if let Some(source) = retry_of {
        file = failed_lines_file(&state, &tenant, source, &file).await?;
    }
    if file.purpose != "batch" {
        return Err(ApiError::invalid(format!(
            "the file {} has purpose {:?}; a batch's input needs purpose \"batch\"",
            file.id, file.purpose
        ))
        .param("input_file_id"));
    }
    let created_at = now();
    let record = BatchRecord {
        id: format!("batch_{}", uuid::Uuid::now_v7().simple()),
        tenant: tenant.clone(),
        endpoint: request.endpoint,
        input_file_id: file.id,
        completion_window: request.completion_window,
        metadata: request.metadata,
        output_expires_after,
        status: BatchStatus::Validating,
        created_at,
        expires_at: created_at + window,
        in_progress_at: None,
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: Counts::default(),
        output_file_id: None,
        error_file_id: None,
        errors: Vec::new(),
        chunks: Vec::new(),
        failed_at_validation: 0,
        lease: None,
        traceparent: Some(trace.0),
    };
    // The marker first: a batch whose record exists is always driven.
    state
        .records
        .put(&BatchRecord::active_key(&record.id), &json!({}))
        .await?;
    state.records.put_owned(&record.id, &record).await?;
    tracing::info!(
        batch = record.id,
        tenant,
        file = record.input_file_id,
        "batch created"
    );
    state.metrics.batch_created();
    crate::driver::kick(&state, &record.id);
    Ok(Json(record.to_api()))
}

impl records::Owned for BatchRecord {
    const KIND: &'static str = "batch";
    fn key(id: &str) -> String {
        BatchRecord::key(id)
    }
    fn tenant(&self) -> &str {
        &self.tenant
    }
}

/// The metadata key that makes a batch of only the failed lines of an
/// earlier one (its `input_file_id` must be that batch's input file).
pub const RETRY_FAILED_OF: &str = "retry_failed_of";

/// A new input file of the lines of `source`'s input whose `custom_id` is
/// in its error file: the replay of failed work, at batch scale.
async fn failed_lines_file(
    state: &AppState,
    tenant: &str,
    source: &str,
    input: &FileRecord,
) -> Result<FileRecord, ApiError> {
    let bad = |m: String| ApiError::invalid(m).param("metadata");
    let batch = find(state, tenant, source).await?;
    if batch.input_file_id != input.id {
        return Err(bad(format!(
            "{RETRY_FAILED_OF}: input_file_id must be {source}'s input file, {}",
            batch.input_file_id
        )));
    }
    if !batch.status.is_final() {
        return Err(bad(format!(
            "{RETRY_FAILED_OF}: {source} is {}; retry once it has ended",
            batch.status.as_str()
        )));
    }
    let Some(errors) = &batch.error_file_id else {
        return Err(bad(format!(
            "{RETRY_FAILED_OF}: {source} has no failed lines"
        )));
    };
    let mut failed = HashSet::new();
    let mut lines = objects::open(&state.s3, state.bucket(), &state.file_key(errors)).await?;
    while let Some(line) = objects::next_line(&mut lines, usize::MAX).await? {
        if let objects::Line::Text(t) = line
            && let Ok(v) = serde_json::from_slice::<Value>(&t)
            && let Some(id) = v["custom_id"].as_str()
        {
            failed.insert(id.to_string());
        }
    }
    let id = new_file_id();
    let mut writer = ObjectWriter::new(&state.s3, state.bucket(), &state.file_key(&id));
    let mut reader = objects::open(&state.s3, state.bucket(), &state.file_key(&input.id)).await?;
    while let Some(line) = objects::next_line(&mut reader, state.config.max_line_bytes).await? {
        if let objects::Line::Text(t) = line
            && let Ok(v) = serde_json::from_slice::<Value>(&t)
            && v["custom_id"].as_str().is_some_and(|c| failed.contains(c))
        {
            writer.write(&t).await?;
            writer.write(b"\n").await?;
        }
    }
    let bytes = writer.finish().await?;
    let file = FileRecord {
        id,
        tenant: tenant.to_string(),
        filename: format!("{source}_failed.jsonl"),
        purpose: "batch".into(),
        bytes,
        created_at: now(),
        expires_at: crate::lifecycle::expires_at(now(), None, state.config.retention_days),
    };
    state.records.put_owned(&file.id, &file).await?;
    Ok(file)
}

async fn find(state: &AppState, tenant: &str, id: &str) -> Result<BatchRecord, ApiError> {
    let batch = state.records.owned(tenant, id).await?;
    batch.ok_or_else(|| ApiError::not_found("batch", id))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(find(&state, &tenant, &id).await?.to_api()))
}

#[derive(Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
}

pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(20).clamp(1, 100);
    let page = records::page(
        &state.records,
        &tenant,
        q.after.as_deref(),
        limit,
        false,
        |_: &BatchRecord| true,
        BatchRecord::to_api,
    )
    .await?;
    Ok(Json(page))
}

pub async fn cancel(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let batch = find(&state, &tenant, &id).await?;
    let at = now();
    let changed = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(&batch.id), |b| {
            matches!(b.status, BatchStatus::Validating | BatchStatus::InProgress).then(|| {
                BatchRecord {
                    status: BatchStatus::Cancelling,
                    cancelling_at: Some(at),
                    ..b.clone()
                }
            })
        })
        .await?;
    match changed {
        Some(b) => {
            tracing::info!(batch = b.id, "batch cancelling");
            crate::driver::kick(&state, &b.id);
            Ok(Json(b.to_api()))
        }
        None => {
            let current = find(&state, &tenant, &id).await?;
            if current.status == BatchStatus::Cancelling {
                return Ok(Json(current.to_api()));
            }
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                format!(
                    "Cannot cancel a batch with status {}.",
                    current.status.as_str()
                ),
            ))
        }
    }
}
