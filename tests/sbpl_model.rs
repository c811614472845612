//! The Seatbelt profile decides exactly as the policy does.
//!
//! A small SBPL interpreter (allow/deny, subpath/literal/regex,
//! require-all/require-any/require-not, last match wins) runs every
//! generated profile against random policies and paths, island ancestors
//! and not-yet-existing paths included, and must agree with
//! `Policy::evaluate_resolved` on every decision. This runs on every
//! platform; the macOS tests check that sandbox-exec itself agrees.

#[path = "support/policies.rs"]
mod policies;

use std::path::Path;

use policies::{any_path, input, probes};
use proptest::prelude::*;
use zcode_acp::policy::{Op, Policy};
use zcode_acp::seatbelt::{build_profile, build_profile_tagged};

#[derive(Debug, Clone)]
enum Sexp {
    List(Vec<Sexp>),
    Sym(String),
    Str(String),
    Regex(regex::Regex),
}

fn parse(text: &str) -> Vec<Sexp> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut stack: Vec<Vec<Sexp>> = vec![Vec::new()];
    while i < chars.len() {
        let c = chars[i];
        match c {
            ';' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '(' => {
                stack.push(Vec::new());
                i += 1;
            }
            ')' => {
                let list = stack.pop().expect("balanced");
                stack.last_mut().expect("balanced").push(Sexp::List(list));
                i += 1;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                while chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    s.push(chars[i]);
                    i += 1;
                }
                i += 1;
                stack.last_mut().unwrap().push(Sexp::Str(s));
            }
            '#' if chars.get(i + 1) == Some(&'"') => {
                let mut s = String::new();
                i += 2;
                while chars[i] != '"' {
                    s.push(chars[i]);
                    i += 1;
                }
                i += 1;
                stack
                    .last_mut()
                    .unwrap()
                    .push(Sexp::Regex(regex::Regex::new(&s).expect("a valid regex")));
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                let mut s = String::new();
                while i < chars.len()
                    && !chars[i].is_whitespace()
                    && chars[i] != '('
                    && chars[i] != ')'
                {
                    s.push(chars[i]);
                    i += 1;
                }
                stack.last_mut().unwrap().push(Sexp::Sym(s));
            }
        }
    }
    assert_eq!(stack.len(), 1, "unbalanced profile");
    stack.pop().unwrap()
}

struct Rule {
    allow: bool,
    ops: Vec<String>,
    filters: Vec<Sexp>,
}

fn rules(profile: &str) -> Vec<Rule> {
    parse(profile)
        .into_iter()
        .filter_map(|form| {
            let Sexp::List(items) = form else { return None };
            let Some(Sexp::Sym(head)) = items.first() else {
                return None;
            };
            let allow = match head.as_str() {
                "allow" => true,
                "deny" => false,
                _ => return None,
            };
            let mut ops = Vec::new();
            let mut filters = Vec::new();
            for item in &items[1..] {
                match item {
                    Sexp::Sym(op) => ops.push(op.clone()),
                    // An action modifier such as `(with message "tag")`:
                    // changes what is logged, never what is decided.
                    Sexp::List(l) if matches!(l.first(), Some(Sexp::Sym(h)) if h == "with") => {}
                    other => filters.push(other.clone()),
                }
            }
            Some(Rule {
                allow,
                ops,
                filters,
            })
        })
        .collect()
}

fn matches(filter: &Sexp, path: &str) -> bool {
    let Sexp::List(items) = filter else {
        panic!("bad filter {filter:?}")
    };
    let Some(Sexp::Sym(head)) = items.first() else {
        panic!("bad filter {filter:?}")
    };
    let arg = || match &items[1] {
        Sexp::Str(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    };
    match head.as_str() {
        "subpath" => {
            let p = arg();
            p == "/" || path == p || path.starts_with(&format!("{p}/"))
        }
        "literal" => path == arg(),
        "regex" => match &items[1] {
            Sexp::Regex(r) => r.is_match(path),
            other => panic!("expected a regex, got {other:?}"),
        },
        "require-all" => items[1..].iter().all(|f| matches(f, path)),
        "require-any" => items[1..].iter().any(|f| matches(f, path)),
        "require-not" => !matches(&items[1], path),
        other => panic!("unknown filter {other}"),
    }
}

fn op_matches(rule_op: &str, op: &str) -> bool {
    rule_op == "default"
        || rule_op == op
        || rule_op.strip_suffix('*').is_some_and(|p| op.starts_with(p))
}

/// What the profile decides for one write operation on one path.
fn interpret(rules: &[Rule], op: Op, path: &Path) -> bool {
    let op = match op {
        Op::Write => "file-write-data",
        Op::Remove => "file-write-unlink",
    };
    let path = path.to_str().unwrap();
    rules
        .iter()
        .rev()
        .find(|r| {
            r.ops.iter().any(|o| op_matches(o, op))
                && (r.filters.is_empty() || r.filters.iter().any(|f| matches(f, path)))
        })
        .map(|r| r.allow)
        .unwrap_or(true)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn the_profile_decides_as_the_policy_does(input in input(true), extra in prop::collection::vec(any_path(), 0..20)) {
        let policy = Policy::build(&input);
        let profile = build_profile_tagged(&policy, Some("zcode-acp-model"))
            .expect("the alphabet is quotable");
        let rules = rules(&profile);
        let mut paths = probes(&policy);
        paths.extend(extra);
        for path in paths {
            for op in [Op::Write, Op::Remove] {
                let expected = policy.evaluate_resolved(&path, op);
                let got = interpret(&rules, op, &path);
                prop_assert_eq!(got, expected.allowed, "{:?} {:?}: policy says {:?}", op, path, expected);
            }
        }
    }
}

#[test]
fn the_interpreter_itself_can_disagree() {
    // Guard against an interpreter that agrees with everything: a profile
    // with its islands removed must disagree with the policy somewhere.
    let input = policies::one_root("/h/w");
    let policy = Policy::build(&input);
    let profile = build_profile(&policy).unwrap();
    let rules_full = rules(&profile);
    let island = Path::new("/h/w/.zcode/acp/sandbox.json");
    assert!(!interpret(&rules_full, Op::Write, island));
    let cut = profile.split(";; ---- islands").next().unwrap();
    let rules_cut = rules(cut);
    let stripped_allow: Vec<Rule> = rules_cut
        .into_iter()
        .map(|mut r| {
            if r.allow {
                r.filters.truncate(1);
                if let Some(Sexp::List(items)) = r.filters.first().cloned() {
                    if matches!(items.first(), Some(Sexp::Sym(s)) if s == "require-all") {
                        r.filters = vec![items[1].clone()];
                    }
                }
            }
            r
        })
        .collect();
    assert!(interpret(&stripped_allow, Op::Write, island));
}
