//! A batch file's lines, in and out: a request line read and dispatched to
//! its endpoint's reader, and the output and error files' lines.

use serde_json::{Map, Value, json};
use sluice_schemas::{ErrorCode, Task};

use super::request::{Endpoint, Line, LineError, Ranking, Request, RequestError};
use super::{chat, classify, completions, embeddings, rerank, responses, transcriptions};

/// Reads one line. `serves` says whether a task's consumers serve a model.
pub fn read_line(text: &[u8], serves: &dyn Fn(Task, &str) -> bool) -> Result<Line, LineError> {
    let value: Value = serde_json::from_slice(text).map_err(|e| LineError {
        code: "invalid_json_line",
        message: format!("This line is not valid JSON: {e}"),
        param: None,
    })?;
    let Value::Object(mut line) = value else {
        return Err(LineError {
            code: "invalid_json_line",
            message: "This line is not a JSON object.".into(),
            param: None,
        });
    };
    let custom_id = match line.remove("custom_id") {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => {
            return Err(LineError {
                code: "missing_required_parameter",
                message: "This line is missing `custom_id` (a non-empty string).".into(),
                param: Some("custom_id"),
            });
        }
    };
    match line.remove("method") {
        Some(Value::String(m)) if m == "POST" => {}
        _ => {
            return Err(LineError {
                code: "invalid_method",
                message: "`method` must be \"POST\".".into(),
                param: Some("method"),
            });
        }
    }
    let url = match line.remove("url") {
        Some(Value::String(u)) => u,
        _ => String::new(),
    };
    let Some(endpoint) = Endpoint::parse(&url) else {
        return Err(LineError {
            code: "invalid_url",
            message: format!(
                "`url` {url:?} is not an endpoint this gateway serves; use one of: {}",
                Endpoint::list()
            ),
            param: Some("url"),
        });
    };
    let body = match line.remove("body") {
        Some(Value::Object(b)) => b,
        _ => {
            return Ok(Line::Fail {
                custom_id,
                error: RequestError::invalid("`body` must be a JSON object", Some("body")),
            });
        }
    };
    Ok(match parse_request(endpoint, body, serves) {
        Ok(request) => Line::Run { custom_id, request },
        Err(error) => Line::Fail { custom_id, error },
    })
}

/// Reads one request's body (a batch line's `body`, or an online request).
pub fn parse_request(
    endpoint: Endpoint,
    mut body: Map<String, Value>,
    serves: &dyn Fn(Task, &str) -> bool,
) -> Result<Request, RequestError> {
    let model = match body.remove("model") {
        Some(Value::String(m)) => m,
        _ => return Err(RequestError::invalid("`model` is required", Some("model"))),
    };
    if !serves(endpoint.task(), &model) {
        return Err(RequestError {
            status: 404,
            code: "model_not_found",
            message: format!(
                "The model `{model}` is not served on {} by this deployment.",
                endpoint.as_str()
            ),
            param: Some("model"),
        });
    }
    let mut ranking = Ranking::default();
    let mut echo = None;
    let mut audio = None;
    let (items, base64, prompt_name) = match endpoint {
        Endpoint::Embeddings => {
            let (items, base64) = embeddings::embedding_items(&mut body)?;
            (items, base64, embeddings::prompt_name(&body)?)
        }
        Endpoint::ChatCompletions => (vec![chat::chat_item(&mut body)?], false, None),
        Endpoint::Completions => (completions::completion_items(&mut body)?, false, None),
        Endpoint::Classify => (classify::classify_items(&mut body)?, false, None),
        Endpoint::Rerank => {
            let (items, asked) = rerank::rerank_items(&mut body)?;
            ranking = asked;
            (items, false, None)
        }
        Endpoint::Responses => {
            let (mut chat, asked) = responses::chat_body(&mut body).map_err(|r| RequestError {
                status: 400,
                code: r.code,
                message: r.message,
                param: Some(r.param),
            })?;
            echo = Some(asked);
            let item = chat::chat_item(&mut chat).map_err(|mut e| {
                if e.param == Some("messages") {
                    e.param = Some("input");
                }
                e
            })?;
            (vec![item], false, None)
        }
        Endpoint::AudioTranscriptions | Endpoint::AudioTranslations => {
            let translate = endpoint == Endpoint::AudioTranslations;
            let (item, answering) = transcriptions::batch_item(&mut body, &model, translate)
                .map_err(|(message, param)| RequestError::invalid(message, Some(param)))?;
            audio = Some(answering);
            (vec![item], false, None)
        }
    };
    Ok(Request {
        endpoint,
        model,
        items,
        base64,
        prompt_name,
        ranking,
        echo,
        audio,
    })
}

/// One line of an output file: a request answered with `body`.
pub fn output_line(id: &str, custom_id: &str, status_code: u16, body: Value) -> Value {
    json!({
        "id": id,
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": id, "body": body},
        "error": null,
    })
}

/// One line of an error file for a request the batch did not run
/// (`batch_expired`, `batch_cancelled`).
pub fn unrun_line(id: &str, custom_id: &str, code: &str, message: &str) -> Value {
    json!({
        "id": id,
        "custom_id": custom_id,
        "response": null,
        "error": {"code": code, "message": message},
    })
}

/// The HTTP status OpenAI would answer a request that failed with `code`.
pub fn http_status(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::InputFetchFailed
        | ErrorCode::StorageUnavailable
        | ErrorCode::DeviceOutOfMemory
        | ErrorCode::MaxDeliveriesExceeded
        | ErrorCode::Internal => 500,
        _ => 400,
    }
}
