//! Generated tokens' logprobs as the wire carries them: the generator's
//! ids and figures, with each token's text and bytes from the model's
//! tokenizer. Shared by the generation thread (stream messages), the
//! engine (results) and the offline generate command.

use sluice_models::decoder::generation::TokenLogprob;
use sluice_models::tokenizer::gguf::GgufTokenizer;

/// Generated tokens' logprobs as results carry them: each id with its text
/// and bytes, the log-probabilities floored for JSON.
pub(crate) fn wire_logprobs(
    tokenizer: &GgufTokenizer,
    logprobs: &[TokenLogprob],
) -> Vec<sluice_schemas::Logprob> {
    let text = |id: u32| {
        let bytes = tokenizer.decode_bytes(&[id]);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    };
    logprobs
        .iter()
        .map(|l| {
            let (token, bytes) = text(l.id);
            sluice_schemas::Logprob {
                id: l.id,
                token,
                bytes,
                logprob: sluice_schemas::Logprob::floored(l.logprob),
                top_logprobs: l
                    .top
                    .iter()
                    .map(|&(id, logprob)| {
                        let (token, bytes) = text(id);
                        sluice_schemas::TopLogprob {
                            id,
                            token,
                            bytes,
                            logprob: sluice_schemas::Logprob::floored(logprob),
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}
