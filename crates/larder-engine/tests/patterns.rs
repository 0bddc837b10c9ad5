//! The pattern matcher (src/pattern.rs) against a simple recursive model written from
//! docs/design/patterns.md, on generated patterns and paths; literal patterns match
//! exactly their own path; arbitrary bytes never make parsing or matching panic.

use larder_engine::{Pattern, PatternList};
use proptest::prelude::*;

/// The model of one glob over one name: plain recursion over characters, exponential
/// but obviously right. Knows the generated subset: letters, `*`, `?`, and classes of
/// letters with an optional leading `!`.
fn model_name(pattern: &[char], name: &[char]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some(('*', rest)) => {
            model_name(rest, name) || (!name.is_empty() && model_name(pattern, &name[1..]))
        }
        Some(('?', rest)) => !name.is_empty() && model_name(rest, &name[1..]),
        Some(('[', rest)) => {
            let Some(close) = rest.iter().position(|&c| c == ']') else {
                unreachable!("generated classes are closed")
            };
            let (members, negated) = match rest[..close].split_first() {
                Some(('!', members)) => (members, true),
                _ => (&rest[..close], false),
            };
            !name.is_empty()
                && members.contains(&name[0]) != negated
                && model_name(&rest[close + 1..], &name[1..])
        }
        Some((&c, rest)) => name.first() == Some(&c) && model_name(rest, &name[1..]),
    }
}

/// The model of a `/`-separated pattern over a path's components.
fn model_components(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        // A trailing `**` matches one or more components, another zero or more.
        Some((&"**", [])) => !path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| model_components(rest, &path[skip..])),
        Some((name, rest)) => {
            let p: Vec<char> = name.chars().collect();
            path.split_first().is_some_and(|(first, path_rest)| {
                let n: Vec<char> = first.chars().collect();
                model_name(&p, &n) && model_components(rest, path_rest)
            })
        }
    }
}

/// The model of one pattern (without `!`) over a path, as the doc states it: a
/// trailing `/` restricts to directories; a pattern with a `/` before its end is
/// matched against the whole path from the base; one without is matched against the
/// last component only.
fn model(pattern: &str, path: &str, is_dir: bool) -> bool {
    let (body, dir_only) = match pattern.strip_suffix('/') {
        Some(body) => (body, true),
        None => (pattern, false),
    };
    if dir_only && !is_dir {
        return false;
    }
    let components: Vec<&str> = path.split('/').collect();
    if body.contains('/') {
        let body = body.strip_prefix('/').unwrap_or(body);
        let pattern: Vec<&str> = body.split('/').collect();
        model_components(&pattern, &components)
    } else if body == "**" {
        true
    } else {
        let p: Vec<char> = body.chars().collect();
        let last: Vec<char> = components.last().unwrap().chars().collect();
        model_name(&p, &last)
    }
}

/// The model of a list: a path is selected if the last pattern matching it or one of
/// its parent directories (taken top down) is not a `!` pattern.
fn model_selects(patterns: &[(bool, String)], path: &str, is_dir: bool) -> bool {
    let components: Vec<&str> = path.split('/').collect();
    (1..=components.len()).any(|depth| {
        let prefix = components[..depth].join("/");
        let prefix_is_dir = depth < components.len() || is_dir;
        patterns
            .iter()
            .rev()
            .find(|(_, p)| model(p, &prefix, prefix_is_dir))
            .is_some_and(|(negated, _)| !negated)
    })
}

fn name_pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(
            prop_oneof![
                Just("a"), Just("b"), Just("*"), Just("?"), Just("[ab]"), Just("[!a]"),
            ],
            1..4,
        )
        .prop_map(|tokens| tokens.concat()),
        1 => Just("**".to_string()),
    ]
}

fn pattern() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(name_pattern(), 1..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(components, leading, trailing)| {
            let mut p = components.join("/");
            if leading {
                p.insert(0, '/');
            }
            if trailing {
                p.push('/');
            }
            p
        })
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec("[abc]{1,3}", 1..5).prop_map(|c| c.join("/"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn one_pattern_matches_as_the_model_says(p in pattern(), path in path(), is_dir in any::<bool>()) {
        let parsed = Pattern::parse(p.as_bytes()).unwrap();
        prop_assert_eq!(parsed.matches(path.as_bytes(), is_dir), model(&p, &path, is_dir), "pattern {:?} path {:?}", p, path);
    }

    #[test]
    fn a_list_selects_as_the_model_says(
        patterns in prop::collection::vec((any::<bool>(), pattern()), 0..5),
        path in path(),
        is_dir in any::<bool>(),
    ) {
        let list = PatternList::new(
            patterns
                .iter()
                .map(|(negated, p)| {
                    let text = if *negated { format!("!{p}") } else { p.clone() };
                    Pattern::parse(text.as_bytes()).unwrap()
                })
                .collect(),
        );
        prop_assert_eq!(list.selects(path.as_bytes(), is_dir), model_selects(&patterns, &path, is_dir));
    }

    #[test]
    fn an_escaped_path_matches_itself_and_nothing_else(
        target in prop::collection::vec("[a*?\\[\\]\\\\!# é]{1,4}", 1..4),
        other in prop::collection::vec("[a*?\\[\\]\\\\!# é]{1,4}", 1..4),
    ) {
        let escape = |component: &str| -> String {
            component
                .chars()
                .flat_map(|c| {
                    let special = matches!(c, '*' | '?' | '[' | ']' | '\\' | '!' | '#');
                    special.then_some('\\').into_iter().chain([c])
                })
                .collect()
        };
        let pattern: Vec<String> = target.iter().map(|c| escape(c)).collect();
        let pattern = Pattern::parse(format!("/{}", pattern.join("/")).as_bytes()).unwrap();
        let target = target.join("/");
        let other = other.join("/");
        prop_assert!(pattern.matches(target.as_bytes(), false));
        prop_assert_eq!(pattern.matches(other.as_bytes(), true), other == target);
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        raw in prop::collection::vec(any::<u8>(), 0..40),
        path in prop::collection::vec(any::<u8>(), 0..40),
        is_dir in any::<bool>(),
    ) {
        if let Ok(p) = Pattern::parse(&raw) {
            let _ = p.matches(&path, is_dir);
            let _ = PatternList::new(vec![p]).selects(&path, is_dir);
        }
    }

    #[test]
    fn wildcard_heavy_bytes_never_panic(
        raw in prop::collection::vec(prop::sample::select(b"*?[]!^-\\/a\xff".to_vec()), 0..24),
        path in prop::collection::vec(prop::sample::select(b"a/]\xff-".to_vec()), 0..24),
    ) {
        if let Ok(p) = Pattern::parse(&raw) {
            let _ = p.matches(&path, false);
        }
    }
}

/// Many `**` over a deep path stay fast: the matcher is linear in (pattern components
/// times path components), where naive recursion would take exponential time.
#[test]
fn many_double_stars_over_a_deep_path_are_fast() {
    let pattern = Pattern::parse("**/a/**/a/**/a/**/a/**/a/**/a/**/b".as_bytes()).unwrap();
    let path = vec!["a"; 400].join("/");
    let started = std::time::Instant::now();
    assert!(!pattern.matches(path.as_bytes(), false));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}
