//! A whole sluice deployment for a test: servers, a namespaced topology made
//! by `sluice init`'s code, a producer, and consumers in this process or as
//! child processes of the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_connect::{DeploymentArgs, NatsAuth, S3Args};
use sluice_consumer::Config;
use sluice_producer::provision::{self, Settings};
use sluice_producer::{Producer, ProducerConfig};
use sluice_schemas::{Secret, Topology};

use crate::{Owned, Servers, models_dir, unique_name};

pub struct Deployment {
    pub servers: Servers,
    /// The other nodes when NATS is a cluster (`servers.nats` is node 0).
    pub cluster: Vec<crate::NatsServer>,
    /// Every NATS URL, comma-separated (what clients are given).
    pub nats_urls: String,
    pub namespace: String,
    pub topology: Topology,
    pub bucket: String,
    pub producer: Producer,
}

#[derive(Parser)]
struct ConfigArgs {
    #[command(flatten)]
    config: Config,
}

impl Deployment {
    /// NATS node `index` of the cluster (node 0 is `servers.nats`).
    pub fn nats_node(&mut self, index: usize) -> &mut crate::NatsServer {
        match index {
            0 => &mut self.servers.nats,
            i => &mut self.cluster[i - 1],
        }
    }

    pub async fn start() -> Result<Deployment> {
        Deployment::start_with(Settings::default()).await
    }

    pub async fn start_with(settings: Settings) -> Result<Deployment> {
        Deployment::start_on(Servers::start().await?, NatsAuth::default(), settings).await
    }

    /// On servers the caller started (a NATS server with auth or TLS, say),
    /// the producer connecting with `auth`.
    pub async fn start_on(
        servers: Servers,
        auth: NatsAuth,
        settings: Settings,
    ) -> Result<Deployment> {
        Deployment::start_named(servers, Vec::new(), auth, settings, &unique_name("t")).await
    }

    /// On the NATS cluster of `nodes` (the first is `servers.nats`) and a
    /// fresh S3 server.
    pub async fn start_clustered(
        mut nodes: Vec<crate::NatsServer>,
        settings: Settings,
    ) -> Result<Deployment> {
        anyhow::ensure!(!nodes.is_empty(), "a cluster needs a node");
        let servers = Servers {
            nats: nodes.remove(0),
            s3: crate::S3Server::start().await?,
        };
        let namespace = unique_name("t");
        Deployment::start_named(servers, nodes, NatsAuth::default(), settings, &namespace).await
    }

    /// With the given namespace ("" for the standard names).
    pub async fn start_named(
        servers: Servers,
        cluster: Vec<crate::NatsServer>,
        auth: NatsAuth,
        settings: Settings,
        namespace: &str,
    ) -> Result<Deployment> {
        let nats_urls = std::iter::once(&servers.nats)
            .chain(&cluster)
            .map(|n| n.url())
            .collect::<Vec<_>>()
            .join(",");
        let namespace = namespace.to_string();
        let bucket = servers.s3.bucket("sluice").await?;
        let producer = Producer::connect(&ProducerConfig {
            deployment: DeploymentArgs {
                nats_url: nats_urls.clone(),
                nats_auth: auth,
                namespace: namespace.clone(),
                s3: S3Args {
                    s3_endpoint: Some(servers.s3.endpoint()),
                    s3_access_key_id: Some(servers.s3.access_key.clone()),
                    s3_secret_access_key: Some(Secret::new(servers.s3.secret_key.clone())),
                    ..S3Args::default()
                },
            },
            bucket: bucket.clone(),
            ..ProducerConfig::default()
        })
        .await?;
        // A new cluster elects its JetStream leaders for a moment: retry.
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match provision::ensure(
                &producer.js,
                Some(&producer.s3),
                &bucket,
                &producer.topology,
                &settings,
            )
            .await
            {
                Ok(_) => break,
                Err(e) if Instant::now() < until && !cluster.is_empty() => {
                    tracing::debug!(error = %e, "cluster not ready for init yet");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Deployment {
            cluster,
            nats_urls,
            topology: producer.topology.clone(),
            servers,
            namespace,
            bucket,
            producer,
        })
    }

    /// Messages left in the job stream (a work queue: acked jobs are removed).
    pub async fn jobs_in_stream(&self) -> u64 {
        self.try_jobs_in_stream().await.expect("job stream info")
    }

    /// Messages ever stored in the job stream (its last sequence): the
    /// jobs published so far.
    pub async fn jobs_published(&self) -> u64 {
        let js = &self.producer.js;
        let mut stream = js
            .get_stream(&self.topology.job_stream)
            .await
            .expect("job stream");
        stream
            .info()
            .await
            .expect("job stream info")
            .state
            .last_sequence
    }

    /// [`Deployment::jobs_in_stream`], or `None` while the stream cannot
    /// answer (its cluster electing a leader).
    pub async fn try_jobs_in_stream(&self) -> Option<u64> {
        let js = &self.producer.js;
        let mut stream = js.get_stream(&self.topology.job_stream).await.ok()?;
        Some(stream.info().await.ok()?.state.messages)
    }

    /// Asserts that job `id` failed alone: its result is an error of
    /// `code` whose message holds `words`, and its status record says
    /// failed.
    pub async fn assert_failed(
        &self,
        id: &str,
        result: &sluice_schemas::JobResult,
        code: sluice_schemas::ErrorCode,
        words: &str,
    ) {
        let sluice_schemas::Outcome::Error { error } = &result.outcome else {
            panic!("{id}: {:?}", result.outcome);
        };
        eprintln!("{id}: {} {}", error.code, error.message);
        assert_eq!(error.code, code, "{id}: {}", error.message);
        assert!(error.message.contains(words), "{id}: {}", error.message);
        let status = self.producer.status(id).await.unwrap().unwrap();
        assert_eq!(status.state, sluice_schemas::JobState::Failed, "{id}");
    }

    /// Messages in the dead-letter stream.
    pub async fn dead_letters(&self) -> u64 {
        let mut dlq = self
            .producer
            .js
            .get_stream(&self.topology.dlq_stream)
            .await
            .expect("dead-letter stream");
        dlq.info()
            .await
            .expect("dead-letter stream info")
            .state
            .messages
    }

    /// Messages left in the job stream once it holds `expected`, or after
    /// 10 s. A job is acked just after its result is published, so a count
    /// read the moment a result arrives may still include that job.
    pub async fn jobs_in_stream_settled(&self, expected: u64) -> u64 {
        crate::read_until(
            std::time::Duration::from_secs(10),
            || self.jobs_in_stream(),
            |&n| n == expected,
        )
        .await
    }

    /// The flags naming this deployment's servers and namespace, as the
    /// consumer and the gateway both take them.
    fn server_args(&self) -> Vec<String> {
        self.server_args_at(&self.nats_urls)
    }

    /// [`Deployment::server_args`] reaching NATS at `nats_urls`.
    fn server_args_at(&self, nats_urls: &str) -> Vec<String> {
        vec![
            format!("--nats-url={nats_urls}"),
            format!("--namespace={}", self.namespace),
            format!("--s3-endpoint={}", self.servers.s3.endpoint()),
            format!("--s3-access-key-id={}", self.servers.s3.access_key),
            format!("--s3-secret-access-key={}", self.servers.s3.secret_key),
        ]
    }

    /// The flags that point a consumer at this deployment, then `extra`
    /// (which may override the test defaults for the budget and intervals).
    pub fn consumer_args(&self, extra: &[&str]) -> Vec<String> {
        self.consumer_args_via(&self.nats_urls, extra)
    }

    /// [`Deployment::consumer_args`] reaching NATS at `nats_urls` (proxies
    /// in front of the nodes, say) instead of the nodes themselves.
    pub fn consumer_args_via(&self, nats_urls: &str, extra: &[&str]) -> Vec<String> {
        let model = models_dir().join(if extra.contains(&"--task=generate") {
            "smollm2"
        } else if extra.contains(&"--task=transcribe") {
            "whisper-tiny-en"
        } else {
            "all-minilm-l6-v2"
        });
        let mut args = without_flags_of(self.server_args_at(nats_urls), extra);
        args.extend([
            format!("--output-bucket={}", self.bucket),
            format!("--model-dir={}", model.display()),
            "--http-addr=127.0.0.1:0".into(),
        ]);
        for default in [
            "--memory-budget=1500000000",
            "--progress-interval-secs=5",
            // Keeps the start-up warm-up (the largest batch) short on 2 cores.
            "--max-batch-tokens=2048",
        ] {
            let flag = default.split('=').next().unwrap_or(default);
            if !extra.iter().any(|e| e.starts_with(flag)) {
                args.push(default.into());
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// A consumer config for this deployment, with `extra` flags on top.
    pub fn consumer_config(&self, extra: &[&str]) -> Config {
        self.consumer_config_via(&self.nats_urls, extra)
    }

    /// [`Deployment::consumer_config`] reaching NATS at `nats_urls`.
    pub fn consumer_config_via(&self, nats_urls: &str, extra: &[&str]) -> Config {
        let mut args = vec!["sluice-consumer".to_string()];
        args.extend(self.consumer_args_via(nats_urls, extra));
        ConfigArgs::parse_from(args).config
    }

    /// The flags that point a gateway at this deployment, with `keys`
    /// (`TENANT:KEY,...`), then `extra`.
    pub fn gateway_args(&self, keys: &str, extra: &[&str]) -> Vec<String> {
        let mut args = without_flags_of(self.server_args(), extra);
        args.extend([
            format!("--bucket={}", self.bucket),
            format!("--keys={keys}"),
            "--listen=127.0.0.1:0".into(),
            "--driver-interval-ms=200".into(),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Starts a gateway in this process.
    pub async fn start_gateway(
        &self,
        keys: &str,
        extra: &[&str],
    ) -> Result<sluice_gateway::Gateway> {
        let mut args = vec!["sluice-gateway".to_string()];
        args.extend(self.gateway_args(keys, extra));
        sluice_gateway::start(sluice_gateway::Config::parse_from(args)).await
    }

    /// Starts the real `sluice-gateway` binary as a child process, on a free
    /// loopback port; returns once it answers `/healthz`.
    pub async fn spawn_gateway(&self, keys: &str, extra: &[&str]) -> Result<GatewayProcess> {
        let bin = workspace_binary("sluice-gateway", "sluice-gateway")?;
        let dir = tempfile::Builder::new()
            .prefix("sluice-gateway-")
            .tempdir()?;
        let log = dir.path().join("gateway.log");
        let addr: std::net::SocketAddr = format!("127.0.0.1:{}", crate::free_port()).parse()?;
        let mut args: Vec<String> = self
            .gateway_args(keys, extra)
            .into_iter()
            .filter(|a| !a.starts_with("--listen="))
            .collect();
        args.push(format!("--listen={addr}"));
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env("RUST_LOG", "info")
            .env_remove("NATS_URL")
            .stdin(Stdio::null());
        let mut process = Owned::spawn(cmd, log)?;
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if reqwest::get(format!("http://{addr}/healthz")).await.is_ok() {
                return Ok(GatewayProcess {
                    process,
                    addr,
                    _dir: dir,
                });
            }
            if let Some(status) = process.exited() {
                bail!(
                    "gateway exited ({status}) before it was ready:\n{}",
                    process.log_tail()
                );
            }
            if Instant::now() > until {
                bail!("gateway not ready after 60 s:\n{}", process.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The bytes of `key` in this deployment's bucket.
    pub async fn read_object(&self, key: &str) -> Result<Vec<u8>> {
        let object = self
            .servers
            .s3
            .client()
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await?;
        Ok(object.body.collect().await?.into_bytes().to_vec())
    }

    /// The keys under `prefix` in this deployment's bucket.
    pub async fn keys_under(&self, prefix: &str) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        let mut pages = self
            .servers
            .s3
            .client()
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            keys.extend(
                page?
                    .contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_string)),
            );
        }
        keys.sort();
        Ok(keys)
    }

    /// Starts a consumer in this process.
    pub async fn start_consumer(&self, extra: &[&str]) -> Result<sluice_consumer::Consumer> {
        sluice_consumer::start(self.consumer_config(extra)).await
    }

    /// [`Deployment::start_consumer`] reaching NATS at `nats_urls` (a chaos
    /// proxy, say).
    pub async fn start_consumer_via(
        &self,
        nats_urls: &str,
        extra: &[&str],
    ) -> Result<sluice_consumer::Consumer> {
        let mut args = vec!["sluice-consumer".to_string()];
        args.extend(self.consumer_args_via(nats_urls, extra));
        sluice_consumer::start(ConfigArgs::parse_from(args).config).await
    }

    /// An in-process consumer of the model in `dir` (not the default
    /// MiniLM), with `extra` flags, answering to the task's default model
    /// name unless `extra` gives `--model-name`.
    pub async fn start_consumer_of(
        &self,
        dir: &Path,
        extra: &[&str],
    ) -> Result<sluice_consumer::Consumer> {
        let mut config = self.consumer_config(extra);
        config.model.model_dir = Some(dir.to_path_buf());
        // Served under the task's default name unless `extra` names one
        // (otherwise it would answer to its directory's): the producer's
        // job helpers name that model.
        if config.model.model_name.is_none() {
            config.model.model_name = Some(config.task().default_model().to_string());
        }
        sluice_consumer::start(config).await
    }

    /// Starts the real `sluice-consumer` binary as a child process.
    pub async fn spawn_consumer(&self, extra: &[&str]) -> Result<ConsumerProcess> {
        self.spawn_consumer_with_env(extra, &[]).await
    }

    /// [`Deployment::spawn_consumer`] with extra environment variables (for
    /// what is read once per process, such as `SLUICE_CPU_KERNELS`).
    pub async fn spawn_consumer_with_env(
        &self,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<ConsumerProcess> {
        self.spawn_consumer_at(&self.nats_urls, extra, env).await
    }

    /// [`Deployment::spawn_consumer_with_env`] reaching NATS at `nats_urls`.
    pub async fn spawn_consumer_at(
        &self,
        nats_urls: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<ConsumerProcess> {
        let bin = consumer_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("sluice-consumer-")
            .tempdir()?;
        let log = dir.path().join("consumer.log");
        let mut cmd = Command::new(bin);
        cmd.args(self.consumer_args_via(nats_urls, extra))
            .env("RUST_LOG", "info")
            .env_remove("NATS_URL")
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        let process = Owned::spawn(cmd, log.clone())?;
        let mut child = ConsumerProcess {
            process,
            log,
            _dir: dir,
            http: None,
        };
        child.http = Some(child.wait_ready().await?);
        Ok(child)
    }
}

/// The consumer binary next to this test binary (`target/<profile>/`).
pub fn consumer_binary() -> Result<PathBuf> {
    workspace_binary("sluice-consumer", "sluice-consumer")
}

/// The `sluice` CLI next to this test binary.
pub fn cli_binary() -> Result<PathBuf> {
    workspace_binary("sluice", "sluice-producer")
}

fn workspace_binary(name: &str, package: &str) -> Result<PathBuf> {
    // Test binaries live in `target/<profile>/deps/`, benchmark binaries in
    // `target/<profile>/` itself.
    let exe = std::env::current_exe()?;
    let mut profile_dir = exe.parent().context("cannot locate the target directory")?;
    if profile_dir.ends_with("deps") {
        profile_dir = profile_dir
            .parent()
            .context("cannot locate the target directory")?;
    }
    let bin = profile_dir.join(name);
    if !bin.is_file() {
        bail!(
            "{} not found: build it first (`cargo build -p {package}`; scripts/test does)",
            bin.display()
        );
    }
    Ok(bin)
}

/// What a run of the `sluice` CLI did.
#[derive(Debug)]
pub struct CliRun {
    /// The exit code (None: killed by a signal or the test's timeout).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    /// stdout's lines parsed as JSON (for `--json` runs).
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}\n{self:?}"))
            })
            .collect()
    }
}

/// `args` without the `--flag=value`s whose flag `extra` gives (it then
/// overrides them: the servers' credentials by a role's, say).
fn without_flags_of(args: Vec<String>, extra: &[&str]) -> Vec<String> {
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    args.into_iter()
        .filter(|a| !extra.iter().any(|e| flag(e) == flag(a)))
        .collect()
}

/// The flags giving a consumer or gateway `role`'s shipped S3 identity
/// (`deploy/s3/render-identities`) instead of the server's own: for a
/// deployment on [`crate::Servers::start_shipped`].
pub fn s3_role_args(role: &str) -> Vec<String> {
    vec![
        format!("--s3-access-key-id={}", crate::role_s3_access_key(role)),
        format!("--s3-secret-access-key={}", crate::ROLE_S3_SECRET),
    ]
}

/// The flags running a consumer or gateway as `role` on a deployment on
/// [`crate::Servers::start_shipped`]: its NATS user and password, its inbox
/// prefix (`deploy/nats/permissions.conf`), then its S3 identity
/// ([`s3_role_args`]).
pub fn role_args(role: &str) -> Vec<String> {
    let mut args = vec![
        format!("--nats-user={role}"),
        format!("--nats-password={}", crate::ROLE_PASSWORD),
        format!("--nats-inbox-prefix=_INBOX_{role}"),
    ];
    args.extend(s3_role_args(role));
    args
}

impl Deployment {
    /// [`Deployment::publisher_env`] with `role`'s shipped NATS user and
    /// inbox prefix (`deploy/nats/permissions.conf`) and S3 identity
    /// (`deploy/s3/render-identities`): for a deployment on
    /// [`crate::Servers::start_shipped`].
    pub fn role_env(&self, role: &str) -> Vec<(&'static str, String)> {
        let mut env = self.publisher_env();
        env.retain(|(k, _)| !matches!(*k, "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY"));
        env.extend([
            ("NATS_USER", role.to_string()),
            ("NATS_PASSWORD", crate::ROLE_PASSWORD.to_string()),
            ("NATS_INBOX_PREFIX", format!("_INBOX_{role}")),
            ("AWS_ACCESS_KEY_ID", crate::role_s3_access_key(role)),
            ("AWS_SECRET_ACCESS_KEY", crate::ROLE_S3_SECRET.to_string()),
        ]);
        env
    }

    /// Whether `role`'s shipped S3 identity may read `key` of this
    /// deployment's bucket: the error the server answered when not.
    pub async fn role_reads(&self, role: &str, key: &str) -> Result<(), String> {
        let s3 = self.servers.s3.role_client(role);
        match s3.get_object().bucket(&self.bucket).key(key).send().await {
            Ok(_) => Ok(()),
            Err(e) => Err(aws_sdk_s3::error::DisplayErrorContext(e).to_string()),
        }
    }

    /// The environment that points a publisher at this deployment: the CLI's
    /// variables and the standard AWS ones (which the Python and Node
    /// examples read too).
    pub fn publisher_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("NATS_URL", self.nats_urls.clone()),
            ("SLUICE_NAMESPACE", self.namespace.clone()),
            ("SLUICE_BUCKET", self.bucket.clone()),
            ("AWS_ENDPOINT_URL", self.servers.s3.endpoint()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", self.servers.s3.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.servers.s3.secret_key.clone()),
        ]
    }

    /// Runs `sluice ARGS` against this deployment, with `stdin` if given;
    /// killed after `timeout`.
    pub async fn cli(&self, args: &[&str], stdin: Option<&[u8]>, timeout: Duration) -> CliRun {
        run_cli(&self.publisher_env(), args, stdin, timeout).await
    }
}

/// Runs the `sluice` CLI with exactly `env` (plus PATH and HOME), so nothing
/// from the test's own environment leaks in.
pub async fn run_cli(
    env: &[(&str, String)],
    args: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> CliRun {
    use tokio::io::AsyncWriteExt;
    let bin = cli_binary().expect("the sluice binary");
    let home = tempfile::tempdir().expect("a temp HOME");
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn sluice");
    if let (Some(body), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(body).await.expect("write stdin");
        drop(pipe);
    }
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(out)) => CliRun {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("sluice {args:?}: {e}"),
        Err(_) => CliRun {
            code: None,
            stdout: String::new(),
            stderr: format!("sluice {args:?} ran past {timeout:?} and was killed"),
        },
    }
}

/// A gateway running as a child process; killed on drop.
pub struct GatewayProcess {
    process: Owned,
    pub addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl GatewayProcess {
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.process.log).unwrap_or_default()
    }

    /// SIGKILL: no drain, no goodbye.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// A consumer running as a child process; killed on drop.
/// What [`ConsumerProcess::sample_memory`] saw: the most reserved of the
/// job budget, that budget, the peak RSS, and how many samples.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemorySamples {
    pub max_reserved: u64,
    pub budget: u64,
    pub max_rss: u64,
    pub samples: u64,
}

pub struct ConsumerProcess {
    process: Owned,
    log: PathBuf,
    _dir: tempfile::TempDir,
    http: Option<String>,
}

impl ConsumerProcess {
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Base URL of its HTTP endpoint.
    pub fn http(&self) -> &str {
        self.http.as_deref().unwrap_or("")
    }

    /// Waits for the "consuming" log line and reads the HTTP address from it.
    async fn wait_ready(&mut self) -> Result<String> {
        let until = Instant::now() + Duration::from_secs(120);
        while Instant::now() < until {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("consuming")) {
                let addr = line
                    .split("http=")
                    .nth(1)
                    .and_then(|s| s.split_whitespace().next())
                    .context("no http= in the consuming line")?;
                return Ok(format!("http://{addr}"));
            }
            if let Some(status) = self.process.exited() {
                bail!(
                    "consumer exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("consumer not ready after 120 s:\n{}", self.log_tail())
    }

    /// GETs a path of its HTTP endpoint.
    pub async fn get(&self, path: &str) -> Result<String> {
        Ok(reqwest::get(format!("{}{path}", self.http()))
            .await?
            .text()
            .await?)
    }

    /// Resident memory of the process, in bytes.
    pub fn resident_bytes(&self) -> Option<u64> {
        crate::resident_bytes_of(self.pid()?)
    }

    /// Samples the process's reserved budget (`/debug/memory`, asserting
    /// it never passes the budget) and its RSS every 50 ms until `stop`.
    pub fn sample_memory(
        &self,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<MemorySamples> {
        let url = format!("{}/debug/memory", self.http());
        let pid = self.pid();
        tokio::spawn(async move {
            let mut seen = MemorySamples::default();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let read = async { reqwest::get(&url).await.ok()?.text().await.ok() };
                if let Some(v) = read
                    .await
                    .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                {
                    let reserved = v["reserved_bytes"].as_u64().unwrap_or(0);
                    seen.budget = v["budget_bytes"].as_u64().unwrap_or(0);
                    assert!(
                        reserved <= seen.budget,
                        "reserved {reserved} over budget {}",
                        seen.budget
                    );
                    seen.max_reserved = seen.max_reserved.max(reserved);
                    seen.samples += 1;
                }
                let rss = pid.and_then(crate::resident_bytes_of).unwrap_or(0);
                seen.max_rss = seen.max_rss.max(rss);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            seen
        })
    }

    /// SIGTERM, then wait up to `grace`; returns whether it exited by itself.
    pub fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.process.terminate(grace)
    }

    /// SIGKILL: no drain, no goodbye.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// SIGSTOP: it holds its connections and its jobs but does nothing
    /// (a process stuck in a long GC pause or swapped out).
    pub fn pause(&self) {
        self.process.signal("STOP");
    }

    /// SIGCONT after [`ConsumerProcess::pause`].
    pub fn resume(&self) {
        self.process.signal("CONT");
    }

    /// Its exit status, once it has exited by itself.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.process.exited()
    }
}
