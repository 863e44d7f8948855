//! `berth job …`: run, stop and look at jobs.
//!
//! A job spec's text is sent to the agent, never printed: not on success, not in errors.

use berth_api::jobs::{AllocStatus, JobList, JobRunRequest, JobStatus, JobVar, VarFile};
use clap::{Args, Subcommand};

use crate::say;

use super::{
    api_client::{self, yes_no},
    input::{self, FormatArg},
    output::{self, quoted},
    watch,
};

/// Jobs on this node.
#[derive(Debug, Args)]
pub struct JobArgs {
    #[command(subcommand)]
    command: JobCommand,
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Place and start a job from a spec file (HCL or JSON, as `nomad job run` takes); prints
    /// its allocs.
    Run {
        /// The spec file (at most 1 MiB); `-` reads standard input. Its text is sent to the
        /// agent, never printed.
        file: String,
        /// The spec's language (default: json for a file ending in .json, else hcl).
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Sets an HCL2 variable of the spec: `name=value` (Nomad's `-var` works too); may be
        /// repeated; wins over every var file.
        #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
        vars: Vec<(String, String)>,
        /// A file of variable values (HCL `name = value` lines, or a JSON object when it ends
        /// in .json; Nomad's `-var-file` works too); may be repeated, later files win.
        #[arg(long = "var-file", value_name = "FILE")]
        var_files: Vec<String>,
        /// Print the API's JSON document instead (and do not follow the job).
        #[arg(long)]
        json: bool,
        /// Return once the job is placed, without following its allocs.
        #[arg(long)]
        detach: bool,
    },
    /// Check a spec file without an agent: syntax, every field, variables; prints what it
    /// would run.
    Validate {
        /// The spec file; `-` reads standard input.
        file: String,
        /// The spec's language (default: json for a file ending in .json, else hcl).
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Sets an HCL2 variable of the spec: `name=value`; may be repeated.
        #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
        vars: Vec<(String, String)>,
        /// A file of variable values; may be repeated, later files win.
        #[arg(long = "var-file", value_name = "FILE")]
        var_files: Vec<String>,
    },
    /// What `job run` would place on this node, and every reason it would not; nothing is
    /// changed. Exits 0 when every alloc can be placed, 1 when not.
    Plan {
        /// The spec file; `-` reads standard input.
        file: String,
        /// The spec's language (default: json for a file ending in .json, else hcl).
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Sets an HCL2 variable of the spec: `name=value`; may be repeated.
        #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
        vars: Vec<(String, String)>,
        /// A file of variable values; may be repeated, later files win.
        #[arg(long = "var-file", value_name = "FILE")]
        var_files: Vec<String>,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// The job as the agent keeps it (parsed, variables filled; mount flags redacted), as
    /// JSON.
    Inspect {
        /// The job id (or a unique prefix).
        #[arg(value_parser = parse_id)]
        id: String,
    },
    /// Stop a job: its tasks stop, then its volumes are released; follows until its allocs
    /// have stopped.
    Stop {
        /// The job id (or a unique prefix).
        #[arg(value_parser = parse_id)]
        id: String,
        /// Also forget the job and its allocs once they have stopped.
        #[arg(long)]
        purge: bool,
        /// Return at once, without following the stop.
        #[arg(long)]
        detach: bool,
        /// Print the API's JSON document instead (and do not follow).
        #[arg(long)]
        json: bool,
    },
    /// Every job in a table, or one job with its allocs.
    Status {
        /// A job id: show this job with its allocs.
        #[arg(value_parser = parse_id)]
        id: Option<String>,
        /// Print the summary fields only, without the allocs.
        #[arg(long)]
        short: bool,
        /// Also each alloc's tasks with their state.
        #[arg(long)]
        verbose: bool,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

/// An id that goes into a URL path. Only emptiness is checked here (it cannot be sent); the
/// agent judges the rest.
pub(super) fn parse_id(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_string())
    }
}

/// `name=value` of `--var`; the value may be empty or hold `=`.
fn parse_var(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err("expected NAME=VALUE".into()),
    }
}

/// Runs `berth job …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: JobArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        JobCommand::Run {
            file,
            format,
            vars,
            var_files,
            json,
            detach,
        } => {
            let req = run_request(&file, format, vars, &var_files)?;
            let job = watch::slow_call(
                "placing the job",
                "see `berth job status`",
                client.run_job(&req),
            )
            .await?;
            if json {
                return output::json(&job);
            }
            say!(
                "Job {} placed: {} alloc(s)",
                quoted(&job.id),
                job.allocs.len()
            )?;
            print_failures(&job)?;
            if job.allocs.is_empty() {
                return Ok(());
            }
            say!()?;
            print_allocs(&job)?;
            if detach || job.event_index.is_none() {
                return Ok(());
            }
            say!()?;
            say!("==> Following the job's allocs (Ctrl-C stops following; the job goes on)")?;
            watch::follow_job(&client, &job, watch::Until::Placed).await
        }
        JobCommand::Validate {
            file,
            format,
            vars,
            var_files,
        } => {
            let req = run_request(&file, format, vars, &var_files)?;
            validate(&req)
        }
        JobCommand::Plan {
            file,
            format,
            vars,
            var_files,
            json,
        } => {
            let req = run_request(&file, format, vars, &var_files)?;
            let plan = client.plan_job(&req).await?;
            if json {
                output::json(&plan)?;
            } else {
                print_plan(&plan)?;
            }
            if plan.placeable {
                Ok(())
            } else {
                Err(NotPlaceable(plan.job_id).into())
            }
        }
        JobCommand::Inspect { id } => output::json(&client.job_spec(&id).await?),
        JobCommand::Stop {
            id,
            purge,
            detach,
            json,
        } => {
            let job = if purge {
                client.purge_job(&id).await?
            } else {
                client.stop_job(&id).await?
            };
            if json {
                return output::json(&job);
            }
            say!(
                "Job {} stopped{}",
                quoted(&job.id),
                if purge {
                    "; it is purged once its allocs have stopped"
                } else {
                    ""
                }
            )?;
            if job.allocs.is_empty() {
                return Ok(());
            }
            say!()?;
            print_allocs(&job)?;
            // In a fleet the allocs stop on their own nodes (a lost node's never reports):
            // the stop is not followed there.
            if detach || job.event_index.is_none() || !job.placements.is_empty() {
                return Ok(());
            }
            say!()?;
            watch::follow_job(&client, &job, watch::Until::Stopped).await
        }
        JobCommand::Status { id: None, json, .. } => {
            let jobs = client.jobs().await?;
            if json {
                output::json(&jobs)
            } else {
                print_list(&jobs)
            }
        }
        JobCommand::Status {
            id: Some(id),
            json,
            short,
            verbose,
        } => {
            let job = client.job(&id).await?;
            if json {
                output::json(&job)
            } else {
                print_one(&job, short, verbose)
            }
        }
    }
}

/// The request for `berth job run`: the file's text (or standard input's, at most
/// [`input::MAX_INPUT_BYTES`]), its language and its name, the variables and the var files'
/// texts.
fn run_request(
    file: &str,
    format: Option<FormatArg>,
    vars: Vec<(String, String)>,
    var_files: &[String],
) -> anyhow::Result<JobRunRequest> {
    let (spec, format, name) = input::read_spec_arg(file, format)?;
    let var_files = var_files
        .iter()
        .map(|f| {
            let text = input::read_file_text(std::path::Path::new(f), "var file")?;
            Ok(VarFile {
                name: f.clone(),
                text,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(JobRunRequest {
        spec,
        format,
        file: Some(name),
        vars: vars
            .into_iter()
            .map(|(name, value)| JobVar { name, value })
            .collect(),
        var_files,
    })
}

/// `job plan` found the job cannot be placed (the reasons were printed): exit code 1.
#[derive(Debug, thiserror::Error)]
#[error("job {0:?} cannot be placed (see the reasons above)")]
pub struct NotPlaceable(pub String);

/// `berth job validate`: parses the spec here, as the agent would (without checking it
/// against a node), and prints what it would run.
fn validate(req: &JobRunRequest) -> anyhow::Result<()> {
    let file = std::path::PathBuf::from(req.file.clone().unwrap_or_else(|| "-".into()));
    let opts = berth_job::ParseOptions {
        vars: req
            .vars
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect(),
        var_files: req
            .var_files
            .iter()
            .map(|f| berth_job::VarFile {
                name: std::path::PathBuf::from(&f.name),
                text: f.text.clone(),
            })
            .collect(),
        ..Default::default()
    };
    let syntax = match req.format {
        berth_api::volumes::SpecFormat::Hcl => berth_input::Syntax::Hcl,
        berth_api::volumes::SpecFormat::Json => berth_input::Syntax::Json,
    };
    let spec = berth_job::JobSpec::parse_with(&file, &req.spec, syntax, &opts)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    say!(
        "Job {} is valid: {} job, {} group(s)",
        quoted(&spec.id),
        spec.job_type.as_str(),
        spec.groups.len()
    )?;
    for g in &spec.groups {
        let tasks: Vec<String> = g
            .tasks
            .iter()
            .map(|t| format!("{} ({})", t.name, t.driver))
            .collect();
        say!(
            "  group {}: count {}, tasks {}, volumes {}",
            quoted(&g.name),
            g.count,
            output::escape(&tasks.join(", ")),
            g.volumes.len()
        )?;
    }
    Ok(())
}

fn print_plan(plan: &berth_api::jobs::JobPlan) -> anyhow::Result<()> {
    if plan.placeable {
        say!(
            "Job {} ({}) can be placed: {} alloc(s)",
            quoted(&plan.job_id),
            plan.job_type,
            plan.allocs.len()
        )?;
        let rows: Vec<Vec<String>> = plan
            .allocs
            .iter()
            .map(|a| {
                vec![
                    a.group.clone(),
                    a.index.to_string(),
                    api_client::list(a.volumes.values().cloned().collect()),
                ]
            })
            .collect();
        if !rows.is_empty() {
            say!()?;
            output::table(&["GROUP", "INDEX", "VOLUMES"], &rows)?;
        }
        return Ok(());
    }
    say!("Job {} cannot be placed:", quoted(&plan.job_id))?;
    for f in &plan.failures {
        say!("  - {}", output::escape(f))?;
    }
    Ok(())
}

/// The statuses `berth job status` counts allocs in, in its columns' order.
const STATUSES: [&str; 4] = ["pending", "running", "complete", "failed"];

fn print_list(list: &JobList) -> anyhow::Result<()> {
    if list.jobs.is_empty() {
        say!("no jobs")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .jobs
        .iter()
        .map(|j| {
            let mut row = vec![j.id.clone(), j.job_type.clone(), yes_no(j.stopped).into()];
            row.extend(
                STATUSES
                    .iter()
                    .map(|s| j.allocs.get(*s).copied().unwrap_or(0).to_string()),
            );
            row
        })
        .collect();
    output::table(
        &[
            "ID", "TYPE", "STOPPED", "PENDING", "RUNNING", "COMPLETE", "FAILED",
        ],
        &rows,
    )
}

fn print_one(job: &JobStatus, short: bool, verbose: bool) -> anyhow::Result<()> {
    let mut fields = vec![
        ("id", job.id.clone()),
        ("type", job.job_type.clone()),
        ("stopped", yes_no(job.stopped).into()),
    ];
    if let Some(v) = job.version {
        fields.push(("version", v.to_string()));
    }
    output::fields(&fields)?;
    if short {
        return Ok(());
    }
    print_failures(job)?;
    say!()?;
    if job.allocs.is_empty() {
        say!("no allocs")?;
        return Ok(());
    }
    print_allocs(job)?;
    if verbose {
        print_tasks(job)?;
    }
    Ok(())
}

/// Each alloc's tasks with their state, restarts and last exit.
fn print_tasks(job: &JobStatus) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = job
        .allocs
        .iter()
        .flat_map(|a| {
            a.tasks.iter().map(|(name, t)| {
                vec![
                    a.alloc_id.clone(),
                    name.clone(),
                    t.state.to_string(),
                    t.restarts.to_string(),
                    t.last_exit.map_or_else(|| "-".into(), |e| e.to_string()),
                ]
            })
        })
        .collect();
    say!()?;
    if rows.is_empty() {
        return say!("no tasks");
    }
    output::table(&["ALLOC", "TASK", "STATE", "RESTARTS", "LAST EXIT"], &rows)
}

/// In a fleet: why groups were not placed.
fn print_failures(job: &JobStatus) -> anyhow::Result<()> {
    if job.failures.is_empty() {
        return Ok(());
    }
    say!()?;
    say!("Placement failures:")?;
    for f in &job.failures {
        say!("  {f}")?;
    }
    Ok(())
}

/// A table of allocs: ID, GROUP, INDEX, STATUS; in a fleet also NODE and DESIRED (with why
/// it was stopped).
fn print_allocs(job: &JobStatus) -> anyhow::Result<()> {
    let fleet = !job.placements.is_empty();
    let rows: Vec<Vec<String>> = job
        .allocs
        .iter()
        .map(|a: &AllocStatus| {
            let mut row = vec![
                a.alloc_id.clone(),
                a.group.clone(),
                a.index.to_string(),
                a.client_status.to_string(),
            ];
            if fleet {
                let p = job.placements.iter().find(|p| p.alloc_id == a.alloc_id);
                row.push(p.map_or_else(String::new, |p| {
                    if p.node_name.is_empty() {
                        p.node_id.clone()
                    } else {
                        p.node_name.clone()
                    }
                }));
                row.push(p.map_or_else(String::new, |p| match &p.stop_reason {
                    Some(why) => format!("{} ({why})", p.desired),
                    None => p.desired.clone(),
                }));
            }
            row
        })
        .collect();
    if fleet {
        output::table(
            &["ID", "GROUP", "INDEX", "STATUS", "NODE", "DESIRED"],
            &rows,
        )
    } else {
        output::table(&["ID", "GROUP", "INDEX", "STATUS"], &rows)
    }
}
