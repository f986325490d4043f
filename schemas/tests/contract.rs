//! Keeps the JSON Schema files and the serde types in agreement: every example in
//! a schema decodes, every Rust value validates, round trips are lossless, and
//! invalid jobs are refused by both sides.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test reports by panicking

use std::collections::BTreeMap;

use jsonschema::{Registry, Validator};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sluice_schemas::*;
use time::macros::datetime;

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// A validator for `schema`, with the other schema files registered so that
/// cross-file `$ref`s resolve offline.
fn validator(schema: &str) -> Validator {
    let result = parse(json_schema::RESULT);
    let registry = Registry::new()
        .add("https://sluice.dev/schemas/v1/result.schema.json", result)
        .unwrap()
        .prepare()
        .unwrap();
    jsonschema::options()
        .with_registry(&registry)
        .should_validate_formats(true)
        .build(&parse(schema))
        .unwrap()
}

fn assert_valid(v: &Validator, instance: &Value) {
    let errors: Vec<String> = v.iter_errors(instance).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{instance} is invalid: {errors:?}");
}

/// Each example in the schema validates, decodes into `T`, and comes back
/// from `T` as the same JSON.
fn check_examples<T: Serialize + DeserializeOwned + std::fmt::Debug>(schema: &str) {
    let v = validator(schema);
    let examples = parse(schema)["examples"].as_array().cloned().unwrap();
    assert!(!examples.is_empty(), "every schema file carries an example");
    for example in examples {
        assert_valid(&v, &example);
        let decoded: T = serde_json::from_value(example.clone())
            .unwrap_or_else(|e| panic!("example {example} does not decode: {e}"));
        let back = serde_json::to_value(&decoded).unwrap();
        assert_eq!(back, example, "round trip changed the example");
        assert_valid(&v, &back);
    }
}

#[test]
fn schema_examples_validate_decode_and_round_trip() {
    check_examples::<Job>(json_schema::JOB);
    check_examples::<JobResult>(json_schema::RESULT);
    check_examples::<StatusRecord>(json_schema::STATUS);
    check_examples::<DeadLetter>(json_schema::DEAD_LETTER);
    check_examples::<StreamChunk>(json_schema::STREAM_CHUNK);
}

#[test]
fn job_examples_pass_the_strict_decoder() {
    for example in parse(json_schema::JOB)["examples"].as_array().unwrap() {
        let payload = serde_json::to_vec(example).unwrap();
        Job::decode(&payload).unwrap();
    }
}

fn s3_output() -> S3Output {
    S3Output {
        bucket: "sluice".into(),
        key: "outputs/job-1.npy".into(),
        bytes: 1664,
        sha256: "ab".repeat(32),
        format: "npy".into(),
        shape: vec![4, 384],
        url: Some("http://127.0.0.1:8333/sluice/outputs/job-1.npy?X-Amz-Signature=1".into()),
    }
}

fn sample_job() -> Job {
    Job {
        version: VERSION,
        id: "job-1".into(),
        task: "embed".into(),
        model: "all-minilm-l6-v2".into(),
        inputs: vec![
            Input::Url {
                url: "https://s3.example/b/k.jsonl?X-Amz-Signature=1".into(),
                format: InputFormat::Jsonl,
                object: Some(ObjectRef {
                    bucket: "b".into(),
                    key: "k.jsonl".into(),
                }),
            },
            Input::Inline {
                items: vec![json!("a text"), json!({"text": "another"})],
            },
        ],
        parameters: Parameters {
            encoder: EncoderParameters {
                truncate: Some(false),
            },
            embed: EmbedParameters {
                normalize: Some(true),
                prompt_name: Some("query".into()),
            },
            ..Parameters::default()
        },
        token_estimate: Some(99),
        deadline: Some(datetime!(2026-11-29 18:00:00.5 UTC)),
        submitted_at: Some(datetime!(2026-11-29 17:00:00 UTC)),
        output: OutputOptions {
            presign_get_secs: Some(60),
            always_s3: Some(true),
            item_tokens: Some(true),
            stream: None,
        },
    }
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    v: &Validator,
    value: &T,
) {
    let json = serde_json::to_value(value).unwrap();
    assert_valid(v, &json);
    let back: T = serde_json::from_value(json).unwrap();
    assert_eq!(&back, value);
}

#[test]
fn every_rust_value_validates_and_round_trips() {
    let job = validator(json_schema::JOB);
    round_trip(&job, &sample_job());
    let minimal = Job {
        inputs: vec![Input::Inline {
            items: vec![json!("x")],
        }],
        parameters: Parameters::default(),
        token_estimate: None,
        deadline: None,
        submitted_at: None,
        output: OutputOptions::default(),
        ..sample_job()
    };
    round_trip(&job, &minimal);

    let result = validator(json_schema::RESULT);
    let ok_s3 = JobResult {
        version: VERSION,
        job_id: Some("job-1".into()),
        outcome: Outcome::Ok {
            output: Output::S3(s3_output()),
        },
        usage: Usage {
            items: 4,
            tokens: 40,
            truncated_items: 1,
            completion_tokens: 0,
            item_tokens: Vec::new(),
            audio_ms: 0,
        },
        timings_ms: Timings {
            queue: Some(1.5),
            fetch: Some(2.0),
            tokenize: Some(0.25),
            batch_wait: Some(3.0),
            inference: Some(10.0),
            write: Some(4.0),
            total: Some(21.0),
        },
        attempt: 2,
        served_by: Some(ServedBy {
            model: "all-minilm-l6-v2".into(),
            forward: "sluice-avx2".into(),
        }),
        finished_at: datetime!(2026-11-29 17:00:01.123 UTC),
    };
    round_trip(&result, &ok_s3);
    let ok_inline = JobResult {
        outcome: Outcome::Ok {
            output: Output::embeddings(vec![vec![0.5, -0.25], vec![1.0, 0.0]]),
        },
        timings_ms: Timings::default(),
        ..ok_s3.clone()
    };
    round_trip(&result, &ok_inline);
    let ok_generated = JobResult {
        outcome: Outcome::Ok {
            output: Output::generations(vec![
                Generation {
                    text: "Paris.".into(),
                    finish_reason: FinishReason::Eos,
                    prompt_tokens: 31,
                    completion_tokens: 3,
                    logprobs: None,
                },
                Generation {
                    text: "Once".into(),
                    finish_reason: FinishReason::Length,
                    prompt_tokens: 4,
                    completion_tokens: 1,
                    logprobs: Some(vec![Logprob {
                        id: 7454,
                        token: "Once".into(),
                        bytes: b"Once".to_vec(),
                        logprob: -0.25,
                        top_logprobs: vec![
                            TopLogprob {
                                id: 7454,
                                token: "Once".into(),
                                bytes: b"Once".to_vec(),
                                logprob: -0.25,
                            },
                            TopLogprob {
                                id: 504,
                                token: "\u{FFFD}".into(),
                                bytes: vec![0xF0, 0x9F],
                                logprob: Logprob::FLOOR,
                            },
                        ],
                    }]),
                },
            ]),
        },
        usage: Usage {
            items: 2,
            tokens: 35,
            truncated_items: 0,
            completion_tokens: 4,
            item_tokens: vec![20, 15],
            audio_ms: 0,
        },
        ..ok_s3.clone()
    };
    round_trip(&result, &ok_generated);
    for reason in [FinishReason::Length, FinishReason::Stop, FinishReason::Eos] {
        assert_eq!(
            serde_json::to_value(reason).unwrap(),
            json!(reason.as_str())
        );
    }
    let jsonl_in_s3 = JobResult {
        outcome: Outcome::Ok {
            output: Output::S3(S3Output {
                key: "outputs/job-1.jsonl".into(),
                format: "jsonl".into(),
                shape: Vec::new(),
                ..s3_output()
            }),
        },
        ..ok_generated.clone()
    };
    round_trip(&result, &jsonl_in_s3);
    let generate_job = Job {
        task: "generate".into(),
        model: "smollm2-135m-instruct".into(),
        inputs: vec![Input::Inline {
            items: vec![
                json!("raw prompt"),
                json!({"prompt": "p", "max_new_tokens": 3, "stop": ["."]}),
                json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_p": 0.9, "seed": 1, "logprobs": 5}),
            ],
        }],
        parameters: Parameters {
            generate: GenerateParameters {
                max_new_tokens: Some(16),
                logprobs: Some(0),
                temperature: Some(0.0),
                top_p: Some(1.0),
                seed: Some(42),
                stop: Some(vec!["\n".into()]),
                ..GenerateParameters::default()
            },
            ..Parameters::default()
        },
        ..sample_job()
    };
    round_trip(&job, &generate_job);
    Job::decode(&generate_job.to_bytes()).unwrap();
    // More alternatives than OpenAI lists are refused by both sides.
    let too_many = Job {
        parameters: Parameters {
            generate: GenerateParameters {
                logprobs: Some(21),
                ..GenerateParameters::default()
            },
            ..Parameters::default()
        },
        ..generate_job.clone()
    };
    assert!(!job.is_valid(&serde_json::to_value(&too_many).unwrap()));
    let err = Job::decode(&too_many.to_bytes()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidParameters);
    assert!(
        err.message.contains("logprobs is 21; at most 20"),
        "{}",
        err.message
    );
    let embed_logprobs = Job {
        parameters: Parameters {
            generate: GenerateParameters {
                logprobs: Some(1),
                ..GenerateParameters::default()
            },
            ..Parameters::default()
        },
        ..sample_job()
    };
    let err = Job::decode(&embed_logprobs.to_bytes()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidParameters, "{}", err.message);
    for code in ErrorCode::ALL {
        let failed = JobResult {
            outcome: Outcome::Error {
                error: ErrorInfo::new(code, format!("{code} happened")),
            },
            usage: Usage::default(),
            ..ok_s3.clone()
        };
        round_trip(&result, &failed);
    }
    // A message answered without an id (neither the body nor Nats-Msg-Id held one).
    let anonymous = JobResult {
        job_id: None,
        outcome: Outcome::Error {
            error: ErrorInfo::new(ErrorCode::MalformedMessage, "not JSON"),
        },
        usage: Usage::default(),
        served_by: None,
        ..ok_s3.clone()
    };
    round_trip(&result, &anonymous);
    assert_eq!(
        serde_json::to_value(&anonymous).unwrap()["job_id"],
        Value::Null
    );

    let status = validator(json_schema::STATUS);
    let record = StatusRecord {
        version: VERSION,
        job_id: "job-1".into(),
        state: JobState::Done,
        updated_at: datetime!(2026-11-29 17:00:01 UTC),
        attempts: 1,
        stream_sequence: Some(5),
        output: Some(s3_output()),
        error: None,
        replays: 0,
        usage: Some(Usage {
            items: 2,
            tokens: 35,
            truncated_items: 0,
            completion_tokens: 0,
            item_tokens: vec![20, 15],
            audio_ms: 0,
        }),
        deadline: None,
        answered: vec![],
    };
    round_trip(&status, &record);
    let queued = StatusRecord {
        state: JobState::Queued,
        output: None,
        usage: None,
        deadline: Some(datetime!(2026-11-29 17:00:03 UTC)),
        ..record.clone()
    };
    round_trip(&status, &queued);
    // Read after its deadline, a queued record is expired, and valid as such.
    let expired = queued.clone().as_of(datetime!(2026-11-29 17:00:03 UTC));
    assert_eq!(expired.state, JobState::Expired);
    assert_eq!(
        expired.error.as_ref().unwrap().code,
        ErrorCode::DeadlineExceeded
    );
    round_trip(&status, &expired);
    assert_eq!(
        queued.clone().as_of(datetime!(2026-11-29 17:00:02 UTC)),
        queued,
        "before its deadline it is as stored"
    );
    assert_eq!(record.clone().as_of(datetime!(2099-01-01 0:00 UTC)), record);
    let failed = StatusRecord {
        state: JobState::Failed,
        output: None,
        error: Some(ErrorInfo::new(ErrorCode::InputTooLarge, "too big")),
        ..record.clone()
    };
    round_trip(&status, &failed);

    let dlq = validator(json_schema::DEAD_LETTER);
    let letter = DeadLetter {
        version: VERSION,
        job_id: None,
        error: ErrorInfo::new(ErrorCode::MalformedMessage, "not JSON"),
        attempts: 1,
        original_subject: "sluice.jobs.embed".into(),
        stream_sequence: 9,
        dead_lettered_at: datetime!(2026-11-29 17:00:02 UTC),
        headers: BTreeMap::from([("Nats-Msg-Id".to_string(), vec!["x".to_string()])]),
        payload_base64: "bm90IGpzb24=".into(),
        payload_object: None,
    };
    round_trip(&dlq, &letter);
    let by_reference = DeadLetter {
        payload_base64: String::new(),
        payload_object: Some(ObjectRef {
            bucket: "sluice".into(),
            key: "outputs/dead-letters/9.job".into(),
        }),
        ..letter
    };
    round_trip(&dlq, &by_reference);
}

#[test]
fn error_codes_in_schema_match_rust() {
    let result = parse(json_schema::RESULT);
    let in_schema: Vec<&str> = result["$defs"]["error"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let in_rust: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(in_schema, in_rust);
    for code in ErrorCode::ALL {
        assert_eq!(serde_json::to_value(code).unwrap(), json!(code.as_str()));
    }
}

#[test]
fn tasks_in_schema_match_rust() {
    let job = parse(json_schema::JOB);
    let in_schema: Vec<&str> = job["properties"]["task"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(in_schema, Task::ALL.map(Task::as_str));
}

/// Invalid jobs: each is refused by the JSON Schema and by the Rust decoder,
/// with the expected code and a message that names the problem.
#[test]
fn invalid_jobs_are_refused_by_schema_and_decoder() {
    let v = validator(json_schema::JOB);
    let good = serde_json::to_value(sample_job()).unwrap();
    let with = |path: &[&str], value: Value| {
        let mut job = good.clone();
        let mut at = &mut job;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value;
        job
    };
    let without = |key: &str| {
        let mut job = good.clone();
        job.as_object_mut().unwrap().remove(key);
        job
    };
    let cases: Vec<(&str, Value, ErrorCode, &str)> = vec![
        (
            "missing id",
            without("id"),
            ErrorCode::SchemaViolation,
            "missing field `id`",
        ),
        (
            "missing version",
            without("version"),
            ErrorCode::SchemaViolation,
            "version",
        ),
        (
            "version 2",
            with(&["version"], json!(2)),
            ErrorCode::UnsupportedVersion,
            "version 2",
        ),
        (
            "version as string",
            with(&["version"], json!("1")),
            ErrorCode::SchemaViolation,
            "version",
        ),
        (
            "unknown task",
            with(&["task"], json!("summarize")),
            ErrorCode::UnknownTask,
            "unknown task \"summarize\"",
        ),
        (
            "id with a dot",
            with(&["id"], json!("a.b")),
            ErrorCode::SchemaViolation,
            "invalid job id",
        ),
        (
            "empty id",
            with(&["id"], json!("")),
            ErrorCode::SchemaViolation,
            "invalid job id",
        ),
        (
            "empty model",
            with(&["model"], json!("")),
            ErrorCode::SchemaViolation,
            "model",
        ),
        (
            "no inputs",
            with(&["inputs"], json!([])),
            ErrorCode::SchemaViolation,
            "inputs",
        ),
        (
            "ftp url",
            with(
                &["inputs"],
                json!([{"type": "url", "url": "ftp://x/y", "format": "jsonl"}]),
            ),
            ErrorCode::SchemaViolation,
            "http",
        ),
        (
            "unknown input format",
            with(
                &["inputs"],
                json!([{"type": "url", "url": "http://x/y", "format": "csv"}]),
            ),
            ErrorCode::SchemaViolation,
            "csv",
        ),
        (
            "unknown input type",
            with(&["inputs"], json!([{"type": "s3", "bucket": "b"}])),
            ErrorCode::SchemaViolation,
            "s3",
        ),
        (
            "empty inline list",
            with(&["inputs"], json!([{"type": "inline", "items": []}])),
            ErrorCode::SchemaViolation,
            "items",
        ),
        (
            "unknown parameter",
            with(&["parameters", "truncat"], json!(false)),
            ErrorCode::SchemaViolation,
            "truncat",
        ),
        (
            "unknown field",
            with(&["priority"], json!(3)),
            ErrorCode::SchemaViolation,
            "priority",
        ),
        (
            "deadline not a date",
            with(&["deadline"], json!("tomorrow")),
            ErrorCode::SchemaViolation,
            "deadline",
        ),
        (
            "negative token estimate",
            with(&["token_estimate"], json!(-5)),
            ErrorCode::SchemaViolation,
            "token_estimate",
        ),
    ];
    for (name, job, code, needle) in cases {
        assert!(!v.is_valid(&job), "{name}: the schema accepted {job}");
        let err = Job::decode(&serde_json::to_vec(&job).unwrap())
            .expect_err(&format!("{name}: the decoder accepted {job}"));
        assert_eq!(err.code, code, "{name}: {}", err.message);
        assert!(
            err.message.contains(needle),
            "{name}: message {:?} does not mention {needle:?}",
            err.message
        );
        assert!(!err.retryable, "{name}: a bad message is never retryable");
    }

    for (name, payload, needle) in [
        ("not JSON", &b"{\"version\": 1,"[..], "not valid JSON"),
        (
            "not UTF-8",
            &b"{\"id\": \"\xff\xfe\"}"[..],
            "not valid UTF-8 (first bad byte at offset 8)",
        ),
    ] {
        let err = Job::decode(payload).unwrap_err();
        assert_eq!(err.code, ErrorCode::MalformedMessage, "{name}");
        assert!(err.message.contains(needle), "{name}: {}", err.message);
    }
    let err = Job::decode(b"[1, 2]").unwrap_err();
    assert_eq!(err.code, ErrorCode::SchemaViolation);
    assert!(err.message.contains("JSON object"), "{}", err.message);
}

#[test]
fn items_are_read_with_clear_errors() {
    assert_eq!(
        Item::from_value(Task::Embed, json!("hi")),
        Ok(Item::Text("hi".into()))
    );
    assert_eq!(
        Item::from_value(Task::Embed, json!({"text": "hi"})),
        Ok(Item::Text("hi".into()))
    );
    let err = Item::from_value(Task::Embed, json!(42)).unwrap_err();
    assert!(err.contains("found a number"), "{err}");
    let err = Item::from_value(Task::Embed, json!({"text": "a", "extra": 1})).unwrap_err();
    assert!(err.contains("extra"), "{err}");
    let err = Item::from_value(Task::Embed, json!({"txt": "a"})).unwrap_err();
    assert!(err.contains("{\"text\""), "{err}");
}

/// The publisher documentation lists every error code with its retryability.
#[test]
fn publisher_readme_lists_every_error_code() {
    let readme = include_str!("../README.md");
    for code in ErrorCode::ALL {
        let row = format!(
            "| `{}` | {} |",
            code.as_str(),
            if code.is_retryable() { "yes" } else { "no" }
        );
        assert!(
            readme.contains(&row),
            "schemas/README.md lacks the row {row}"
        );
    }
}

/// Generate parameters out of range are refused by the schema and by the
/// decoder (`invalid_parameters`, naming the parameter); a parameter of the
/// other task is refused by the decoder.
#[test]
fn generate_parameters_are_checked() {
    let v = validator(json_schema::JOB);
    let generate = |parameters: Value| {
        json!({
            "version": 1, "id": "g-1", "task": "generate", "model": "m",
            "inputs": [{"type": "inline", "items": ["hi"]}],
            "parameters": parameters,
        })
    };
    let out_of_range = [
        (json!({"max_new_tokens": 0}), "max_new_tokens"),
        (json!({"temperature": -0.5}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"stop": [""]}), "stop[0] is empty"),
        (
            json!({"stop": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}),
            "at most 8",
        ),
        (json!({"stop": ["x".repeat(257)]}), "stop[0] is 257 bytes"),
    ];
    for (parameters, needle) in out_of_range {
        let job = generate(parameters.clone());
        assert!(!v.is_valid(&job), "the schema accepted {parameters}");
        let err = Job::decode(&serde_json::to_vec(&job).unwrap()).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParameters, "{}", err.message);
        assert!(
            err.message.contains(needle),
            "{parameters}: {}",
            err.message
        );
    }
    assert!(
        Job::decode(
            &serde_json::to_vec(&generate(
                json!({"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 1})
            ))
            .unwrap()
        )
        .is_ok()
    );

    let err = Job::decode(&serde_json::to_vec(&generate(json!({"truncate": false}))).unwrap())
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidParameters);
    assert!(
        err.message
            .contains("`truncate` applies to the embed, rerank and classify tasks only"),
        "{}",
        err.message
    );
    let mut embed = generate(json!({"temperature": 0.7, "seed": 3}));
    embed["task"] = json!("embed");
    let err = Job::decode(&serde_json::to_vec(&embed).unwrap()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidParameters);
    assert!(
        err.message
            .contains("`temperature` applies to the generate task only")
            && err.message.contains("temperature, seed"),
        "{}",
        err.message
    );
}

/// `parameters.prompt_name` is an embed parameter of 1 to 64 characters:
/// the schema and the decoder agree on its bounds, and a generate job is
/// refused it by name.
#[test]
fn prompt_name_is_checked() {
    let v = validator(json_schema::JOB);
    let job = |task: &str, parameters: Value| {
        json!({
            "version": 1, "id": "p-1", "task": task, "model": "m",
            "inputs": [{"type": "inline", "items": ["hi"]}],
            "parameters": parameters,
        })
    };
    let ok = job("embed", json!({"prompt_name": "query"}));
    assert_valid(&v, &ok);
    let decoded = Job::decode(&serde_json::to_vec(&ok).unwrap()).unwrap();
    assert_eq!(
        decoded.job.parameters.embed.prompt_name.as_deref(),
        Some("query")
    );
    for name in [String::new(), "q".repeat(MAX_PROMPT_NAME + 1)] {
        let bad = job("embed", json!({ "prompt_name": name }));
        assert!(!v.is_valid(&bad), "the schema accepted {name:?}");
        let err = Job::decode(&serde_json::to_vec(&bad).unwrap()).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParameters, "{}", err.message);
        assert!(
            err.message
                .contains("parameters.prompt_name must be 1 to 64 characters"),
            "{}",
            err.message
        );
    }
    let err = Job::decode(
        &serde_json::to_vec(&job("generate", json!({"prompt_name": "query"}))).unwrap(),
    )
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidParameters);
    assert!(
        err.message
            .contains("`prompt_name` applies to the embed task only"),
        "{}",
        err.message
    );
}

/// `output.stream` is a generate option: the decoder refuses it on an embed
/// job, saying so, and takes it on a generate job; stream messages validate
/// and round-trip, and the last one carries its finish reason and usage.
#[test]
fn streaming_is_for_generate_jobs_and_its_messages_round_trip() {
    let job = |task: &str| {
        json!({
            "version": 1, "id": "s-1", "task": task, "model": "m",
            "inputs": [{"type": "inline", "items": ["hi"]}],
            "output": {"stream": true},
        })
    };
    let err = Job::decode(&serde_json::to_vec(&job("embed")).unwrap()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidParameters);
    assert!(
        err.message
            .contains("output.stream applies to generate jobs only"),
        "{}",
        err.message
    );
    let valid = Job::decode(&serde_json::to_vec(&job("generate")).unwrap()).unwrap();
    assert!(valid.job.output.stream());
    assert_valid(&validator(json_schema::JOB), &job("generate"));

    let v = validator(json_schema::STREAM_CHUNK);
    let first = StreamChunk {
        version: VERSION,
        job_id: "s-1".into(),
        item: 0,
        attempt: 1,
        seq: 0,
        text: "Pa".into(),
        logprobs: None,
        queue_ms: Some(3.5),
        finish_reason: None,
        usage: None,
    };
    round_trip(&v, &first);
    let last = StreamChunk {
        seq: 4,
        text: "ris.".into(),
        logprobs: Some(vec![Logprob {
            id: 2,
            token: "ris".into(),
            bytes: b"ris".to_vec(),
            logprob: -1.5,
            top_logprobs: Vec::new(),
        }]),
        queue_ms: None,
        finish_reason: Some(FinishReason::Eos),
        usage: Some(StreamUsage {
            prompt_tokens: 31,
            completion_tokens: 3,
        }),
        ..first.clone()
    };
    round_trip(&v, &last);
    assert!(last.is_last() && !first.is_last());
    // A finish reason without usage (or the other way round) is not a message.
    let mut half = serde_json::to_value(&last).unwrap();
    half.as_object_mut().unwrap().remove("usage");
    assert!(!v.is_valid(&half));
}

/// The schema's range for `output.presign_get_secs` (1 s to 7 days, S3's
/// limit) is the decoder's: both refuse 0 and 604801, both take the ends.
#[test]
fn presign_lifetime_is_the_schemas_range() {
    let v = validator(json_schema::JOB);
    let job = |secs: u64| {
        json!({
            "version": 1, "id": "p-1", "task": "embed", "model": "m",
            "inputs": [{"type": "inline", "items": ["hi"]}],
            "output": {"presign_get_secs": secs},
        })
    };
    for secs in [0, 604_801, 4_294_967_295] {
        assert!(!v.is_valid(&job(secs)), "the schema accepted {secs}");
        let err = Job::decode(&serde_json::to_vec(&job(secs)).unwrap()).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParameters, "{}", err.message);
        assert!(
            err.message
                .contains("output.presign_get_secs must be 1 to 604800"),
            "{}",
            err.message
        );
    }
    for secs in [1, 3600, 604_800] {
        assert_valid(&v, &job(secs));
        Job::decode(&serde_json::to_vec(&job(secs)).unwrap()).unwrap();
    }
}

#[test]
fn generate_items_are_read_with_clear_errors() {
    let v = validator(json_schema::JOB);
    let read = |item: Value| Item::from_value(Task::Generate, item);
    assert_eq!(
        read(json!("Once upon")),
        Ok(Item::Prompt(Prompt {
            input: PromptInput::Text("Once upon".into()),
            parameters: GenerateParameters::default(),
        }))
    );
    assert_eq!(
        read(json!({"prompt": "p", "max_new_tokens": 5, "seed": 9})),
        Ok(Item::Prompt(Prompt {
            input: PromptInput::Text("p".into()),
            parameters: GenerateParameters {
                max_new_tokens: Some(5),
                seed: Some(9),
                ..GenerateParameters::default()
            },
        }))
    );
    assert_eq!(
        read(
            json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})
        ),
        Ok(Item::Prompt(Prompt {
            input: PromptInput::Messages(vec![
                ChatMessage {
                    role: "system".into(),
                    content: "s".into()
                },
                ChatMessage {
                    role: "user".into(),
                    content: "u".into()
                },
            ]),
            parameters: GenerateParameters::default(),
        }))
    );
    let bad = [
        (json!(3), "found a number"),
        (json!({"text": "t"}), "unknown field `text`"),
        (
            json!({"prompt": "p", "messages": [{"role": "user", "content": "u"}]}),
            "not both",
        ),
        (json!({"max_new_tokens": 3}), "needs `prompt` or `messages`"),
        (json!({"messages": []}), "`messages` is empty"),
        (
            json!({"messages": [{"role": "robot", "content": "u"}]}),
            "unknown chat role \"robot\"",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "missing field `content`",
        ),
        (json!({"prompt": "p", "temperature": "hot"}), "invalid type"),
    ];
    for (item, needle) in bad {
        let err = read(item.clone()).unwrap_err();
        assert!(err.contains(needle), "{item}: {err}");
        let job = json!({
            "version": 1, "id": "g-1", "task": "generate", "model": "m",
            "inputs": [{"type": "inline", "items": [item]}],
        });
        assert!(!v.is_valid(&job), "the schema accepted the item {item}");
    }
    // Per-prompt parameters merge over the job's.
    let job = GenerateParameters {
        max_new_tokens: Some(64),
        stop: Some(vec!["\n".into()]),
        ..GenerateParameters::default()
    };
    let own = GenerateParameters {
        max_new_tokens: Some(8),
        ..GenerateParameters::default()
    };
    let merged = own.or(&job);
    assert_eq!(merged.max_new_tokens, Some(8));
    assert_eq!(merged.stop, Some(vec!["\n".to_string()]));
}

/// A rerank job's items are `{"query", "document"}` pairs: the schema and
/// the decoder agree on them, `truncate` is its one parameter (embed's and
/// generate's others are refused by name, as is streaming), and its scores
/// validate and round-trip as a result.
#[test]
fn rerank_jobs_and_their_scores_are_checked() {
    let v = validator(json_schema::JOB);
    let job = |items: Value, parameters: Value| {
        json!({
            "version": 1, "id": "r-1", "task": "rerank", "model": "reranker",
            "inputs": [{"type": "inline", "items": items}],
            "parameters": parameters,
        })
    };
    let ok = job(
        json!([{"query": "q", "document": "d1"}, {"query": "q", "document": ""}]),
        json!({"truncate": false}),
    );
    assert_valid(&v, &ok);
    let decoded = Job::decode(&serde_json::to_vec(&ok).unwrap()).unwrap();
    assert_eq!(decoded.task, Task::Rerank);
    assert_eq!(
        Item::from_value(Task::Rerank, json!({"query": "q", "document": "d"})),
        Ok(Item::Pair(Pair {
            query: "q".into(),
            document: "d".into()
        }))
    );
    for (item, needle) in [
        (json!("just a text"), "found a string"),
        (json!({"query": "q"}), "missing field `document`"),
        (
            json!({"query": "q", "document": "d", "score": 1}),
            "unknown field `score`",
        ),
        (json!({"query": 1, "document": "d"}), "invalid type"),
    ] {
        let err = Item::from_value(Task::Rerank, item.clone()).unwrap_err();
        assert!(err.contains(needle), "{item}: {err}");
        assert!(
            !v.is_valid(&job(json!([item]), json!({}))),
            "the schema accepted {item}"
        );
    }
    for (parameters, needle) in [
        (
            json!({"normalize": true}),
            "`normalize` applies to the embed task only, not to rerank",
        ),
        (
            json!({"prompt_name": "query"}),
            "`prompt_name` applies to the embed task only, not to rerank",
        ),
        (
            json!({"temperature": 0.5}),
            "`temperature` applies to the generate task only, not to rerank",
        ),
    ] {
        let bad = job(json!([{"query": "q", "document": "d"}]), parameters);
        let err = Job::decode(&serde_json::to_vec(&bad).unwrap()).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParameters, "{}", err.message);
        assert!(err.message.contains(needle), "{}", err.message);
    }
    let mut streamed = job(json!([{"query": "q", "document": "d"}]), json!({}));
    streamed["output"] = json!({"stream": true});
    let err = Job::decode(&serde_json::to_vec(&streamed).unwrap()).unwrap_err();
    assert!(
        err.message
            .contains("output.stream applies to generate jobs only (the rerank task's"),
        "{}",
        err.message
    );

    let result = validator(json_schema::RESULT);
    let scored = JobResult {
        version: VERSION,
        job_id: Some("r-1".into()),
        outcome: Outcome::Ok {
            output: Output::scores(vec![0.75, -1.5]),
        },
        usage: Usage {
            items: 2,
            tokens: 9,
            ..Usage::default()
        },
        timings_ms: Timings::default(),
        attempt: 1,
        served_by: None,
        finished_at: datetime!(2026-12-04 12:00:00 UTC),
    };
    round_trip(&result, &scored);
}
