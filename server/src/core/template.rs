//! Templates say how the resources whose ids match a glob are shared; a repository is a valid,
//! ordered list of them (Doorman's `ResourceRepository`), with the policies that say who may ask.

use std::{collections::HashMap, fmt, sync::Arc};

use globset::GlobMatcher;

use super::{
    adaptive::Adaptive,
    algorithm::Algorithm,
    algorithm::Choice,
    glob::glob,
    policy::Policies,
    priority::{PriorityMode, SubtreeWants},
};
use sluice_client::{defaults::MAX_AMOUNT, out_of_range};

use crate::defaults::{MAX_SIGNAL_SECONDS, MAX_TEMPLATE_SECONDS};

/// The glob every repository must end with, matching every resource id.
pub const CATCH_ALL: &str = "*";

#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub identifier_glob: String,
    /// The capacity shared; an adaptive template's is its initial one.
    pub capacity: f64,
    /// Learned, not configured, within these bounds (`capacity: adaptive`).
    pub adaptive: Option<Adaptive>,
    /// What clients may use when they cannot reach a server: −1 unlimited, 0 nothing. `None`
    /// means capacity divided by the number of clients.
    pub safe_capacity: Option<f64>,
    pub description: Option<String>,
    pub algorithm: Algorithm,
}

/// Why a list of templates is not a repository. Names the template (by position and glob) and
/// the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateError(pub String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateError {}

#[derive(Debug)]
pub struct Repository {
    templates: Vec<Arc<Template>>,
    matchers: Vec<GlobMatcher>,
    exact: HashMap<String, usize>,
    /// Who may ask for what; none: every caller is trusted.
    policies: Policies,
}

/// Checks a template parameter's value: `Err` says what is wrong.
type CheckValue = fn(Option<&str>) -> Result<(), String>;

impl Repository {
    /// Validates the templates (SPEC §3.1) and builds the lookup; the error holds every
    /// template's first fault, one per line.
    pub fn new(templates: Vec<Template>) -> Result<Repository, TemplateError> {
        let mut matchers = Vec::with_capacity(templates.len());
        let mut exact = HashMap::with_capacity(templates.len());
        let mut errors = Vec::new();
        for (i, t) in templates.iter().enumerate() {
            match check(t, &exact) {
                Ok(matcher) => matchers.push(matcher),
                Err((field, why)) => errors.push(format!("resources[{i}] ({:?}): {field}: {why}", t.identifier_glob)),
            }
            exact.entry(t.identifier_glob.clone()).or_insert(i);
        }
        match templates.iter().position(|t| t.identifier_glob == CATCH_ALL) {
            None => errors.push(format!(
                "resources: a template with identifier_glob {CATCH_ALL:?} is required (as the last one)"
            )),
            Some(i) if i + 1 != templates.len() => errors.push(format!(
                "resources[{i}] ({CATCH_ALL:?}): identifier_glob: the catch-all template must be the last one"
            )),
            Some(_) => {}
        }
        if !errors.is_empty() {
            return Err(TemplateError(errors.join("\n")));
        }
        Ok(Repository {
            templates: templates.into_iter().map(Arc::new).collect(),
            matchers,
            exact,
            policies: Policies::default(),
        })
    }

    /// The repository with these policies.
    pub fn with_policies(self, policies: Policies) -> Repository {
        Repository { policies, ..self }
    }

    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// The template for a resource: the one whose glob is exactly the id, else the first whose
    /// glob matches. There always is one, since the last template matches everything.
    pub fn find(&self, resource_id: &str) -> &Arc<Template> {
        let i = self.exact.get(resource_id).copied().unwrap_or_else(|| {
            self.matchers.iter().position(|m| m.is_match(resource_id)).unwrap_or(self.templates.len() - 1)
        });
        &self.templates[i]
    }

    pub fn templates(&self) -> &[Arc<Template>] {
        &self.templates
    }
}

/// One template's fault (field, why), `exact` holding the globs before it; else its matcher.
fn check(t: &Template, exact: &HashMap<String, usize>) -> Result<GlobMatcher, (String, String)> {
    let fail = |field: &str, why: String| Err((field.to_owned(), why));
    if t.identifier_glob.is_empty() {
        return fail("identifier_glob", "must not be empty".into());
    }
    if !(0.0..=MAX_AMOUNT).contains(&t.capacity) {
        return fail("capacity", out_of_range(t.capacity, ""));
    }
    if let Some(safe) = t.safe_capacity
        && !((0.0..=MAX_AMOUNT).contains(&safe) || safe == -1.0)
    {
        return fail("safe_capacity", out_of_range(safe, " or -1 (unlimited)"));
    }
    if let Some(adaptive) = &t.adaptive {
        check_adaptive(adaptive).map_err(|(field, why)| (format!("adaptive.{field}"), why))?;
    }
    check_algorithm(&t.algorithm).map_err(|(field, why)| (format!("algorithm.{field}"), why))?;
    if let Some(first) = exact.get(&t.identifier_glob) {
        return fail("identifier_glob", format!("duplicates resources[{first}]"));
    }
    glob(&t.identifier_glob).map(|g| g.compile_matcher()).or_else(|e| fail("identifier_glob", e))
}

/// Checks an adaptive template's bounds and settings: `Err` names the field.
fn check_adaptive(a: &Adaptive) -> Result<(), (String, String)> {
    let within = |field: &str, value: f64, range: std::ops::RangeInclusive<f64>, what: &str| {
        if range.contains(&value) { Ok(()) } else { Err((field.to_owned(), format!("must be {what}, got {value}"))) }
    };
    within("max", a.max, 0.0..=MAX_AMOUNT, &format!("from 0 to {MAX_AMOUNT:e}"))?;
    within("min", a.min, 0.0..=a.max, &format!("from 0 to max ({})", a.max))?;
    within("initial", a.initial, a.min..=a.max, &format!("from min ({}) to max ({})", a.min, a.max))?;
    within("tolerance", a.tolerance, 0.01..=10.0, "from 0.01 to 10")?;
    within("error_share", a.error_share, 0.0..=1.0, "from 0 to 1")?;
    within("headroom", a.headroom, 0.0..=0.9, "from 0 to 0.9")?;
    within("growth", a.growth, 0.01..=1.0, "from 0.01 to 1")?;
    within("drain", a.drain, 0.1..=MAX_SIGNAL_SECONDS, &format!("from 0.1 to {MAX_SIGNAL_SECONDS} seconds"))?;
    if !(1..=MAX_SIGNAL_SECONDS as i64).contains(&a.interval) {
        return Err(("interval".into(), format!("must be from 1 to {MAX_SIGNAL_SECONDS} seconds, got {}", a.interval)));
    }
    Ok(())
}

/// Checks an algorithm's settings (SPEC §3.1): `Err` names the field (`lease_length`,
/// `parameters[0].value`) and says what is wrong.
pub fn check_algorithm(a: &Algorithm) -> Result<(), (String, String)> {
    let fail = |field: &str, why: String| Err((field.to_owned(), why));
    if a.refresh_interval < 1 {
        return fail("refresh_interval", format!("must be ≥ 1, got {}", a.refresh_interval));
    }
    if a.lease_length < a.refresh_interval {
        return fail(
            "lease_length",
            format!("must be ≥ refresh_interval ({}), got {}", a.refresh_interval, a.lease_length),
        );
    }
    if let Some(d) = a.learning_mode_duration
        && d < 0
    {
        return fail("learning_mode_duration", format!("must be ≥ 0, got {d}"));
    }
    let durations = [("lease_length", Some(a.lease_length)), ("learning_mode_duration", a.learning_mode_duration)];
    if let Some((field, Some(value))) = durations.into_iter().find(|(_, v)| v.is_some_and(|v| v > MAX_TEMPLATE_SECONDS))
    {
        return fail(field, format!("must be at most {MAX_TEMPLATE_SECONDS} s (a year), got {value}"));
    }
    // A misspelt or repeated parameter would silently leave the default in force.
    let known: [(&str, CheckValue); 2] = [
        (PriorityMode::NAME, |v| PriorityMode::parse(v).map(drop)),
        (SubtreeWants::NAME, |v| SubtreeWants::parse(v).map(drop)),
    ];
    for (j, p) in a.parameters.iter().enumerate() {
        let field = format!("parameters[{j}]");
        let Some((_, check)) = known.iter().find(|(name, _)| *name == p.name) else {
            let names = known.map(|(name, _)| name).join(", ");
            return fail(&field, format!("unknown parameter {:?} (known: {names})", p.name));
        };
        if a.parameters[..j].iter().any(|q| q.name == p.name) {
            return fail(&field, format!("{} is given twice", p.name));
        }
        check(p.value.as_deref()).map_err(|why| (format!("{field}.value"), why))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::algorithm::{Kind, Parameter};

    fn template(glob: &str, capacity: f64) -> Template {
        Template {
            identifier_glob: glob.into(),
            capacity,
            adaptive: None,
            safe_capacity: None,
            description: None,
            algorithm: Algorithm {
                kind: Kind::FairShare,
                lease_length: 10,
                refresh_interval: 5,
                parameters: vec![],
                learning_mode_duration: None,
            },
        }
    }

    fn error(templates: Vec<Template>) -> String {
        Repository::new(templates).unwrap_err().0
    }

    #[test]
    fn exact_match_wins_then_first_glob_in_order() {
        let repo = Repository::new(vec![
            template("db/*", 1.0),
            template("db/users", 2.0),
            template("db/u*", 3.0),
            template("*", 4.0),
        ])
        .unwrap();
        assert_eq!(repo.find("db/users").capacity, 2.0);
        assert_eq!(repo.find("db/uploads").capacity, 1.0);
        assert_eq!(repo.find("api").capacity, 4.0);
        assert_eq!(repo.find("a/b/c").capacity, 4.0, "the catch-all spans slashes");
    }

    #[test]
    fn invalid_templates_are_named_with_their_field() {
        assert_eq!(
            error(vec![template("a", 1.0)]),
            "resources: a template with identifier_glob \"*\" is required (as the last one)"
        );
        assert_eq!(
            error(vec![template("*", 1.0), template("a", 1.0)]),
            "resources[0] (\"*\"): identifier_glob: the catch-all template must be the last one"
        );
        assert_eq!(
            error(vec![template("a", 1.0), template("a", 2.0), template("*", 1.0)]),
            "resources[1] (\"a\"): identifier_glob: duplicates resources[0]"
        );
        assert!(
            error(vec![template("a[", 1.0), template("*", 1.0)])
                .starts_with("resources[0] (\"a[\"): identifier_glob: malformed glob")
        );
        assert_eq!(
            error(vec![template("*", f64::NAN)]),
            "resources[0] (\"*\"): capacity: must be from 0 to 1e15, got NaN"
        );
        let mut t = template("*", 1.0);
        t.algorithm.lease_length = 2;
        assert_eq!(
            error(vec![t]),
            "resources[0] (\"*\"): algorithm.lease_length: must be ≥ refresh_interval (5), got 2"
        );
        let mut t = template("*", 1.0);
        t.algorithm.refresh_interval = 0;
        assert_eq!(error(vec![t]), "resources[0] (\"*\"): algorithm.refresh_interval: must be ≥ 1, got 0");
        let mut t = template("*", 1.0);
        t.algorithm.lease_length = i64::MAX;
        assert_eq!(
            error(vec![t]),
            "resources[0] (\"*\"): algorithm.lease_length: must be at most 31622400 s (a year), got 9223372036854775807"
        );
        let mut t = template("*", 1.0);
        t.safe_capacity = Some(-2.0);
        assert!(error(vec![t]).starts_with("resources[0] (\"*\"): safe_capacity:"));
        let parameters = |names_values: &[(&str, Option<&str>)]| {
            let mut t = template("*", 1.0);
            t.algorithm.parameters = names_values
                .iter()
                .map(|(name, value)| Parameter { name: (*name).into(), value: value.map(Into::into) })
                .collect();
            error(vec![t])
        };
        assert_eq!(
            parameters(&[("priorty_mode", Some("ignore"))]),
            "resources[0] (\"*\"): algorithm.parameters[0]: unknown parameter \"priorty_mode\" (known: priority_mode, subtree_wants)"
        );
        assert_eq!(
            parameters(&[("priority_mode", Some("ignore")), ("priority_mode", Some("strict"))]),
            "resources[0] (\"*\"): algorithm.parameters[1]: priority_mode is given twice"
        );
        assert_eq!(
            parameters(&[("priority_mode", Some("lax"))]),
            "resources[0] (\"*\"): algorithm.parameters[0].value: must be \"strict\" or \"ignore\", got \"lax\""
        );
        assert_eq!(
            parameters(&[("priority_mode", None)]),
            "resources[0] (\"*\"): algorithm.parameters[0].value: must be \"strict\" or \"ignore\", got no value"
        );
    }
}
