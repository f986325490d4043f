//! Inputs: download from presigned URLs with a byte cap, a timeout and the
//! address policy of `addresses.rs` (internal addresses closed unless the
//! host is listed, enforced where the connection is made); parse JSONL into
//! items. Inline items go through the same parser.

pub mod addresses;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use self::addresses::{GuardedResolver, Lookup, NotAllowed, Reach, SystemLookup, refusal};

use serde_json::Value;
use sluice_schemas::{ErrorCode, Input, InputFormat, Item, JsonlError, Task, truncate_for_message};

use crate::error::JobError;

/// Who may be fetched from, and how much.
#[derive(Debug, Clone)]
pub struct FetchPolicy {
    /// `host` or `host:port`. Empty: any host on a public address. Listed
    /// hosts (and only they, when any are listed) may be internal.
    pub allow_hosts: Vec<String>,
    /// `host:port`s always allowed, internal or not: the consumer's own S3
    /// endpoint.
    pub trusted_hosts: Vec<String>,
    pub allow_link_local: bool,
    /// Cap on the bytes of all of a job's inputs together.
    pub max_bytes: u64,
    pub timeout: Duration,
}

pub struct Fetcher {
    /// For hosts not listed: public addresses only.
    public: reqwest::Client,
    /// For listed and trusted hosts: internal addresses too.
    listed: reqwest::Client,
    policy: FetchPolicy,
}

/// A job's items and the bytes they were read from.
#[derive(Debug, Default)]
pub struct FetchedItems {
    pub items: Vec<Item>,
    pub bytes: u64,
}

/// One of a job's inputs, read: what its task parses into items.
#[derive(Debug)]
pub enum InputBody<'a> {
    /// Items carried in the job message itself.
    Inline(&'a [Value]),
    /// A downloaded object, in the format its job names.
    Object(Downloaded),
}

/// A downloaded object: its bytes, and what its server said they are.
#[derive(Debug)]
pub struct Downloaded {
    pub bytes: Vec<u8>,
    /// The `Content-Type` the server answered, if any.
    pub content_type: Option<String>,
    pub format: InputFormat,
}

impl Fetcher {
    pub fn new(policy: FetchPolicy) -> Result<Fetcher, reqwest::Error> {
        Fetcher::with_lookup(policy, Arc::new(SystemLookup))
    }

    /// A fetcher whose clients resolve names through `lookup` (the system's
    /// resolver in [`Fetcher::new`]; a table in tests).
    pub fn with_lookup(
        policy: FetchPolicy,
        lookup: Arc<dyn Lookup>,
    ) -> Result<Fetcher, reqwest::Error> {
        let client = |internal: bool| {
            let resolver = GuardedResolver {
                lookup: Arc::clone(&lookup),
                reach: Reach {
                    internal,
                    link_local: policy.allow_link_local,
                },
            };
            reqwest::Client::builder()
                // A redirect could lead past the policy: never follow one.
                .redirect(reqwest::redirect::Policy::none())
                // Nor a proxy from the environment (HTTP_PROXY, ALL_PROXY):
                // through one the guarded resolver never sees the input's
                // host, and the proxy would fetch `localhost` for us.
                .no_proxy()
                .timeout(policy.timeout)
                .connect_timeout(policy.timeout.min(Duration::from_secs(10)))
                .dns_resolver(Arc::new(resolver))
                .build()
        };
        Ok(Fetcher {
            public: client(false)?,
            listed: client(true)?,
            policy,
        })
    }

    /// Reads a job's inputs in order: each URL's object downloaded (within
    /// `--max-input-bytes` in all) and handed to `read` with its index, as
    /// is each inline list, before the next is fetched.
    pub async fn read(
        &self,
        inputs: &[Input],
        mut read: impl FnMut(usize, InputBody<'_>, &mut FetchedItems) -> Result<(), JobError>,
    ) -> Result<FetchedItems, JobError> {
        let mut out = FetchedItems::default();
        for (i, input) in inputs.iter().enumerate() {
            let body = match input {
                Input::Inline { items } => InputBody::Inline(items),
                Input::Url { url, format, .. } => {
                    let remaining = self.policy.max_bytes.saturating_sub(out.bytes);
                    let (bytes, content_type) = self.download(i, url, remaining).await?;
                    out.bytes += bytes.len() as u64;
                    InputBody::Object(Downloaded {
                        bytes,
                        content_type,
                        format: *format,
                    })
                }
            };
            read(i, body, &mut out)?;
        }
        Ok(out)
    }

    /// Downloads one input of at most `cap` bytes, with its content type.
    async fn download(
        &self,
        index: usize,
        url: &str,
        cap: u64,
    ) -> Result<(Vec<u8>, Option<String>), JobError> {
        let shown = redact_url(url);
        let parsed = url::Url::parse(url).map_err(|e| {
            JobError::new(
                ErrorCode::SchemaViolation,
                format!("inputs[{index}].url {shown} is not a URL: {e}"),
            )
        })?;
        let http = self.client_for(index, &parsed)?;
        let transient = |what: String| JobError::new(ErrorCode::InputFetchFailed, what);
        let mut resp = http
            .get(parsed)
            .send()
            .await
            .map_err(|e| match not_allowed_in(&e) {
                Some(why) => JobError::new(
                    ErrorCode::InputNotAllowed,
                    format!("inputs[{index}] {shown}: {why}"),
                ),
                None => transient(format!("inputs[{index}] {shown}: {}", describe_reqwest(e))),
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
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
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
        Ok((body, content_type))
    }

    /// The client that may fetch `url` (the listed one for a listed or
    /// trusted host), after the checks that need no lookup: scheme, the
    /// allow-list, metadata names, and literal addresses (which no resolver
    /// sees).
    fn client_for(&self, index: usize, url: &url::Url) -> Result<&reqwest::Client, JobError> {
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
        let Some((host, port)) = host_and_port(url) else {
            return Err(not_allowed("the URL has no host".into()));
        };
        let with_port = format!("{host}:{port}");
        let matches = |list: &[String]| {
            list.iter()
                .any(|a| a.eq_ignore_ascii_case(&host) || a.eq_ignore_ascii_case(&with_port))
        };
        let trusted = self
            .policy
            .trusted_hosts
            .iter()
            .any(|a| a.eq_ignore_ascii_case(&with_port));
        let listed = matches(&self.policy.allow_hosts);
        if !self.policy.allow_link_local
            && (host == "metadata.google.internal" || host == "metadata")
        {
            return Err(not_allowed(format!(
                "host {host} is a cloud metadata service"
            )));
        }
        let reach = Reach {
            internal: listed || trusted,
            link_local: self.policy.allow_link_local,
        };
        if let Ok(ip) = host.parse::<IpAddr>()
            && let Some(why) = refusal(ip, reach)
        {
            return Err(not_allowed(format!("host {why}")));
        }
        if !self.policy.allow_hosts.is_empty() && !listed && !trusted {
            return Err(not_allowed(format!(
                "host {with_port} is not on the allow-list (input_allow_hosts = {})",
                self.policy.allow_hosts.join(",")
            )));
        }
        Ok(if reach.internal {
            &self.listed
        } else {
            &self.public
        })
    }
}

/// A URL's host (lowercase, IPv6 without brackets) and port (the scheme's
/// default when it names none; 0 when it has none): how the allow-list and
/// the trusted S3 endpoint are matched.
pub fn host_and_port(url: &url::Url) -> Option<(String, u16)> {
    let host = url
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    Some((host, url.port_or_known_default().unwrap_or(0)))
}

/// The policy's refusal, when the resolver refused the URL's host.
fn not_allowed_in(e: &reqwest::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(refused) = err.downcast_ref::<NotAllowed>() {
            return Some(refused.to_string());
        }
        source = err.source();
    }
    None
}

/// Input `index`'s items as a task of JSONL lines and inline entries
/// reads them (`Item::from_value`), added to `out` within `max_items`.
pub fn read_input(
    task: Task,
    index: usize,
    input: InputBody<'_>,
    out: &mut FetchedItems,
    max_items: u64,
) -> Result<(), JobError> {
    match input {
        InputBody::Inline(items) => {
            for (j, v) in items.iter().enumerate() {
                let item = Item::from_value(task, v.clone()).map_err(|m| {
                    JobError::new(
                        ErrorCode::InputInvalid,
                        format!("inputs[{index}].items[{j}]: {m}"),
                    )
                })?;
                out.items.push(item);
                check_count(out, max_items)?;
            }
            Ok(())
        }
        InputBody::Object(object) => match object.format {
            InputFormat::Jsonl => {
                parse_jsonl(task, index, &object.bytes, &mut out.items, max_items)
            }
            // The job's checks refuse it first; a task reading audio reads
            // its own inputs.
            InputFormat::Audio => Err(JobError::new(
                ErrorCode::InputInvalid,
                format!("inputs[{index}] is an audio file; the {task} task reads jsonl"),
            )),
        },
    }
}

/// Refuses a job past `max_items` items.
pub fn check_count(out: &FetchedItems, max_items: u64) -> Result<(), JobError> {
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
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            redact_url("http://h:1/b/k.jsonl?X-Amz-Signature=secret"),
            "http://h:1/b/k.jsonl"
        );
    }

    /// A loopback server that answers every request with one JSONL line.
    async fn serve_one_line() -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 2048];
                let _ = conn.read(&mut buf).await;
                let body = "\"hello\"\n";
                let _ = conn
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/jsonl\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        port
    }

    /// Resolves names from a table, as a hostile DNS server could answer.
    struct Table(Vec<(&'static str, IpAddr)>);

    impl Lookup for Table {
        fn lookup(
            &self,
            host: String,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
        {
            let found: Vec<IpAddr> = self
                .0
                .iter()
                .filter(|(name, _)| *name == host)
                .map(|(_, ip)| *ip)
                .collect();
            Box::pin(async move {
                if found.is_empty() {
                    Err(std::io::Error::other(format!("no such host {host}")))
                } else {
                    Ok(found)
                }
            })
        }
    }

    fn fetcher(allow_hosts: &[String], trusted_hosts: &[String]) -> Fetcher {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let table = Table(vec![
            ("inputs.internal.test", loopback),
            ("rebound.test", "93.184.216.34".parse().unwrap()),
            ("rebound.test", "10.0.0.7".parse().unwrap()),
            ("metadata.test", "169.254.169.254".parse().unwrap()),
        ]);
        Fetcher::with_lookup(
            FetchPolicy {
                allow_hosts: allow_hosts.to_vec(),
                trusted_hosts: trusted_hosts.to_vec(),
                allow_link_local: false,
                max_bytes: 1 << 20,
                timeout: Duration::from_secs(5),
            },
            Arc::new(table),
        )
        .unwrap()
    }

    async fn fetch(f: &Fetcher, url: &str) -> Result<FetchedItems, JobError> {
        let input = Input::Url {
            url: url.to_string(),
            format: sluice_schemas::InputFormat::Jsonl,
            object: None,
        };
        f.read(&[input], |i, body, out| {
            read_input(Task::Embed, i, body, out, 100)
        })
        .await
    }

    fn refused_with(result: Result<FetchedItems, JobError>, words: &str) {
        match result {
            Err(e) => {
                assert_eq!(e.code, ErrorCode::InputNotAllowed, "{e:?}");
                assert!(e.message.contains(words), "{}", e.message);
            }
            Ok(_) => panic!("fetched; expected a refusal naming {words:?}"),
        }
    }

    /// An object comes back as its bytes with the content type its server
    /// gave, for its task to read; inline items as they are.
    #[tokio::test]
    async fn inputs_come_back_as_bytes_with_their_content_type() {
        let port = serve_one_line().await;
        let f = fetcher(&[format!("127.0.0.1:{port}")], &[]);
        let inputs = [
            Input::Inline {
                items: vec![serde_json::json!("inline")],
            },
            Input::Url {
                url: format!("http://127.0.0.1:{port}/in.jsonl"),
                format: sluice_schemas::InputFormat::Jsonl,
                object: None,
            },
        ];
        let mut seen = Vec::new();
        let items = f
            .read(&inputs, |i, body, out| {
                if let InputBody::Object(object) = &body {
                    seen.push((i, object.bytes.clone(), object.content_type.clone()));
                }
                read_input(Task::Embed, i, body, out, 10)
            })
            .await
            .unwrap();
        assert_eq!(
            seen,
            vec![(1, b"\"hello\"\n".to_vec(), Some("application/jsonl".into()))]
        );
        assert_eq!(
            items.items,
            vec![Item::Text("inline".into()), Item::Text("hello".into())]
        );
        assert_eq!(items.bytes, 8);
    }

    #[tokio::test]
    async fn internal_addresses_are_refused_unless_the_host_is_listed_or_trusted() {
        let port = serve_one_line().await;
        let by_ip = format!("http://127.0.0.1:{port}/in.jsonl");
        let by_name = format!("http://inputs.internal.test:{port}/in.jsonl");

        // Closed by default, by literal address and by what a name resolves to.
        let closed = fetcher(&[], &[]);
        refused_with(
            fetch(&closed, &by_ip).await,
            "127.0.0.1 is a loopback address",
        );
        refused_with(
            fetch(&closed, &by_name).await,
            "inputs.internal.test resolves to 127.0.0.1",
        );
        // One internal address among public ones is enough to refuse the name.
        refused_with(
            fetch(&closed, "http://rebound.test/in.jsonl").await,
            "10.0.0.7 is a private (RFC 1918) address",
        );
        refused_with(
            fetch(&closed, "http://metadata.test/").await,
            "input_allow_link_local is off",
        );

        // Listed (by host:port, or by name), the same URLs are fetched: the
        // connection goes to the address the guard checked.
        let listed = fetcher(
            &[format!("127.0.0.1:{port}"), "inputs.internal.test".into()],
            &[],
        );
        for url in [&by_ip, &by_name] {
            let got = fetch(&listed, url).await.unwrap();
            assert_eq!(got.items, vec![Item::Text("hello".into())], "{url}");
        }
        // Listing does not open link-local.
        let listed = fetcher(&["metadata.test".into()], &[]);
        refused_with(
            fetch(&listed, "http://metadata.test/").await,
            "input_allow_link_local is off",
        );

        // The consumer's own S3 endpoint is trusted without a list, and
        // with one that does not name it.
        let trusted = [format!("127.0.0.1:{port}")];
        for allow in [vec![], vec!["example.com".to_string()]] {
            let s3 = fetcher(&allow, &trusted);
            assert_eq!(fetch(&s3, &by_ip).await.unwrap().items.len(), 1);
        }
        // Another port on the same host is not the endpoint.
        refused_with(
            fetch(
                &fetcher(&[], &trusted),
                &format!("http://127.0.0.1:{}/", port + 1),
            )
            .await,
            "loopback",
        );
    }
}
