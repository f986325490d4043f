//! The Files API: `POST /v1/files` (multipart, streamed to S3), `GET
//! /v1/files`, `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE
//! /v1/files/{id}`. A file's bytes live in S3, its record in the gateway
//! bucket; a tenant sees only its own files. A file expires (`expires_after`,
//! else `--retention-days`): from then on it answers 404, and the sweeper
//! removes it (`lifecycle`). Deleting the input of a batch that has not
//! ended is refused (409 `file_in_use`).

use axum::Json;
use axum::body::Body;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api_error::ApiError;
use crate::auth::Tenant;
use crate::bounds::BodyStalled;
use crate::driver::sweep;
use crate::file_record::{FileRecord, new_file_id};
use crate::lifecycle;
use crate::objects::{self, ObjectWriter};
use crate::quota::{self, Room};
use crate::records;
use crate::state::{AppState, now};

/// Purposes a client may upload with (the batch API's input).
const UPLOAD_PURPOSES: [&str; 1] = [quota::UPLOADED];

/// The tenant's file `id`, or 404 (also for another tenant's file, and for
/// one that has expired).
pub async fn find(state: &AppState, tenant: &str, id: &str) -> Result<FileRecord, ApiError> {
    let file = state.records.owned::<FileRecord>(tenant, id).await?;
    file.filter(|f| !f.expired(now()))
        .ok_or_else(|| ApiError::not_found("file", id))
}

/// The most bytes a form field other than `file` may hold (`purpose`,
/// `expires_after[...]`): a few words each.
pub const MAX_FORM_FIELD_BYTES: usize = 256;

/// Bytes a multipart body may carry beyond its file (boundaries, headers,
/// the small fields).
pub const FORM_OVERHEAD_BYTES: u64 = 64 * 1024;

/// The form's fields, read as they come; the file streams to S3.
#[derive(Default)]
struct Form {
    purpose: Option<String>,
    anchor: Option<String>,
    seconds: Option<String>,
    file: Option<FileRecord>,
}

pub async fn upload(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    mut multipart: Multipart,
) -> Result<Json<Value>, ApiError> {
    let mut form = Form::default();
    let room = quota::room(&state, &tenant).await?;
    if let Err(e) = read_form(&state, &tenant, room, &mut multipart, &mut form).await {
        // A file already stored by an earlier field has no record yet:
        // nothing would ever find it again.
        if let Some(file) = &form.file {
            let _ = objects::delete(&state.s3, state.bucket(), &state.file_key(&file.id)).await;
        }
        return Err(e);
    }
    let Form {
        purpose,
        anchor,
        seconds,
        file: stored,
    } = form;
    let Some(mut file) = stored else {
        return Err(ApiError::invalid("the form has no `file` field").param("file"));
    };
    let purpose = purpose.unwrap_or_default();
    let refused = if !UPLOAD_PURPOSES.contains(&purpose.as_str()) {
        Some(
            ApiError::invalid(format!(
                "'{purpose}' is not a supported purpose; use one of: {}",
                UPLOAD_PURPOSES.join(", ")
            ))
            .param("purpose"),
        )
    } else if anchor.is_some() || seconds.is_some() {
        match lifecycle::expires_after(anchor.as_deref(), seconds.map(Value::String).as_ref()) {
            Ok(secs) => {
                file.expires_at = Some(file.created_at + secs);
                None
            }
            Err(e) => Some(ApiError::invalid(e).param("expires_after")),
        }
    } else {
        file.expires_at = lifecycle::expires_at(file.created_at, None, state.config.retention_days);
        None
    };
    if let Some(refused) = refused {
        let _ = objects::delete(&state.s3, state.bucket(), &state.file_key(&file.id)).await;
        return Err(refused);
    }
    file.purpose = purpose;
    if let Err(e) = state.records.put_owned(&file.id, &file).await {
        let _ = objects::delete(&state.s3, state.bucket(), &state.file_key(&file.id)).await;
        return Err(e.into());
    }
    tracing::info!(file = file.id, tenant, bytes = file.bytes, "file uploaded");
    Ok(Json(file.to_api()))
}

/// Reads `multipart` into `form`, streaming the file to S3. On an error,
/// `form.file` is whatever was stored before it (the caller removes it).
async fn read_form(
    state: &AppState,
    tenant: &str,
    room: Room,
    multipart: &mut Multipart,
    form: &mut Form,
) -> Result<(), ApiError> {
    while let Some(mut field) = multipart.next_field().await.map_err(bad_form)? {
        match field.name() {
            Some("purpose") => form.purpose = Some(small_field(field, "purpose").await?),
            Some("expires_after[anchor]") => {
                form.anchor = Some(small_field(field, "expires_after").await?);
            }
            Some("expires_after[seconds]") => {
                form.seconds = Some(small_field(field, "expires_after").await?);
            }
            Some("file") => {
                if form.file.is_some() {
                    return Err(ApiError::invalid("give one `file`").param("file"));
                }
                let id = new_file_id();
                let filename = field.file_name().unwrap_or("upload.jsonl").to_string();
                let writer = ObjectWriter::new(&state.s3, state.bucket(), &state.file_key(&id));
                let bytes = stream_field(&mut field, writer, room.bytes, || {
                    room.refusal(
                        state.config.max_file_bytes,
                        state.config.max_tenant_file_bytes,
                    )
                })
                .await?;
                form.file = Some(FileRecord {
                    id,
                    tenant: tenant.to_string(),
                    filename,
                    purpose: String::new(),
                    bytes,
                    created_at: now(),
                    expires_at: None,
                });
            }
            _ => {} // other fields are ignored (skipped, not kept)
        }
    }
    Ok(())
}

/// Streams a form field into `writer`'s object, at most `cap` bytes (past
/// it, `over`'s refusal); the object's size. Nothing is left behind on an
/// error: the upload is aborted.
pub(crate) async fn stream_field(
    field: &mut axum::extract::multipart::Field<'_>,
    mut writer: ObjectWriter,
    cap: u64,
    over: impl FnOnce() -> ApiError,
) -> Result<u64, ApiError> {
    loop {
        let chunk = match field.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                writer.abort().await;
                return Err(bad_form(e));
            }
        };
        if writer.len() + chunk.len() as u64 > cap {
            writer.abort().await;
            return Err(over());
        }
        if let Err(e) = writer.write(&chunk).await {
            writer.abort().await;
            return Err(e.into());
        }
    }
    Ok(writer.finish().await?)
}

/// A small text field, refused past [`MAX_FORM_FIELD_BYTES`] without
/// reading (or echoing) the rest.
pub(crate) async fn small_field(
    mut field: axum::extract::multipart::Field<'_>,
    param: &'static str,
) -> Result<String, ApiError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(bad_form)? {
        if bytes.len() + chunk.len() > MAX_FORM_FIELD_BYTES {
            return Err(ApiError::invalid(format!(
                "the form field `{}` is longer than {MAX_FORM_FIELD_BYTES} bytes",
                field.name().unwrap_or(param)
            ))
            .param(param));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| {
        ApiError::invalid(format!(
            "the form field `{}` is not UTF-8 text",
            field.name().unwrap_or(param)
        ))
        .param(param)
    })
}

/// A multipart body that cannot be read, answered as the caller's error:
/// 408 when it stopped arriving, 413 past the size limit, else 400.
pub(crate) fn bad_form(e: axum::extract::multipart::MultipartError) -> ApiError {
    if let Some(stall) = BodyStalled::in_chain(&e) {
        ApiError::stalled(stall)
    } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large("the multipart body is larger than the gateway accepts")
    } else {
        ApiError::invalid(format!(
            "the multipart body could not be read: {}",
            e.body_text()
        ))
    }
}

#[derive(Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
    purpose: Option<String>,
    order: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(10_000).clamp(1, 10_000);
    let ascending = match q.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(
                ApiError::invalid(format!("order must be asc or desc, not {other:?}"))
                    .param("order"),
            );
        }
    };
    let page = records::page(
        &state.records,
        &tenant,
        q.after.as_deref(),
        limit,
        ascending,
        |f: &FileRecord| !f.expired(now()) && q.purpose.as_ref().is_none_or(|p| *p == f.purpose),
        FileRecord::to_api,
    )
    .await?;
    Ok(Json(page))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(find(&state, &tenant, &id).await?.to_api()))
}

pub async fn content(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let file = find(&state, &tenant, &id).await?;
    let body = objects::get(&state.s3, state.bucket(), &state.file_key(&file.id)).await?;
    let stream = tokio_util::io::ReaderStream::new(body.into_async_read());
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, file.bytes.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

pub async fn delete(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let file = find(&state, &tenant, &id).await?;
    if let Some(batch) = sweep::in_use_by(&state, &file.id).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            format!(
                "the file {} is the input of batch {batch}, which has not ended; \
                 cancel the batch or wait for it to end, then delete the file",
                file.id
            ),
        )
        .code("file_in_use"));
    }
    objects::delete(&state.s3, state.bucket(), &state.file_key(&file.id)).await?;
    state
        .records
        .delete_owned::<FileRecord>(&file.tenant, &file.id)
        .await?;
    Ok(Json(
        json!({ "id": file.id, "object": "file", "deleted": true }),
    ))
}
