//! Validation's pure parts: runnable lines gathered into chunk jobs
//! (consecutive lines of one task and model, within the chunk limits), the
//! validation errors kept, and the job ids of chunks and their lines.

use serde_json::Value;
use sluice_schemas::{Task, Work};

use crate::batch_record::BatchError;
use crate::openai::Request;

/// Most validation errors kept on a failed batch (all are counted).
pub const MAX_ERRORS: usize = 100;
/// Largest chunk input, under the consumers' default --max-input-bytes (8 MiB).
pub const CHUNK_BYTES: usize = 4 << 20;

/// How big a chunk may grow (`--chunk-lines`, `--chunk-texts`,
/// `--chunk-prompts`, [`CHUNK_BYTES`]).
#[derive(Clone, Copy, Debug)]
pub struct ChunkLimits {
    pub lines: u64,
    pub texts: usize,
    pub prompts: usize,
    pub bytes: usize,
}

/// A chunk being gathered: its lines' items as JSONL.
#[derive(Debug, PartialEq)]
pub struct OpenChunk {
    pub task: Task,
    pub model: String,
    /// embed: the prompt every line of the chunk asked for.
    pub prompt_name: Option<String>,
    pub first_line: u64,
    pub last_line: u64,
    pub lines: u64,
    pub items: usize,
    pub body: Vec<u8>,
}

/// Gathers runnable lines into chunks. A line joins the open chunk when it
/// has the chunk's task, model and prompt and the chunk has room for it (a line
/// with more items than a chunk may hold gets a chunk of its own).
pub struct Chunker {
    limits: ChunkLimits,
    open: Option<OpenChunk>,
}

impl Chunker {
    pub fn new(limits: ChunkLimits) -> Chunker {
        Chunker { limits, open: None }
    }

    /// Adds line `line_no`; returns the chunk it closed, when it did not fit.
    pub fn add(&mut self, line_no: u64, request: &Request) -> Option<OpenChunk> {
        let task = request.endpoint.task();
        let most_items = match task.work() {
            // A rerank document is one pair, one encoder item, as a text is.
            Work::Encode => self.limits.texts,
            Work::Generate => self.limits.prompts,
            // A recording is a job of its own (a consumer's default).
            Work::Transcribe => 1,
        };
        let n = request.items.len();
        let fits = self.open.as_ref().is_some_and(|c| {
            c.task == task
                && c.model == request.model
                && c.prompt_name == request.prompt_name
                && c.lines < self.limits.lines
                && c.items + n <= most_items.max(n)
                && c.body.len() < self.limits.bytes
        });
        let closed = if fits { None } else { self.open.take() };
        let chunk = self.open.get_or_insert_with(|| OpenChunk {
            task,
            model: request.model.clone(),
            prompt_name: request.prompt_name.clone(),
            first_line: line_no,
            last_line: line_no,
            lines: 0,
            items: 0,
            body: Vec::new(),
        });
        chunk.last_line = line_no;
        chunk.lines += 1;
        chunk.items += n;
        append_items(&mut chunk.body, &request.items);
        closed
    }

    /// The chunk still open, if any.
    pub fn finish(&mut self) -> Option<OpenChunk> {
        self.open.take()
    }
}

/// Appends `items` as JSONL: a chunk's (or a split line's) job input.
pub fn append_items(body: &mut Vec<u8>, items: &[Value]) {
    for item in items {
        // A `Value` always serializes.
        body.extend_from_slice(item.to_string().as_bytes());
        body.push(b'\n');
    }
}

/// A failed validation's errors: every one counted, the first
/// [`MAX_ERRORS`] kept for the batch record.
#[derive(Debug, Default)]
pub struct ErrorLog {
    pub kept: Vec<BatchError>,
    pub count: usize,
}

impl ErrorLog {
    pub fn push(&mut self, code: &str, message: String, param: Option<&str>, line: u64) {
        self.count += 1;
        if self.kept.len() < MAX_ERRORS {
            self.kept.push(BatchError {
                code: code.into(),
                message,
                param: param.map(str::to_string),
                line: Some(line),
            });
        }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// A chunk's job id: `<batch>-<the task's letter><n>` (`-e0` for
/// embeddings, `-g0` for generations, `-r0` for rerankings).
pub fn chunk_job(batch_id: &str, task: Task, index: usize) -> String {
    format!("{batch_id}-{}{index}", task.letter())
}

/// The task of a chunk's job id or its lines' (see [`chunk_job`]; a
/// batch id has no `-`).
pub fn chunk_task(job_id: &str) -> Task {
    let kind = job_id.split('-').nth(1).unwrap_or_default();
    kind.chars()
        .next()
        .and_then(Task::of_letter)
        .unwrap_or(Task::Embed)
}

/// The job ids of a split chunk's lines.
pub fn line_job(chunk_job: &str, line: u64) -> String {
    format!("{chunk_job}-l{line}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::Endpoint;
    use serde_json::json;

    fn request(endpoint: Endpoint, model: &str, items: usize) -> Request {
        Request {
            endpoint,
            model: model.into(),
            items: (0..items).map(|i| json!(format!("t{i}"))).collect(),
            base64: false,
            prompt_name: None,
            ranking: Default::default(),
            echo: None,
            audio: None,
        }
    }

    const LIMITS: ChunkLimits = ChunkLimits {
        lines: 3,
        texts: 4,
        prompts: 2,
        bytes: 1 << 20,
    };

    /// A table row: what it shows, the limits, the lines (endpoint, model,
    /// items) and the chunks expected (first line, last line, lines, items).
    type Case = (
        &'static str,
        ChunkLimits,
        Vec<(Endpoint, &'static str, usize)>,
        Vec<(u64, u64, u64, usize)>,
    );

    /// Lines in, chunks out as (first line, last line, lines, items).
    fn chunks(
        limits: ChunkLimits,
        lines: &[(Endpoint, &str, usize)],
    ) -> Vec<(u64, u64, u64, usize)> {
        let mut c = Chunker::new(limits);
        let mut out = Vec::new();
        for (i, (endpoint, model, items)) in lines.iter().enumerate() {
            out.extend(c.add(i as u64 + 1, &request(*endpoint, model, *items)));
        }
        out.extend(c.finish());
        out.iter()
            .map(|c| (c.first_line, c.last_line, c.lines, c.items))
            .collect()
    }

    #[test]
    fn lines_gather_into_chunks_of_one_task_and_model_within_the_limits() {
        use Endpoint::*;
        let table: [Case; 7] = [
            (
                "one line",
                LIMITS,
                vec![(Embeddings, "m", 1)],
                vec![(1, 1, 1, 1)],
            ),
            (
                "three lines fill a chunk",
                LIMITS,
                vec![(Embeddings, "m", 1); 4],
                vec![(1, 3, 3, 3), (4, 4, 1, 1)],
            ),
            (
                "texts fill a chunk first",
                LIMITS,
                vec![(Embeddings, "m", 3), (Embeddings, "m", 2)],
                vec![(1, 1, 1, 3), (2, 2, 1, 2)],
            ),
            (
                "a line bigger than a chunk gets its own",
                LIMITS,
                vec![
                    (Embeddings, "m", 1),
                    (Embeddings, "m", 9),
                    (Embeddings, "m", 1),
                ],
                vec![(1, 1, 1, 1), (2, 2, 1, 9), (3, 3, 1, 1)],
            ),
            (
                "another model closes the chunk",
                LIMITS,
                vec![
                    (Embeddings, "a", 1),
                    (Embeddings, "b", 1),
                    (Embeddings, "a", 1),
                ],
                vec![(1, 1, 1, 1), (2, 2, 1, 1), (3, 3, 1, 1)],
            ),
            (
                "another task closes it, and prompts have their own limit",
                LIMITS,
                vec![
                    (Embeddings, "m", 1),
                    (ChatCompletions, "m", 1),
                    (Completions, "m", 1),
                    (Completions, "m", 1),
                ],
                vec![(1, 1, 1, 1), (2, 3, 2, 2), (4, 4, 1, 1)],
            ),
            (
                "a full body closes the chunk",
                ChunkLimits { bytes: 8, ..LIMITS },
                vec![(Embeddings, "m", 2), (Embeddings, "m", 1)],
                vec![(1, 1, 1, 2), (2, 2, 1, 1)],
            ),
        ];
        for (what, limits, lines, want) in table {
            assert_eq!(chunks(limits, &lines), want, "{what}");
        }
    }

    #[test]
    fn a_chunks_body_is_its_lines_items_as_jsonl() {
        let mut c = Chunker::new(LIMITS);
        assert_eq!(c.add(7, &request(Endpoint::Embeddings, "m", 2)), None);
        assert_eq!(c.add(8, &request(Endpoint::Embeddings, "m", 1)), None);
        let chunk = c.finish().unwrap_or_else(|| panic!("open chunk"));
        assert_eq!(chunk.body, b"\"t0\"\n\"t1\"\n\"t0\"\n");
        assert_eq!((chunk.task, chunk.model.as_str()), (Task::Embed, "m"));
        assert_eq!(c.finish(), None);
    }

    /// A chunk is one job with one `parameters.prompt_name`: a line asking
    /// for another prompt starts the next chunk, which carries its name.
    #[test]
    fn another_prompt_closes_the_chunk() {
        let mut c = Chunker::new(LIMITS);
        let prompted = |name: Option<&str>| Request {
            prompt_name: name.map(str::to_string),
            ..request(Endpoint::Embeddings, "m", 1)
        };
        assert_eq!(c.add(1, &prompted(None)), None);
        let plain = c
            .add(2, &prompted(Some("query")))
            .unwrap_or_else(|| panic!("closed"));
        assert_eq!((plain.lines, plain.prompt_name), (1, None));
        assert_eq!(c.add(3, &prompted(Some("query"))), None);
        let query = c
            .add(4, &prompted(Some("passage")))
            .unwrap_or_else(|| panic!("closed"));
        assert_eq!((query.first_line, query.lines), (2, 2));
        assert_eq!(query.prompt_name.as_deref(), Some("query"));
        let passage = c.finish().unwrap_or_else(|| panic!("open chunk"));
        assert_eq!(passage.prompt_name.as_deref(), Some("passage"));
    }

    #[test]
    fn every_error_is_counted_and_the_first_hundred_kept() {
        let mut log = ErrorLog::default();
        assert!(log.is_empty());
        for line in 1..=150 {
            log.push(
                "invalid_request_error",
                format!("bad {line}"),
                Some("body"),
                line,
            );
        }
        assert_eq!((log.count, log.kept.len()), (150, MAX_ERRORS));
        assert_eq!(log.kept[0].line, Some(1));
        assert_eq!(log.kept[99].message, "bad 100");
        assert_eq!(log.kept[0].param.as_deref(), Some("body"));
    }

    #[test]
    fn job_ids_name_the_task_and_the_line() {
        let table = [
            ("batch_ab", Task::Embed, 0, "batch_ab-e0"),
            ("batch_ab", Task::Generate, 12, "batch_ab-g12"),
            ("batch_ab", Task::Rerank, 3, "batch_ab-r3"),
        ];
        for (batch, task, index, id) in table {
            assert_eq!(chunk_job(batch, task, index), id);
            assert_eq!(chunk_task(id), task);
            assert_eq!(chunk_task(&line_job(id, 40)), task, "a split line's job");
        }
        assert_eq!(line_job("batch_ab-e0", 40), "batch_ab-e0-l40");
    }
}
