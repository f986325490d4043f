//! OpenAI's audio endpoints: `POST /v1/audio/transcriptions` and
//! `/v1/audio/translations`. The multipart `file` streams to S3 (under
//! `<prefix>audio/<job id>`, never whole in this process's memory), and
//! the request becomes one transcribe job whose input is that object's
//! presigned URL, published and answered as every online request is
//! (`online.rs`: the tenant's subject, the deadline, a cancel when the
//! client goes away); the object is removed once the job is answered. The
//! form's fields and the answer's formats are `openai/transcriptions.rs`'s.

use aws_sdk_s3::presigning::PresigningConfig;
use axum::Extension;
use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use sluice_schemas::{Input, InputFormat, Job, ObjectRef, OutputOptions, Task, VERSION};

use crate::api_error::ApiError;
use crate::auth::Tenant;
use crate::files::{bad_form, small_field, stream_field};
use crate::objects::{self, ObjectWriter};
use crate::online::{admit_tokens, deadline_secs, run_to_output};
use crate::openai::Share;
use crate::openai::transcriptions::{Answer, Fields, answer, read_fields};
use crate::state::AppState;
use crate::traces::RequestTrace;

/// `POST /v1/audio/transcriptions`.
pub async fn transcriptions(
    State(state): State<AppState>,
    tenant: Tenant,
    trace: Extension<RequestTrace>,
    headers: HeaderMap,
    multipart: Multipart,
) -> Result<Response, ApiError> {
    handle(state, tenant, trace, headers, multipart, false).await
}

/// `POST /v1/audio/translations`: the speech in English.
pub async fn translations(
    State(state): State<AppState>,
    tenant: Tenant,
    trace: Extension<RequestTrace>,
    headers: HeaderMap,
    multipart: Multipart,
) -> Result<Response, ApiError> {
    handle(state, tenant, trace, headers, multipart, true).await
}

/// Removes the request's audio object when the request ends, however it
/// ends (answered, refused, or the client gone).
struct RemoveOnDrop {
    state: AppState,
    key: Option<String>,
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let state = self.state.clone();
            tokio::spawn(async move {
                if let Err(e) = objects::delete(&state.s3, state.bucket(), &key).await {
                    tracing::warn!(key, error = %e, "cannot remove an audio request's object");
                }
            });
        }
    }
}

async fn handle(
    state: AppState,
    Tenant(tenant): Tenant,
    Extension(trace): Extension<RequestTrace>,
    headers: HeaderMap,
    mut multipart: Multipart,
    translate: bool,
) -> Result<Response, ApiError> {
    admit_tokens(&state, &tenant)?;
    let deadline_secs = deadline_secs(&state, &headers)?;
    let job_id = uuid::Uuid::now_v7().to_string();
    let key = format!("{}audio/{job_id}", state.config.prefix);
    let mut stored = RemoveOnDrop {
        state: state.clone(),
        key: None,
    };
    let mut fields = Fields::default();
    while let Some(mut field) = multipart.next_field().await.map_err(bad_form)? {
        let name = field.name().unwrap_or_default().to_string();
        match name.as_str() {
            "file" => {
                if stored.key.is_some() {
                    return Err(ApiError::invalid("give one `file`").param("file"));
                }
                let writer = ObjectWriter::new(&state.s3, state.bucket(), &key);
                let cap = state.config.max_file_bytes;
                stream_field(&mut field, writer, cap, || {
                    ApiError::too_large(format!(
                        "the audio file is larger than {cap} bytes (--max-file-bytes)"
                    ))
                    .param("file")
                })
                .await?;
                stored.key = Some(key.clone());
            }
            "model" => fields.model = Some(small_field(field, "model").await?),
            "language" => fields.language = Some(small_field(field, "language").await?),
            "prompt" => fields.prompt = Some(small_field(field, "prompt").await?),
            "response_format" => {
                fields.response_format = Some(small_field(field, "response_format").await?);
            }
            "temperature" => fields.temperature = Some(small_field(field, "temperature").await?),
            "stream" => fields.stream = Some(small_field(field, "stream").await?),
            "timestamp_granularities[]" | "timestamp_granularities" => fields
                .timestamp_granularities
                .push(small_field(field, "timestamp_granularities[]").await?),
            _ => {} // other fields are ignored (skipped, not kept)
        }
    }
    if stored.key.is_none() {
        return Err(ApiError::invalid("the form has no `file` field").param("file"));
    }
    let asked = read_fields(fields).map_err(|(m, param)| ApiError::invalid(m).param(param))?;
    if !state.serves(Task::Transcribe, &asked.model) {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "the model '{}' is not served for transcription; served: {}",
                asked.model,
                state.served_models(Task::Transcribe).join(", ")
            ),
        )
        .param("model")
        .code("model_not_found"));
    }
    // Read by its consumer once it starts (by the deadline), and again by
    // another if that one dies mid-file.
    let lifetime = std::time::Duration::from_secs_f64(deadline_secs)
        + std::time::Duration::from_secs(state.config.online_transcribe_secs)
        + crate::driver::PRESIGN_PAST_DEADLINE;
    let presigned = state
        .s3
        .get_object()
        .bucket(state.bucket())
        .key(&key)
        .presigned(
            PresigningConfig::expires_in(lifetime)
                .map_err(|e| ApiError::unavailable(anyhow::anyhow!("presigning {key}: {e}")))?,
        )
        .await
        .map_err(|e| ApiError::unavailable(anyhow::anyhow!("presigning {key}: {e}")))?;
    let mut parameters = sluice_schemas::Parameters::default();
    parameters.transcribe.language = asked.language.clone();
    parameters.transcribe.translate = translate.then_some(true);
    let job = Job {
        version: VERSION,
        id: job_id.clone(),
        task: Task::Transcribe.as_str().into(),
        model: asked.model.clone(),
        inputs: vec![Input::Url {
            url: presigned.uri().to_string(),
            format: InputFormat::Audio,
            object: Some(ObjectRef {
                bucket: state.bucket().to_string(),
                key: key.clone(),
            }),
        }],
        parameters,
        token_estimate: None,
        deadline: None,
        submitted_at: Some(time::OffsetDateTime::now_utc()),
        output: OutputOptions::default(),
    };
    let running = (
        state.config.online_transcribe_secs,
        "--online-transcribe-secs",
    );
    let (outputs, _usage) =
        run_to_output(&state, &tenant, &trace, job, deadline_secs, running).await?;
    drop(stored);
    let Share::Lines(lines) = outputs.all() else {
        return Err(ApiError::unavailable(anyhow::anyhow!(
            "job {job_id}: its output is not transcripts"
        )));
    };
    let transcript: sluice_schemas::Transcript = lines
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no transcript"))
        .and_then(|v| serde_json::from_value(v).map_err(anyhow::Error::from))
        .map_err(|e| ApiError::unavailable(anyhow::anyhow!("job {job_id}: {e}")))?;
    Ok(match answer(&transcript, asked.format, translate) {
        Answer::Json(body) => axum::Json(body).into_response(),
        Answer::Text { body, content_type } => {
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }
    })
}
