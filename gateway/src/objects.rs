//! S3 objects written and read as streams, so no file is ever whole in the
//! gateway's memory: uploads go out in parts of [`PART_BYTES`], reads come
//! back a line at a time.

use anyhow::{Context, Result, anyhow};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};

/// S3's smallest part is 5 MiB; 8 MiB keeps a stream's memory at one part.
pub const PART_BYTES: usize = 8 << 20;

fn s3_error<E: std::error::Error + Send + Sync + 'static>(
    what: &str,
    e: aws_sdk_s3::error::SdkError<E>,
) -> anyhow::Error {
    anyhow!("{what}: {}", aws_sdk_s3::error::DisplayErrorContext(e))
}

/// One object being written: a single PUT when it ends under one part, a
/// multipart upload otherwise.
pub struct ObjectWriter {
    s3: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    buffer: Vec<u8>,
    upload_id: Option<String>,
    parts: Vec<CompletedPart>,
    written: u64,
}

impl ObjectWriter {
    pub fn new(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> ObjectWriter {
        ObjectWriter {
            s3: s3.clone(),
            bucket: bucket.to_string(),
            key: key.to_string(),
            buffer: Vec::new(),
            upload_id: None,
            parts: Vec::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.written
    }

    pub fn is_empty(&self) -> bool {
        self.written == 0
    }

    /// Buffers `data`, sending each part as it fills: the buffer never
    /// holds more than one part (allocated once, at its full size).
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        self.written += data.len() as u64;
        while !data.is_empty() {
            if self.buffer.capacity() == 0 {
                self.buffer.reserve_exact(PART_BYTES);
            }
            let take = data.len().min(PART_BYTES - self.buffer.len());
            self.buffer.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buffer.len() == PART_BYTES {
                self.send_part().await?;
            }
        }
        Ok(())
    }

    async fn send_part(&mut self) -> Result<()> {
        let what = format!("writing s3://{}/{}", self.bucket, self.key);
        let upload_id = match &self.upload_id {
            Some(id) => id.clone(),
            None => {
                let created = self
                    .s3
                    .create_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&self.key)
                    .send()
                    .await
                    .map_err(|e| s3_error(&what, e))?;
                let id = created
                    .upload_id()
                    .context("S3 gave no upload id")?
                    .to_string();
                self.upload_id = Some(id.clone());
                id
            }
        };
        let number = self.parts.len() as i32 + 1;
        let body = std::mem::take(&mut self.buffer);
        let part = self
            .s3
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&upload_id)
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| s3_error(&what, e))?;
        self.parts.push(
            CompletedPart::builder()
                .set_e_tag(part.e_tag().map(str::to_string))
                .part_number(number)
                .build(),
        );
        Ok(())
    }

    /// Completes the object; returns its size.
    pub async fn finish(mut self) -> Result<u64> {
        let what = format!("writing s3://{}/{}", self.bucket, self.key);
        match self.upload_id.clone() {
            None => {
                self.s3
                    .put_object()
                    .bucket(&self.bucket)
                    .key(&self.key)
                    .body(ByteStream::from(std::mem::take(&mut self.buffer)))
                    .send()
                    .await
                    .map_err(|e| s3_error(&what, e))?;
            }
            Some(upload_id) => {
                if !self.buffer.is_empty() {
                    self.send_part().await?;
                }
                self.s3
                    .complete_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&self.key)
                    .upload_id(&upload_id)
                    .multipart_upload(
                        CompletedMultipartUpload::builder()
                            .set_parts(Some(std::mem::take(&mut self.parts)))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| s3_error(&what, e))?;
            }
        }
        Ok(self.written)
    }

    /// Gives up: an unfinished multipart upload is aborted (best effort).
    pub async fn abort(self) {
        if let Some(upload_id) = &self.upload_id {
            let aborted = self
                .s3
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(upload_id)
                .send()
                .await;
            if let Err(e) = aborted {
                tracing::warn!(key = self.key, error = %aws_sdk_s3::error::DisplayErrorContext(e), "abort of an upload failed");
            }
        }
    }
}

/// An object's body, as a stream.
pub async fn get(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<ByteStream> {
    let object = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| s3_error(&format!("reading s3://{bucket}/{key}"), e))?;
    Ok(object.body)
}

/// An object's body as a buffered async reader.
pub async fn open(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
) -> Result<BufReader<impl tokio::io::AsyncRead + Unpin + use<>>> {
    let body = get(s3, bucket, key).await?;
    Ok(BufReader::with_capacity(1 << 16, body.into_async_read()))
}

/// An object's whole body (for the small objects: chunk outputs).
pub async fn read_all(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Vec<u8>> {
    let body = get(s3, bucket, key)
        .await?
        .collect()
        .await
        .with_context(|| format!("reading s3://{bucket}/{key}"))?;
    Ok(body.into_bytes().to_vec())
}

pub async fn delete(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<()> {
    s3.delete_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| s3_error(&format!("deleting s3://{bucket}/{key}"), e))?;
    Ok(())
}

/// One line of a stream: its bytes (without the newline) unless it was
/// longer than the limit, then only its length.
pub enum Line {
    Text(Vec<u8>),
    TooLong(usize),
}

/// Reads the next line, keeping at most `max` bytes of it; None at the end.
pub async fn next_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Option<Line>> {
    let mut line = Vec::new();
    let mut length = 0usize;
    let mut seen_any = false;
    loop {
        let buf = reader.fill_buf().await.context("reading a line")?;
        if buf.is_empty() {
            break;
        }
        seen_any = true;
        let (take, done) = match memchr(buf) {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if length + take <= max {
            line.extend_from_slice(&buf[..take]);
        } else {
            line = Vec::new();
        }
        length += take;
        reader.consume(take + usize::from(done));
        if done {
            break;
        }
    }
    if !seen_any {
        return Ok(None);
    }
    if line.last() == Some(&b'\r') {
        line.pop();
        length -= 1;
    }
    Ok(Some(if length > max {
        Line::TooLong(length)
    } else {
        Line::Text(line)
    }))
}

fn memchr(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<String> {
        let mut reader = BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        while let Some(line) = next_line(&mut reader, max).await.unwrap() {
            out.push(match line {
                Line::Text(t) => String::from_utf8(t).unwrap(),
                Line::TooLong(n) => format!("<{n} bytes>"),
            });
        }
        out
    }

    #[tokio::test]
    async fn lines_are_split_kept_within_the_limit_and_the_last_needs_no_newline() {
        assert_eq!(lines(b"a\nbb\r\n\nccc", 8).await, ["a", "bb", "", "ccc"]);
        assert_eq!(
            lines(b"short\nmuch too long\nok\n", 6).await,
            ["short", "<13 bytes>", "ok"]
        );
        assert!(lines(b"", 8).await.is_empty());
    }
}
