//! The `deadletter` binary: parse the command line, dispatch, turn errors into exit codes.

use clap::Parser;

use deadletter::cli::{Cli, Command};
use deadletter::commands::{self, ExitCode};
use deadletter::config::ConfigError;
use deadletter::store::StoreError;

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        deadletter::logging::init_cli();
    }
    if let Err(e) = run(cli) {
        eprintln!("deadletter: {e:#}");
        std::process::exit(exit_code(&e));
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Config(cmd) = cli.command {
        return commands::config::run(cmd);
    }
    let config = commands::load_config(&cli)?;
    let (server, actor, token_file) = (
        cli.server.clone(),
        cli.actor.clone(),
        cli.token_file.clone(),
    );
    let client = || {
        commands::client::Client::new(
            server.as_deref(),
            actor.as_deref(),
            token_file.as_deref(),
            &config,
        )
    };
    match cli.command {
        Command::Serve(args) => commands::serve::run(config, args),
        Command::List(args) => commands::list::run(&config, args),
        Command::Show(args) => commands::show::run(&config, args),
        Command::Resolve(args) => commands::resolve::run(&client()?, args),
        Command::Skip(args) => commands::skip::run(&client()?, args),
        Command::Reopen(args) => commands::reopen::run(&client()?, args),
        Command::Assign(args) => commands::assign::run(&client()?, args),
        Command::Note(args) => commands::note::run(&client()?, args),
        Command::Edit(args) => commands::edit::run(&client()?, args),
        Command::Groups(args) => commands::groups::run(&client()?, args),
        Command::Replay(args) => commands::replay::run(&client()?, args),
        Command::Job(args) => commands::replay::job(&client()?, args),
        Command::Erase(args) => commands::erase::run(&client()?, args),
        Command::Backup { path } => commands::backup::backup(&config, &path),
        Command::Check => commands::backup::check(&config),
        Command::Export { out } => commands::export::export(&config, out.as_deref()),
        Command::Import { path } => commands::export::import(&config, &path),
        Command::Service(args) => commands::service::service(args),
        Command::Stats { json } => commands::stats::run(&config, json),
        Command::Retention { json } => commands::retention::run(&config, json),
        Command::Config(_) => unreachable!("handled above"),
    }
}

fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.downcast_ref::<ConfigError>().is_some() {
            return ExitCode::ConfigInvalid as i32;
        }
        if let Some(StoreError::NotFound(_)) = cause.downcast_ref::<StoreError>() {
            return ExitCode::NotFound as i32;
        }
    }
    1
}
