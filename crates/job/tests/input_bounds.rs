//! Job specs that try to crash or flood the reader: nesting 200,000 levels deep, texts over
//! 1 MiB, `fs_type` values no filesystem has, hostile file names, and mount flags or env values
//! in every wrong shape. Each is refused with a `file:line: field: message` error that repeats
//! no flag, no env value and no raw control character.

use std::path::Path;

use berth_job::{JobSpec, SpecError};

const FLAG: &str = "canary-flag-5531";
const ENV: &str = "canary-env-8817";
const NUMBER: &str = "86420975";

/// A valid job: `volume` lines go in its volume block, `task` lines in its task, `top` after
/// the job block.
fn job(volume: &str, task: &str, top: &str) -> String {
    format!(
        "job \"j\" {{\n  group \"web\" {{\n    volume \"data\" {{\n      type = \"csi\"\n      source = \"demo\"\n      access_mode = \"single-node-writer\"\n{volume}\n    }}\n    task \"app\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/app\"\n      }}\n{task}\n    }}\n  }}\n}}\n{top}"
    )
}

/// The same in HCL's JSON form.
fn job_json(volume: &str, task: &str, top: &str) -> String {
    let v = if volume.is_empty() {
        String::new()
    } else {
        format!(", {volume}")
    };
    let t = if task.is_empty() {
        String::new()
    } else {
        format!(", {task}")
    };
    let top = if top.is_empty() {
        String::new()
    } else {
        format!(",\n{top}")
    };
    format!(
        "{{\"job\": {{\"j\": {{\"group\": {{\"web\": {{\n\"volume\": {{\"data\": {{\"type\": \"csi\", \"source\": \"demo\", \"access_mode\": \"single-node-writer\"{v}}}}},\n\"task\": {{\"app\": {{\"driver\": \"exec\", \"config\": {{\"command\": \"/bin/app\"}}{t}}}}}}}}}}}}}{top}}}"
    )
}

fn parse(file: &str, text: &str) -> Result<JobSpec, SpecError> {
    JobSpec::parse(Path::new(file), text)
}

/// `n` levels of `shape` after the job, starting on line `job("", "", "").lines().count() + 1`.
fn deep_hcl(shape: &str, n: usize) -> String {
    let (open, inner, close, lead) = match shape {
        "blocks" => ("a{\n", "", "}\n", ""),
        "objects" => ("{a=", "1", "}", "x="),
        "lists" => ("[", "1", "]", "x="),
        "tuples" => ("[1,", "2", "]", "x="),
        "parens" => ("(", "1", ")", "x="),
        "templates" => ("\"${", "1", "}\"", "x="),
        "directives" => ("%{if a}", "y", "%{endif}", "x=\""),
        "heredoc interpolations" => ("${", "1", "}", "x=<<EOT\n"),
        other => panic!("{other}"),
    };
    let mut top = format!("{lead}{}{inner}{}", open.repeat(n), close.repeat(n));
    match shape {
        "directives" => top.push('"'),
        "heredoc interpolations" => top.push_str("\nEOT\n"),
        _ => {}
    }
    let text = job("", "", &top);
    if text.len() > berth_input::MAX_SPEC_BYTES {
        return job("", "", &format!("{lead}{}", open.repeat(n)));
    }
    text
}

const SHAPES: &[&str] = &[
    "blocks",
    "objects",
    "lists",
    "tuples",
    "parens",
    "templates",
    "directives",
    "heredoc interpolations",
];

#[test]
fn deep_hcl_is_refused_before_parsing() {
    let first = job("", "", "").lines().count() + 1;
    for shape in SHAPES {
        let e = parse("/j/deep.hcl", &deep_hcl(shape, 65)).expect_err(shape);
        let line = match *shape {
            "blocks" => first + 64,
            "heredoc interpolations" => first + 1,
            _ => first,
        };
        assert_eq!(
            e.to_string(),
            format!("/j/deep.hcl:{line}: nesting deeper than 64 levels"),
            "{shape}"
        );
        let text = deep_hcl(shape, 200_000.min(berth_input::MAX_SPEC_BYTES / 8));
        assert!(text.len() <= berth_input::MAX_SPEC_BYTES, "{shape}");
        let e =
            berth_testkit::on_small_stack(move || parse("/j/deep.hcl", &text)).expect_err(shape);
        assert!(e.message.contains("nesting deeper than 64"), "{shape}: {e}");
    }
}

#[test]
fn deep_json_is_refused_before_parsing() {
    let objects = |n: usize| {
        job_json(
            "",
            "",
            &format!("\"x\": {}1{}", "{\"\":".repeat(n), "}".repeat(n)),
        )
    };
    let arrays = |n: usize| {
        job_json(
            "",
            "",
            &format!("\"x\": {}1{}", "[".repeat(n), "]".repeat(n)),
        )
    };
    for text in [objects(65), arrays(65)] {
        let e = parse("/j/deep.json", &text).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/j/deep.json:4: nesting deeper than 64 levels"
        );
    }
    for text in [objects(190_000), arrays(200_000)] {
        assert!(text.len() <= berth_input::MAX_SPEC_BYTES);
        let e = berth_testkit::on_small_stack(move || parse("/j/deep.json", &text)).unwrap_err();
        assert!(e.message.contains("nesting deeper than 64"), "{e}");
    }
}

#[test]
fn nesting_up_to_the_limit_reaches_the_checker() {
    for shape in ["objects", "lists", "tuples", "parens", "blocks"] {
        let e = parse("/j/j.hcl", &deep_hcl(shape, 64)).expect_err(shape);
        assert!(e.message.starts_with("unknown field"), "{shape}: {e}");
    }
    // The job's own object is a level.
    let e = parse(
        "/j/j.json",
        &job_json(
            "",
            "",
            &format!("\"x\": {}1{}", "[".repeat(63), "]".repeat(63)),
        ),
    )
    .unwrap_err();
    assert!(e.message.starts_with("unknown field"), "{e}");
    // Braces in strings, heredocs and comments are text.
    let braces = "{[(".repeat(50_000);
    let spec = job(
        "",
        &format!(
            "      env {{\n        A = \"{braces}\"\n        B = <<EOT\n{braces}\nEOT\n      }}\n"
        ),
        &format!("# {braces}\n/* {braces} */\n"),
    );
    let s = berth_testkit::on_small_stack(move || parse("/j/j.hcl", &spec)).expect("valid");
    assert_eq!(s.groups[0].tasks[0].env["A"], braces.as_str());
}

#[test]
fn texts_over_one_mib_are_refused_unread() {
    let base = job("", "", "");
    let at = format!(
        "# {}\n{base}",
        "x".repeat(berth_input::MAX_SPEC_BYTES - base.len() - 3)
    );
    assert_eq!(at.len(), berth_input::MAX_SPEC_BYTES);
    assert!(parse("/j/j.hcl", &at).is_ok());
    let e = parse("/j/j.hcl", &format!("#{at}")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/j/j.hcl: too large: more than 1048576 bytes (1 MiB), the most berth reads in one file"
    );
    let e = parse(
        "/j/j.json",
        &format!("{}{}", " ".repeat(2 << 20), job_json("", "", "")),
    )
    .unwrap_err();
    assert!(e.message.starts_with("too large"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.hcl");
    std::fs::write(&file, format!("# {}\n{base}", "x".repeat(4 << 20))).unwrap();
    let e = JobSpec::load(&file).unwrap_err();
    assert!(e.message.starts_with("too large"), "{e}");
}

#[test]
fn fs_type_must_be_a_filesystem_type() {
    let huge = "x".repeat(1_000_000);
    for bad in [
        huge.as_str(),
        "ext4\\u0000",
        "ext4,ro,../../x",
        "../../etc",
        "a b",
    ] {
        for (file, text) in [
            (
                "/j/j.hcl",
                job(
                    &format!("      mount_options {{\n        fs_type = \"{bad}\"\n      }}"),
                    "",
                    "",
                ),
            ),
            (
                "/j/j.json",
                job_json(
                    &format!("\"mount_options\": {{\"fs_type\": \"{bad}\"}}"),
                    "",
                    "",
                ),
            ),
        ] {
            let e = parse(file, &text).expect_err(bad);
            assert_eq!(
                e.field, "job.group[web].volume[data].mount_options.fs_type",
                "{e}"
            );
            assert!(
                e.message.starts_with("not a filesystem type (")
                    || (bad.contains("u0000") && e.message == "contains a NUL byte"),
                "{e}"
            );
            let shown = e.to_string();
            assert!(shown.len() < 300, "{} bytes", shown.len());
            assert!(!shown.contains("../") && !shown.contains("ro,"), "{shown}");
        }
    }
    let e = parse(
        "/j/j.hcl",
        &job(
            "      mount_options {\n        fs_type = \"ext4,ro\"\n      }",
            "",
            "",
        ),
    )
    .unwrap_err();
    assert_eq!(e.line, Some(8), "{e}");
    for good in ["ext4", "xfs", "fuse.sshfs", ""] {
        let s = parse(
            "/j/j.hcl",
            &job(
                &format!("      mount_options {{\n        fs_type = \"{good}\"\n      }}"),
                "",
                "",
            ),
        )
        .unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(s.groups[0].volumes["data"].mount_options.fs_type, good);
    }
}

#[test]
fn hostile_file_names_are_escaped_and_cut() {
    let name = format!("j\nx.hcl:1: forged\u{1b}[2J\u{202e}{}", "n".repeat(100_000));
    for text in [job("", "", "colour = 1\n"), deep_hcl("lists", 65)] {
        let shown = parse(&name, &text).unwrap_err().to_string();
        assert!(!shown.chars().any(berth_sys::is_unprintable), "{shown:?}");
        assert!(
            shown.starts_with("j\\nx.hcl:1: forged\\u{1b}[2J\\u{202e}nnn"),
            "{shown}"
        );
        assert!(shown.len() < 400, "{} bytes", shown.len());
    }
}

#[test]
fn values_in_errors_are_escaped_and_cut() {
    let long = format!("evil\\n\\u001b[31m{}", "v".repeat(500_000));
    for text in [
        job(&format!("      attachment_mode = \"{long}\""), "", ""),
        job("", "", "").replace("\"single-node-writer\"", &format!("\"{long}\"")),
        job("", "", "").replace("\"csi\"", &format!("\"{long}\"")),
        job("", &format!("      kill_timeout = \"{long}\""), ""),
        job(
            "",
            &format!("      restart {{\n        mode = \"{long}\"\n      }}"),
            "",
        ),
        job(
            "",
            &format!(
                "      volume_mount {{\n        volume = \"{long}\"\n        destination = \"/d\"\n      }}"
            ),
            "",
        ),
        job(
            "",
            &format!(
                "      volume_mount {{\n        volume = \"data\"\n        destination = \"{long}\"\n      }}"
            ),
            "",
        ),
        job(
            "",
            &format!(
                "      csi_plugin {{\n        id = \"p\"\n        type = \"{long}\"\n      }}"
            ),
            "",
        ),
        job(
            "",
            &format!(
                "      csi_plugin {{\n        id = \"p\"\n        type = \"node\"\n        mount_dir = \"/local/csi/{long}\"\n      }}"
            ),
            "",
        ),
        job("", "", "")
            .replace("job \"j\" {", "job \"j\" {\n  type = \"long\"")
            .replace("\"long\"", &format!("\"{long}\"")),
        job("", "", &format!("{} = 1\n", "k".repeat(500_000))),
        job("", &format!("      env = {{ \"{long}\" = [1] }}"), ""),
    ] {
        let e = parse("/j/j.hcl", &text).unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.len() < 1200,
            "{} bytes: {}",
            shown.len(),
            &shown[..300]
        );
        assert!(!shown.chars().any(berth_sys::is_unprintable), "{shown:?}");
    }
    let keys: String = (0..10_000).map(|i| format!("k{i} = 1\n")).collect();
    let e = parse("/j/j.hcl", &job("", "", &keys)).unwrap_err();
    assert!(e.message.contains(" and 9991 more)"), "{e}");
}

#[test]
fn one_volume_claimed_twice_is_found_in_any_order() {
    let vol = |name: &str, source: &str, per_alloc: bool| {
        format!(
            "    volume \"{name}\" {{\n      type = \"csi\"\n      source = \"{source}\"\n      access_mode = \"single-node-writer\"\n      per_alloc = {per_alloc}\n    }}\n"
        )
    };
    let spec = |vols: &str| {
        format!(
            "job \"j\" {{\n  group \"g\" {{\n    count = 3\n{vols}    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/x\"\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    for (vols, want) in [
        (
            vol("a", "d", true) + &vol("b", "d", true),
            "alloc 0 would claim volume \"d[0]\" twice, here and in volume \"a\"",
        ),
        (
            vol("a", "d[2]", false) + &vol("b", "d", true),
            "alloc 2 would claim volume \"d[2]\" twice, here and in volume \"a\"",
        ),
        (
            vol("a", "d", true) + &vol("b", "d[1]", false),
            "alloc 1 would claim volume \"d[1]\" twice, here and in volume \"a\"",
        ),
        (
            vol("a", "x", false) + &vol("b", "y", false) + &vol("c", "y", false),
            "alloc 0 would claim volume \"y\" twice, here and in volume \"b\"",
        ),
    ] {
        let e = parse("/j/j.hcl", &spec(&vols)).unwrap_err();
        assert!(e.message.starts_with(want), "{e}");
    }
    let ok = vol("a", "d", true) + &vol("b", "d[3]", false) + &vol("c", "e", false);
    assert!(parse("/j/j.hcl", &spec(&ok)).is_ok());
}

/// Mount flags, mount options and env values in every wrong shape, with a canary in each.
fn wrong_shapes() -> Vec<(&'static str, String)> {
    let (f, e, n) = (FLAG, ENV, NUMBER);
    let mo = |x: &str| {
        job(
            &format!("      mount_options {{\n        {x}\n      }}"),
            "",
            "",
        )
    };
    let mut out: Vec<(&str, String)> = [
        mo(&format!("mount_flags = \"{f}\"")),
        mo(&format!("mount_flags = {n}")),
        mo(&format!("mount_flags = {{ a = \"{f}\" }}")),
        mo(&format!("mount_flags = {{ \"{f}\" = 1 }}")),
        mo(&format!("mount_flags = [{{ a = \"{f}\" }}]")),
        mo(&format!("mount_flags = [[\"{f}\"]]")),
        mo(&format!("mount_flags = [1, \"{f}\"]")),
        mo(&format!("mount_flags = [\"{f}\\u0000\"]")),
        mo(&format!("mount_flags = [\"{f}${{x}}\"]")),
        mo(&format!("mount_flags = [{f}]")),
        mo(&format!("mount_flags = [\"{f}\"] ]")),
        mo(&format!("\"{f}\" = true")),
        mo(&format!("{f} = true")),
        mo(&format!(
            "mount_flags = [\"{f}\"]\n        mount_flags = [\"{f}\"]"
        )),
        job(&format!("      mount_options = \"{f}\""), "", ""),
        job(&format!("      mount_options = [\"{f}\"]"), "", ""),
        job(&format!("      mount_options = {n}"), "", ""),
        job("", &format!("      env = \"{e}\""), ""),
        job("", &format!("      env = {n}"), ""),
        job("", &format!("      env = [\"{e}\"]"), ""),
        job(
            "",
            &format!("      env {{\n        A = [\"{e}\"]\n      }}"),
            "",
        ),
        job(
            "",
            &format!("      env {{\n        A = {{ x = \"{e}\" }}\n      }}"),
            "",
        ),
        job(
            "",
            &format!("      env {{\n        A = \"{e}\\u0000\"\n      }}"),
            "",
        ),
        job(
            "",
            &format!("      env {{\n        A = \"{e}${{x}}\"\n      }}"),
            "",
        ),
        job(
            "",
            &format!("      env {{\n        A = \"{e}\" ]\n      }}"),
            "",
        ),
        job(
            "",
            &format!("      env {{\n        A = \"{e}\"\n        A = \"{e}\"\n      }}"),
            "",
        ),
    ]
    .into_iter()
    .map(|t| ("/j/j.hcl", t))
    .collect();
    let mo = |x: &str| job_json(&format!("\"mount_options\": {x}"), "", "");
    out.extend(
        [
            mo(&format!("\"{f}\"")),
            mo(&format!("[\"{f}\"]")),
            mo(&format!("{{\"{f}\": true}}")),
            mo(&format!("{{\"mount_flags\": \"{f}\"}}")),
            mo(&format!("{{\"mount_flags\": {n}}}")),
            mo(&format!("{{\"mount_flags\": {{\"a\": \"{f}\"}}}}")),
            mo(&format!("{{\"mount_flags\": {{\"{f}\": 1}}}}")),
            mo(&format!("{{\"mount_flags\": [{{\"a\": \"{f}\"}}]}}")),
            mo(&format!("{{\"mount_flags\": [[\"{f}\"]]}}")),
            mo(&format!("{{\"mount_flags\": [1, \"{f}\"]}}")),
            mo(&format!("{{\"mount_flags\": [\"{f}\\u0000\"]}}")),
            mo(&format!(
                "{{\"mount_flags\": [\"{f}\"], \"mount_flags\": [\"{f}\"]}}"
            )),
            mo(&format!(
                "[{{\"mount_flags\": [\"{f}\"]}}, {{\"mount_flags\": [\"{f}\"]}}]"
            )),
            mo(&format!("{{\"mount_flags\": [\"{f}\" }}")),
            job_json("", &format!("\"env\": \"{e}\""), ""),
            job_json("", &format!("\"env\": {n}"), ""),
            job_json("", &format!("\"env\": [\"{e}\"]"), ""),
            job_json("", &format!("\"env\": {{\"A\": [\"{e}\"]}}"), ""),
            job_json("", &format!("\"env\": {{\"A\": {{\"x\": \"{e}\"}}}}"), ""),
            job_json("", &format!("\"env\": {{\"A\": \"{e}\\u0000\"}}"), ""),
            job_json(
                "",
                &format!("\"env\": {{\"A\": \"{e}\", \"A\": \"{e}\"}}"),
                "",
            ),
        ]
        .into_iter()
        .map(|t| ("/j/j.json", t)),
    );
    out
}

#[test]
fn flags_and_env_values_in_wrong_shapes_never_show() {
    for (file, text) in wrong_shapes() {
        let e = parse(file, &text).expect_err(&text);
        let out = format!("{e} {e:?}");
        for canary in [FLAG, ENV, NUMBER] {
            assert!(!out.contains(canary), "leaked {canary}:\n{text}\n{out}");
        }
    }
}

#[test]
fn syntax_errors_far_along_a_line_are_reported() {
    let text = job("", "", &format!("x = \"{}\" ]\n", "y".repeat(70_000)));
    let e = parse("/j/j.hcl", &text).unwrap_err();
    assert!(e.message.starts_with("column 70"), "{e}");
    assert!(e.to_string().len() < 400, "{e}");
}
