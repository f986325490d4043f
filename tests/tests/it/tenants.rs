//! Tenant fair share by token cost. Issue #19's check: tenant A floods
//! 10,000 jobs of 64 long texts; tenant B then submits 200 jobs of 8 short
//! texts. While both have a backlog each gets about half the consumer's
//! tokens (target: within 10% of equal), so B is done in about twice the
//! time its own tokens take, not after A's backlog.

use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_producer::Submission;
use sluice_schemas::{Input, Outcome, Task};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::jsonl;

const T: Duration = Duration::from_secs(300);
const A_JOBS: usize = 10_000;
const B_JOBS: usize = 200;

/// A text of about `words` word-piece tokens, numbered.
fn text(i: usize, words: usize) -> String {
    const WORDS: [&str; 16] = [
        "the",
        "river",
        "carries",
        "water",
        "from",
        "high",
        "mountains",
        "down",
        "to",
        "a",
        "quiet",
        "valley",
        "where",
        "people",
        "grow",
        "rice",
    ];
    let mut t = format!("text {i}:");
    for w in 0..words {
        t.push(' ');
        t.push_str(WORDS[(i + w) % WORDS.len()]);
    }
    t
}

fn tokens_of(stats: &[(String, u64)], tenant: &str) -> u64 {
    stats
        .iter()
        .find(|(t, _)| t == tenant)
        .map_or(0, |(_, n)| *n)
}

#[tokio::test]
async fn a_small_tenant_gets_an_equal_token_share_beside_a_flood() {
    let d = Deployment::start().await.unwrap();
    // A tenant name that is not a subject token is refused before anything
    // is published.
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.jsonl");
    std::fs::write(&one, jsonl(&["a text".to_string()])).unwrap();
    let bad = d
        .cli(
            &["submit", "--tenant", "a.b", one.to_str().unwrap()],
            None,
            T,
        )
        .await;
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.stderr.contains("is not a tenant name"), "{bad:?}");
    assert_eq!(d.jobs_in_stream().await, 0);

    // A: 10,000 jobs, each the same uploaded input of 64 long texts.
    let long: Vec<String> = (0..64).map(|i| text(i, 110)).collect();
    let a_input = d
        .producer
        .upload_input("tenant-a.jsonl", jsonl(&long))
        .await
        .unwrap();
    let a_jobs = (0..A_JOBS).map(|i| {
        let job = d
            .producer
            .job(Task::Embed, &format!("a-{i}"), vec![a_input.clone()]);
        let mut s = Submission::new(&d.producer, job, None);
        s.tenant = Some("a".into());
        s
    });
    let a_jobs: Vec<Submission> = a_jobs.collect();
    let mut acks = d.producer.submit_pipelined(a_jobs, 256).await.unwrap();
    while let Some(s) = acks.next().await {
        s.ack.unwrap();
    }
    drop(acks);
    let watch = d.cli(&["watch", "--once", "--json"], None, T).await;
    assert_eq!(
        watch.json_lines()[0]["stream"]["pending_by_priority"]["normal"],
        A_JOBS,
        "{watch:?}"
    );

    let mut results = d.producer.subscribe_results().await.unwrap();
    let consumer = d.start_consumer(&[]).await.unwrap();
    // Let A's jobs run a while alone.
    let mut a_done = 0;
    while a_done < 3 {
        let r = tokio::time::timeout(T, results.next_result())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
        a_done += 1;
    }
    let a_alone_tokens = tokens_of(&consumer.stats.tenant_tokens(), "a");

    // B: 200 jobs of 8 short texts, inline.
    let b_jobs: Vec<Submission> = (0..B_JOBS)
        .map(|i| {
            let items = (0..8).map(|k| text(i * 8 + k, 28).into()).collect();
            let job = d.producer.job(
                Task::Embed,
                &format!("b-{i}"),
                vec![Input::Inline { items }],
            );
            let mut s = Submission::new(&d.producer, job, None);
            s.tenant = Some("b".into());
            s
        })
        .collect();
    let b_published = Instant::now();
    let mut acks = d.producer.submit_pipelined(b_jobs, 256).await.unwrap();
    while let Some(s) = acks.next().await {
        s.ack.unwrap();
    }
    drop(acks);

    // Sample the tokens served per tenant while B's jobs complete.
    let mut samples: Vec<(u64, u64)> = Vec::new();
    let mut b_done = 0;
    let mut b_tokens = 0;
    let mut sample_every = tokio::time::interval(Duration::from_millis(20));
    while b_done < B_JOBS {
        tokio::select! {
            r = results.next_result() => {
                let r = r.unwrap();
                assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
                if r.job_id.as_deref().unwrap_or("").starts_with("b-") {
                    b_done += 1;
                    b_tokens += r.usage.tokens;
                } else {
                    a_done += 1;
                }
            }
            _ = sample_every.tick() => {
                let t = consumer.stats.tenant_tokens();
                samples.push((tokens_of(&t, "a"), tokens_of(&t, "b")));
            }
            _ = tokio::time::sleep(T) => panic!("B's jobs did not complete in {T:?}"),
        }
    }
    let b_secs = b_published.elapsed().as_secs_f64();
    let t = consumer.stats.tenant_tokens();
    samples.push((tokens_of(&t, "a"), tokens_of(&t, "b")));
    assert_eq!(tokens_of(&t, "b"), b_tokens, "every B token counted once");

    // Both had a backlog from B's first token served to its last: the
    // shares over that span.
    let start = samples.iter().position(|(_, b)| *b > 0).unwrap();
    let end = samples.iter().position(|(_, b)| *b == b_tokens).unwrap();
    let (a0, b0) = samples[start.saturating_sub(1)];
    let (a1, b1) = samples[end];
    let (a_share, b_share) = (a1 - a0, b1 - b0);
    let ratio = b_share as f64 / a_share as f64;
    let a_rate = (a_share + b_share) as f64 / b_secs;
    let a_left = (A_JOBS - a_done) as u64 * (a_alone_tokens / 3);
    eprintln!(
        "tenant B: {B_JOBS} jobs, {b_tokens} tokens, all answered {b_secs:.1} s after publishing, \
         beside {} A jobs waiting; while both had a backlog A got {a_share} tokens and B {b_share} \
         (B/A = {ratio:.3}); first in, first out B would have waited for A's ~{a_left} tokens \
         (~{:.0} s at this rate)",
        A_JOBS - a_done,
        a_left as f64 / a_rate,
    );
    assert!(
        (0.9..=1.1).contains(&ratio),
        "token shares while both had a backlog: A {a_share}, B {b_share} (B/A {ratio:.3}), not within 10% of equal"
    );
    assert!(a_done < A_JOBS, "A still had a backlog when B finished");

    // The per-tenant consumers exist; the stream still holds A's backlog
    // (nothing lost, nothing run twice: every result above was Ok and B's
    // tokens were counted once).
    let info = d
        .producer
        .js
        .get_stream(&d.producer.topology.job_stream)
        .await
        .unwrap()
        .consumer_info(&d.producer.topology.tenant_consumer(
            Task::Embed,
            sluice_schemas::Priority::Normal,
            "b",
        ))
        .await;
    assert!(info.is_ok(), "{info:?}");
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// A stream made before tenants has no tenant subjects: a tenant's job goes
/// to its level's plain subject and runs (labelled with its tenant from the
/// header), and `sluice init` adds the subjects in place.
#[tokio::test]
async fn a_tenants_job_on_a_stream_from_before_tenants_runs_on_the_plain_subject() {
    let d = Deployment::start().await.unwrap();
    let t = d.producer.topology.clone();
    let js = &d.producer.js;
    let mut stream = js.get_stream(&t.job_stream).await.unwrap();
    let mut config = stream.info().await.unwrap().config.clone();
    config.subjects.retain(|s| !s.ends_with(".*"));
    js.update_stream(&config).await.unwrap();

    let mut results = d.producer.subscribe_results().await.unwrap();
    submit_as(
        &d,
        "before-tenants",
        "a text from an old deployment",
        "acme",
    )
    .await;
    let subjects: Vec<(String, usize)> = futures::TryStreamExt::try_collect(
        stream
            .info_with_subjects(format!("{}.>", t.job_subject_prefix))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(subjects, vec![(t.job_subject("embed"), 1)]);

    let consumer = d.start_consumer(&[]).await.unwrap();
    let r = tokio::time::timeout(T, results.next_result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.job_id.as_deref(), Some("before-tenants"));
    assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
    let tenants = consumer.stats.tenant_tokens();
    assert!(tokens_of(&tenants, "acme") > 0, "{tenants:?}");

    // The gateway publishes every job as its key's tenant and reads its
    // status in that tenant's scope: it refuses such a stream, naming the
    // fix.
    const KEYS: &str = "acme:sk-acme-0123456789";
    let refused = match d.start_gateway(KEYS, &[]).await {
        Ok(_) => panic!("a gateway started on a stream without tenants' subjects"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        refused.contains("has no subjects for tenants' jobs")
            && refused.contains("run `sluice init` to add them"),
        "{refused}"
    );

    let init = d.cli(&["init"], None, T).await;
    assert_eq!(init.code, Some(0), "{init:?}");
    assert!(init.stdout.contains("subjects"), "{init:?}");
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.subjects, t.job_subjects());
    d.start_gateway(KEYS, &[]).await.unwrap();
    consumer.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// An idle consumer pulls a quiet tenant's job as it is published, not at
/// its next look at the stream's tenants: with that look a minute away, a
/// new tenant's job (and then another's, after the first tenant went quiet
/// again) is still answered within seconds.
#[tokio::test]
async fn an_idle_consumer_takes_a_new_tenants_job_as_it_arrives() {
    let d = Deployment::start().await.unwrap();
    let consumer = d
        .start_consumer(&["--tenant-refresh-ms=60000"])
        .await
        .unwrap();
    // The first look at the tenants happens at start: let it pass, idle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut results = d.producer.subscribe_results().await.unwrap();
    for (id, tenant) in [("quiet-1", "quiet"), ("quiet-2", "other")] {
        let sent = Instant::now();
        submit_as(&d, id, "a text from a tenant that was quiet", tenant).await;
        let r = tokio::time::timeout(Duration::from_secs(10), results.next_result())
            .await
            .unwrap_or_else(|_| panic!("{id} waited for the next look at the tenants"))
            .unwrap();
        assert_eq!(r.job_id.as_deref(), Some(id));
        assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
        eprintln!(
            "{id} ({tenant}): answered {:?} after publishing",
            sent.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let tenants = consumer.stats.tenant_tokens();
    assert!(
        tokens_of(&tenants, "quiet") > 0 && tokens_of(&tenants, "other") > 0,
        "{tenants:?}"
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Publishes a one-text embed job as `tenant` and waits for its ack.
async fn submit_as(d: &Deployment, id: &str, text: &str, tenant: &str) {
    let job = d.producer.job(
        Task::Embed,
        id,
        vec![Input::Inline {
            items: vec![text.to_string().into()],
        }],
    );
    let mut submission = Submission::new(&d.producer, job, None);
    submission.tenant = Some(tenant.into());
    let mut acks = d
        .producer
        .submit_pipelined(vec![submission], 1)
        .await
        .unwrap();
    acks.next().await.unwrap().ack.unwrap();
}
