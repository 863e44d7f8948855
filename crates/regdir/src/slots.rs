//! What the watcher knows about each path in the directory, and what to do when a path is
//! looked at again. Pure bookkeeping: no I/O besides `lstat`, no sink calls.

use std::{
    collections::HashMap,
    fs::Metadata,
    io,
    os::unix::{ffi::OsStrExt as _, fs::FileTypeExt as _, fs::MetadataExt as _},
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::DiscoveredPlugin;

/// One particular socket file: a socket removed and created again at the same path is a
/// different one, even if the inode number is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketId {
    dev: u64,
    ino: u64,
    /// Birth time where the filesystem records it, else the change time.
    born: Option<SystemTime>,
    ctime: (i64, i64),
}

impl SocketId {
    fn of(meta: &Metadata) -> Self {
        let born = meta.created().ok();
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            born,
            // With a birth time, a chmod (which moves ctime) is not a new socket.
            ctime: if born.is_some() {
                (0, 0)
            } else {
                (meta.ctime(), meta.ctime_nsec())
            },
        }
    }

    #[cfg(test)]
    pub(crate) fn fake(ino: u64) -> Self {
        Self {
            dev: 1,
            ino,
            born: None,
            ctime: (0, 0),
        }
    }
}

/// The socket at `path` if it is one the watcher cares about: a unix socket (not followed
/// through a symlink) whose name does not start with `.`. `None` for anything else, and for a
/// path that is gone.
pub(crate) fn socket_at(path: &Path) -> Option<SocketId> {
    if path
        .file_name()
        .is_none_or(|n| n.as_bytes().first() == Some(&b'.'))
    {
        return None;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => Some(SocketId::of(&meta)),
        Ok(_) => None,
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(socket = %path.display(), error = %e, "cannot stat; treated as gone");
            None
        }
    }
}

/// What is known about one path.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    /// A job for this path is running; look again when it ends.
    Busy,
    /// This socket's plugin is registered with the sink.
    Registered {
        id: SocketId,
        plugin: DiscoveredPlugin,
    },
    /// This socket was tried and not registered; not tried again until it changes.
    Skipped { id: SocketId },
}

/// Work for one path, run off the watcher's loop: deregister first, then register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    /// The plugin whose socket is gone or was replaced.
    pub(crate) deregister: Option<DiscoveredPlugin>,
    /// The socket to ask `GetInfo`.
    pub(crate) register: Option<SocketId>,
}

/// How a job ended.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Registered {
        id: SocketId,
        plugin: DiscoveredPlugin,
    },
    Skipped {
        id: SocketId,
    },
    /// Nothing is registered for the path any more.
    Gone,
}

/// What to do with a path, given what is known (`slot`) and what is there now (`now`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing changed (or a job is running and will look again).
    Nothing,
    /// A skipped socket is gone: forget it.
    Forget,
    /// Run this job.
    Start(Job),
}

pub(crate) fn plan(slot: Option<&Slot>, now: Option<SocketId>) -> Plan {
    match (slot, now) {
        (Some(Slot::Busy), _) | (None, None) => Plan::Nothing,
        (None, Some(id)) => Plan::Start(Job {
            deregister: None,
            register: Some(id),
        }),
        (Some(Slot::Registered { id, .. }), Some(now)) if *id == now => Plan::Nothing,
        (Some(Slot::Registered { plugin, .. }), now) => Plan::Start(Job {
            deregister: Some(plugin.clone()),
            register: now,
        }),
        (Some(Slot::Skipped { id }), Some(now)) if *id == now => Plan::Nothing,
        (Some(Slot::Skipped { .. }), Some(now)) => Plan::Start(Job {
            deregister: None,
            register: Some(now),
        }),
        (Some(Slot::Skipped { .. }), None) => Plan::Forget,
    }
}

/// Every path the watcher knows, and its state. One owner: the watcher's loop.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    slots: HashMap<PathBuf, Slot>,
}

impl Slots {
    /// Looks at `path` again (with `now`, what is there) and returns the job to start, if any.
    /// A started job marks the path busy until [`Slots::complete`].
    pub(crate) fn reconcile(&mut self, path: &Path, now: Option<SocketId>) -> Option<Job> {
        match plan(self.slots.get(path), now) {
            Plan::Nothing => None,
            Plan::Forget => {
                self.slots.remove(path);
                None
            }
            Plan::Start(job) => {
                self.slots.insert(path.to_path_buf(), Slot::Busy);
                Some(job)
            }
        }
    }

    /// Records how the job for `path` ended.
    pub(crate) fn complete(&mut self, path: &Path, outcome: Outcome) {
        match outcome {
            Outcome::Registered { id, plugin } => {
                self.slots
                    .insert(path.to_path_buf(), Slot::Registered { id, plugin });
            }
            Outcome::Skipped { id } => {
                self.slots.insert(path.to_path_buf(), Slot::Skipped { id });
            }
            Outcome::Gone => {
                self.slots.remove(path);
            }
        }
    }

    /// The paths known, in no particular order.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Path> {
        self.slots.keys().map(PathBuf::as_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(name: &str) -> DiscoveredPlugin {
        DiscoveredPlugin {
            name: name.into(),
            endpoint: "/run/csi.sock".into(),
            registration_socket: "/reg/a.sock".into(),
            versions: vec!["1.0.0".into()],
        }
    }

    fn start(deregister: Option<DiscoveredPlugin>, register: Option<SocketId>) -> Plan {
        Plan::Start(Job {
            deregister,
            register,
        })
    }

    #[test]
    fn plan_covers_every_case() {
        let (a, b) = (SocketId::fake(1), SocketId::fake(2));
        let reg = Slot::Registered {
            id: a,
            plugin: plugin("p"),
        };
        let skip = Slot::Skipped { id: a };

        assert_eq!(plan(None, None), Plan::Nothing);
        assert_eq!(plan(None, Some(a)), start(None, Some(a)));
        assert_eq!(plan(Some(&Slot::Busy), Some(b)), Plan::Nothing);
        assert_eq!(plan(Some(&Slot::Busy), None), Plan::Nothing);
        assert_eq!(plan(Some(&reg), Some(a)), Plan::Nothing);
        assert_eq!(plan(Some(&reg), None), start(Some(plugin("p")), None));
        assert_eq!(plan(Some(&reg), Some(b)), start(Some(plugin("p")), Some(b)));
        assert_eq!(plan(Some(&skip), Some(a)), Plan::Nothing, "no hammering");
        assert_eq!(plan(Some(&skip), Some(b)), start(None, Some(b)), "changed");
        assert_eq!(plan(Some(&skip), None), Plan::Forget);
    }

    #[test]
    fn a_rescan_sees_what_events_missed() {
        // A full scan is reconcile on every listed and every known path; a missed create or
        // delete is simply found there.
        let mut slots = Slots::default();
        let p = Path::new("/reg/a.sock");
        let job = slots
            .reconcile(p, Some(SocketId::fake(1)))
            .expect("new socket");
        assert_eq!(job.register, Some(SocketId::fake(1)));
        assert!(
            slots.reconcile(p, Some(SocketId::fake(1))).is_none(),
            "busy"
        );
        slots.complete(
            p,
            Outcome::Registered {
                id: SocketId::fake(1),
                plugin: plugin("p"),
            },
        );
        assert!(
            slots.reconcile(p, Some(SocketId::fake(1))).is_none(),
            "unchanged"
        );
        let job = slots.reconcile(p, None).expect("gone");
        assert_eq!(job.deregister, Some(plugin("p")));
        assert_eq!(job.register, None);
        slots.complete(p, Outcome::Gone);
        assert_eq!(slots.paths().count(), 0);

        let job = slots.reconcile(p, Some(SocketId::fake(2))).expect("back");
        slots.complete(
            p,
            Outcome::Skipped {
                id: job.register.expect("id"),
            },
        );
        assert!(slots.reconcile(p, Some(SocketId::fake(2))).is_none());
        assert!(slots.reconcile(p, None).is_none());
        assert_eq!(
            slots.paths().count(),
            0,
            "a skipped socket that is gone is forgotten"
        );
    }

    #[test]
    fn socket_at_sees_only_visible_sockets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("a.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let hidden = dir.path().join(".a.sock");
        let _h = std::os::unix::net::UnixListener::bind(&hidden).expect("bind");
        let file = dir.path().join("file.sock");
        std::fs::write(&file, b"").expect("write");
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&sock, &link).expect("symlink");

        let id = socket_at(&sock).expect("socket");
        assert_eq!(socket_at(&sock), Some(id), "stable");
        assert_eq!(socket_at(&hidden), None);
        assert_eq!(socket_at(&file), None);
        assert_eq!(socket_at(&link), None);
        assert_eq!(socket_at(dir.path()), None);
        assert_eq!(socket_at(&dir.path().join("missing.sock")), None);

        // The old listener keeps its inode alive, so the new one cannot reuse its number.
        std::fs::remove_file(&sock).expect("rm");
        let _l2 = std::os::unix::net::UnixListener::bind(&sock).expect("bind again");
        assert_ne!(socket_at(&sock), Some(id), "a new socket at the same path");
        drop(_l);
    }
}
