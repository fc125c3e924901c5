//! The status pages as a person sees them: a real server and a real sidecar under load, their
//! `/debug/status` pages rendered by headless Chromium, with charts of the last minutes drawn
//! from the binaries' own history and times shown as dates and ages.

use std::time::Duration;

use sluice_tests::{
    browser::Chromium,
    config::{Algorithm, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig, Template, Upstream},
    harness::{Process, Server, Sidecar},
    http::{get, http1},
    upstream::UpstreamProcess,
    wait::{eventually, lazily},
};
use tokio::time::sleep;

/// Sampling interval for both binaries: short, so that the charts have points within seconds.
const SAMPLE_EVERY: &str = "300ms";

#[tokio::test]
async fn status_pages_chart_the_last_minutes_and_show_ages() {
    let Some(chromium) = Chromium::find() else { return };
    let upstream = UpstreamProcess::start(None);
    let server = Server::launch()
        .config(&ServerConfig::new().template(Template::catch_all(5.0, Algorithm::fair_share(30, 1).learning(0))))
        .args(["--history-interval", SAMPLE_EVERY])
        .start();
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(upstream.addr()))
        .leasing_from([server.grpc])
        .resource(Resource::new("orders"))
        .rule(Rule::charging("orders").on_limit(OnLimit::Reject));
    let sidecar = Sidecar::launch(&config).args(["--history-interval", SAMPLE_EVERY]).start();
    let listen = sidecar.listen();

    // About 50 requests a second against a lease of 5: some admitted, most refused. Far above the
    // lease, so that the sidecar still wants all of it while the browser slows the load down.
    let load = tokio::spawn(async move {
        let client = http1();
        loop {
            get(&client, &format!("http://{listen}/echo")).await;
            sleep(Duration::from_millis(20)).await;
        }
    });
    let status = || serde_json::from_str::<serde_json::Value>(&sidecar.get("/debug/status.json").1).unwrap();
    eventually(lazily(|| format!("no lease, admissions and refusals: {}", status())), async || {
        let orders = &status()["resources"][0];
        orders["mode"] == "leased" && orders["admitted"].as_u64() > Some(0) && orders["refused"].as_u64() > Some(0)
    })
    .await;
    // A few samples under the lease.
    sleep(Duration::from_secs(2)).await;

    let page = |process: &Process, path: &str| chromium.dom(&format!("http://{}{path}", process.admin));
    let sidecar_page = page(&sidecar, "/debug/status");
    let server_page = page(&server, "/debug/status");
    let resource_page = page(&server, "/debug/status?resource=orders");
    load.abort();

    for dom in [&sidecar_page, &server_page, &resource_page] {
        assert!(dom.contains("<meta http-equiv=\"refresh\" content=\"5\">"), "refreshes itself: {dom}");
        assert_eq!(dom.matches("<svg").count(), 1, "one chart: {dom}");
        assert!(dom.contains("ago</text>") && dom.contains(">now</text>"), "a time axis: {dom}");
        assert!(!dates(dom).is_empty(), "dates: {dom}");
    }

    // The sidecar: its lease's capacity, and requests admitted and refused per second.
    for label in ["capacity", "admitted", "delayed", "refused"] {
        assert!(sidecar_page.contains(&format!("{label} <tspan")), "{label} in the legend: {sidecar_page}");
    }
    let lines = polylines(&sidecar_page);
    assert!(lines.iter().filter(|(_, points)| points.len() >= 2).count() >= 4, "four lines drawn: {lines:?}");
    assert!(lines.iter().any(|(dashed, points)| *dashed && flat(points)), "the lease of 5, level: {lines:?}");
    let sidecar_ages = ages(&sidecar_page);
    assert!(
        sidecar_ages.iter().any(|a| a.starts_with("in ") && a.ends_with(" s")),
        "the lease expires in seconds: {sidecar_ages:?}"
    );
    assert!(sidecar_ages.iter().any(|a| a.ends_with(" s ago")), "the configuration was applied: {sidecar_ages:?}");

    // The server: the resource's capacity, Σ wants and Σ has.
    for page in [&server_page, &resource_page] {
        for label in ["capacity", "Σ wants", "Σ has"] {
            assert!(page.contains(&format!("{label} <tspan")), "{label} in the legend: {page}");
        }
        let lines = polylines(page);
        assert_eq!(lines.iter().filter(|(_, points)| points.len() >= 2).count(), 3, "three lines drawn: {lines:?}");
        assert!(lines.iter().any(|(dashed, points)| *dashed && flat(points)), "a capacity of 5, level: {lines:?}");
    }
    assert!(server_page.contains("1 of 1 resources charted"), "{server_page}");
    let server_ages = ages(&server_page);
    assert!(
        server_ages.iter().filter(|a| a.ends_with(" s ago")).count() >= 3,
        "role, serving, config: {server_ages:?}"
    );
    assert!(ages(&resource_page).iter().any(|a| a.starts_with("in ")), "the sidecar's lease expires: {resource_page}");
}

/// Every polyline in `dom`: whether it is dashed, and its points.
fn polylines(dom: &str) -> Vec<(bool, Vec<(f64, f64)>)> {
    dom.split("<polyline")
        .skip(1)
        .map(|rest| {
            let element = &rest[..rest.find('>').expect("a closed tag")];
            let points = element.split("points=\"").nth(1).and_then(|p| p.split('"').next()).unwrap_or("");
            let points = points
                .split_whitespace()
                .map(|pair| {
                    let (x, y) = pair.split_once(',').expect("x,y");
                    (x.parse().expect("x"), y.parse().expect("y"))
                })
                .collect();
            (element.contains("stroke-dasharray"), points)
        })
        .collect()
}

/// Level over its last three points (a sidecar's capacity is 0 until its first lease).
fn flat(points: &[(f64, f64)]) -> bool {
    let last = &points[points.len().saturating_sub(3)..];
    last.len() == 3 && last.iter().all(|p| p.1 == last[0].1) && last[2].0 > last[0].0
}

/// Every age in parentheses, e.g. "in 8 s", "3 min ago".
fn ages(dom: &str) -> Vec<String> {
    dom.split('(')
        .filter_map(|rest| rest.split(')').next())
        .filter(|text| {
            let words: Vec<&str> = text.split(' ').collect();
            let number = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
            let unit = |w: &str| ["s", "min", "h", "d"].contains(&w);
            match words[..] {
                ["in", n, u] | [n, u, "ago"] => number(n) && unit(u),
                _ => false,
            }
        })
        .map(str::to_owned)
        .collect()
}

/// Every ISO-8601 UTC date to the second, e.g. "2026-11-25T10:00:00Z".
fn dates(dom: &str) -> Vec<&str> {
    (0..dom.len().saturating_sub(19))
        .filter_map(|i| dom.get(i..i + 20))
        .filter(|s| {
            s.bytes().enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                10 => b == b'T',
                13 | 16 => b == b':',
                19 => b == b'Z',
                _ => b.is_ascii_digit(),
            })
        })
        .collect()
}
