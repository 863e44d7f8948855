//! `device` blocks in a task's `resources`: the name forms (and CDI names), defaults, Nomad's
//! job files as its docs write them, `${device.…}` kept as written next to HCL2 variables, the
//! JSON form, the stored form, and every problem with its field and line, all at once.

use std::{collections::BTreeMap, path::Path};

use berth_devices::{
    attribute::Attribute,
    model::{DeviceGroup, DeviceInstance},
    request::{DeviceName, Operand, affinity_score, check_group},
};
use berth_input::Syntax;
use berth_job::{DeviceTarget, JobSpec, ParseOptions, SpecErrors, TaskSpec};

/// The 1-based line of the first line holding `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} is in the text"))
        + 1
}

fn parse(text: &str, opts: &ParseOptions) -> Result<JobSpec, SpecErrors> {
    JobSpec::parse_with(Path::new("/jobs/gpu.hcl"), text, Syntax::Hcl, opts)
}

fn task(spec: &JobSpec) -> &TaskSpec {
    &spec.groups[0].tasks[0]
}

/// A job whose one task has `resources` holding `body`.
fn job(body: &str) -> String {
    format!(
        "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n      resources {{\n{body}      }}\n    }}\n  }}\n}}\n"
    )
}

/// The job spec example of Nomad's `device` documentation, as written there (two GPUs with a
/// memory constraint and a memory affinity), plus a model affinity as its examples write one,
/// in a docker task of our own (the example shows no driver).
const NOMAD_DOCS: &str = r#"job "docs" {
  group "example" {
    task "server" {
      driver = "docker"

      config {
        image   = "trainer"
        command = "/usr/bin/train"
      }

      resources {
        cpu    = 500
        memory = 2048

        device "nvidia/gpu" {
          count = 2

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "2 GiB"
          }

          affinity {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "4 GiB"
            weight    = 75
          }

          affinity {
            attribute = "${device.model}"
            operator  = "regexp"
            value     = "Tesla"
          }
        }
      }
    }
  }
}
"#;

fn gpu(name: &str, memory: &str) -> DeviceGroup {
    DeviceGroup {
        vendor: "nvidia".into(),
        device_type: "gpu".into(),
        name: name.into(),
        attributes: BTreeMap::from([("memory".to_string(), Attribute::parse(memory))]),
        instances: vec![DeviceInstance {
            id: "GPU-0".into(),
            healthy: true,
            health_description: String::new(),
            locality: None,
        }],
    }
}

#[test]
fn nomads_documented_job_parses_unchanged_and_matches() {
    let spec = parse(NOMAD_DOCS, &ParseOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let t = task(&spec);
    assert_eq!(t.devices.len(), 1);
    let d = &t.devices[0];
    assert_eq!(d.name, "nvidia/gpu");
    assert_eq!(
        d.target,
        DeviceTarget::Plugin(DeviceName {
            vendor: Some("nvidia".into()),
            device_type: "gpu".into(),
            name: None,
        })
    );
    assert_eq!(d.count, 2);
    let c = &d.constraints[0];
    assert_eq!(
        (c.attribute.as_str(), c.operator, c.value.as_str()),
        ("${device.attr.memory}", Operand::GreaterOrEqual, "2 GiB")
    );
    assert_eq!(d.affinities[0].weight, 75);
    assert_eq!(d.affinities[1].attribute, "${device.model}");
    assert_eq!(d.affinities[1].operator, Operand::Regexp);
    assert_eq!(d.affinities[1].weight, 50, "Nomad's default weight");

    // What placement does with it.
    check_group(d, &gpu("Tesla K80", "12 GiB")).unwrap();
    assert_eq!(
        check_group(d, &gpu("GRID K1", "1024 MiB")).unwrap_err(),
        ["constraint ${device.attr.memory} >= 2 GiB failed: memory is 1024 MiB"]
    );
    assert_eq!(affinity_score(d, &gpu("Tesla K80", "12 GiB")), 1.0);
    assert_eq!(affinity_score(d, &gpu("Tesla K80", "3 GiB")), 50.0 / 125.0);
    assert_eq!(affinity_score(d, &gpu("GRID K1", "2048 MiB")), 0.0);

    // The stored form gives the same spec back; a spec stored before devices loads.
    let stored = serde_json::to_value(&spec).unwrap();
    assert_eq!(
        serde_json::from_value::<JobSpec>(stored.clone()).unwrap(),
        spec
    );
    let mut old = stored;
    old["groups"][0]["tasks"][0]
        .as_object_mut()
        .unwrap()
        .remove("devices");
    let old: JobSpec = serde_json::from_value(old).unwrap();
    assert!(task(&old).devices.is_empty());
}

#[test]
fn names_in_three_forms_a_cdi_name_and_defaults() {
    let text = job(concat!(
        "        device \"gpu\" {}\n",
        "        device \"nvidia/gpu\" {\n          count = 3\n        }\n",
        "        device \"nvidia/gpu/Tesla K80\" {}\n",
        "        device \"nvidia.com/gpu=GPU-0\" {\n          count = 1\n        }\n",
        "        device \"amd/fpga/A/B\" {}\n",
    ));
    let spec = parse(&text, &ParseOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let devices = &task(&spec).devices;
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu",
            "nvidia/gpu",
            "nvidia/gpu/Tesla K80",
            "nvidia.com/gpu=GPU-0",
            "amd/fpga/A/B"
        ]
    );
    let counts: Vec<u32> = devices.iter().map(|d| d.count).collect();
    assert_eq!(counts, [1, 3, 1, 1, 1]);
    let plugin = |i: usize| match &devices[i].target {
        DeviceTarget::Plugin(n) => n.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (plugin(0).vendor, plugin(0).device_type.as_str()),
        (None, "gpu")
    );
    assert_eq!(plugin(1).vendor.as_deref(), Some("nvidia"));
    assert_eq!(plugin(2).name.as_deref(), Some("Tesla K80"));
    assert_eq!(plugin(4).name.as_deref(), Some("A/B"));
    match &devices[3].target {
        DeviceTarget::Cdi(q) => {
            assert_eq!(
                (q.kind().as_str(), q.name.as_str()),
                ("nvidia.com/gpu", "GPU-0")
            )
        }
        other => panic!("{other:?}"),
    }
    // No devices: an empty list.
    let plain = parse(&job("        cpu = 100\n"), &ParseOptions::default()).unwrap();
    assert!(task(&plain).devices.is_empty());
}

#[test]
fn device_references_stay_literal_next_to_filled_variables() {
    let text = format!(
        "variable \"min\" {{\n  type    = string\n  default = \"4 GiB\"\n}}\nvariable \"weight\" {{\n  default = -30\n}}\n{}",
        job(concat!(
            "        device \"gpu\" {\n",
            "          constraint {\n",
            "            attribute = \"${device.attr.memory}\"\n",
            "            operator  = \">=\"\n",
            "            value     = \"${var.min}\"\n",
            "          }\n",
            "          constraint {\n",
            "            attribute = \"${device.attr.clock}\"\n",
            "            value     = \"${upper(\"x\")} ${device.vendor}\"\n",
            "          }\n",
            "          affinity {\n",
            "            attribute = \"${device.ids}\"\n",
            "            set_contains_any = \"GPU-1,${var.min}\"\n",
            "            weight    = var.weight\n",
            "          }\n",
            "          affinity {\n",
            "            attribute = \"$${device.model}\"\n",
            "            value     = var.min\n",
            "          }\n",
            "        }\n",
        ))
    );
    // `${device.vendor}` inside other text is no reference: refused, with its line.
    let e = parse(&text, &ParseOptions::default()).unwrap_err();
    assert_eq!(e.len(), 1, "{e}");
    let want = format!(
        "gpu.hcl:{}: job.group[g].task[t].resources.device[gpu].constraint[1].value: \"X ${{device.vendor}}\": device constraints can only use ${{device.model|vendor|type|ids|attr.<name>}}, each as the whole attribute or value",
        line_of(&text, "${upper(")
    );
    assert!(e.to_string().contains(&want), "wanted {want}\nin {e}");

    let text = text.replace("${upper(\"x\")} ${device.vendor}", "${device.vendor}");
    let opts = ParseOptions {
        vars: vec![("min".into(), "8 GiB".into())],
        ..Default::default()
    };
    let spec = parse(&text, &opts).unwrap_or_else(|e| panic!("{e}"));
    let d = &task(&spec).devices[0];
    let c = &d.constraints;
    assert_eq!(c[0].attribute, "${device.attr.memory}");
    assert_eq!(c[0].value, "8 GiB");
    assert_eq!(c[1].attribute, "${device.attr.clock}");
    assert_eq!(c[1].operator, Operand::Equal, "the default operator");
    assert_eq!(c[1].value, "${device.vendor}");
    let a = &d.affinities;
    assert_eq!(a[0].attribute, "${device.ids}");
    assert_eq!(a[0].operator, Operand::SetContainsAny);
    assert_eq!(a[0].value, "GPU-1,8 GiB");
    assert_eq!(a[0].weight, -30);
    // An escaped reference is the same text.
    assert_eq!(a[1].attribute, "${device.model}");
    assert_eq!(a[1].value, "8 GiB");
}

#[test]
fn the_json_form_reads_the_same() {
    let json = r#"{"job": {"j": {"group": {"g": {"task": {"t": {
        "driver": "exec",
        "config": {"command": "/bin/true"},
        "resources": {
            "cpu": 100,
            "device": {
                "nvidia/gpu": {
                    "count": 2,
                    "constraint": [{"attribute": "${device.attr.memory}", "operator": ">=", "value": "2 GiB"}],
                    "affinity": {"attribute": "${device.model}", "regexp": "Tesla", "weight": 20}
                },
                "example.com/device=dev0": {}
            }
        }
    }}}}}}}"#;
    let spec = JobSpec::parse_with(
        Path::new("j.json"),
        json,
        Syntax::Json,
        &ParseOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let devices = &task(&spec).devices;
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].count, 2);
    assert_eq!(devices[0].constraints[0].attribute, "${device.attr.memory}");
    assert_eq!(devices[0].affinities[0].operator, Operand::Regexp);
    assert_eq!(devices[0].affinities[0].value, "Tesla");
    assert_eq!(devices[0].affinities[0].weight, 20);
    assert!(matches!(devices[1].target, DeviceTarget::Cdi(_)));

    // The HCL form of the same job gives the same requests.
    let hcl = job(concat!(
        "        cpu = 100\n",
        "        device \"nvidia/gpu\" {\n          count = 2\n",
        "          constraint {\n            attribute = \"${device.attr.memory}\"\n            operator  = \">=\"\n            value     = \"2 GiB\"\n          }\n",
        "          affinity {\n            attribute = \"${device.model}\"\n            regexp    = \"Tesla\"\n            weight    = 20\n          }\n",
        "        }\n",
        "        device \"example.com/device=dev0\" {}\n",
    ));
    let from_hcl = parse(&hcl, &ParseOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&task(&from_hcl).devices, devices);

    // JSON errors name the field (JSON has no lines).
    let bad = json.replace("\">=\"", "\"≈\"");
    let e = JobSpec::parse_with(
        Path::new("j.json"),
        &bad,
        Syntax::Json,
        &ParseOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.first().to_string(),
        "j.json: job.group[g].task[t].resources.device[nvidia/gpu].constraint[0].operator: unknown operator \"≈\" (expected one of =, !=, <, <=, >, >=, regexp, version, semver, set_contains, set_contains_all, set_contains_any, is_set, is_not_set; or ==, is, not)"
    );
}

#[test]
fn every_problem_is_reported_with_its_field_and_line() {
    let text = job(concat!(
        "        device \"nvidia/gpu\" {\n",
        "          constraint {\n",
        "            attribute = \"${device.attr.memory}\"\n",
        "            operator  = \"≈\"\n",
        "            value     = \"4 GiB\"\n",
        "          }\n",
        "          constraint {\n",
        "            attribute = \"${node.class}\"\n",
        "            value     = \"gpu\"\n",
        "          }\n",
        "          constraint {\n",
        "            attribute = \"${device.model}\"\n",
        "            regexp    = \"Tesla(\"\n",
        "          }\n",
        "          constraint {\n",
        "            attribute = \"${device.attr.driver}\"\n",
        "            operator  = \"version\"\n",
        "            value     = \">= 1.x\"\n",
        "          }\n",
        "          constraint {\n",
        "            attribute = \"${device.attr.ecc}\"\n",
        "            operator  = \"is_set\"\n",
        "            value     = \"true\"\n",
        "          }\n",
        "          constraint {\n",
        "            attribute = \"${device.colour}\"\n",
        "            operator  = \">\"\n",
        "          }\n",
        "          affinity {\n",
        "            attribute = \"${device.model}\"\n",
        "            value     = \"K80\"\n",
        "            weight    = 0\n",
        "          }\n",
        "          affinity {\n",
        "            attribute = \"${device.model}\"\n",
        "            value     = \"K80\"\n",
        "            weight    = 150\n",
        "          }\n",
        "        }\n",
        "        device \"nvidia/gpu\" {}\n",
        "        device \"\" {}\n",
        "        device \"amd/gpu\" {\n",
        "          count = 0\n",
        "        }\n",
        "        device \"vendor.com/class=x\" {\n",
        "          count = 2\n",
        "          constraint {\n",
        "            attribute = \"${device.model}\"\n",
        "            value     = \"x\"\n",
        "          }\n",
        "        }\n",
        "        device \"nvidia//gpu\" {}\n",
    ));
    let text = text.replace(
        "      driver = \"exec\"\n",
        "      driver = \"exec\"\n      device \"gpu\" {}\n",
    );
    let e = parse(&text, &ParseOptions::default()).unwrap_err();
    let all = e.to_string();
    let p = "job.group[g].task[t]";
    let d = format!("{p}.resources.device[nvidia/gpu]");
    let want: Vec<(usize, String, &str)> = vec![
        (
            line_of(&text, "device \"gpu\" {}"),
            format!("{p}.device"),
            "device blocks go in a task's resources block",
        ),
        (
            line_of(&text, "\"≈\""),
            format!("{d}.constraint[0].operator"),
            "unknown operator \"≈\"",
        ),
        (
            line_of(&text, "${node.class}"),
            format!("{d}.constraint[1].attribute"),
            "\"${node.class}\": device constraints can only use ${device.model|vendor|type|ids|attr.<name>}",
        ),
        (
            line_of(&text, "Tesla("),
            format!("{d}.constraint[2].regexp"),
            "regexp does not compile: unclosed group",
        ),
        (
            line_of(&text, ">= 1.x"),
            format!("{d}.constraint[3].value"),
            "not a version constraint: \"1.x\" is not a version",
        ),
        (
            line_of(&text, "value     = \"true\""),
            format!("{d}.constraint[4].value"),
            "is_set takes no value",
        ),
        (
            line_of(&text, "${device.colour}"),
            format!("{d}.constraint[5].attribute"),
            "\"${device.colour}\": device constraints can only use",
        ),
        (
            line_of(&text, "${device.colour}") - 1,
            format!("{d}.constraint[5].value"),
            "is required by operator >",
        ),
        (
            line_of(&text, "weight    = 0"),
            format!("{d}.affinity[0].weight"),
            "must not be 0: from -100 (avoid) to 100 (prefer)",
        ),
        (
            line_of(&text, "weight    = 150"),
            format!("{d}.affinity[1].weight"),
            "150 is outside -100 to 100",
        ),
        (
            line_of(&text, "device \"nvidia/gpu\" {}"),
            d.clone(),
            "duplicate device name \"nvidia/gpu\" (first at line",
        ),
        (
            line_of(&text, "device \"\" {}"),
            format!("{p}.resources.device[\"\"]"),
            "is empty: name a device type (gpu), vendor/type (nvidia/gpu)",
        ),
        (
            line_of(&text, "count = 0"),
            format!("{p}.resources.device[amd/gpu].count"),
            "0 is less than 1",
        ),
        (
            line_of(&text, "count = 2"),
            format!("{p}.resources.device[\"vendor.com/class=x\"].count"),
            "is 2, but a CDI device request names one device: count must be 1",
        ),
        (
            line_of(&text, "device \"vendor.com/class=x\"") + 2,
            format!("{p}.resources.device[\"vendor.com/class=x\"].constraint[0]"),
            "a CDI device is named exactly and takes no constraint",
        ),
        (
            line_of(&text, "nvidia//gpu"),
            format!("{p}.resources.device[\"nvidia//gpu\"]"),
            "\"nvidia//gpu\" has an empty part",
        ),
    ];
    for (line, field, message) in &want {
        let expected = format!("gpu.hcl:{line}: {field}: {message}");
        assert!(all.contains(&expected), "wanted {expected}\nin:\n{all}");
    }
    assert_eq!(e.len(), want.len(), "{all}");
}

#[test]
fn device_references_elsewhere_and_other_misuses_are_refused() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            job("        cpu = 100\n").replace(
                "command = \"/bin/true\"",
                "command = \"/bin/echo\"\n        args = [\"${device.model}\"]",
            ),
            "job.group[g].task[t].config.args[0]",
            "unknown variable device.model: ${device.…} references are read only in",
        ),
        (
            job("        cpu = 100\n").replace("driver = \"exec\"", "driver = \"${device.type}\""),
            "job.group[g].task[t].driver",
            "${device.…} references are read only in the attribute and value",
        ),
        (
            job(
                "        device \"gpu\" {\n          constraint {\n            attribute = \"${device.model}\"\n            operator = \"regexp\"\n            regexp = \"x\"\n          }\n        }\n",
            ),
            "job.group[g].task[t].resources.device[gpu].constraint[0].regexp",
            "regexp = \"…\" is short for operator = \"regexp\" and value = \"…\": give one form",
        ),
        (
            job(
                "        device \"gpu\" {\n          constraint {\n            distinct_hosts = true\n          }\n        }\n",
            ),
            "job.group[g].task[t].resources.device[gpu].constraint[0].distinct_hosts",
            "does not select devices",
        ),
        (
            job(
                "        device \"gpu\" {\n          constraint {\n            attribute = \"${device.model}\"\n            weight = 5\n            value = \"x\"\n          }\n        }\n",
            ),
            "job.group[g].task[t].resources.device[gpu].constraint[0].weight",
            "unknown field; expected one of: attribute, operator, value, regexp",
        ),
        (
            job(
                "        device \"gpu\" {\n          affinity {\n            attribute = \"${device.model}\"\n            value = \"x\"\n            weight = \"high\"\n          }\n        }\n",
            ),
            "job.group[g].task[t].resources.device[gpu].affinity[0].weight",
            "expected a whole number from -100 to 100, found a string",
        ),
        (
            job(
                "        device \"gpu\" {\n          affinity {\n            attribute = \"${device.attr.x}\"\n            operator = \"is_set\"\n          }\n        }\n",
            ),
            "job.group[g].task[t].resources.device[gpu].affinity[0].operator",
            "is_set applies to constraints only, not to affinities",
        ),
        (
            job("        device \"gpu\" {\n          size = 3\n        }\n"),
            "job.group[g].task[t].resources.device[gpu].size",
            "unknown field; expected one of: count, constraint, affinity",
        ),
        (
            job("        device {\n        }\n"),
            "job.group[g].task[t].resources.device",
            "needs one label, its name",
        ),
        (
            job("        cpu = 100\n").replace(
                "    task \"t\" {",
                "    device \"gpu\" {}\n    task \"t\" {",
            ),
            "job.group[g].device",
            "device blocks go in a task's resources block",
        ),
    ];
    for (text, field, message) in cases {
        let e = parse(&text, &ParseOptions::default()).unwrap_err();
        let all = e.to_string();
        assert!(
            e.iter()
                .any(|x| x.field == field && x.message.contains(message)),
            "wanted {field}: {message}\nin:\n{all}"
        );
        assert!(e.iter().all(|x| x.line.is_some()), "{all}");
    }
}
