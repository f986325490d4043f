//! Inputs: download from presigned URLs with a byte cap, a timeout and a host
//! allow-list; parse JSONL into items. Inline items go through the same parser.

use std::net::IpAddr;
use std::time::Duration;

use sluice_schemas::{ErrorCode, Input, Item, JsonlError, Task, truncate_for_message};

use crate::error::JobError;

/// Who may be fetched from, and how much.
#[derive(Debug, Clone)]
pub struct FetchPolicy {
    /// `host` or `host:port`; empty allows any host but link-local ones.
    pub allow_hosts: Vec<String>,
    pub allow_link_local: bool,
    /// Cap on the bytes of all of a job's inputs together.
    pub max_bytes: u64,
    pub timeout: Duration,
}

pub struct Fetcher {
    http: reqwest::Client,
    policy: FetchPolicy,
}

/// A job's items and the bytes they were read from.
#[derive(Debug, Default)]
pub struct FetchedItems {
    pub items: Vec<Item>,
    pub bytes: u64,
}

impl Fetcher {
    pub fn new(policy: FetchPolicy) -> Result<Fetcher, reqwest::Error> {
        let http = reqwest::Client::builder()
            // A redirect could lead past the allow-list: never follow one.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(policy.timeout)
            .connect_timeout(policy.timeout.min(Duration::from_secs(10)))
            .build()?;
        Ok(Fetcher { http, policy })
    }

    /// All items of a job's inputs, in order, within `max_items`.
    pub async fn items(
        &self,
        task: Task,
        inputs: &[Input],
        max_items: u64,
    ) -> Result<FetchedItems, JobError> {
        let mut out = FetchedItems::default();
        for (i, input) in inputs.iter().enumerate() {
            match input {
                Input::Inline { items } => {
                    for (j, v) in items.iter().enumerate() {
                        let item = Item::from_value(task, v.clone()).map_err(|m| {
                            JobError::new(
                                ErrorCode::InputInvalid,
                                format!("inputs[{i}].items[{j}]: {m}"),
                            )
                        })?;
                        out.items.push(item);
                        check_count(&out, max_items)?;
                    }
                }
                Input::Url { url, .. } => {
                    let remaining = self.policy.max_bytes.saturating_sub(out.bytes);
                    let body = self.download(i, url, remaining).await?;
                    out.bytes += body.len() as u64;
                    parse_jsonl(task, i, &body, &mut out.items, max_items)?;
                }
            }
        }
        Ok(out)
    }

    /// Downloads one input of at most `cap` bytes.
    async fn download(&self, index: usize, url: &str, cap: u64) -> Result<Vec<u8>, JobError> {
        let shown = redact_url(url);
        let parsed = url::Url::parse(url).map_err(|e| {
            JobError::new(
                ErrorCode::SchemaViolation,
                format!("inputs[{index}].url {shown} is not a URL: {e}"),
            )
        })?;
        self.check_host(index, &parsed).await?;
        let transient = |what: String| JobError::new(ErrorCode::InputFetchFailed, what);
        let mut resp =
            self.http.get(parsed).send().await.map_err(|e| {
                transient(format!("inputs[{index}] {shown}: {}", describe_reqwest(e)))
            })?;
        let status = resp.status();
        if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
            return Err(transient(format!(
                "inputs[{index}] {shown} answered HTTP {status}; will retry"
            )));
        }
        if !status.is_success() {
            let why = match status.as_u16() {
                403 => {
                    ": the presigned URL is expired, or its signature does not match (re-sign it and resubmit)"
                }
                404 => ": no such object",
                300..=399 => ": redirects are not followed",
                _ => "",
            };
            return Err(JobError::new(
                ErrorCode::InputUnavailable,
                format!("inputs[{index}] {shown} answered HTTP {status}{why}"),
            ));
        }
        let too_large = |n: String| {
            JobError::new(
                ErrorCode::InputTooLarge,
                format!(
                    "inputs[{index}] {shown} is {n} bytes; this consumer accepts at most {cap} more bytes of input for the job (max_input_bytes)"
                ),
            )
        };
        if let Some(len) = resp.content_length().filter(|&len| len > cap) {
            return Err(too_large(len.to_string()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| {
            transient(format!(
                "inputs[{index}] {shown}: reading the body: {}",
                describe_reqwest(e)
            ))
        })? {
            if (body.len() + chunk.len()) as u64 > cap {
                return Err(too_large(format!("more than {cap}")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    async fn check_host(&self, index: usize, url: &url::Url) -> Result<(), JobError> {
        let not_allowed = |why: String| {
            JobError::new(
                ErrorCode::InputNotAllowed,
                format!("inputs[{index}]: {why}"),
            )
        };
        let scheme = url.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(not_allowed(format!(
                "scheme {scheme:?} is not allowed; use http or https"
            )));
        }
        let Some(host) = url.host_str() else {
            return Err(not_allowed("the URL has no host".into()));
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let port = url.port_or_known_default().unwrap_or(0);
        if !self.policy.allow_link_local {
            self.check_not_link_local(index, &host, port).await?;
        }
        if !self.policy.allow_hosts.is_empty() {
            let with_port = format!("{host}:{port}");
            let listed = self
                .policy
                .allow_hosts
                .iter()
                .any(|a| a.eq_ignore_ascii_case(&host) || a.eq_ignore_ascii_case(&with_port));
            if !listed {
                return Err(not_allowed(format!(
                    "host {with_port} is not on the allow-list (input_allow_hosts = {})",
                    self.policy.allow_hosts.join(",")
                )));
            }
        }
        Ok(())
    }
}

impl Fetcher {
    /// Refuses link-local and cloud-metadata hosts, by name and by what the
    /// name resolves to.
    async fn check_not_link_local(
        &self,
        index: usize,
        host: &str,
        port: u16,
    ) -> Result<(), JobError> {
        let not_allowed = |why: String| {
            JobError::new(
                ErrorCode::InputNotAllowed,
                format!("inputs[{index}]: {why}"),
            )
        };
        let host = host.to_string();
        if host == "metadata.google.internal" || host == "metadata" {
            return Err(not_allowed(format!(
                "host {host} is a cloud metadata service"
            )));
        }
        // Check what the name resolves to as well as literal addresses.
        let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| {
                    JobError::new(
                        ErrorCode::InputFetchFailed,
                        format!("inputs[{index}]: cannot resolve {host}: {e}"),
                    )
                })?
                .map(|a| a.ip())
                .collect(),
        };
        if let Some(ip) = addrs.iter().find(|ip| is_link_local(ip)) {
            return Err(not_allowed(format!(
                "host {host} is a link-local address ({ip}), where cloud metadata services live (input_allow_link_local is off)"
            )));
        }
        Ok(())
    }
}

fn check_count(out: &FetchedItems, max_items: u64) -> Result<(), JobError> {
    if out.items.len() as u64 > max_items {
        return Err(JobError::new(
            ErrorCode::TooManyItems,
            format!(
                "the job has more than {max_items} items (max_items_per_job); split it into several jobs"
            ),
        ));
    }
    Ok(())
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_link_local())
                // AWS's IPv6 metadata address.
                || v6.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254]
        }
    }
}

/// Parses JSONL (one item per line; blank lines skipped) into `items`.
pub fn parse_jsonl(
    task: Task,
    input: usize,
    body: &[u8],
    items: &mut Vec<Item>,
    max_items: u64,
) -> Result<(), JobError> {
    sluice_schemas::parse_jsonl(task, body, items, max_items).map_err(|e| match e {
        JsonlError::Invalid(m) => {
            JobError::new(ErrorCode::InputInvalid, format!("inputs[{input}]: {m}"))
        }
        JsonlError::TooManyItems(max) => JobError::new(
            ErrorCode::TooManyItems,
            format!(
                "the job has more than {max} items (max_items_per_job); split it into several jobs"
            ),
        ),
    })
}

/// A URL without its query (where presigned credentials live), for messages and logs.
pub fn redact_url(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    truncate_for_message(without_query)
}

fn describe_reqwest(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    // reqwest's Display includes the URL with its query; strip it.
    let detail = e.without_url().to_string();
    format!("{kind}: {detail}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn jsonl_strings_and_objects() {
        let mut items = Vec::new();
        parse_jsonl(
            Task::Embed,
            0,
            b"\"a\"\n\n{\"text\": \"b\"}\n",
            &mut items,
            10,
        )
        .unwrap();
        assert_eq!(items, vec![Item::Text("a".into()), Item::Text("b".into())]);
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let mut items = Vec::new();
        let e = parse_jsonl(Task::Embed, 2, b"\"a\"\nnot json\n", &mut items, 10).unwrap_err();
        assert_eq!(e.code, ErrorCode::InputInvalid);
        assert!(
            e.message.starts_with("inputs[2]: line 2: not JSON"),
            "{}",
            e.message
        );
        let e = parse_jsonl(Task::Embed, 0, b"\"a\"\n\xff\xfe\n", &mut Vec::new(), 10).unwrap_err();
        assert!(e.message.contains("not valid UTF-8"), "{}", e.message);
        let e = parse_jsonl(Task::Embed, 0, b"[1]\n", &mut Vec::new(), 10).unwrap_err();
        assert!(e.message.contains("line 1: an embed item"), "{}", e.message);
        let e =
            parse_jsonl(Task::Embed, 0, b"\"a\"\n\"b\"\n\"c\"\n", &mut Vec::new(), 2).unwrap_err();
        assert_eq!(e.code, ErrorCode::TooManyItems);
    }

    #[test]
    fn link_local_addresses() {
        assert!(is_link_local(&"169.254.169.254".parse().unwrap()));
        assert!(is_link_local(&"fe80::1".parse().unwrap()));
        assert!(is_link_local(&"fd00:ec2::254".parse().unwrap()));
        assert!(!is_link_local(&"127.0.0.1".parse().unwrap()));
        assert!(!is_link_local(&"10.1.2.3".parse().unwrap()));
    }

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            redact_url("http://h:1/b/k.jsonl?X-Amz-Signature=secret"),
            "http://h:1/b/k.jsonl"
        );
    }
}
