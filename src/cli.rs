//! The command line, as clap derive types. Raw arguments only: commands turn them into
//! validated values (filters, ids, config) before doing anything.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `deadletter --version`: the crate version and the git commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("DEADLETTER_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(name = "deadletter", version = VERSION, about = "The dead-letter queue for a self-hosted n8n", long_about = None)]
pub struct Cli {
    /// Config file (TOML). Without one, the embedded defaults apply.
    #[arg(long, global = true, env = "DEADLETTER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory holding deadletter.db (overrides storage.data_dir).
    #[arg(long, global = true, env = "DEADLETTER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// The running server, for the verbs that change records (default: http:// + server.listen).
    #[arg(long, global = true, env = "DEADLETTER_URL", value_name = "URL")]
    pub server: Option<String>,

    /// A file holding your API token, for the verbs that talk to the server (or set
    /// DEADLETTER_TOKEN). Never on the command line, where `ps` would show it.
    #[arg(
        long,
        global = true,
        env = "DEADLETTER_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<PathBuf>,

    /// Who you are, for the audit trail of the verbs that change records (default: $USER).
    #[arg(long, global = true, env = "DEADLETTER_ACTOR", value_name = "NAME")]
    pub actor: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing buys nothing
pub enum Command {
    /// Run the server: HTTP API on loopback, durable storage.
    Serve(ServeArgs),
    /// List dead letters, newest first (reads the database directly; no server needed).
    List(ListArgs),
    /// Show one dead letter with its payload, error and audit events.
    Show(ShowArgs),
    /// Mark records resolved (needs the server).
    Resolve(VerbArgs),
    /// Skip records, saying why (needs the server).
    Skip(VerbArgs),
    /// Give records an owner, or take it away with --unassign (needs the server).
    Assign(AssignArgs),
    /// Add a note to a record's audit trail (needs the server).
    Note(NoteArgs),
    /// Reopen closed records for review, saying why (needs the server).
    Reopen(VerbArgs),
    /// Edit a record's payload in $EDITOR; the original is kept (needs the server).
    Edit(EditArgs),
    /// List failure groups (fingerprints), most recent first (needs the server).
    Groups(GroupsArgs),
    /// Replay records to their targets: ids, or filters with --expect N (needs the server).
    Replay(ReplayArgs),
    /// Show or steer a replay job (needs the server).
    Job(JobArgs),
    /// Erase records now — payloads destroyed, tombstones kept (admin; needs the server).
    Erase(EraseArgs),
    /// A consistent copy of the database, safe while the server runs (no server needed).
    Backup {
        /// The new file to write.
        path: PathBuf,
    },
    /// Check the database's integrity; exit 1 if anything is wrong (no server needed).
    Check,
    /// Write everything (records, payload versions, events, attempts, tombstones) as JSON
    /// Lines, from one snapshot (no server needed; safe while it runs).
    Export {
        /// The file to write; standard output if absent or `-`.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Read an export back; run it again and nothing changes (stop the server first).
    Import {
        /// The export to read (`-`: standard input).
        path: PathBuf,
    },
    /// The queue at a glance: counts, what is new and old, top failures, time to resolution,
    /// the 48 h SLO, ingress per hour (no server needed).
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Bytes per partition against the caps, records about to expire, removals by reason
    /// (no server needed).
    Retention {
        #[arg(long)]
        json: bool,
    },
    /// Run deadletter as a service: a launchd agent (or daemon, --system) on macOS, a systemd
    /// user (or system) unit on Linux. --dry-run prints the file and the commands.
    Service(ServiceArgs),
    /// Write or validate the config file.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Args)]
pub struct ServiceArgs {
    pub action: ServiceAction,
    /// A system service (LaunchDaemon, or a systemd system unit) instead of a per-user one;
    /// needs root.
    #[arg(long)]
    pub system: bool,
    /// Print the unit file and the exact commands; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The launchd label (and the systemd unit's name).
    #[arg(long)]
    pub label: Option<String>,
    /// launchd or systemd (default: this OS's).
    #[arg(long)]
    pub platform: Option<String>,
    /// The binary the service runs (default: this one).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// LaunchDaemon only: run as this user instead of root.
    #[arg(long)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ServiceAction {
    Install,
    Uninstall,
    Status,
}

#[derive(Debug, Args)]
pub struct VerbArgs {
    /// Record ids.
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Why (required for skip and reopen).
    #[arg(long, alias = "note")]
    pub reason: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AssignArgs {
    #[arg(required = true)]
    pub ids: Vec<String>,
    #[arg(
        long,
        required_unless_present = "unassign",
        conflicts_with = "unassign"
    )]
    pub owner: Option<String>,
    #[arg(long)]
    pub unassign: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct NoteArgs {
    pub id: String,
    pub text: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct EditArgs {
    pub id: String,
    /// Save without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GroupsArgs {
    /// Only groups with open records.
    #[arg(long)]
    pub open: bool,
    /// Only poison groups.
    #[arg(long)]
    pub poison: bool,
    #[arg(long = "class")]
    pub failure_class: Option<String>,
    #[arg(long)]
    pub workflow: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (overrides server.listen); port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

/// The list filters, shared by `list` and `replay` (the API's `GET /v1/dead-letters` query).
#[derive(Debug, Args, Default)]
pub struct FilterArgs {
    /// new, retry_scheduled, retrying, review, ready_for_replay, replaying, replayed,
    /// replay_failed, resolved, skipped
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long)]
    pub partition: Option<String>,
    /// Workflow id or exact name.
    #[arg(long)]
    pub workflow: Option<String>,
    #[arg(long)]
    pub owner: Option<String>,
    /// transient, rate_limited, auth, validation, conflict, business, unknown
    #[arg(long = "class")]
    pub failure_class: Option<String>,
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// First seen at or after this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long)]
    pub since: Option<String>,
    /// First seen before this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long)]
    pub until: Option<String>,
    /// Substring of the error message.
    #[arg(long = "message", short = 'q')]
    pub message: Option<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Continue after this cursor (printed at the end of a full page).
    #[arg(long)]
    pub cursor: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Print JSON (the API's shape) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    pub id: String,
    /// Print JSON (the API's shape).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Write the commented example config (to PATH, or standard output).
    Init {
        path: Option<PathBuf>,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Validate a config file; names every bad key by its path.
    Check { path: PathBuf },
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Record ids (or use the filters with --expect).
    pub ids: Vec<String>,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// How many records the filters must match (refused otherwise).
    #[arg(long)]
    pub expect: Option<usize>,
    /// Show target, key, payload version and changes per record; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Send with new idempotency keys (the old ones go in X-Deadletter-Supersedes).
    #[arg(long)]
    pub new_keys: bool,
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Follow the job to its end with a progress bar.
    #[arg(long)]
    pub wait: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct JobArgs {
    #[arg(value_enum)]
    pub action: JobAction,
    pub id: i64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum JobAction {
    Show,
    Approve,
    Pause,
    Resume,
    Cancel,
}

#[derive(Debug, Args)]
pub struct EraseArgs {
    /// Record ids.
    #[arg(long = "id")]
    pub ids: Vec<i64>,
    #[arg(long)]
    pub idempotency_key: Option<String>,
    #[arg(long = "event-id")]
    pub external_event_id: Option<String>,
    #[arg(long = "tenant")]
    pub tenant_id: Option<String>,
    #[arg(long)]
    pub json: bool,
}
