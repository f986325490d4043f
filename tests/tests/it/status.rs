//! The status store's transitions against a real KV bucket on a real
//! nats-server, one at a time and racing each other.

use std::sync::Arc;

use async_nats::jetstream::{self, kv};
use sluice_schemas::{ErrorInfo, JobState, StatusRecord, VERSION};
use sluice_status::{Replay, Start, StatusStore};
use sluice_tests::NatsServer;
use time::OffsetDateTime;

async fn store(server: &NatsServer) -> StatusStore {
    let js = jetstream::new(server.connect().await.unwrap());
    let bucket = js
        .create_key_value(kv::Config {
            bucket: sluice_tests::unique_name("status"),
            history: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    StatusStore::new(bucket)
}

fn record(job_id: &str, state: JobState, attempt: u32) -> StatusRecord {
    StatusRecord {
        version: VERSION,
        job_id: job_id.to_string(),
        state,
        updated_at: OffsetDateTime::now_utc(),
        attempts: attempt,
        stream_sequence: Some(7),
        output: None,
        error: None,
        replays: 0,
        usage: None,
        deadline: None,
        answered: vec![],
    }
}

#[tokio::test]
async fn each_transition_follows_its_rule() {
    let server = NatsServer::start().await.unwrap();
    let s = store(&server).await;

    // queue: create-if-absent.
    assert!(s.queue("a", 1, None).await.unwrap());
    assert!(
        !s.queue("a", 2, None).await.unwrap(),
        "a second queue writes nothing"
    );
    let a = s.get("a").await.unwrap().unwrap();
    assert_eq!((a.state, a.stream_sequence), (JobState::Queued, Some(1)));

    // start: running over queued; the record written is returned.
    let Start::Running(running) = s.start(&record("a", JobState::Running, 1)).await.unwrap() else {
        panic!("start over queued must write running");
    };
    assert_eq!(running.state, JobState::Running);
    // A start with no record at all (the publisher's status write was lost).
    assert!(matches!(
        s.start(&record("b", JobState::Running, 1)).await.unwrap(),
        Start::Running(_)
    ));

    // finish: the first final status wins; a second finish is refused.
    assert!(s.finish(&record("a", JobState::Done, 1)).await.unwrap());
    let mut failed = record("a", JobState::Failed, 2);
    failed.error = Some(ErrorInfo::new(sluice_schemas::ErrorCode::Internal, "late"));
    assert!(
        !s.finish(&failed).await.unwrap(),
        "a final status is never overwritten"
    );
    assert_eq!(s.get("a").await.unwrap().unwrap().state, JobState::Done);

    // start over a final status writes nothing and says what is there.
    match s.start(&record("a", JobState::Running, 3)).await.unwrap() {
        Start::Final(r) => assert_eq!(r.state, JobState::Done),
        other => panic!("{other:?}"),
    }

    // cancel: only what has not finished.
    assert!(!s.cancel("a").await.unwrap(), "a done job is not cancelled");
    assert!(s.cancel("b").await.unwrap());
    assert_eq!(
        s.get("b").await.unwrap().unwrap().state,
        JobState::Cancelled
    );
    assert!(
        s.cancel("never-seen").await.unwrap(),
        "cancel ahead of the job"
    );
    assert!(!s.cancel("b").await.unwrap(), "cancelled is final");

    // replay: failed and cancelled jobs queue again, counting replays; a
    // done job is refused.
    assert!(s.finish(&failed_record("c")).await.unwrap());
    assert_eq!(s.replay("c").await.unwrap(), Replay::Queued { replays: 1 });
    let c = s.get("c").await.unwrap().unwrap();
    assert_eq!((c.state, c.replays), (JobState::Queued, 1));
    // The replay count survives the next start and finish.
    let Start::Running(r) = s.start(&record("c", JobState::Running, 1)).await.unwrap() else {
        panic!()
    };
    assert_eq!(r.replays, 1);
    assert!(s.finish(&failed_record("c")).await.unwrap());
    assert_eq!(s.get("c").await.unwrap().unwrap().replays, 1);
    assert_eq!(s.replay("c").await.unwrap(), Replay::Queued { replays: 2 });
    assert_eq!(s.replay("b").await.unwrap(), Replay::Queued { replays: 1 });
    match s.replay("a").await.unwrap() {
        Replay::AlreadyDone(r) => assert_eq!(r.state, JobState::Done),
        other => panic!("a done job must not be replayed: {other:?}"),
    }

    // expired: a queued record past its deadline reads expired (with
    // deadline_exceeded), is final to cancel, and may be replayed.
    let soon = OffsetDateTime::now_utc() + time::Duration::milliseconds(300);
    assert!(s.queue("e", 9, Some(soon)).await.unwrap());
    let e = s.get("e").await.unwrap().unwrap();
    assert_eq!((e.state, e.deadline), (JobState::Queued, Some(soon)));
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        s.get("e").await.unwrap().unwrap().state,
        JobState::Queued,
        "as stored"
    );
    let e = s.view("e").await.unwrap().unwrap();
    assert_eq!(e.state, JobState::Expired, "as read");
    assert_eq!(
        e.error.unwrap().code,
        sluice_schemas::ErrorCode::DeadlineExceeded
    );
    assert!(!s.cancel("e").await.unwrap(), "expired is final");
    assert!(!s.cancel_queued("e").await.unwrap());
    assert_eq!(s.view("e").await.unwrap().unwrap().state, JobState::Expired);
    assert_eq!(s.replay("e").await.unwrap(), Replay::Queued { replays: 1 });
    let e = s.get("e").await.unwrap().unwrap();
    assert_eq!((e.state, e.deadline), (JobState::Queued, None));
    // requeue: a running delivery given back for a retry is queued again,
    // its deadline kept, so it reads expired if the stream drops it at its
    // deadline before the redelivery; only that delivery's running record.
    let soon = OffsetDateTime::now_utc() + time::Duration::milliseconds(300);
    assert!(s.queue("g", 7, Some(soon)).await.unwrap());
    let Start::Running(g) = s.start(&record("g", JobState::Running, 1)).await.unwrap() else {
        panic!("start over queued must write running");
    };
    assert_eq!(g.deadline, Some(soon), "start keeps the stored deadline");
    assert!(
        !s.requeue("g", 8, g.attempts).await.unwrap(),
        "another message's running record stays"
    );
    assert!(
        !s.requeue("g", 7, g.attempts + 1).await.unwrap(),
        "another delivery's running record stays"
    );
    assert!(s.requeue("g", 7, g.attempts).await.unwrap());
    let g = s.get("g").await.unwrap().unwrap();
    assert_eq!(
        (g.state, g.deadline, g.stream_sequence),
        (JobState::Queued, Some(soon), Some(7))
    );
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(s.view("g").await.unwrap().unwrap().state, JobState::Expired);
    assert!(s.finish(&record("h", JobState::Done, 1)).await.unwrap());
    assert!(
        !s.requeue("h", 7, 1).await.unwrap(),
        "a final record is left"
    );
    // A consumer that pulled it late writes expired itself; it stays final.
    let mut late = record("f", JobState::Expired, 1);
    late.error = Some(ErrorInfo::new(
        sluice_schemas::ErrorCode::DeadlineExceeded,
        "late",
    ));
    assert!(s.finish(&late).await.unwrap());
    assert!(!s.finish(&record("f", JobState::Done, 2)).await.unwrap());
}

fn failed_record(job_id: &str) -> StatusRecord {
    let mut r = record(job_id, JobState::Failed, 1);
    r.error = Some(ErrorInfo::new(
        sluice_schemas::ErrorCode::InputInvalid,
        "bad",
    ));
    r
}

/// Two deliveries of one job finishing at once (a stale Nak, an ack
/// timeout): exactly one finish wins, over 20 rounds of 2 racers each.
#[tokio::test]
async fn of_two_finishes_exactly_one_wins() {
    let server = NatsServer::start().await.unwrap();
    let s = Arc::new(store(&server).await);
    for round in 0..20 {
        let id = format!("job-{round}");
        s.queue(&id, round, None).await.unwrap();
        let racers: Vec<_> = [JobState::Done, JobState::Failed]
            .into_iter()
            .enumerate()
            .map(|(i, state)| {
                let (s, id) = (Arc::clone(&s), id.clone());
                tokio::spawn(async move {
                    let mut r = record(&id, state, i as u32 + 1);
                    if state == JobState::Failed {
                        r.error = Some(ErrorInfo::new(sluice_schemas::ErrorCode::Internal, "x"));
                    }
                    (state, s.finish(&r).await.unwrap())
                })
            })
            .collect();
        let mut winners = Vec::new();
        for r in racers {
            let (state, won) = r.await.unwrap();
            if won {
                winners.push(state);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        assert_eq!(s.get(&id).await.unwrap().unwrap().state, winners[0]);
    }
}

/// `sluice cancel` racing a consumer's start: whichever lands first, the
/// job either runs (start wrote running, then cancel wrote cancelled, and
/// the running delivery's finish is refused) or never starts (cancel first:
/// start finds it final). Never both answered.
#[tokio::test]
async fn cancel_against_start_never_lets_both_win() {
    let server = NatsServer::start().await.unwrap();
    let s = Arc::new(store(&server).await);
    let (mut ran, mut stopped) = (0, 0);
    for round in 0..20 {
        let id = format!("job-{round}");
        s.queue(&id, round, None).await.unwrap();
        // Alternate which goes first, so both orders happen.
        let spawn_start = || {
            let (s, id) = (Arc::clone(&s), id.clone());
            tokio::spawn(async move { s.start(&record(&id, JobState::Running, 1)).await.unwrap() })
        };
        let spawn_cancel = || {
            let (s, id) = (Arc::clone(&s), id.clone());
            tokio::spawn(async move { s.cancel(&id).await.unwrap() })
        };
        let (start, cancel) = if round % 2 == 0 {
            let start = spawn_start();
            (start, spawn_cancel())
        } else {
            let cancel = spawn_cancel();
            (spawn_start(), cancel)
        };
        let (started, cancelled) = (start.await.unwrap(), cancel.await.unwrap());
        assert!(
            cancelled,
            "round {round}: nothing final was there to refuse it"
        );
        match started {
            Start::Running(_) => {
                // It started before the cancel: its finish must now lose.
                assert!(!s.finish(&record(&id, JobState::Done, 1)).await.unwrap());
                ran += 1;
            }
            Start::Final(r) => {
                assert_eq!(r.state, JobState::Cancelled, "round {round}");
                stopped += 1;
            }
        }
        assert_eq!(
            s.get(&id).await.unwrap().unwrap().state,
            JobState::Cancelled
        );
    }
    eprintln!("start first {ran} times, cancel first {stopped} times, of 20");
    assert!(ran > 0 && stopped > 0, "both orders: {ran} / {stopped}");
}

/// A replay racing a late finish of the same job: either the replay queues
/// it (and the finish, landing after, still wins only over a non-final
/// record) or the finish lands first and the replay of a done job is
/// refused. The record always ends consistent with who won.
#[tokio::test]
async fn replay_of_a_job_that_finishes_meanwhile() {
    let server = NatsServer::start().await.unwrap();
    let s = Arc::new(store(&server).await);
    for round in 0..20 {
        let id = format!("job-{round}");
        assert!(s.finish(&failed_record(&id)).await.unwrap());
        // A stale delivery of the same job still running somewhere.
        let finish = {
            let (s, id) = (Arc::clone(&s), id.clone());
            tokio::spawn(async move { s.finish(&record(&id, JobState::Done, 2)).await.unwrap() })
        };
        let replay = {
            let (s, id) = (Arc::clone(&s), id.clone());
            tokio::spawn(async move { s.replay(&id).await.unwrap() })
        };
        let (finished, replayed) = (finish.await.unwrap(), replay.await.unwrap());
        let now = s.get(&id).await.unwrap().unwrap();
        match (finished, &replayed) {
            // Replay first, then the finish over the queued record.
            (true, Replay::Queued { replays: 1 }) => assert_eq!(now.state, JobState::Done),
            // The failed status held: the finish lost, the replay queued it.
            (false, Replay::Queued { replays: 1 }) => assert_eq!(now.state, JobState::Queued),
            other => panic!("round {round}: {other:?} leaves {now:?}"),
        }
    }
}
