//! TOML → validated `Config`.
//!
//! `RawConfig` mirrors the file (every key defaulted, so no file at all is a valid config);
//! `Config::parse` turns it into typed values (socket address, partition, compiled rules) and
//! reports *every* problem at once, each named by its key path: unknown keys (collected with
//! serde_ignored rather than `deny_unknown_fields`, which stops at the first), a wrong type, or
//! a value out of range. The commented example in `config.example.toml` is embedded in the
//! binary: it is what `deadletter config init` writes and what a test checks parses to the
//! defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::classify::{RuleSpec, Rules};
use crate::model::{Backoff, BodyMode, FailureClass, Partition, Status};

/// The commented example config, embedded so `config init` needs no file beside the binary.
pub const EXAMPLE: &str = include_str!("../config.example.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} problem(s) in {origin}:\n{}", problems.len(), problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        origin: String,
        problems: Vec<String>,
    },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub ingest: IngestConfig,
    pub redact: RedactConfig,
    pub logging: LoggingConfig,
    pub rules: Rules,
    pub triage: TriageConfig,
    pub delivery: DeliveryConfig,
    pub targets: Vec<TargetConfig>,
    pub replay: ReplayConfig,
    pub auth: AuthConfig,
    pub retention: RetentionConfig,
    pub metrics: MetricsConfig,
    pub alerts: AlertsConfig,
    pub n8n: N8nConfig,
}

/// n8n's public API: enrichment of Error Trigger records (and, later, reconciliation).
#[derive(Debug, Clone)]
pub struct N8nConfig {
    pub base_url: String,
    /// Where the API key is read from (never the key: Debug shows the source only).
    pub api_key: Option<SecretSource>,
    pub timeout: Duration,
    /// Fetch the execution of each Error Trigger record (needs `api_key`).
    pub enrich: bool,
    /// Executions fetched at once.
    pub concurrency: usize,
    /// How often the enricher looks for records to fetch.
    pub tick: Duration,
    /// Keep trying (n8n down, key refused) this long after a record arrived, then give up.
    pub give_up_after: Duration,
    /// Replay an Error Trigger record whose payload is a webhook item (fetched from n8n) to
    /// that webhook, without a `[[targets]]` entry.
    pub replay_to_webhook: bool,
    /// Replay an Error Trigger record that has no webhook item (and no edited payload) with
    /// n8n's own retry of its execution.
    pub replay_with_retry: bool,
    /// n8n's retry with the workflow as it is now (true) or as it was when it failed (false).
    pub retry_load_workflow: bool,
    /// Page through n8n's failed executions and create records for the ones never reported.
    pub reconcile: bool,
    pub reconcile_every: Duration,
}

/// Alert rules, evaluated every `evaluate_every`, posted to one webhook.
#[derive(Debug, Clone)]
pub struct AlertsConfig {
    /// None: alerts are off (the rules are still checked).
    pub webhook: Option<AlertWebhook>,
    pub evaluate_every: Duration,
    pub rules: Vec<AlertRule>,
}

#[derive(Debug, Clone)]
pub struct AlertWebhook {
    pub url: String,
    pub format: AlertFormat,
    pub timeout: Duration,
    pub secret_headers: Vec<(String, SecretSource)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertFormat {
    /// deadletter's own JSON (an n8n webhook takes it as is).
    Generic,
    /// `{"text": …}`: Slack's incoming webhooks and most chat tools.
    Slack,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AlertRule {
    pub name: String,
    pub kind: AlertKind,
    /// At most one message per this long while the rule keeps firing.
    pub throttle: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AlertKind {
    /// Open records in a partition (any, if None) over `over`, for at least `window`.
    Depth {
        partition: Option<String>,
        over: u64,
        window: Duration,
    },
    /// Open records past their due time (their class's SLA).
    OverSla,
    /// New records of a class flagged as a credential incident (auth failures).
    CredentialIncident,
    /// Replay/retry sends accepted under `floor` over `window` (with at least `min_sends`).
    ReplaySuccess {
        floor: f64,
        window: Duration,
        min_sends: u64,
    },
    /// More than `over` records ingested within `window` (a retry storm upstream).
    RetryStorm { over: u64, window: Duration },
}

/// `GET /metrics` and `GET /v1/stats`.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// With API tokens configured, /metrics asks for one too (any role); otherwise it is open
    /// like /healthz (it never shows payloads, only counts, partitions and target names).
    pub require_token: bool,
    /// Partitions beyond this many share the label `partition="other"`.
    pub max_partitions: usize,
    /// Partitions whose open records are money at risk (business-loss risk in stats).
    pub money_partitions: Vec<String>,
}

/// How long records and tombstones are kept.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Any record older than this (first seen) goes, open or not.
    pub max_age: Duration,
    /// A closed record (replayed, resolved, skipped) goes this long after it closed.
    pub closed_max_age: Duration,
    /// Tombstones are kept this long.
    pub tombstone_max_age: Duration,
    /// How often the sweeper runs.
    pub sweep_every: Duration,
    /// Records removed per transaction (small, so ingest never waits long).
    pub batch: usize,
    /// Stored document bytes a partition may hold (the oldest go beyond it).
    pub max_bytes: Option<u64>,
    /// Bytes the database file may use (all partitions; the oldest go beyond it).
    pub max_total_bytes: Option<u64>,
    /// Open records this close to their age are "expiring soon" (`GET /v1/retention`, logs).
    pub warn_before: Duration,
    /// Partitions with their own policy; what they leave out is the global value.
    pub partitions: std::collections::BTreeMap<String, PartitionRetention>,
}

/// One partition's retention, resolved (global values where it says nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRetention {
    pub max_age: Duration,
    pub closed_max_age: Duration,
    pub max_bytes: Option<u64>,
}

/// API tokens. With none configured, the API is open — and deadletter refuses to listen
/// anywhere but loopback.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub tokens: Vec<TokenConfig>,
}

#[derive(Debug, Clone)]
pub struct TokenConfig {
    /// Becomes the actor in the audit trail.
    pub name: String,
    pub role: crate::model::Role,
    pub secret: TokenSecret,
}

/// Where a token comes from: read once at start from the environment or a file, or given only
/// as its sha256 (so the config file holds no secret).
#[derive(Clone, PartialEq, Eq)]
pub enum TokenSecret {
    Env(String),
    File(PathBuf),
    Sha256([u8; 32]),
}

impl std::fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSecret::Env(v) => write!(f, "env:{v}"),
            TokenSecret::File(p) => write!(f, "file:{}", p.display()),
            TokenSecret::Sha256(_) => f.write_str("sha256:[REDACTED]"),
        }
    }
}

impl TokenSecret {
    /// The token's sha256, reading it now if it lives in the environment or a file.
    pub fn digest(&self) -> Result<[u8; 32], String> {
        use sha2::{Digest, Sha256};
        let token = match self {
            TokenSecret::Sha256(d) => return Ok(*d),
            TokenSecret::Env(v) => {
                std::env::var(v).map_err(|_| format!("environment variable {v} is not set"))?
            }
            TokenSecret::File(p) => std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        };
        if token.len() < 16 {
            return Err("a token must be at least 16 characters".into());
        }
        Ok(Sha256::digest(token.as_bytes()).into())
    }
}

/// Operator replay jobs.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Items sent between two checks of the job's failure ratio (after a one-item canary).
    pub batch_size: usize,
    /// A job stops by itself when more than this share of its sent items failed.
    pub stop_failure_ratio: f64,
    /// Jobs touching these partitions need a second, different person to approve them.
    pub require_approval: Vec<String>,
    /// The most records one job may take.
    pub max_items: usize,
    /// The most jobs one person may have open (awaiting approval, running or paused) at once.
    pub max_open_jobs_per_actor: usize,
}

/// Automatic retries and replays.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// Run the retry scheduler (off: records wait in retry_scheduled).
    pub enabled: bool,
    /// How often the scheduler looks for due records.
    pub tick: Duration,
    /// A claimed record not finished within this returns to its queue.
    pub lease: Duration,
    /// Sends in flight at once, per target.
    pub concurrency_per_target: usize,
    /// With no target and no replay_url, send to the n8n webhook the item came from
    /// (`webhookUrl` of an n8n webhook item). Off by default: replaying re-runs the workflow.
    pub use_payload_webhook_url: bool,
    /// Settings for targets made from a record's replay_url (or payload webhookUrl).
    pub defaults: TargetSettings,
}

/// Where records go back to, and how gently.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    pub name: String,
    pub url: String,
    /// Send records of these partitions here …
    pub partitions: Vec<String>,
    /// … or of these workflows (id or name).
    pub workflows: Vec<String>,
    pub settings: TargetSettings,
}

#[derive(Debug, Clone)]
pub struct TargetSettings {
    pub method: String,
    pub timeout: Duration,
    pub body: BodyMode,
    /// Extra headers, literal values.
    pub headers: Vec<(String, String)>,
    /// Extra headers whose values are read at send time, never stored.
    pub secret_headers: Vec<(String, SecretSource)>,
    /// Token bucket: starts at `rate_initial` sends/s, doubles every `rate_ramp_every` while
    /// the error rate stays under 0.5 %, up to `rate_max`; halves on errors.
    pub rate_initial: f64,
    pub rate_max: f64,
    pub rate_ramp_every: Duration,
    /// Circuit breaker: opens after this many consecutive failures …
    pub breaker_failures: u32,
    /// … for this long, then lets one probe through.
    pub breaker_cooldown: Duration,
}

/// Where a secret header value comes from, read at send time.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names where the secret lives, never the secret.
        match self {
            SecretSource::Env(v) => write!(f, "env:{v}"),
            SecretSource::File(p) => write!(f, "file:{}", p.display()),
        }
    }
}

impl SecretSource {
    /// The secret, read now.
    pub fn read(&self) -> Result<String, String> {
        match self {
            SecretSource::Env(v) => {
                std::env::var(v).map_err(|_| format!("environment variable {v} is not set"))
            }
            SecretSource::File(p) => std::fs::read_to_string(p)
                .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(|e| format!("cannot read {}: {e}", p.display())),
        }
    }
}

/// What happens to a new record of one failure class.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// new, review or retry_scheduled.
    pub initial: Status,
    /// Automatic attempts before the record goes to review (used by the retry scheduler).
    pub max_attempts: u32,
    /// Who gets new records of this class.
    pub owner: Option<String>,
    /// `due_at` = first seen + SLA.
    pub sla: Duration,
    /// Flag the record (and, later, alert) as a credential incident.
    pub credential_incident: bool,
    /// The wait between automatic attempts.
    pub backoff: Backoff,
}

#[derive(Debug, Clone)]
pub struct TriageConfig {
    /// One policy per failure class, in `FailureClass::ALL` order.
    policies: Vec<(FailureClass, Policy)>,
    /// This many new records of one fingerprint within `poison_window` make it poison.
    pub poison_threshold: u32,
    pub poison_window: Duration,
}

impl TriageConfig {
    pub fn policy(&self, class: FailureClass) -> &Policy {
        // Every class has an entry: `validate` fills the table from the defaults.
        &self
            .policies
            .iter()
            .find(|(c, _)| *c == class)
            .expect("a policy for every class")
            .1
    }
}

/// The built-in policies (DESIGN.md "Failure classes"), before config overrides.
pub fn default_policy(class: FailureClass) -> Policy {
    use FailureClass::*;
    let hours = |h: u64| Duration::from_secs(h * 3600);
    let secs = Duration::from_secs;
    let (initial, max_attempts, sla, base) = match class {
        Transient => (Status::RetryScheduled, 5, hours(24), secs(30)),
        RateLimited => (Status::RetryScheduled, 8, hours(24), secs(60)),
        Unknown => (Status::RetryScheduled, 3, hours(24), secs(60)),
        Auth => (Status::Review, 0, hours(4), secs(60)),
        Validation | Conflict | Business => (Status::Review, 0, hours(48), secs(60)),
    };
    Policy {
        initial,
        max_attempts,
        owner: None,
        sla,
        credential_incident: class == Auth,
        backoff: Backoff {
            base,
            factor: 2.0,
            cap: hours(1),
        },
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub body_limit_bytes: usize,
    pub batch_max_items: usize,
    /// A request whose body has not arrived by then gets 408 (slow clients hold nothing).
    pub request_timeout: Duration,
    /// Most bytes of request headers (names and values) accepted (431 above it).
    pub max_header_bytes: usize,
    /// After SIGTERM/SIGINT: how long in-flight requests and sends may take before exit.
    pub shutdown_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    pub compress_above_bytes: usize,
    pub zstd_level: i32,
    pub busy_timeout: Duration,
    pub writer_max_batch: usize,
}

impl StorageConfig {
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("deadletter.db")
    }
}

#[derive(Debug, Clone)]
pub struct IngestConfig {
    pub default_partition: Partition,
    pub dedup_identical_bodies: bool,
    pub max_request_header_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct RedactConfig {
    /// The configured keys plus `extra_keys`, as written (the redactor normalises them).
    pub keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct LoggingConfig {
    pub level: String,
    pub dir: PathBuf,
    /// Log files older than this are removed (by the retention sweeper's schedule).
    pub max_age: Duration,
    pub stderr: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct RawConfig {
    server: RawServer,
    storage: RawStorage,
    ingest: RawIngest,
    redact: RawRedact,
    logging: RawLogging,
    classify: RawClassify,
    triage: RawTriage,
    policy: std::collections::BTreeMap<String, RawPolicy>,
    delivery: RawDelivery,
    targets: Vec<RawDelivery>,
    replay: RawReplay,
    auth: RawAuth,
    retention: RawRetention,
    metrics: RawMetrics,
    alerts: RawAlerts,
    n8n: RawN8n,
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawN8n {
    base_url: String,
    api_key: Option<RawSecret>,
    timeout: String,
    enrich: bool,
    concurrency: u64,
    tick: String,
    give_up_after: String,
    reconcile: bool,
    reconcile_every: String,
    replay_to_webhook: bool,
    replay_with_retry: bool,
    retry_load_workflow: bool,
}

impl Default for RawN8n {
    fn default() -> Self {
        RawN8n {
            base_url: "http://127.0.0.1:5678".into(),
            api_key: None,
            timeout: "10s".into(),
            enrich: true,
            concurrency: 2,
            tick: "2s".into(),
            give_up_after: "1d".into(),
            reconcile: true,
            reconcile_every: "5m".into(),
            replay_to_webhook: true,
            replay_with_retry: true,
            retry_load_workflow: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawAlerts {
    webhook_url: String,
    format: String,
    timeout: String,
    evaluate_every: String,
    throttle: String,
    include_defaults: bool,
    secret_headers: std::collections::BTreeMap<String, RawSecret>,
    rules: Vec<RawAlertRule>,
}

impl Default for RawAlerts {
    fn default() -> Self {
        RawAlerts {
            webhook_url: String::new(),
            format: "generic".into(),
            timeout: "5s".into(),
            evaluate_every: "1m".into(),
            throttle: "1h".into(),
            include_defaults: true,
            secret_headers: Default::default(),
            rules: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct RawAlertRule {
    name: String,
    kind: String,
    partition: Option<String>,
    over: Option<u64>,
    floor: Option<f64>,
    window: Option<String>,
    min_sends: Option<u64>,
    throttle: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawMetrics {
    require_token: bool,
    max_partitions: u64,
    money_partitions: Vec<String>,
}

impl Default for RawMetrics {
    fn default() -> Self {
        RawMetrics {
            require_token: false,
            max_partitions: 50,
            money_partitions: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawRetention {
    max_age: String,
    closed_max_age: String,
    tombstone_max_age: String,
    sweep_every: String,
    batch: u64,
    max_bytes: String,
    max_total_bytes: String,
    warn_before: String,
    partitions: std::collections::BTreeMap<String, RawPartitionRetention>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct RawPartitionRetention {
    max_age: Option<String>,
    closed_max_age: Option<String>,
    max_bytes: Option<String>,
}

impl Default for RawRetention {
    fn default() -> Self {
        RawRetention {
            max_age: "14d".into(),
            closed_max_age: "7d".into(),
            tombstone_max_age: "400d".into(),
            sweep_every: "10m".into(),
            batch: 200,
            max_bytes: "500MB".into(),
            max_total_bytes: "4GB".into(),
            warn_before: "2d".into(),
            partitions: Default::default(),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct RawAuth {
    tokens: Vec<RawToken>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct RawToken {
    name: String,
    role: String,
    env: Option<String>,
    file: Option<String>,
    sha256: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawReplay {
    batch_size: u64,
    stop_failure_ratio: f64,
    require_approval: Vec<String>,
    max_items: u64,
    max_open_jobs_per_actor: u64,
}

impl Default for RawReplay {
    fn default() -> Self {
        RawReplay {
            batch_size: 10,
            stop_failure_ratio: 0.2,
            require_approval: Vec::new(),
            max_items: 1000,
            max_open_jobs_per_actor: 3,
        }
    }
}

/// `[delivery]` and each `[[targets]]` share one shape (no `#[serde(flatten)]`: it would hide
/// unknown keys from serde_ignored); keys that belong only to one of them are checked by hand.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct RawDelivery {
    // [delivery] only
    enabled: Option<bool>,
    tick: Option<String>,
    lease: Option<String>,
    concurrency_per_target: Option<u64>,
    use_payload_webhook_url: Option<bool>,
    // [[targets]] only
    name: Option<String>,
    url: Option<String>,
    partitions: Vec<String>,
    workflows: Vec<String>,
    // both
    method: Option<String>,
    timeout: Option<String>,
    body: Option<String>,
    headers: std::collections::BTreeMap<String, String>,
    secret_headers: std::collections::BTreeMap<String, RawSecret>,
    rate_initial: Option<f64>,
    rate_max: Option<f64>,
    rate_ramp_every: Option<String>,
    breaker_failures: Option<u64>,
    breaker_cooldown: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawSecret {
    #[serde(default)]
    env: Option<String>,
    #[serde(default)]
    file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawTriage {
    poison_threshold: u64,
    poison_window: String,
}

impl Default for RawTriage {
    fn default() -> Self {
        RawTriage {
            poison_threshold: 3,
            poison_window: "1h".into(),
        }
    }
}

/// Overrides for one class; what is left out keeps the built-in value.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct RawPolicy {
    initial: Option<String>,
    max_attempts: Option<u64>,
    owner: Option<String>,
    sla: Option<String>,
    credential_incident: Option<bool>,
    retry_base: Option<String>,
    retry_factor: Option<f64>,
    retry_cap: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawServer {
    listen: String,
    body_limit_bytes: u64,
    batch_max_items: u64,
    request_timeout: String,
    shutdown_timeout: String,
    max_header_bytes: u64,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: "127.0.0.1:7680".into(),
            body_limit_bytes: 16 * 1024 * 1024,
            batch_max_items: 1000,
            request_timeout: "30s".into(),
            shutdown_timeout: "10s".into(),
            max_header_bytes: 16 * 1024,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawStorage {
    data_dir: String,
    compress_above_bytes: u64,
    zstd_level: i64,
    busy_timeout_ms: u64,
    writer_max_batch: u64,
}

impl Default for RawStorage {
    fn default() -> Self {
        RawStorage {
            data_dir: String::new(),
            compress_above_bytes: 1024,
            zstd_level: 3,
            busy_timeout_ms: 5000,
            writer_max_batch: 256,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawIngest {
    default_partition: String,
    dedup_identical_bodies: bool,
    max_request_header_bytes: u64,
}

impl Default for RawIngest {
    fn default() -> Self {
        RawIngest {
            default_partition: "default".into(),
            dedup_identical_bodies: true,
            max_request_header_bytes: 4096,
        }
    }
}

/// The keys whose values never reach the database or the logs.
pub const DEFAULT_REDACT_KEYS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api_key",
    "apikey",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "password",
    "passwd",
    "secret",
    "client_secret",
    "private_key",
    "x-n8n-api-key",
];

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawRedact {
    keys: Vec<String>,
    extra_keys: Vec<String>,
}

impl Default for RawRedact {
    fn default() -> Self {
        RawRedact {
            keys: DEFAULT_REDACT_KEYS.iter().map(|s| s.to_string()).collect(),
            extra_keys: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawLogging {
    level: String,
    dir: String,
    max_age: String,
    stderr: bool,
}

impl Default for RawLogging {
    fn default() -> Self {
        RawLogging {
            level: "info".into(),
            dir: String::new(),
            max_age: String::new(),
            stderr: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct RawClassify {
    include_defaults: bool,
    rules: Vec<RawRule>,
}

impl Default for RawClassify {
    fn default() -> Self {
        RawClassify {
            include_defaults: true,
            rules: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawRule {
    name: String,
    class: String,
    #[serde(default)]
    http_status: Vec<u16>,
    #[serde(default)]
    error_code: Vec<String>,
    #[serde(default)]
    error_text: Option<String>,
    #[serde(default)]
    node_type: Option<String>,
    #[serde(default)]
    workflow: Option<String>,
}

impl Config {
    /// The embedded defaults: what `deadletter serve` runs on with no file.
    pub fn default_config() -> Result<Config, ConfigError> {
        Config::parse("", "the embedded default config")
    }

    /// Read and validate a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parse TOML text; `origin` names it in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let invalid = |problems: Vec<String>| ConfigError::Invalid {
            origin: origin.to_owned(),
            problems,
        };
        let de = toml::Deserializer::parse(text).map_err(|e| invalid(vec![one_line(&e)]))?;
        let mut unknown = Vec::new();
        let mut track = serde_path_to_error::Track::new();
        let raw: Result<RawConfig, _> = serde_ignored::deserialize(
            serde_path_to_error::Deserializer::new(de, &mut track),
            |path| unknown.push(format!("{path}: unknown key")),
        );
        let raw = match raw {
            Ok(raw) => raw,
            Err(e) => {
                let path = track.path().to_string();
                let mut problems = unknown;
                problems.push(format!("{path}: {}", one_line(&e)));
                return Err(invalid(problems));
            }
        };
        let mut problems = unknown;
        let config = validate(raw, &mut problems);
        match config {
            Some(c) if problems.is_empty() => Ok(c),
            _ => Err(invalid(problems)),
        }
    }

    /// The platform's per-user data dir for deadletter.
    pub fn platform_data_dir() -> Option<PathBuf> {
        directories::ProjectDirs::from("", "", "deadletter").map(|d| d.data_dir().to_owned())
    }

    /// Point the data dir somewhere else (`--data-dir`); logs follow unless set explicitly.
    pub fn set_data_dir(&mut self, dir: PathBuf) {
        if self.logging.dir == self.storage.data_dir.join("logs") {
            self.logging.dir = dir.join("logs");
        }
        self.storage.data_dir = dir;
    }
}

fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with('|') && !l.chars().all(|c| c == '^' || c == ' ')
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn validate(raw: RawConfig, problems: &mut Vec<String>) -> Option<Config> {
    let mut bad = |p: String| problems.push(p);

    let listen = raw
        .server
        .listen
        .parse::<SocketAddr>()
        .map_err(|_| {
            bad(format!(
                "server.listen: `{}` is not an address like 127.0.0.1:7680",
                raw.server.listen
            ))
        })
        .ok();
    let body_limit_bytes = in_range(
        &mut bad,
        "server.body_limit_bytes",
        raw.server.body_limit_bytes,
        1024,
        1 << 30,
    );
    let batch_max_items = in_range(
        &mut bad,
        "server.batch_max_items",
        raw.server.batch_max_items,
        1,
        100_000,
    );

    let data_dir = if raw.storage.data_dir.trim().is_empty() {
        match Config::platform_data_dir() {
            Some(d) => Some(d),
            None => {
                bad("storage.data_dir: empty, and this platform has no per-user data dir (is HOME set?)".into());
                None
            }
        }
    } else {
        Some(PathBuf::from(&raw.storage.data_dir))
    };
    let compress_above_bytes = in_range(
        &mut bad,
        "storage.compress_above_bytes",
        raw.storage.compress_above_bytes,
        0,
        1 << 30,
    );
    let zstd_level = in_range(
        &mut bad,
        "storage.zstd_level",
        raw.storage.zstd_level.max(0) as u64,
        1,
        19,
    ) as i32;
    if raw.storage.zstd_level < 1 {
        bad("storage.zstd_level: must be from 1 to 19".into());
    }
    let busy_timeout_ms = in_range(
        &mut bad,
        "storage.busy_timeout_ms",
        raw.storage.busy_timeout_ms,
        0,
        600_000,
    );
    let writer_max_batch = in_range(
        &mut bad,
        "storage.writer_max_batch",
        raw.storage.writer_max_batch,
        1,
        10_000,
    );

    let default_partition = Partition::parse(&raw.ingest.default_partition)
        .map_err(|m| bad(format!("ingest.default_partition: {m}")))
        .ok();
    let max_request_header_bytes = in_range(
        &mut bad,
        "ingest.max_request_header_bytes",
        raw.ingest.max_request_header_bytes,
        64,
        1 << 20,
    );

    let mut keys = raw.redact.keys;
    keys.extend(raw.redact.extra_keys);
    for (i, k) in keys.iter().enumerate() {
        if k.trim().is_empty() {
            bad(format!("redact.keys[{i}]: empty key"));
        }
    }

    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&raw.logging.level) {
        bad(format!(
            "logging.level: `{}` is not a log filter: {e}",
            raw.logging.level
        ));
    }

    let mut specs = Vec::new();
    for (i, r) in raw.classify.rules.into_iter().enumerate() {
        let path = format!("classify.rules[{i}]");
        let class = r
            .class
            .parse::<FailureClass>()
            .map_err(|m| bad(format!("{path}.class: {m}")))
            .ok();
        if r.http_status.is_empty()
            && r.error_code.is_empty()
            && r.error_text.is_none()
            && r.node_type.is_none()
            && r.workflow.is_none()
        {
            bad(format!("{path}: `{}` has no matcher (http_status, error_code, error_text, node_type or workflow)", r.name));
        }
        for s in &r.http_status {
            if !(100..=599).contains(s) {
                bad(format!("{path}.http_status: {s} is not an HTTP status"));
            }
        }
        // Compiled even when the class is bad, so a bad regex in the same rule is reported too.
        specs.push((
            path,
            RuleSpec {
                name: r.name,
                class: class.unwrap_or(FailureClass::Unknown),
                http_status: r.http_status,
                error_code: r.error_code,
                error_text: r.error_text,
                node_type: r.node_type,
                workflow: r.workflow,
            },
        ));
    }
    let rules = match Rules::build(specs, raw.classify.include_defaults) {
        Ok(r) => Some(r),
        Err(errs) => {
            problems.extend(errs);
            None
        }
    };

    let max_header_bytes = in_range(
        &mut |p| problems.push(p),
        "server.max_header_bytes",
        raw.server.max_header_bytes,
        1024,
        1 << 20,
    );
    let request_timeout = duration(
        problems,
        "server.request_timeout",
        &raw.server.request_timeout,
    );
    let shutdown_timeout = duration(
        problems,
        "server.shutdown_timeout",
        &raw.server.shutdown_timeout,
    );
    let triage = validate_triage(raw.triage, raw.policy, problems);
    let auth = validate_auth(raw.auth, problems);
    let retention = validate_retention(raw.retention, problems);
    let alerts = validate_alerts(raw.alerts, problems);
    let n8n = validate_n8n(raw.n8n, problems);
    let metrics = {
        let max = in_range(
            &mut |p| problems.push(p),
            "metrics.max_partitions",
            raw.metrics.max_partitions,
            1,
            10_000,
        );
        let mut ok = true;
        for (i, p) in raw.metrics.money_partitions.iter().enumerate() {
            if let Err(e) = crate::model::Partition::parse(p) {
                problems.push(format!("metrics.money_partitions[{i}]: {e}"));
                ok = false;
            }
        }
        ok.then_some(MetricsConfig {
            require_token: raw.metrics.require_token,
            max_partitions: max as usize,
            money_partitions: raw.metrics.money_partitions,
        })
    };
    // Logs are kept as long as records unless told otherwise.
    let log_max_age = if raw.logging.max_age.trim().is_empty() {
        retention.as_ref().map(|r| r.max_age)
    } else {
        duration(problems, "logging.max_age", &raw.logging.max_age)
    };
    let (delivery, targets) = validate_delivery(raw.delivery, raw.targets, problems);
    let replay_batch = in_range(
        &mut |p| problems.push(p),
        "replay.batch_size",
        raw.replay.batch_size,
        1,
        1000,
    );
    let replay_max = in_range(
        &mut |p| problems.push(p),
        "replay.max_items",
        raw.replay.max_items,
        1,
        100_000,
    );
    let replay_per_actor = in_range(
        &mut |p| problems.push(p),
        "replay.max_open_jobs_per_actor",
        raw.replay.max_open_jobs_per_actor,
        1,
        1000,
    );
    if !(0.0..=1.0).contains(&raw.replay.stop_failure_ratio) {
        problems.push(format!(
            "replay.stop_failure_ratio: {} must be from 0 to 1",
            raw.replay.stop_failure_ratio
        ));
    }

    let data_dir = data_dir?;
    let log_dir = if raw.logging.dir.trim().is_empty() {
        data_dir.join("logs")
    } else {
        PathBuf::from(&raw.logging.dir)
    };
    Some(Config {
        server: ServerConfig {
            listen: listen?,
            body_limit_bytes: body_limit_bytes as usize,
            batch_max_items: batch_max_items as usize,
            request_timeout: request_timeout?,
            max_header_bytes: max_header_bytes as usize,
            shutdown_timeout: shutdown_timeout?,
        },
        storage: StorageConfig {
            data_dir,
            compress_above_bytes: compress_above_bytes as usize,
            zstd_level,
            busy_timeout: Duration::from_millis(busy_timeout_ms),
            writer_max_batch: writer_max_batch as usize,
        },
        ingest: IngestConfig {
            default_partition: default_partition?,
            dedup_identical_bodies: raw.ingest.dedup_identical_bodies,
            max_request_header_bytes: max_request_header_bytes as usize,
        },
        redact: RedactConfig { keys },
        logging: LoggingConfig {
            level: raw.logging.level,
            dir: log_dir,
            max_age: log_max_age?,
            stderr: raw.logging.stderr,
        },
        rules: rules?,
        triage: triage?,
        delivery: delivery?,
        targets,
        auth: auth?,
        retention: retention?,
        metrics: metrics?,
        alerts: alerts?,
        n8n: n8n?,
        replay: ReplayConfig {
            batch_size: replay_batch as usize,
            stop_failure_ratio: raw.replay.stop_failure_ratio,
            require_approval: raw.replay.require_approval,
            max_items: replay_max as usize,
            max_open_jobs_per_actor: replay_per_actor as usize,
        },
    })
}

/// "500MB", "4 GiB", "0" — or "" / "none" for no cap.
fn byte_cap(problems: &mut Vec<String>, path: &str, text: &str) -> Option<Option<u64>> {
    let t = text.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("none") {
        return Some(None);
    }
    match t.parse::<bytesize::ByteSize>() {
        Ok(b) if b.as_u64() > 0 => Some(Some(b.as_u64())),
        Ok(_) => {
            problems.push(format!(
                "{path}: a cap of 0 bytes would remove everything; write \"none\" for no cap"
            ));
            None
        }
        Err(e) => {
            problems.push(format!(
                "{path}: `{text}` is not a size like 500MB or 4GiB ({e})"
            ));
            None
        }
    }
}

fn validate_retention(raw: RawRetention, problems: &mut Vec<String>) -> Option<RetentionConfig> {
    let max_age = duration(problems, "retention.max_age", &raw.max_age);
    let closed_max_age = duration(problems, "retention.closed_max_age", &raw.closed_max_age);
    let tombstone_max_age = duration(
        problems,
        "retention.tombstone_max_age",
        &raw.tombstone_max_age,
    );
    let sweep_every = duration(problems, "retention.sweep_every", &raw.sweep_every);
    let warn_before = duration(problems, "retention.warn_before", &raw.warn_before);
    let batch = in_range(
        &mut |p| problems.push(p),
        "retention.batch",
        raw.batch,
        1,
        10_000,
    );
    let max_bytes = byte_cap(problems, "retention.max_bytes", &raw.max_bytes);
    let max_total_bytes = byte_cap(problems, "retention.max_total_bytes", &raw.max_total_bytes);
    let mut partitions = std::collections::BTreeMap::new();
    for (name, p) in raw.partitions {
        let path = format!("retention.partitions.{name}");
        if let Err(e) = crate::model::Partition::parse(&name) {
            problems.push(format!("{path}: {e}"));
            continue;
        }
        let age = |problems: &mut Vec<String>,
                   key: &str,
                   v: &Option<String>,
                   global: Option<Duration>| {
            match v {
                Some(t) => duration(problems, &format!("{path}.{key}"), t),
                None => global,
            }
        };
        let p_max_age = age(problems, "max_age", &p.max_age, max_age);
        let p_closed = age(
            problems,
            "closed_max_age",
            &p.closed_max_age,
            closed_max_age,
        );
        let p_bytes = match &p.max_bytes {
            Some(t) => byte_cap(problems, &format!("{path}.max_bytes"), t),
            None => max_bytes,
        };
        if let (Some(max_age), Some(closed_max_age), Some(max_bytes)) =
            (p_max_age, p_closed, p_bytes)
        {
            partitions.insert(
                name,
                PartitionRetention {
                    max_age,
                    closed_max_age,
                    max_bytes,
                },
            );
        }
    }
    Some(RetentionConfig {
        max_age: max_age?,
        closed_max_age: closed_max_age?,
        tombstone_max_age: tombstone_max_age?,
        sweep_every: sweep_every?,
        warn_before: warn_before?,
        batch: batch as usize,
        max_bytes: max_bytes?,
        max_total_bytes: max_total_bytes?,
        partitions,
    })
}

/// A secret header's source: exactly one of env or file.
fn secret_source(problems: &mut Vec<String>, path: &str, v: &RawSecret) -> Option<SecretSource> {
    match (&v.env, &v.file) {
        (Some(e), None) => Some(SecretSource::Env(e.clone())),
        (None, Some(f)) => Some(SecretSource::File(PathBuf::from(f))),
        _ => {
            problems.push(format!("{path}: give exactly one of env or file"));
            None
        }
    }
}

fn validate_alerts(raw: RawAlerts, problems: &mut Vec<String>) -> Option<AlertsConfig> {
    let n = problems.len();
    let evaluate_every = duration(problems, "alerts.evaluate_every", &raw.evaluate_every);
    let throttle = duration(problems, "alerts.throttle", &raw.throttle);
    let timeout = duration(problems, "alerts.timeout", &raw.timeout);
    let format = match raw.format.as_str() {
        "generic" => AlertFormat::Generic,
        "slack" => AlertFormat::Slack,
        other => {
            problems.push(format!(
                "alerts.format: `{other}` is not one of generic, slack"
            ));
            AlertFormat::Generic
        }
    };
    let url = raw.webhook_url.trim().to_owned();
    if !url.is_empty()
        && reqwest::Url::parse(&url)
            .map(|u| !u.scheme().starts_with("http"))
            .unwrap_or(true)
    {
        problems.push(format!("alerts.webhook_url: `{url}` is not an http(s) URL"));
    }
    let mut secret_headers = Vec::new();
    for (k, v) in &raw.secret_headers {
        if axum::http::HeaderName::from_bytes(k.as_bytes()).is_err() {
            problems.push(format!(
                "alerts.secret_headers.{k}: not a valid header name"
            ));
        }
        if let Some(src) = secret_source(problems, &format!("alerts.secret_headers.{k}"), v) {
            secret_headers.push((k.clone(), src));
        }
    }
    let mut raw_rules = Vec::new();
    if raw.include_defaults {
        raw_rules.extend(
            default_alert_rules()
                .into_iter()
                .map(|r| (format!("alerts (built-in rule {})", r.name), r)),
        );
    }
    raw_rules.extend(
        raw.rules
            .into_iter()
            .enumerate()
            .map(|(i, r)| (format!("alerts.rules[{i}]"), r)),
    );
    let mut rules: Vec<AlertRule> = Vec::new();
    for (path, r) in raw_rules {
        if r.name.trim().is_empty() {
            problems.push(format!("{path}.name: required"));
        }
        if let Some(prev) = rules.iter().position(|x| x.name == r.name) {
            // A rule of yours with a default's name replaces the default.
            rules.remove(prev);
        }
        let window = |problems: &mut Vec<String>, default: &str| {
            duration(
                problems,
                &format!("{path}.window"),
                r.window.as_deref().unwrap_or(default),
            )
        };
        let kind = match r.kind.as_str() {
            "depth" => {
                if let Some(p) = &r.partition {
                    if let Err(e) = crate::model::Partition::parse(p) {
                        problems.push(format!("{path}.partition: {e}"));
                    }
                }
                AlertKind::Depth {
                    partition: r.partition.clone(),
                    over: r.over.unwrap_or(1000),
                    window: window(problems, "0s").unwrap_or_default(),
                }
            }
            "over_sla" => AlertKind::OverSla,
            "credential_incident" => AlertKind::CredentialIncident,
            "replay_success" => {
                let floor = r.floor.unwrap_or(0.9);
                if !(0.0..=1.0).contains(&floor) {
                    problems.push(format!("{path}.floor: {floor} is not from 0 to 1"));
                }
                AlertKind::ReplaySuccess {
                    floor,
                    window: window(problems, "1h").unwrap_or_default(),
                    min_sends: r.min_sends.unwrap_or(10),
                }
            }
            "retry_storm" => AlertKind::RetryStorm {
                over: r.over.unwrap_or(1000),
                window: window(problems, "5m").unwrap_or_default(),
            },
            other => {
                problems.push(format!(
                    "{path}.kind: `{other}` is not one of depth, over_sla, credential_incident, replay_success, retry_storm"
                ));
                continue;
            }
        };
        let rule_throttle = match &r.throttle {
            Some(t) => duration(problems, &format!("{path}.throttle"), t),
            None => throttle,
        };
        rules.push(AlertRule {
            name: r.name,
            kind,
            throttle: rule_throttle.unwrap_or_default(),
        });
    }
    if problems.len() > n {
        return None;
    }
    Some(AlertsConfig {
        webhook: (!url.is_empty()).then(|| AlertWebhook {
            url,
            format,
            timeout: timeout.unwrap_or_default(),
            secret_headers,
        }),
        evaluate_every: evaluate_every?,
        rules,
    })
}

fn validate_n8n(raw: RawN8n, problems: &mut Vec<String>) -> Option<N8nConfig> {
    let n = problems.len();
    let base_url = raw.base_url.trim().trim_end_matches('/').to_owned();
    if reqwest::Url::parse(&base_url)
        .map(|u| !u.scheme().starts_with("http"))
        .unwrap_or(true)
    {
        problems.push(format!("n8n.base_url: `{base_url}` is not an http(s) URL"));
    }
    let api_key = raw
        .api_key
        .as_ref()
        .and_then(|k| secret_source(problems, "n8n.api_key", k));
    let timeout = duration(problems, "n8n.timeout", &raw.timeout);
    let tick = duration(problems, "n8n.tick", &raw.tick);
    let give_up_after = duration(problems, "n8n.give_up_after", &raw.give_up_after);
    let reconcile_every = duration(problems, "n8n.reconcile_every", &raw.reconcile_every);
    let concurrency = in_range(
        &mut |p| problems.push(p),
        "n8n.concurrency",
        raw.concurrency,
        1,
        16,
    );
    if problems.len() > n {
        return None;
    }
    Some(N8nConfig {
        base_url,
        api_key,
        timeout: timeout?,
        enrich: raw.enrich,
        concurrency: concurrency as usize,
        tick: tick?,
        give_up_after: give_up_after?,
        reconcile: raw.reconcile,
        reconcile_every: reconcile_every?,
        replay_to_webhook: raw.replay_to_webhook,
        replay_with_retry: raw.replay_with_retry,
        retry_load_workflow: raw.retry_load_workflow,
    })
}

/// The built-in rules (`alerts.include_defaults`).
fn default_alert_rules() -> Vec<RawAlertRule> {
    let rule = |name: &str, kind: &str| RawAlertRule {
        name: name.into(),
        kind: kind.into(),
        ..RawAlertRule::default()
    };
    vec![
        rule("credential-incident", "credential_incident"),
        rule("over-sla", "over_sla"),
        RawAlertRule {
            over: Some(1000),
            window: Some("10m".into()),
            ..rule("backlog", "depth")
        },
        rule("replay-success", "replay_success"),
        rule("retry-storm", "retry_storm"),
    ]
}

fn validate_auth(raw: RawAuth, problems: &mut Vec<String>) -> Option<AuthConfig> {
    let mut tokens: Vec<TokenConfig> = Vec::new();
    for (i, t) in raw.tokens.into_iter().enumerate() {
        let path = format!("auth.tokens[{i}]");
        if t.name.trim().is_empty() || tokens.iter().any(|o| o.name == t.name) {
            problems.push(format!(
                "{path}.name: `{}` is missing, empty or used twice",
                t.name
            ));
        }
        let role = match t.role.parse::<crate::model::Role>() {
            Ok(r) => r,
            Err(m) => {
                problems.push(format!("{path}.role: {m}"));
                continue;
            }
        };
        let secret = match (t.env, t.file, t.sha256) {
            (Some(e), None, None) => TokenSecret::Env(e),
            (None, Some(f), None) => TokenSecret::File(PathBuf::from(f)),
            (None, None, Some(h)) => match hex::decode(h.trim()) {
                Ok(b) if b.len() == 32 => {
                    let mut d = [0u8; 32];
                    d.copy_from_slice(&b);
                    TokenSecret::Sha256(d)
                }
                _ => {
                    problems.push(format!("{path}.sha256: not 64 hex digits"));
                    continue;
                }
            },
            _ => {
                problems.push(format!("{path}: give exactly one of env, file or sha256"));
                continue;
            }
        };
        tokens.push(TokenConfig {
            name: t.name,
            role,
            secret,
        });
    }
    Some(AuthConfig { tokens })
}

fn settings(
    raw: &RawDelivery,
    base: &TargetSettings,
    path: &str,
    problems: &mut Vec<String>,
) -> TargetSettings {
    let mut s = base.clone();
    if let Some(m) = raw.method.clone() {
        let up = m.to_ascii_uppercase();
        if ["POST", "PUT", "PATCH"].contains(&up.as_str()) {
            s.method = up;
        } else {
            problems.push(format!("{path}.method: `{m}` must be POST, PUT or PATCH"));
        }
    }
    if let Some(t) = &raw.timeout {
        if let Some(d) = duration(problems, &format!("{path}.timeout"), t) {
            s.timeout = d;
        }
    }
    if let Some(b) = &raw.body {
        match BodyMode::parse(b) {
            Ok(m) => s.body = m,
            Err(e) => problems.push(format!("{path}.body: {e}")),
        }
    }
    for (k, v) in &raw.headers {
        if axum::http::HeaderName::from_bytes(k.as_bytes()).is_err()
            || axum::http::HeaderValue::from_str(v).is_err()
        {
            problems.push(format!("{path}.headers.{k}: not a valid header"));
        }
        s.headers.push((k.clone(), v.clone()));
    }
    for (k, v) in &raw.secret_headers {
        if let Some(src) = secret_source(problems, &format!("{path}.secret_headers.{k}"), v) {
            s.secret_headers.push((k.clone(), src));
        }
    }
    if let Some(r) = raw.rate_initial {
        s.rate_initial = r;
    }
    if let Some(r) = raw.rate_max {
        s.rate_max = r;
    }
    if !(s.rate_initial > 0.0 && s.rate_initial <= s.rate_max && s.rate_max <= 10_000.0) {
        problems.push(format!(
            "{path}: rate_initial ({}) must be > 0 and <= rate_max ({}) <= 10000",
            s.rate_initial, s.rate_max
        ));
    }
    if let Some(r) = &raw.rate_ramp_every {
        if let Some(d) = duration(problems, &format!("{path}.rate_ramp_every"), r) {
            s.rate_ramp_every = d;
        }
    }
    if let Some(b) = raw.breaker_failures {
        s.breaker_failures = in_range(
            &mut |p| problems.push(p),
            &format!("{path}.breaker_failures"),
            b,
            1,
            1000,
        ) as u32;
    }
    if let Some(c) = &raw.breaker_cooldown {
        if let Some(d) = duration(problems, &format!("{path}.breaker_cooldown"), c) {
            s.breaker_cooldown = d;
        }
    }
    s
}

fn validate_delivery(
    raw: RawDelivery,
    targets: Vec<RawDelivery>,
    problems: &mut Vec<String>,
) -> (Option<DeliveryConfig>, Vec<TargetConfig>) {
    let builtin = TargetSettings {
        method: "POST".into(),
        timeout: Duration::from_secs(10),
        body: BodyMode::Auto,
        headers: Vec::new(),
        secret_headers: Vec::new(),
        rate_initial: 1.0,
        rate_max: 20.0,
        rate_ramp_every: Duration::from_secs(300),
        breaker_failures: 5,
        breaker_cooldown: Duration::from_secs(30),
    };
    let defaults = settings(&raw, &builtin, "delivery", problems);
    for (key, given) in [
        ("name", raw.name.is_some()),
        ("url", raw.url.is_some()),
        ("partitions", !raw.partitions.is_empty()),
        ("workflows", !raw.workflows.is_empty()),
    ] {
        if given {
            problems.push(format!("delivery.{key}: belongs in a [[targets]] entry"));
        }
    }
    let tick = duration(
        problems,
        "delivery.tick",
        raw.tick.as_deref().unwrap_or("1s"),
    );
    let lease = duration(
        problems,
        "delivery.lease",
        raw.lease.as_deref().unwrap_or("2m"),
    );
    let concurrency = in_range(
        &mut |p| problems.push(p),
        "delivery.concurrency_per_target",
        raw.concurrency_per_target.unwrap_or(2),
        1,
        64,
    );
    let mut out: Vec<TargetConfig> = Vec::new();
    for (i, t) in targets.into_iter().enumerate() {
        let path = format!("targets[{i}]");
        for (key, given) in [
            ("enabled", t.enabled.is_some()),
            ("tick", t.tick.is_some()),
            ("lease", t.lease.is_some()),
            ("concurrency_per_target", t.concurrency_per_target.is_some()),
            (
                "use_payload_webhook_url",
                t.use_payload_webhook_url.is_some(),
            ),
        ] {
            if given {
                problems.push(format!("{path}.{key}: belongs in [delivery]"));
            }
        }
        let name = t.name.clone().unwrap_or_default();
        let url = t.url.clone().unwrap_or_default();
        if name.trim().is_empty() || out.iter().any(|o| o.name == name) {
            problems.push(format!(
                "{path}.name: `{name}` is missing, empty or used twice"
            ));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            problems.push(format!(
                "{path}.url: `{url}` is not an http:// or https:// URL"
            ));
        }
        out.push(TargetConfig {
            settings: settings(&t, &defaults, &path, problems),
            name,
            url,
            partitions: t.partitions,
            workflows: t.workflows,
        });
    }
    let delivery = match (tick, lease) {
        (Some(tick), Some(lease)) => Some(DeliveryConfig {
            enabled: raw.enabled.unwrap_or(true),
            tick,
            lease,
            concurrency_per_target: concurrency as usize,
            use_payload_webhook_url: raw.use_payload_webhook_url.unwrap_or(false),
            defaults,
        }),
        _ => None,
    };
    (delivery, out)
}

fn duration(problems: &mut Vec<String>, path: &str, text: &str) -> Option<Duration> {
    humantime::parse_duration(text.trim())
        .map_err(|e| {
            problems.push(format!(
                "{path}: `{text}` is not a duration like 30m, 4h or 2d ({e})"
            ))
        })
        .ok()
}

fn validate_triage(
    raw: RawTriage,
    policies: std::collections::BTreeMap<String, RawPolicy>,
    problems: &mut Vec<String>,
) -> Option<TriageConfig> {
    let window = duration(problems, "triage.poison_window", &raw.poison_window);
    let threshold = in_range(
        &mut |p| problems.push(p),
        "triage.poison_threshold",
        raw.poison_threshold,
        1,
        1_000_000,
    );
    let mut table: Vec<(FailureClass, Policy)> = FailureClass::ALL
        .iter()
        .map(|c| (*c, default_policy(*c)))
        .collect();
    for (name, over) in policies {
        let path = format!("policy.{name}");
        let Ok(class) = name.parse::<FailureClass>() else {
            problems.push(format!(
                "{path}: unknown failure class; expected one of: {}",
                FailureClass::ALL
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        };
        let Some((_, p)) = table.iter_mut().find(|(c, _)| *c == class) else {
            continue;
        };
        if let Some(i) = over.initial {
            match i.parse::<Status>() {
                Ok(Status::RetryScheduled) if class == FailureClass::Auth => problems.push(format!(
                    "{path}.initial: auth failures are never retried automatically (a retry with a bad credential only locks the account)"
                )),
                Ok(s @ (Status::New | Status::Review | Status::RetryScheduled)) => p.initial = s,
                _ => problems.push(format!(
                    "{path}.initial: `{i}` must be new, review or retry_scheduled"
                )),
            }
        }
        if let Some(m) = over.max_attempts {
            p.max_attempts = in_range(
                &mut |e| problems.push(e),
                &format!("{path}.max_attempts"),
                m,
                0,
                1000,
            ) as u32;
        }
        if let Some(o) = over.owner {
            p.owner = Some(o).filter(|o| !o.trim().is_empty());
        }
        if let Some(sla) = over.sla {
            if let Some(d) = duration(problems, &format!("{path}.sla"), &sla) {
                p.sla = d;
            }
        }
        if let Some(c) = over.credential_incident {
            p.credential_incident = c;
        }
        if let Some(b) = over.retry_base {
            if let Some(d) = duration(problems, &format!("{path}.retry_base"), &b) {
                p.backoff.base = d;
            }
        }
        if let Some(f) = over.retry_factor {
            if !(1.0..=10.0).contains(&f) {
                problems.push(format!(
                    "{path}.retry_factor: {f} is out of range (1 to 10)"
                ));
            }
            p.backoff.factor = f.clamp(1.0, 10.0);
        }
        if let Some(c) = over.retry_cap {
            if let Some(d) = duration(problems, &format!("{path}.retry_cap"), &c) {
                p.backoff.cap = d;
            }
        }
    }
    Some(TriageConfig {
        policies: table,
        poison_threshold: threshold as u32,
        poison_window: window?,
    })
}

fn in_range(bad: &mut impl FnMut(String), path: &str, v: u64, lo: u64, hi: u64) -> u64 {
    if v < lo || v > hi {
        bad(format!("{path}: {v} is out of range ({lo} to {hi})"));
    }
    v.clamp(lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_means_the_documented_defaults() {
        let c = Config::default_config().unwrap();
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:7680");
        assert_eq!(c.server.body_limit_bytes, 16 * 1024 * 1024);
        assert_eq!(c.storage.compress_above_bytes, 1024);
        assert_eq!(c.ingest.default_partition.as_str(), "default");
        assert!(c.storage.data_dir.ends_with("deadletter"));
    }

    #[test]
    fn the_embedded_example_parses_to_the_same_defaults() {
        let ex = Config::parse(EXAMPLE, "example").unwrap();
        let def = Config::default_config().unwrap();
        assert_eq!(format!("{ex:?}"), format!("{def:?}"));
    }

    #[test]
    fn policies_default_per_class_and_can_be_overridden() {
        let c = Config::default_config().unwrap();
        assert_eq!(
            c.triage.policy(FailureClass::Transient).initial,
            Status::RetryScheduled
        );
        assert_eq!(
            c.triage.policy(FailureClass::Validation).initial,
            Status::Review
        );
        assert!(c.triage.policy(FailureClass::Auth).credential_incident);
        assert_eq!(c.triage.poison_threshold, 3);
        let c = Config::parse(
            "[policy.validation]\nowner = \"ops\"\nsla = \"2h\"\n[policy.unknown]\ninitial = \"review\"\n",
            "t",
        )
        .unwrap();
        let v = c.triage.policy(FailureClass::Validation);
        assert_eq!(
            (v.owner.as_deref(), v.sla),
            (Some("ops"), Duration::from_secs(7200))
        );
        assert_eq!(
            c.triage.policy(FailureClass::Unknown).initial,
            Status::Review
        );
        let err = Config::parse(
            "[policy.sad]\nsla = \"1h\"\n[policy.auth]\ninitial = \"resolved\"\nsla = \"soon\"\n[triage]\npoison_window = \"x\"\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        for key in [
            "policy.sad",
            "policy.auth.initial",
            "policy.auth.sla",
            "triage.poison_window",
        ] {
            assert!(err.contains(key), "{key} in {err}");
        }
    }

    #[test]
    fn targets_inherit_delivery_defaults_and_keep_secrets_out_of_debug() {
        let c = Config::parse(
            "[delivery]\nrate_initial = 2.0\ntimeout = \"3s\"\n\n[[targets]]\nname = \"orders\"\nurl = \"http://127.0.0.1:5678/webhook/orders\"\npartitions = [\"orders\"]\nbody = \"wrapped\"\nsecret_headers = { Authorization = { env = \"ORDERS_TOKEN\" } }\n",
            "t",
        )
        .unwrap();
        let t = &c.targets[0];
        assert_eq!(
            (t.settings.rate_initial, t.settings.timeout),
            (2.0, Duration::from_secs(3))
        );
        assert_eq!(t.settings.body, BodyMode::Wrapped);
        assert_eq!(
            format!("{:?}", t.settings.secret_headers),
            "[(\"Authorization\", env:ORDERS_TOKEN)]"
        );
        let err = Config::parse(
            "[[targets]]\nname = \"x\"\nurl = \"ftp://x\"\nbody = \"raw\"\nrate_initial = 0.0\n[targets.secret_headers.A]\nenv = \"E\"\nfile = \"/f\"\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        for key in [
            "targets[0].url",
            "targets[0].body",
            "targets[0]: rate_initial",
            "targets[0].secret_headers.A",
        ] {
            assert!(err.contains(key), "{key} in {err}");
        }
    }

    #[test]
    fn every_unknown_key_is_named_by_its_path() {
        let err = Config::parse(
            "[server]\nlisten='127.0.0.1:1'\nlistn='x'\n[storage]\nfoo=1\n[nope]\n",
            "t.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("server.listn: unknown key"), "{err}");
        assert!(err.contains("storage.foo: unknown key"), "{err}");
        assert!(err.contains("nope: unknown key"), "{err}");
    }

    #[test]
    fn wrong_types_and_values_are_named_by_path() {
        let err = Config::parse("[server]\nbody_limit_bytes='big'\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.body_limit_bytes"), "{err}");
        let err = Config::parse(
            "[server]\nlisten='nowhere'\n[[classify.rules]]\nname='x'\nclass='sad'\nerror_text='('\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("server.listen"), "{err}");
        assert!(err.contains("classify.rules[0].class"), "{err}");
        assert!(err.contains("classify.rules[0].error_text"), "{err}");
        let err = Config::parse("[[classify.rules]]\nname='x'\nclass='auth'\nbogus=1\n", "t")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("classify.rules") && err.contains("bogus: unknown key"),
            "{err}"
        );
    }

    #[test]
    fn alert_rules_default_override_and_name_their_mistakes() {
        let c = Config::default_config().unwrap();
        assert!(c.alerts.webhook.is_none(), "off until a webhook is set");
        let names: Vec<&str> = c.alerts.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "credential-incident",
                "over-sla",
                "backlog",
                "replay-success",
                "retry-storm"
            ]
        );
        let c = Config::parse(
            "[alerts]\nwebhook_url = 'http://127.0.0.1:5678/webhook/x'\nformat = 'slack'\n\
             [[alerts.rules]]\nname = 'backlog'\nkind = 'depth'\npartition = 'orders'\nover = 5\nthrottle = '10m'\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.alerts.webhook.as_ref().unwrap().format,
            AlertFormat::Slack
        );
        let backlog: Vec<&AlertRule> = c
            .alerts
            .rules
            .iter()
            .filter(|r| r.name == "backlog")
            .collect();
        assert_eq!(
            backlog.len(),
            1,
            "yours replaces the default of the same name"
        );
        assert_eq!(
            (backlog[0].kind.clone(), backlog[0].throttle),
            (
                AlertKind::Depth {
                    partition: Some("orders".into()),
                    over: 5,
                    window: Duration::ZERO
                },
                Duration::from_secs(600)
            )
        );
        let err = Config::parse(
            "[alerts]\nwebhook_url = 'ftp://x'\nformat = 'teams'\n\
             [[alerts.rules]]\nname = 'a'\nkind = 'vibes'\n\
             [[alerts.rules]]\nname = 'b'\nkind = 'replay_success'\nfloor = 2.0\nwindow = 'soon'\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        for want in [
            "alerts.webhook_url",
            "alerts.format: `teams`",
            "alerts.rules[0].kind: `vibes`",
            "alerts.rules[1].floor",
            "alerts.rules[1].window",
        ] {
            assert!(err.contains(want), "{want} not in: {err}");
        }
    }

    #[test]
    fn retention_caps_partitions_and_log_age() {
        let c = Config::default_config().unwrap();
        assert_eq!(c.retention.max_bytes, Some(500_000_000));
        assert_eq!(c.retention.max_total_bytes, Some(4_000_000_000));
        assert_eq!(
            c.logging.max_age, c.retention.max_age,
            "logs follow records by default"
        );
        let c = Config::parse(
            "[retention]\nmax_age = '30d'\nmax_total_bytes = 'none'\n\
             [retention.partitions.billing]\nmax_bytes = '2GiB'\n\
             [retention.partitions.'ops.eu']\nmax_age = '3d'\nmax_bytes = 'none'\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.logging.max_age, Duration::from_secs(30 * 86_400));
        assert_eq!(c.retention.max_total_bytes, None);
        let billing = &c.retention.partitions["billing"];
        assert_eq!(
            (billing.max_age, billing.max_bytes),
            (Duration::from_secs(30 * 86_400), Some(2 << 30)),
            "what a partition leaves out is the global value"
        );
        let ops = &c.retention.partitions["ops.eu"];
        assert_eq!(
            (ops.max_age, ops.max_bytes),
            (Duration::from_secs(3 * 86_400), None)
        );
        let err = Config::parse(
            "[retention]\nmax_bytes = 'lots'\nmax_total_bytes = '0'\n\
             [retention.partitions.'a b']\nmax_age = '1d'\n\
             [retention.partitions.x]\nmax_age = 'soon'\nmax_bytez = 1\n\
             [logging]\nmax_age = 'forever'\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        for path in [
            "retention.max_bytes: `lots` is not a size",
            "retention.max_total_bytes: a cap of 0 bytes",
            "retention.partitions.a b:",
            "retention.partitions.x.max_age",
            "retention.partitions.x.max_bytez: unknown key",
            "logging.max_age",
        ] {
            assert!(err.contains(path), "{path} not in: {err}");
        }
    }
}
#[cfg(test)]
mod flatten_check {
    #[test]
    fn unknown_keys_beside_flattened_settings_are_named() {
        let err = super::Config::parse(
            "[delivery]\nbogus = 1\n[[targets]]\nname='a'\nurl='http://x'\ntypo=2\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("delivery.bogus") && err.contains("typo"),
            "{err}"
        );
    }
}
