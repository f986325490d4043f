//! `sluice-gateway`: OpenAI's Files and Batches APIs over sluice's job
//! queue. Stateless: files and batch outputs live in S3, every record in the
//! gateway's KV bucket, the work in the job stream; any number of gateways
//! can serve one deployment, and a killed one loses nothing.
//!
//! The data path: `files::upload` streams a batch file to S3;
//! `batches::create` records a batch; `driver` validates it, publishes its
//! chunk jobs (run by the consumers like any job), follows their status
//! records and writes the output and error files.

pub mod api_error;
pub mod audio;
pub mod auth;
pub mod batch_record;
pub mod batches;
pub mod bounds;
pub mod config;
pub mod driver;
pub mod extract;
pub mod file_record;
pub mod files;
pub mod in_flight;
pub mod job_errors;
pub mod lifecycle;
pub mod metrics;
pub mod objects;
pub mod online;
pub mod openai;
pub mod outputs;
pub mod quota;
pub mod rate;
pub mod records;
pub mod state;
pub mod traces;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{get, post};

pub use config::Config;
use state::AppState;

/// The HTTP API.
pub fn router(state: AppState) -> Router {
    // An upload's body: the file, up to its limit, and the form around it.
    let upload_limit = usize::try_from(
        state
            .config
            .max_file_bytes
            .saturating_add(files::FORM_OVERHEAD_BYTES),
    )
    .unwrap_or(usize::MAX);
    // Each online request holds one of --max-online-requests slots.
    let slot = axum::middleware::from_fn_with_state(state.clone(), in_flight::limit);
    // Every endpoint of the OpenAI-compatible API answers online through
    // one handler (the body is read by the route's endpoint).
    let online = openai::Endpoint::ALL
        .into_iter()
        .filter(|e| e.takes_json())
        .fold(Router::new(), |router, endpoint| {
            router.route(endpoint.as_str(), post(online::answer).layer(slot.clone()))
        });
    online
        .route(
            "/v1/files",
            post(files::upload)
                .layer(DefaultBodyLimit::max(upload_limit))
                .get(files::list),
        )
        .route("/v1/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route(
            "/v1/audio/transcriptions",
            post(audio::transcriptions)
                .layer(DefaultBodyLimit::max(upload_limit))
                .layer(slot.clone()),
        )
        .route(
            "/v1/audio/translations",
            post(audio::translations)
                .layer(DefaultBodyLimit::max(upload_limit))
                .layer(slot.clone()),
        )
        .route("/v1/models", get(online::models))
        .route("/v1/batches", post(batches::create).get(batches::list))
        .route("/v1/batches/{id}", get(batches::retrieve))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ready" }))
        .route(
            "/metrics",
            get(|State(state): State<AppState>| async move { state.metrics.render() }),
        )
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            observe_request,
        ))
        .with_state(state)
}

/// Counts each request by its route (the pattern, not the path) and status,
/// and records its server span (`traces.rs`), whose `traceparent` the
/// handlers find in the request's extensions.
async fn observe_request(
    State(state): State<AppState>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let parent = request
        .headers()
        .get(sluice_schemas::names::headers::TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    let span = state
        .traces
        .request(request.method().as_str(), &route, parent);
    request
        .extensions_mut()
        .insert(traces::RequestTrace(span.traceparent().to_string()));
    let response = next.run(request).await;
    let status = response.status().as_u16();
    state.metrics.request(&route, status);
    span.end(status);
    response
}

/// A started gateway: its address and tasks.
pub struct Gateway {
    pub addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
    driver: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    traces: traces::Traces,
    otlp_metrics: Option<Arc<metrics::OtlpMetrics>>,
}

impl Gateway {
    /// Stops serving and driving at once (every fact is in NATS and S3:
    /// nothing is lost); spans and metrics not yet exported are dropped.
    pub fn stop(self) {
        self.server.abort();
        self.driver.abort();
        self.sweeper.abort();
    }

    /// `stop`, then exports the spans still buffered and the metrics once more.
    pub async fn shutdown(self) {
        let (traces, metrics) = (self.traces.clone(), self.otlp_metrics.clone());
        self.stop();
        let _ = tokio::task::spawn_blocking(move || {
            traces.shutdown();
            if let Some(m) = metrics {
                m.shutdown();
            }
        })
        .await;
    }
}

/// Reads the deployed models again every [`sluice_producer::models::REFRESH`]
/// while the gateway runs, so `serves` sees a model deployed or removed
/// since (a failed read keeps the last).
async fn refresh_models(models: std::sync::Weak<sluice_producer::models::ModelCatalog>) {
    loop {
        tokio::time::sleep(sluice_producer::models::REFRESH).await;
        let Some(models) = models.upgrade() else {
            return;
        };
        if let Err(e) = models.read().await {
            tracing::warn!(error = %e, "cannot read the deployed models; keeping the last read");
        }
    }
}

/// Connects, checks the deployment's bucket, binds and starts the driver.
pub async fn start(config: Config) -> Result<Gateway> {
    config.validate()?;
    let rate = (config.rate_limit_rps > 0.0)
        .then(|| rate::RequestRate::new(config.rate_limit_rps, config.rate_limit_burst));
    let keys = auth::Keys::load(config.keys_file.as_deref(), config.keys.as_ref())?.with_rate(rate);
    let topology = config.topology();
    let nats = sluice_connect::connect_nats(
        &config.deployment.nats_url,
        &config.deployment.nats_auth,
        "sluice-gateway",
        true,
        Duration::from_secs(30),
    )
    .await?;
    let js = async_nats::jetstream::new(nats);
    let gateway_kv = open_bucket(&js, &topology.gateway_bucket).await?;
    let status_kv = open_bucket(&js, &topology.status_bucket).await?;
    require_tenant_subjects(&js, &topology).await?;
    // A batch's window must end a margin before its chunks' status records
    // can age out of this bucket (see `lifecycle`).
    let status_max_age = sluice_connect::lookup::look_up(
        &format!("key-value bucket {}", topology.status_bucket),
        || status_kv.status(),
    )
    .await
    .with_context(|| format!("cannot read the bucket {}", topology.status_bucket))?
    .max_age();
    let s3 = config.deployment.s3.client().await;
    let metrics = Arc::new(metrics::Metrics::default());
    let (traces, otlp_metrics) = match config.otlp.endpoint.clone() {
        // The exporters' HTTP client is a blocking one: build them off the runtime.
        Some(endpoint) => {
            let protocol = config.otlp.protocol;
            let interval = config.otlp.metrics_interval();
            let metrics = Arc::clone(&metrics);
            tokio::task::spawn_blocking(move || -> Result<_> {
                let traces = traces::Traces::otlp(&endpoint, protocol)?;
                let pushed = metrics::OtlpMetrics::start(&endpoint, protocol, interval, &metrics)?;
                Ok((traces, Some(Arc::new(pushed))))
            })
            .await
            .context("OTLP set-up panicked")??
        }
        None => (traces::Traces::disabled(), None),
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let models = Arc::new(sluice_producer::models::ModelCatalog::new(
        js.clone(),
        topology.clone(),
    ));
    sluice_connect::lookup::look_up("the deployed models", || models.read())
        .await
        .context("cannot read the deployed models")?;
    tokio::spawn(refresh_models(Arc::downgrade(&models)));
    let state = AppState::new(state::Shared {
        online_slots: Arc::new(tokio::sync::Semaphore::new(config.max_online_requests)),
        token_rate: (config.token_rate_limit_tpm > 0)
            .then(|| rate::TokenRate::new(config.token_rate_limit_tpm)),
        config: Arc::new(config),
        keys: Arc::new(keys),
        topology,
        records: records::Records::new(gateway_kv, js.client()),
        statuses: sluice_status::StatusStore::new(status_kv),
        js,
        s3,
        owner: format!("gateway-{}", uuid::Uuid::new_v4().simple()),
        busy: state::Busy::default(),
        metrics,
        traces: traces.clone(),
        models,
        max_window_secs: lifecycle::max_window_secs(status_max_age),
    });
    let driver = driver::spawn(state.clone());
    let sweeper = driver::sweep::spawn(state.clone());
    let bounds = state.config.bounds();
    let app = router(state);
    let server = tokio::spawn(bounds::serve(listener, app, bounds));
    tracing::info!(%addr, "sluice-gateway listening");
    Ok(Gateway {
        addr,
        server,
        driver,
        sweeper,
        traces,
        otlp_metrics,
    })
}

/// Opens a bucket `sluice init` made, waiting out a cluster's election
/// (`sluice_connect::lookup`); one that does not exist names the fix.
async fn open_bucket(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Result<async_nats::jetstream::kv::Store> {
    sluice_connect::lookup::look_up(&format!("key-value bucket {name}"), || {
        js.get_key_value(name)
    })
    .await
    .map_err(|e| {
        e.for_start_up(
            &format!("key-value bucket {name}"),
            "run `sluice init` first",
        )
    })
}

/// Refuses a job stream without the tenants' subjects (one created by a
/// sluice from before tenants, not yet upgraded by `sluice init`): the
/// gateway publishes every job as its API key's tenant, and reads its
/// status in that tenant's scope (`sluice_status::StatusStore`), which a
/// job that fell back to a plain subject would not be in.
async fn require_tenant_subjects(
    js: &async_nats::jetstream::Context,
    topology: &sluice_schemas::Topology,
) -> Result<()> {
    let name = &topology.job_stream;
    let mut stream =
        sluice_connect::lookup::look_up(&format!("stream {name}"), || js.get_stream(name))
            .await
            .map_err(|e| e.for_start_up(&format!("stream {name}"), "run `sluice init` first"))?;
    let subjects = &stream
        .info()
        .await
        .with_context(|| format!("cannot read the stream {name}"))?
        .config
        .subjects;
    let missing: Vec<String> = sluice_schemas::Task::ALL
        .iter()
        .flat_map(|t| {
            sluice_schemas::Priority::ALL.map(|p| topology.tenant_subjects(t.as_str(), p))
        })
        .filter(|s| !subjects.contains(s))
        .collect();
    if !missing.is_empty() {
        anyhow::bail!(
            "the job stream {name} has no subjects for tenants' jobs ({}, ...: created by an older sluice): run `sluice init` to add them in place",
            missing[0]
        );
    }
    Ok(())
}

/// `start`, then serve until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<()> {
    let running = start(config).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping");
    running.shutdown().await;
    Ok(())
}
