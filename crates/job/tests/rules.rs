//! A job's and a group's placement rules (`constraint`, `affinity`, `spread`), `priority`,
//! `datacenters` and `system` jobs: every operator spelling and short form, the distinct forms,
//! weights and percents, references, the JSON form, the stored form, and every problem with its
//! field and line, several at once.

use std::path::Path;

use berth_devices::request::Operand;
use berth_input::Syntax;
use berth_job::{
    JobSpec, JobType, NodeKeys, ParseOptions, SpecErrors,
    rules::{
        DEFAULT_PRIORITY, DEFAULT_SPREAD_WEIGHT, NodeAffinity, NodeConstraint, Rules, Spread,
        SpreadTarget,
    },
};

fn parse(text: &str) -> Result<JobSpec, SpecErrors> {
    JobSpec::parse_with(
        Path::new("/jobs/rules.hcl"),
        text,
        Syntax::Hcl,
        &ParseOptions::default(),
    )
}

fn json(text: &str) -> Result<JobSpec, SpecErrors> {
    JobSpec::parse_with(
        Path::new("/jobs/rules.json"),
        text,
        Syntax::Json,
        &ParseOptions::default(),
    )
}

fn ok(text: &str) -> JobSpec {
    parse(text).unwrap_or_else(|e| panic!("{text}\n{e}"))
}

/// A job "j" with `job_body` in the job block and `group_body` in its one group "web".
fn job(job_body: &str, group_body: &str) -> String {
    format!(
        "job \"j\" {{\n{job_body}  group \"web\" {{\n{group_body}    task \"app\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/app\"\n      }}\n    }}\n  }}\n}}\n"
    )
}

/// A `kind` block (`constraint`, `affinity`, `spread`) at job level holding `body` lines.
fn at_job(kind: &str, body: &str) -> String {
    job(&format!("  {kind} {{\n{body}  }}\n"), "")
}

/// The same in the group.
fn at_group(kind: &str, body: &str) -> String {
    job("", &format!("    {kind} {{\n{body}    }}\n"))
}

/// The 1-based line of the first line holding `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} is in\n{text}"))
        + 1
}

/// `text` fails with exactly these problems: (field, text on the line, what the message says).
fn fails(text: &str, want: &[(&str, &str, &str)]) {
    let errors = match parse(text) {
        Ok(s) => panic!("{text}\nparsed: {s:?}"),
        Err(e) => e,
    };
    let got: Vec<_> = errors.iter().collect();
    assert_eq!(got.len(), want.len(), "{text}\n{errors}");
    for (e, (field, needle, what)) in got.iter().zip(want) {
        assert_eq!(e.field, *field, "{text}\n{errors}");
        assert_eq!(e.line, Some(line_of(text, needle)), "{text}\n{errors}");
        assert!(e.message.contains(what), "{e}\nshould say {what:?}");
        let shown = e.to_string();
        let prefix = format!("/jobs/rules.hcl:{}: {field}: ", line_of(text, needle));
        assert!(shown.starts_with(&prefix), "{shown}\nshould start {prefix}");
    }
}

fn attribute(attribute: &str, operator: Operand, value: &str) -> NodeConstraint {
    NodeConstraint::Attribute {
        attribute: attribute.into(),
        operator,
        value: value.into(),
    }
}

fn affinity(attribute: &str, operator: Operand, value: &str, weight: i8) -> NodeAffinity {
    NodeAffinity {
        attribute: attribute.into(),
        operator,
        value: value.into(),
        weight,
    }
}

/// Nomad's documented examples, at job and group level.
const NOMAD_STYLE: &str = r#"job "docs" {
  type        = "service"
  priority    = 80
  datacenters = ["us-east-1", "eu-*", "dc?"]

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  constraint {
    attribute = "${meta.my_custom_value}"
    operator  = ">"
    value     = "3"
  }

  affinity {
    attribute = "${node.datacenter}"
    value     = "us-west1"
    weight    = 100
  }

  spread {
    attribute = "${node.datacenter}"
    weight    = 100

    target "us-east1" {
      percent = 60
    }

    target "us-west1" {
      percent = 40
    }
  }

  group "example" {
    count = 3

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    constraint {
      distinct_property = "${meta.rack}"
      value             = "2"
    }

    affinity {
      attribute = "${meta.rack}"
      operator  = "regexp"
      value     = "^r[0-9]+$"
      weight    = -50
    }

    spread {
      attribute = "${meta.rack}"
    }

    task "server" {
      driver = "exec"
      config {
        command = "/bin/server"
      }
    }
  }
}
"#;

fn nomad_style_expected() -> (Rules, Rules) {
    let job = Rules {
        constraints: vec![
            attribute("${attr.kernel.name}", Operand::Equal, "linux"),
            attribute("${meta.my_custom_value}", Operand::Greater, "3"),
        ],
        affinities: vec![affinity(
            "${node.datacenter}",
            Operand::Equal,
            "us-west1",
            100,
        )],
        spreads: vec![Spread {
            attribute: "${node.datacenter}".into(),
            weight: 100,
            targets: vec![
                SpreadTarget {
                    value: "us-east1".into(),
                    percent: 60,
                },
                SpreadTarget {
                    value: "us-west1".into(),
                    percent: 40,
                },
            ],
        }],
    };
    let group = Rules {
        constraints: vec![
            NodeConstraint::DistinctHosts,
            NodeConstraint::DistinctProperty {
                attribute: "${meta.rack}".into(),
                limit: 2,
            },
        ],
        affinities: vec![affinity("${meta.rack}", Operand::Regexp, "^r[0-9]+$", -50)],
        spreads: vec![Spread {
            attribute: "${meta.rack}".into(),
            weight: DEFAULT_SPREAD_WEIGHT,
            targets: vec![],
        }],
    };
    (job, group)
}

/// [`NOMAD_STYLE`] in HCL's JSON form, blocks written both ways (an object, a list of them).
const NOMAD_STYLE_JSON: &str = r#"{
  "job": {
    "docs": {
      "type": "service",
      "priority": 80,
      "datacenters": ["us-east-1", "eu-*", "dc?"],
      "constraint": [
        { "attribute": "${attr.kernel.name}", "value": "linux" },
        { "attribute": "${meta.my_custom_value}", "operator": ">", "value": "3" }
      ],
      "affinity": { "attribute": "${node.datacenter}", "value": "us-west1", "weight": 100 },
      "spread": [
        {
          "attribute": "${node.datacenter}",
          "weight": 100,
          "target": [
            { "us-east1": { "percent": 60 } },
            { "us-west1": { "percent": 40 } }
          ]
        }
      ],
      "group": {
        "example": {
          "count": 3,
          "constraint": [
            { "operator": "distinct_hosts", "value": "true" },
            { "distinct_property": "${meta.rack}", "value": 2 }
          ],
          "affinity": [
            { "attribute": "${meta.rack}", "operator": "regexp", "value": "^r[0-9]+$", "weight": -50 }
          ],
          "spread": { "attribute": "${meta.rack}" },
          "task": {
            "server": { "driver": "exec", "config": { "command": "/bin/server" } }
          }
        }
      }
    }
  }
}"#;

#[test]
fn nomad_style_rules_priority_and_datacenters_are_kept_from_hcl_and_json() {
    let (job_rules, group_rules) = nomad_style_expected();
    let from_hcl = ok(NOMAD_STYLE);
    assert_eq!(from_hcl.priority, 80);
    assert_eq!(from_hcl.datacenters, ["us-east-1", "eu-*", "dc?"]);
    assert_eq!(from_hcl.rules, job_rules);
    assert_eq!(from_hcl.groups[0].rules, group_rules);

    let from_json = json(NOMAD_STYLE_JSON).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_json, from_hcl);
}

#[test]
fn rules_round_trip_through_the_stored_form() {
    let spec = ok(NOMAD_STYLE);
    let stored = serde_json::to_value(&spec).unwrap();
    assert_eq!(stored["priority"], 80);
    assert_eq!(
        stored["rules"]["constraints"][0],
        serde_json::json!({
            "kind": "attribute",
            "attribute": "${attr.kernel.name}",
            "operator": "equal",
            "value": "linux",
        })
    );
    assert_eq!(
        stored["groups"][0]["rules"]["constraints"][1],
        serde_json::json!({ "kind": "distinct_property", "attribute": "${meta.rack}", "limit": 2 })
    );
    let back: JobSpec = serde_json::from_value(stored.clone()).unwrap();
    assert_eq!(back, spec);
    let text = serde_json::to_string(&spec).unwrap();
    assert_eq!(serde_json::from_str::<JobSpec>(&text).unwrap(), spec);

    // A spec stored before these fields loads with their defaults; empty rules are not written.
    let plain = ok(&job("", ""));
    let stored = serde_json::to_value(&plain).unwrap();
    assert!(stored.get("rules").is_none(), "{stored}");
    assert!(stored["groups"][0].get("rules").is_none(), "{stored}");
    assert!(stored.get("datacenters").is_none(), "{stored}");
    let mut old = stored;
    old.as_object_mut().unwrap().remove("priority");
    let old: JobSpec = serde_json::from_value(old).unwrap();
    assert_eq!(old.priority, DEFAULT_PRIORITY);
    assert_eq!(old, plain);
}

#[test]
fn priority_and_datacenters() {
    let spec = ok(&job("  priority = 100\n  datacenters = [\"*\"]\n", ""));
    assert_eq!(
        (spec.priority, spec.datacenters.as_slice()),
        (100, &["*".to_string()][..])
    );
    let spec = ok(&job("  priority = 1\n", ""));
    assert_eq!(spec.priority, 1);
    let spec = ok(&job("", ""));
    assert_eq!(spec.priority, DEFAULT_PRIORITY);
    assert!(spec.datacenters.is_empty());

    fails(
        &job("  priority = 101\n", ""),
        &[("job.priority", "priority", "101 is more than 100")],
    );
    fails(
        &job("  datacenters = [\"dc1\", \"\"]\n", ""),
        &[("job.datacenters[1]", "datacenters", "is empty")],
    );
    fails(
        &job("  datacenters = \"dc1\"\n", ""),
        &[(
            "job.datacenters",
            "datacenters",
            "expected a list of strings",
        )],
    );
}

#[test]
fn system_jobs() {
    let spec = ok(&job("  type = \"system\"\n", ""));
    assert_eq!(spec.job_type, JobType::System);
    assert_eq!(spec.groups[0].count, 1);
    let spec = ok(&job(
        "  type = \"system\"\n  constraint {\n    distinct_hosts = true\n  }\n",
        "    count = 1\n",
    ));
    assert_eq!(spec.rules.constraints, [NodeConstraint::DistinctHosts]);

    fails(
        &job("  type = \"system\"\n", "    count = 2\n"),
        &[(
            "job.group[web].count",
            "count = 2",
            "is 2, but count cannot exceed 1 with the system scheduler",
        )],
    );
    // As in Nomad, a system job takes no affinity or spread, at either level.
    let text = job(
        "  type = \"system\"\n  affinity {\n    attribute = \"${node.class}\"\n    value = \"big\"\n  }\n",
        "    spread {\n      attribute = \"${node.datacenter}\"\n    }\n",
    );
    fails(
        &text,
        &[
            (
                "job.affinity[0]",
                "affinity {",
                "a system job takes no affinity block",
            ),
            (
                "job.group[web].spread[0]",
                "spread {",
                "a system job takes no spread block",
            ),
        ],
    );
    fails(
        &job("  type = \"sysbatch\"\n", ""),
        &[(
            "job.type",
            "sysbatch",
            "berth runs service, batch and system jobs only",
        )],
    );
}

#[test]
fn every_operator_spelling() {
    let spellings = [
        ("=", Operand::Equal),
        ("==", Operand::Equal),
        ("is", Operand::Equal),
        ("!=", Operand::NotEqual),
        ("not", Operand::NotEqual),
        ("<", Operand::Less),
        ("<=", Operand::LessOrEqual),
        (">", Operand::Greater),
        (">=", Operand::GreaterOrEqual),
        ("regexp", Operand::Regexp),
        ("version", Operand::Version),
        ("semver", Operand::Semver),
        ("set_contains", Operand::SetContains),
        ("set_contains_all", Operand::SetContainsAll),
        ("set_contains_any", Operand::SetContainsAny),
    ];
    for (spelling, operand) in spellings {
        let value = match operand {
            Operand::Version | Operand::Semver => ">= 1.2.0, < 2.0.0",
            _ => "a,b",
        };
        let body = format!(
            "    attribute = \"${{attr.x}}\"\n    operator = \"{spelling}\"\n    value = \"{value}\"\n"
        );
        let c = ok(&at_job("constraint", &body));
        assert_eq!(
            c.rules.constraints,
            [attribute("${attr.x}", operand, value)],
            "{spelling}"
        );
        let a = ok(&at_job("affinity", &body));
        assert_eq!(
            a.rules.affinities,
            [affinity("${attr.x}", operand, value, 50)],
            "{spelling}"
        );
    }
    for (spelling, operand) in [
        ("is_set", Operand::IsSet),
        ("is_not_set", Operand::IsNotSet),
    ] {
        let body =
            format!("      attribute = \"${{meta.gpu}}\"\n      operator = \"{spelling}\"\n");
        let spec = ok(&at_group("constraint", &body));
        assert_eq!(
            spec.groups[0].rules.constraints,
            [attribute("${meta.gpu}", operand, "")]
        );
        // Constraints only.
        let text = at_group("affinity", &body);
        fails(
            &text,
            &[(
                "job.group[web].affinity[0].operator",
                "operator",
                &format!("{spelling} applies to constraints only, not to affinities"),
            )],
        );
        // No value.
        let text = at_group("constraint", &format!("{body}      value = \"x\"\n"));
        fails(
            &text,
            &[(
                "job.group[web].constraint[0].value",
                "value",
                &format!("{spelling} takes no value"),
            )],
        );
    }
    // The operator defaults to `=`; numbers and bools are text.
    let spec = ok(&at_job(
        "constraint",
        "    attribute = \"${meta.tier}\"\n    value = 3\n",
    ));
    assert_eq!(
        spec.rules.constraints,
        [attribute("${meta.tier}", Operand::Equal, "3")]
    );
}

#[test]
fn short_forms_stand_for_operator_and_value() {
    let forms = [
        ("regexp", "^eu-", Operand::Regexp),
        ("version", "~> 1.2", Operand::Version),
        ("semver", ">= 1.2.0", Operand::Semver),
        ("set_contains", "a,b", Operand::SetContains),
        ("set_contains_all", "a", Operand::SetContainsAll),
        ("set_contains_any", "a,c", Operand::SetContainsAny),
    ];
    for (key, value, operand) in forms {
        let body = format!("      attribute = \"${{attr.os.name}}\"\n      {key} = \"{value}\"\n");
        let spec = ok(&at_group("constraint", &body));
        assert_eq!(
            spec.groups[0].rules.constraints,
            [attribute("${attr.os.name}", operand, value)],
            "{key}"
        );
        let spec = ok(&at_group(
            "affinity",
            &format!("{body}      weight = -10\n"),
        ));
        assert_eq!(
            spec.groups[0].rules.affinities,
            [affinity("${attr.os.name}", operand, value, -10)],
            "{key}"
        );
        // Not next to operator or value.
        let text = at_group("constraint", &format!("{body}      operator = \"=\"\n"));
        fails(
            &text,
            &[(
                &format!("job.group[web].constraint[0].{key}"),
                &format!("{key} ="),
                &format!("{key} = \"…\" is short for operator = \"{key}\" and value = \"…\""),
            )],
        );
    }
}

#[test]
fn distinct_hosts_in_both_forms() {
    for body in [
        "    distinct_hosts = true\n",
        "    operator = \"distinct_hosts\"\n",
        "    operator = \"distinct_hosts\"\n    value = \"true\"\n",
        "    operator = \"distinct_hosts\"\n    value = true\n",
    ] {
        let spec = ok(&at_job("constraint", body));
        assert_eq!(
            spec.rules.constraints,
            [NodeConstraint::DistinctHosts],
            "{body}"
        );
    }
    // false: no constraint at all, as in Nomad.
    let spec = ok(&at_group("constraint", "      distinct_hosts = false\n"));
    assert!(spec.groups[0].rules.is_empty());

    let text = at_job(
        "constraint",
        "    distinct_hosts = true\n    attribute = \"${node.unique.id}\"\n",
    );
    fails(
        &text,
        &[(
            "job.constraint[0].distinct_hosts",
            "distinct_hosts",
            "stands for a whole constraint: give it alone",
        )],
    );
    let text = at_job(
        "constraint",
        "    operator = \"distinct_hosts\"\n    attribute = \"${node.unique.id}\"\n",
    );
    fails(
        &text,
        &[(
            "job.constraint[0].attribute",
            "attribute",
            "distinct_hosts takes no attribute",
        )],
    );
    let text = at_job(
        "constraint",
        "    operator = \"distinct_hosts\"\n    value = \"yes\"\n",
    );
    fails(
        &text,
        &[(
            "job.constraint[0].value",
            "value",
            "distinct_hosts takes no value but \"true\", found \"yes\"",
        )],
    );
    let text = at_job("constraint", "    distinct_hosts = \"true\"\n");
    fails(
        &text,
        &[(
            "job.constraint[0].distinct_hosts",
            "distinct_hosts",
            "expected true or false, found a string",
        )],
    );
    let text = at_job(
        "constraint",
        "    distinct_hosts = true\n    distinct_property = \"${meta.rack}\"\n",
    );
    fails(
        &text,
        &[(
            "job.constraint[0].distinct_property",
            "distinct_property",
            "give distinct_hosts or distinct_property, not both",
        )],
    );
}

#[test]
fn distinct_property_with_and_without_a_limit() {
    let cases = [
        ("    distinct_property = \"${meta.rack}\"\n", 1),
        (
            "    distinct_property = \"${meta.rack}\"\n    value = \"3\"\n",
            3,
        ),
        (
            "    distinct_property = \"${meta.rack}\"\n    value = 2\n",
            2,
        ),
        (
            "    operator = \"distinct_property\"\n    attribute = \"${meta.rack}\"\n",
            1,
        ),
        (
            "    operator = \"distinct_property\"\n    attribute = \"${meta.rack}\"\n    value = 4\n",
            4,
        ),
    ];
    for (body, limit) in cases {
        let spec = ok(&at_job("constraint", body));
        assert_eq!(
            spec.rules.constraints,
            [NodeConstraint::DistinctProperty {
                attribute: "${meta.rack}".into(),
                limit
            }],
            "{body}"
        );
    }
    let bad = [
        (
            "    distinct_property = \"${meta.rack}\"\n    value = 0\n",
            "job.constraint[0].value",
            "value",
            "must be at least 1",
        ),
        (
            "    distinct_property = \"${meta.rack}\"\n    value = \"two\"\n",
            "job.constraint[0].value",
            "value",
            "\"two\" is not a whole number",
        ),
        (
            "    distinct_property = \"${meta.rack}\"\n    value = 1.5\n",
            "job.constraint[0].value",
            "value",
            "\"1.5\" is not a whole number",
        ),
        (
            "    operator = \"distinct_property\"\n",
            "job.constraint[0].attribute",
            "constraint {",
            "is required by distinct_property",
        ),
        (
            "    distinct_property = \"${meta.rack}\"\n    operator = \"=\"\n",
            "job.constraint[0].operator",
            "operator",
            "give one form, not both",
        ),
        (
            "    distinct_property = \"${meta.rack}\"\n    attribute = \"${meta.row}\"\n",
            "job.constraint[0].attribute",
            "attribute",
            "give one form, not both",
        ),
        (
            "    distinct_property = \"${NOMAD_ALLOC_ID}\"\n",
            "job.constraint[0].distinct_property",
            "distinct_property",
            "unknown reference \"${NOMAD_ALLOC_ID}\"",
        ),
    ];
    for (body, field, needle, what) in bad {
        fails(&at_job("constraint", body), &[(field, needle, what)]);
    }
    // Distinct forms are for constraints.
    fails(
        &at_group("affinity", "      distinct_hosts = true\n"),
        &[(
            "job.group[web].affinity[0].distinct_hosts",
            "distinct_hosts",
            "distinct_hosts applies to constraints only, not to affinities",
        )],
    );
    fails(
        &at_group(
            "affinity",
            "      operator = \"distinct_property\"\n      attribute = \"${meta.rack}\"\n",
        ),
        &[(
            "job.group[web].affinity[0].operator",
            "operator",
            "distinct_property applies to constraints only",
        )],
    );
}

#[test]
fn affinity_weights() {
    let body = |w: &str| format!("    attribute = \"${{node.class}}\"\n    value = \"big\"\n{w}");
    let weight = |w: &str| ok(&at_job("affinity", &body(w))).rules.affinities[0].weight;
    assert_eq!(weight(""), 50);
    assert_eq!(weight("    weight = 100\n"), 100);
    assert_eq!(weight("    weight = -100\n"), -100);
    assert_eq!(weight("    weight = 1\n"), 1);
    for (w, what) in [
        ("0", "must not be 0: from -100 (avoid) to 100 (prefer)"),
        ("101", "101 is outside -100 to 100"),
        ("-101", "-101 is outside -100 to 100"),
        ("1000", "1000 is outside -100 to 100"),
        ("2.5", "2.5 is not a whole number"),
        ("\"high\"", "expected a whole number from -100 to 100"),
    ] {
        let text = at_job("affinity", &body(&format!("    weight = {w}\n")));
        fails(&text, &[("job.affinity[0].weight", "weight", what)]);
    }
    // A value is required but by is_set and is_not_set (which affinities do not take).
    fails(
        &at_job("affinity", "    attribute = \"${node.class}\"\n"),
        &[(
            "job.affinity[0].value",
            "affinity {",
            "is required by operator =",
        )],
    );
    fails(
        &at_job("affinity", "    value = \"big\"\n"),
        &[("job.affinity[0].attribute", "affinity {", "is required")],
    );
}

#[test]
fn spreads_and_their_targets() {
    let spec = ok(&at_group(
        "spread",
        "      attribute = \"${node.datacenter}\"\n      weight = 1\n      target \"dc1\" {\n        percent = 70\n      }\n      target \"dc2\" {\n        percent = 30\n      }\n      target \"dc3\" {}\n",
    ));
    assert_eq!(
        spec.groups[0].rules.spreads,
        [Spread {
            attribute: "${node.datacenter}".into(),
            weight: 1,
            targets: vec![
                SpreadTarget {
                    value: "dc1".into(),
                    percent: 70
                },
                SpreadTarget {
                    value: "dc2".into(),
                    percent: 30
                },
                SpreadTarget {
                    value: "dc3".into(),
                    percent: 0
                },
            ],
        }]
    );
    let spec = ok(&at_job(
        "spread",
        "    attribute = \"${attr.platform.aws.placement.availability-zone}\"\n",
    ));
    assert_eq!(spec.rules.spreads[0].weight, DEFAULT_SPREAD_WEIGHT);
    assert!(spec.rules.spreads[0].targets.is_empty());

    let over = "    attribute = \"${node.datacenter}\"\n    target \"dc1\" {\n      percent = 60\n    }\n    target \"dc2\" {\n      percent = 50 # over\n    }\n";
    fails(
        &at_job("spread", over),
        &[(
            "job.spread[0].target[dc2].percent",
            "# over",
            "the spread's target percents add up to 110: at most 100",
        )],
    );
    let twice = "    attribute = \"${node.datacenter}\"\n    target \"dc1\" {\n      percent = 10\n    }\n    target \"dc1\" { # again\n      percent = 20\n    }\n";
    let text = at_job("spread", twice);
    fails(
        &text,
        &[(
            "job.spread[0].target[dc1]",
            "# again",
            &format!(
                "target \"dc1\" given more than once (first at line {})",
                line_of(&text, "target \"dc1\" {")
            ),
        )],
    );
    let bad = [
        (
            "    attribute = \"${node.datacenter}\"\n    weight = 0\n",
            "job.spread[0].weight",
            "weight",
            "must be from 1 to 100: berth refuses a weight of 0",
        ),
        (
            "    attribute = \"${node.datacenter}\"\n    weight = 101\n",
            "job.spread[0].weight",
            "weight",
            "101 is more than 100",
        ),
        (
            "    weight = 10\n",
            "job.spread[0].attribute",
            "spread {",
            "is required",
        ),
        (
            "    attribute = \"${node.datacenter}\"\n    target \"dc1\" {\n      percent = 101\n    }\n",
            "job.spread[0].target[dc1].percent",
            "percent",
            "101 is more than 100",
        ),
        (
            "    attribute = \"${node.datacenter}\"\n    target \"dc1\" {\n      share = 1\n    }\n",
            "job.spread[0].target[dc1].share",
            "share",
            "unknown field; expected one of: percent",
        ),
        (
            "    attribute = \"${node.datacenter}\"\n    target {\n      percent = 1\n    }\n",
            "job.spread[0].target",
            "target {",
            "needs one label, its value",
        ),
        (
            "    attribute = \"${node.datacenter}\"\n    operator = \"=\"\n",
            "job.spread[0].operator",
            "operator",
            "unknown field; expected one of: attribute, weight, target",
        ),
        (
            "    attribute = \"${NOMAD_DC}\"\n",
            "job.spread[0].attribute",
            "attribute",
            "unknown reference \"${NOMAD_DC}\"",
        ),
    ];
    for (body, field, needle, what) in bad {
        fails(&at_job("spread", body), &[(field, needle, what)]);
    }
}

#[test]
fn references_of_node_rules() {
    // Every node reference; references inside text; HCL2 variables filled; keys the parsing
    // node lacks are no problem (the rule is for every node of a fleet).
    let text = format!(
        "variable \"zone\" {{\n  default = \"eu\"\n}}\n{}",
        job(
            concat!(
                "  constraint {\n    attribute = \"${attr.unique.hostname}\"\n    operator = \"!=\"\n    value = \"${node.unique.name}\"\n  }\n",
                "  constraint {\n    attribute = \"${node.unique.id}\"\n    operator = \"is_set\"\n  }\n",
                "  constraint {\n    attribute = \"${node.region}-${node.class}\"\n    value = \"${var.zone}-big\"\n  }\n",
                "  affinity {\n    attribute = \"${meta.zone}\"\n    value = \"${var.zone}\"\n  }\n",
            ),
            "",
        )
    );
    let opts = ParseOptions {
        node: Some(NodeKeys::default()),
        ..Default::default()
    };
    let spec = JobSpec::parse_with(Path::new("/jobs/rules.hcl"), &text, Syntax::Hcl, &opts)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        spec.rules.constraints,
        [
            attribute(
                "${attr.unique.hostname}",
                Operand::NotEqual,
                "${node.unique.name}"
            ),
            attribute("${node.unique.id}", Operand::IsSet, ""),
            attribute("${node.region}-${node.class}", Operand::Equal, "eu-big"),
        ]
    );
    assert_eq!(
        spec.rules.affinities,
        [affinity("${meta.zone}", Operand::Equal, "eu", 50)]
    );

    let bad = [
        (
            "${NOMAD_ALLOC_ID}",
            "unknown reference \"${NOMAD_ALLOC_ID}\": a job's or group's constraint, affinity or spread can use ${attr.<key>}",
        ),
        (
            "${device.model}",
            "(${device.…} references go in a device block's constraint or affinity)",
        ),
        ("${node.id}", "unknown reference \"${node.id}\""),
        ("rack-${NOMAD_DC}", "unknown reference \"${NOMAD_DC}\""),
    ];
    for (reference, what) in bad {
        let body = format!("    attribute = \"{reference}\"\n    value = \"x\"\n");
        fails(
            &at_job("constraint", &body),
            &[("job.constraint[0].attribute", "attribute", what)],
        );
        let body = format!("      attribute = \"${{meta.x}}\"\n      value = \"{reference}\"\n");
        fails(
            &at_group("affinity", &body),
            &[("job.group[web].affinity[0].value", "value", what)],
        );
    }
}

#[test]
fn literal_values_are_checked_when_read() {
    let bad = [
        ("regexp", "(", "regexp does not compile"),
        ("version", "> one", "not a version constraint"),
        ("semver", "~> 1.2", "not a semver constraint"),
    ];
    for (operator, value, what) in bad {
        let body = format!(
            "    attribute = \"${{attr.x}}\"\n    operator = \"{operator}\"\n    value = \"{value}\"\n"
        );
        fails(
            &at_job("constraint", &body),
            &[("job.constraint[0].value", "value", what)],
        );
        // The short form names its own field.
        let body = format!("    attribute = \"${{attr.x}}\"\n    {operator} = \"{value}\"\n");
        fails(
            &at_job("affinity", &body),
            &[(
                &format!("job.affinity[0].{operator}"),
                &format!("{operator} ="),
                what,
            )],
        );
    }
    // A reference is checked with the value it takes, on each node.
    let spec = ok(&at_job(
        "constraint",
        "    attribute = \"${attr.x}\"\n    regexp = \"${meta.pattern}\"\n",
    ));
    assert_eq!(
        spec.rules.constraints,
        [attribute("${attr.x}", Operand::Regexp, "${meta.pattern}")]
    );
    fails(
        &at_job(
            "constraint",
            "    attribute = \"${attr.x}\"\n    operator = \"~=\"\n    value = \"1\"\n",
        ),
        &[(
            "job.constraint[0].operator",
            "operator",
            "unknown operator \"~=\" (expected one of =, !=, <, <=, >, >=, regexp, version, semver, \
             set_contains, set_contains_all, set_contains_any, is_set, is_not_set, distinct_hosts, \
             distinct_property; or ==, is, not)",
        )],
    );
    fails(
        &at_job(
            "constraint",
            "    attribute = \"${attr.x}\"\n    operator = \">\"\n",
        ),
        &[(
            "job.constraint[0].value",
            "constraint {",
            "is required by operator >",
        )],
    );
}

#[test]
fn several_problems_at_once_in_file_order_and_task_rules_stay_unknown() {
    let text = job(
        concat!(
            "  constraint {\n    attribute = \"${NOMAD_JOB_ID}\"\n    value = \"x\"\n  }\n",
            "  affinity {\n    attribute = \"${node.class}\"\n    value = \"big\"\n    weight = 0\n  }\n",
            "  constraint {\n    attribute = \"${attr.a}\"\n    colour = \"red\"\n  }\n",
        ),
        "    spread {\n      attribute = \"${node.datacenter}\"\n      weight = 0\n    }\n",
    );
    let errors = parse(&text).unwrap_err();
    let got: Vec<(String, Option<usize>)> =
        errors.iter().map(|e| (e.field.clone(), e.line)).collect();
    assert_eq!(
        got,
        [
            (
                "job.constraint[0].attribute".to_string(),
                Some(line_of(&text, "NOMAD_JOB_ID"))
            ),
            (
                "job.affinity[0].weight".to_string(),
                Some(line_of(&text, "weight = 0"))
            ),
            (
                "job.constraint[1].colour".to_string(),
                Some(line_of(&text, "colour"))
            ),
            (
                "job.group[web].spread[0].weight".to_string(),
                Some(line_of(&text, "      weight = 0"))
            ),
        ],
        "{errors}"
    );

    // A task's constraint is not read.
    let text = job(
        "",
        "",
    )
    .replace(
        "      driver = \"exec\"\n",
        "      driver = \"exec\"\n      constraint {\n        attribute = \"${attr.x}\"\n        value = \"y\"\n      }\n",
    );
    fails(
        &text,
        &[(
            "job.group[web].task[app].constraint",
            "constraint {",
            "unknown field",
        )],
    );
    // A labelled rule block.
    fails(
        &at_job("constraint", "    distinct_hosts = true\n")
            .replace("constraint {", "constraint \"x\" {"),
        &[(
            "job.constraint[0]",
            "constraint \"x\"",
            "this block takes no label",
        )],
    );
}

#[test]
fn json_form_errors_name_the_field() {
    let cases = [
        (
            NOMAD_STYLE_JSON.replace("\"weight\": 100,\n", "\"weight\": 0,\n"),
            "job.spread[0].weight",
            "must be from 1 to 100",
        ),
        (
            NOMAD_STYLE_JSON.replace("\"percent\": 40", "\"percent\": 41"),
            "job.spread[0].target[us-west1].percent",
            "add up to 101",
        ),
        (
            NOMAD_STYLE_JSON.replace("{ \"us-west1\"", "{ \"us-east1\""),
            "job.spread[0].target[us-east1]",
            "given more than once",
        ),
        (
            NOMAD_STYLE_JSON.replace("\"value\": 2", "\"value\": 0"),
            "job.group[example].constraint[1].value",
            "must be at least 1",
        ),
        (
            NOMAD_STYLE_JSON.replace("${meta.my_custom_value}", "${NOMAD_TASK_DIR}"),
            "job.constraint[1].attribute",
            "unknown reference",
        ),
        (
            NOMAD_STYLE_JSON.replace("\"count\": 3", "\"count\": 3, \"sticky\": true"),
            "job.group[example].sticky",
            "constraint, affinity, spread",
        ),
    ];
    for (text, field, what) in cases {
        let errors = json(&text).unwrap_err();
        let e = errors.first();
        assert_eq!((e.field.as_str(), e.line), (field, None), "{errors}");
        assert!(e.message.contains(what), "{e}\nshould say {what:?}");
    }
}
