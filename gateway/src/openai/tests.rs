//! The endpoints' requests and answers against OpenAI's shapes.

#![allow(clippy::unwrap_used)]
use super::embeddings::embeddings_body;
use super::rerank::rerank_body;
use super::*;
use base64::Engine;
use serde_json::{Value, json};
use sluice_schemas::TopLogprob;
use sluice_schemas::{FinishReason, Generation, Item, Logprob, Task};

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
        audio: None,
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
    let e = read(r#"{"custom_id":"a","method":"POST","url":"/v1/images","body":{}}"#).unwrap_err();
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

/// Each endpoint answers from the output its task writes, and an output of
/// another shape is an error naming both, not a wrong answer.
#[test]
fn each_endpoint_answers_from_its_own_kind_of_output() {
    let vectors = [0.6f32, 0.8, 1.0, 0.0];
    let scores = [0.25f32, 0.75];
    let labels =
        [json!([{"label": "pos", "id": 1, "score": 0.9}, {"label": "neg", "id": 0, "score": 0.1}])];
    let generation = [
        json!({"text": "hi", "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 1}),
    ];
    let table: [(&str, &str, Share<'_>, Result<&str, &str>); 7] = [
        (
            "/v1/embeddings",
            r#"{"model":"m","input":["a","b"]}"#,
            Share::Vectors {
                dim: 2,
                values: &vectors,
            },
            Ok("list"),
        ),
        (
            "/v1/rerank",
            r#"{"model":"m","query":"q","documents":["a","b"]}"#,
            Share::Scores(&scores),
            Ok("list"),
        ),
        (
            "/v1/classify",
            r#"{"model":"m","input":"a"}"#,
            Share::Lines(&labels),
            Ok("list"),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#,
            Share::Lines(&generation),
            Ok("chat.completion"),
        ),
        (
            "/v1/embeddings",
            r#"{"model":"m","input":"a"}"#,
            Share::Scores(&scores),
            Err("the job's output is scores, which /v1/embeddings does not answer with"),
        ),
        (
            "/v1/classify",
            r#"{"model":"m","input":"a"}"#,
            Share::Lines(&generation),
            Err("reading a text's labels"),
        ),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"a"}"#,
            Share::Vectors {
                dim: 2,
                values: &vectors,
            },
            Err("the job's output is vectors, which /v1/completions does not answer with"),
        ),
    ];
    for (url, body, share, expected) in table {
        let model = Endpoint::parse(url).unwrap().task().default_model();
        let body = body.replace(r#""m""#, &format!("{model:?}"));
        let answer = answer_body(&request(url, &body), "id", model, 1, share, 5);
        match (answer, expected) {
            (Ok(body), Ok(object)) => assert_eq!(body["object"], object, "{url}: {body}"),
            (Err(e), Err(start)) => assert!(e.starts_with(start), "{url}: {e}"),
            (answer, expected) => panic!("{url}: {answer:?}, expected {expected:?}"),
        }
    }
}
