//! The Batches API: `POST /v1/batches`, `GET /v1/batches/{id}`, `GET
//! /v1/batches`, `POST /v1/batches/{id}/cancel`. Handlers only record what
//! the client asked; the driver (`driver.rs`) does the work.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::api_error::ApiError;
use crate::auth::Tenant;
use crate::batch_record::{BatchRecord, BatchStatus, Counts, window_secs};
use crate::files;
use crate::openai::Endpoint;
use crate::records;
use crate::state::{AppState, now};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    output_expires_after: Option<Value>,
}

pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request: CreateBatch = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the request body is not a valid batch: {e}")))?;
    let _ = request.output_expires_after;
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
    if let Some(metadata) = &request.metadata
        && (metadata.len() > 16 || metadata.values().any(|v| !v.is_string()))
    {
        return Err(ApiError::invalid("metadata holds at most 16 string values").param("metadata"));
    }
    let file = files::find(&state, &tenant, &request.input_file_id).await?;
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
    };
    // The marker first: a batch whose record exists is always driven.
    state
        .records
        .put(&BatchRecord::active_key(&record.id), &json!({}))
        .await?;
    state
        .records
        .put(&BatchRecord::key(&record.id), &record)
        .await?;
    tracing::info!(
        batch = record.id,
        tenant,
        file = record.input_file_id,
        "batch created"
    );
    crate::driver::kick(&state, &record.id);
    Ok(Json(record.to_api()))
}

impl records::Owned for BatchRecord {
    fn key(id: &str) -> String {
        BatchRecord::key(id)
    }
    fn tenant(&self) -> &str {
        &self.tenant
    }
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
        "batch.",
        q.after.as_deref(),
        limit,
        false,
        |b: &BatchRecord| b.tenant == tenant,
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
