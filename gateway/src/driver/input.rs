//! A batch's input file, read a line at a time (validation reads it once,
//! a split and finalizing again).

use anyhow::Result;

use crate::batch_record::BatchRecord;
use crate::objects::{self, Line as RawLine, next_line};
use crate::openai::{self, Line, Request};
use crate::state::AppState;

/// A batch's input file, read a line at a time, numbered from 1.
pub struct InputLines<R> {
    reader: R,
    line_no: u64,
    max_line_bytes: usize,
}

impl InputLines<()> {
    pub async fn open(
        state: &AppState,
        batch: &BatchRecord,
    ) -> Result<InputLines<impl tokio::io::AsyncBufRead + Unpin + use<>>> {
        let key = state.file_key(&batch.input_file_id);
        Ok(InputLines {
            reader: objects::open(&state.s3, state.bucket(), &key).await?,
            line_no: 0,
            max_line_bytes: state.config.max_line_bytes,
        })
    }
}

impl<R: tokio::io::AsyncBufRead + Unpin> InputLines<R> {
    pub async fn next(&mut self) -> Result<Option<(u64, RawLine)>> {
        let line = next_line(&mut self.reader, self.max_line_bytes).await?;
        Ok(line.map(|l| {
            self.line_no += 1;
            (self.line_no, l)
        }))
    }
}

/// One line read as a request against the models this deployment serves.
pub fn read_request(state: &AppState, text: &[u8]) -> Result<Line, openai::LineError> {
    openai::read_line(text, &|task, model| state.serves(task, model))
}

/// Re-reads the input file's lines `first..=last`: the runnable ones.
pub async fn runnable_lines(
    state: &AppState,
    batch: &BatchRecord,
    first: u64,
    last: u64,
) -> Result<Vec<(u64, String, Request)>> {
    let mut input = InputLines::open(state, batch).await?;
    let mut out = Vec::new();
    while let Some((line_no, raw)) = input.next().await? {
        if line_no < first {
            continue;
        }
        if line_no > last {
            break;
        }
        if let RawLine::Text(t) = raw
            && let Ok(Line::Run { custom_id, request }) = read_request(state, &t)
        {
            out.push((line_no, custom_id, request));
        }
    }
    Ok(out)
}
