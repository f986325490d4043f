//! The batch file's request lines and the response bodies, in OpenAI's
//! shapes, mapped to and from sluice's job items. Pure: no I/O.
//!
//! A line that is not a request at all (not JSON, no `custom_id`, a
//! `custom_id` seen before, a method other than POST, a `url` the gateway
//! does not serve) fails the batch's validation with its line number, as
//! OpenAI's does. A request that is well-formed but cannot run (an unknown
//! model, a bad body, too large) fails alone: it gets a line in the error file.

use base64::Engine;
use serde_json::{Map, Value, json};
use sluice_schemas::{
    ErrorCode, FinishReason, GenerateParameters, Generation, Item, Logprob, MAX_PROMPT_NAME,
    ResponseFormat, Task,
};

use crate::logprobs;

/// The endpoints a batch line may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Embeddings,
    ChatCompletions,
    Completions,
    /// The rerank API vLLM, llama-server, Jina and Cohere share (not
    /// OpenAI's): a query, documents, the documents ranked.
    Rerank,
    /// OpenAI's Responses API, for text (see [`crate::responses`]).
    Responses,
}

impl Endpoint {
    pub const ALL: [Endpoint; 5] = [
        Endpoint::Embeddings,
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Rerank,
        Endpoint::Responses,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Rerank => "/v1/rerank",
            Endpoint::Responses => "/v1/responses",
        }
    }

    pub fn parse(url: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.as_str() == url)
    }

    pub fn task(self) -> Task {
        match self {
            Endpoint::Embeddings => Task::Embed,
            Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Responses => {
                Task::Generate
            }
            Endpoint::Rerank => Task::Rerank,
        }
    }

    pub fn list() -> String {
        Endpoint::ALL.map(Endpoint::as_str).join(", ")
    }
}

/// A line that fails the batch's validation.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
}

/// A request that fails alone: its HTTP status and OpenAI error body.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
}

impl RequestError {
    fn invalid(message: impl Into<String>, param: Option<&'static str>) -> RequestError {
        RequestError {
            status: 400,
            code: "invalid_request_error",
            message: message.into(),
            param,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": if self.status >= 500 { "server_error" } else { "invalid_request_error" },
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// A request that can run: its items, in the order the consumer answers them.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub endpoint: Endpoint,
    pub model: String,
    /// The job items (embed: texts; generate: prompt objects; rerank: one
    /// `{"query", "document"}` pair per document, in the request's order).
    pub items: Vec<Value>,
    /// embeddings: answer vectors as base64 of little-endian float32.
    pub base64: bool,
    /// embeddings: the model's prompt to put before each text, by name (a
    /// body field sentence-transformers servers take; OpenAI's SDKs send it
    /// with `extra_body`). None: the model's default prompt.
    pub prompt_name: Option<String>,
    /// rerank: what the answer lists.
    pub ranking: Ranking,
    /// responses: the request's fields its answer repeats.
    pub echo: Option<crate::responses::Echo>,
}

/// What a rerank answer lists: the `top_n` best documents (none: all),
/// each with its text when `return_documents`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ranking {
    pub top_n: Option<usize>,
    pub return_documents: bool,
}

/// What one line of a batch file is.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Run {
        custom_id: String,
        request: Request,
    },
    Fail {
        custom_id: String,
        error: RequestError,
    },
}

impl Line {
    pub fn custom_id(&self) -> &str {
        match self {
            Line::Run { custom_id, .. } | Line::Fail { custom_id, .. } => custom_id,
        }
    }
}

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
    let (items, base64, prompt_name) = match endpoint {
        Endpoint::Embeddings => {
            let (items, base64) = embedding_items(&mut body)?;
            (items, base64, prompt_name(&body)?)
        }
        Endpoint::ChatCompletions => (vec![chat_item(&mut body)?], false, None),
        Endpoint::Completions => (completion_items(&mut body)?, false, None),
        Endpoint::Rerank => {
            let (items, asked) = rerank_items(&mut body)?;
            ranking = asked;
            (items, false, None)
        }
        Endpoint::Responses => {
            let (mut chat, asked) =
                crate::responses::chat_body(&mut body).map_err(|r| RequestError {
                    status: 400,
                    code: r.code,
                    message: r.message,
                    param: Some(r.param),
                })?;
            echo = Some(asked);
            let item = chat_item(&mut chat).map_err(|mut e| {
                if e.param == Some("messages") {
                    e.param = Some("input");
                }
                e
            })?;
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
    })
}

/// A rerank body: `query` (a string), `documents` (a non-empty list of
/// strings or `{"text": ...}` objects, as Cohere's v2 and vLLM take),
/// `top_n` (a whole number >= 1; default: every document) and
/// `return_documents` (default false, as Cohere's).
fn rerank_items(body: &mut Map<String, Value>) -> Result<(Vec<Value>, Ranking), RequestError> {
    let query = match body.remove("query") {
        Some(Value::String(q)) => q,
        _ => {
            return Err(RequestError::invalid(
                "`query` is required: the text to rank the documents against",
                Some("query"),
            ));
        }
    };
    let refused = || {
        RequestError::invalid(
            "`documents` must be a non-empty list of strings or {\"text\": ...} objects",
            Some("documents"),
        )
    };
    let documents: Vec<String> = match body.remove("documents") {
        Some(Value::Array(list)) if !list.is_empty() => list
            .into_iter()
            .map(|d| match d {
                Value::String(s) => Ok(s),
                Value::Object(mut o) if o.len() == 1 => match o.remove("text") {
                    Some(Value::String(s)) => Ok(s),
                    _ => Err(refused()),
                },
                _ => Err(refused()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(refused()),
    };
    let top_n = match body.get("top_n") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(RequestError::invalid(
                    "`top_n` must be a whole number >= 1 (how many of the best documents to list)",
                    Some("top_n"),
                ));
            }
        },
    };
    let return_documents = match body.get("return_documents") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(RequestError::invalid(
                "`return_documents` must be a boolean",
                Some("return_documents"),
            ));
        }
    };
    let items = documents
        .into_iter()
        .map(|document| json!({"query": query, "document": document}))
        .collect();
    Ok((
        items,
        Ranking {
            top_n,
            return_documents,
        },
    ))
}

fn embedding_items(body: &mut Map<String, Value>) -> Result<(Vec<Value>, bool), RequestError> {
    if body.get("dimensions").is_some_and(|d| !d.is_null()) {
        return Err(RequestError::invalid(
            "`dimensions` is not supported: the model answers with its own dimension",
            Some("dimensions"),
        ));
    }
    let base64 = match body.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(RequestError::invalid(
                format!("`encoding_format` must be \"float\" or \"base64\", not {other:?}"),
                Some("encoding_format"),
            ));
        }
    };
    let texts = strings(body.remove("input"), "input")?;
    // An empty text is embedded (as sentence-transformers does), where
    // OpenAI refuses it.
    Ok((texts.into_iter().map(Value::String).collect(), base64))
}

/// `prompt_name`: absent, null, or 1 to [`MAX_PROMPT_NAME`] characters (the
/// consumer refuses a name its model does not have).
fn prompt_name(body: &Map<String, Value>) -> Result<Option<String>, RequestError> {
    match body.get("prompt_name") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if (1..=MAX_PROMPT_NAME).contains(&name.chars().count()) => {
            Ok(Some(name.clone()))
        }
        Some(_) => Err(RequestError::invalid(
            format!(
                "`prompt_name` must be the name of one of the model's prompts (a string of 1 to {MAX_PROMPT_NAME} characters)"
            ),
            Some("prompt_name"),
        )),
    }
}

/// `input` / `prompt`: a string or a non-empty list of strings.
fn strings(value: Option<Value>, name: &'static str) -> Result<Vec<String>, RequestError> {
    let refused = || {
        RequestError::invalid(
            format!(
                "`{name}` must be a string or a non-empty list of strings (token arrays are not supported)"
            ),
            Some(name),
        )
    };
    match value {
        Some(Value::String(s)) => Ok(vec![s]),
        Some(Value::Array(list)) if !list.is_empty() => list
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(refused()),
            })
            .collect(),
        _ => Err(refused()),
    }
}

/// The sampling parameters both generate endpoints share, as a sluice item's.
fn generate_parameters(
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

/// What logprobs a chat completions body asks for: `logprobs: true`, with
/// `top_logprobs` alternatives per token (0 to 20; default 0).
fn chat_logprobs(body: &Map<String, Value>) -> Result<Option<u32>, RequestError> {
    let on = match body.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(on)) => *on,
        Some(_) => {
            return Err(RequestError::invalid(
                "`logprobs` must be true or false",
                Some("logprobs"),
            ));
        }
    };
    let most = GenerateParameters::MAX_LOGPROBS;
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&n| n <= u64::from(most))
                .ok_or_else(|| {
                    RequestError::invalid(
                        format!("`top_logprobs` must be a whole number from 0 to {most}"),
                        Some("top_logprobs"),
                    )
                })? as u32,
        ),
    };
    match (on, top) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, Some(n)) if n > 0 => Err(RequestError::invalid(
            "`top_logprobs` needs `logprobs`: true",
            Some("top_logprobs"),
        )),
        (false, _) => Ok(None),
    }
}

/// The most alternatives the legacy completions' `logprobs` lists
/// (OpenAI's limit there).
const COMPLETIONS_MAX_LOGPROBS: u64 = 5;

/// What logprobs a legacy completions body asks for: `logprobs`, the
/// number of alternatives per token (0 to 5).
fn completion_logprobs(body: &Map<String, Value>) -> Result<Option<u32>, RequestError> {
    if body.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(RequestError::invalid(
            format!(
                "`top_logprobs` is a chat completions parameter; completions take `logprobs`, a number of alternatives from 0 to {COMPLETIONS_MAX_LOGPROBS}"
            ),
            Some("top_logprobs"),
        ));
    }
    match body.get("logprobs") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&n| n <= COMPLETIONS_MAX_LOGPROBS)
            .map(|n| Some(n as u32))
            .ok_or_else(|| {
                RequestError::invalid(
                    format!(
                        "`logprobs` must be a whole number from 0 to {COMPLETIONS_MAX_LOGPROBS} (the alternatives listed per token)"
                    ),
                    Some("logprobs"),
                )
            }),
    }
}

fn chat_item(body: &mut Map<String, Value>) -> Result<Value, RequestError> {
    let mut item = generate_parameters(body, None, chat_logprobs(body)?)?;
    let Some(Value::Array(messages)) = body.remove("messages") else {
        return Err(RequestError::invalid(
            "`messages` must be a list",
            Some("messages"),
        ));
    };
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        // OpenAI's newer name for the system role.
        let role = if role == "developer" { "system" } else { role };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => Ok(t),
                        _ => Err(RequestError::invalid(
                            "only text content parts are supported",
                            Some("messages"),
                        )),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(""),
            _ => {
                return Err(RequestError::invalid(
                    "each message needs a `content` string",
                    Some("messages"),
                ));
            }
        };
        out.push(json!({"role": role, "content": content}));
    }
    item.insert("messages".into(), Value::Array(out));
    let item = Value::Object(item);
    Item::from_value(Task::Generate, item.clone())
        .map_err(|e| RequestError::invalid(e, Some("messages")))?;
    Ok(item)
}

/// OpenAI's legacy completions answer 16 tokens when `max_tokens` is unset.
const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

fn completion_items(body: &mut Map<String, Value>) -> Result<Vec<Value>, RequestError> {
    if body.get("echo").is_some_and(|e| e.as_bool() == Some(true)) {
        return Err(RequestError::invalid(
            "`echo` is not supported",
            Some("echo"),
        ));
    }
    let parameters = generate_parameters(
        body,
        Some(COMPLETIONS_DEFAULT_MAX_TOKENS),
        completion_logprobs(body)?,
    )?;
    let prompts = strings(body.remove("prompt"), "prompt")?;
    Ok(prompts
        .into_iter()
        .map(|p| {
            let mut item = parameters.clone();
            item.insert("prompt".into(), Value::String(p));
            Value::Object(item)
        })
        .collect())
}

/// OpenAI's finish reasons: the model's end of turn is `stop` too.
fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Eos => "stop",
    }
}

/// `parameters.normalize` of the jobs an embeddings request becomes: OpenAI's
/// embeddings are unit vectors ("normalized to length 1", its API says, and
/// clients compute cosine as a dot product on that word), so the gateway
/// asks for them whatever the model's own modules do; other tasks take no
/// such parameter.
pub fn unit_vectors(task: sluice_schemas::Task) -> Option<bool> {
    (task == sluice_schemas::Task::Embed).then_some(true)
}

/// The response body of an embeddings request.
pub fn embeddings_body(model: &str, vectors: &[&[f32]], tokens: u64, base64: bool) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

/// The response body of a rerank request: the documents by relevance, best
/// first (ties in request order), the first `top_n` of them, each with its
/// index in the request, its score and, with `return_documents`, its text
/// (from the request's items).
pub fn rerank_body(id: &str, model: &str, request: &Request, scores: &[f32], tokens: u64) -> Value {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    order.truncate(request.ranking.top_n.unwrap_or(usize::MAX));
    let results: Vec<Value> = order
        .into_iter()
        .map(|index| {
            let mut result = json!({"index": index, "relevance_score": scores[index]});
            if request.ranking.return_documents {
                let text = request
                    .items
                    .get(index)
                    .and_then(|item| item.get("document"))
                    .cloned()
                    .unwrap_or(Value::Null);
                result["document"] = json!({ "text": text });
            }
            result
        })
        .collect();
    json!({
        "id": format!("rerank-{id}"),
        "object": "list",
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

/// The response body of a chat completion, completions or responses
/// request.
pub fn generation_body(
    request: &Request,
    id: &str,
    created: i64,
    model: &str,
    generations: &[Generation],
) -> Value {
    let endpoint = request.endpoint;
    if endpoint == Endpoint::Responses
        && let Some(generation) = generations.first()
    {
        let echo = request.echo.clone().unwrap_or_default();
        return crate::responses::body(id, created, model, &echo, generation);
    }
    let prompt: u64 = generations.iter().map(|g| g.prompt_tokens).sum();
    let completion: u64 = generations.iter().map(|g| g.completion_tokens).sum();
    let choices: Vec<Value> = generations
        .iter()
        .enumerate()
        .map(|(index, g)| match endpoint {
            Endpoint::ChatCompletions => json!({
                "index": index,
                "message": {"role": "assistant", "content": g.text, "refusal": null},
                "logprobs": g.logprobs.as_deref().map(logprobs::chat),
                "finish_reason": finish_reason(g.finish_reason),
            }),
            _ => json!({
                "index": index,
                "text": g.text,
                "logprobs": g.logprobs.as_deref().map(|l| logprobs::completion(l, 0)),
                "finish_reason": finish_reason(g.finish_reason),
            }),
        })
        .collect();
    let mut body = envelope(endpoint, false, id, created, model, choices);
    body["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
    body
}

/// What one streamed chunk of a completion says about one choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delta<'a> {
    /// chat: the assistant's role, on a choice's first chunk.
    Role,
    /// New text, and the logprobs of the tokens since the last chunk when
    /// they were asked for (with the first one's character offset into the
    /// choice's text, for the legacy completions' `text_offset`).
    Text {
        text: &'a str,
        logprobs: Option<(&'a [Logprob], usize)>,
    },
    Finish(FinishReason),
}

/// One Server-Sent Event body of a streamed chat completion
/// (`chat.completion.chunk`) or completion (`text_completion`), for choice
/// `index`. With `include_usage` every chunk carries `"usage": null`, as
/// OpenAI's do, and [`usage_chunk`] ends the stream.
pub fn stream_chunk(
    endpoint: Endpoint,
    id: &str,
    created: i64,
    model: &str,
    index: u32,
    delta: Delta<'_>,
    include_usage: bool,
) -> Value {
    let finish = match delta {
        Delta::Finish(r) => Value::from(finish_reason(r)),
        _ => Value::Null,
    };
    let logprobs = match delta {
        Delta::Text { logprobs, .. } => logprobs,
        _ => None,
    };
    let choice = match endpoint {
        Endpoint::ChatCompletions => json!({
            "index": index,
            "delta": match delta {
                Delta::Role => json!({"role": "assistant", "content": ""}),
                Delta::Text { text, .. } => json!({"content": text}),
                Delta::Finish(_) => json!({}),
            },
            "logprobs": logprobs.map(|(l, _)| logprobs::chat(l)),
            "finish_reason": finish,
        }),
        _ => json!({
            "index": index,
            "text": match delta {
                Delta::Text { text, .. } => text,
                _ => "",
            },
            "logprobs": logprobs.map(|(l, offset)| logprobs::completion(l, offset)),
            "finish_reason": finish,
        }),
    };
    let mut chunk = envelope(endpoint, true, id, created, model, vec![choice]);
    if include_usage {
        chunk["usage"] = Value::Null;
    }
    chunk
}

/// The last chunk of a stream that asked `stream_options.include_usage`:
/// no choices, the request's usage.
pub fn usage_chunk(
    endpoint: Endpoint,
    id: &str,
    created: i64,
    model: &str,
    prompt_tokens: u64,
    completion_tokens: u64,
) -> Value {
    let mut chunk = envelope(endpoint, true, id, created, model, Vec::new());
    chunk["usage"] = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    chunk
}

/// What a completion body and a streamed chunk share: id, object, time,
/// model, choices.
fn envelope(
    endpoint: Endpoint,
    streamed: bool,
    id: &str,
    created: i64,
    model: &str,
    choices: Vec<Value>,
) -> Value {
    let (prefix, object) = match (endpoint, streamed) {
        (Endpoint::ChatCompletions, false) => ("chatcmpl", "chat.completion"),
        (Endpoint::ChatCompletions, true) => ("chatcmpl", "chat.completion.chunk"),
        _ => ("cmpl", "text_completion"),
    };
    json!({
        "id": format!("{prefix}-{id}"),
        "object": object,
        "created": created,
        "model": model,
        "system_fingerprint": null,
        "choices": choices,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sluice_schemas::TopLogprob;

    /// A batch line's request to `url` with `body`, which must run.
    fn request(url: &str, body: &str) -> Request {
        match read(&format!(
            r#"{{"custom_id":"c","method":"POST","url":"{url}","body":{body}}}"#
        ))
        .unwrap()
        {
            Line::Run { request, .. } => request,
            other => panic!("{other:?}"),
        }
    }

    fn serves(task: Task, model: &str) -> bool {
        model == task.default_model()
    }

    fn read(line: &str) -> Result<Line, LineError> {
        read_line(line.as_bytes(), &serves)
    }

    fn failed(line: &str) -> RequestError {
        match read(line).unwrap() {
            Line::Fail { error, .. } => error,
            other => panic!("expected a failed request, got {other:?}"),
        }
    }

    #[test]
    fn embedding_lines_become_texts() {
        let line = read(r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"all-minilm-l6-v2","input":["x","y"],"encoding_format":"base64"}}"#).unwrap();
        let Line::Run { custom_id, request } = line else {
            panic!()
        };
        assert_eq!(custom_id, "a");
        assert_eq!(request.items, vec![json!("x"), json!("y")]);
        assert!(request.base64);
        assert_eq!(request.prompt_name, None);
    }

    #[test]
    fn an_embedding_line_names_its_prompt() {
        let line = read(r#"{"custom_id":"q","method":"POST","url":"/v1/embeddings","body":{"model":"all-minilm-l6-v2","input":"x","prompt_name":"query"}}"#).unwrap();
        let Line::Run { request, .. } = line else {
            panic!()
        };
        assert_eq!(request.prompt_name.as_deref(), Some("query"));
        for bad in ["\"\"", "3", &format!("\"{}\"", "q".repeat(65))] {
            let e = failed(&format!(
                r#"{{"custom_id":"q","method":"POST","url":"/v1/embeddings","body":{{"model":"all-minilm-l6-v2","input":"x","prompt_name":{bad}}}}}"#
            ));
            assert_eq!((e.status, e.param), (400, Some("prompt_name")), "{bad}");
            assert!(e.message.contains("1 to 64 characters"), "{}", e.message);
        }
    }

    #[test]
    fn chat_and_completion_lines_become_prompt_items_with_their_parameters() {
        let line = read(r#"{"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{"model":"smollm2-135m-instruct","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_completion_tokens":8,"temperature":0,"stop":"\n"}}"#).unwrap();
        let Line::Run { request, .. } = line else {
            panic!()
        };
        assert_eq!(
            request.items,
            vec![
                json!({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_new_tokens":8,"temperature":0.0,"stop":["\n"]})
            ]
        );
        let line = read(r#"{"custom_id":"p","method":"POST","url":"/v1/completions","body":{"model":"smollm2-135m-instruct","prompt":["a","b"]}}"#).unwrap();
        let Line::Run { request, .. } = line else {
            panic!()
        };
        assert_eq!(
            request.items,
            vec![
                json!({"prompt":"a","max_new_tokens":16}),
                json!({"prompt":"b","max_new_tokens":16})
            ]
        );
    }

    fn reranks(task: Task, model: &str) -> bool {
        task == Task::Rerank && model == "bge-reranker"
    }

    /// A rerank line becomes one pair per document, its ranking options
    /// kept for the answer; documents may be `{"text": ...}` objects; a
    /// bad field fails the request alone, naming it.
    #[test]
    fn rerank_lines_become_pairs_and_bad_ones_name_the_field() {
        let read = |body: &str| {
            read_line(
                format!(r#"{{"custom_id":"r","method":"POST","url":"/v1/rerank","body":{body}}}"#)
                    .as_bytes(),
                &reranks,
            )
            .unwrap()
        };
        let Line::Run { request, .. } = read(
            r#"{"model":"bge-reranker","query":"q","documents":["a",{"text":"b"}],"top_n":1,"return_documents":true}"#,
        ) else {
            panic!()
        };
        assert_eq!(request.endpoint.task(), Task::Rerank);
        assert_eq!(
            request.items,
            vec![
                json!({"query": "q", "document": "a"}),
                json!({"query": "q", "document": "b"})
            ]
        );
        for item in &request.items {
            assert!(Item::from_value(Task::Rerank, item.clone()).is_ok());
        }
        assert_eq!(
            request.ranking,
            Ranking {
                top_n: Some(1),
                return_documents: true
            }
        );
        let Line::Run { request, .. } =
            read(r#"{"model":"bge-reranker","query":"q","documents":["a"]}"#)
        else {
            panic!()
        };
        assert_eq!(request.ranking, Ranking::default());
        for (body, param, needle) in [
            (
                r#"{"model":"bge-reranker","documents":["a"]}"#,
                "query",
                "`query` is required",
            ),
            (
                r#"{"model":"bge-reranker","query":"q","documents":[]}"#,
                "documents",
                "non-empty list",
            ),
            (
                r#"{"model":"bge-reranker","query":"q","documents":[3]}"#,
                "documents",
                "non-empty list",
            ),
            (
                r#"{"model":"bge-reranker","query":"q","documents":["a"],"top_n":0}"#,
                "top_n",
                ">= 1",
            ),
            (
                r#"{"model":"bge-reranker","query":"q","documents":["a"],"return_documents":"yes"}"#,
                "return_documents",
                "boolean",
            ),
        ] {
            let Line::Fail { error, .. } = read(body) else {
                panic!("{body} ran")
            };
            assert_eq!((error.status, error.param), (400, Some(param)), "{body}");
            assert!(error.message.contains(needle), "{body}: {}", error.message);
        }
        let Line::Fail { error, .. } =
            read(r#"{"model":"all-minilm-l6-v2","query":"q","documents":["a"]}"#)
        else {
            panic!()
        };
        assert_eq!((error.status, error.code), (404, "model_not_found"));
    }

    /// The answer ranks best first (ties in request order), keeps the first
    /// `top_n`, and gives each document's index, score and, when asked,
    /// its text.
    #[test]
    fn a_rerank_answer_ranks_the_documents() {
        let request = |top_n, return_documents| Request {
            endpoint: Endpoint::Rerank,
            model: "m".into(),
            items: ["a", "b", "c", "d"]
                .iter()
                .map(|d| json!({"query": "q", "document": d}))
                .collect(),
            base64: false,
            prompt_name: None,
            ranking: Ranking {
                top_n,
                return_documents,
            },
            echo: None,
        };
        let scores = [0.25f32, 0.75, 0.25, -1.0];
        let body = rerank_body("x", "m", &request(None, false), &scores, 12);
        let order: Vec<u64> = body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["index"].as_u64().unwrap())
            .collect();
        assert_eq!(order, [1, 0, 2, 3]);
        assert_eq!(body["results"][0]["relevance_score"], 0.75);
        assert!(body["results"][0].get("document").is_none());
        assert_eq!(
            (body["model"].as_str(), body["id"].as_str()),
            (Some("m"), Some("rerank-x"))
        );
        assert_eq!(body["usage"]["total_tokens"], 12);
        let body = rerank_body("x", "m", &request(Some(2), true), &scores, 12);
        assert_eq!(body["results"].as_array().unwrap().len(), 2);
        assert_eq!(body["results"][1]["document"], json!({"text": "a"}));
        let body = rerank_body("x", "m", &request(Some(9), false), &scores, 12);
        assert_eq!(body["results"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn lines_that_are_not_requests_fail_validation_with_a_code() {
        assert_eq!(read("not json").unwrap_err().code, "invalid_json_line");
        assert_eq!(read("[1]").unwrap_err().code, "invalid_json_line");
        assert_eq!(
            read(r#"{"method":"POST","url":"/v1/embeddings","body":{}}"#)
                .unwrap_err()
                .code,
            "missing_required_parameter"
        );
        assert_eq!(
            read(r#"{"custom_id":"a","method":"GET","url":"/v1/embeddings","body":{}}"#)
                .unwrap_err()
                .code,
            "invalid_method"
        );
        let e =
            read(r#"{"custom_id":"a","method":"POST","url":"/v1/images","body":{}}"#).unwrap_err();
        assert_eq!(e.code, "invalid_url");
        assert!(e.message.contains("/v1/embeddings"), "{}", e.message);
    }

    #[test]
    fn requests_that_cannot_run_fail_alone_with_openais_error() {
        let e = failed(
            r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"text-embedding-3-small","input":"x"}}"#,
        );
        assert_eq!((e.status, e.code), (404, "model_not_found"));
        let e = failed(
            r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"all-minilm-l6-v2","input":"x","dimensions":256}}"#,
        );
        assert_eq!((e.status, e.param), (400, Some("dimensions")));
        let e = failed(
            r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"all-minilm-l6-v2","input":[1,2]}}"#,
        );
        assert!(e.message.contains("token arrays"), "{}", e.message);
        let e = failed(
            r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"x"}],"top_p":2}}"#,
        );
        assert!(e.message.contains("top_p"), "{}", e.message);
        let e = failed(
            r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"smollm2-135m-instruct","messages":[{"role":"robot","content":"x"}]}}"#,
        );
        assert!(e.message.contains("role"), "{}", e.message);
        let e = failed(
            r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"smollm2-135m-instruct","messages":[],"n":2}}"#,
        );
        assert_eq!(e.param, Some("n"));
    }

    /// What each endpoint's logprobs fields ask of the job (its items'
    /// `logprobs`: alternatives per token), and what they refuse.
    #[test]
    fn logprobs_fields_become_the_items_logprobs_or_are_refused() {
        let chat = |fields: &str| {
            format!(
                r#"{{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{{"model":"smollm2-135m-instruct","messages":[{{"role":"user","content":"x"}}],{fields}}}}}"#
            )
        };
        let completions = |fields: &str| {
            format!(
                r#"{{"custom_id":"a","method":"POST","url":"/v1/completions","body":{{"model":"smollm2-135m-instruct","prompt":"x",{fields}}}}}"#
            )
        };
        let responses = |fields: &str| {
            format!(
                r#"{{"custom_id":"a","method":"POST","url":"/v1/responses","body":{{"model":"smollm2-135m-instruct","input":"x",{fields}}}}}"#
            )
        };
        let asked = |line: &str| match read(line).unwrap() {
            Line::Run { request, .. } => request.items[0]
                .get("logprobs")
                .map(|k| k.as_u64().unwrap()),
            Line::Fail { error, .. } => panic!("{line}: {error:?}"),
        };
        for (line, want) in [
            (chat(r#""logprobs":true"#), Some(0)),
            (chat(r#""logprobs":true,"top_logprobs":3"#), Some(3)),
            (chat(r#""logprobs":true,"top_logprobs":20"#), Some(20)),
            (chat(r#""logprobs":false,"top_logprobs":0"#), None),
            (chat(r#""logprobs":null"#), None),
            (completions(r#""logprobs":0"#), Some(0)),
            (completions(r#""logprobs":5"#), Some(5)),
            (completions(r#""logprobs":null"#), None),
            (
                responses(r#""include":["message.output_text.logprobs"]"#),
                Some(0),
            ),
            (
                responses(r#""include":["message.output_text.logprobs"],"top_logprobs":4"#),
                Some(4),
            ),
            (responses(r#""top_logprobs":4"#), None),
            (responses(r#""include":[]"#), None),
        ] {
            assert_eq!(asked(&line), want, "{line}");
        }
        for (line, param, says) in [
            (
                chat(r#""top_logprobs":2"#),
                "top_logprobs",
                "needs `logprobs`: true",
            ),
            (
                chat(r#""logprobs":true,"top_logprobs":21"#),
                "top_logprobs",
                "from 0 to 20",
            ),
            (chat(r#""logprobs":1"#), "logprobs", "true or false"),
            (completions(r#""logprobs":6"#), "logprobs", "from 0 to 5"),
            (completions(r#""logprobs":true"#), "logprobs", "from 0 to 5"),
            (
                completions(r#""top_logprobs":2"#),
                "top_logprobs",
                "completions take `logprobs`",
            ),
            (
                responses(r#""include":["message.output_text.logprobs"],"top_logprobs":21"#),
                "top_logprobs",
                "from 0 to 20",
            ),
            (
                responses(r#""include":["reasoning.encrypted_content"]"#),
                "include",
                "message.output_text.logprobs",
            ),
        ] {
            let e = failed(&line);
            assert_eq!(e.param, Some(param), "{line}");
            assert!(e.message.contains(says), "{line}: {}", e.message);
        }
    }

    /// A generation's logprobs in each endpoint's shape: chat's `content`
    /// list, the legacy completions' parallel lists (the chosen token among
    /// each step's alternatives, offsets in characters), the Responses
    /// output text's list; none where none were asked.
    #[test]
    fn logprobs_are_answered_in_each_endpoints_shape() {
        let top = |id: u32, token: &str, logprob: f32| TopLogprob {
            id,
            token: token.into(),
            bytes: token.as_bytes().to_vec(),
            logprob,
        };
        let logprobs = vec![
            Logprob {
                id: 1,
                token: "Pa".into(),
                bytes: b"Pa".to_vec(),
                logprob: -0.5,
                top_logprobs: vec![top(1, "Pa", -0.5), top(9, "Lo", -1.25)],
            },
            Logprob {
                id: 2,
                token: "ris".into(),
                bytes: b"ris".to_vec(),
                logprob: -2.0,
                top_logprobs: vec![top(3, "rty", -0.25), top(2, "ris", -2.0)],
            },
        ];
        let g = Generation {
            text: "Paris".into(),
            finish_reason: FinishReason::Eos,
            prompt_tokens: 10,
            completion_tokens: 2,
            logprobs: Some(logprobs.clone()),
        };
        let chat = request(
            "/v1/chat/completions",
            r#"{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2}"#,
        );
        let body = generation_body(&chat, "x", 1, "m", std::slice::from_ref(&g));
        assert_eq!(
            body["choices"][0]["logprobs"],
            json!({"content": [
                {"token": "Pa", "logprob": -0.5, "bytes": [80, 97], "top_logprobs": [
                    {"token": "Pa", "logprob": -0.5, "bytes": [80, 97]},
                    {"token": "Lo", "logprob": -1.25, "bytes": [76, 111]}]},
                {"token": "ris", "logprob": -2.0, "bytes": [114, 105, 115], "top_logprobs": [
                    {"token": "rty", "logprob": -0.25, "bytes": [114, 116, 121]},
                    {"token": "ris", "logprob": -2.0, "bytes": [114, 105, 115]}]}],
                "refusal": null})
        );
        let completions = request(
            "/v1/completions",
            r#"{"model":"smollm2-135m-instruct","prompt":"x","logprobs":1}"#,
        );
        let body = generation_body(&completions, "x", 1, "m", std::slice::from_ref(&g));
        assert_eq!(
            body["choices"][0]["logprobs"],
            json!({
                "tokens": ["Pa", "ris"],
                "token_logprobs": [-0.5, -2.0],
                "top_logprobs": [{"Pa": -0.5, "Lo": -1.25}, {"rty": -0.25, "ris": -2.0}],
                "text_offset": [0, 2],
            })
        );
        // A streamed chunk's offsets start where the choice's text is.
        let chunk = stream_chunk(
            Endpoint::Completions,
            "x",
            1,
            "m",
            0,
            Delta::Text {
                text: "ris",
                logprobs: Some((&logprobs[1..], 2)),
            },
            false,
        );
        assert_eq!(chunk["choices"][0]["logprobs"]["text_offset"], json!([2]));
        let chunk = stream_chunk(
            Endpoint::ChatCompletions,
            "x",
            1,
            "m",
            0,
            Delta::Text {
                text: "ris",
                logprobs: Some((&logprobs[1..], 2)),
            },
            false,
        );
        assert_eq!(
            chunk["choices"][0]["logprobs"]["content"][0]["token"],
            "ris"
        );
        let responses = request(
            "/v1/responses",
            r#"{"model":"smollm2-135m-instruct","input":"x","include":["message.output_text.logprobs"],"top_logprobs":2}"#,
        );
        let body = generation_body(&responses, "x", 1, "m", std::slice::from_ref(&g));
        let text = &body["output"][0]["content"][0];
        assert_eq!(text["logprobs"][1]["token"], "ris");
        assert_eq!(text["logprobs"][1]["top_logprobs"][0]["token"], "rty");
        assert_eq!(body["top_logprobs"], 2);
        // Not asked for: null (chat, completions) or empty (responses).
        let plain = Generation {
            logprobs: None,
            ..g
        };
        let body = generation_body(&chat, "x", 1, "m", std::slice::from_ref(&plain));
        assert_eq!(body["choices"][0]["logprobs"], Value::Null);
        let body = generation_body(&responses, "x", 1, "m", std::slice::from_ref(&plain));
        assert_eq!(body["output"][0]["content"][0]["logprobs"], json!([]));
    }

    #[test]
    fn bodies_are_shaped_as_openais() {
        let v = [0.5f32, -1.0];
        let body = embeddings_body("m", &[&v], 3, true);
        assert_eq!(body["object"], "list");
        assert_eq!(body["data"][0]["object"], "embedding");
        let b64 = body["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        assert_eq!(
            bytes,
            [0.5f32.to_le_bytes(), (-1.0f32).to_le_bytes()].concat()
        );
        assert_eq!(body["usage"]["total_tokens"], 3);
        let g = Generation {
            text: "Paris".into(),
            finish_reason: FinishReason::Eos,
            prompt_tokens: 10,
            completion_tokens: 2,
            logprobs: None,
        };
        let chat = request(
            "/v1/chat/completions",
            r#"{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"x"}]}"#,
        );
        let body = generation_body(&chat, "x", 1, "m", std::slice::from_ref(&g));
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["message"]["content"], "Paris");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["total_tokens"], 12);
        let responses = request(
            "/v1/responses",
            r#"{"model":"smollm2-135m-instruct","input":"x","instructions":"Be brief."}"#,
        );
        assert_eq!(
            responses.items,
            vec![
                json!({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"x"}]})
            ]
        );
        let body = generation_body(&responses, "x", 1, "m", &[g]);
        assert_eq!(body["object"], "response");
        assert_eq!(body["instructions"], "Be brief.");
        assert_eq!(body["output"][0]["content"][0]["text"], "Paris");
        assert_eq!(body["usage"]["total_tokens"], 12);
    }
}
