//! A task's `logs` block: Nomad's defaults, its fields in HCL and JSON, and every refusal with
//! the field's path and line.

use std::path::Path;

use berth_input::Syntax;
use berth_job::*;

fn hcl(logs: &str) -> Result<JobSpec, SpecError> {
    let text = format!(
        "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n{logs}    }}\n  }}\n}}\n"
    );
    JobSpec::parse(Path::new("/jobs/logs.hcl"), &text)
}

fn logs_of(spec: &JobSpec) -> LogConfig {
    spec.groups[0].tasks[0].logs
}

#[test]
fn nomads_defaults_apply_without_a_block() {
    let spec = hcl("").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        logs_of(&spec),
        LogConfig {
            max_files: 10,
            max_file_size_mb: 10,
            disabled: false,
        }
    );
}

#[test]
fn the_blocks_fields_are_read() {
    let spec = hcl("      logs {\n        max_files     = 3\n        max_file_size = 1\n      }\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        logs_of(&spec),
        LogConfig {
            max_files: 3,
            max_file_size_mb: 1,
            disabled: false,
        }
    );
    let spec =
        hcl("      logs {\n        disabled = true\n      }\n").unwrap_or_else(|e| panic!("{e}"));
    assert!(logs_of(&spec).disabled);
    // Nomad's older form.
    let spec =
        hcl("      logs {\n        enabled = false\n      }\n").unwrap_or_else(|e| panic!("{e}"));
    assert!(logs_of(&spec).disabled);
    let spec = hcl("      logs {\n        enabled  = true\n        disabled = false\n      }\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!logs_of(&spec).disabled);
}

#[test]
fn json_jobs_take_the_block_too() {
    let json = r#"{"job": {"j": {"group": {"g": {"task": {"t": {
        "driver": "raw_exec",
        "config": {"command": "/bin/echo"},
        "logs": {"max_files": 2, "max_file_size": 5}
    }}}}}}}"#;
    let spec = JobSpec::parse_with(
        Path::new("j.json"),
        json,
        Syntax::Json,
        &ParseOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(logs_of(&spec).max_files, 2);
    assert_eq!(logs_of(&spec).max_file_size_mb, 5);

    let bad = json.replace("\"max_files\": 2", "\"max_files\": \"two\"");
    let e = JobSpec::parse_with(
        Path::new("j.json"),
        &bad,
        Syntax::Json,
        &ParseOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("logs.max_files"), "{e}");
}

#[test]
fn bad_blocks_are_refused_with_the_field_and_line() {
    for (block, field, line, says) in [
        (
            "      logs {\n        max_files = 0\n      }\n",
            "logs.max_files",
            9,
            "0 is less than 1",
        ),
        (
            "      logs {\n        max_file_size = -5\n      }\n",
            "logs.max_file_size",
            9,
            "less than 1",
        ),
        (
            "      logs {\n        max_file_size = 1.5\n      }\n",
            "logs.max_file_size",
            9,
            "not a whole number",
        ),
        (
            "      logs {\n        max_files = \"ten\"\n      }\n",
            "logs.max_files",
            9,
            "a whole number",
        ),
        (
            "      logs {\n        disabled = \"yes\"\n      }\n",
            "logs.disabled",
            9,
            "true or false",
        ),
        (
            "      logs {\n        enabled  = true\n        disabled = true\n      }\n",
            "logs.enabled",
            9,
            "contradicts",
        ),
        (
            "      logs {\n        max_size = 3\n      }\n",
            "logs.max_size",
            9,
            "",
        ),
        (
            "      logs {}\n      logs {}\n",
            "logs",
            9,
            "declared more than once",
        ),
    ] {
        let e = hcl(block).unwrap_err().to_string();
        assert!(e.contains(field), "{block}: {e}");
        assert!(e.contains(&format!("logs.hcl:{line}")), "{block}: {e}");
        assert!(e.contains(says), "{block}: {e}");
    }
}
