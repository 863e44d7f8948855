//! `berth volume …`: the agent's volume catalog, claims and snapshots.
//!
//! Spec texts, secrets and mount flags are sent, never printed: not on success, not in errors.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use berth_api::{
    Client, ClientError, PluginList, PluginStatus,
    jobs::AllocStatus,
    volumes::{
        ClaimRequest, DetachRequest, DetachResponse, ExpandRequest, FlagsInput, MountOptionsInput,
        MountOptionsView, REDACTED, ReleaseRequest, SnapshotCreateRequest, SnapshotDeleteRequest,
        SnapshotList, SnapshotView, VolumeList, VolumeSpecRequest, VolumeStatus, WriteOnly,
    },
};
use berth_csi::model::{AccessMode, AttachmentMode, VolumeStats};
use clap::{Args, Subcommand};

use crate::say;

use super::{
    UsageError,
    api_client::{self, KindArg, ago, list, ratio, yes_no},
    csi::{SecretArgs, parse_key_value},
    input::{self, FormatArg},
    output::{self, quoted},
};

/// Volumes in the agent's catalog.
#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    command: VolumeCommand,
}

#[derive(Debug, Subcommand)]
enum VolumeCommand {
    /// Add a volume that already exists at the storage provider, from a spec file (HCL or
    /// JSON, as `nomad volume register` takes).
    Register(SpecArgs),
    /// Create a volume at the storage provider (CreateVolume) and add it, from a spec file
    /// (HCL or JSON, as `nomad volume create` takes).
    Create(SpecArgs),
    /// Every volume in a table, or one volume in detail with its claims and its usages on
    /// this node.
    Status {
        /// A volume id: show this volume in detail.
        #[arg(value_parser = parse_id)]
        id: Option<String>,
        /// The kind of volume: csi, the only one berth has (Nomad's `-type csi`).
        #[arg(long = "type", value_enum)]
        kind: Option<KindArg>,
        /// Print the summary fields only, without the tables.
        #[arg(long)]
        short: bool,
        /// Show the claiming allocs' times in full.
        #[arg(long)]
        verbose: bool,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Remove a volume from the catalog (it stays at the provider). Refused while it is
    /// claimed, unless --force.
    Deregister {
        /// The volume id.
        #[arg(value_parser = parse_id)]
        id: String,
        /// Release every claim first.
        #[arg(long)]
        force: bool,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume at the provider (DeleteVolume) and from the catalog.
    Delete {
        /// The volume id.
        #[arg(value_parser = parse_id)]
        id: String,
    },
    /// Release every claim of one node on a volume (unpublish, unstage, controller unpublish).
    Detach {
        /// The volume id.
        #[arg(value_parser = parse_id)]
        id: String,
        /// The node (default: this node).
        #[arg(long)]
        node: Option<String>,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Grow a volume (ControllerExpandVolume, then NodeExpandVolume where it is mounted).
    Expand {
        /// The volume id.
        #[arg(value_parser = parse_id)]
        id: String,
        /// At least this size: bytes, or with a unit (1GiB, 500MB, 10G).
        #[arg(long, value_parser = parse_size)]
        capacity_min: u64,
        /// At most this size (default: no limit).
        #[arg(long, value_parser = parse_size)]
        capacity_max: Option<u64>,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Snapshots: create, delete, list.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Claim a volume for an alloc on this node and mount it; prints where.
    ///
    /// Stands in for the job runner until jobs exist: an alloc's volumes are claimed when it
    /// starts. Idempotent: the same claim again answers the same.
    Claim(ClaimArgs),
    /// Release an alloc's claim on a volume: unmount, then free the claim. Exits 1 when a step
    /// failed and the agent keeps retrying it in the background.
    ///
    /// Stands in for the job runner until jobs exist: an alloc's claims are released when it
    /// stops.
    Release {
        /// The volume id.
        #[arg(value_parser = parse_id)]
        id: String,
        /// The alloc whose claim is released.
        #[arg(long)]
        alloc: String,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

/// A spec file to register or create.
#[derive(Debug, Args)]
struct SpecArgs {
    /// The spec file (at most 1 MiB); `-` reads standard input. Its text is sent to the agent,
    /// never printed.
    file: String,
    /// The spec's language (default: json for a file ending in .json, else hcl).
    #[arg(long, value_enum)]
    format: Option<FormatArg>,
    /// Print the API's JSON document instead.
    #[arg(long)]
    json: bool,
}

/// `berth volume claim`.
#[derive(Args)]
struct ClaimArgs {
    /// The volume id.
    #[arg(value_parser = parse_id)]
    id: String,
    /// The alloc claiming it.
    #[arg(long)]
    alloc: String,
    /// One of the volume's access modes: single-node-writer, single-node-reader-only,
    /// multi-node-reader-only, multi-node-single-writer, multi-node-multi-writer,
    /// single-node-single-writer, single-node-multi-writer.
    #[arg(long, value_parser = parse_access_mode)]
    access_mode: AccessMode,
    /// file-system or block-device.
    #[arg(long, default_value = "file-system", value_parser = parse_attachment_mode)]
    attachment_mode: AttachmentMode,
    /// Mount read-only (a read claim); else a write claim.
    #[arg(long)]
    read_only: bool,
    /// Filesystem type (default: the volume's).
    #[arg(long)]
    fs_type: Option<String>,
    /// A mount flag (repeatable; replaces the volume's). Never printed.
    #[arg(long = "mount-flag")]
    mount_flags: Vec<String>,
    /// Print the API's JSON document instead.
    #[arg(long)]
    json: bool,
}

// Hand-written so the mount flags can never be printed through `{:?}`.
impl std::fmt::Debug for ClaimArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimArgs")
            .field("id", &self.id)
            .field("alloc", &self.alloc)
            .field("access_mode", &self.access_mode)
            .field("attachment_mode", &self.attachment_mode)
            .field("read_only", &self.read_only)
            .field("fs_type", &self.fs_type)
            .field("mount_flags", &REDACTED)
            .field("json", &self.json)
            .finish()
    }
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Snapshot a volume (CreateSnapshot; idempotent by name).
    Create {
        /// The volume id.
        #[arg(value_parser = parse_id)]
        id: String,
        /// The snapshot's name.
        name: String,
        /// A parameter for the plugin as KEY=VALUE (repeatable).
        #[arg(long = "parameter", value_parser = parse_key_value)]
        parameters: Vec<(String, String)>,
        /// Secrets for CreateSnapshot (default: the volume's).
        #[command(flatten)]
        secrets: SecretArgs,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot at the provider (DeleteSnapshot).
    Delete {
        /// The controller plugin.
        #[arg(long)]
        plugin: String,
        /// The provider's snapshot id.
        snapshot_id: String,
        #[command(flatten)]
        secrets: SecretArgs,
    },
    /// The snapshots a controller plugin lists.
    List {
        /// The controller plugin.
        #[arg(long)]
        plugin: String,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

/// An id that goes into a URL path. Only emptiness is checked here (it cannot be sent); the
/// agent judges the rest.
fn parse_id(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_string())
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    berth_volume::parse_size(s).map_err(|e| e.to_string())
}

fn parse_access_mode(s: &str) -> Result<AccessMode, String> {
    s.parse()
        .map_err(|e: berth_csi::model::ModelError| e.to_string())
}

fn parse_attachment_mode(s: &str) -> Result<AttachmentMode, String> {
    s.parse()
        .map_err(|e: berth_csi::model::ModelError| e.to_string())
}

/// Runs `berth volume …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: VolumeArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        VolumeCommand::Register(spec) => put(&client, spec, "registered").await,
        VolumeCommand::Create(spec) => put(&client, spec, "created").await,
        VolumeCommand::Status {
            id: None,
            json,
            short: _,
            ..
        } => {
            let volumes = client.volumes().await?;
            if json {
                output::json(&volumes)
            } else {
                let plugins = client.plugins().await?;
                print_list(&volumes, &plugins)
            }
        }
        VolumeCommand::Status {
            id: Some(id),
            json,
            short,
            verbose,
            ..
        } => {
            let mut volume = client.volume(&id).await?;
            redact_flags(&mut volume);
            if json {
                return output::json(&volume);
            }
            let plugin = optional(client.plugin(&volume.plugin_id).await)?;
            let mut allocs = BTreeMap::new();
            if !short {
                for c in &volume.claims {
                    if let Some(a) = optional(client.alloc(&c.alloc_id).await)? {
                        allocs.insert(c.alloc_id.clone(), a);
                    }
                }
            }
            let view = Detail {
                plugin: plugin.as_ref(),
                allocs: &allocs,
                short,
                verbose,
            };
            print_one(&volume, &view, SystemTime::now())
        }
        VolumeCommand::Deregister { id, force, json } => {
            let answer = client.deregister_volume(&id, force).await?;
            if json {
                output::json(&answer)?;
            } else {
                print_releases(&answer)?;
            }
            all_released(&id, &answer)?;
            if !json {
                say!("Volume {} deregistered", quoted(&id))?;
            }
            Ok(())
        }
        VolumeCommand::Delete { id } => {
            super::watch::slow_call(
                "deleting the volume",
                "see `berth volume status`",
                client.delete_volume(&id),
            )
            .await?;
            say!("Volume {} deleted", quoted(&id))?;
            Ok(())
        }
        VolumeCommand::Detach { id, node, json } => {
            let answer = super::watch::slow_call(
                "releasing the claims",
                "see `berth volume status`",
                client.detach_volume(&id, &DetachRequest { node_id: node }),
            )
            .await?;
            if json {
                output::json(&answer)?;
            } else if answer.releases.is_empty() {
                say!("no claims to release")?;
            } else {
                print_releases(&answer)?;
            }
            all_released(&id, &answer)
        }
        VolumeCommand::Expand {
            id,
            capacity_min,
            capacity_max,
            json,
        } => {
            if capacity_max.is_some_and(|max| max < capacity_min) {
                return Err(
                    UsageError("--capacity-max is smaller than --capacity-min".into()).into(),
                );
            }
            let answer = super::watch::slow_call(
                "expanding the volume",
                "see `berth volume status`",
                client.expand_volume(
                    &id,
                    &ExpandRequest {
                        capacity_min,
                        capacity_max,
                    },
                ),
            )
            .await?;
            if json {
                return output::json(&answer);
            }
            say!(
                "Volume {} expanded to {} ({} bytes){}",
                quoted(&answer.volume_id),
                output::capacity(answer.capacity_bytes),
                answer.capacity_bytes,
                if answer.node_expanded {
                    ", filesystem grown on this node"
                } else {
                    ""
                }
            )?;
            Ok(())
        }
        VolumeCommand::Snapshot(cmd) => snapshot(&client, cmd).await,
        VolumeCommand::Claim(args) => claim(&client, args).await,
        VolumeCommand::Release { id, alloc, json } => {
            let answer = client
                .release_volume(
                    &id,
                    &ReleaseRequest {
                        alloc_id: alloc.clone(),
                    },
                )
                .await?;
            if json {
                output::json(&answer)?;
            } else if answer.released {
                say!("released")?;
            } else {
                say!(
                    "releasing (retrying in the background): {}",
                    output::escape(answer.error.as_deref().unwrap_or("no reason given"))
                )?;
            }
            if answer.released {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "the claim of alloc {} on volume {} is not released yet",
                    quoted(&alloc),
                    quoted(&id)
                ))
            }
        }
    }
}

/// `register` and `create`.
async fn put(client: &Client, args: SpecArgs, done: &str) -> anyhow::Result<()> {
    let (spec, format, file) = input::read_spec_arg(&args.file, args.format)?;
    let req = VolumeSpecRequest {
        spec,
        format,
        file: Some(file),
    };
    let after = "see `berth volume status`";
    let mut volume = if done == "created" {
        super::watch::slow_call("creating the volume", after, client.create_volume(&req)).await?
    } else {
        super::watch::slow_call(
            "registering the volume",
            after,
            client.register_volume(&req),
        )
        .await?
    };
    // On stderr, so `--json` output stays one document.
    for w in &volume.warnings {
        eprintln!("warning: {w}");
    }
    if args.json {
        redact_flags(&mut volume);
        return output::json(&volume);
    }
    say!(
        "Volume {} {done} (external id {}, plugin {})",
        quoted(&volume.id),
        quoted(&volume.external_id),
        quoted(&volume.plugin_id)
    )?;
    Ok(())
}

async fn claim(client: &Client, args: ClaimArgs) -> anyhow::Result<()> {
    let mount_options = if args.fs_type.is_some() || !args.mount_flags.is_empty() {
        Some(MountOptionsInput {
            fs_type: args.fs_type,
            mount_flags: (!args.mount_flags.is_empty()).then_some(FlagsInput(args.mount_flags)),
        })
    } else {
        None
    };
    let answer = client
        .claim_volume(
            &args.id,
            &ClaimRequest {
                alloc_id: args.alloc,
                read_only: args.read_only,
                access_mode: args.access_mode,
                attachment_mode: args.attachment_mode,
                mount_options,
            },
        )
        .await?;
    if args.json {
        output::json(&answer)
    } else {
        say!("{}", output::escape(&answer.target.display().to_string()))?;
        Ok(())
    }
}

async fn snapshot(client: &Client, cmd: SnapshotCommand) -> anyhow::Result<()> {
    match cmd {
        SnapshotCommand::Create {
            id,
            name,
            parameters,
            secrets,
            json,
        } => {
            let secrets = if secrets.given() {
                Some(WriteOnly(secrets.load()?.expose().clone()))
            } else {
                None
            };
            let snap = client
                .create_snapshot(
                    &id,
                    &SnapshotCreateRequest {
                        name,
                        parameters: parameters.into_iter().collect(),
                        secrets,
                    },
                )
                .await?;
            if json {
                return output::json(&snap);
            }
            output::fields(&[
                ("snapshot id", snap.snapshot_id.clone()),
                ("plugin", snap.plugin_id.clone()),
                ("source", snap.source_external_id.clone()),
                (
                    "volume",
                    snap.source_volume_id.clone().unwrap_or_else(|| "-".into()),
                ),
                ("size", output::capacity(snap.size_bytes)),
                ("created", created(&snap)),
                ("ready", yes_no(snap.ready_to_use).into()),
            ])
        }
        SnapshotCommand::Delete {
            plugin,
            snapshot_id,
            secrets,
        } => {
            let secrets = WriteOnly(secrets.load()?.expose().clone());
            client
                .delete_snapshot(&SnapshotDeleteRequest {
                    plugin_id: plugin,
                    snapshot_id: snapshot_id.clone(),
                    secrets,
                })
                .await?;
            say!("Snapshot {} deleted", quoted(&snapshot_id))?;
            Ok(())
        }
        SnapshotCommand::List { plugin, json } => {
            let snapshots = client.list_snapshots(&plugin).await?;
            if json {
                output::json(&snapshots)
            } else {
                print_snapshots(&snapshots)
            }
        }
    }
}

/// Mount flags are shown as [`REDACTED`] whatever the agent sent.
fn redact_flags(volume: &mut VolumeStatus) {
    let redact = |m: &mut MountOptionsView| {
        if m.mount_flags.is_some() {
            m.mount_flags = Some(REDACTED.into());
        }
    };
    redact(&mut volume.mount_options);
    for usage in &mut volume.usages {
        redact(&mut usage.mount_options);
    }
}

/// An error when some claim is not released yet.
fn all_released(id: &str, answer: &DetachResponse) -> anyhow::Result<()> {
    let pending = answer.releases.iter().filter(|r| !r.released).count();
    if pending == 0 {
        Ok(())
    } else {
        Err(anyhow::anyhow!(
            "{pending} claim(s) on volume {} not released yet (the agent keeps retrying in the \
             background)",
            quoted(id)
        ))
    }
}

fn print_releases(answer: &DetachResponse) -> anyhow::Result<()> {
    if answer.releases.is_empty() {
        return Ok(());
    }
    let rows: Vec<Vec<String>> = answer
        .releases
        .iter()
        .map(|r| {
            vec![
                r.alloc_id.clone(),
                if r.released {
                    "released".into()
                } else {
                    format!(
                        "pending: {}",
                        r.error.as_deref().unwrap_or("no reason given")
                    )
                },
            ]
        })
        .collect();
    output::table(&["ALLOC", "RELEASE"], &rows)
}

/// `None` for a 404 (no such plugin or alloc), the error otherwise.
fn optional<T>(answer: Result<T, ClientError>) -> anyhow::Result<Option<T>> {
    match answer {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a volume can be claimed now: its plugin is healthy and, when the volume needs a
/// controller, an instance serving the controller role is healthy.
fn schedulable(plugin: Option<&PluginStatus>, controller_required: bool) -> bool {
    plugin.is_some_and(|p| {
        let ((controllers, _), _) = api_client::plugin_roles(p);
        p.health.healthy && (!controller_required || controllers > 0)
    })
}

fn print_list(list: &VolumeList, plugins: &PluginList) -> anyhow::Result<()> {
    if list.volumes.is_empty() {
        say!("no volumes")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .volumes
        .iter()
        .map(|v| {
            let plugin = plugins.plugins.iter().find(|p| p.id == v.plugin_id);
            vec![
                v.id.clone(),
                v.name.clone(),
                v.plugin_id.clone(),
                v.external_id.clone(),
                yes_no(schedulable(plugin, v.controller_required)).into(),
                if v.access_modes.is_empty() {
                    "-".into()
                } else {
                    let modes: Vec<&str> = v.access_modes.iter().map(|m| m.as_str()).collect();
                    modes.join(",")
                },
                v.read_claims.to_string(),
                v.write_claims.to_string(),
                output::capacity(v.capacity_bytes),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "NAME",
            "PLUGIN",
            "EXTERNAL ID",
            "SCHEDULABLE",
            "ACCESS MODES",
            "READERS",
            "WRITERS",
            "CAPACITY",
        ],
        &rows,
    )
}

/// What `volume status ID` shows besides the volume: its plugin and its claiming allocs.
struct Detail<'a> {
    plugin: Option<&'a PluginStatus>,
    allocs: &'a BTreeMap<String, AllocStatus>,
    short: bool,
    verbose: bool,
}

/// The distinct words of the volume's claims' modes, `-` when it has no claim.
fn claim_modes(words: impl Iterator<Item = String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for w in words {
        if !seen.contains(&w) {
            seen.push(w);
        }
    }
    list(seen)
}

fn print_one(v: &VolumeStatus, d: &Detail<'_>, now: SystemTime) -> anyhow::Result<()> {
    let fp = d.plugin.and_then(|p| p.fingerprint.as_ref());
    let ((ch, ce), (nh, ne)) = d.plugin.map_or(((0, 0), (0, 0)), api_client::plugin_roles);
    let capacity = if v.capacity_bytes > 0 {
        format!(
            "{} ({} bytes)",
            output::size(v.capacity_bytes),
            v.capacity_bytes
        )
    } else {
        "-".into()
    };
    output::fields(&[
        ("id", v.id.clone()),
        ("name", v.name.clone()),
        ("plugin", v.plugin_id.clone()),
        ("provider", fp.map_or("-".into(), |f| f.provider.clone())),
        ("version", fp.map_or("-".into(), |f| f.version.clone())),
        (
            "schedulable",
            yes_no(schedulable(d.plugin, v.controller_required)).into(),
        ),
        ("controllers healthy", ratio(ch, ce)),
        ("nodes healthy", ratio(nh, ne)),
        (
            "access mode",
            claim_modes(v.claims.iter().map(|c| c.access_mode.to_string())),
        ),
        (
            "attachment mode",
            claim_modes(v.claims.iter().map(|c| c.attachment_mode.to_string())),
        ),
        ("external id", v.external_id.clone()),
        ("origin", format!("{:?}", v.origin).to_lowercase()),
        ("created", ago(v.created_ms, now)),
        ("capacity", capacity),
        (
            "capabilities",
            list(
                v.capabilities
                    .iter()
                    .map(|c| format!("{}/{}", c.access_mode, c.attachment_mode))
                    .collect(),
            ),
        ),
        ("fs type", non_empty(&v.mount_options.fs_type)),
        ("mount flags", flags(&v.mount_options)),
        ("parameters", output::map(&v.parameters)),
        ("context", output::map(&v.context)),
        ("secrets", list(v.secret_names.clone())),
        (
            "topology",
            if v.topology.is_empty() {
                "-".into()
            } else {
                let segments: Vec<String> = v.topology.iter().map(output::map).collect();
                segments.join("; ")
            },
        ),
        ("controller required", yes_no(v.controller_required).into()),
    ])?;
    if d.short {
        return Ok(());
    }

    say!()?;
    if v.claims.is_empty() {
        say!("no claims")?;
    } else {
        let rows: Vec<Vec<String>> = v
            .claims
            .iter()
            .map(|c| {
                let mut row = vec![c.alloc_id.clone()];
                row.extend(api_client::alloc_cells(
                    d.allocs.get(&c.alloc_id),
                    now,
                    d.verbose,
                ));
                row.extend([
                    c.node_id.clone(),
                    c.mode.clone(),
                    c.access_mode.to_string(),
                    c.attachment_mode.to_string(),
                    format!("{:?}", c.state).to_lowercase(),
                    c.error
                        .as_deref()
                        .map_or_else(|| "-".into(), str::to_string),
                ]);
                row
            })
            .collect();
        let mut header = vec!["ALLOC"];
        header.extend(api_client::ALLOC_COLUMNS);
        header.extend(["NODE", "MODE", "ACCESS", "ATTACHMENT", "STATE", "ERROR"]);
        output::table(&header, &rows)?;
    }

    say!()?;
    if v.usages.is_empty() {
        say!("no usages on this node")?;
        return Ok(());
    }
    let mut rows = Vec::new();
    for u in &v.usages {
        let staging = u.staging.clone().unwrap_or_else(|| "-".into());
        if u.allocs.is_empty() {
            rows.push(vec![
                u.usage.clone(),
                staging.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for a in &u.allocs {
            let (used, total) = bytes_stats(a.stats.as_ref());
            rows.push(vec![
                u.usage.clone(),
                staging.clone(),
                a.alloc_id.clone(),
                a.state.clone(),
                a.target.display().to_string(),
                used,
                total,
            ]);
        }
    }
    output::table(
        &[
            "USAGE", "STAGING", "ALLOC", "STATE", "TARGET", "USED", "TOTAL",
        ],
        &rows,
    )
}

fn print_snapshots(list: &SnapshotList) -> anyhow::Result<()> {
    if list.snapshots.is_empty() {
        say!("no snapshots")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .snapshots
        .iter()
        .map(|s| {
            vec![
                s.snapshot_id.clone(),
                s.source_external_id.clone(),
                s.source_volume_id.clone().unwrap_or_else(|| "-".into()),
                output::capacity(s.size_bytes),
                created(s),
                yes_no(s.ready_to_use).into(),
            ]
        })
        .collect();
    output::table(
        &[
            "SNAPSHOT ID",
            "SOURCE",
            "VOLUME",
            "SIZE",
            "CREATED",
            "READY",
        ],
        &rows,
    )
}

fn created(s: &SnapshotView) -> String {
    match s.creation_time.and_then(|t| u64::try_from(t).ok()) {
        Some(secs) => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
        }
        None => "-".into(),
    }
}

/// [`REDACTED`] when the volume has mount flags, `-` otherwise.
fn flags(m: &MountOptionsView) -> String {
    if m.mount_flags.is_some() {
        REDACTED.into()
    } else {
        "-".into()
    }
}

fn non_empty(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.into() }
}

/// Used and total bytes from NodeGetVolumeStats, `-` where absent.
fn bytes_stats(stats: Option<&VolumeStats>) -> (String, String) {
    match stats.and_then(|s| s.usage.iter().find(|u| u.unit == "bytes")) {
        Some(u) => (output::size(u.used), output::size(u.total)),
        None => ("-".into(), "-".into()),
    }
}
