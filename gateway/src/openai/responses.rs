//! OpenAI's Responses API (`POST /v1/responses`) for text: its request
//! mapped onto a chat item, its answer and its streamed events in the
//! Responses shapes. Pure: no I/O.
//!
//! A request is `input` (a string, or a list of messages whose content is a
//! string or `input_text` / `output_text` parts), `instructions` (the
//! system message), `max_output_tokens`, `temperature`, `top_p` and
//! `text.format` (`text`, `json_object`, or `json_schema` with `name`,
//! `schema`, `strict`: structured outputs, as `response_format` on chat).
//! What needs more than a model answering text is refused, naming the
//! field: `tools`, images, files and audio, stored state
//! (`previous_response_id`, `conversation`, `background`, `prompt`) and
//! every `include` but `message.output_text.logprobs` (the text's token
//! logprobs, with `top_logprobs` alternatives each). Responses are not
//! stored (`store` answers false): a conversation is sent whole, as with
//! chat completions.
//!
//! Streamed, a response is OpenAI's event sequence: `response.created`,
//! `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta` per step,
//! then the `.done` events and `response.completed` (with `usage`), or
//! `response.failed` carrying the error. Each event is named by its `type`
//! and numbered by `sequence_number`.

use serde_json::{Map, Value, json};
use sluice_schemas::{FinishReason, Generation, Logprob};

/// The request fields an answer repeats back, as OpenAI's do.
pub type Echo = Map<String, Value>;

/// A request refused (400), naming the field.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// `unsupported_parameter`: a field sluice does not serve;
    /// `invalid_request_error`: a field with a bad value.
    pub code: &'static str,
    pub message: String,
    pub param: &'static str,
}

fn unsupported(message: impl Into<String>, param: &'static str) -> Refused {
    Refused {
        code: "unsupported_parameter",
        message: message.into(),
        param,
    }
}

fn invalid(message: impl Into<String>, param: &'static str) -> Refused {
    Refused {
        code: "invalid_request_error",
        message: message.into(),
        param,
    }
}

/// Reads a Responses body into a chat completions body (`messages` and the
/// sampling fields under their chat names) and the fields to echo back.
/// What a text model cannot do is refused here, naming its field.
pub fn chat_body(body: &mut Map<String, Value>) -> Result<(Map<String, Value>, Echo), Refused> {
    refuse_unsupported(body)?;
    let mut messages = Vec::new();
    let mut echo = Echo::new();
    match body.remove("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => {
            messages.push(json!({"role": "system", "content": text}));
            echo.insert("instructions".into(), Value::String(text));
        }
        Some(_) => return Err(invalid("`instructions` must be a string", "instructions")),
    }
    match body.remove("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) if !items.is_empty() => {
            for item in items {
                messages.push(input_message(item)?);
            }
        }
        _ => {
            return Err(invalid(
                "`input` is required: a string, or a non-empty list of messages",
                "input",
            ));
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(stream) = body.remove("stream") {
        chat.insert("stream".into(), stream);
    }
    match body.remove("max_output_tokens") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64().is_some_and(|n| n >= 1) => {
            echo.insert("max_output_tokens".into(), n.clone());
            chat.insert("max_completion_tokens".into(), n);
        }
        Some(_) => {
            return Err(invalid(
                "`max_output_tokens` must be a whole number >= 1",
                "max_output_tokens",
            ));
        }
    }
    logprobs(body, &mut chat, &mut echo);
    for name in ["temperature", "top_p"] {
        if let Some(v) = body.remove(name).filter(|v| !v.is_null()) {
            echo.insert(name.into(), v.clone());
            chat.insert(name.into(), v);
        }
    }
    if let Some(text) = body.remove("text").filter(|v| !v.is_null()) {
        let Value::Object(text) = text else {
            return Err(invalid("`text` must be an object", "text"));
        };
        if let Some(format) = text.get("format").filter(|v| !v.is_null()) {
            chat.insert("response_format".into(), response_format(format)?);
        }
        echo.insert("text".into(), Value::Object(text));
    }
    match body.remove("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) if m.values().all(Value::is_string) => {
            echo.insert("metadata".into(), Value::Object(m));
        }
        Some(_) => {
            return Err(invalid(
                "`metadata` must be an object of string values",
                "metadata",
            ));
        }
    }
    match body.remove("truncation") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "disabled" || t == "auto" => {
            echo.insert("truncation".into(), Value::String(t));
        }
        Some(_) => {
            return Err(invalid(
                "`truncation` must be \"disabled\" or \"auto\"",
                "truncation",
            ));
        }
    }
    Ok((chat, echo))
}

/// The fields that ask for more than a model answering text.
fn refuse_unsupported(body: &Map<String, Value>) -> Result<(), Refused> {
    let set = |name: &str| body.get(name).is_some_and(|v| !v.is_null());
    if body
        .get("tools")
        .is_some_and(|t| t.as_array().is_none_or(|t| !t.is_empty()))
    {
        return Err(unsupported(
            "`tools` is not supported: this gateway's models answer text, without tool calls",
            "tools",
        ));
    }
    if body
        .get("tool_choice")
        .is_some_and(|c| !(c.is_null() || c == "none" || c == "auto"))
    {
        return Err(unsupported(
            "`tool_choice` is not supported: this gateway's models answer text, without tool calls",
            "tool_choice",
        ));
    }
    let stored = "responses are not stored here: send the whole conversation in `input`";
    if set("previous_response_id") {
        return Err(unsupported(
            format!("`previous_response_id` is not supported: {stored}"),
            "previous_response_id",
        ));
    }
    if set("conversation") {
        return Err(unsupported(
            format!("`conversation` is not supported: {stored}"),
            "conversation",
        ));
    }
    if set("prompt") {
        return Err(unsupported(
            "`prompt` (a stored prompt template) is not supported: send the text in `input` and `instructions`",
            "prompt",
        ));
    }
    if body.get("background").is_some_and(|b| b == true) {
        return Err(unsupported(
            "`background` is not supported: for work that runs later, use the Batches API with url /v1/responses",
            "background",
        ));
    }
    match body.get("include") {
        None | Some(Value::Null) => {}
        Some(Value::Array(include))
            if include.iter().all(|i| i.as_str() == Some(INCLUDE_LOGPROBS)) => {}
        Some(_) => {
            return Err(unsupported(
                format!(
                    "`include` takes only \"{INCLUDE_LOGPROBS}\" here: a response carries its text, usage and, asked, its logprobs"
                ),
                "include",
            ));
        }
    }
    Ok(())
}

/// The `include` value that asks for the output text's logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// Maps `include: ["message.output_text.logprobs"]` and `top_logprobs`
/// onto chat's `logprobs` and `top_logprobs`; `top_logprobs` alone asks
/// for nothing (it is echoed back).
fn logprobs(body: &mut Map<String, Value>, chat: &mut Map<String, Value>, echo: &mut Echo) {
    let asked = body
        .remove("include")
        .and_then(|i| i.as_array().map(|i| !i.is_empty()))
        .unwrap_or(false);
    let top = body.remove("top_logprobs").filter(|v| !v.is_null());
    if let Some(top) = &top {
        echo.insert("top_logprobs".into(), top.clone());
    }
    if asked {
        chat.insert("logprobs".into(), Value::Bool(true));
        if let Some(top) = top {
            chat.insert("top_logprobs".into(), top);
        }
    }
}

/// One `input` list item: a message (`type` absent or `"message"`) with a
/// role and text content.
fn input_message(item: Value) -> Result<Value, Refused> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    if kind != "message" {
        return Err(unsupported(
            format!(
                "`input` items of type {kind:?} are not supported: only messages with text content"
            ),
            "input",
        ));
    }
    let role = match item.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant" | "system")) => role,
        // OpenAI's newer name for the system role.
        Some("developer") => "system",
        _ => {
            return Err(invalid(
                "each `input` message needs a `role`: user, assistant, system or developer",
                "input",
            ));
        }
    };
    let content = match item.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(content_part)
            .collect::<Result<Vec<_>, _>>()?
            .concat(),
        _ => {
            return Err(invalid(
                "each `input` message needs `content`: a string or a list of text parts",
                "input",
            ));
        }
    };
    Ok(json!({"role": role, "content": content}))
}

fn content_part(part: &Value) -> Result<&str, Refused> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
    match (kind, part.get("text").and_then(Value::as_str)) {
        ("input_text" | "output_text" | "text", Some(text)) => Ok(text),
        ("input_image", _) => Err(unsupported(
            "`input_image` content is not supported: this gateway's models read text",
            "input",
        )),
        ("input_file", _) => Err(unsupported(
            "`input_file` content is not supported: put the file's text in an `input_text` part",
            "input",
        )),
        ("input_audio", _) => Err(unsupported(
            "`input_audio` content is not supported: this gateway's models read text",
            "input",
        )),
        _ => Err(invalid(
            format!("content parts of type {kind:?} are not supported: use `input_text`"),
            "input",
        )),
    }
}

/// `text.format` (flat: `{"type": "json_schema", "name", "schema",
/// "strict"}`) as chat's `response_format` (nested under `json_schema`).
fn response_format(format: &Value) -> Result<Value, Refused> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") | Some("json_object") => Ok(json!({"type": format["type"]})),
        Some("json_schema") => {
            let mut schema = format.as_object().cloned().unwrap_or_default();
            schema.remove("type");
            Ok(json!({"type": "json_schema", "json_schema": schema}))
        }
        _ => Err(invalid(
            "`text.format` must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"name\", \"schema\", \"strict\"}",
            "text",
        )),
    }
}

/// A response's `usage`.
fn usage(input: u64, output: u64) -> Value {
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
    })
}

/// The assistant's message, as an output item.
fn message(id: &str, text: Option<(&str, Option<&[Logprob]>)>, status: &str) -> Value {
    let content = match text {
        Some((text, logprobs)) => vec![output_text(text, logprobs)],
        None => Vec::new(),
    };
    json!({
        "id": format!("msg_{id}"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

/// The message's text part, with its tokens' logprobs when asked for.
fn output_text(text: &str, logprobs: Option<&[Logprob]>) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs_list(logprobs)})
}

fn logprobs_list(logprobs: Option<&[Logprob]>) -> Value {
    logprobs
        .unwrap_or_default()
        .iter()
        .map(super::logprobs::token)
        .collect()
}

/// What the answer to a finished generation says about it: `completed`,
/// or `incomplete` when it ran out of `max_output_tokens`.
fn ending(reason: FinishReason) -> (&'static str, Value) {
    match reason {
        FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        FinishReason::Stop | FinishReason::Eos => ("completed", Value::Null),
    }
}

/// A response object: the echoed request, its status and output.
fn response(id: &str, created: i64, model: &str, echo: &Echo, status: &str) -> Value {
    let mut body = json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": created,
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "metadata": {},
        "model": model,
        "output": [],
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": null,
        "user": null,
    });
    for (key, value) in echo {
        body[key] = value.clone();
    }
    body
}

/// The answer to a Responses request: one assistant message.
pub fn body(id: &str, created: i64, model: &str, echo: &Echo, generation: &Generation) -> Value {
    let (status, details) = ending(generation.finish_reason);
    let mut body = response(id, created, model, echo, status);
    body["incomplete_details"] = details;
    body["output"] = json!([message(
        id,
        Some((&generation.text, generation.logprobs.as_deref())),
        status
    )]);
    body["usage"] = usage(generation.prompt_tokens, generation.completion_tokens);
    body
}

/// The events of one streamed response, numbered as they are made.
pub struct Events {
    id: String,
    created: i64,
    model: String,
    echo: Echo,
    sequence: u64,
    text: String,
    /// The logprobs streamed so far (None: not asked for).
    logprobs: Option<Vec<Logprob>>,
}

impl Events {
    /// `logprobs`: the request asked for the text's logprobs.
    pub fn new(id: &str, created: i64, model: &str, echo: Echo, logprobs: bool) -> Events {
        Events {
            id: id.to_string(),
            created,
            model: model.to_string(),
            echo,
            sequence: 0,
            text: String::new(),
            logprobs: logprobs.then(Vec::new),
        }
    }

    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = kind.into();
        fields["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        fields
    }

    fn part(&self) -> Value {
        json!({"item_id": format!("msg_{}", self.id), "output_index": 0, "content_index": 0})
    }

    /// `response.created` and `response.in_progress`: the job has started.
    pub fn started(&mut self) -> Vec<Value> {
        let response = response(
            &self.id,
            self.created,
            &self.model,
            &self.echo,
            "in_progress",
        );
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// The message and its text part open: before the first delta.
    pub fn opened(&mut self) -> Vec<Value> {
        let item = message(&self.id, None, "in_progress");
        let mut part = self.part();
        part["part"] = output_text("", None);
        vec![
            self.event(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ),
            self.event("response.content_part.added", part),
        ]
    }

    /// New text, with the logprobs of its tokens when they were asked for.
    pub fn delta(&mut self, text: &str, logprobs: &[Logprob]) -> Value {
        self.text.push_str(text);
        if let Some(all) = &mut self.logprobs {
            all.extend_from_slice(logprobs);
        }
        let mut fields = self.part();
        fields["delta"] = text.into();
        fields["logprobs"] = logprobs_list(Some(logprobs));
        self.event("response.output_text.delta", fields)
    }

    /// The text, part and message are done; the response completes (or is
    /// incomplete) with its usage.
    pub fn finished(&mut self, reason: FinishReason, input: u64, output: u64) -> Vec<Value> {
        let generation = Generation {
            text: self.text.clone(),
            finish_reason: reason,
            prompt_tokens: input,
            completion_tokens: output,
            logprobs: self.logprobs.clone(),
        };
        let response = body(&self.id, self.created, &self.model, &self.echo, &generation);
        let item = response["output"][0].clone();
        let mut done = self.part();
        done["text"] = generation.text.as_str().into();
        done["logprobs"] = logprobs_list(generation.logprobs.as_deref());
        let mut part = self.part();
        part["part"] = output_text(&generation.text, generation.logprobs.as_deref());
        let last = if response["status"] == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", part),
            self.event(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ),
            self.event(last, json!({"response": response})),
        ]
    }

    /// `response.failed`, carrying the error's code and message.
    pub fn failed(&mut self, code: &str, message: &str) -> Value {
        let mut response = response(&self.id, self.created, &self.model, &self.echo, "failed");
        response["error"] = json!({"code": code, "message": message});
        self.event("response.failed", json!({"response": response}))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn read(body: Value) -> Result<(Map<String, Value>, Echo), Refused> {
        let Value::Object(mut body) = body else {
            panic!()
        };
        chat_body(&mut body)
    }

    #[test]
    fn input_and_instructions_become_chat_messages_with_their_parameters() {
        let (chat, echo) = read(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Answer in French."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "!"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Salut"}]},
                {"role": "user", "content": "Again"}
            ],
            "max_output_tokens": 8,
            "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
            "metadata": {"k": "v"}
        }))
        .unwrap();
        assert_eq!(
            Value::Object(chat),
            json!({
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "system", "content": "Answer in French."},
                    {"role": "user", "content": "Hi!"},
                    {"role": "assistant", "content": "Salut"},
                    {"role": "user", "content": "Again"}
                ],
                "max_completion_tokens": 8,
                "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}}
            })
        );
        assert_eq!(echo["instructions"], "Be brief.");
        assert_eq!(echo["max_output_tokens"], 8);
        assert_eq!(echo["metadata"], json!({"k": "v"}));
        let (chat, _) = read(json!({"input": "Hello"})).unwrap();
        assert_eq!(
            chat["messages"],
            json!([{"role": "user", "content": "Hello"}])
        );
    }

    /// Each field a text model cannot serve is refused naming it, with
    /// OpenAI's error shape.
    #[test]
    fn what_is_not_text_generation_is_refused_naming_the_field() {
        let table = [
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools",
            ),
            (
                json!({"input": "x", "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                json!({"input": "x", "conversation": "conv_1"}),
                "conversation",
            ),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "prompt": {"id": "p"}}), "prompt"),
            (
                json!({"input": "x", "include": ["file_search_call.results"]}),
                "include",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
                "input",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "input",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]}),
                "input",
            ),
        ];
        for (body, param) in table {
            let e = read(body.clone()).unwrap_err();
            assert_eq!(
                (e.code, e.param),
                ("unsupported_parameter", param),
                "{body}"
            );
            assert!(
                e.message.contains(param.split('_').next().unwrap()),
                "{}",
                e.message
            );
        }
        for (body, param) in [
            (json!({}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": [{"content": "x"}]}), "input"),
            (
                json!({"input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (json!({"input": "x", "instructions": 3}), "instructions"),
            (
                json!({"input": "x", "text": {"format": {"type": "xml"}}}),
                "text",
            ),
        ] {
            let e = read(body.clone()).unwrap_err();
            assert_eq!(e.param, param, "{body}");
        }
        // Empty tools, tool_choice "auto" and null stored state are what a
        // plain request may carry.
        read(json!({"input": "x", "tools": [], "tool_choice": "auto", "previous_response_id": null, "store": true}))
            .unwrap();
    }

    #[test]
    fn an_answer_is_one_assistant_message_with_usage() {
        let g = Generation {
            text: "Hi".into(),
            finish_reason: FinishReason::Length,
            prompt_tokens: 3,
            completion_tokens: 2,
            logprobs: None,
        };
        let mut echo = Echo::new();
        echo.insert("max_output_tokens".into(), 2.into());
        let b = body("x", 7, "m", &echo, &g);
        assert_eq!(b["id"], "resp_x");
        assert_eq!(b["object"], "response");
        assert_eq!(b["status"], "incomplete");
        assert_eq!(
            b["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(b["max_output_tokens"], 2);
        assert_eq!(b["output"][0]["role"], "assistant");
        assert_eq!(
            b["output"][0]["content"][0],
            json!({"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []})
        );
        assert_eq!(b["usage"]["total_tokens"], 5);
    }

    /// Asked for, each delta carries its tokens' logprobs and the done
    /// events the whole list.
    #[test]
    fn a_streamed_response_carries_its_logprobs_delta_by_delta() {
        let lp = |id: u32, token: &str| Logprob {
            id,
            token: token.into(),
            bytes: token.as_bytes().to_vec(),
            logprob: -1.0,
            top_logprobs: Vec::new(),
        };
        let mut events = Events::new("x", 7, "m", Echo::new(), true);
        events.started();
        events.opened();
        let first = events.delta("He", &[lp(1, "He")]);
        assert_eq!(first["logprobs"][0]["token"], "He");
        events.delta("llo", &[lp(2, "ll"), lp(3, "o")]);
        let done = events.finished(FinishReason::Eos, 4, 3);
        assert_eq!(done[0]["type"], "response.output_text.done");
        let tokens = |list: &Value| -> Vec<String> {
            list.as_array()
                .unwrap()
                .iter()
                .map(|l| l["token"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(tokens(&done[0]["logprobs"]), ["He", "ll", "o"]);
        let text = &done[3]["response"]["output"][0]["content"][0];
        assert_eq!(tokens(&text["logprobs"]), ["He", "ll", "o"]);
    }

    #[test]
    fn a_stream_is_numbered_events_ending_in_the_whole_response() {
        let mut events = Events::new("x", 7, "m", Echo::new(), false);
        let mut all = events.started();
        all.extend(events.opened());
        all.push(events.delta("He", &[]));
        all.push(events.delta("llo", &[]));
        all.extend(events.finished(FinishReason::Eos, 4, 2));
        let kinds: Vec<&str> = all.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, e) in all.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
        let done = all.last().unwrap();
        assert_eq!(done["response"]["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(done["response"]["usage"]["total_tokens"], 6);
        assert_eq!(
            events.failed("internal", "boom")["response"]["error"]["code"],
            "internal"
        );
    }
}
