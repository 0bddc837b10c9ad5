//! Path patterns for `--include`, `--exclude`, `--exclude-file` and `.larderignore`
//! files: gitignore-style globs, specified in docs/design/patterns.md.
//!
//! Matching is pure: a pattern sees only a path's bytes and whether it names a
//! directory. A path is split into components at `/`, and each component is matched as
//! a sequence of *units*: the UTF-8 characters of a name, or single bytes where the name
//! is not valid UTF-8. So `?` matches one character of a UTF-8 name and one byte of a
//! broken one, and no wildcard ever matches `/`.
//!
//! The model these functions are tested against is in `tests/patterns.rs`.

use crate::error::{EngineError, Result};

/// A byte that does not begin a valid UTF-8 sequence is the unit `RAW_BYTE + byte`:
/// above every Unicode scalar value, so it never equals a character.
const RAW_BYTE: u32 = 0x11_0000;

/// The first unit of `bytes` and its length in bytes; `None` for empty input.
fn first_unit(bytes: &[u8]) -> Option<(u32, usize)> {
    let &first = bytes.first()?;
    let head = &bytes[..bytes.len().min(4)];
    let valid = match std::str::from_utf8(head) {
        Ok(s) => s,
        // Everything before `valid_up_to` is valid UTF-8, so this never falls back.
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
    };
    Some(match valid.chars().next() {
        Some(c) => (u32::from(c), c.len_utf8()),
        None => (RAW_BYTE + u32::from(first), 1),
    })
}

/// The units of one name.
fn units(name: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(name.len());
    let mut rest = name;
    while let Some((unit, len)) = first_unit(rest) {
        out.push(unit);
        rest = &rest[len..];
    }
    out
}

/// A path split into components of units, to be matched against many patterns.
pub(crate) struct PathUnits {
    components: Vec<Vec<u32>>,
}

impl PathUnits {
    /// `path` as stored in a snapshot: components joined by `/`; empty for the root.
    pub(crate) fn new(path: &[u8]) -> Self {
        let components = if path.is_empty() {
            Vec::new()
        } else {
            path.split(|&b| b == b'/').map(units).collect()
        };
        Self { components }
    }

    pub(crate) fn all(&self) -> &[Vec<u32>] {
        &self.components
    }

    /// The components below the first `depth` ones: the path relative to an ancestor.
    pub(crate) fn below(&self, depth: usize) -> &[Vec<u32>] {
        &self.components[depth.min(self.components.len())..]
    }
}

/// One element of a name pattern; every element but `AnyRun` matches exactly one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Unit(u32),
    /// `?`
    AnyUnit,
    /// `*`: any run of units, the empty one included.
    AnyRun,
    /// `[...]`: one unit inside one of the inclusive ranges (outside all, if negated).
    Class {
        negated: bool,
        ranges: Vec<(u32, u32)>,
    },
}

impl Token {
    fn matches_unit(&self, unit: u32) -> bool {
        match self {
            Self::Unit(u) => *u == unit,
            Self::AnyUnit => true,
            Self::AnyRun => false,
            Self::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&unit)) != *negated
            }
        }
    }
}

/// One `/`-separated component of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Component {
    /// `**`: any number of whole components; zero or more, or one or more when it is
    /// the pattern's last component (`dir/**` matches what is inside `dir`, not `dir`).
    AnyPath,
    /// A glob matched against one name.
    Name(Vec<Token>),
}

/// One pattern: a glob over snapshot paths, possibly negated (`!`) or limited to
/// directories (trailing `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// The pattern as given (lossily decoded), for messages.
    text: String,
    negated: bool,
    dir_only: bool,
    /// Never empty, never two `AnyPath` in a row. An unanchored pattern starts with
    /// `AnyPath`, which makes it match at any depth.
    components: Vec<Component>,
}

impl Pattern {
    /// Parses one pattern (docs/design/patterns.md). Fails with
    /// [`EngineError::InvalidPattern`] on an empty pattern, an empty, `.` or `..`
    /// component, an unclosed or reversed `[...]`, a POSIX class, or a trailing `\`.
    pub fn parse(raw: &[u8]) -> Result<Self> {
        let text = String::from_utf8_lossy(raw).into_owned();
        let invalid = |reason: &str| EngineError::InvalidPattern {
            pattern: crate::names::escape_name(raw),
            reason: reason.to_string(),
        };
        let (negated, body) = match raw.strip_prefix(b"!") {
            Some(rest) => (true, rest),
            None => (false, raw),
        };
        let (dir_only, body) = match body.strip_suffix(b"/") {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        let anchored = body.contains(&b'/');
        let body = body.strip_prefix(b"/").unwrap_or(body);
        if body.is_empty() {
            return Err(invalid("it names no path"));
        }
        let mut components = Vec::new();
        if !anchored {
            components.push(Component::AnyPath);
        }
        for raw_component in body.split(|&b| b == b'/') {
            if raw_component.is_empty() {
                return Err(invalid("empty component (`//`)"));
            }
            if raw_component == b"." || raw_component == b".." {
                return Err(invalid(
                    "`.` and `..` never occur in snapshot paths; write the path from the snapshot root (as `larder ls` shows it)",
                ));
            }
            let component = parse_component(raw_component).map_err(|r| invalid(&r))?;
            // `**/**` matches what `**` matches.
            if component == Component::AnyPath && components.last() == Some(&Component::AnyPath) {
                continue;
            }
            components.push(component);
        }
        Ok(Self {
            text,
            negated,
            dir_only,
            components,
        })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the glob matches `path` (components joined by `/`, relative to the
    /// pattern's base) itself, ignoring `!`. Parent directories are not considered
    /// here; [`PatternList::selects`] does that.
    pub fn matches(&self, path: &[u8], is_dir: bool) -> bool {
        self.matches_units(PathUnits::new(path).all(), is_dir)
    }

    fn matches_units(&self, path: &[Vec<u32>], is_dir: bool) -> bool {
        (is_dir || !self.dir_only) && components_match(&self.components, path)
    }
}

fn parse_component(raw: &[u8]) -> std::result::Result<Component, String> {
    if raw == b"**" {
        return Ok(Component::AnyPath);
    }
    let mut tokens = Vec::new();
    let mut rest = raw;
    while let Some((&byte, tail)) = rest.split_first() {
        match byte {
            b'*' => {
                // `**` inside a name is `*`.
                if tokens.last() != Some(&Token::AnyRun) {
                    tokens.push(Token::AnyRun);
                }
                rest = tail;
            }
            b'?' => {
                tokens.push(Token::AnyUnit);
                rest = tail;
            }
            b'[' => {
                let (class, after) = parse_class(tail)?;
                tokens.push(class);
                rest = after;
            }
            b'\\' => {
                let (unit, len) = first_unit(tail)
                    .ok_or("`\\` at the end of a name (a `/` cannot be escaped)")?;
                tokens.push(Token::Unit(unit));
                rest = &tail[len..];
            }
            _ => {
                // `rest` is not empty here, so it has a first unit.
                let (unit, len) = first_unit(rest).unwrap_or((u32::from(byte), 1));
                tokens.push(Token::Unit(unit));
                rest = &rest[len..];
            }
        }
    }
    Ok(Component::Name(tokens))
}

/// Parses a class after its `[`; returns it and what follows its `]`.
fn parse_class(after_open: &[u8]) -> std::result::Result<(Token, &[u8]), String> {
    let (negated, mut rest) = match after_open.split_first() {
        Some((b'!' | b'^', tail)) => (true, tail),
        _ => (false, after_open),
    };
    let mut ranges = Vec::new();
    loop {
        match rest.first() {
            None => return Err("`[` without a closing `]` (a `[...]` never spans a `/`)".into()),
            // A `]` first in the class is a member, not its end.
            Some(b']') if !ranges.is_empty() => {
                return Ok((Token::Class { negated, ranges }, &rest[1..]))
            }
            Some(b'[') if rest.get(1) == Some(&b':') => {
                return Err(
                    "POSIX classes such as `[:alpha:]` are not supported; list the characters"
                        .into(),
                )
            }
            Some(_) => {}
        }
        let (lo, after_lo) = class_member(rest)?;
        match after_lo.split_first() {
            // `-` before the closing `]` is a member, not a range.
            Some((b'-', after_dash)) if after_dash.first().is_some_and(|&b| b != b']') => {
                let (hi, after_hi) = class_member(after_dash)?;
                if hi < lo {
                    return Err("a `[...]` range whose end comes before its start".into());
                }
                ranges.push((lo, hi));
                rest = after_hi;
            }
            _ => {
                ranges.push((lo, lo));
                rest = after_lo;
            }
        }
    }
}

/// One member of a class (`\` escapes); `rest` is not empty.
fn class_member(rest: &[u8]) -> std::result::Result<(u32, &[u8]), String> {
    let escaped = rest.first() == Some(&b'\\');
    let from = if escaped { &rest[1..] } else { rest };
    let (unit, len) = first_unit(from).ok_or("`[` without a closing `]`")?;
    Ok((unit, &from[len..]))
}

/// Whether `tokens` match all of `name`. Every token but `AnyRun` matches exactly one
/// unit, so remembering only the last `*` suffices: a later `*` can absorb whatever an
/// earlier one could.
fn name_matches(tokens: &[Token], name: &[u32]) -> bool {
    let (mut t, mut n) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while n < name.len() {
        match tokens.get(t) {
            Some(Token::AnyRun) => {
                last_star = Some((t, n));
                t += 1;
            }
            Some(token) if token.matches_unit(name[n]) => {
                t += 1;
                n += 1;
            }
            _ => match last_star {
                Some((star, start)) => {
                    // Let the last `*` absorb one more unit and retry after it.
                    last_star = Some((star, start + 1));
                    t = star + 1;
                    n = start + 1;
                }
                None => return false,
            },
        }
    }
    tokens[t.min(tokens.len())..]
        .iter()
        .all(|token| *token == Token::AnyRun)
}

/// Whether `pattern` matches all of `path`, by dynamic programming over (pattern
/// component, path component) pairs: linear in their product however many `**` there
/// are.
fn components_match(pattern: &[Component], path: &[Vec<u32>]) -> bool {
    let n = path.len();
    // `next[j]`: whether the components after the current one match `path[j..]`.
    let mut next: Vec<bool> = (0..=n).map(|j| j == n).collect();
    for (i, component) in pattern.iter().enumerate().rev() {
        let last = i + 1 == pattern.len();
        let mut row = vec![false; n + 1];
        for j in (0..=n).rev() {
            row[j] = match component {
                Component::AnyPath if last => j < n,
                Component::AnyPath => next[j] || (j < n && row[j + 1]),
                Component::Name(tokens) => j < n && next[j + 1] && name_matches(tokens, &path[j]),
            };
        }
        next = row;
    }
    next[0]
}

/// An ordered list of patterns in which the last pattern matching a path decides
/// (gitignore's rule): a plain pattern selects it, a `!` pattern takes it back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatternList {
    patterns: Vec<Pattern>,
}

impl PatternList {
    pub fn new(patterns: Vec<Pattern>) -> Self {
        Self { patterns }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// What the list says about `path` itself: `Some(true)` if the last pattern that
    /// matches it is a plain one, `Some(false)` if it is a `!` one, `None` if none does.
    pub(crate) fn decide(&self, path: &[Vec<u32>], is_dir: bool) -> Option<bool> {
        self.patterns
            .iter()
            .rev()
            .find(|p| p.matches_units(path, is_dir))
            .map(|p| !p.negated)
    }

    /// Whether the list selects `path` (relative to the list's base): the list decides
    /// `Some(true)` for the path itself or for one of its parent directories. A
    /// selected directory selects everything below it, so a `!` pattern cannot take
    /// back a path inside a selected directory (gitignore's rule).
    pub fn selects(&self, path: &[u8], is_dir: bool) -> bool {
        let units = PathUnits::new(path);
        let all = units.all();
        (1..all.len()).any(|depth| self.decide(&all[..depth], true) == Some(true))
            || self.decide(all, is_dir) == Some(true)
    }
}

/// Parses a pattern file (`--exclude-file`, `.larderignore`): one pattern per line.
/// Lines that are blank or start with `#` are skipped; a trailing `\r` and trailing
/// spaces are removed, except a space escaped with `\`. Returns each pattern line's
/// number (from 1) with the pattern or the reason it is invalid.
pub fn parse_pattern_file(text: &[u8]) -> Vec<(usize, Result<Pattern>)> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter_map(|(i, line)| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let line = trim_trailing_spaces(line);
            if line.is_empty() || line.starts_with(b"#") {
                None
            } else {
                Some((i + 1, Pattern::parse(line)))
            }
        })
        .collect()
}

fn trim_trailing_spaces(mut line: &[u8]) -> &[u8] {
    while let Some(rest) = line.strip_suffix(b" ") {
        let backslashes = rest.iter().rev().take_while(|&&b| b == b'\\').count();
        if backslashes % 2 == 1 {
            break;
        }
        line = rest;
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn file(pattern: &str, path: &str) -> bool {
        p(pattern).matches(path.as_bytes(), false)
    }

    fn dir(pattern: &str, path: &str) -> bool {
        p(pattern).matches(path.as_bytes(), true)
    }

    #[test]
    fn a_name_without_slash_matches_at_any_depth() {
        assert!(file("a.txt", "a.txt"));
        assert!(file("a.txt", "x/y/a.txt"));
        assert!(!file("a.txt", "x/a.txt/y"));
        assert!(file("*.txt", "x/.hidden.txt"));
        assert!(!file("*.txt", "x/a.txt.bak"));
    }

    #[test]
    fn a_slash_anchors_at_the_base() {
        for pattern in ["/x/a.txt", "x/a.txt"] {
            assert!(file(pattern, "x/a.txt"), "{pattern}");
            assert!(!file(pattern, "y/x/a.txt"), "{pattern}");
        }
        assert!(file("/a.txt", "a.txt"));
        assert!(!file("/a.txt", "x/a.txt"));
        assert!(file("home/*/junk", "home/me/junk"));
        assert!(!file("home/*/junk", "home/me/deep/junk"));
    }

    #[test]
    fn wildcards_never_cross_a_slash() {
        assert!(!file("/a*b", "a/b"));
        assert!(!file("/a?b", "a/b"));
        assert!(Pattern::parse(b"/a[/]b").is_err());
        assert!(file("/a*", "a"));
        assert!(file("/a?c", "abc"));
    }

    #[test]
    fn double_star_spans_directories() {
        assert!(file("**/b", "b"));
        assert!(file("**/b", "a/x/b"));
        assert!(file("/a/**/b", "a/b"));
        assert!(file("/a/**/b", "a/x/y/b"));
        assert!(!file("/a/**/b", "ab"));
        assert!(file("/a/**", "a/x"));
        assert!(file("/a/**", "a/x/y"));
        assert!(!dir("/a/**", "a"), "a trailing /** matches inside only");
        assert!(file("/a**", "abc"), "** inside a name is *");
        assert!(!file("/a**", "a/bc"));
        assert!(file("**", "anything/at/all"));
    }

    #[test]
    fn trailing_slash_matches_directories_only() {
        assert!(dir("build/", "x/build"));
        assert!(!file("build/", "x/build"));
        assert!(dir("/x/build/", "x/build"));
    }

    #[test]
    fn classes_ranges_and_negation() {
        assert!(file("/[abc]", "b"));
        assert!(!file("/[abc]", "d"));
        assert!(file("/[a-c]x", "bx"));
        assert!(file("/[!a-c]x", "dx"));
        assert!(file("/[^a-c]x", "dx"));
        assert!(!file("/[!a-c]x", "ax"));
        assert!(file("/[]]", "]"));
        assert!(file("/[!]]", "a"));
        assert!(file("/[a-]", "-"));
        assert!(file("/[\\]]", "]"));
        assert!(file("/[é-ë]", "ê"));
    }

    #[test]
    fn escapes_make_wildcards_literal() {
        assert!(file("/a\\*", "a*"));
        assert!(!file("/a\\*", "ab"));
        assert!(file("\\!x", "!x"));
        assert!(file("\\#x", "#x"));
        assert!(file("/\\[x]", "[x]"));
    }

    #[test]
    fn question_mark_is_one_character_or_one_broken_byte() {
        assert!(file("/?", "é"));
        assert!(!file("/??", "é"));
        assert!(p("/a?b").matches(b"a\xffb", false));
        assert!(p("/a*b").matches(b"a\xff\xfeb", false));
        assert!(Pattern::parse(b"/\xff").unwrap().matches(b"\xff", false));
        assert!(!Pattern::parse(b"/\xff")
            .unwrap()
            .matches("ÿ".as_bytes(), false));
    }

    #[test]
    fn invalid_patterns_say_why() {
        for (pattern, why) in [
            ("", "names no path"),
            ("!", "names no path"),
            ("/", "names no path"),
            ("a//b", "empty component"),
            ("./a", "`.` and `..`"),
            ("a/../b", "`.` and `..`"),
            ("a[bc", "without a closing"),
            ("a[]", "without a closing"),
            ("[z-a]", "comes before its start"),
            ("[[:alpha:]]", "POSIX"),
            ("a\\", "at the end of a name"),
        ] {
            match Pattern::parse(pattern.as_bytes()) {
                Ok(parsed) => panic!("{pattern:?} parsed as {parsed:?}"),
                Err(e) => assert!(e.to_string().contains(why), "{pattern:?}: {e}"),
            }
        }
    }

    #[test]
    fn the_last_matching_pattern_decides() {
        let list = PatternList::new(vec![p("*.log"), p("!keep.log")]);
        assert!(list.selects(b"a/x.log", false));
        assert!(!list.selects(b"a/keep.log", false));
        let list = PatternList::new(vec![p("!keep.log"), p("*.log")]);
        assert!(list.selects(b"a/keep.log", false));
    }

    #[test]
    fn a_selected_directory_selects_everything_below_it() {
        let list = PatternList::new(vec![p("build/"), p("!build/keep")]);
        assert!(list.selects(b"x/build", true));
        assert!(list.selects(b"x/build/a/b", false));
        assert!(
            list.selects(b"x/build/keep", false),
            "a ! pattern cannot take back a path inside a selected directory"
        );
        assert!(!list.selects(b"x/build", false), "a file named build");
        assert!(!list.selects(b"", true), "the root is never selected");
    }

    #[test]
    fn pattern_files_skip_comments_blank_lines_and_trailing_spaces() {
        let text = b"# comment\n\n*.tmp  \n  \nescaped\\ \r\n\\#literal\nbad[\n!*.keep\r\n";
        let parsed = parse_pattern_file(text);
        let lines: Vec<usize> = parsed.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, [3, 5, 6, 7, 8]);
        let ok: Vec<&str> = parsed
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().map(Pattern::as_str))
            .collect();
        assert_eq!(ok, ["*.tmp", "escaped\\ ", "\\#literal", "!*.keep"]);
        assert!(parsed[3].1.is_err());
        assert!(p("escaped\\ ").matches(b"escaped ", false));
    }
}
