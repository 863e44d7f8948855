//! `berth csi …`: a CSI client for any plugin socket, for debugging plugins.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use berth_csi::{
    CapacityRange, ContentSource, ControllerPublish, CreateVolume, CsiClient, Endpoint, NodeExpand,
    NodePublish, NodeStage, RetryPolicy, Rpc, Validation,
    model::{AccessMode, ExternalId, MountFlags, MountOptions, Secrets, VolumeCapability},
};
use clap::{Args, Subcommand};
use serde_json::json;

use crate::say;

use super::{UsageError, input, output};

/// Talk to a CSI plugin socket directly.
#[derive(Debug, Args)]
pub struct CsiArgs {
    /// The plugin's socket: unix:///path/csi.sock or /path/csi.sock.
    #[arg(long, short = 'e', global = true, env = "CSI_ENDPOINT")]
    endpoint: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Give up on a call after this long, retries included (e.g. 10s, 2m).
    #[arg(long, global = true, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    #[command(subcommand)]
    command: CsiCommand,
}

#[derive(Debug, Subcommand)]
enum CsiCommand {
    /// GetPluginInfo: name and version.
    Info,
    /// Probe: is the plugin ready?
    Probe,
    /// Plugin, controller and node capabilities.
    Capabilities,
    /// NodeGetInfo: node id, volume limit, topology.
    NodeInfo,
    /// Volumes: create, delete, list, validate, expand; capacity.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// ControllerPublishVolume / ControllerUnpublishVolume.
    #[command(subcommand)]
    Controller(ControllerCommand),
    /// Node stage / unstage / publish / unpublish / stats / expand.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Snapshots: create, delete, list.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

/// How the volume will be used: one capability.
#[derive(Args)]
struct CapabilityArgs {
    /// Access mode: single-node-writer, single-node-reader-only, multi-node-reader-only,
    /// multi-node-single-writer, multi-node-multi-writer, single-node-single-writer,
    /// single-node-multi-writer.
    #[arg(long, default_value = "single-node-writer", value_parser = parse_access_mode)]
    access_mode: AccessMode,
    /// Attach as a raw block device instead of a mounted filesystem.
    #[arg(long)]
    block: bool,
    /// Filesystem type (mount access only).
    #[arg(long, default_value = "")]
    fs_type: String,
    /// A mount flag (repeatable; mount access only). Never printed.
    #[arg(long = "mount-flag")]
    mount_flags: Vec<String>,
}

impl CapabilityArgs {
    fn capability(&self) -> anyhow::Result<VolumeCapability> {
        if self.block {
            if !self.fs_type.is_empty() || !self.mount_flags.is_empty() {
                return Err(UsageError(
                    "--fs-type and --mount-flag apply to mount access, not --block".into(),
                )
                .into());
            }
            return Ok(VolumeCapability::block(self.access_mode));
        }
        Ok(VolumeCapability::mount(
            self.access_mode,
            MountOptions {
                fs_type: self.fs_type.clone(),
                mount_flags: MountFlags::new(self.mount_flags.clone()),
                volume_mount_group: String::new(),
            },
        ))
    }
}

/// Secrets, by flag or file. Never echoed.
#[derive(Args)]
pub(super) struct SecretArgs {
    /// A secret as KEY=VALUE (repeatable).
    // Parsed in `load`, not by clap: clap's error would repeat the value.
    #[arg(long = "secret", value_name = "KEY=VALUE")]
    secrets: Vec<String>,
    /// A file of secrets (at most 1 MiB): a JSON object, or KEY=VALUE lines; `-` reads
    /// standard input (keeps them out of the process list, unlike --secret).
    #[arg(long)]
    secrets_file: Option<PathBuf>,
}

// Hand-written so the values can never be printed through `{:?}`.
impl std::fmt::Debug for SecretArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretArgs")
            .field("secrets", &berth_csi::REDACTED)
            .field("secrets_file", &self.secrets_file)
            .finish()
    }
}

impl std::fmt::Debug for CapabilityArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapabilityArgs")
            .field("access_mode", &self.access_mode)
            .field("block", &self.block)
            .field("fs_type", &self.fs_type)
            .field("mount_flags", &berth_csi::REDACTED)
            .finish()
    }
}

impl SecretArgs {
    /// Whether any secret was given.
    pub(super) fn given(&self) -> bool {
        !self.secrets.is_empty() || self.secrets_file.is_some()
    }

    /// The secrets: the file's, then the flags' on top.
    pub(super) fn load(&self) -> anyhow::Result<Secrets> {
        let mut map = BTreeMap::new();
        if let Some(path) = &self.secrets_file {
            let text = input::read_text(&input::Source::from_arg(path), "--secrets-file")?;
            map.extend(parse_secrets_file(path, &text)?);
        }
        for (i, s) in self.secrets.iter().enumerate() {
            let (k, v) = parse_key_value(s).map_err(|e| {
                UsageError(format!(
                    "--secret (#{}): {e}; the value is not shown",
                    i + 1
                ))
            })?;
            map.insert(k, v);
        }
        Ok(Secrets::new(map))
    }
}

fn parse_secrets_file(
    path: &std::path::Path,
    text: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    if text.trim_start().starts_with('{') {
        // The error of serde_json names line and column, never the values.
        return serde_json::from_str(text).map_err(|e| {
            UsageError(format!(
                "{}:{}: not a JSON object of strings ({:?} error)",
                path.display(),
                e.line(),
                e.classify()
            ))
            .into()
        });
    }
    let mut map = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(
                UsageError(format!("{}:{}: expected KEY=VALUE", path.display(), i + 1)).into(),
            );
        };
        map.insert(k.trim().to_string(), v.to_string());
    }
    Ok(map)
}

#[derive(Debug, Subcommand)]
enum VolumeCommand {
    /// CreateVolume.
    Create {
        /// Volume name (the plugin makes creation idempotent by it).
        #[arg(long)]
        name: String,
        /// Minimum size in bytes.
        #[arg(long, default_value_t = 0)]
        required_bytes: i64,
        /// Maximum size in bytes.
        #[arg(long, default_value_t = 0)]
        limit_bytes: i64,
        /// A parameter for the plugin as KEY=VALUE (repeatable).
        #[arg(long = "param", value_parser = parse_key_value)]
        params: Vec<(String, String)>,
        /// Start from this snapshot.
        #[arg(long, conflicts_with = "from_volume")]
        from_snapshot: Option<String>,
        /// Clone this volume (its external id).
        #[arg(long, value_parser = parse_external_id)]
        from_volume: Option<ExternalId>,
        #[command(flatten)]
        cap: CapabilityArgs,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// DeleteVolume.
    Delete {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// ListVolumes (all pages unless --max-entries is given).
    List {
        /// Entries per page; with it, only one page is fetched.
        #[arg(long)]
        max_entries: Option<i32>,
        /// Token of the page to fetch.
        #[arg(long, default_value = "")]
        starting_token: String,
    },
    /// ValidateVolumeCapabilities.
    Validate {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// Volume context as KEY=VALUE (repeatable).
        #[arg(long = "volume-context", value_parser = parse_key_value)]
        volume_context: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapabilityArgs,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// ControllerExpandVolume.
    Expand {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// New minimum size in bytes.
        #[arg(long)]
        required_bytes: i64,
        /// New maximum size in bytes.
        #[arg(long, default_value_t = 0)]
        limit_bytes: i64,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// GetCapacity.
    Capacity {
        #[command(flatten)]
        cap: CapabilityArgs,
    },
}

#[derive(Debug, Subcommand)]
enum ControllerCommand {
    /// ControllerPublishVolume: prints the publish context.
    Publish {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// The plugin's node id (see `berth csi node-info`).
        #[arg(long)]
        node_id: String,
        /// Publish read-only.
        #[arg(long)]
        read_only: bool,
        /// Volume context as KEY=VALUE (repeatable).
        #[arg(long = "volume-context", value_parser = parse_key_value)]
        volume_context: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapabilityArgs,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// ControllerUnpublishVolume.
    Unpublish {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// The plugin's node id.
        #[arg(long)]
        node_id: String,
        #[command(flatten)]
        secrets: SecretArgs,
    },
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// NodeStageVolume.
    Stage {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// Staging directory.
        #[arg(long)]
        staging_path: PathBuf,
        /// Publish context as KEY=VALUE (repeatable; from `controller publish`).
        #[arg(long = "publish-context", value_parser = parse_key_value)]
        publish_context: Vec<(String, String)>,
        /// Volume context as KEY=VALUE (repeatable).
        #[arg(long = "volume-context", value_parser = parse_key_value)]
        volume_context: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapabilityArgs,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// NodeUnstageVolume.
    Unstage {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// Staging directory.
        #[arg(long)]
        staging_path: PathBuf,
    },
    /// NodePublishVolume.
    Publish {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// Where the volume appears.
        #[arg(long)]
        target_path: PathBuf,
        /// Where it was staged (plugins that stage).
        #[arg(long)]
        staging_path: Option<PathBuf>,
        /// Publish read-only.
        #[arg(long)]
        read_only: bool,
        /// Publish context as KEY=VALUE (repeatable).
        #[arg(long = "publish-context", value_parser = parse_key_value)]
        publish_context: Vec<(String, String)>,
        /// Volume context as KEY=VALUE (repeatable).
        #[arg(long = "volume-context", value_parser = parse_key_value)]
        volume_context: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapabilityArgs,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// NodeUnpublishVolume.
    Unpublish {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// Where the volume appears.
        #[arg(long)]
        target_path: PathBuf,
    },
    /// NodeGetVolumeStats.
    Stats {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// A path where the volume is published.
        #[arg(long)]
        volume_path: PathBuf,
        /// Where it is staged (optional).
        #[arg(long)]
        staging_path: Option<PathBuf>,
    },
    /// NodeExpandVolume.
    Expand {
        /// The plugin's volume id.
        #[arg(value_parser = parse_external_id)]
        external_id: ExternalId,
        /// A path where the volume is published.
        #[arg(long)]
        volume_path: PathBuf,
        /// Where it is staged (optional).
        #[arg(long)]
        staging_path: Option<PathBuf>,
        /// New minimum size in bytes.
        #[arg(long)]
        required_bytes: i64,
        #[command(flatten)]
        secrets: SecretArgs,
    },
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// CreateSnapshot.
    Create {
        /// The plugin's id of the volume to snapshot.
        #[arg(value_parser = parse_external_id)]
        source: ExternalId,
        /// Snapshot name (idempotency key).
        #[arg(long)]
        name: String,
        /// A parameter for the plugin as KEY=VALUE (repeatable).
        #[arg(long = "param", value_parser = parse_key_value)]
        params: Vec<(String, String)>,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// DeleteSnapshot.
    Delete {
        /// The plugin's snapshot id.
        snapshot_id: String,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// ListSnapshots (all pages).
    List {
        /// Only snapshots of this volume.
        #[arg(long, value_parser = parse_external_id)]
        source: Option<ExternalId>,
        /// Only this snapshot.
        #[arg(long)]
        snapshot_id: Option<String>,
        #[command(flatten)]
        secrets: SecretArgs,
    },
}

fn parse_access_mode(s: &str) -> Result<AccessMode, String> {
    s.parse()
        .map_err(|e: berth_csi::model::ModelError| e.to_string())
}

fn parse_external_id(s: &str) -> Result<ExternalId, String> {
    ExternalId::new(s).map_err(|_| "must not be empty".to_string())
}

pub(super) fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        // Never echo the value: it may be a secret.
        _ => Err("expected KEY=VALUE with a non-empty KEY".into()),
    }
}

fn to_map(pairs: &[(String, String)]) -> BTreeMap<String, String> {
    pairs.iter().cloned().collect()
}

/// Policies for an interactive tool: the table's, bounded by `--timeout`.
fn client(args: &CsiArgs) -> anyhow::Result<CsiClient> {
    let raw = args
        .endpoint
        .as_deref()
        .ok_or_else(|| UsageError("no endpoint: pass --endpoint or set CSI_ENDPOINT".into()))?;
    let endpoint = Endpoint::parse(raw).map_err(|e| UsageError(format!("--endpoint: {e}")))?;
    endpoint.check()?;
    let mut builder = CsiClient::builder(endpoint);
    if let Some(limit) = args.timeout {
        for rpc in Rpc::ALL {
            let p = rpc.policy();
            builder = builder.policy(
                rpc,
                RetryPolicy {
                    attempt_timeout: p.attempt_timeout.min(limit),
                    overall_timeout: limit,
                    ..p
                },
            );
        }
    }
    Ok(builder.build())
}

/// Prints `ok: <what>` (or `{"ok": true}`) for calls that return nothing.
fn done(json: bool, what: &str) -> anyhow::Result<()> {
    if json {
        output::json(&json!({ "ok": true }))
    } else {
        output::fields(&[("ok", what.to_string())])
    }
}

/// Teardown calls: "already done" (NOT_FOUND where the spec allows it) is success.
fn teardown(result: Result<(), berth_csi::CsiError>) -> anyhow::Result<&'static str> {
    match result {
        Ok(()) => Ok("done"),
        Err(e) if e.is_already_done() => Ok("already done"),
        Err(e) => Err(e.into()),
    }
}

/// Runs `berth csi …`.
pub async fn run(args: CsiArgs) -> anyhow::Result<()> {
    let c = client(&args)?;
    let j = args.json;
    match &args.command {
        CsiCommand::Info => {
            let info = c.plugin_info().await?;
            if j {
                return output::json(&info);
            }
            output::fields(&[
                ("name", info.name),
                ("version", info.vendor_version),
                ("manifest", output::map(&info.manifest)),
            ])
        }
        CsiCommand::Probe => {
            let ready = c.probe().await?;
            if j {
                output::json(&json!({ "ready": ready }))
            } else {
                output::fields(&[("ready", ready.to_string())])
            }
        }
        CsiCommand::Capabilities => capabilities(&c, j).await,
        CsiCommand::NodeInfo => {
            let info = c.node_info().await?;
            if j {
                return output::json(&info);
            }
            output::fields(&[
                ("node id", info.node_id),
                ("max volumes", info.max_volumes_per_node.to_string()),
                (
                    "topology",
                    info.accessible_topology
                        .as_ref()
                        .map_or("-".into(), output::map),
                ),
            ])
        }
        CsiCommand::Volume(cmd) => volume(&c, j, cmd).await,
        CsiCommand::Controller(cmd) => controller(&c, j, cmd).await,
        CsiCommand::Node(cmd) => node(&c, j, cmd).await,
        CsiCommand::Snapshot(cmd) => snapshot(&c, j, cmd).await,
    }
}

async fn capabilities(c: &CsiClient, j: bool) -> anyhow::Result<()> {
    let plugin = c.plugin_capabilities().await?;
    // A node-only plugin has no Controller service, and the other way round: show what answers.
    let controller = if plugin.controller_service {
        Some(c.controller_capabilities().await?)
    } else {
        None
    };
    let node = match c.node_capabilities().await {
        Ok(caps) => Some(caps),
        Err(e) if e.code() == berth_csi::Code::Unimplemented => None,
        Err(e) => return Err(e.into()),
    };
    if j {
        return output::json(&json!({ "plugin": plugin, "controller": controller, "node": node }));
    }
    let mut p = Vec::new();
    if plugin.controller_service {
        p.push("controller-service".to_string());
    }
    if plugin.volume_accessibility_constraints {
        p.push("volume-accessibility-constraints".into());
    }
    if plugin.group_controller_service {
        p.push("group-controller-service".into());
    }
    if plugin.snapshot_metadata_service {
        p.push("snapshot-metadata-service".into());
    }
    if let Some(e) = plugin.volume_expansion {
        p.push(format!(
            "volume-expansion={}",
            if e == berth_csi::model::VolumeExpansion::Online {
                "online"
            } else {
                "offline"
            }
        ));
    }
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    output::fields(&[
        ("plugin", list(p)),
        (
            "controller",
            controller.map_or("(no controller service)".into(), |s| {
                list(s.iter().map(|c| c.to_string()).collect())
            }),
        ),
        (
            "node",
            node.map_or("(no node service)".into(), |s| {
                list(s.iter().map(|c| c.to_string()).collect())
            }),
        ),
    ])
}

async fn volume(c: &CsiClient, j: bool, cmd: &VolumeCommand) -> anyhow::Result<()> {
    match cmd {
        VolumeCommand::Create {
            name,
            required_bytes,
            limit_bytes,
            params,
            from_snapshot,
            from_volume,
            cap,
            secrets,
        } => {
            let source = match (from_snapshot, from_volume) {
                (Some(s), _) => Some(ContentSource::Snapshot(s.clone())),
                (None, Some(v)) => Some(ContentSource::Volume(v.clone())),
                (None, None) => None,
            };
            let v = c
                .create_volume(&CreateVolume {
                    name: name.clone(),
                    capacity: CapacityRange {
                        required_bytes: *required_bytes,
                        limit_bytes: *limit_bytes,
                    },
                    capabilities: vec![cap.capability()?],
                    parameters: to_map(params),
                    secrets: secrets.load()?,
                    source,
                    accessibility_requirements: None,
                })
                .await?;
            if j {
                return output::json(&v);
            }
            output::fields(&[
                ("external id", v.external_id.to_string()),
                ("capacity", v.capacity_bytes.to_string()),
                ("context", output::map(&v.context)),
                (
                    "topology",
                    v.accessible_topology
                        .iter()
                        .map(output::map)
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
            ])
        }
        VolumeCommand::Delete {
            external_id,
            secrets,
        } => {
            let what = teardown(c.delete_volume(external_id, &secrets.load()?).await)?;
            done(j, what)
        }
        VolumeCommand::List {
            max_entries,
            starting_token,
        } => {
            let mut token = starting_token.clone();
            let mut all = Vec::new();
            loop {
                let page = c.list_volumes(max_entries.unwrap_or(0), &token).await?;
                all.extend(page.entries);
                token = page.next_token;
                if token.is_empty() || max_entries.is_some() {
                    break;
                }
            }
            if j {
                let entries: Vec<_> = all
                    .iter()
                    .map(|e| json!({ "volume": e.volume, "published_node_ids": e.published_node_ids, "abnormal": e.abnormal }))
                    .collect();
                return output::json(&json!({ "entries": entries, "next_token": token }));
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|e| {
                    vec![
                        e.volume.external_id.to_string(),
                        e.volume.capacity_bytes.to_string(),
                        if e.published_node_ids.is_empty() {
                            "-".into()
                        } else {
                            e.published_node_ids.join(",")
                        },
                        e.abnormal
                            .clone()
                            .map_or("ok".into(), |m| format!("abnormal: {m}")),
                    ]
                })
                .collect();
            output::table(
                &["EXTERNAL ID", "CAPACITY", "PUBLISHED TO", "CONDITION"],
                &rows,
            )?;
            if !token.is_empty() {
                say!("next token: {}", output::escape(&token))?;
            }
            Ok(())
        }
        VolumeCommand::Validate {
            external_id,
            volume_context,
            cap,
            secrets,
        } => {
            let v = c
                .validate_capabilities(
                    external_id,
                    &[cap.capability()?],
                    &to_map(volume_context),
                    &BTreeMap::new(),
                    &secrets.load()?,
                )
                .await?;
            let (ok, msg) = match v {
                Validation::Confirmed => (true, String::new()),
                Validation::NotConfirmed(m) => (false, m),
            };
            if j {
                output::json(&json!({ "confirmed": ok, "message": msg }))
            } else {
                output::fields(&[
                    ("confirmed", ok.to_string()),
                    ("message", if msg.is_empty() { "-".into() } else { msg }),
                ])
            }
        }
        VolumeCommand::Expand {
            external_id,
            required_bytes,
            limit_bytes,
            secrets,
        } => {
            let range = CapacityRange {
                required_bytes: *required_bytes,
                limit_bytes: *limit_bytes,
            };
            let (bytes, node) = c
                .controller_expand(external_id, range, None, &secrets.load()?)
                .await?;
            if j {
                output::json(&json!({ "capacity_bytes": bytes, "node_expansion_required": node }))
            } else {
                output::fields(&[
                    ("capacity", bytes.to_string()),
                    ("node expansion required", node.to_string()),
                ])
            }
        }
        VolumeCommand::Capacity { cap } => {
            let bytes = c
                .get_capacity(&[cap.capability()?], &BTreeMap::new(), None)
                .await?;
            if j {
                output::json(&json!({ "available_capacity": bytes }))
            } else {
                output::fields(&[("available", bytes.to_string())])
            }
        }
    }
}

async fn controller(c: &CsiClient, j: bool, cmd: &ControllerCommand) -> anyhow::Result<()> {
    match cmd {
        ControllerCommand::Publish {
            external_id,
            node_id,
            read_only,
            volume_context,
            cap,
            secrets,
        } => {
            let ctx = c
                .controller_publish(&ControllerPublish {
                    external_id: external_id.clone(),
                    node_id: node_id.clone(),
                    capability: cap.capability()?,
                    read_only: *read_only,
                    volume_context: to_map(volume_context),
                    secrets: secrets.load()?,
                })
                .await?;
            if j {
                return output::json(&json!({ "publish_context": ctx }));
            }
            output::fields(&[("publish context", output::map(&ctx))])
        }
        ControllerCommand::Unpublish {
            external_id,
            node_id,
            secrets,
        } => {
            let what = teardown(
                c.controller_unpublish(external_id, node_id, &secrets.load()?)
                    .await,
            )?;
            done(j, what)
        }
    }
}

async fn node(c: &CsiClient, j: bool, cmd: &NodeCommand) -> anyhow::Result<()> {
    match cmd {
        NodeCommand::Stage {
            external_id,
            staging_path,
            publish_context,
            volume_context,
            cap,
            secrets,
        } => {
            c.node_stage(&NodeStage {
                external_id: external_id.clone(),
                staging_path: staging_path.clone(),
                capability: cap.capability()?,
                publish_context: to_map(publish_context),
                volume_context: to_map(volume_context),
                secrets: secrets.load()?,
            })
            .await?;
            done(j, "staged")
        }
        NodeCommand::Unstage {
            external_id,
            staging_path,
        } => {
            let what = teardown(c.node_unstage(external_id, staging_path).await)?;
            done(j, what)
        }
        NodeCommand::Publish {
            external_id,
            target_path,
            staging_path,
            read_only,
            publish_context,
            volume_context,
            cap,
            secrets,
        } => {
            c.node_publish(&NodePublish {
                external_id: external_id.clone(),
                staging_path: staging_path.clone(),
                target_path: target_path.clone(),
                capability: cap.capability()?,
                read_only: *read_only,
                publish_context: to_map(publish_context),
                volume_context: to_map(volume_context),
                secrets: secrets.load()?,
            })
            .await?;
            done(j, "published")
        }
        NodeCommand::Unpublish {
            external_id,
            target_path,
        } => {
            let what = teardown(c.node_unpublish(external_id, target_path).await)?;
            done(j, what)
        }
        NodeCommand::Stats {
            external_id,
            volume_path,
            staging_path,
        } => {
            let stats = c
                .node_volume_stats(external_id, volume_path, staging_path.as_deref())
                .await?;
            if j {
                return output::json(&stats);
            }
            let rows: Vec<Vec<String>> = stats
                .usage
                .iter()
                .map(|u| {
                    vec![
                        u.unit.clone(),
                        u.used.to_string(),
                        u.available.to_string(),
                        u.total.to_string(),
                    ]
                })
                .collect();
            output::table(&["UNIT", "USED", "AVAILABLE", "TOTAL"], &rows)?;
            say!(
                "condition: {}",
                stats
                    .abnormal
                    .map_or("ok".into(), |m| format!("abnormal: {}", output::escape(&m)))
            )?;
            Ok(())
        }
        NodeCommand::Expand {
            external_id,
            volume_path,
            staging_path,
            required_bytes,
            secrets,
        } => {
            let bytes = c
                .node_expand(&NodeExpand {
                    external_id: external_id.clone(),
                    volume_path: volume_path.clone(),
                    staging_path: staging_path.clone(),
                    capacity: CapacityRange {
                        required_bytes: *required_bytes,
                        limit_bytes: 0,
                    },
                    capability: None,
                    secrets: secrets.load()?,
                })
                .await?;
            if j {
                output::json(&json!({ "capacity_bytes": bytes }))
            } else {
                output::fields(&[("capacity", bytes.to_string())])
            }
        }
    }
}

async fn snapshot(c: &CsiClient, j: bool, cmd: &SnapshotCommand) -> anyhow::Result<()> {
    match cmd {
        SnapshotCommand::Create {
            source,
            name,
            params,
            secrets,
        } => {
            let s = c
                .create_snapshot(source, name, &to_map(params), &secrets.load()?)
                .await?;
            if j {
                return output::json(&s);
            }
            output::fields(&[
                ("snapshot id", s.snapshot_id),
                ("source", s.source_external_id),
                ("size", s.size_bytes.to_string()),
                ("ready", s.ready_to_use.to_string()),
            ])
        }
        SnapshotCommand::Delete {
            snapshot_id,
            secrets,
        } => {
            let what = teardown(c.delete_snapshot(snapshot_id, &secrets.load()?).await)?;
            done(j, what)
        }
        SnapshotCommand::List {
            source,
            snapshot_id,
            secrets,
        } => {
            let secrets = secrets.load()?;
            let mut token = String::new();
            let mut all = Vec::new();
            loop {
                let page = c
                    .list_snapshots(source.as_ref(), snapshot_id.as_deref(), 0, &token, &secrets)
                    .await?;
                all.extend(page.entries);
                token = page.next_token;
                if token.is_empty() {
                    break;
                }
            }
            if j {
                return output::json(&all);
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|s| {
                    vec![
                        s.snapshot_id.clone(),
                        s.source_external_id.clone(),
                        s.size_bytes.to_string(),
                        s.ready_to_use.to_string(),
                    ]
                })
                .collect();
            output::table(&["SNAPSHOT ID", "SOURCE", "SIZE", "READY"], &rows)
        }
    }
}
