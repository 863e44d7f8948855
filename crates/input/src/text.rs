//! The size and nesting bounds of a text, checked by one loop over it before any parser runs.
//!
//! What counts as a level, in HCL: a `{`, `[` or `(` in code; a template interpolation
//! (`${ … }`) or an `if`/`for` directive's expression (`%{ if … }`) in a quoted string or a
//! heredoc; and the template inside an `if` or `for` directive, up to its `%{ endif }` or
//! `%{ endfor }`. What does not count: braces in quoted strings and heredocs outside
//! interpolations, escaped markers (`$${`, `%%{`), and comments (`#`, `//`, `/* */`). In
//! JSON: a `{` or `[` outside strings.
//!
//! The reading follows hcl-rs's parser where a text is valid; where the parser would stop with
//! a syntax error (a string running into a newline, say) it may count more than the parser
//! would, never less before that point.

use std::{io::Read as _, path::Path};

/// Most bytes of a spec or config text; a longer one is refused before it is parsed.
pub const MAX_SPEC_BYTES: usize = 1024 * 1024;

/// Deepest nesting accepted (see the module doc for what counts as a level). hcl-rs refuses
/// deeper expressions on its own too, at the same depth.
pub const MAX_NESTING: usize = 64;

/// Which language a text is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// HCL (native syntax).
    Hcl,
    /// JSON.
    Json,
}

/// Why a text is refused before it is parsed. Neither message repeats any of the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Longer than [`MAX_SPEC_BYTES`].
    #[error(
        "too large: more than {MAX_SPEC_BYTES} bytes (1 MiB), the most berth reads in one file"
    )]
    TooLarge,
    /// Nested deeper than [`MAX_NESTING`] levels.
    #[error("nesting deeper than {MAX_NESTING} levels")]
    TooDeep {
        /// 1-based line of the first opening past the limit.
        line: usize,
    },
}

impl TextError {
    /// The line the error is about, when there is one.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::TooLarge => None,
            Self::TooDeep { line } => Some(*line),
        }
    }
}

/// Checks `text` against [`MAX_SPEC_BYTES`] and [`MAX_NESTING`]. Runs in one pass, without
/// recursion, whatever the text.
pub fn check_text(syntax: Syntax, text: &str) -> Result<(), TextError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(TextError::TooLarge);
    }
    let deep = match syntax {
        Syntax::Hcl => hcl_too_deep(text.as_bytes()),
        Syntax::Json => json_too_deep(text.as_bytes()),
    };
    match deep {
        Some(line) => Err(TextError::TooDeep { line }),
        None => Ok(()),
    }
}

/// Reads `file` as UTF-8, but only a regular file ([`crate::open_regular`]) and never more
/// than one byte over [`MAX_SPEC_BYTES`] (so a huge file is not read whole); [`check_text`]
/// then refuses a text that long.
pub fn read_text(file: &Path) -> std::io::Result<String> {
    let (file, _) = crate::open_regular(file).map_err(|e| match e {
        crate::OpenError::Io(e) => e,
        not_regular => std::io::Error::new(std::io::ErrorKind::InvalidInput, not_regular),
    })?;
    let mut text = String::new();
    file.take(MAX_SPEC_BYTES as u64 + 1)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// The line of the first `{` or `[` past [`MAX_NESTING`], outside strings.
fn json_too_deep(b: &[u8]) -> Option<usize> {
    let (mut depth, mut line, mut i) = (0usize, 1usize, 0usize);
    let mut in_string = false;
    while let Some(&c) = b.get(i) {
        match (in_string, c) {
            (_, b'\n') => line += 1,
            (true, b'\\') => i += 1,
            (_, b'"') => in_string = !in_string,
            (false, b'{' | b'[') => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(line);
                }
            }
            (false, b'}' | b']') => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// What the HCL scanner is inside of.
#[derive(Debug)]
enum Ctx {
    /// `{`, `[` or `(` in code.
    Bracket,
    /// `${ … }` or `%{ … }`: code up to its closing brace; then, for a directive, what it
    /// does to its template.
    Interp(Then),
    /// A quoted string, with its open `if`/`for` directives.
    Quoted { directives: usize },
    /// A heredoc (its delimiter is `text[start..end]`), with its open directives.
    Heredoc {
        start: usize,
        end: usize,
        directives: usize,
    },
}

/// What a `${ … }` or `%{ … }` holds, and what it does to its template once closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// An expression (a `${ }`, or a directive this scanner does not know): one level.
    Expr,
    /// `if` or `for`: one level for its expression, then the template inside it is one level
    /// deeper.
    Opens,
    /// `endif` or `endfor`: no expression; the template is one level shallower.
    Closes,
    /// `else`: no expression.
    Else,
}

impl Then {
    fn counts(self) -> bool {
        matches!(self, Then::Expr | Then::Opens)
    }
}

/// The scanner's state: the open contexts, and the depth they add up to.
struct Hcl<'a> {
    b: &'a [u8],
    stack: Vec<Ctx>,
    depth: usize,
    line: usize,
}

impl Hcl<'_> {
    /// One level deeper; `Err(line)` past the limit.
    fn deeper(&mut self) -> Result<(), usize> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            Err(self.line)
        } else {
            Ok(())
        }
    }

    fn open(&mut self, ctx: Ctx) -> Result<(), usize> {
        let counts = match ctx {
            Ctx::Bracket => true,
            Ctx::Interp(then) => then.counts(),
            Ctx::Quoted { .. } | Ctx::Heredoc { .. } => false,
        };
        self.stack.push(ctx);
        if counts { self.deeper() } else { Ok(()) }
    }

    fn close(&mut self) -> Result<(), usize> {
        let (levels, then) = match self.stack.pop() {
            None => (0, Then::Else),
            Some(Ctx::Bracket) => (1, Then::Else),
            Some(Ctx::Interp(then)) => (usize::from(then.counts()), then),
            Some(Ctx::Quoted { directives } | Ctx::Heredoc { directives, .. }) => {
                (directives, Then::Else)
            }
        };
        self.depth -= levels;
        match (then, self.directives()) {
            (Then::Opens, Some(d)) => {
                *d += 1;
                self.deeper()
            }
            (Then::Closes, Some(d)) if *d > 0 => {
                *d -= 1;
                self.depth -= 1;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The innermost template's open directives.
    fn directives(&mut self) -> Option<&mut usize> {
        match self.stack.last_mut() {
            Some(Ctx::Quoted { directives } | Ctx::Heredoc { directives, .. }) => Some(directives),
            _ => None,
        }
    }

    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    /// Whether the text at `i` continues an identifier (ASCII only: after a heredoc's
    /// delimiter, anything else ends it, at the parser's end or before).
    fn id_continue(&self, i: usize) -> bool {
        let c = self.at(i);
        c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
    }

    /// `<<ID` or `<<-ID` followed by a line end at `i`: the delimiter's range and where the
    /// heredoc's text starts.
    fn heredoc_start(&self, i: usize) -> Option<(usize, usize, usize)> {
        let mut j = i + 2;
        if self.at(j) == b'-' {
            j += 1;
        }
        let start = j;
        let first = self.at(j);
        if !(first.is_ascii_alphabetic() || first == b'_' || first >= 0x80) {
            return None;
        }
        while self.id_continue(j) || self.at(j) >= 0x80 {
            j += 1;
        }
        let end = j;
        match (self.at(j), self.at(j + 1)) {
            (b'\n', _) => Some((start, end, j)),
            (b'\r', b'\n') => Some((start, end, j + 1)),
            _ => None,
        }
    }

    /// If a heredoc line starting at `i` is its closing one (`[ \t]*` then the delimiter, not
    /// followed by an identifier character): where the text after the delimiter starts.
    fn heredoc_end(&self, i: usize, start: usize, end: usize) -> Option<usize> {
        let mut j = i;
        while matches!(self.at(j), b' ' | b'\t') {
            j += 1;
        }
        let delim = &self.b[start..end];
        let after = j + delim.len();
        (self.b.get(j..after) == Some(delim) && !self.id_continue(after)).then_some(after)
    }

    /// Code at `i`; returns the next position.
    fn code(&mut self, i: usize) -> Result<usize, usize> {
        let b = self.b;
        Ok(match b[i] {
            b'#' => skip_line(b, i),
            b'/' if self.at(i + 1) == b'/' => skip_line(b, i),
            b'/' if self.at(i + 1) == b'*' => {
                let mut j = i + 2;
                while j < b.len() && !(b[j] == b'*' && self.at(j + 1) == b'/') {
                    if b[j] == b'\n' {
                        self.line += 1;
                    }
                    j += 1;
                }
                j + 2
            }
            b'"' => {
                self.open(Ctx::Quoted { directives: 0 })?;
                i + 1
            }
            b'<' if self.at(i + 1) == b'<' => match self.heredoc_start(i) {
                Some((start, end, newline)) => {
                    self.line += 1;
                    self.open(Ctx::Heredoc {
                        start,
                        end,
                        directives: 0,
                    })?;
                    // The first line may be the closing one.
                    match self.heredoc_end(newline + 1, start, end) {
                        Some(after) => {
                            self.close()?;
                            after
                        }
                        None => newline + 1,
                    }
                }
                None => i + 2,
            },
            b'{' | b'[' | b'(' => {
                self.open(Ctx::Bracket)?;
                i + 1
            }
            b'}' | b']' | b')' => {
                if matches!(self.stack.last(), Some(Ctx::Bracket | Ctx::Interp(_))) {
                    self.close()?;
                }
                i + 1
            }
            b'\n' => {
                self.line += 1;
                i + 1
            }
            _ => i + 1,
        })
    }

    /// Template text (of a quoted string when `quoted`, else of a heredoc) at `i`.
    fn template(&mut self, i: usize, quoted: bool) -> Result<usize, usize> {
        let (c, next) = (self.at(i), self.at(i + 1));
        Ok(match c {
            b'$' | b'%' if next == c && self.at(i + 2) == b'{' => i + 3,
            b'$' if next == b'{' => {
                self.open(Ctx::Interp(Then::Expr))?;
                i + 2
            }
            b'%' if next == b'{' => {
                let then = self.directive(i + 2);
                self.open(Ctx::Interp(then))?;
                i + 2
            }
            b'"' if quoted => {
                self.close()?;
                i + 1
            }
            b'\\' if quoted && next != b'\n' => i + 2,
            b'\n' => {
                self.line += 1;
                if quoted {
                    // The parser stops here (a string cannot span lines); read on as code.
                    self.close()?;
                    i + 1
                } else if let Some(Ctx::Heredoc { start, end, .. }) = self.stack.last()
                    && let Some(after) = self.heredoc_end(i + 1, *start, *end)
                {
                    self.close()?;
                    after
                } else {
                    i + 1
                }
            }
            _ => i + 1,
        })
    }

    /// What the directive whose `%{` ends before `i` does.
    fn directive(&self, mut i: usize) -> Then {
        while matches!(self.at(i), b' ' | b'\t' | b'\r' | b'\n' | b'~') {
            i += 1;
        }
        let start = i;
        while self.id_continue(i) {
            i += 1;
        }
        match &self.b[start..i] {
            b"if" | b"for" => Then::Opens,
            b"endif" | b"endfor" => Then::Closes,
            b"else" => Then::Else,
            _ => Then::Expr,
        }
    }
}

fn skip_line(b: &[u8], i: usize) -> usize {
    b[i..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |n| i + n)
}

/// The line of the first opening past [`MAX_NESTING`] in HCL text.
fn hcl_too_deep(b: &[u8]) -> Option<usize> {
    let mut s = Hcl {
        b,
        stack: Vec::new(),
        depth: 0,
        line: 1,
    };
    let mut i = 0;
    while i < b.len() {
        let step = match s.stack.last() {
            None | Some(Ctx::Bracket | Ctx::Interp(_)) => s.code(i),
            Some(Ctx::Quoted { .. }) => s.template(i, true),
            Some(Ctx::Heredoc { .. }) => s.template(i, false),
        };
        match step {
            Ok(next) => i = next,
            Err(line) => return Some(line),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hcl(text: &str) -> Result<(), TextError> {
        check_text(Syntax::Hcl, text)
    }

    /// `open` repeated `n` times around `inner`, closed by `close`, each opening on its own
    /// line after the first `lead` lines.
    fn nest(lead: &str, open: &str, inner: &str, close: &str, n: usize) -> String {
        format!("{lead}{}{inner}{}", open.repeat(n), close.repeat(n))
    }

    /// HCL shapes: (name, opening, innermost, closing, before). Each opening adds one level,
    /// on one line (blocks: one per line).
    const HCL_SHAPES: &[(&str, &str, &str, &str, &str)] = &[
        ("blocks", "a{\n", "", "}\n", ""),
        ("objects", "{a=", "1", "}", "x="),
        ("lists", "[", "1", "]", "x="),
        ("tuples", "[1,", "2", "]", "x="),
        ("parens", "(", "1", ")", "x="),
        ("calls", "f(", "1", ")", "x="),
        ("templates", "\"${", "1", "}\"", "x="),
        ("directives", "%{if a}", "y", "%{endif}", "x=\""),
        ("heredoc interpolations", "${", "1", "}", "x=<<EOT\n"),
    ];

    /// A shape nested `n` deep, closed when that fits in [`MAX_SPEC_BYTES`] (a refused text
    /// need not be valid past the limit).
    fn hcl_shape(name: &str, n: usize) -> String {
        let (_, open, inner, close, lead) = HCL_SHAPES
            .iter()
            .find(|s| s.0 == name)
            .copied()
            .expect("shape");
        let mut t = nest(lead, open, inner, close, n);
        match name {
            "directives" => t.push('"'),
            "heredoc interpolations" => t.push_str("\nEOT\n"),
            _ => {}
        }
        if t.len() > MAX_SPEC_BYTES {
            t = format!("{lead}{}", open.repeat(n));
        }
        t
    }

    #[test]
    fn every_hcl_shape_is_refused_past_the_limit() {
        for (name, open, ..) in HCL_SHAPES {
            let at = hcl_shape(name, MAX_NESTING);
            assert_eq!(hcl(&at), Ok(()), "{name} at the limit");
            let over = hcl_shape(name, MAX_NESTING + 1);
            let e = hcl(&over).expect_err(name);
            assert!(matches!(e, TextError::TooDeep { .. }), "{name}: {e}");
            assert_eq!(e.to_string(), "nesting deeper than 64 levels");
            // 200,000 levels, or as many as 1 MiB holds.
            let n = 200_000.min(MAX_SPEC_BYTES / open.len() - 1);
            let deep = hcl_shape(name, n);
            assert!(deep.len() <= MAX_SPEC_BYTES, "{name}");
            let e = berth_testkit::on_small_stack(move || check_text(Syntax::Hcl, &deep))
                .expect_err(name);
            assert!(matches!(e, TextError::TooDeep { .. }), "{name}: {e}");
        }
    }

    #[test]
    fn the_line_is_the_first_opening_past_the_limit() {
        let text = hcl_shape("blocks", 70);
        assert_eq!(hcl(&text), Err(TextError::TooDeep { line: 65 }));
        let text = format!("# top\n\n{}", hcl_shape("lists", 70));
        assert_eq!(hcl(&text), Err(TextError::TooDeep { line: 3 }));
        // Lines count inside comments, strings and heredocs too.
        let text = format!(
            "/* a\nb */\nx = \"a\\\"b\"\ny = <<EOT\n{{\nEOT\n{}",
            hcl_shape("blocks", 65)
        );
        assert_eq!(hcl(&text), Err(TextError::TooDeep { line: 71 }));
    }

    #[test]
    fn text_that_is_not_code_does_not_count() {
        let braces = "{[(".repeat(100_000);
        for text in [
            format!("x = \"{braces}\"\n"),
            format!("x = \"$${{{braces}\"\n"),
            format!("x = \"%%{{{braces}\"\n"),
            format!("x = <<EOT\n{braces}\n  EOT\n"),
            format!("x = <<-EOT\n{braces}\n${{1}}\n  EOT\ny = [1]\n"),
            format!("# {braces}\n"),
            format!("// {braces}\n"),
            format!("/* {braces}\n{braces} */\n"),
            format!("x = \"a\\\"{braces}\"\n"),
        ] {
            let t = text.clone();
            let r = berth_testkit::on_small_stack(move || check_text(Syntax::Hcl, &t));
            assert_eq!(r, Ok(()), "{}", &text[..40]);
        }
    }

    #[test]
    fn code_after_strings_heredocs_and_comments_counts_again() {
        let deep = hcl_shape("lists", 65);
        for lead in [
            "a = \"}}}]])))\"\n",
            "a = <<EOT\n}}}]]]\nEOTX\nEOT\n",
            // The delimiter line may go on with code.
            "a = [<<EOT\n]]]\n  EOT\n]\n",
            // The first line may close it.
            "a = <<EOT\nEOT\n",
            "# }}}\n",
            "/* }}} */\n",
            // A string cannot span lines: the parser stops; counting goes on as code.
            "a = \"}}}\n",
            // Interpolations end at their own brace.
            "a = \"${ {b = 1} }\"\n",
            "a = \"%{ if true }x%{ endif }\"\n",
        ] {
            let text = format!("{lead}{deep}");
            assert!(
                matches!(hcl(&text), Err(TextError::TooDeep { .. })),
                "{lead:?}"
            );
            let ok = format!("{lead}{}", hcl_shape("lists", 64));
            assert_eq!(hcl(&ok), Ok(()), "{lead:?}");
        }
        // Code on the delimiter line after the heredoc counts.
        let text = format!("x = [<<EOT\nhi\nEOT\n, {}]\n", "[".repeat(64));
        assert!(matches!(hcl(&text), Err(TextError::TooDeep { line: 4 })));
    }

    #[test]
    fn directives_count_until_they_end() {
        let open = "%{ if a }".repeat(40);
        let shut = "%{ endif }".repeat(40);
        // 40 open directives and 25 lists inside them: 65 levels.
        let text = format!(
            "x = \"{open}${{{}1{}}}{shut}\"",
            "[".repeat(24),
            "]".repeat(24)
        );
        assert!(matches!(hcl(&text), Err(TextError::TooDeep { .. })));
        let text = format!("x = \"{open}{shut}{open}{shut}\"");
        assert_eq!(hcl(&text), Ok(()));
        let text = format!("x = \"{}\"", "%{ for a in b }%{~ endfor ~}".repeat(100));
        assert_eq!(hcl(&text), Ok(()));
        // 64 open directives, each with an else: at the limit, not past it.
        let text = format!(
            "x = \"{}{}\"",
            "%{ if a }%{ else }".repeat(64),
            "%{ endif }".repeat(64)
        );
        assert_eq!(hcl(&text), Ok(()));
        let text = format!("x = \"{}${{1}}\"", "%{ if a }".repeat(64));
        assert!(matches!(hcl(&text), Err(TextError::TooDeep { .. })));
    }

    #[test]
    fn json_counts_objects_and_arrays_outside_strings() {
        let json = |t: &str| check_text(Syntax::Json, t);
        let obj = |n: usize| format!("{}1{}", "{\"\":\n".repeat(n), "}".repeat(n));
        let arr = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(json(&obj(64)), Ok(()));
        assert_eq!(json(&arr(64)), Ok(()));
        assert_eq!(json(&obj(65)), Err(TextError::TooDeep { line: 65 }));
        assert_eq!(json(&arr(65)), Err(TextError::TooDeep { line: 1 }));
        let flat_obj = format!("{}1{}", "{\"\":".repeat(200_000), "}".repeat(200_000));
        for deep in [flat_obj, arr(200_000)] {
            let r = berth_testkit::on_small_stack(move || check_text(Syntax::Json, &deep));
            assert!(matches!(r, Err(TextError::TooDeep { .. })));
        }
        let quoted = format!(
            "{{\"a\": \"{}\\\"{}\"}}",
            "{[".repeat(1000),
            "{[".repeat(1000)
        );
        assert_eq!(json(&quoted), Ok(()));
    }

    #[test]
    fn size_is_bounded() {
        let at = format!("a = \"{}\"", "x".repeat(MAX_SPEC_BYTES - 6));
        assert_eq!(at.len(), MAX_SPEC_BYTES);
        assert_eq!(hcl(&at), Ok(()));
        let over = format!("{at} ");
        assert_eq!(hcl(&over), Err(TextError::TooLarge));
        assert_eq!(check_text(Syntax::Json, &over), Err(TextError::TooLarge));
        assert_eq!(
            TextError::TooLarge.to_string(),
            "too large: more than 1048576 bytes (1 MiB), the most berth reads in one file"
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let big = dir.path().join("big.hcl");
        std::fs::write(&big, "#".repeat(3 * MAX_SPEC_BYTES)).expect("write");
        let text = read_text(&big).expect("read");
        assert_eq!(
            text.len(),
            MAX_SPEC_BYTES + 1,
            "reads one byte past the limit"
        );
        assert_eq!(hcl(&text), Err(TextError::TooLarge));
    }

    #[test]
    fn hcl_parses_what_passes_at_the_limit() {
        for (name, ..) in HCL_SHAPES {
            if matches!(*name, "templates" | "directives" | "heredoc interpolations") {
                // hcl-rs counts a template and its interpolation as two levels of its own;
                // it refuses these shapes itself, cleanly, before 64 of ours.
                continue;
            }
            let text = hcl_shape(name, MAX_NESTING);
            assert!(hcl::parse(&text).is_ok(), "{name}");
        }
    }
}
