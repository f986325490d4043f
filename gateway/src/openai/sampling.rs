//! The sampling parameters both generate endpoints (chat completions and
//! the legacy completions) take, as a sluice prompt item's.

use serde_json::{Map, Value};
use sluice_schemas::{GenerateParameters, ResponseFormat};

use super::request::RequestError;

/// The sampling parameters both generate endpoints share, as a sluice item's.
pub(super) fn generate_parameters(
    body: &Map<String, Value>,
    default_max_tokens: Option<u32>,
    logprobs: Option<u32>,
) -> Result<Map<String, Value>, RequestError> {
    if body
        .get("stream")
        .is_some_and(|s| s.as_bool() == Some(true))
    {
        return Err(RequestError::invalid(
            "`stream` is not available in a batch",
            Some("stream"),
        ));
    }
    if body
        .get("n")
        .is_some_and(|n| !n.is_null() && n.as_u64() != Some(1))
    {
        return Err(RequestError::invalid(
            "only `n` = 1 is supported",
            Some("n"),
        ));
    }
    let number = |name: &'static str| -> Result<Option<f64>, RequestError> {
        match body.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                RequestError::invalid(format!("`{name}` must be a number"), Some(name))
            }),
        }
    };
    let whole = |name: &'static str| -> Result<Option<u64>, RequestError> {
        match body.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                RequestError::invalid(format!("`{name}` must be a whole number >= 0"), Some(name))
            }),
        }
    };
    let max_tokens = match whole("max_completion_tokens")? {
        Some(n) => Some(n),
        None => whole("max_tokens")?,
    };
    let max_new_tokens =
        match max_tokens {
            Some(n) => Some(u32::try_from(n).map_err(|_| {
                RequestError::invalid("`max_tokens` is too large", Some("max_tokens"))
            })?),
            None => default_max_tokens,
        };
    let stop = match body.get("stop") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(list)) => Some(
            list.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    RequestError::invalid(
                        "`stop` must be a string or a list of strings",
                        Some("stop"),
                    )
                })?,
        ),
        Some(_) => {
            return Err(RequestError::invalid(
                "`stop` must be a string or a list of strings",
                Some("stop"),
            ));
        }
    };
    let response_format = match body.get("response_format") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value::<ResponseFormat>(v.clone()).map_err(|e| {
                RequestError::invalid(
                    format!(
                        "`response_format` must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or {{\"type\": \"json_schema\", \"json_schema\": {{\"name\", \"schema\", \"strict\"}}}}: {e}"
                    ),
                    Some("response_format"),
                )
            })?,
        ),
    };
    let parameters = GenerateParameters {
        max_new_tokens,
        temperature: number("temperature")?,
        top_p: number("top_p")?,
        seed: whole("seed")?,
        stop,
        response_format,
        logprobs,
    };
    parameters
        .check()
        .map_err(|e| RequestError::invalid(e, None))?;
    let mut item = Map::new();
    if let Some(n) = parameters.max_new_tokens {
        item.insert("max_new_tokens".into(), n.into());
    }
    if let Some(t) = parameters.temperature {
        item.insert("temperature".into(), t.into());
    }
    if let Some(p) = parameters.top_p {
        item.insert("top_p".into(), p.into());
    }
    if let Some(s) = parameters.seed {
        item.insert("seed".into(), s.into());
    }
    if let Some(stop) = parameters.stop {
        item.insert("stop".into(), stop.into());
    }
    if let Some(format) = parameters.response_format {
        let format = serde_json::to_value(format).map_err(|e| {
            RequestError::invalid(format!("`response_format`: {e}"), Some("response_format"))
        })?;
        item.insert("response_format".into(), format);
    }
    if let Some(k) = parameters.logprobs {
        item.insert("logprobs".into(), k.into());
    }
    Ok(item)
}
