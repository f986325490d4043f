//! The harness itself: real servers answer, and S3 really checks signatures.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream};
use aws_sdk_s3::presigning::PresigningConfig;
use futures::StreamExt;
use sluice_tests::{NatsServer, S3Server, unique_name};

#[tokio::test]
async fn jetstream_publish_and_read_back() {
    let nats = NatsServer::start().await.unwrap();
    let js = jetstream::new(nats.connect().await.unwrap());
    let name = unique_name("HARNESS");
    let subject = format!("{name}.jobs");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    let ack = js
        .publish(subject.clone(), "hello".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.sequence, 1);
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("reader".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    let msg = batch.next().await.unwrap().unwrap();
    assert_eq!(&msg.payload[..], b"hello");
    msg.double_ack().await.unwrap();
    let mut stream = js.get_stream(&name).await.unwrap();
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        0,
        "work queue drained"
    );
}

#[tokio::test]
async fn presigned_urls_work_and_tampered_or_expired_ones_are_refused() {
    let s3 = S3Server::start().await.unwrap();
    let client = s3.client();
    let bucket = s3.bucket("harness").await.unwrap();
    let http = reqwest::Client::new();

    // PUT through a presigned URL, GET through another.
    let put = client
        .put_object()
        .bucket(&bucket)
        .key("in/a.jsonl")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(60)).unwrap())
        .await
        .unwrap();
    let resp = http
        .put(put.uri())
        .body("\"hello\"\n")
        .send()
        .await
        .unwrap();
    assert!(
        resp.status().is_success(),
        "presigned PUT: {}",
        resp.status()
    );
    let get = client
        .get_object()
        .bucket(&bucket)
        .key("in/a.jsonl")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(60)).unwrap())
        .await
        .unwrap();
    let resp = http.get(get.uri()).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "\"hello\"\n");

    // Tampered signature: one hex digit changed.
    let url = get.uri().to_string();
    let at = url.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
    let mut tampered = url.clone().into_bytes();
    tampered[at] = if tampered[at] == b'0' { b'1' } else { b'0' };
    let resp = http
        .get(String::from_utf8(tampered).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403, "a tampered signature must be refused");

    // Tampered key: the signature covers the path.
    let other = url.replace("in/a.jsonl", "in/b.jsonl");
    let resp = http.get(other).send().await.unwrap();
    assert_eq!(
        resp.status(),
        403,
        "a URL moved to another key must be refused"
    );

    // Unsigned: refused.
    let resp = http
        .get(format!("{}/{bucket}/in/a.jsonl", s3.endpoint()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403, "anonymous reads must be refused");

    // Expired.
    let short = client
        .get_object()
        .bucket(&bucket)
        .key("in/a.jsonl")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(1)).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let resp = http.get(short.uri()).send().await.unwrap();
    assert_eq!(resp.status(), 403, "an expired URL must be refused");
}

#[tokio::test]
async fn servers_are_gone_after_drop() {
    let nats = NatsServer::start().await.unwrap();
    let pid = nats.pid().unwrap();
    drop(nats);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "nats-server {pid} still running after drop"
    );
}
