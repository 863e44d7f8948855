//! Reading the files a command is given (specs, secrets, the agent's config): regular files or
//! standard input only, and never more than a bound, so `/dev/zero`, a FIFO or a huge file is
//! refused at once instead of hanging or filling memory.

use std::{
    io,
    path::{Path, PathBuf},
};

use berth_api::volumes::SpecFormat;
use berth_input::{OpenError, open_regular, read_bounded};

/// The most a spec file (or any other file the CLI reads) may hold: 1 MiB, the agent's own
/// bound for a spec. Its API takes request bodies up to 2 MiB, room for a spec escaped in a JSON
/// string.
pub const MAX_INPUT_BYTES: u64 = berth_api::volumes::MAX_SPEC_BYTES as u64;

/// What the bound reads as in messages.
const MAX_INPUT_TEXT: &str = "1 MiB";

/// Where the text comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Standard input (`-`).
    Stdin,
    /// A file.
    File(PathBuf),
}

impl Source {
    /// `-` is standard input; anything else a file.
    pub fn from_arg(arg: &Path) -> Self {
        if arg.as_os_str() == "-" {
            Self::Stdin
        } else {
            Self::File(arg.to_path_buf())
        }
    }

    /// The name of the source in messages and in the request: the path, or `<stdin>`.
    pub fn name(&self) -> String {
        match self {
            Self::Stdin => "<stdin>".into(),
            Self::File(path) => path.display().to_string(),
        }
    }
}

/// Why an input could not be read. Never holds any of its text. `label` is the path (or
/// `<stdin>`), after what it is for when that is not plain from the command (`--secrets-file
/// PATH`).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The path is not a regular file (a directory, a device, a FIFO, a socket).
    #[error(
        "{label}: is {kind}, not a regular file (give a file{stdin})",
        stdin = if *stdin_ok { ", or - for standard input" } else { "" }
    )]
    NotRegular {
        /// What is read.
        label: String,
        /// What it is instead.
        kind: &'static str,
        /// Whether `-` would have read standard input.
        stdin_ok: bool,
    },
    /// More than [`MAX_INPUT_BYTES`].
    #[error("{label}: larger than {MAX_INPUT_TEXT}, the most berth reads from one file{why}")]
    TooLarge {
        /// What is read.
        label: String,
        /// Why the bound is what it is, when it matters (`; …`), else empty.
        why: &'static str,
    },
    /// Not UTF-8 text.
    #[error("{label}: not UTF-8 text (at byte {at})")]
    NotText {
        /// What is read.
        label: String,
        /// Offset of the first bad byte.
        at: usize,
    },
    /// The system refused.
    #[error("cannot read {label}")]
    Io {
        /// What is read.
        label: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

/// What a too-large spec is told.
const SPEC_BOUND: &str = "; a spec goes to the agent's API inside a JSON string, and the API \
                          takes requests of at most 2 MiB";

/// Reads the whole text of `source`, at most [`MAX_INPUT_BYTES`]. `what` names it in errors
/// before its path (`--secrets-file`), or is empty when the path says enough. A path must be
/// a regular file (checked before it is opened, so a FIFO or a device never blocks the
/// command); standard input may be anything, and is read up to the bound only.
pub fn read_text(source: &Source, what: &str) -> Result<String, InputError> {
    read_text_limited(source, what, MAX_INPUT_BYTES, true, "")
}

/// [`read_text`] for a spec file (or `-`), whose text is sent to the agent; the error for one
/// too large says why the bound is 1 MiB.
pub fn read_spec(source: &Source) -> Result<String, InputError> {
    read_text_limited(source, "", MAX_INPUT_BYTES, true, SPEC_BOUND)
}

/// The language of a spec given on the command line (`--format`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum FormatArg {
    /// HCL.
    Hcl,
    /// JSON.
    Json,
}

/// A spec named on the command line (a path, or `-`): its text ([`read_spec`]), its language
/// (`format`, else JSON when the name ends in `.json`, else HCL) and its name for messages.
pub fn read_spec_arg(
    file: &str,
    format: Option<FormatArg>,
) -> Result<(String, SpecFormat, String), InputError> {
    let source = Source::from_arg(Path::new(file));
    let spec = read_spec(&source)?;
    let name = source.name();
    let format = match format {
        Some(FormatArg::Hcl) => SpecFormat::Hcl,
        Some(FormatArg::Json) => SpecFormat::Json,
        None if Path::new(&name)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json")) =>
        {
            SpecFormat::Json
        }
        None => SpecFormat::Hcl,
    };
    Ok((spec, format, name))
}

/// [`read_text`] for a file that cannot be `-` (the agent's `--config`).
pub fn read_file_text(path: &Path, what: &str) -> Result<String, InputError> {
    let source = Source::File(path.to_path_buf());
    read_text_limited(&source, what, MAX_INPUT_BYTES, false, "")
}

fn read_text_limited(
    source: &Source,
    what: &str,
    limit: u64,
    stdin_ok: bool,
    why: &'static str,
) -> Result<String, InputError> {
    let label = if what.is_empty() {
        source.name()
    } else {
        format!("{what} {}", source.name())
    };
    let io_err = |source: io::Error| InputError::Io {
        label: label.clone(),
        source,
    };
    let not_regular = |kind| InputError::NotRegular {
        label: label.clone(),
        kind,
        stdin_ok,
    };
    let bytes = match source {
        Source::Stdin => read_bounded(io::stdin().lock(), limit),
        Source::File(path) => {
            let (file, len) = open_regular(path).map_err(|e| match e {
                OpenError::NotRegular(kind) => not_regular(kind),
                OpenError::Io(e) => io_err(e),
            })?;
            if len > limit {
                return Err(InputError::TooLarge { label, why });
            }
            read_bounded(file, limit)
        }
    }
    .map_err(io_err)?;
    let Some(bytes) = bytes else {
        return Err(InputError::TooLarge { label, why });
    };
    String::from_utf8(bytes).map_err(|e| InputError::NotText {
        label,
        at: e.utf8_error().valid_up_to(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        (dir, path)
    }

    #[test]
    fn a_regular_file_up_to_the_bound_is_read() {
        let (_d, path) = file("v.hcl", b"id = \"a\"\n");
        let text = read_text(&Source::from_arg(&path), "").expect("read");
        assert_eq!(text, "id = \"a\"\n");

        let exact = vec![b'x'; MAX_INPUT_BYTES as usize];
        let (_d, path) = file("big.hcl", &exact);
        assert_eq!(
            read_text(&Source::File(path), "").expect("read").len(),
            exact.len()
        );
    }

    #[test]
    fn too_large_devices_dirs_and_fifos_are_refused_without_blocking() {
        let (dir, path) = file("big.hcl", &vec![b'x'; MAX_INPUT_BYTES as usize + 1]);
        let err = read_spec(&Source::File(path.clone())).expect_err("too large");
        assert_eq!(
            err.to_string(),
            format!(
                "{}: larger than 1 MiB, the most berth reads from one file; a spec goes to the \
                 agent's API inside a JSON string, and the API takes requests of at most 2 MiB",
                path.display()
            )
        );
        let err = read_text(&Source::File(path.clone()), "--secrets-file").expect_err("large");
        assert_eq!(
            err.to_string(),
            format!(
                "--secrets-file {}: larger than 1 MiB, the most berth reads from one file",
                path.display()
            )
        );

        let err = read_text(&Source::File("/dev/zero".into()), "").expect_err("device");
        assert_eq!(
            err.to_string(),
            "/dev/zero: is a character device, not a regular file (give a file, or - \
             for standard input)"
        );
        let err = read_file_text(dir.path(), "--config").expect_err("dir");
        assert_eq!(
            err.to_string(),
            format!(
                "--config {}: is a directory, not a regular file (give a file)",
                dir.path().display()
            )
        );

        // Opening a FIFO for reading would block until a writer comes: it is never opened.
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let err = read_text(&Source::File(fifo), "--secrets-file").expect_err("fifo");
        assert!(err.to_string().contains("is a FIFO"), "{err}");

        let missing = dir.path().join("missing");
        let err = read_text(&Source::File(missing.clone()), "").expect_err("missing");
        assert!(
            matches!(&err, InputError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
        );
        assert_eq!(
            err.to_string(),
            format!("cannot read {}", missing.display())
        );
    }

    #[test]
    fn reads_stop_at_the_bound() {
        // An endless reader: only the bound and one byte more are read.
        let endless = io::repeat(b'x');
        assert_eq!(read_bounded(endless, 16).expect("read"), None);
        assert_eq!(
            read_bounded(&b"0123456789"[..], 10).expect("read"),
            Some(b"0123456789".to_vec())
        );
    }

    #[test]
    fn text_must_be_utf8() {
        let (_d, path) = file("bin.hcl", b"ab\xffcd");
        let err = read_text(&Source::File(path), "").expect_err("binary");
        assert!(
            err.to_string().ends_with("not UTF-8 text (at byte 2)"),
            "{err}"
        );
    }
}
