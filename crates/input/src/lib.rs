//! What every reader of user-written text (volume specs, job specs, the agent's config file)
//! checks before a parser sees it, and how its errors repeat what the user wrote.
//!
//! - [`check_text`]: at most [`MAX_SPEC_BYTES`], and nothing nested deeper than
//!   [`MAX_NESTING`] levels. The parsers (hcl-rs, serde_json) and berth's own readers recurse
//!   once per level, so a text nested 200,000 levels deep would overflow the stack; the check
//!   is a loop over the text and refuses it first.
//! - [`Quoted`] and [`Shown`]: a value or a file name as an error shows it, with control and
//!   bidirectional-text characters escaped and cut to [`MAX_SHOWN_CHARS`] characters.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod echo;
mod file;
mod text;

pub use echo::{
    MAX_LISTED, MAX_SHOWN_CHARS, Quoted, Shown, quoted, quoted_list, serde_message, shown_list,
    shown_within,
};
pub use file::{OpenError, not_regular_kind, open_regular, read_bounded};
pub use text::{MAX_NESTING, MAX_SPEC_BYTES, Syntax, TextError, check_text, read_text};
