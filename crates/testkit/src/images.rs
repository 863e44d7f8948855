//! Container images built offline for the `docker` driver's tests: a root holding Debian's
//! static busybox and any binaries of this workspace (with the shared libraries they load),
//! imported into a podman storage of the test's own.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// Where Debian's `busybox-static` puts busybox.
pub const BUSYBOX: &str = "/bin/busybox";

/// podman with a storage of its own under a temporary directory: every container and image
/// of it is removed when dropped.
#[derive(Debug)]
pub struct TestPodman {
    dir: tempfile::TempDir,
}

impl TestPodman {
    /// A new, empty storage.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["root", "run"] {
            fs::create_dir(dir.path().join(sub)).expect("storage dir");
        }
        Self { dir }
    }

    /// podman's `--root`.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// podman's `--runroot`.
    pub fn run_root(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// `podman` with this storage's global flags (those the driver passes too).
    pub fn command(&self) -> Command {
        self.with_globals(Command::new("podman"))
    }

    fn with_globals(&self, mut cmd: Command) -> Command {
        cmd.args(["--runtime", "runc", "--root"])
            .arg(self.root())
            .arg("--runroot")
            .arg(self.run_root())
            .arg("--tmpdir")
            .arg(self.run_root().join("libpod"));
        cmd
    }

    /// Runs `podman <args>` and returns its output; panics when it cannot run.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .output()
            .expect("running podman (Debian's podman package)")
    }

    /// The ids of every container of this storage.
    pub fn containers(&self) -> Vec<String> {
        self.containers_from(self.command())
    }

    /// [`containers`](Self::containers) as seen from mount namespace `ns` (where the agent
    /// that ran them keeps their network namespaces).
    pub fn containers_in(&self, ns: &crate::MountNamespace) -> Vec<String> {
        self.containers_from(self.with_globals(ns.command("podman")))
    }

    fn containers_from(&self, mut cmd: Command) -> Vec<String> {
        let out = cmd
            .args(["ps", "--all", "--no-trunc", "--format", "{{.ID}}"])
            .output()
            .expect("running podman");
        assert!(
            out.status.success(),
            "podman ps failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Builds image `name` (e.g. `localhost/busybox:test`): busybox with every applet, the
    /// workspace binaries `binaries` in `/bin` (with their shared libraries), `/etc/passwd`
    /// with root and nobody, and `entrypoint` (a JSON array) when given.
    pub fn build_image(&self, name: &str, binaries: &[&Path], entrypoint: Option<&str>) {
        let work = tempfile::tempdir().expect("tempdir");
        let root = work.path().join("rootfs");
        for dir in ["bin", "etc", "tmp", "proc", "sys", "dev", "lib64", "run"] {
            fs::create_dir_all(root.join(dir)).expect("rootfs dir");
        }
        assert!(
            Path::new(BUSYBOX).is_file(),
            "{BUSYBOX} is missing: install Debian's busybox-static (scripts/setup.sh does)"
        );
        fs::copy(BUSYBOX, root.join("bin/busybox")).expect("copying busybox");
        let list = Command::new(BUSYBOX)
            .arg("--list")
            .output()
            .expect("busybox --list");
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" && !applet.contains('/') {
                let _ = symlink("busybox", root.join("bin").join(applet));
            }
        }
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        )
        .expect("passwd");
        fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").expect("group");
        for bin in binaries {
            let name = bin.file_name().expect("binary name");
            fs::copy(bin, root.join("bin").join(name)).expect("copying a binary");
            for lib in shared_libraries(bin) {
                let inside = root.join(lib.strip_prefix("/").expect("absolute"));
                fs::create_dir_all(inside.parent().expect("parent")).expect("lib dir");
                fs::copy(&lib, &inside).expect("copying a library");
            }
        }
        let tar = work.path().join("rootfs.tar");
        let status = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("tar");
        assert!(status.success(), "tar failed");
        let mut args: Vec<String> = vec!["import".into()];
        if let Some(entry) = entrypoint {
            args.push("--change".into());
            args.push(format!("ENTRYPOINT {entry}"));
        }
        args.push("--change".into());
        args.push("ENV PATH=/bin".into());
        args.push(tar.display().to_string());
        args.push(name.into());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.run(&refs);
        assert!(
            out.status.success(),
            "podman import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Saves image `name` as a docker-archive at `path`.
    pub fn save_docker_archive(&self, name: &str, path: &Path) {
        let out = self.run(&[
            "save",
            "--format",
            "docker-archive",
            "-o",
            &path.display().to_string(),
            name,
        ]);
        assert!(
            out.status.success(),
            "podman save failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Default for TestPodman {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestPodman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
    }
}

/// The shared libraries `bin` loads, with the loader, as `ldd` lists them.
fn shared_libraries(bin: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("ldd").arg(bin).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            line.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}
