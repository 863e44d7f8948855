//! `berth acl …`: bootstrap the agent's ACLs and manage its tokens.

use std::time::SystemTime;

use berth_api::acl::{AclToken, NewToken, Policy};
use clap::{Args, Subcommand};

use crate::say;

use super::{
    api_client::{self, ago},
    output,
};

/// ACL tokens (agent config `acl { enabled = true }`).
#[derive(Debug, Args)]
pub struct AclArgs {
    #[command(subcommand)]
    command: AclCommand,
}

#[derive(Debug, Subcommand)]
enum AclCommand {
    /// Make the first management token; works once per agent. Prints its secret, which is
    /// not shown again.
    Bootstrap {
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Tokens: create, list, delete, self.
    Token(TokenArgs),
}

#[derive(Debug, Args)]
struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Make a token (needs management). Prints its secret, which is not shown again.
    Create {
        /// A name for people.
        #[arg(long)]
        name: String,
        /// A policy: read, job-operator, volume-operator or management; repeat for more.
        #[arg(long = "policy", value_name = "POLICY", required = true, value_parser = parse_policy)]
        policies: Vec<Policy>,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Every token, without secrets (needs management).
    List {
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Delete a token by its accessor id (needs management); its secret stops working.
    Delete {
        /// The token's accessor id.
        accessor: String,
    },
    /// The token this command sends (--token or BERTH_TOKEN).
    #[command(name = "self")]
    Own {
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse()
}

/// Runs `berth acl …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: AclArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        AclCommand::Bootstrap { json } => {
            let token = client.acl_bootstrap().await?;
            print_new(&token, json)
        }
        AclCommand::Token(TokenArgs { command }) => match command {
            TokenCommand::Create {
                name,
                policies,
                json,
            } => {
                let token = client.acl_create_token(&name, &policies).await?;
                print_new(&token, json)
            }
            TokenCommand::List { json } => {
                let list = client.acl_tokens().await?;
                if json {
                    return output::json(&list);
                }
                if list.tokens.is_empty() {
                    return say!("no ACL tokens");
                }
                let now = SystemTime::now();
                let rows: Vec<Vec<String>> = list
                    .tokens
                    .iter()
                    .map(|t| {
                        vec![
                            t.accessor_id.clone(),
                            t.name.clone(),
                            policies(&t.policies),
                            ago(t.create_time, now),
                        ]
                    })
                    .collect();
                output::table(&["ACCESSOR ID", "NAME", "POLICIES", "CREATED"], &rows)
            }
            TokenCommand::Delete { accessor } => {
                client.acl_delete_token(&accessor).await?;
                say!("deleted ACL token {}", output::escape(&accessor))
            }
            TokenCommand::Own { json } => {
                let token = client.acl_token_self().await?;
                if json {
                    output::json(&token)
                } else {
                    output::fields(&token_rows(&token))
                }
            }
        },
    }
}

fn policies(p: &[Policy]) -> String {
    p.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
}

fn token_rows(t: &AclToken) -> Vec<(&'static str, String)> {
    vec![
        ("accessor id", t.accessor_id.clone()),
        ("name", t.name.clone()),
        ("policies", policies(&t.policies)),
        ("created", ago(t.create_time, SystemTime::now())),
    ]
}

/// A token just made, with its secret: the one time it is shown.
fn print_new(token: &NewToken, json: bool) -> anyhow::Result<()> {
    if json {
        return output::json(token);
    }
    let mut rows = token_rows(&token.token);
    rows.insert(1, ("secret id", token.secret_id.expose().to_string()));
    output::fields(&rows)?;
    say!("the secret id is not shown again: keep it (berth --token, or BERTH_TOKEN)")
}
