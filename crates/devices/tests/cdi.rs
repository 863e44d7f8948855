//! CDI spec directories with real files: loading, priorities, conflicts, refused files, and
//! resolution into container edits.

use std::{
    fs,
    path::{Path, PathBuf},
};

use berth_devices::{
    cdi::{CdiError, CdiRegistry, CdiSpec, CdiSpecError, QualifiedName},
    model::{DeviceMount, DeviceNode},
};

fn qn(s: &str) -> QualifiedName {
    QualifiedName::parse(s).unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

/// Two spec directories, lowest priority first, removed on drop.
struct Dirs {
    _root: tempfile::TempDir,
    low: PathBuf,
    high: PathBuf,
}

impl Dirs {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let low = root.path().join("etc-cdi");
        let high = root.path().join("run-cdi");
        fs::create_dir(&low).unwrap();
        fs::create_dir(&high).unwrap();
        Self {
            _root: root,
            low,
            high,
        }
    }

    fn load(&self) -> CdiRegistry {
        CdiRegistry::load(&[self.low.clone(), self.high.clone()])
    }
}

const ACME_JSON: &str = r#"{
  "cdiVersion": "0.6.0",
  "kind": "example.com/device",
  "containerEdits": {
    "env": ["ACME_DRIVER=1"],
    "mounts": [{"hostPath": "/opt/acme/lib", "containerPath": "/usr/lib/acme",
                "type": "none", "options": ["ro", "nosuid", "nodev", "bind"]}]
  },
  "devices": [
    {
      "name": "dev0",
      "containerEdits": {
        "env": ["ACME_VISIBLE=0"],
        "deviceNodes": [
          {"path": "/dev/acme0", "hostPath": "/dev/acme/card0", "permissions": "rw"},
          {"path": "/dev/acmectl"}
        ]
      }
    },
    {
      "name": "dev1",
      "containerEdits": {
        "env": ["ACME_VISIBLE=1"],
        "deviceNodes": [{"path": "/dev/acme1", "permissions": "none"}]
      }
    }
  ]
}"#;

const ACME_YAML: &str = "\
cdiVersion: 0.6.0
kind: example.com/device
containerEdits:
  env:
  - ACME_DRIVER=1
  mounts:
  - hostPath: /opt/acme/lib
    containerPath: /usr/lib/acme
    type: none
    options: [ro, nosuid, nodev, bind]
devices:
- name: dev0
  containerEdits:
    env: [ACME_VISIBLE=0]
    deviceNodes:
    - path: /dev/acme0
      hostPath: /dev/acme/card0
      permissions: rw
    - path: /dev/acmectl
- name: dev1
  containerEdits:
    env: [ACME_VISIBLE=1]
    deviceNodes:
    - {path: /dev/acme1, permissions: none}
";

fn node(host: &str, task: &str, permissions: &str) -> DeviceNode {
    DeviceNode {
        host_path: host.into(),
        task_path: task.into(),
        permissions: permissions.into(),
    }
}

#[test]
fn json_and_yaml_specs_resolve_to_nodes_env_and_mounts() {
    for (file, text) in [
        ("acme.json", ACME_JSON),
        ("acme.yaml", ACME_YAML),
        ("acme.yml", ACME_YAML),
    ] {
        let dirs = Dirs::new();
        let path = write(&dirs.low, file, text);
        let reg = dirs.load();
        assert!(reg.errors().is_empty(), "{file}: {:?}", reg.errors());
        assert_eq!(
            reg.devices(),
            vec![
                (qn("example.com/device=dev0"), path.clone()),
                (qn("example.com/device=dev1"), path.clone()),
            ],
            "{file}"
        );
        let out = reg.resolve(&[qn("example.com/device=dev0")]).unwrap();
        assert_eq!(out.env["ACME_DRIVER"], "1", "{file}");
        assert_eq!(out.env["ACME_VISIBLE"], "0", "{file}");
        assert_eq!(
            out.device_nodes,
            [
                node("/dev/acme/card0", "/dev/acme0", "rw"),
                node("/dev/acmectl", "/dev/acmectl", "rwm"),
            ],
            "{file}"
        );
        assert_eq!(
            out.mounts,
            [DeviceMount {
                host_path: "/opt/acme/lib".into(),
                task_path: "/usr/lib/acme".into(),
                read_only: true,
            }],
            "{file}"
        );
        assert!(out.cdi_devices.is_empty());
        let (spec, device) = reg.device(&qn("example.com/device=dev1")).unwrap();
        assert_eq!(spec.path(), path);
        assert_eq!(device.name, "dev1");
    }
}

#[test]
fn spec_edits_are_applied_once_for_several_devices() {
    let dirs = Dirs::new();
    write(&dirs.low, "acme.json", ACME_JSON);
    let reg = dirs.load();
    let out = reg
        .resolve_names(&["example.com/device=dev0", "example.com/device=dev1"])
        .unwrap();
    assert_eq!(out.mounts.len(), 1, "{out:?}");
    assert_eq!(out.env["ACME_VISIBLE"], "1");
    assert_eq!(
        out.device_nodes,
        [
            node("/dev/acme/card0", "/dev/acme0", "rw"),
            node("/dev/acmectl", "/dev/acmectl", "rwm"),
            // `none`: the node is there, the device cgroup allows nothing.
            node("/dev/acme1", "/dev/acme1", ""),
        ]
    );
}

fn one_device(kind: &str, name: &str, env: &str) -> String {
    format!(
        r#"{{"cdiVersion": "1.1.0", "kind": "{kind}",
            "devices": [{{"name": "{name}", "containerEdits": {{"env": ["{env}"]}}}}]}}"#
    )
}

#[test]
fn a_later_directory_overrides_an_earlier_one() {
    let dirs = Dirs::new();
    write(
        &dirs.low,
        "a.json",
        &one_device("example.com/device", "dev0", "FROM=etc"),
    );
    write(
        &dirs.low,
        "b.json",
        &one_device("example.com/device", "dev1", "FROM=etc"),
    );
    let high = write(
        &dirs.high,
        "z.yaml",
        &one_device("example.com/device", "dev0", "FROM=run"),
    );
    let reg = dirs.load();
    assert!(reg.errors().is_empty(), "{:?}", reg.errors());
    let out = reg.resolve(&[qn("example.com/device=dev0")]).unwrap();
    assert_eq!(out.env["FROM"], "run");
    let out = reg.resolve(&[qn("example.com/device=dev1")]).unwrap();
    assert_eq!(out.env["FROM"], "etc");
    assert_eq!(
        reg.device(&qn("example.com/device=dev0")).unwrap().0.path(),
        high
    );
}

#[test]
fn a_device_defined_twice_in_one_directory_resolves_to_neither() {
    let dirs = Dirs::new();
    let a = write(
        &dirs.high,
        "a.json",
        &one_device("example.com/device", "dev0", "X=a"),
    );
    let b = write(
        &dirs.high,
        "b.yaml",
        &one_device("example.com/device", "dev0", "X=b"),
    );
    write(
        &dirs.high,
        "c.json",
        &one_device("example.com/device", "dev1", "X=c"),
    );
    let reg = dirs.load();
    let name = qn("example.com/device=dev0");
    let e = reg.resolve(std::slice::from_ref(&name)).unwrap_err();
    let msg = e.to_string();
    match &e {
        CdiError::Conflict { name: n, files } => {
            assert_eq!(n, &name.to_string());
            assert_eq!(files, &[a.clone(), b.clone()]);
        }
        other => panic!("{other:?}"),
    }
    assert!(msg.contains(&a.display().to_string()), "{msg}");
    assert!(msg.contains(&b.display().to_string()), "{msg}");
    assert!(msg.contains("same directory"), "{msg}");
    assert_eq!(reg.errors().len(), 1, "{:?}", reg.errors());
    assert!(matches!(reg.errors()[0], CdiError::Conflict { .. }));
    // The other device of the same directory still resolves; the conflict is not listed.
    reg.resolve(&[qn("example.com/device=dev1")]).unwrap();
    assert_eq!(reg.devices().len(), 1);

    // A single definition in a higher directory wins over a lower directory's conflict.
    let dirs2 = Dirs::new();
    write(
        &dirs2.low,
        "a.json",
        &one_device("example.com/device", "dev0", "X=a"),
    );
    write(
        &dirs2.low,
        "b.json",
        &one_device("example.com/device", "dev0", "X=b"),
    );
    write(
        &dirs2.high,
        "c.json",
        &one_device("example.com/device", "dev0", "X=c"),
    );
    let reg = dirs2.load();
    assert!(reg.errors().is_empty(), "{:?}", reg.errors());
    assert_eq!(reg.resolve(&[name]).unwrap().env["X"], "c");
}

fn spec_error(reg: &CdiRegistry, file: &Path) -> String {
    reg.errors()
        .iter()
        .find_map(|e| match e {
            CdiError::Spec(s) if s.path() == file => Some(s.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no error for {}: {:?}", file.display(), reg.errors()))
}

#[test]
fn refused_files_name_file_and_field_and_change_nothing_else() {
    let dirs = Dirs::new();
    let good = write(&dirs.low, "good.json", ACME_JSON);
    let p = "devices[0].containerEdits";
    let cases: Vec<(&str, String, String)> = vec![
        (
            "version.json",
            one_device("bad.com/v", "d", "A=1").replace("1.1.0", "9.9.9"),
            r#"cdiVersion: "9.9.9": unsupported"#.into(),
        ),
        (
            "kind.json",
            one_device("bad", "d", "A=1"),
            r#"kind: "bad": expected vendor/class"#.into(),
        ),
        (
            "name.json",
            one_device("bad.com/n", "d/0", "A=1"),
            "devices[0].name: device name \"d/0\" holds \"/\"".into(),
        ),
        (
            "relative.yaml",
            "cdiVersion: 1.1.0\nkind: bad.com/r\ndevices:\n- name: ok\n  containerEdits:\n    \
             env: [A=1]\n- name: d\n  containerEdits:\n    deviceNodes:\n    - path: dev/x\n"
                .into(),
            "devices[1].containerEdits.deviceNodes[0].path: must be an absolute path".into(),
        ),
        (
            "env.json",
            one_device("bad.com/e", "d", "NOVALUE"),
            format!("{p}.env[0]: \"NOVALUE\": expected NAME=VALUE"),
        ),
        (
            "perm.json",
            r#"{"cdiVersion": "1.1.0", "kind": "bad.com/p", "devices": [{"name": "d",
                "containerEdits": {"deviceNodes": [{"path": "/dev/p", "permissions": "rx"}]}}]}"#
                .into(),
            format!("{p}.deviceNodes[0].permissions: \"rx\": expected one or more of r, w and m"),
        ),
        (
            "unknown-field.yaml",
            "cdiVersion: 1.1.0\nkind: bad.com/u\ndevices:\n- name: d\n  containerEdits:\n    \
             env: [A=1]\n    devicenodes: []\n"
                .into(),
            format!(":7: {p}: unknown field `devicenodes`, expected one of"),
        ),
        (
            "duplicate.json",
            r#"{"cdiVersion": "1.1.0", "kind": "bad.com/d", "devices": [
                {"name": "d", "containerEdits": {"env": ["A=1"]}},
                {"name": "d", "containerEdits": {"env": ["A=2"]}}]}"#
                .into(),
            "devices[1].name: \"d\" is also the name of devices[0]".into(),
        ),
        (
            "empty.json",
            r#"{"cdiVersion": "1.1.0", "kind": "bad.com/empty", "devices": []}"#.into(),
            "devices: a spec must define at least one device".into(),
        ),
        (
            "syntax.yaml",
            "cdiVersion: 1.1.0\nkind: bad.com/s\ndevices:\n  - name: d\n    containerEdits: {env: [A=1]\n"
                .into(),
            ":6: ".into(),
        ),
    ];
    let mut paths = Vec::new();
    for (file, text, _) in &cases {
        paths.push(write(&dirs.low, file, text));
    }
    let reg = dirs.load();
    for ((file, _, want), path) in cases.iter().zip(&paths) {
        let msg = spec_error(&reg, path);
        assert!(
            msg.starts_with(&path.display().to_string()),
            "{file}: {msg}"
        );
        assert!(msg.contains(want.as_str()), "{file}: {msg}\nwanted: {want}");
    }
    assert_eq!(reg.errors().len(), cases.len(), "{:?}", reg.errors());
    // The good file's devices resolve; no bad file contributed anything, not even the valid
    // device `ok` of relative.yaml.
    let names: Vec<_> = reg
        .devices()
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(
        names,
        ["example.com/device=dev0", "example.com/device=dev1"]
    );
    assert!(reg.devices().iter().all(|(_, p)| *p == good));
    reg.resolve(&[qn("example.com/device=dev0")]).unwrap();
    let e = reg.resolve(&[qn("bad.com/r=ok")]).unwrap_err();
    assert!(matches!(e, CdiError::Unknown { .. }), "{e}");
    assert!(e.to_string().contains("relative.yaml"), "{e}");
}

#[test]
fn a_yaml_syntax_error_reports_its_line() {
    let d = tempfile::tempdir().unwrap();
    let path = write(
        d.path(),
        "broken.yaml",
        "cdiVersion: 1.1.0\nkind: example.com/device\ndevices:\n- name: dev0\n  containerEdits:\n\
         \tenv: [A=1]\n",
    );
    let e = CdiSpec::load(&path).unwrap_err();
    assert!(matches!(e, CdiSpecError::Syntax { .. }), "{e:?}");
    assert_eq!(e.line(), Some(6), "{e}");
    assert!(
        e.to_string()
            .starts_with(&format!("{}:6: ", path.display())),
        "{e}"
    );
}

#[test]
fn only_spec_files_are_read_and_symlinks_only_to_regular_files() {
    let dirs = Dirs::new();
    let target = write(dirs.high.parent().unwrap(), "outside.json", ACME_JSON);
    std::os::unix::fs::symlink(&target, dirs.low.join("linked.json")).unwrap();
    std::os::unix::fs::symlink("/dev/null", dirs.low.join("null.json")).unwrap();
    std::os::unix::fs::symlink(dirs.low.join("gone"), dirs.low.join("dangling.yaml")).unwrap();
    fs::create_dir(dirs.low.join("dir.json")).unwrap();
    write(&dirs.low, "notes.txt", "not a spec");
    write(&dirs.low, "acme.json.bak", "not a spec either");
    let reg = dirs.load();
    assert_eq!(reg.devices().len(), 2, "{:?}", reg.errors());
    assert!(
        reg.devices()
            .iter()
            .all(|(_, p)| p.ends_with("linked.json"))
    );
    let msg = spec_error(&reg, &dirs.low.join("null.json"));
    assert!(msg.contains("not a regular file"), "{msg}");
    spec_error(&reg, &dirs.low.join("dangling.yaml"));
    assert_eq!(reg.errors().len(), 2, "{:?}", reg.errors());
}

#[test]
fn an_unlistable_directory_is_an_error_and_a_missing_one_is_not() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "plain", "");
    let reg = CdiRegistry::load(&[d.path().join("missing"), file.clone()]);
    assert_eq!(reg.errors().len(), 1, "{:?}", reg.errors());
    match &reg.errors()[0] {
        CdiError::Dir { dir, .. } => assert_eq!(dir, &file),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reload_sees_what_changed_and_unsupported_fields_are_named() {
    let dirs = Dirs::new();
    let reg0 = dirs.load();
    assert!(reg0.devices().is_empty());
    let path = write(
        &dirs.low,
        "hooks.json",
        r#"{"cdiVersion": "0.7.0", "kind": "example.com/hooked",
            "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "/bin/ldconfig"}]},
            "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}]}"#,
    );
    write(
        &dirs.low,
        "gids.json",
        r#"{"cdiVersion": "0.7.0", "kind": "example.com/gids", "devices": [
            {"name": "ok", "containerEdits": {"env": ["A=1"], "additionalGids": [0]}},
            {"name": "d", "containerEdits": {"env": ["A=1"], "additionalGids": [44]}}]}"#,
    );
    let mut reg = reg0;
    reg.reload();
    assert_eq!(reg.devices().len(), 3, "{:?}", reg.errors());
    let e = reg.resolve(&[qn("example.com/hooked=d")]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "CDI device example.com/hooked=d: {}: containerEdits.hooks: ",
            path.display()
        )),
        "{msg}"
    );
    let e = reg.resolve(&[qn("example.com/gids=d")]).unwrap_err();
    assert!(
        e.to_string()
            .contains("devices[1].containerEdits.additionalGids"),
        "{e}"
    );
    reg.resolve(&[qn("example.com/gids=ok")]).unwrap();
}
