//! Volume specs that try to crash or flood the reader: nesting 200,000 levels deep, texts over
//! 1 MiB, `fs_type` values no filesystem has, hostile file names, and secrets or mount flags in
//! every wrong shape. Each is refused with a `file:line: field: message` error that repeats no
//! secret, no flag and no raw control character.

use std::{path::Path, time::Instant};

use berth_volume::{Operation, SpecError, VolumeSpec};

const SECRET: &str = "canary-s3cr3t-7781";
const FLAG: &str = "canary-flag-4423";
/// A canary that is a number: serde would print it in "invalid type: integer `…`".
const SECRET_NUMBER: &str = "97531864";

/// A valid register spec; `extra` goes at the end.
fn reg(extra: &str) -> String {
    format!(
        "id = \"v\"\nexternal_id = \"e\"\ntype = \"csi\"\nplugin_id = \"p\"\ncapability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n{extra}"
    )
}

/// The same in JSON; `extra` holds more `"key": value` pairs.
fn reg_json(extra: &str) -> String {
    let sep = if extra.is_empty() { "" } else { ",\n" };
    format!(
        "{{\"id\": \"v\", \"external_id\": \"e\", \"type\": \"csi\", \"plugin_id\": \"p\",\n\"capability\": [{{\"access_mode\": \"single-node-writer\", \"attachment_mode\": \"file-system\"}}]{sep}{extra}}}"
    )
}

fn parse(file: &str, text: &str) -> Result<VolumeSpec, SpecError> {
    VolumeSpec::parse(Operation::Register, Path::new(file), text)
}

/// A spec with its nesting starting on line `reg("").lines().count() + 1`.
fn deep_hcl(shape: &str, n: usize) -> String {
    let (open, inner, close, lead) = match shape {
        "blocks" => ("a{\n", "", "}\n", ""),
        "objects" => ("{a=", "1", "}", "parameters="),
        "lists" => ("[", "1", "]", "parameters="),
        "tuples" => ("[1,", "2", "]", "parameters="),
        "parens" => ("(", "1", ")", "name="),
        "templates" => ("\"${", "1", "}\"", "name="),
        "directives" => ("%{if a}", "x", "%{endif}", "name=\""),
        other => panic!("{other}"),
    };
    let mut body = format!("{lead}{}{inner}{}", open.repeat(n), close.repeat(n));
    if shape == "directives" {
        body.push('"');
    }
    let text = reg(&body);
    if text.len() > berth_input::MAX_SPEC_BYTES {
        // Refused before the end; the closing half need not be there.
        return reg(&format!("{lead}{}", open.repeat(n)));
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
];

fn assert_too_deep(e: &SpecError, file: &str, line: usize) {
    assert_eq!(
        e.to_string(),
        format!("{file}:{line}: nesting deeper than 64 levels")
    );
}

#[test]
fn deep_hcl_is_refused_before_parsing() {
    let first = reg("").lines().count() + 1;
    for shape in SHAPES {
        // 65 levels: the 65th opening's line (blocks open one per line).
        let e = parse("/s/deep.hcl", &deep_hcl(shape, 65)).expect_err(shape);
        let line = if *shape == "blocks" {
            first + 64
        } else {
            first
        };
        assert_too_deep(&e, "/s/deep.hcl", line);

        // 200,000 levels (or as many as 1 MiB holds), on a small stack.
        let text = deep_hcl(shape, 200_000.min(berth_input::MAX_SPEC_BYTES / 8));
        assert!(text.len() <= berth_input::MAX_SPEC_BYTES, "{shape}");
        let started = Instant::now();
        let e =
            berth_testkit::on_small_stack(move || parse("/s/deep.hcl", &text)).expect_err(shape);
        assert!(e.message.contains("nesting deeper than 64"), "{shape}: {e}");
        eprintln!("{shape}: refused in {:?}", started.elapsed());
    }
}

#[test]
fn deep_json_is_refused_before_parsing() {
    let objects = |n: usize| {
        reg_json(&format!(
            "\"parameters\": {}1{}",
            "{\"\":".repeat(n),
            "}".repeat(n)
        ))
    };
    let arrays = |n: usize| {
        reg_json(&format!(
            "\"parameters\": {}1{}",
            "[".repeat(n),
            "]".repeat(n)
        ))
    };
    for (name, text) in [("objects", objects(65)), ("arrays", arrays(65))] {
        let e = parse("/s/deep.json", &text).expect_err(name);
        assert_too_deep(&e, "/s/deep.json", 3);
    }
    for text in [objects(190_000), arrays(200_000)] {
        assert!(text.len() <= berth_input::MAX_SPEC_BYTES);
        let e =
            berth_testkit::on_small_stack(move || parse("/s/deep.json", &text)).expect_err("deep");
        assert!(e.message.contains("nesting deeper than 64"), "{e}");
    }
}

#[test]
fn nesting_up_to_the_limit_reaches_the_checker() {
    // Parameters take strings: the checker, not the depth check, refuses these.
    for shape in ["objects", "lists", "tuples"] {
        let e = parse("/s/v.hcl", &deep_hcl(shape, 64)).expect_err(shape);
        assert!(e.field.starts_with("parameters"), "{shape}: {e}");
        assert!(!e.message.contains("nesting"), "{shape}: {e}");
    }
    let e = parse("/s/v.hcl", &deep_hcl("blocks", 64)).expect_err("blocks");
    assert_eq!(e.field, "a", "{e}");
    // The spec's own object is a level, and so is the parameters map.
    let json = reg_json(&format!(
        "\"parameters\": {{\"k\": {}1{}}}",
        "[".repeat(62),
        "]".repeat(62)
    ));
    let e = parse("/s/v.json", &json).expect_err("json");
    assert_eq!(e.field, "parameters.k", "{e}");
    // A real spec with a 64-deep comment, string and heredoc is a real spec.
    let braces = "{[(".repeat(50_000);
    let spec = reg(&format!(
        "# {braces}\n/* {braces} */\nname = <<EOT\n{braces}\nEOT\nparameters = {{ a = \"{braces}\" }}\n"
    ));
    let e = berth_testkit::on_small_stack(move || parse("/s/v.hcl", &spec))
        .expect_err("parameters too big");
    assert_eq!(e.field, "parameters", "{e}");
    assert!(e.message.contains("more than 4096"), "{e}");
    let spec = reg(&format!("# {braces}\nname = <<EOT\n{braces}\n  EOT\n"));
    let s = berth_testkit::on_small_stack(move || parse("/s/v.hcl", &spec)).expect("valid");
    assert_eq!(s.name, format!("{braces}\n"));
}

#[test]
fn texts_over_one_mib_are_refused_unread() {
    let pad = |n: usize| format!("# {}\n", "x".repeat(n));
    let base = reg("");
    let at = format!(
        "{}{base}",
        pad(berth_input::MAX_SPEC_BYTES - base.len() - 3)
    );
    assert_eq!(at.len(), berth_input::MAX_SPEC_BYTES);
    assert!(parse("/s/v.hcl", &at).is_ok());
    let over = format!("#{at}");
    let e = parse("/s/v.hcl", &over).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/s/v.hcl: too large: more than 1048576 bytes (1 MiB), the most berth reads in one file"
    );
    let e = parse(
        "/s/v.json",
        &format!("{}{}", " ".repeat(2 << 20), reg_json("")),
    )
    .unwrap_err();
    assert!(e.message.starts_with("too large"), "{e}");

    // load reads no more than the limit (and one byte).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.hcl");
    std::fs::write(&file, format!("{}{}", pad(4 << 20), reg(""))).unwrap();
    let e = VolumeSpec::load(Operation::Register, &file).unwrap_err();
    assert!(e.message.starts_with("too large"), "{e}");
}

#[test]
fn fs_type_must_be_a_filesystem_type() {
    let huge = "x".repeat(1_000_000);
    for bad in [
        huge.as_str(),
        "ext4\\u0000",
        "ext4,ro,../../x",
        "ext4 -o exec",
        "../../etc",
        "ext4\\n",
    ] {
        for (file, text) in [
            (
                "/s/v.hcl",
                reg(&format!("mount_options {{\n  fs_type = \"{bad}\"\n}}\n")),
            ),
            (
                "/s/v.json",
                reg_json(&format!("\"mount_options\": {{\"fs_type\": \"{bad}\"}}")),
            ),
        ] {
            let e = parse(file, &text).expect_err(bad);
            assert_eq!(e.field, "mount_options.fs_type", "{e}");
            assert!(e.message.starts_with("not a filesystem type ("), "{e}");
            let shown = e.to_string();
            assert!(shown.len() < 300, "{} bytes", shown.len());
            assert!(!shown.contains("../") && !shown.contains("ro,"), "{shown}");
        }
    }
    let e = parse(
        "/s/v.hcl",
        &reg("mount_options {\n  fs_type = \"ext4,ro\"\n}\n"),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "/s/v.hcl:{}: mount_options.fs_type: not a filesystem type (7 bytes; expected at most 64 of a-z, A-Z, 0-9, '.', '_', '-')",
            reg("").lines().count() + 2
        )
    );
    for good in ["ext4", "xfs", "fuse.sshfs", "nfs4", ""] {
        let s = parse(
            "/s/v.hcl",
            &reg(&format!("mount_options {{\n  fs_type = \"{good}\"\n}}\n")),
        )
        .unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(s.mount_options.fs_type, good);
    }
}

#[test]
fn hostile_file_names_are_escaped_and_cut() {
    let name = format!(
        "x\ny.hcl:1: forged\r\u{1b}[2J\u{202e}{}",
        "n".repeat(100_000)
    );
    let e = parse(&name, &reg("colour = 1\n")).unwrap_err();
    let shown = e.to_string();
    assert!(
        !shown.chars().any(berth_sys::is_unprintable),
        "raw control character in {shown:?}"
    );
    assert!(
        shown.starts_with("x\\ny.hcl:1: forged\\r\\u{1b}[2J\\u{202e}nnn"),
        "{shown}"
    );
    assert!(shown.len() < 400, "{} bytes", shown.len());
    assert!(shown.contains("…:"), "cut: {shown}");
    assert!(shown.ends_with(": colour: unknown field; expected one of: id, name, type, namespace, plugin_id, external_id, capacity_min, capacity_max, snapshot_id, clone_id, capability, mount_options, topology_request, secrets, parameters, context"), "{shown}");
    // Refused texts name it the same way.
    let e = parse(&name, &deep_hcl("lists", 65)).unwrap_err();
    assert!(!e.to_string().contains('\n'), "{e}");
}

#[test]
fn values_in_errors_are_escaped_and_cut() {
    let long = format!("evil\n\u{1b}[31m{}", "v".repeat(500_000));
    for (text, field) in [
        (
            reg(&format!(
                "namespace = \"{}\"\n",
                long.replace('\n', "\\n").replace('\u{1b}', "\\u001b")
            )),
            "namespace",
        ),
        (
            reg("").replace(
                "single-node-writer",
                &long.replace('\n', "\\n").replace('\u{1b}', "\\u001b"),
            ),
            "capability[0].access_mode",
        ),
        (
            reg("").replace(
                "\"csi\"",
                &format!(
                    "\"{}\"",
                    long.replace('\n', "\\n").replace('\u{1b}', "\\u001b")
                ),
            ),
            "type",
        ),
        (reg(&format!("{} = 1\n", "k".repeat(500_000))), ""),
        (
            reg(&format!(
                "parameters = {{ \"{}\" = [1] }}\n",
                long.replace('\n', "\\n").replace('\u{1b}', "\\u001b")
            )),
            "parameters[",
        ),
    ] {
        let e = parse("/s/v.hcl", &text).unwrap_err();
        let shown = e.to_string();
        assert!(
            e.field.starts_with(field),
            "{field}: {}",
            &shown[..200.min(shown.len())]
        );
        assert!(shown.len() < 1000, "{field}: {} bytes", shown.len());
        assert!(!shown.chars().any(berth_sys::is_unprintable), "{shown:?}");
    }
    // Many unknown keys: a few are listed.
    let keys: String = (0..10_000).map(|i| format!("k{i} = 1\n")).collect();
    let e = parse("/s/v.hcl", &reg(&keys)).unwrap_err();
    assert!(e.message.contains(" and 9991 more)"), "{e}");
    assert!(e.to_string().len() < 1000);
}

/// Every wrong shape of `secrets`, `mount_options` and `mount_flags`, with a canary in it.
fn wrong_shapes() -> Vec<(&'static str, String)> {
    let s = SECRET;
    let f = FLAG;
    let n = SECRET_NUMBER;
    let hcl = [
        format!("secrets = \"{s}\""),
        format!("secrets = {n}"),
        format!("secrets = [\"{s}\"]"),
        format!("secrets = [[\"{s}\"]]"),
        format!("secrets = [{{ k = {{ x = \"{s}\" }} }}]"),
        format!("secrets = {{ k = [\"{s}\"] }}"),
        format!("secrets = {{ k = {{ n = \"{s}\" }} }}"),
        format!("secrets = {{ k = {{ \"{s}\" = 1 }} }}"),
        format!("secrets = {{ k = [{{ x = \"{s}\" }}] }}"),
        format!("secrets = [{{ k = \"v\" }}, \"{s}\"]"),
        format!("secrets = {{ k = \"{s}${{x}}\" }}"),
        format!("secrets = {{ k = {s} }}"),
        format!("secrets = {{ k = \"{s}\", k = \"{s}\" }}"),
        format!("secrets {{\n  inner {{\n    k = \"{s}\"\n  }}\n}}"),
        format!("secrets = \"{s}\\q\""),
        format!("secrets = {{ k = \"{s}\" ]"),
        format!("mount_options = \"{f}\""),
        format!("mount_options = [\"{f}\"]"),
        format!("mount_options {{\n  \"{f}\" = true\n}}"),
        format!("mount_options {{\n  {f} = true\n}}"),
        format!("mount_options {{\n  mount_flags = \"{f}\"\n}}"),
        format!("mount_options {{\n  mount_flags = {n}\n}}"),
        format!("mount_options {{\n  mount_flags = {{ a = \"{f}\" }}\n}}"),
        format!("mount_options {{\n  mount_flags = {{ \"{f}\" = 1 }}\n}}"),
        format!("mount_options {{\n  mount_flags = [{{ a = \"{f}\" }}]\n}}"),
        format!("mount_options {{\n  mount_flags = [[\"{f}\"]]\n}}"),
        format!("mount_options {{\n  mount_flags = [1, \"{f}\", true]\n}}"),
        format!("mount_options {{\n  mount_flags = [\"{f}\\u0000\"]\n}}"),
        format!("mount_options {{\n  mount_flags = [\"{f}\"] ]\n}}"),
    ];
    let json = [
        format!("\"secrets\": \"{s}\""),
        format!("\"secrets\": {n}"),
        format!("\"secrets\": [\"{s}\"]"),
        format!("\"secrets\": [[\"{s}\"]]"),
        format!("\"secrets\": [{{\"k\": {{\"x\": \"{s}\"}}}}]"),
        format!("\"secrets\": {{\"k\": [\"{s}\"]}}"),
        format!("\"secrets\": {{\"k\": {{\"n\": \"{s}\"}}}}"),
        format!("\"secrets\": {{\"k\": {{\"{s}\": 1}}}}"),
        format!("\"secrets\": {{\"k\": null, \"j\": [{{\"x\": \"{s}\"}}]}}"),
        format!("\"secrets\": {{\"k\": \"{s}\\q\"}}"),
        format!("\"secrets\": {{\"k\": \"{s}\" ]"),
        format!("\"mount_options\": \"{f}\""),
        format!("\"mount_options\": [\"{f}\"]"),
        format!("\"mount_options\": {{\"{f}\": true}}"),
        format!("\"mount_options\": {{\"mount_flags\": \"{f}\"}}"),
        format!("\"mount_options\": {{\"mount_flags\": {n}}}"),
        format!("\"mount_options\": {{\"mount_flags\": {{\"a\": \"{f}\"}}}}"),
        format!("\"mount_options\": {{\"mount_flags\": {{\"{f}\": 1}}}}"),
        format!("\"mount_options\": {{\"mount_flags\": [{{\"a\": \"{f}\"}}]}}"),
        format!("\"mount_options\": {{\"mount_flags\": [[\"{f}\"]]}}"),
        format!("\"mount_options\": {{\"mount_flags\": [1, \"{f}\"]}}"),
        format!(
            "\"mount_options\": [{{\"mount_flags\": [\"{f}\"]}}, {{\"mount_flags\": [\"{f}\"]}}]"
        ),
    ];
    let mut out: Vec<(&'static str, String)> = hcl
        .into_iter()
        .map(|x| ("/s/v.hcl", reg(&format!("{x}\n"))))
        .collect();
    out.extend(json.into_iter().map(|x| ("/s/v.json", reg_json(&x))));
    out
}

#[test]
fn secrets_and_flags_in_wrong_shapes_never_show() {
    for (file, text) in wrong_shapes() {
        for op in [Operation::Register, Operation::Create] {
            let text = if op == Operation::Create {
                text.replace("\"external_id\": \"e\", ", "")
                    .replace("external_id = \"e\"\n", "")
            } else {
                text.clone()
            };
            let e = VolumeSpec::parse(op, Path::new(file), &text)
                .expect_err(&text[text.len().saturating_sub(80)..]);
            let out = format!("{e} {e:?}");
            for canary in [SECRET, FLAG, SECRET_NUMBER] {
                assert!(!out.contains(canary), "leaked {canary}:\n{text}\n{out}");
            }
        }
    }
}

#[test]
fn syntax_errors_far_along_a_line_are_reported() {
    // hcl's own error text cannot be formatted past column 65535.
    for text in [
        reg(&format!("name = \"{}\" ]\n", "x".repeat(70_000))),
        reg(&format!("name = \"{}\" ]\n", "x".repeat(70_000))).replace('\n', " "),
        format!("{}\n{}", " ".repeat(100_000), reg("]")),
    ] {
        let e = parse("/s/v.hcl", &text).unwrap_err();
        assert!(e.line.is_some(), "{e}");
        assert!(e.to_string().len() < 400, "{e}");
    }
}
