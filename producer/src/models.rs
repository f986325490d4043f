//! Which model route a job is published to: the deployed models `sluice
//! init` recorded, read from the models bucket and kept for a while, read
//! again on a miss (a model deployed since) and once they are older than
//! [`REFRESH`] (a model removed since).

use std::sync::RwLock;
use std::time::{Duration, Instant};

use anyhow::Result;
use async_nats::jetstream;
use sluice_schemas::{DeployedModels, Job, NotDeployed, Priority, Route, Topology};

/// How long a read of the models bucket is trusted.
pub const REFRESH: Duration = Duration::from_secs(10);

pub struct ModelCatalog {
    js: jetstream::Context,
    topology: Topology,
    /// The last read and when it was made.
    last: RwLock<Option<(Instant, DeployedModels)>>,
}

impl ModelCatalog {
    pub fn new(js: jetstream::Context, topology: Topology) -> ModelCatalog {
        ModelCatalog {
            js,
            topology,
            last: RwLock::new(None),
        }
    }

    /// The deployed models as of at most [`REFRESH`] ago (none recorded:
    /// empty, every task unrouted).
    pub async fn models(&self) -> Result<DeployedModels> {
        match self.last_read() {
            Some((at, models)) if at.elapsed() < REFRESH => Ok(models),
            _ => self.read().await,
        }
    }

    /// The last read, however old (empty before the first).
    pub fn snapshot(&self) -> DeployedModels {
        self.last_read().map(|(_, m)| m).unwrap_or_default()
    }

    /// Where `job` goes at `priority` as `tenant`: its model's route. A
    /// model its task does not deploy is refused with [`NotDeployed`]
    /// (downcast it with [`not_deployed`]), after one more read of the
    /// bucket.
    pub async fn route(
        &self,
        job: &Job,
        priority: Priority,
        tenant: Option<&str>,
    ) -> Result<Route> {
        let mut model = self.models().await?.route(&job.task, &job.model);
        if model.is_err() {
            model = self.read().await?.route(&job.task, &job.model);
        }
        let model = model.map_err(|e: NotDeployed| {
            anyhow::Error::new(e).context(format!("job {} was not published", job.id))
        })?;
        Ok(Route {
            task: job.task.clone(),
            model,
            priority,
            tenant: tenant.map(str::to_string),
        })
    }

    /// Reads the bucket now.
    pub async fn read(&self) -> Result<DeployedModels> {
        let models = sluice_connect::models::deployed_models(&self.js, &self.topology)
            .await?
            .unwrap_or_default();
        if let Ok(mut last) = self.last.write() {
            *last = Some((Instant::now(), models.clone()));
        }
        Ok(models)
    }

    fn last_read(&self) -> Option<(Instant, DeployedModels)> {
        self.last.read().ok().and_then(|last| last.clone())
    }
}

/// Whether `e` is a refusal of an undeployed model, and which.
pub fn not_deployed(e: &anyhow::Error) -> Option<&NotDeployed> {
    e.chain()
        .find_map(|cause| cause.downcast_ref::<NotDeployed>())
}
