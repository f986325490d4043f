//! The deployed models: which models of each task a deployment routes, as
//! `sluice init` records them (one key-value record per model in the
//! topology's `models_bucket`, keyed `<task>.<model>`) and as publishers
//! and consumers read them back. Pure: the reading is theirs.
//!
//! A task's *default* model takes the task's plain subjects
//! (`sluice.jobs.embed`, `...embed.high`, `...embed.<level>.<tenant>`) and
//! the durable consumers they always had; every other model of the task has
//! its own (`sluice.jobs.embed.model.<model>...`, durables `...@<model>`),
//! so a consumer only ever pulls the jobs of the model it loaded. A task
//! with no record is not routed: its jobs go to the plain subjects whatever
//! model they name, as before models were routed.

use serde::{Deserialize, Serialize};

/// One deployed model: its record in the models bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployedModel {
    /// The task it serves (`embed`, `generate`).
    pub task: String,
    /// Its name: what jobs put in `model`, a subject token
    /// ([`crate::names::is_valid_model`]).
    pub model: String,
    /// Whether it is its task's default model (the plain subjects).
    pub default: bool,
}

impl DeployedModel {
    /// Its key in the models bucket: `<task>.<model>`.
    pub fn key(&self) -> String {
        format!("{}.{}", self.task, self.model)
    }

    /// Where its jobs go: `None` for the task's plain subjects (the
    /// default model), else the model's own.
    pub fn route(&self) -> Option<String> {
        (!self.default).then(|| self.model.clone())
    }
}

/// A job names a model its task's deployment does not route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "model {model:?} is not deployed for the {task} task (deployed: {}): add it to `[[models]]` in the settings file and run `sluice init --settings FILE`",
    deployed.join(", ")
)]
pub struct NotDeployed {
    pub task: String,
    pub model: String,
    /// The task's deployed models, the default first.
    pub deployed: Vec<String>,
}

/// Every deployed model of a deployment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeployedModels {
    models: Vec<DeployedModel>,
}

impl DeployedModels {
    pub fn new(mut models: Vec<DeployedModel>) -> DeployedModels {
        models
            .sort_by(|a, b| (&a.task, !a.default, &a.model).cmp(&(&b.task, !b.default, &b.model)));
        DeployedModels { models }
    }

    /// All of them: by task, each task's default first.
    pub fn all(&self) -> &[DeployedModel] {
        &self.models
    }

    /// `task`'s models, the default first.
    pub fn of_task<'a>(&'a self, task: &'a str) -> impl Iterator<Item = &'a DeployedModel> + 'a {
        self.models.iter().filter(move |m| m.task == task)
    }

    /// The model route of `task`'s jobs for `model` (the [`crate::Route`]'s
    /// `model`): `None` for the plain subjects (the task's default model, or
    /// any model of a task with no record), `Some` for a model's own; an
    /// error for a model its task does not deploy.
    pub fn route(&self, task: &str, model: &str) -> Result<Option<String>, NotDeployed> {
        let mut of_task = self.of_task(task).peekable();
        if of_task.peek().is_none() {
            return Ok(None);
        }
        let deployed: Vec<&DeployedModel> = of_task.collect();
        match deployed.iter().find(|m| m.model == model) {
            Some(m) => Ok(m.route()),
            None => Err(NotDeployed {
                task: task.to_string(),
                model: model.to_string(),
                deployed: deployed.iter().map(|m| m.model.clone()).collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn model(task: &str, model: &str, default: bool) -> DeployedModel {
        DeployedModel {
            task: task.into(),
            model: model.into(),
            default,
        }
    }

    #[test]
    fn a_job_is_routed_by_its_tasks_records() {
        let models = DeployedModels::new(vec![
            model("embed", "bge-small", false),
            model("embed", "minilm", true),
        ]);
        // (task, model, route or the deployed models named in the error)
        type Want = Result<Option<&'static str>, Vec<&'static str>>;
        let table: [(&str, &str, Want); 4] = [
            ("embed", "minilm", Ok(None)),
            ("embed", "bge-small", Ok(Some("bge-small"))),
            ("embed", "e5", Err(vec!["minilm", "bge-small"])),
            // No record of the task: the plain subjects, whatever the model.
            ("generate", "anything", Ok(None)),
        ];
        for (task, name, want) in table {
            let got = models.route(task, name);
            match want {
                Ok(route) => assert_eq!(got, Ok(route.map(str::to_string)), "{task}/{name}"),
                Err(deployed) => assert_eq!(got.unwrap_err().deployed, deployed, "{task}/{name}"),
            }
        }
    }

    #[test]
    fn the_refusal_names_the_deployed_models_and_the_fix() {
        let models = DeployedModels::new(vec![model("embed", "minilm", true)]);
        let e = models.route("embed", "e5").unwrap_err().to_string();
        assert!(
            e.contains("\"e5\" is not deployed for the embed task (deployed: minilm)"),
            "{e}"
        );
        assert!(e.contains("[[models]]") && e.contains("sluice init"), "{e}");
    }

    #[test]
    fn the_record_is_keyed_by_task_and_model_and_round_trips() {
        let m = model("generate", "smollm2-360m", false);
        assert_eq!(m.key(), "generate.smollm2-360m");
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(
            json,
            r#"{"task":"generate","model":"smollm2-360m","default":false}"#
        );
        assert_eq!(serde_json::from_str::<DeployedModel>(&json).unwrap(), m);
    }
}
