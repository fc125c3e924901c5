//! The alerts and the dashboard (`deploy/prometheus`, `deploy/grafana`, runbooks in
//! `docs/observability.md`) against the real thing: promtool's checks and unit tests of the
//! rules, and a real Prometheus scraping a real server tree (an etcd-elected root and an
//! intermediate server) and a sidecar under load, which runs every dashboard query and every
//! rule expression and must get series back from each.
//!
//! An alert's expression is a condition, empty while nothing is wrong; the test runs it with its
//! one threshold comparison turned into a `bool` comparison (`x > 0.1` → `x > bool 0.1`), which
//! keeps every series the condition looks at, valued 1 where it holds and 0 where not.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde_json::Value;
use sluice_proto::GetCapacityRequest;
use sluice_tests::{
    config::{
        Algorithm, ConfigFile, Listener, Match, OnLimit, PathMatch, Resource, Rule, ServerConfig, SidecarConfig,
        Template, Upstream,
    },
    etcd::Etcd,
    harness::{Process, Server, Sidecar},
    http::{get, http1},
    prometheus::{Prometheus, promtool, tools_present},
    upstream::UpstreamProcess,
    wait::{eventually, lazily},
};
use tonic::Code;

const RULES: &str = "prometheus/sluice-rules.yaml";
const RULE_TESTS: &str = "prometheus/sluice-rules.test.yaml";
const DASHBOARD: &str = "grafana/sluice.json";
/// The etcd key the root tier campaigns on.
const TIER: &str = "/sluice/test/observability";
/// What `$__rate_interval` stands for: Grafana's is at least four scrape intervals (1 s here).
const RATE_INTERVAL: &str = "10s";
/// Each resource's capacity at the root: well below the load, so that requests are rejected,
/// delayed and shadow-rejected.
const CAPACITY: f64 = 20.0;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(path)
}

fn read_yaml(path: &Path) -> Value {
    yaml_serde::from_str(&fs::read_to_string(path).expect("read YAML")).expect("valid YAML")
}

fn dashboard() -> Value {
    serde_json::from_str(&fs::read_to_string(deploy(DASHBOARD)).expect("read the dashboard")).expect("dashboard JSON")
}

/// The alerting rules of the rules file: (name, rule).
fn alerts() -> Vec<(String, Value)> {
    let rules = read_yaml(&deploy(RULES));
    let groups = rules["groups"].as_array().expect("groups");
    let rules = groups.iter().flat_map(|g| g["rules"].as_array().expect("rules").iter());
    rules.filter_map(|r| Some((r["alert"].as_str()?.to_owned(), r.clone()))).collect()
}

/// The alert's condition with its threshold comparison made a `bool` one. The rules keep to
/// one comparison outside parentheses, braces, brackets and strings; another form is refused.
fn condition_as_bool(expr: &str) -> Result<String, String> {
    let bytes = expr.as_bytes();
    let (mut depth, mut quote, mut found) = (0i32, None, Vec::new());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match (quote, c) {
            (Some(q), b'\\') if q != b'`' => i += 1,
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'"' | b'\'' | b'`') => quote = Some(c),
            (None, b'(' | b'{' | b'[') => depth += 1,
            (None, b')' | b'}' | b']') => depth -= 1,
            (None, b'=' | b'!' | b'<' | b'>') if depth == 0 => {
                let two = bytes.get(i + 1) == Some(&b'=');
                if two || matches!(c, b'<' | b'>') {
                    let end = i + 1 + usize::from(two);
                    found.push(end);
                    i = end;
                    continue;
                }
                return Err(format!("{expr}: unexpected `{}`", c as char));
            }
            _ => {}
        }
        i += 1;
    }
    match found[..] {
        [end] => Ok(format!("{} bool{}", &expr[..end], &expr[end..])),
        _ => Err(format!("{expr}: {} comparisons outside parentheses, not one", found.len())),
    }
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every `sluice_*` metric name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("sluice_") {
        let preceded = rest[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        let tail = &rest[at..];
        let len = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        if !preceded {
            names.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
    names
}

/// A dashboard's PromQL with its variables filled in: every template variable matches all,
/// `$__rate_interval` is [`RATE_INTERVAL`].
fn substitute(expr: &str, variables: &[String]) -> String {
    let mut out = expr.replace("$__rate_interval", RATE_INTERVAL);
    for name in variables {
        out = out.replace(&format!("${{{name}}}"), ".*").replace(&format!("${name}"), ".*");
    }
    out
}

/// Every query panel of the dashboard: (title, queries).
fn panels(dashboard: &Value) -> Vec<(String, Vec<String>)> {
    let all = dashboard["panels"].as_array().expect("panels");
    let queries = all.iter().filter(|p| p["type"] != "row");
    queries
        .map(|p| {
            let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
            let exprs = targets.iter().map(|t| t["expr"].as_str().unwrap_or_default().to_owned()).collect();
            (p["title"].as_str().unwrap_or_default().to_owned(), exprs)
        })
        .collect()
}

/// The template variables: (name, `label_values(selector, label)` split, for query variables).
fn variables(dashboard: &Value) -> Vec<(String, Option<(String, String)>)> {
    let list = dashboard["templating"]["list"].as_array().expect("templating variables");
    list.iter()
        .map(|v| {
            let name = v["name"].as_str().expect("variable name").to_owned();
            let query = v["query"].as_str().filter(|_| v["type"] == "query").map(|q| {
                let inner =
                    q.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).expect("label_values(..)");
                let (selector, label) = inner.rsplit_once(',').expect("label_values(selector, label)");
                (selector.trim().to_owned(), label.trim().to_owned())
            });
            (name, query)
        })
        .collect()
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook_section() {
    let docs = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/observability.md")).unwrap();
    let anchors: BTreeSet<String> =
        docs.lines().filter_map(|l| l.strip_prefix('#')).map(|h| anchor(h.trim_start_matches('#'))).collect();
    let alerts = alerts();
    assert!(alerts.len() >= 10, "{} alerts", alerts.len());
    for (name, rule) in &alerts {
        assert!(matches!(rule["labels"]["severity"].as_str(), Some("critical" | "warning")), "{name}: severity");
        let annotations = &rule["annotations"];
        for key in ["summary", "description"] {
            assert!(annotations[key].as_str().is_some_and(|s| !s.is_empty()), "{name}: no {key}");
        }
        let url = annotations["runbook_url"].as_str().unwrap_or_default();
        let section = url.strip_prefix("docs/observability.md#").unwrap_or_else(|| panic!("{name}: runbook_url {url}"));
        assert_eq!(section, name.to_lowercase(), "{name}: the runbook section is named after the alert");
        assert!(anchors.contains(section), "{name}: no section #{section} in docs/observability.md");
        condition_as_bool(rule["expr"].as_str().expect("expr")).unwrap();
    }
}

#[test]
fn the_condition_of_an_alert_becomes_a_bool_comparison() {
    assert_eq!(condition_as_bool("x > 0.1").unwrap(), "x > bool 0.1");
    assert_eq!(
        condition_as_bool("sum by (a) (rate(x{a!=\"b\",c=~\"d\"}[5m]) > 0) >= 2 * y").unwrap(),
        "sum by (a) (rate(x{a!=\"b\",c=~\"d\"}[5m]) > 0) >= bool 2 * y"
    );
    assert_eq!(condition_as_bool("x{a=\"<\"} == 0").unwrap(), "x{a=\"<\"} == bool 0");
    assert!(condition_as_bool("x > 1 and y < 2").is_err(), "two comparisons");
    assert!(condition_as_bool("absent(x)").is_err(), "no comparison");
    assert_eq!(
        metric_names("rate(sluice_a_total[5m]) / sluice:b:sum + sluice_c"),
        ["sluice_a_total", "sluice_c"].map(String::from).into()
    );
    assert_eq!(anchor(" SluiceServerTierWithoutMaster"), "sluiceservertierwithoutmaster");
    assert_eq!(anchor("Alerts and runbooks"), "alerts-and-runbooks");
}

#[test]
fn the_dashboard_is_well_formed() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "sluice");
    let ids: Vec<_> =
        dashboard["panels"].as_array().unwrap().iter().map(|p| p["id"].as_u64().expect("panel id")).collect();
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len(), "panel ids are unique: {ids:?}");
    let rows: Vec<_> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].clone())
        .collect();
    assert_eq!(rows, ["Resources", "Capacity servers", "Server tree"]);
    let names: Vec<String> = variables(&dashboard).into_iter().map(|(name, _)| name).collect();
    for panel in dashboard["panels"].as_array().unwrap() {
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().expect("gridPos.x"), grid["w"].as_u64().expect("gridPos.w"));
        assert!(x + w <= 24, "{}: past the 24 columns", panel["title"]);
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{}", panel["title"]);
        assert!(panel["description"].as_str().is_some_and(|d| !d.is_empty()), "{}: no description", panel["title"]);
    }
    for (title, exprs) in panels(&dashboard) {
        assert!(!exprs.is_empty() && exprs.iter().all(|e| !e.is_empty()), "{title}: a panel without a query");
        for expr in exprs {
            let filled = substitute(&expr, &names);
            assert!(!filled.contains('$'), "{title}: an unknown variable in {expr}");
        }
    }
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    if !tools_present(&["promtool"]) {
        return;
    }
    let dir = deploy("prometheus");
    for args in [["check", "rules", "sluice-rules.yaml"], ["test", "rules", "sluice-rules.test.yaml"]] {
        let output = promtool(&dir, &args, "");
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "promtool {}:\n{text}", args.join(" "));
        assert!(text.contains("SUCCESS"), "promtool {}:\n{text}", args.join(" "));
    }
    // Every alert is shown firing and not firing by the unit tests.
    let tests = read_yaml(&deploy(RULE_TESTS));
    let (mut firing, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in tests["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let name = case["alertname"].as_str().unwrap().to_owned();
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                firing.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    for (name, _) in alerts() {
        assert!(firing.contains(&name) && quiet.contains(&name), "{name}: the unit tests must show it firing and not");
    }
}

/// A sidecar in front of `upstream`, leasing from `server`: one resource per on_limit mode.
fn sidecar_config(upstream: SocketAddr, server: SocketAddr) -> SidecarConfig {
    let rule = |prefix: &str, resource: &str, on_limit: OnLimit| {
        Rule::charging(resource).matching(Match::default().path(PathMatch::Prefix(prefix.into()))).on_limit(on_limit)
    };
    SidecarConfig::proxy(Listener::app(), Upstream::app(upstream))
        .leasing_from([server])
        .resource(Resource::new("rejecting"))
        .resource(Resource::new("delaying"))
        .resource(Resource::new("shadowing"))
        .rule(rule("/echo/reject", "rejecting", OnLimit::Reject))
        .rule(rule("/echo/delay", "delaying", OnLimit::Delay).max_wait(Duration::from_millis(300)))
        .rule(rule("/echo/shadow", "shadowing", OnLimit::Shadow))
}

/// A server sharing `capacity` of each resource, with leases of `lease` seconds refreshed every
/// `refresh`, without learning mode.
fn server_config(capacity: f64, lease: u64, refresh: u64) -> ServerConfig {
    let algorithm = Algorithm::fair_share(lease, refresh).learning(0);
    // One resource learns its capacity, for the adaptive series: at most `capacity`, which its
    // load (shadowed, all forwarded) exceeds whatever the controller decides.
    ServerConfig::new()
        .template(Template::adaptive("shadowing", 0.0, capacity, algorithm.clone()))
        .template(Template::catch_all(capacity, algorithm))
}

/// Offers each of the sidecar's resources about 60 requests a second until `stop`.
fn load(listen: SocketAddr, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    let client = http1();
    let mut tasks = Vec::new();
    for path in ["reject", "delay", "shadow"] {
        for _ in 0..3 {
            let (client, stop, url) = (client.clone(), stop.clone(), format!("http://{listen}/echo/{path}"));
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let answer = get(&client, &url).await;
                    assert!(matches!(answer.status.as_u16(), 200 | 429), "{url}: {}", answer.status);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
    }
    tasks
}

/// Waits until `query` returns a series.
async fn series_of(prometheus: &Prometheus, query: &str) {
    let why = lazily(|| format!("no series for {query}; log:\n{}", prometheus.logs()));
    eventually(why, async || prometheus.query(query).is_ok_and(|s| !s.is_empty())).await;
}

/// The series of `query`, which must be at least one; printed with what asked for it.
fn series(prometheus: &Prometheus, what: &str, query: &str) -> Vec<Value> {
    let series = prometheus.query(query).unwrap_or_else(|e| panic!("{what}: {e}"));
    let finite = series
        .iter()
        .filter(|s| s["value"][1].as_str().is_some_and(|v| v.parse::<f64>().is_ok_and(f64::is_finite)))
        .count();
    eprintln!(
        "{:>3} series ({finite} finite)  {what}: {}",
        series.len(),
        query.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    assert!(!series.is_empty(), "{what}: no series for {query}");
    series
}

/// The values of `series` by the value of `label`.
fn by_label(series: &[Value], label: &str) -> BTreeMap<String, Vec<f64>> {
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in series {
        let key = s["metric"][label].as_str().unwrap_or_default().to_owned();
        values.entry(key).or_default().push(s["value"][1].as_str().unwrap().parse().unwrap());
    }
    values
}

/// Waits until `check` holds for the value of `process`'s `series` on /metrics, and returns it.
async fn gauge_until(process: &Process, series: &str, what: &str, check: impl Fn(f64) -> bool) -> f64 {
    let mut value = None;
    let why = lazily(|| format!("{series} is {:?}, not {what}; log:\n{}", process.metric(series), process.logs()));
    eventually(why, async || {
        value = process.metric(series);
        value.is_some_and(&check)
    })
    .await;
    value.expect("checked")
}

/// The gauges the alerts added read: a tree's parent lease and its loss, the sidecar's time on
/// its fallback once its server is gone, and both binaries' last reload.
#[tokio::test]
async fn the_alert_gauges_follow_leases_and_reloads() {
    let template = |capacity: f64| server_config(capacity, 3, 1);
    let root = Server::launch().config(&template(10.0)).start();
    let poll = ["--config-poll-interval", "100ms"];
    let leaf = Server::launch().config(&template(0.0)).args(poll).args(["--parent", &root.grpc.to_string()]).start();
    let upstream = UpstreamProcess::start(None);
    let sidecar_config = sidecar_config(upstream.addr(), leaf.grpc);
    let sidecar = Sidecar::launch(&sidecar_config).args(poll).start();
    let listen = sidecar.listen();
    assert_eq!(get(&http1(), &format!("http://{listen}/echo/reject")).await.status, 200);

    assert_eq!(root.metric("sluice_server_info{election=\"embedded\",election_key=\"\"}"), Some(1.0));
    assert_eq!(root.metric("sluice_server_elections_total{result=\"won\"}"), Some(0.0), "shown from zero");
    let expiry = "sluice_server_parent_lease_expiry_timestamp_seconds{resource=\"rejecting\"}";
    assert_eq!(root.metric(expiry), None, "a root has no parent lease");
    let now = unix_now();
    gauge_until(&leaf, expiry, "a lease's expiry", |t| t > now).await;
    let mode = "sluice_sidecar_mode{resource=\"rejecting\",mode=\"leased\"}";
    gauge_until(&sidecar, mode, "leased", |m| m == 1.0).await;
    let refresh = "sluice_sidecar_refresh_interval_seconds{resource=\"rejecting\"}";
    assert_eq!(sidecar.metric(refresh), Some(1.0));
    let fallback = "sluice_sidecar_fallback_duration_seconds{resource=\"rejecting\"}";
    assert_eq!(sidecar.metric(fallback), Some(0.0));
    assert_eq!(sidecar.metric("sluice_sidecar_refresh_interval_seconds{resource=\"shadowing\"}"), None, "never leased");

    // A rejected change, then a good one, on both binaries.
    let leaf_config = template(0.0);
    let binaries: [(&Process, &dyn ConfigFile, &str); 2] = [
        (&leaf, &leaf_config, "sluice_server_config_last_reload_successful"),
        (&sidecar, &sidecar_config, "sluice_sidecar_config_last_reload_successful"),
    ];
    for (process, good, last) in binaries {
        assert_eq!(process.metric(last), Some(1.0));
        // Not YAML: written by hand, as no configuration the kit builds can be.
        process.write_raw_config("resources: [unclosed\n");
        gauge_until(process, last, "0 after a rejected change", |v| v == 0.0).await;
        process.write_config(good);
        gauge_until(process, last, "1 after a good change", |v| v == 1.0).await;
    }

    // The root goes: the leaf's lease from it runs out.
    drop(root);
    gauge_until(&leaf, expiry, "0 once the lease ran out", |t| t == 0.0).await;
    // The leaf goes: the sidecar's lease runs out and its fallback applies, for longer and longer.
    drop(leaf);
    let on_fallback = "sluice_sidecar_mode{resource=\"rejecting\",mode=\"fallback_safe\"}";
    gauge_until(&sidecar, on_fallback, "on the fallback", |m| m == 1.0).await;
    let first = gauge_until(&sidecar, fallback, "above 0", |d| d > 0.0).await;
    gauge_until(&sidecar, fallback, "growing", |d| d >= first + 0.5).await;
    assert_eq!(sidecar.metric(refresh), Some(1.0), "the last lease's, kept on the fallback");
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_gets_series_for_every_dashboard_query_and_rule_from_the_binaries() {
    if !tools_present(&["prometheus", "promtool"]) {
        return;
    }
    let etcd = Etcd::start();
    let root = Server::launch()
        .config(&server_config(CAPACITY, 10, 2))
        .args(["--etcd-endpoints", &etcd.endpoint(), "--election-key", TIER])
        .start();
    let leaf = Server::launch().config(&server_config(0.0, 10, 2)).args(["--parent", &root.grpc.to_string()]).start();
    let upstream = UpstreamProcess::start(None);
    let sidecar = Sidecar::launch(&sidecar_config(upstream.addr(), leaf.grpc)).start();
    let listen = sidecar.listen();
    let rules = deploy(RULES);
    let prometheus = Prometheus::start(
        &[("sluice-server", vec![root.admin, leaf.admin]), ("sluice-sidecar", vec![sidecar.admin])],
        &[&rules],
    );

    // Client errors for the error panels and rules to see. A counter series appears with its
    // first increment, which `rate` cannot see: the second round is what it counts.
    let mut client = root.client().await;
    for round in 0..2 {
        for _ in 0..3 {
            let status = client.get_capacity(GetCapacityRequest::default()).await.expect_err("no client id");
            assert_eq!(status.code(), Code::InvalidArgument);
        }
        if round == 0 {
            let errors = "sluice_server_requests_total{code=\"INVALID_ARGUMENT\"}";
            series_of(&prometheus, errors).await;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(listen, &stop);
    // Until Prometheus has seen each decision happen, the parent lease and the election.
    for query in [
        "increase(sluice_sidecar_requests_total{decision=\"rejected\"}[10s]) > 0",
        "increase(sluice_sidecar_requests_total{decision=\"delayed\"}[10s]) > 0",
        "increase(sluice_sidecar_requests_total{decision=\"shadow_rejected\"}[10s]) > 0",
        "sluice_server_parent_lease_capacity",
        // After the root's first decision on the sidecar's signals, passed up by the leaf.
        "sluice_server_adaptive_goodput",
        "sluice_server_elections_total{result=\"won\"} > 0",
        "sluice:sidecar_rejected:ratio_rate5m{resource=\"rejecting\"} > 0.1",
    ] {
        series_of(&prometheus, query).await;
    }
    // Until each recording rule has recorded, as the alerts read what they record.
    let loaded = prometheus.api("/api/v1/rules").unwrap();
    for group in loaded["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap().iter().filter(|r| r["type"] == "recording") {
            series_of(&prometheus, rule["name"].as_str().unwrap()).await;
        }
    }

    // The dashboard: its variables' selectors, then every panel's queries.
    let dashboard = dashboard();
    let variables = variables(&dashboard);
    let names: Vec<String> = variables.iter().map(|(name, _)| name.clone()).collect();
    let mut referenced = BTreeSet::new();
    let mut queries = 0;
    for (name, query) in &variables {
        let Some((selector, label)) = query else { continue };
        referenced.extend(metric_names(selector));
        let found = series(&prometheus, &format!("variable ${name}"), &substitute(selector, &names));
        assert!(found.iter().any(|s| s["metric"][label].is_string()), "${name}: no series has label {label}");
        queries += 1;
    }
    for (title, exprs) in panels(&dashboard) {
        for expr in exprs {
            referenced.extend(metric_names(&expr));
            series(&prometheus, &format!("panel \"{title}\""), &substitute(&expr, &names));
            queries += 1;
        }
    }

    // Every rule as Prometheus loaded it: evaluated without error, and with series.
    let loaded = prometheus.api("/api/v1/rules").unwrap();
    let mut conditions = BTreeMap::new();
    for group in loaded["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let (name, query) = (rule["name"].as_str().unwrap(), rule["query"].as_str().unwrap());
            assert_eq!(rule["health"], "ok", "{name}: {}", rule["lastError"]);
            referenced.extend(metric_names(query));
            match rule["type"].as_str() {
                Some("recording") => {
                    series(&prometheus, &format!("record {name}"), query);
                }
                _ => {
                    let condition = condition_as_bool(query).unwrap();
                    conditions.insert(name.to_owned(), series(&prometheus, &format!("alert {name}"), &condition));
                }
            }
            queries += 1;
        }
    }
    assert_eq!(conditions.len(), alerts().len(), "every alert of the file is loaded");

    // What the conditions say of this setup: the reject resource is rejecting, the root
    // answered errors, the leaf is asked for more than it has; nothing else is wrong.
    let holds = |alert: &str| by_label(&conditions[alert], "resource");
    assert_eq!(holds("SluiceSidecarRejecting")["rejecting"], [1.0]);
    assert_eq!(holds("SluiceSidecarRejecting")["shadowing"], [0.0], "shadow rejections pass");
    let root_instance = root.admin.to_string();
    assert_eq!(by_label(&conditions["SluiceServerRpcErrors"], "instance")[&root_instance], [1.0]);
    // At the leaf, where the sidecar's wants land at once (the root hears of them later).
    let leaf_instance = leaf.admin.to_string();
    let demand = conditions["SluiceServerDemandExceedsCapacity"]
        .iter()
        .filter(|s| s["metric"]["instance"] == leaf_instance.as_str());
    assert_eq!(by_label(&demand.cloned().collect::<Vec<_>>(), "resource")["rejecting"], [1.0]);
    for alert in [
        "SluiceSidecarOnFallback",
        "SluiceSidecarCapacityRpcErrors",
        "SluiceServerParentRpcErrors",
        "SluiceServerTierWithoutMaster",
        "SluiceServerMasterFlapping",
        "SluiceServerConfigReloadFailed",
        "SluiceSidecarConfigReloadFailed",
        "SluiceServerParentLeaseMissing",
    ] {
        let held = conditions[alert].iter().filter(|s| s["value"][1] != "0").count();
        assert_eq!(held, 0, "{alert} holds: {:?}", conditions[alert]);
    }
    assert_eq!(
        by_label(&conditions["SluiceServerTierWithoutMaster"], "election_key").keys().collect::<Vec<_>>(),
        [TIER]
    );
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("load task");
    }

    // Every metric the dashboard and the rules name is exported; each exposition passes promtool.
    let processes: [(&str, &Process); 3] = [("root", &*root), ("leaf", &*leaf), ("sidecar", &*sidecar)];
    let mut exported = BTreeSet::new();
    for (what, process) in processes {
        let (_, body) = process.get("/metrics");
        let names = body.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next());
        exported.extend(names.filter(|n| n.starts_with("sluice_")).map(str::to_owned));
        let output = promtool(Path::new("."), &["check", "metrics"], &body);
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success() && text.trim().is_empty(), "promtool check metrics, {what}:\n{text}");
    }
    let missing: Vec<_> = referenced.difference(&exported).collect();
    assert!(missing.is_empty(), "queried but not exported: {missing:?}");
    eprintln!("{queries} queries; {} sluice_* names queried, all exported: {referenced:?}", referenced.len());
    drop(prometheus);
    drop(etcd);
}
