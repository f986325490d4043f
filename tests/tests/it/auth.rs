//! NATS auth and TLS: the consumer and the CLI connect to a real nats-server
//! configured for each method, a job goes through, and wrong or missing
//! credentials get a clear error and publish nothing.

use std::path::Path;
use std::time::Duration;

use sluice_connect::NatsAuth;
use sluice_producer::provision::Settings;
use sluice_schemas::Secret;
use sluice_tests::Servers;
use sluice_tests::deploy::{Deployment, role_args, run_cli, s3_role_args};
use sluice_tests::fixtures::jsonl;

const T: Duration = Duration::from_secs(120);

/// One way of securing the server, and how clients pass it (or fail it).
struct Case {
    /// The nats-server config (auth or TLS blocks).
    server: String,
    /// What the producer library, the consumer flags and the CLI env carry.
    auth: NatsAuth,
    consumer_flags: Vec<String>,
    cli_env: Vec<(&'static str, String)>,
    /// A wrong or missing credential, and what the error must say.
    wrong_env: Vec<(&'static str, String)>,
    wrong_says: &'static str,
}

async fn check(case: Case) {
    let servers = Servers::start_with_nats_config(Some(&case.server))
        .await
        .unwrap();
    let d = Deployment::start_on(servers, case.auth.clone(), Settings::default())
        .await
        .unwrap();
    let flags: Vec<&str> = case.consumer_flags.iter().map(String::as_str).collect();
    let consumer = d.start_consumer(&flags).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        jsonl(&["secured".to_string(), "sluice".to_string()]),
    )
    .unwrap();

    // The CLI with the right credentials: the job goes through.
    let mut env = d.publisher_env();
    env.extend(case.cli_env.clone());
    let run = run_cli(
        &env,
        &["submit", "--wait", "--json", input.to_str().unwrap()],
        None,
        T,
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("\"status\":\"ok\""), "{run:?}");

    // Wrong or missing credentials: exit 2, a message that says what to
    // check, and nothing published.
    let mut env = d.publisher_env();
    env.extend(case.wrong_env.clone());
    let run = run_cli(&env, &["submit", input.to_str().unwrap()], None, T).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("cannot connect to NATS") && run.stderr.contains(case.wrong_says),
        "{run:?}"
    );
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);

    // A consumer without them fails at start-up at once (no 30 s of retries).
    let started = std::time::Instant::now();
    let error = match d.start_consumer(&[]).await {
        Ok(_) => panic!("a consumer without credentials started"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("cannot connect to NATS"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(25), "{error}");
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn user_and_password() {
    let password = sluice_tests::unique_name("pw");
    check(Case {
        server: format!("authorization {{ user: sluice, password: \"{password}\" }}"),
        auth: NatsAuth {
            nats_user: Some("sluice".into()),
            nats_password: Some(Secret::new(password.clone())),
            ..NatsAuth::default()
        },
        consumer_flags: vec![
            "--nats-user=sluice".into(),
            format!("--nats-password={password}"),
        ],
        cli_env: vec![
            ("NATS_USER", "sluice".into()),
            ("NATS_PASSWORD", password.clone()),
        ],
        wrong_env: vec![
            ("NATS_USER", "sluice".into()),
            ("NATS_PASSWORD", "wrong".into()),
        ],
        wrong_says: "--nats-password",
    })
    .await;
}

#[tokio::test]
async fn token() {
    let token = sluice_tests::unique_name("tok");
    check(Case {
        server: format!("authorization {{ token: \"{token}\" }}"),
        auth: NatsAuth {
            nats_token: Some(Secret::new(token.clone())),
            ..NatsAuth::default()
        },
        consumer_flags: vec![format!("--nats-token={token}")],
        cli_env: vec![("NATS_TOKEN", token.clone())],
        wrong_env: vec![],
        wrong_says: "--nats-token",
    })
    .await;
}

#[tokio::test]
async fn nkey_seed() {
    let user = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().unwrap();
    let seed_file = dir.path().join("user.nk");
    std::fs::write(&seed_file, user.seed().unwrap()).unwrap();
    let seed_path = seed_file.to_str().unwrap().to_string();
    check(Case {
        server: format!(
            "authorization {{ users: [ {{ nkey: \"{}\" }} ] }}",
            user.public_key()
        ),
        auth: NatsAuth {
            nats_nkey_seed_file: Some(seed_file.clone()),
            ..NatsAuth::default()
        },
        consumer_flags: vec![format!("--nats-nkey-seed-file={seed_path}")],
        cli_env: vec![("NATS_NKEY_SEED_FILE", seed_path.clone())],
        wrong_env: vec![],
        wrong_says: "--nats-nkey-seed-file",
    })
    .await;
}

/// A NATS JWT (decentralized auth): `claims` plus the standard fields,
/// signed by `issuer`. The format is nats-io/jwt v2's: base64url header,
/// claims and ed25519 signature over the first two.
fn nats_jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims = serde_json::json!({
        "iat": time::OffsetDateTime::now_utc().unix_timestamp(),
        "iss": issuer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let id = hex::encode_upper(sha2::Sha256::digest(claims.to_string().as_bytes()));
    claims["jti"] = id.into();
    let signing_input = format!(
        "{}.{}",
        b64.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#),
        b64.encode(claims.to_string())
    );
    let signature = issuer.sign(signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", b64.encode(signature))
}

/// An account JWT without limits, and with JetStream unless it is the
/// system account (which the server refuses JetStream).
fn account_jwt(
    operator: &nkeys::KeyPair,
    account: &nkeys::KeyPair,
    name: &str,
    jetstream: bool,
) -> String {
    let js = if jetstream { -1 } else { 0 };
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": js, "disk_storage": js, "streams": js, "consumer": js,
    });
    nats_jwt(
        operator,
        &account.public_key(),
        name,
        serde_json::json!({ "type": "account", "version": 2, "limits": unlimited }),
    )
}

/// A `.creds` file for a new user of `account`: its JWT and its seed, in
/// the layout `nsc generate creds` writes.
fn creds_file(path: &Path, account: &nkeys::KeyPair) {
    let user = nkeys::KeyPair::new_user();
    let jwt = nats_jwt(
        account,
        &user.public_key(),
        "sluice",
        serde_json::json!({
            "type": "user", "version": 2, "pub": {}, "sub": {},
            "subs": -1, "data": -1, "payload": -1,
        }),
    );
    std::fs::write(
        path,
        format!(
            "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    )
    .unwrap();
}

#[tokio::test]
async fn creds_file_with_operator_signed_jwts() {
    let operator = nkeys::KeyPair::new_operator();
    let system = nkeys::KeyPair::new_account();
    let account = nkeys::KeyPair::new_account();
    let operator_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        "sluice-test",
        serde_json::json!({ "type": "operator", "version": 2,
                            "system_account": system.public_key() }),
    );
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("sluice.creds");
    creds_file(&creds, &account);
    // A user of an account this server does not know: refused.
    let stranger = dir.path().join("stranger.creds");
    creds_file(&stranger, &nkeys::KeyPair::new_account());
    let creds_path = creds.to_str().unwrap().to_string();
    check(Case {
        server: format!(
            "operator: \"{operator_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: \"{sys_jwt}\"\n  {acc}: \"{acc_jwt}\"\n}}\n",
            sys = system.public_key(),
            sys_jwt = account_jwt(&operator, &system, "SYS", false),
            acc = account.public_key(),
            acc_jwt = account_jwt(&operator, &account, "sluice", true),
        ),
        auth: NatsAuth {
            nats_creds: Some(creds.clone()),
            ..NatsAuth::default()
        },
        consumer_flags: vec![format!("--nats-creds={creds_path}")],
        cli_env: vec![("NATS_CREDS", creds_path.clone())],
        wrong_env: vec![("NATS_CREDS", stranger.to_str().unwrap().to_string())],
        wrong_says: "--nats-creds",
    })
    .await;
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate,
/// written as PEM files into `dir`.
pub(crate) fn make_certificates(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "sluice test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca_cert, &ca_key)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(DnType::CommonName, "sluice-consumer");
    let client = client_params
        .signed_by(&client_key, &ca_cert, &ca_key)
        .unwrap();
    for (name, pem) in [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", server.pem()),
        ("server-key.pem", server_key.serialize_pem()),
        ("client.pem", client.pem()),
        ("client-key.pem", client_key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
}

#[tokio::test]
async fn tls_with_a_custom_ca() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    check(Case {
        server: format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\" }}",
            p("server.pem"),
            p("server-key.pem")
        ),
        auth: NatsAuth {
            nats_ca: Some(dir.path().join("ca.pem")),
            ..NatsAuth::default()
        },
        consumer_flags: vec![format!("--nats-ca={}", p("ca.pem"))],
        cli_env: vec![("NATS_CA", p("ca.pem"))],
        // Without the CA, the server's certificate cannot be trusted.
        wrong_env: vec![],
        wrong_says: "--nats-ca",
    })
    .await;
}

#[tokio::test]
async fn mutual_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    check(Case {
        server: format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}",
            p("server.pem"),
            p("server-key.pem"),
            p("ca.pem")
        ),
        auth: NatsAuth {
            nats_ca: Some(dir.path().join("ca.pem")),
            nats_cert: Some(dir.path().join("client.pem")),
            nats_key: Some(dir.path().join("client-key.pem")),
            ..NatsAuth::default()
        },
        consumer_flags: vec![
            format!("--nats-ca={}", p("ca.pem")),
            format!("--nats-cert={}", p("client.pem")),
            format!("--nats-key={}", p("client-key.pem")),
        ],
        cli_env: vec![
            ("NATS_CA", p("ca.pem")),
            ("NATS_CERT", p("client.pem")),
            ("NATS_KEY", p("client-key.pem")),
        ],
        // Trusting the server is not enough: it wants our certificate.
        wrong_env: vec![("NATS_CA", p("ca.pem"))],
        wrong_says: "cannot connect",
    })
    .await;
}

/// deploy/nats/permissions.conf as shipped: the consumers (embed and
/// generate) and the publisher each do their job with only their own
/// permissions, refused nothing on the way, and a publisher cannot read the
/// dead-letter stream, another client's streamed text or a job message
/// waiting in the stream (its presigned URLs).
#[tokio::test]
async fn the_shipped_permissions_let_each_role_do_its_job_and_no_more() {
    let servers = Servers::start_shipped().await.unwrap();
    let as_user = |user: &str| NatsAuth {
        nats_user: Some(user.into()),
        nats_password: Some(Secret::new(sluice_tests::ROLE_PASSWORD)),
        ..NatsAuth::default()
    };
    // `sluice init` as admin, with the standard names the file is written for.
    let d = Deployment::start_named(
        servers,
        Vec::new(),
        as_user("admin"),
        Settings::default(),
        "",
    )
    .await
    .unwrap();
    let as_consumer = role_args("consumer");
    let as_consumer: Vec<&str> = as_consumer.iter().map(String::as_str).collect();
    let consumer = d
        .start_consumer(
            &[
                &as_consumer[..],
                // Its output to S3, written with its identity and read back
                // with the publisher's.
                &["--inline-output-max-bytes=0"],
            ]
            .concat(),
        )
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, jsonl(&["allowed".to_string()])).unwrap();
    let env = d.role_env("publisher");
    let run = run_cli(
        &env,
        &[
            "submit",
            "--wait",
            "--json",
            "--id",
            "perm-1",
            input.to_str().unwrap(),
        ],
        None,
        T,
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}\nconsumer log: see above");
    assert!(run.stdout.contains("\"status\":\"ok\""), "{run:?}");
    let run = run_cli(&env, &["status", "perm-1"], None, T).await;
    assert_eq!(run.code, Some(0), "{run:?}");

    // Each role's S3 identity reaches its own objects and no others: the
    // attack is a consumer reading the publisher's input (a tenant's
    // text) or a tenant's gateway file, a publisher forging an output or
    // reading a gateway file, the gateway reading a publisher's input.
    let input = d.keys_under("inputs/").await.unwrap();
    let output = d.keys_under("outputs/").await.unwrap();
    assert!(
        input.len() == 1 && output.len() == 1,
        "{input:?} {output:?}"
    );
    let gateway_file = "gateway/files/file-team-a";
    d.servers
        .s3
        .client()
        .put_object()
        .bucket(&d.bucket)
        .key(gateway_file)
        .body(b"team A's private batch".to_vec().into())
        .send()
        .await
        .unwrap();
    s3_reach(&d, "consumer", &output[0], true, true).await;
    s3_reach(&d, "consumer", &input[0], false, false).await;
    s3_reach(&d, "consumer", gateway_file, false, false).await;
    s3_reach(&d, "publisher", &input[0], true, true).await;
    s3_reach(&d, "publisher", &output[0], true, false).await;
    s3_reach(&d, "publisher", gateway_file, false, false).await;
    s3_reach(&d, "gateway", gateway_file, true, true).await;
    s3_reach(&d, "gateway", &input[0], false, false).await;
    for role in ["consumer", "publisher", "gateway"] {
        let listed = d
            .servers
            .s3
            .role_client(role)
            .list_objects_v2()
            .bucket(&d.bucket)
            .send()
            .await;
        assert!(listed.is_err(), "{role} listed the bucket: {listed:?}");
    }
    // A consumer given another role's identity is refused at start-up,
    // naming what it needs.
    let wrong = s3_role_args("publisher");
    let refused = d
        .start_consumer(&[&as_consumer[..3], &[&wrong[0], &wrong[1]]].concat())
        .await
        .err()
        .expect("a consumer that cannot write its outputs does not start")
        .to_string();
    assert!(
        refused.contains("is not reachable under outputs/") && refused.contains("AccessDenied"),
        "{refused}"
    );

    // Reading dead letters is not a publisher's business.
    let run = run_cli(&env, &["dlq", "ls"], None, T).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("Permissions Violation") && run.stderr.contains("SLUICE_DLQ"),
        "the refusal is named: {run:?}"
    );
    eprintln!("publisher running `sluice dlq ls`: {}", run.stderr.trim());

    // Generation too, streamed: a generate consumer with the consumer's
    // role runs it (its cancel watch on the job's status record, its
    // stream messages), and the publisher reads its text and its result.
    let generator = d
        .start_consumer(
            &[
                &[
                    "--task=generate",
                    "--max-new-tokens=16",
                    "--max-prompt-tokens=256",
                    "--max-items-per-job=32",
                ][..],
                &as_consumer[..],
            ]
            .concat(),
        )
        .await
        .unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"Once upon a time\", \"max_new_tokens\": 8}\n",
    )
    .unwrap();
    // The attack: another publishing service (the same role, its own
    // connection and inbox) listens on every job's streamed text and
    // reads job messages out of the stream by sequence.
    let spy = sluice_connect::connect_nats(
        &d.servers.nats.url(),
        &NatsAuth {
            nats_inbox_prefix: Some("_INBOX_publisher".into()),
            ..as_user("publisher")
        },
        "spy",
        false,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let mut overheard = spy.subscribe("sluice.stream.>").await.unwrap();
    spy.flush().await.unwrap();
    let run = run_cli(
        &env,
        &[
            "--json",
            "submit",
            "--task",
            "generate",
            "--inline",
            "--stream",
            "--id",
            "perm-gen-1",
            prompts.to_str().unwrap(),
        ],
        None,
        T,
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("\"status\":\"ok\"") && run.stdout.contains("\"stream\""),
        "its text streamed and its result came: {run:?}"
    );
    generator.shutdown(Duration::from_secs(10)).await.unwrap();
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
    hears_nothing(
        &mut overheard,
        "another publisher read the job's streamed text",
    )
    .await;
    // A job waiting in the stream (no consumer runs now), its input's
    // presigned URL in its body: the spy asks the stream for it.
    let waiting = d.producer.job(
        sluice_schemas::Task::Embed,
        "waiting-1",
        vec![sluice_schemas::Input::Inline {
            items: vec![serde_json::json!("team A's private text")],
        }],
    );
    let stored = d.producer.submit(&waiting).await.unwrap();
    let read = tokio::time::timeout(
        Duration::from_secs(3),
        spy.request(
            "$JS.API.STREAM.MSG.GET.SLUICE_JOBS",
            format!("{{\"seq\":{}}}", stored.sequence).into(),
        ),
    )
    .await;
    assert!(
        !matches!(&read, Ok(Ok(m)) if String::from_utf8_lossy(&m.payload).contains("\"message\"")),
        "another publisher read a job out of the stream: {read:?}"
    );
    drop((overheard, spy));
    // The spy's two tries and the dead letters are refused; nothing else
    // is: each refusal of a role's own work costs it a timeout.
    let all = d.servers.nats.permission_violations();
    let spied = |l: &String| {
        l.contains("sluice.stream.>") || l.contains("$JS.API.STREAM.MSG.GET.SLUICE_JOBS")
    };
    assert_eq!(
        all.iter().filter(|l| spied(l)).count(),
        2,
        "the spy's subscription and read were refused:\n{}",
        all.join("\n")
    );
    let refused: Vec<String> = all
        .into_iter()
        .filter(|l| !l.contains("SLUICE_DLQ") && !spied(l))
        .collect();
    assert!(
        refused.is_empty(),
        "the shipped permissions refused a role its own work:\n{}",
        refused.join("\n")
    );
}

/// Whether `role`'s shipped S3 identity reads `key` (`read`) and writes
/// next to it (`write`: a new object beside it, then removed), as expected.
async fn s3_reach(d: &Deployment, role: &str, key: &str, read: bool, write: bool) {
    let got = d.role_reads(role, key).await;
    assert_eq!(got.is_ok(), read, "{role} reading {key}: {got:?}");
    let s3 = d.servers.s3.role_client(role);
    let beside = format!("{key}.written-by-{role}");
    let put = s3
        .put_object()
        .bucket(&d.bucket)
        .key(&beside)
        .body(b"forged".to_vec().into())
        .send()
        .await;
    assert_eq!(
        put.is_ok(),
        write,
        "{role} writing {beside}: {:?}",
        put.err()
            .map(|e| aws_sdk_s3::error::DisplayErrorContext(e).to_string())
    );
    if write {
        s3.delete_object()
            .bucket(&d.bucket)
            .key(&beside)
            .send()
            .await
            .unwrap();
    }
}

/// Tenants sharing a fleet, each with its own publisher user from
/// `deploy/nats/render-tenant-publishers` on the shipped permissions: the
/// attack is team B's publisher going after team A's job: its status record
/// (read, forged), its answers (A's inbox), its subjects, and a job of B's
/// own under A's job id, which used to find A's record final and was
/// answered from it instead of run.
#[tokio::test]
async fn a_tenants_publisher_reaches_only_its_own_jobs_records_and_answers() {
    let servers = Servers::start_shipped_with_tenants(&["team-a", "team-b"])
        .await
        .unwrap();
    let admin = NatsAuth {
        nats_user: Some("admin".into()),
        nats_password: Some(Secret::new(sluice_tests::ROLE_PASSWORD)),
        ..NatsAuth::default()
    };
    let d = Deployment::start_named(servers, Vec::new(), admin, Settings::default(), "")
        .await
        .unwrap();
    let as_consumer = role_args("consumer");
    let as_consumer: Vec<&str> = as_consumer.iter().map(String::as_str).collect();
    let consumer = d.start_consumer(&as_consumer).await.unwrap();
    let tenant_env = |tenant: &str| {
        let mut env = d.role_env("publisher");
        env.retain(|(k, _)| !matches!(*k, "NATS_USER" | "NATS_INBOX_PREFIX"));
        env.extend([
            ("NATS_USER", format!("publisher-{tenant}")),
            ("NATS_INBOX_PREFIX", format!("_INBOX_publisher.{tenant}")),
            ("SLUICE_TENANT", tenant.to_string()),
        ]);
        env
    };
    let dir = tempfile::tempdir().unwrap();
    let submit = |tenant: &'static str, lines: Vec<String>| {
        let input = dir.path().join(format!("{tenant}.jsonl"));
        std::fs::write(&input, jsonl(&lines)).unwrap();
        let env = tenant_env(tenant);
        async move {
            run_cli(
                &env,
                &[
                    "submit",
                    "--wait",
                    "--json",
                    "--inline",
                    "--id",
                    "shared-1",
                    input.to_str().unwrap(),
                ],
                None,
                T,
            )
            .await
        }
    };
    let run = submit("team-a", vec!["team A's private text".to_string()]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("\"status\":\"ok\""), "{run:?}");
    let a_record = d
        .producer
        .status_in(Some("team-a"), "shared-1")
        .await
        .unwrap()
        .expect("team A's record, in its scope");
    assert_eq!(a_record.state, sluice_schemas::JobState::Done);

    // Team B's publisher, by hand.
    let spy = sluice_connect::connect_nats(
        &d.servers.nats.url(),
        &NatsAuth {
            nats_user: Some("publisher-team-b".into()),
            nats_password: Some(Secret::new(sluice_tests::ROLE_PASSWORD)),
            nats_inbox_prefix: Some("_INBOX_publisher.team-b".into()),
            ..NatsAuth::default()
        },
        "spy",
        false,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    // Forge A's record (cancelled, and done with an output of B's
    // choosing) under its key and the plain one.
    let forged = serde_json::json!({
        "version": 1, "job_id": "shared-1", "state": "done",
        "updated_at": "2026-01-01T00:00:00Z", "attempts": 1,
        "output": {"bucket": d.bucket, "key": "gateway/files/file-team-a", "bytes": 1}
    })
    .to_string();
    for subject in [
        "$KV.sluice-status.team-a.shared-1",
        "$KV.sluice-status.shared-1",
    ] {
        spy.publish(subject, forged.clone().into()).await.unwrap();
    }
    // Read it, by key and by sequence.
    for request in [
        r#"{"last_by_subj":"$KV.sluice-status.team-a.shared-1"}"#,
        r#"{"seq":1}"#,
    ] {
        let read = tokio::time::timeout(
            Duration::from_secs(3),
            spy.request("$JS.API.STREAM.MSG.GET.KV_sluice-status", request.into()),
        )
        .await;
        assert!(
            !matches!(&read, Ok(Ok(m)) if String::from_utf8_lossy(&m.payload).contains("\"message\"")),
            "team B read a status record: {read:?}"
        );
    }
    // Listen on A's answers, and publish a job as A.
    let mut overheard = spy.subscribe("_INBOX_publisher.team-a.>").await.unwrap();
    let as_a = async_nats::jetstream::new(spy.clone())
        .publish("sluice.jobs.embed.normal.team-a", "{}".into())
        .await;
    let stored = match as_a {
        Ok(ack) => tokio::time::timeout(Duration::from_secs(3), ack).await.ok(),
        Err(_) => None,
    };
    assert!(
        !matches!(stored, Some(Ok(_))),
        "team B published on team A's subject: {stored:?}"
    );
    spy.flush().await.unwrap();

    // B's own job under A's id: run for B, answered with B's two vectors.
    let run = submit(
        "team-b",
        vec!["one of B's".to_string(), "two of B's".to_string()],
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("\"status\":\"ok\"") && run.stdout.contains("\"items\":2"),
        "team B's job ran for B: {run:?}"
    );
    hears_nothing(&mut overheard, "team B heard team A's answers").await;
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();

    // A's record is as the consumer left it; B's is its own; nothing
    // under the plain key.
    let now = d
        .producer
        .status_in(Some("team-a"), "shared-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now, a_record, "team A's record changed");
    let b = d
        .producer
        .status_in(Some("team-b"), "shared-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.state, sluice_schemas::JobState::Done);
    assert_eq!(b.usage.map(|u| u.items), Some(2));
    assert_eq!(d.producer.status("shared-1").await.unwrap(), None);

    // Every refusal is one of the spy's; the tenants' and the consumer's
    // own work is refused nothing.
    drop((overheard, spy));
    let all = d.servers.nats.permission_violations();
    let spied = [
        "$KV.sluice-status.team-a.shared-1",
        "$KV.sluice-status.shared-1",
        "$JS.API.STREAM.MSG.GET.KV_sluice-status",
        "_INBOX_publisher.team-a.>",
        "sluice.jobs.embed.normal.team-a",
    ];
    for attempt in spied {
        assert!(
            all.iter().any(|l| l.contains(&format!("\"{attempt}\""))),
            "{attempt} was not refused:\n{}",
            all.join("\n")
        );
    }
    let refused: Vec<&String> = all
        .iter()
        .filter(|l| !spied.iter().any(|s| l.contains(&format!("\"{s}\""))))
        .collect();
    assert!(
        refused.is_empty(),
        "the permissions refused a tenant or the consumer its own work:\n{}",
        refused
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Fails with `what` (and the subject heard) if `subscription` receives a
/// message within a second.
async fn hears_nothing(subscription: &mut async_nats::Subscriber, what: &str) {
    let got = tokio::time::timeout(
        Duration::from_secs(1),
        futures::StreamExt::next(subscription),
    )
    .await;
    assert!(
        !matches!(got, Ok(Some(_))),
        "{what}: {:?}",
        got.ok().flatten().map(|m| m.subject)
    );
}
