//! Running deadletter as a service: a launchd LaunchAgent / LaunchDaemon on macOS, a systemd
//! user or system unit on Linux. This module only plans — the file to write (a template from
//! `launchd/` or `packaging/systemd/` with the real paths filled in) and the exact commands —
//! so `--dry-run` prints precisely what `deadletter service install` would do, and tests check
//! it on any OS. `commands::service` carries the plan out.

use std::path::{Path, PathBuf};

const AGENT: &str = include_str!("../launchd/deadletter.agent.plist");
const DAEMON: &str = include_str!("../launchd/deadletter.daemon.plist");
const SYSTEMD_SYSTEM: &str = include_str!("../packaging/systemd/deadletter.service");
const SYSTEMD_USER: &str = include_str!("../packaging/systemd/deadletter-user.service");

/// The default launchd label (and, on Linux, the unit is `deadletter.service`).
pub const DEFAULT_LABEL: &str = "com.deadletter.server";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Launchd,
    Systemd,
}

impl Platform {
    pub fn native() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::Launchd
        } else {
            Platform::Systemd
        }
    }
}

/// Who and where: everything a plan needs to know about this machine.
#[derive(Debug, Clone)]
pub struct Setup {
    pub platform: Platform,
    /// A system service (LaunchDaemon / system unit) rather than a per-user one.
    pub system: bool,
    /// launchd label; on Linux, the unit's name is `deadletter` unless a label is given.
    pub label: String,
    pub binary: PathBuf,
    pub home: PathBuf,
    pub uid: u32,
    /// LaunchDaemon only: run as this user instead of root.
    pub user_name: Option<String>,
}

/// What to do, in order: make directories, write the config if missing, write files, run
/// commands, remove files, run the commands after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Directories to create (private to the owner) before anything else.
    pub dirs: Vec<PathBuf>,
    /// Written only when missing: the default config.
    pub config: Option<PathBuf>,
    pub write: Vec<(PathBuf, String)>,
    pub run: Vec<Vec<String>>,
    pub remove: Vec<PathBuf>,
    pub after: Vec<Vec<String>>,
}

/// Where a service keeps its things.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub unit: PathBuf,
    pub config: PathBuf,
    pub data_dir: PathBuf,
    pub log_dir: PathBuf,
}

impl Setup {
    fn unit_name(&self) -> String {
        if self.label == DEFAULT_LABEL {
            "deadletter".into()
        } else {
            self.label.clone()
        }
    }

    pub fn paths(&self) -> Paths {
        let support = |base: &Path| base.join("Library/Application Support/deadletter");
        match (self.platform, self.system) {
            (Platform::Launchd, false) => Paths {
                unit: self
                    .home
                    .join("Library/LaunchAgents")
                    .join(format!("{}.plist", self.label)),
                config: support(&self.home).join("deadletter.toml"),
                data_dir: support(&self.home),
                log_dir: self.home.join("Library/Logs/deadletter"),
            },
            (Platform::Launchd, true) => Paths {
                unit: PathBuf::from("/Library/LaunchDaemons").join(format!("{}.plist", self.label)),
                config: support(Path::new("/")).join("deadletter.toml"),
                data_dir: support(Path::new("/")),
                log_dir: PathBuf::from("/Library/Logs/deadletter"),
            },
            (Platform::Systemd, false) => Paths {
                unit: self
                    .home
                    .join(".config/systemd/user")
                    .join(format!("{}.service", self.unit_name())),
                config: self.home.join(".config/deadletter/deadletter.toml"),
                data_dir: self.home.join(".local/share/deadletter"),
                log_dir: self.home.join(".local/share/deadletter/logs"),
            },
            (Platform::Systemd, true) => Paths {
                unit: PathBuf::from("/etc/systemd/system")
                    .join(format!("{}.service", self.unit_name())),
                config: PathBuf::from("/etc")
                    .join(self.unit_name())
                    .join("deadletter.toml"),
                data_dir: PathBuf::from("/var/lib").join(self.unit_name()),
                log_dir: PathBuf::from("/var/lib")
                    .join(self.unit_name())
                    .join("logs"),
            },
        }
    }

    /// launchd's domain target: `gui/<uid>` for an agent, `system` for a daemon.
    fn domain(&self) -> String {
        if self.system {
            "system".into()
        } else {
            format!("gui/{}", self.uid)
        }
    }

    fn systemctl(&self, args: &[&str]) -> Vec<String> {
        let mut v = vec!["systemctl".to_string()];
        if !self.system {
            v.push("--user".into());
        }
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }

    /// The unit file's text, paths filled in.
    pub fn unit_text(&self) -> String {
        let p = self.paths();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        match self.platform {
            Platform::Launchd => {
                let template = if self.system { DAEMON } else { AGENT };
                let user = match (&self.user_name, self.system) {
                    (Some(u), true) => {
                        format!("\n  <key>UserName</key>\n  <string>{}</string>", xml(u))
                    }
                    _ => String::new(),
                };
                template
                    .replace("{{LABEL}}", &xml(&self.label))
                    .replace("{{BINARY}}", &xml(&s(&self.binary)))
                    .replace("{{CONFIG}}", &xml(&s(&p.config)))
                    .replace("{{DATA_DIR}}", &xml(&s(&p.data_dir)))
                    .replace("{{LOG_DIR}}", &xml(&s(&p.log_dir)))
                    .replace("{{USER_NAME}}", &user)
            }
            Platform::Systemd => {
                let template = if self.system {
                    SYSTEMD_SYSTEM
                } else {
                    SYSTEMD_USER
                };
                template
                    .replace("{{BINARY}}", &unit_quoted(&s(&self.binary)))
                    .replace("{{CONFIG}}", &unit_quoted(&s(&p.config)))
                    .replace("{{DATA_DIR}}", &unit_quoted(&s(&p.data_dir)))
                    .replace("{{NAME}}", &self.unit_name())
            }
        }
    }

    pub fn install(&self) -> Plan {
        let p = self.paths();
        let unit = p.unit.to_string_lossy().into_owned();
        let mut dirs = vec![
            p.unit.parent().map(Path::to_path_buf).unwrap_or_default(),
            p.config.parent().map(Path::to_path_buf).unwrap_or_default(),
        ];
        let run = match self.platform {
            Platform::Launchd => {
                dirs.push(p.data_dir.clone());
                dirs.push(p.log_dir.clone());
                let target = format!("{}/{}", self.domain(), self.label);
                vec![
                    // Loading twice is an error: take an older copy out first (ignored if absent).
                    vec!["launchctl".into(), "bootout".into(), target.clone()],
                    vec![
                        "launchctl".into(),
                        "bootstrap".into(),
                        self.domain(),
                        unit.clone(),
                    ],
                    vec!["launchctl".into(), "enable".into(), target.clone()],
                    vec!["launchctl".into(), "kickstart".into(), "-k".into(), target],
                ]
            }
            Platform::Systemd => {
                if !self.system {
                    dirs.push(p.data_dir.clone());
                }
                let name = format!("{}.service", self.unit_name());
                vec![
                    self.systemctl(&["daemon-reload"]),
                    self.systemctl(&["enable", "--now", &name]),
                    // A reinstall picks up a new binary or unit.
                    self.systemctl(&["restart", &name]),
                ]
            }
        };
        dirs.dedup();
        Plan {
            dirs,
            config: Some(p.config.clone()),
            write: vec![(p.unit.clone(), self.unit_text())],
            run,
            remove: Vec::new(),
            after: Vec::new(),
        }
    }

    pub fn uninstall(&self) -> Plan {
        let p = self.paths();
        let run = match self.platform {
            Platform::Launchd => vec![vec![
                "launchctl".into(),
                "bootout".into(),
                format!("{}/{}", self.domain(), self.label),
            ]],
            Platform::Systemd => {
                vec![self.systemctl(&[
                    "disable",
                    "--now",
                    &format!("{}.service", self.unit_name()),
                ])]
            }
        };
        let after = match self.platform {
            // Forget the removed unit.
            Platform::Systemd => vec![self.systemctl(&["daemon-reload"])],
            Platform::Launchd => Vec::new(),
        };
        Plan {
            run,
            remove: vec![p.unit.clone()],
            after,
            ..Plan::default()
        }
    }

    pub fn status(&self) -> Plan {
        let run = match self.platform {
            Platform::Launchd => vec![vec![
                "launchctl".into(),
                "print".into(),
                format!("{}/{}", self.domain(), self.label),
            ]],
            Platform::Systemd => vec![self.systemctl(&[
                "status",
                "--no-pager",
                &format!("{}.service", self.unit_name()),
            ])],
        };
        Plan {
            run,
            ..Plan::default()
        }
    }
}

/// A value inside a plist `<string>`.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A value inside a double-quoted systemd unit argument: `%` is a specifier, `\` and `"` escape.
fn unit_quoted(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('%', "%%")
}

/// A command as a shell would show it.
pub fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.:=@%+".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(platform: Platform, system: bool) -> Setup {
        Setup {
            platform,
            system,
            label: DEFAULT_LABEL.into(),
            binary: PathBuf::from("/opt/deadletter & co/bin/deadletter"),
            home: PathBuf::from("/Users/ana"),
            uid: 501,
            user_name: None,
        }
    }

    #[test]
    fn an_agent_install_bootstraps_enables_and_kickstarts_in_the_users_domain() {
        let plan = setup(Platform::Launchd, false).install();
        let lines: Vec<String> = plan.run.iter().map(|c| shell_line(c)).collect();
        assert_eq!(
            lines,
            [
                "launchctl bootout gui/501/com.deadletter.server",
                "launchctl bootstrap gui/501 /Users/ana/Library/LaunchAgents/com.deadletter.server.plist",
                "launchctl enable gui/501/com.deadletter.server",
                "launchctl kickstart -k gui/501/com.deadletter.server",
            ]
        );
        let text = &plan.write[0].1;
        assert!(text.contains("<string>/opt/deadletter &amp; co/bin/deadletter</string>"));
        assert!(!text.contains("{{"), "{text}");
    }

    #[test]
    fn a_system_unit_is_hardened_and_enabled_with_systemctl() {
        let s = setup(Platform::Systemd, true);
        let plan = s.install();
        assert_eq!(
            plan.write[0].0,
            PathBuf::from("/etc/systemd/system/deadletter.service")
        );
        let text = &plan.write[0].1;
        for want in [
            "DynamicUser=yes",
            "StateDirectory=deadletter",
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            r#"ExecStart="/opt/deadletter & co/bin/deadletter" --config "/etc/deadletter/deadletter.toml" --data-dir /var/lib/deadletter serve"#,
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
        let lines: Vec<String> = plan.run.iter().map(|c| shell_line(c)).collect();
        assert_eq!(
            lines,
            [
                "systemctl daemon-reload",
                "systemctl enable --now deadletter.service",
                "systemctl restart deadletter.service"
            ]
        );
        let un = s.uninstall();
        let lines: Vec<String> = un
            .run
            .iter()
            .chain(&un.after)
            .map(|c| shell_line(c))
            .collect();
        assert_eq!(
            lines,
            [
                "systemctl disable --now deadletter.service",
                "systemctl daemon-reload"
            ]
        );
        assert_eq!(
            un.remove,
            [PathBuf::from("/etc/systemd/system/deadletter.service")]
        );
        let user = setup(Platform::Systemd, false).status();
        assert_eq!(
            shell_line(&user.run[0]),
            "systemctl --user status --no-pager deadletter.service"
        );
    }
}
