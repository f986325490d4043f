//! What one client can hold of the gateway (`gateway/src/bounds.rs`,
//! `files.rs`'s form limits), each written as the attack: a form field of
//! 100 MB, two files in one form, an upload that stalls, headers that never
//! end, and more connections than the gateway serves.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::deploy::{Deployment, GatewayProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEYS: &str = "team-a:sk-team-a-bounds\n";
const KEY_A: &str = "sk-team-a-bounds";
const BOUNDARY: &str = "sluice-bounds-7f3a";

/// A response read off a raw connection: the status and the JSON body (or
/// `Null`), with its headers lower-cased.
struct Answer {
    status: u16,
    headers: String,
    body: Value,
    body_bytes: usize,
}

/// Reads one HTTP/1.1 response with a `content-length` off `tcp`, within
/// `limit`; `None` when the connection closed (or the time ran out) first.
async fn read_answer(tcp: &mut (impl AsyncReadExt + Unpin), limit: Duration) -> Option<Answer> {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
                    let body = &buf[end + 4..end + 4 + length];
                    return Some(Answer {
                        status,
                        headers: head,
                        body: serde_json::from_slice(body).unwrap_or(Value::Null),
                        body_bytes: length,
                    });
                }
            }
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read).await.ok().flatten()
}

/// `POST /v1/files` on a raw connection: the head, then `parts` written one
/// after another (write errors ignored: the gateway may answer and close
/// before the body ends), then the answer, read concurrently.
async fn post_form(
    gateway: &GatewayProcess,
    content_length: usize,
    parts: Vec<Vec<u8>>,
    stall_after: bool,
) -> Option<Answer> {
    let tcp = TcpStream::connect(gateway.addr).await.unwrap();
    let (mut reader, mut writer) = tcp.into_split();
    let head = format!(
        "POST /v1/files HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: multipart/form-data; boundary={BOUNDARY}\r\ncontent-length: {content_length}\r\n\r\n",
        gateway.addr
    );
    let writing = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        for part in parts {
            writer.write_all(&part).await?;
        }
        if stall_after {
            // Hold the connection open without sending more.
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Ok::<_, std::io::Error>(writer)
    });
    let answer = read_answer(&mut reader, Duration::from_secs(30)).await;
    writing.abort();
    answer
}

/// A response's status, `Retry-After` (seconds) and JSON body (or `Null`).
async fn answered(response: reqwest::Response) -> (u16, Option<u64>, Value) {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let bytes = response.bytes().await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, retry_after, body)
}

fn field_head(name: &str, filename: Option<&str>) -> Vec<u8> {
    let filename = filename.map_or(String::new(), |f| format!("; filename=\"{f}\""));
    format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"{filename}\r\n\r\n")
        .into_bytes()
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A 100 MB `purpose` field was read whole into memory (peak 893 MiB for
/// 300 MB) and echoed back in the 400. Now: refused after 256 bytes, the
/// answer short, the gateway's memory flat.
#[tokio::test]
async fn a_huge_form_field_is_refused_without_being_held_or_echoed() {
    let d = Deployment::start().await.unwrap();
    let gateway = d.spawn_gateway(KEYS, &[]).await.unwrap();
    let pid = gateway.pid().unwrap();
    let before = peak_rss_kib(pid);
    let field = 100 << 20;
    let mut parts = vec![field_head("purpose", None)];
    parts.extend((0..field / (1 << 20)).map(|_| vec![b'x'; 1 << 20]));
    let length = parts.iter().map(Vec::len).sum::<usize>() + 64;
    let answer = post_form(&gateway, length, parts, false).await.unwrap();
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.body["error"]["param"], "purpose", "{}", answer.body);
    assert!(
        answer.body_bytes < 1024,
        "the refusal echoed {} bytes",
        answer.body_bytes
    );
    let grew_mib = (peak_rss_kib(pid) - before) / 1024;
    assert!(
        grew_mib < 32,
        "the gateway's peak memory grew {grew_mib} MiB"
    );
    assert!(d.keys_under("gateway/files/").await.unwrap().is_empty());
}

/// A second `file` field was refused, but the first stayed in S3 with no
/// record, where nothing would ever find (or sweep) it.
#[tokio::test]
async fn a_form_with_two_files_leaves_no_object_behind() {
    let d = Deployment::start().await.unwrap();
    let gateway = d.spawn_gateway(KEYS, &[]).await.unwrap();
    let line = b"{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"model\": \"m\", \"input\": \"x\"}}\n";
    let mut body = field_head("purpose", None);
    body.extend_from_slice(b"batch\r\n");
    for name in ["one.jsonl", "two.jsonl"] {
        body.extend(field_head("file", Some(name)));
        body.extend_from_slice(line);
        body.extend_from_slice(b"\r\n");
    }
    body.extend(format!("--{BOUNDARY}--\r\n").into_bytes());
    let answer = post_form(&gateway, body.len(), vec![body], false)
        .await
        .unwrap();
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.body["error"]["param"], "file", "{}", answer.body);
    let left = d.keys_under("gateway/files/").await.unwrap();
    assert!(left.is_empty(), "objects left behind: {left:?}");
}

/// An upload that stalls with its connection open kept its parts (and a
/// task) for as long as the client liked; a JSON body that stalls held its
/// request. Now both are answered 408 after `--body-idle-secs`, in
/// OpenAI's shape, and the upload's parts are removed.
#[tokio::test]
async fn a_stalled_body_is_answered_408_and_an_uploads_parts_removed() {
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .spawn_gateway(KEYS, &["--body-idle-secs=2"])
        .await
        .unwrap();
    // More than one part (8 MiB) of the file, then nothing.
    let mut parts = vec![field_head("purpose", None), b"batch\r\n".to_vec()];
    parts.push(field_head("file", Some("big.jsonl")));
    parts.extend((0..10).map(|_| vec![b' '; 1 << 20]));
    let started = Instant::now();
    let answer = post_form(&gateway, 64 << 20, parts, true).await;
    let answer = answer.expect("the stalled upload was held past 30 s");
    assert_eq!(answer.status, 408, "{}", answer.body);
    assert_eq!(answer.body["error"]["code"], "request_timeout");
    assert!(started.elapsed() < Duration::from_secs(20));
    let s3 = d.servers.s3.client();
    let uploads = s3
        .list_multipart_uploads()
        .bucket(&d.bucket)
        .prefix("gateway/files/")
        .send()
        .await
        .unwrap();
    assert!(
        uploads.uploads().is_empty(),
        "parts left: {:?}",
        uploads.uploads()
    );
    assert!(d.keys_under("gateway/files/").await.unwrap().is_empty());

    let tcp = TcpStream::connect(gateway.addr).await.unwrap();
    let (mut reader, mut writer) = tcp.into_split();
    let head = format!(
        "POST /v1/embeddings HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"model\": ",
        gateway.addr
    );
    writer.write_all(head.as_bytes()).await.unwrap();
    let answer = read_answer(&mut reader, Duration::from_secs(20))
        .await
        .expect("the stalled JSON body was held past 20 s");
    assert_eq!(answer.status, 408, "{}", answer.body);
    assert_eq!(answer.body["error"]["type"], "invalid_request_error");
    drop(writer);
    let log = gateway.log();
    assert!(
        !log.contains("ERROR"),
        "a client's stall logged an ERROR:\n{log}"
    );
}

/// Headers that never end (slow-loris) and a kept-alive connection that
/// never sends its next request were held for as long as the client liked.
/// Now each is closed after `--header-timeout-secs`.
#[tokio::test]
async fn headers_that_never_end_and_idle_connections_are_closed() {
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .spawn_gateway(KEYS, &["--header-timeout-secs=2"])
        .await
        .unwrap();
    let mut slow = TcpStream::connect(gateway.addr).await.unwrap();
    slow.write_all(b"GET /v1/files HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(gateway.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let first = read_answer(&mut idle, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    for (what, tcp) in [
        ("slow headers", &mut slow),
        ("an idle keep-alive", &mut idle),
    ] {
        let closed = tokio::time::timeout(Duration::from_secs(15), async {
            let mut buf = [0u8; 1024];
            // Whatever the gateway says (a 408 or nothing), it then closes.
            while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
        })
        .await;
        assert!(closed.is_ok(), "{what} was held past 15 s");
    }
}

/// 3,000 half-open connections were all held, each a task and buffers.
/// Now one past `--max-connections` is answered 503 with `Retry-After` and
/// closed, and a slot freed is served again.
#[tokio::test]
async fn connections_past_the_cap_are_answered_503_with_retry_after() {
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .spawn_gateway(KEYS, &["--max-connections=4"])
        .await
        .unwrap();
    // Four kept-alive connections, each proven to hold a slot by an answer
    // (a slot may still be held for a moment by the harness's readiness
    // probe, whose close the gateway has not yet seen: then a connection is
    // refused, and another tried).
    let mut held = Vec::new();
    let until = Instant::now() + Duration::from_secs(30);
    while held.len() < 4 {
        let mut tcp = TcpStream::connect(gateway.addr).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        match read_answer(&mut tcp, Duration::from_secs(10)).await {
            Some(a) if a.status == 200 => held.push(tcp),
            other => {
                assert!(
                    Instant::now() < until,
                    "4 connections were not served in 30 s: {:?}",
                    other.map(|a| a.status)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let mut extra = TcpStream::connect(gateway.addr).await.unwrap();
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let answer = read_answer(&mut extra, Duration::from_secs(10))
        .await
        .expect("the connection past the cap got no answer");
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(
        answer.headers.contains("retry-after: 1"),
        "{}",
        answer.headers
    );
    assert_eq!(answer.body["error"]["code"], "too_many_connections");
    drop(held);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut tcp = TcpStream::connect(gateway.addr).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let status = read_answer(&mut tcp, Duration::from_secs(5))
            .await
            .map(|a| a.status);
        if status == Some(200) {
            break;
        }
        assert!(
            Instant::now() < until,
            "a freed slot was not served again: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One tenant cannot take the gateway's requests for itself: at
/// `--rate-limit-rps=1 --rate-limit-burst=3`, ten requests at once from
/// team A's key get three answers (and one more per second they took), the
/// rest 429 `rate_limit_exceeded` in OpenAI's shape with `Retry-After`;
/// team B is served meanwhile; after the wait team A is served again.
#[tokio::test]
async fn a_tenant_past_its_request_rate_is_told_to_wait_and_others_are_served() {
    const KEYS: &str = "team-a:sk-team-a-rate,team-b:sk-team-b-rate";
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--rate-limit-rps=1", "--rate-limit-burst=3"])
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let models = format!("http://{}/v1/models", gateway.addr);
    let get = |key: &'static str| {
        let request = http.get(&models).bearer_auth(key);
        async move { answered(request.send().await.unwrap()).await }
    };
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..10 {
        answers.push(get("sk-team-a-rate").await);
    }
    let took = started.elapsed().as_secs_f64();
    let served = answers.iter().filter(|(s, ..)| *s == 200).count();
    eprintln!("team A: {served} of 10 served in {took:.2} s");
    assert!(
        answers[..3].iter().all(|(s, ..)| *s == 200),
        "the burst is served: {answers:?}"
    );
    assert!(
        served <= 3 + took.ceil() as usize,
        "{served} served in {took} s: {answers:?}"
    );
    let refused: Vec<_> = answers.iter().filter(|(s, ..)| *s != 200).collect();
    assert!(
        !refused.is_empty(),
        "ten requests at once at 1 a second: {answers:?}"
    );
    let mut wait = 0;
    for (status, retry_after, body) in refused {
        assert_eq!(*status, 429, "{body}");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
        assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
        let secs = retry_after.unwrap_or_else(|| panic!("no Retry-After: {body}"));
        assert!((1..=2).contains(&secs), "Retry-After {secs}: {body}");
        wait = wait.max(secs);
    }
    let (status, _, body) = get("sk-team-b-rate").await;
    assert_eq!(status, 200, "team B is not held by team A's rate: {body}");
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let (status, _, body) = get("sk-team-a-rate").await;
    assert_eq!(status, 200, "after Retry-After, team A is served: {body}");
}

/// One tenant cannot take the model's tokens for itself: at
/// `--token-rate-limit-tpm=60` (one a second), a request of team A's whose
/// answer used more than that is served (it was admitted before it was
/// known), and leaves team A in debt: its next request is answered 429
/// `rate_limit_exceeded` of type `tokens` with the `Retry-After` that
/// refills the debt, and no job is published for it; team B is served
/// meanwhile.
#[tokio::test]
async fn a_tenant_past_its_token_rate_waits_for_what_it_used_and_others_are_served() {
    const KEYS: &str = "team-a:sk-team-a-tokens,team-b:sk-team-b-tokens";
    let d = Deployment::start().await.unwrap();
    let _consumer = d.start_consumer(&[]).await.unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--token-rate-limit-tpm=60"])
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let url = format!("http://{}/v1/embeddings", gateway.addr);
    let text = "the backlog waits in the stream while the consumers pull only what fits ".repeat(8);
    let embed = |key: &'static str| {
        let request = http
            .post(&url)
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(serde_json::json!({"model": "all-minilm-l6-v2", "input": text}).to_string());
        async move { answered(request.send().await.unwrap()).await }
    };
    let (status, _, first) = embed("sk-team-a-tokens").await;
    assert_eq!(status, 200, "{first}");
    let used = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        used > 60,
        "the request used {used} tokens, more than a minute's 60"
    );
    let published = d.jobs_published().await;
    let (status, retry_after, body) = embed("sk-team-a-tokens").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(body["error"]["type"], "tokens", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--token-rate-limit-tpm"),
        "{body}"
    );
    // In debt by `used - 60`, refilled at one a second: that many seconds
    // (and one for the token it needs), give or take the second between.
    let secs = retry_after.unwrap_or_else(|| panic!("no Retry-After: {body}"));
    let debt = used - 60;
    assert!(
        (debt..=debt + 3).contains(&secs),
        "Retry-After {secs} for a debt of {debt}: {body}"
    );
    assert_eq!(
        d.jobs_published().await,
        published,
        "no job was published for the refused request"
    );
    let (status, _, body) = embed("sk-team-b-tokens").await;
    assert_eq!(status, 200, "team B is not held by team A's tokens: {body}");
}

/// One gateway answers at most `--max-online-requests` online requests at
/// once: with two held open (no consumer: their jobs wait out their 30 s
/// deadlines), a third is answered 503 `too_many_requests_in_flight` with
/// `Retry-After` at once (the cap is checked before the handler reads the
/// body); other routes are served; once the two clients go away, their
/// slots are free again.
#[tokio::test]
async fn online_requests_past_the_gateways_cap_are_refused_at_once() {
    const KEYS: &str = "team-a:sk-team-a-in-flight";
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--max-online-requests=2"])
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://{}/v1", gateway.addr);
    let embed = |deadline_secs: &str| {
        http.post(format!("{base}/embeddings"))
            .bearer_auth("sk-team-a-in-flight")
            .header("sluice-deadline-secs", deadline_secs)
            .header("content-type", "application/json")
            .body(r#"{"model": "all-minilm-l6-v2", "input": "held"}"#)
            .send()
    };
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(embed("30"))).collect();
    // A probe with a 1 s deadline is admitted (and answered 504) until the
    // two hold both slots.
    let until = Instant::now() + Duration::from_secs(25);
    let refused = loop {
        let asked = Instant::now();
        let response = embed("1").await.unwrap();
        let status = response.status().as_u16();
        if status == 503 {
            break (asked.elapsed(), response);
        }
        assert_eq!(status, 504, "a probe admitted waits out its deadline");
        assert!(
            Instant::now() < until,
            "the two requests never held both slots"
        );
    };
    let (took, response) = refused;
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    eprintln!("refused in {took:?}: {body}");
    assert!(
        took < Duration::from_secs(1),
        "refused at once, not queued: {took:?}"
    );
    assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
    assert_eq!(
        body["error"]["code"], "too_many_requests_in_flight",
        "{body}"
    );
    let models = http
        .get(format!("{base}/models"))
        .bearer_auth("sk-team-a-in-flight")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status().as_u16(), 200, "other routes are not capped");
    // The two clients go away: their slots come back.
    for h in held {
        h.abort();
    }
    let until = Instant::now() + Duration::from_secs(25);
    loop {
        let status = embed("1").await.unwrap().status().as_u16();
        if status == 504 {
            break;
        }
        assert_eq!(status, 503);
        assert!(Instant::now() < until, "the slots never came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One tenant could fill the bucket: uploads had no bound but each file's
/// size. With `--max-tenant-file-bytes`, an upload that would take its
/// tenant past the quota is refused 413 `storage_quota_exceeded` at the byte
/// that would pass it, leaving no object and no record; another tenant is
/// not held by it, and the tenant has room again once it deletes a file.
#[tokio::test]
async fn a_tenant_cannot_store_past_its_quota_and_others_are_not_held_by_it() {
    const KEYS: &str = "team-a:sk-team-a-quota,team-b:sk-team-b-quota";
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--max-tenant-file-bytes=3000"])
        .await
        .unwrap();
    let api = sluice_tests::api::Api::new(gateway.addr);
    let line = "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"model\": \"m\", \"input\": \"x\"}}\n";
    let file = line.repeat(2000 / line.len() + 1).into_bytes();
    assert!(file.len() > 1500 && file.len() < 3000, "{}", file.len());

    let (status, first) = api.upload("sk-team-a-quota", &file).await;
    assert_eq!(status, 200, "{first}");
    let (status, refused) = api.upload("sk-team-a-quota", &file).await;
    assert_eq!(status, 413, "{refused}");
    assert_eq!(
        refused["error"]["code"], "storage_quota_exceeded",
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("hold {} of 3000 bytes", file.len()))
            && message.contains("--max-tenant-file-bytes"),
        "{message}"
    );
    // Nothing of the refused upload is left: one object, one listed file.
    let objects = d.keys_under("gateway/files/").await.unwrap();
    assert_eq!(objects.len(), 1, "{objects:?}");
    let (_, listed) = api.get("/files", "sk-team-a-quota").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "{listed}");

    // Team B's room is its own.
    let (status, theirs) = api.upload("sk-team-b-quota", &file).await;
    assert_eq!(status, 200, "{theirs}");

    // Deleting a file gives team A its room back.
    let id = first["id"].as_str().unwrap();
    let (status, deleted) = api
        .send(
            api.http.delete(format!("{}/files/{id}", api.base)),
            Some("sk-team-a-quota"),
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    let (status, again) = api.upload("sk-team-a-quota", &file).await;
    assert_eq!(status, 200, "{again}");
}
