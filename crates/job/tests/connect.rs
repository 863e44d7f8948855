//! Consul Connect in job specs: group `service` blocks, task `kind` and `identity` blocks, as
//! Nomad writes them; the tasks that need a Consul SI token; every rule's error with its field
//! and line.

use std::{path::Path, time::Duration};

use berth_job::*;

fn hcl(text: &str) -> Result<JobSpec, SpecError> {
    JobSpec::parse(Path::new("/jobs/connect.hcl"), text)
}

/// Nomad's Connect example, with the sidecar written out as a task (berth injects none).
const COUNTDASH: &str = r#"job "countdash" {
  group "api" {
    service {
      name = "count-api"
      port = "9001"
      tags = ["v1", "api"]

      connect {
        sidecar_service {}
      }

      identity {
        aud = ["consul.io"]
        ttl = "1h"
      }
    }

    task "web" {
      driver = "raw_exec"
      config {
        command = "/usr/local/bin/counting-service"
      }

      identity {
        env  = true
        file = true
      }

      identity {
        name          = "vault_default"
        aud           = ["vault.io"]
        file          = true
        filepath      = "local/vault.jwt"
        ttl           = "1h"
        change_mode   = "signal"
        change_signal = "sighup"
      }
    }

    task "connect-proxy-count-api" {
      driver = "raw_exec"
      kind   = "connect-proxy:count-api"
      config {
        command = "/usr/local/bin/envoy"
      }
    }
  }
}
"#;

/// The same job in HCL's JSON form.
const COUNTDASH_JSON: &str = r#"{"job": {"countdash": {"group": {"api": {
  "service": [{
    "name": "count-api",
    "port": "9001",
    "tags": ["v1", "api"],
    "connect": {"sidecar_service": {}},
    "identity": {"aud": ["consul.io"], "ttl": "1h"}
  }],
  "task": {
    "web": {
      "driver": "raw_exec",
      "config": {"command": "/usr/local/bin/counting-service"},
      "identity": [
        {"env": true, "file": true},
        {"name": "vault_default", "aud": ["vault.io"], "file": true,
         "filepath": "local/vault.jwt", "ttl": "1h", "change_mode": "signal",
         "change_signal": "sighup"}
      ]
    },
    "connect-proxy-count-api": {
      "driver": "raw_exec",
      "kind": "connect-proxy:count-api",
      "config": {"command": "/usr/local/bin/envoy"}
    }
  }
}}}}}"#;

#[test]
fn countdash_parses_into_the_model() {
    let spec = hcl(COUNTDASH).unwrap_or_else(|e| panic!("{e}"));
    let g = spec.group("api").unwrap();
    assert_eq!(
        g.services,
        [ServiceSpec {
            name: "count-api".into(),
            port: Some("9001".into()),
            tags: vec!["v1".into(), "api".into()],
            provider: ServiceProvider::Consul,
            connect: Some(ConnectSpec {
                native: false,
                sidecar_service: Some(SidecarService::default()),
            }),
            identity: Some(ServiceIdentity {
                aud: vec!["consul.io".into()],
                ttl: Some(Duration::from_secs(3600)),
            }),
        }]
    );
    let svc = g.service("count-api").unwrap();
    assert!(svc.has_sidecar() && !svc.is_connect_native());

    let proxy = g.task("connect-proxy-count-api").unwrap();
    assert_eq!(proxy.driver, "raw_exec");
    assert_eq!(proxy.kind, Some(TaskKind::ConnectProxy("count-api".into())));
    assert!(proxy.identities.is_empty());

    let web = g.task("web").unwrap();
    assert_eq!(web.kind, None);
    assert_eq!(
        web.identities,
        [
            WorkloadIdentity {
                name: DEFAULT_IDENTITY_NAME.into(),
                aud: vec![DEFAULT_IDENTITY_AUD.into()],
                env: true,
                file: true,
                filepath: None,
                ttl: None,
                change_mode: IdentityChangeMode::Noop,
                change_signal: None,
            },
            WorkloadIdentity {
                name: "vault_default".into(),
                aud: vec!["vault.io".into()],
                env: false,
                file: true,
                filepath: Some("local/vault.jwt".into()),
                ttl: Some(Duration::from_secs(3600)),
                change_mode: IdentityChangeMode::Signal,
                change_signal: Some("SIGHUP".into()),
            },
        ]
    );
    assert!(web.identities[0].is_default() && !web.identities[1].is_default());

    let from_json = JobSpec::parse(Path::new("/jobs/connect.json"), COUNTDASH_JSON)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_json, spec);
}

#[test]
fn stored_form_round_trips_and_older_records_read() {
    let spec = hcl(COUNTDASH).unwrap();
    let stored = serde_json::to_string(&spec).unwrap();
    assert!(
        stored.contains(r#""kind":"connect-proxy:count-api""#),
        "{stored}"
    );
    assert!(stored.contains(r#""ttl":"1h""#), "{stored}");
    let back: JobSpec = serde_json::from_str(&stored).unwrap();
    assert_eq!(back, spec);

    // A job without any of it stores none of the new fields, so older builds read it, and
    // what they stored reads back the same.
    let plain = hcl(&job("", "")).unwrap_or_else(|e| panic!("{e}"));
    let stored = serde_json::to_string(&plain).unwrap();
    for field in ["services", "kind", "identities"] {
        assert!(!stored.contains(&format!("\"{field}\"")), "{stored}");
    }
    assert_eq!(serde_json::from_str::<JobSpec>(&stored).unwrap(), plain);
}

#[test]
fn service_names_may_use_the_job_and_group_names() {
    let text = COUNTDASH
        .replace(
            "name = \"count-api\"",
            "name = \"${NOMAD_JOB_NAME}-${NOMAD_GROUP_NAME}\"",
        )
        .replace("connect-proxy:count-api", "connect-proxy:countdash-api");
    let spec = hcl(&text).unwrap_or_else(|e| panic!("{e}"));
    let g = &spec.groups[0];
    assert_eq!(g.services[0].name, "countdash-api");
    assert_eq!(
        g.consul_si_token_tasks(),
        [("countdash-api", "connect-proxy-count-api")]
    );
}

#[test]
fn si_token_tasks_are_the_connect_tasks_with_their_services() {
    let spec = hcl(COUNTDASH).unwrap();
    assert_eq!(
        spec.groups[0].consul_si_token_tasks(),
        [("count-api", "connect-proxy-count-api")]
    );

    let text = r#"job "mesh" {
  group "g" {
    service {
      name = "db"
      connect {
        sidecar_service {
          port = 21000
          tags = ["proxy"]
        }
      }
    }
    service {
      name = "native-api"
      port = "http"
      connect {
        native = true
      }
    }
    service {
      name     = "plain"
      provider = "consul"
    }
    task "app" {
      driver = "exec"
      config {
        command = "/bin/app"
      }
    }
    task "native" {
      driver = "exec"
      kind   = "connect-native:native-api"
      config {
        command = "/bin/native"
      }
    }
    task "db-proxy" {
      driver = "raw_exec"
      kind   = "connect-proxy:db"
      config {
        command = "envoy"
      }
    }
    task "gateway" {
      driver = "raw_exec"
      kind   = "connect-ingress:ingress-gw"
      config {
        command = "envoy"
      }
    }
  }
  group "none" {
    task "t" {
      driver = "exec"
      config {
        command = "true"
      }
    }
  }
}
"#;
    let spec = hcl(text).unwrap_or_else(|e| panic!("{e}"));
    let g = &spec.groups[0];
    assert_eq!(
        g.consul_si_token_tasks(),
        [
            ("native-api", "native"),
            ("db", "db-proxy"),
            ("ingress-gw", "gateway")
        ]
    );
    assert_eq!(
        g.service("db").unwrap().connect,
        Some(ConnectSpec {
            native: false,
            sidecar_service: Some(SidecarService {
                port: Some("21000".into()),
                tags: vec!["proxy".into()],
            }),
        })
    );
    assert!(g.service("native-api").unwrap().is_connect_native());
    assert_eq!(g.service("plain").unwrap().connect, None);
    assert!(
        g.task("gateway")
            .unwrap()
            .kind
            .as_ref()
            .unwrap()
            .is_gateway()
    );
    assert!(spec.groups[1].consul_si_token_tasks().is_empty());
    assert!(spec.groups[1].services.is_empty());
}

/// A group "g" holding `group` lines, with a task "app" holding `task` lines.
fn job(group: &str, task: &str) -> String {
    format!(
        r#"job "j" {{
  group "g" {{
{group}
    task "app" {{
      driver = "raw_exec"
      config {{
        command = "/bin/app"
      }}
{task}
    }}
  }}
}}
"#
    )
}

const SIDECAR: &str = r#"    service {
      name = "count-api"
      connect {
        sidecar_service {}
      }
    }
"#;

#[test]
fn every_rule_names_the_field_and_the_line() {
    let proxy = "      kind = \"connect-proxy:count-api\"\n";
    let identity = |body: &str| format!("      identity {{\n{body}      }}\n");
    // (spec, field, text on the reported line, what the message says)
    let cases: Vec<(String, &str, &str, &str)> = vec![
        // kind
        (
            job("", proxy),
            "job.group[g].task[app].kind",
            "kind =",
            "connect-proxy:count-api: the group has no service \"count-api\" (the group has no \
             service block); add service { name = \"count-api\" connect { sidecar_service {} } }",
        ),
        (
            job(
                "    service {\n      name = \"other\"\n      connect {\n        sidecar_service {}\n      }\n    }\n",
                proxy,
            ),
            "job.group[g].task[app].kind",
            "kind =",
            "the group has no service \"count-api\" (the group's services: \"other\")",
        ),
        (
            job("    service {\n      name = \"count-api\"\n    }\n", proxy),
            "job.group[g].task[app].kind",
            "kind =",
            "connect-proxy:count-api: service \"count-api\" has no connect { sidecar_service {} } block",
        ),
        (
            job(SIDECAR, "      kind = \"connect-native:count-api\"\n"),
            "job.group[g].task[app].kind",
            "kind =",
            "service \"count-api\" has no connect { native = true } block",
        ),
        (
            job(SIDECAR, "      kind = \"sidecar:count-api\"\n"),
            "job.group[g].task[app].kind",
            "kind =",
            "unknown kind \"sidecar:count-api\" (expected connect-proxy:<service>",
        ),
        (
            job(SIDECAR, "      kind = \"connect-proxy\"\n"),
            "job.group[g].task[app].kind",
            "kind =",
            "unknown kind \"connect-proxy\"",
        ),
        (
            job(SIDECAR, "      kind = \"connect-proxy:\"\n"),
            "job.group[g].task[app].kind",
            "kind =",
            "connect-proxy: names no service (connect-proxy:<service>)",
        ),
        (
            job(SIDECAR, "      kind = \"connect-mesh:a_b\"\n"),
            "job.group[g].task[app].kind",
            "kind =",
            "connect-mesh:<service>: \"a_b\" is not a service name",
        ),
        (
            job(SIDECAR, "      kind = 3\n"),
            "job.group[g].task[app].kind",
            "kind =",
            "expected a string, found a number",
        ),
        (
            job(SIDECAR, proxy).replace(
                "  }\n}\n",
                "    task \"again\" {\n      driver = \"raw_exec\"\n      kind   = \"connect-proxy:count-api\"\n      config {\n        command = \"envoy\"\n      }\n    }\n  }\n}\n",
            ),
            "job.group[g].task[again].kind",
            "kind   =",
            "task \"app\" is already the proxy of service \"count-api\"",
        ),
        // services
        (
            job(&format!("{SIDECAR}{SIDECAR}"), ""),
            "job.group[g].service[1]",
            "service {\n      name = \"count-api\"\n      connect {\n        sidecar_service {}\n      }\n    }\n\n",
            "duplicate service name \"count-api\" (first at line 3)",
        ),
        (
            job("    service {\n      port = \"http\"\n    }\n", ""),
            "job.group[g].service[0].name",
            "service {",
            "is required",
        ),
        (
            job("    service {\n      name = \"count_api\"\n    }\n", ""),
            "job.group[g].service[0].name",
            "name = \"count_api\"",
            "\"count_api\" is not a service name: ASCII letters, digits and dashes",
        ),
        (
            job("    service {\n      name = \"-api\"\n    }\n", ""),
            "job.group[g].service[0].name",
            "name = \"-api\"",
            "is not a service name",
        ),
        (
            job(&format!("    service {{\n      name = \"{}\"\n    }}\n", "a".repeat(64)), ""),
            "job.group[g].service[0].name",
            "name = \"aaa",
            "is 64 characters long; a service name has at most 63",
        ),
        (
            job("    service {\n      name = \"${NOMAD_TASK_NAME}-api\"\n    }\n", ""),
            "job.group[g].service[0].name",
            "name = \"${NOMAD_TASK_NAME}",
            "unknown variable NOMAD_TASK_NAME (a group service belongs to no task): a service \
             name may use ${NOMAD_JOB_NAME} and ${NOMAD_GROUP_NAME}",
        ),
        (
            job("    service {\n      name = \"${NOMAD_ALLOC_ID}\"\n    }\n", ""),
            "job.group[g].service[0].name",
            "name = \"${NOMAD_ALLOC_ID}",
            "unknown variable NOMAD_ALLOC_ID (not known here)",
        ),
        (
            job("    service {\n      name = \"api\"\n      port = \"\"\n    }\n", ""),
            "job.group[g].service[0].port",
            "port = \"\"",
            "\"\" is not a port label or number",
        ),
        (
            job("    service {\n      name = \"api\"\n      port = 70000\n    }\n", ""),
            "job.group[g].service[0].port",
            "port = 70000",
            "70000 is not a port number (1 to 65535)",
        ),
        (
            job("    service {\n      name = \"api\"\n      provider = \"etcd\"\n    }\n", ""),
            "job.group[g].service[0].provider",
            "provider = \"etcd\"",
            "unknown provider \"etcd\" (expected consul or nomad)",
        ),
        (
            job(&SIDECAR.replace("connect {", "provider = \"nomad\"\n      connect {"), ""),
            "job.group[g].service[0].connect",
            "connect {",
            "Connect needs provider \"consul\", and this service's provider is \"nomad\"",
        ),
        (
            job(&format!("{SIDECAR}    service {{\n      name = \"n\"\n      provider = \"nomad\"\n    }}\n"), ""),
            "job.group[g].service[1].provider",
            "provider = \"nomad\"",
            "is \"nomad\", but service \"count-api\" uses \"consul\": the services of a group share one provider",
        ),
        (
            job("    service {\n      name = \"api\"\n      connect {\n      }\n    }\n", ""),
            "job.group[g].service[0].connect",
            "connect {",
            "needs a sidecar_service { … } block (a sidecar proxy fronts the service) or native = true",
        ),
        (
            job(&SIDECAR.replace("connect {", "connect {\n        native = true"), ""),
            "job.group[g].service[0].connect.native",
            "native = true",
            "native = true and a sidecar_service block exclude each other",
        ),
        (
            job(&SIDECAR.replace("sidecar_service {}", "sidecar_service {\n          proxy {}\n        }"), ""),
            "job.group[g].service[0].connect.sidecar_service.proxy",
            "proxy {}",
            "unknown field; expected one of: port, tags",
        ),
        (
            job(&SIDECAR.replace("connect {", "check {\n      }\n      connect {"), ""),
            "job.group[g].service[0].check",
            "check {",
            "unknown field; expected one of: name, port, tags, provider, connect, identity",
        ),
        (
            job(&SIDECAR.replace("connect {", "identity {\n        ttl = \"soon\"\n      }\n      connect {"), ""),
            "job.group[g].service[0].identity.ttl",
            "ttl = \"soon\"",
            "\"soon\" is not a duration",
        ),
        (
            job(&SIDECAR.replace("connect {", "identity {\n        aud = [\n          \"consul.io\",\n          \"\",\n        ]\n      }\n      connect {"), ""),
            "job.group[g].service[0].identity.aud[1]",
            "\"\",",
            "is empty: an audience is a non-empty string",
        ),
        (
            job(&SIDECAR.replace("connect {", "identity {\n        env = true\n      }\n      connect {"), ""),
            "job.group[g].service[0].identity.env",
            "env = true",
            "unknown field; expected one of: aud, ttl",
        ),
        // task identities
        (
            job("", &format!("{}{}", identity("        env = true\n"), identity("        file = true\n"))),
            "job.group[g].task[app].identity[1]",
            "identity {\n        file",
            "duplicate identity name \"default\" (first at line 9); only one identity block may \
             leave out name",
        ),
        (
            job("", &format!(
                "{}{}",
                identity("        name = \"vault_default\"\n        aud = [\"vault.io\"]\n"),
                identity("        name = \"vault_default\"\n        aud = [\"other\"]\n")
            )),
            "job.group[g].task[app].identity[1]",
            "identity {\n        name = \"vault_default\"\n        aud = [\"other\"]",
            "duplicate identity name \"vault_default\" (first at line 9)",
        ),
        (
            job("", "      identity \"vault_default\" {\n        aud = [\"vault.io\"]\n      }\n"),
            "job.group[g].task[app].identity",
            "identity \"vault_default\"",
            "takes no label: name the identity inside the block, identity { name = \"vault_default\" … }",
        ),
        (
            job("", &identity("        name = \"vault.x\"\n")),
            "job.group[g].task[app].identity[0].name",
            "name = \"vault.x\"",
            "invalid identity name \"vault.x\": 1 to 128 ASCII letters, digits, '-' and '_'",
        ),
        (
            job("", &identity("        name = \"v\"\n        ttl = \"1 hour\"\n")),
            "job.group[g].task[app].identity[0].ttl",
            "ttl = \"1 hour\"",
            "\"1 hour\" is not a duration: ",
        ),
        (
            job("", &identity("        name = \"v\"\n        ttl = \"0s\"\n")),
            "job.group[g].task[app].identity[0].ttl",
            "ttl = \"0s\"",
            "must be more than 0",
        ),
        (
            job("", &identity("        ttl = \"1h\"\n")),
            "job.group[g].task[app].identity[0].ttl",
            "ttl = \"1h\"",
            "the default identity takes no ttl",
        ),
        (
            job("", &identity("        name = \"v\"\n        aud = [\"a\", \"\"]\n")),
            "job.group[g].task[app].identity[0].aud[1]",
            "aud = [\"a\", \"\"]",
            "is empty: an audience is a non-empty string",
        ),
        (
            job("", &identity("        aud = [\"vault.io\"]\n")),
            "job.group[g].task[app].identity[0].aud",
            "aud = [\"vault.io\"]",
            "the default identity's audience is always \"nomadproject.io\"",
        ),
        (
            job("", &identity("        name = \"v\"\n        secret = true\n        colour = 1\n")),
            "job.group[g].task[app].identity[0].secret",
            "secret = true",
            "unknown field (also unknown: \"colour\"); expected one of: name, aud, env, file, \
             filepath, ttl, change_mode, change_signal",
        ),
        (
            job("", &identity("        name = \"v\"\n        env = \"yes\"\n")),
            "job.group[g].task[app].identity[0].env",
            "env = \"yes\"",
            "expected true or false, found a string",
        ),
        (
            job("", &identity("        name = \"v\"\n        change_mode = \"signal\"\n")),
            "job.group[g].task[app].identity[0].change_mode",
            "change_mode = \"signal\"",
            "\"signal\" needs change_signal",
        ),
        (
            job("", &identity("        name = \"v\"\n        change_signal = \"SIGHUP\"\n")),
            "job.group[g].task[app].identity[0].change_signal",
            "change_signal = \"SIGHUP\"",
            "goes with change_mode = \"signal\" only",
        ),
        (
            job("", &identity("        name = \"v\"\n        change_mode = \"signal\"\n        change_signal = \"HUP\"\n")),
            "job.group[g].task[app].identity[0].change_signal",
            "change_signal = \"HUP\"",
            "\"HUP\" is not a signal name such as \"SIGHUP\"",
        ),
        (
            job("", &identity("        name = \"v\"\n        change_mode = \"reload\"\n")),
            "job.group[g].task[app].identity[0].change_mode",
            "change_mode = \"reload\"",
            "unknown change mode \"reload\" (expected noop, restart or signal)",
        ),
        (
            job("", &identity("        name = \"v\"\n        filepath = \"local/v.jwt\"\n")),
            "job.group[g].task[app].identity[0].filepath",
            "filepath = ",
            "goes with file = true only",
        ),
        (
            job("", &identity("        name = \"v\"\n        file = true\n        filepath = \"../v.jwt\"\n")),
            "job.group[g].task[app].identity[0].filepath",
            "filepath = ",
            "must not contain \"..\"",
        ),
        (
            job("", &identity("        name = \"v\"\n        file = true\n        filepath = \"/v.jwt\"\n")),
            "job.group[g].task[app].identity[0].filepath",
            "filepath = ",
            "must be a path relative to the task's directory",
        ),
        // where the blocks go
        (
            job("", &SIDECAR.replace("    ", "  ")),
            "job.group[g].task[app].service",
            "  service {\n    name",
            "unknown field; expected one of: config, env",
        ),
        (
            job(&identity("        env = true\n"), ""),
            "job.group[g].identity",
            "identity {",
            "unknown field",
        ),
    ];
    for (text, field, needle, what) in cases {
        let e = match hcl(&text) {
            Ok(s) => panic!("{text}\nparsed: {s:?}"),
            Err(e) => e,
        };
        let shown = e.to_string();
        assert_eq!(e.field, field, "{text}\n{shown}");
        let at = text
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in\n{text}"));
        let want_line = text[..at].matches('\n').count() + 1;
        assert_eq!(e.line, Some(want_line), "{text}\n{shown}");
        let prefix = format!("/jobs/connect.hcl:{want_line}: {field}: ");
        assert!(shown.starts_with(&prefix), "{shown}\nshould start {prefix}");
        assert!(shown.contains(what), "{text}\n{shown}\nshould say {what:?}");
    }
}

#[test]
fn json_errors_name_the_field() {
    let cases = [
        (
            r#"{"job": {"j": {"group": {"g": {"task": {"t": {"driver": "exec", "kind": "connect-proxy:api", "config": {"command": "x"}}}}}}}}"#,
            "job.group[g].task[t].kind",
            "the group has no service \"api\"",
        ),
        (
            r#"{"job": {"j": {"group": {"g": {"service": [{"name": "a"}, {"name": "a"}], "task": {"t": {"driver": "exec", "config": {"command": "x"}}}}}}}}"#,
            "job.group[g].service[1]",
            "duplicate service name \"a\"",
        ),
        (
            r#"{"job": {"j": {"group": {"g": {"task": {"t": {"driver": "exec", "config": {"command": "x"}, "identity": {"vault_default": {"aud": ["v"]}}}}}}}}}"#,
            "job.group[g].task[t].identity[0].vault_default",
            "unknown field",
        ),
    ];
    for (text, field, what) in cases {
        let e = JobSpec::parse(Path::new("/jobs/j.json"), text).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert_eq!(e.line, None, "{e}");
        assert!(e.to_string().contains(what), "{e}\nshould say {what:?}");
    }
}

#[test]
fn every_problem_is_reported_once() {
    // A broken service is reported for itself; the proxy of it is not reported again.
    let text = job(
        &SIDECAR.replace(
            "name = \"count-api\"",
            "name = \"count-api\"\n      tags = 1",
        ),
        "      kind = \"connect-proxy:count-api\"\n      identity {\n        name = \"v\"\n        ttl = \"x\"\n      }\n",
    );
    let errors = JobSpec::parse_with(
        Path::new("/jobs/connect.hcl"),
        &text,
        berth_input::Syntax::Hcl,
        &ParseOptions::default(),
    )
    .unwrap_err();
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "job.group[g].service[0].tags",
            "job.group[g].task[app].identity[0].ttl"
        ],
        "{errors}"
    );
}
