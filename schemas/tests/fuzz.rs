//! Property tests over everything a publisher can send: job messages and
//! JSONL inputs, arbitrary or mutated from valid ones. No input panics the
//! decoder, and every rejection carries a code a publisher can act on and a
//! message. Bounded (a fixed number of cases), so it runs in every CI run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test reports by panicking

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_schemas::{ErrorCode, Item, Job, JsonlError, Task, parse_jsonl};

/// The codes decoding may answer with: it reads no input and runs nothing.
const DECODE_CODES: [ErrorCode; 5] = [
    ErrorCode::MalformedMessage,
    ErrorCode::SchemaViolation,
    ErrorCode::UnsupportedVersion,
    ErrorCode::UnknownTask,
    ErrorCode::InvalidParameters,
];

fn check_decode(payload: &[u8]) -> Result<(), TestCaseError> {
    match Job::decode(payload) {
        Ok(valid) => {
            // Whatever decodes re-encodes and decodes to the same job.
            let again = Job::decode(&valid.job.to_bytes()).map_err(|e| {
                TestCaseError::fail(format!("a decoded job does not decode again: {e:?}"))
            })?;
            prop_assert_eq!(again.job, valid.job);
        }
        Err(e) => {
            prop_assert!(
                DECODE_CODES.contains(&e.code),
                "unexpected code {:?}",
                e.code
            );
            prop_assert!(!e.message.trim().is_empty());
            prop_assert!(
                e.message.len() < 2000,
                "message too long: {}",
                e.message.len()
            );
            prop_assert!(!e.retryable, "a bad message never gets better by retrying");
        }
    }
    Ok(())
}

/// Arbitrary JSON, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn valid_job() -> Value {
    json!({
        "version": 1,
        "id": "fuzz-1",
        "task": "embed",
        "model": "all-minilm-l6-v2",
        "inputs": [
            {"type": "url", "url": "https://example.com/in.jsonl?X-Amz-Signature=abc", "format": "jsonl"},
            {"type": "inline", "items": ["hello", {"text": "world"}]}
        ],
        "parameters": {"truncate": true},
        "token_estimate": 12,
        "deadline": "2026-11-29T18:00:00Z"
    })
}

const FIELDS: [&str; 9] = [
    "version",
    "id",
    "task",
    "model",
    "inputs",
    "parameters",
    "token_estimate",
    "deadline",
    "output",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_decode(&bytes)?;
    }

    #[test]
    fn arbitrary_json_is_decoded_or_refused_with_a_code(value in any_json()) {
        check_decode(value.to_string().as_bytes())?;
    }

    #[test]
    fn a_valid_job_with_one_field_replaced_or_removed(
        field in prop::sample::select(FIELDS.to_vec()),
        replacement in prop::option::of(any_json()),
    ) {
        let mut job = valid_job();
        match replacement {
            Some(v) => { job[field] = v; }
            None => { job.as_object_mut().unwrap().remove(field); }
        }
        check_decode(job.to_string().as_bytes())?;
    }

    #[test]
    fn a_valid_job_cut_short_is_malformed(cut in 0usize..200) {
        let text = valid_job().to_string();
        let cut = cut.min(text.len() - 1);
        let e = Job::decode(&text.as_bytes()[..cut]).unwrap_err();
        prop_assert_eq!(e.code, ErrorCode::MalformedMessage);
    }

    #[test]
    fn jsonl_inputs_parse_or_name_the_line(
        lines in prop::collection::vec(
            prop_oneof![
                ".{0,30}".prop_map(|s| json!(s).to_string()),
                ".{0,30}".prop_map(|s| json!({"text": s}).to_string()),
                any_json().prop_map(|v| v.to_string()),
                ".{0,30}",
            ],
            0..20,
        ),
        max_items in 1u64..30,
    ) {
        let body = lines.join("\n");
        let mut items = Vec::new();
        match parse_jsonl(Task::Embed, body.as_bytes(), &mut items, max_items) {
            Ok(()) => {
                prop_assert!(items.len() as u64 <= max_items);
                prop_assert!(items.iter().all(|i| matches!(i, Item::Text(_))));
            }
            Err(JsonlError::Invalid(m)) => {
                prop_assert!(m.starts_with("line ") || m.starts_with("not valid UTF-8"), "{}", m);
            }
            Err(JsonlError::TooManyItems(max)) => prop_assert_eq!(max, max_items),
        }
    }

    #[test]
    fn jsonl_bytes_never_panic_the_parser(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut items = Vec::new();
        let _ = parse_jsonl(Task::Embed, &bytes, &mut items, 100);
    }
}

#[test]
fn the_mutated_job_is_valid_before_mutation() {
    let valid = Job::decode(valid_job().to_string().as_bytes()).unwrap();
    assert_eq!(valid.job.id, "fuzz-1");
}
