//! A job's error as the gateway's client is told it (an online answer, a
//! stream's error event, a batch's error file).
//!
//! A consumer's error message is written for the operator: for a failure
//! of ours it names the bucket and key it could not write, the S3 or NATS
//! client's own text, the internal address of an input the gateway made.
//! Those are replaced by a stable sentence per code that names the job (its
//! id finds the cause in the consumers' and the gateway's logs, where the
//! gateway writes the consumer's message). A mistake that is the caller's
//! (a parameter, an item too long, too many items, a model it named) keeps
//! the consumer's message, which is about the caller's own request; so
//! does an input that could not be read when it is the caller's own URL (a
//! batch transcription line's `https://` recording).

use std::borrow::Cow;

use sluice_schemas::ErrorCode;

/// The message the client is told for a job `job_id` that failed with
/// `code` and the consumer's `message`; `callers_input`: the job's input is
/// a URL the caller gave, not one the gateway made.
pub fn for_client<'a>(
    job_id: &str,
    code: ErrorCode,
    message: &'a str,
    callers_input: bool,
) -> Cow<'a, str> {
    let input_error = matches!(
        code,
        ErrorCode::InputNotAllowed | ErrorCode::InputUnavailable | ErrorCode::InputFetchFailed
    );
    let Some(ours) = stable_message(code).filter(|_| !(callers_input && input_error)) else {
        return Cow::Borrowed(message);
    };
    tracing::warn!(
        job = job_id,
        code = code.as_str(),
        error = message,
        "a job failed"
    );
    Cow::Owned(format!(
        "{ours} (job {job_id}; the consumers' and the gateway's logs have the cause)"
    ))
}

/// The sentence for a code whose message is not for the client; `None`
/// for the caller's own mistakes, whose message is.
fn stable_message(code: ErrorCode) -> Option<&'static str> {
    match code {
        ErrorCode::InvalidParameters
        | ErrorCode::UnknownModel
        | ErrorCode::InputTooLarge
        | ErrorCode::InputInvalid
        | ErrorCode::ItemTooLong
        | ErrorCode::TooManyItems
        | ErrorCode::DeadlineExceeded
        | ErrorCode::Cancelled => None,
        // The gateway makes the inputs of its jobs (inline, or an object of
        // its own in S3; but for a batch line's own URL, see `for_client`):
        // one that cannot be read is a failure of ours.
        ErrorCode::InputNotAllowed | ErrorCode::InputUnavailable | ErrorCode::InputFetchFailed => {
            Some("The job's input, stored by the gateway, could not be read; try again.")
        }
        ErrorCode::StorageUnavailable => {
            Some("The job's storage was unavailable, so its answer was not kept; try again.")
        }
        ErrorCode::DeviceOutOfMemory => Some(
            "The model ran out of device memory on this request; try again, or send less at once.",
        ),
        ErrorCode::MaxDeliveriesExceeded => {
            Some("The job was tried as often as the queue allows without an answer; try again.")
        }
        // The gateway wrote the job: one a consumer cannot read means the
        // two disagree on the format (an upgrade in progress).
        ErrorCode::MalformedMessage
        | ErrorCode::SchemaViolation
        | ErrorCode::UnsupportedVersion
        | ErrorCode::UnknownTask => Some(
            "The consumers could not read the job the gateway wrote (are they of another version?); try again.",
        ),
        ErrorCode::Internal => Some("The job failed inside sluice; try again."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_mistakes_keep_their_message_and_ours_say_a_stable_sentence() {
        let detail = "writing s3://private-bucket/outputs/j.npy: dispatch failure: 10.0.0.7:9000";
        let table = [
            (ErrorCode::InvalidParameters, true),
            (ErrorCode::UnknownModel, true),
            (ErrorCode::InputTooLarge, true),
            (ErrorCode::InputInvalid, true),
            (ErrorCode::ItemTooLong, true),
            (ErrorCode::TooManyItems, true),
            (ErrorCode::DeadlineExceeded, true),
            (ErrorCode::Cancelled, true),
            (ErrorCode::InputNotAllowed, false),
            (ErrorCode::InputUnavailable, false),
            (ErrorCode::InputFetchFailed, false),
            (ErrorCode::StorageUnavailable, false),
            (ErrorCode::DeviceOutOfMemory, false),
            (ErrorCode::MaxDeliveriesExceeded, false),
            (ErrorCode::MalformedMessage, false),
            (ErrorCode::SchemaViolation, false),
            (ErrorCode::UnsupportedVersion, false),
            (ErrorCode::UnknownTask, false),
            (ErrorCode::Internal, false),
        ];
        for (code, relayed) in table {
            let told = for_client("job-1", code, detail, false);
            if relayed {
                assert_eq!(told, detail, "{code:?}");
            } else {
                assert!(!told.contains("private-bucket"), "{code:?}: {told}");
                assert!(!told.contains("10.0.0.7"), "{code:?}: {told}");
                assert!(told.contains("job job-1"), "{code:?}: {told}");
                assert!(told.ends_with("have the cause)"), "{code:?}: {told}");
            }
        }
    }

    #[test]
    fn why_the_callers_own_url_could_not_be_read_is_the_callers() {
        let detail = "GET https://audio.example/talk.mp3 answered 404 Not Found";
        for code in [
            ErrorCode::InputNotAllowed,
            ErrorCode::InputUnavailable,
            ErrorCode::InputFetchFailed,
        ] {
            assert_eq!(for_client("job-1", code, detail, true), detail, "{code:?}");
            assert!(
                for_client("job-1", code, detail, false)
                    .starts_with("The job's input, stored by the gateway")
            );
        }
        // Not an input error: still ours to hide.
        let told = for_client("job-1", ErrorCode::StorageUnavailable, detail, true);
        assert!(!told.contains("audio.example"), "{told}");
    }
}
