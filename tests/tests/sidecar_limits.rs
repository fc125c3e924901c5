//! Enforcement and leases through the real sidecar (SPEC §4.3–4.5): reject, delay and shadow
//! modes, concurrency limits, the capacity server going away and coming back, reloads, and
//! releasing leases at shutdown.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use sluice_tests::{
    config::{
        Algorithm, ConfigFile, Cost, Fallback, Kind, Listener, OnLimit, Resource, Rule, ServerConfig, SidecarConfig,
        Template, Upstream,
    },
    harness::{Server, Sidecar, run, standalone_sidecar},
    http::{HttpClient, get, http1, send},
    upstream::{
        UpstreamProcess,
        echo::{EchoRequest, echo_client::EchoClient},
    },
    wait::eventually,
};
use tonic::Code;

/// A sidecar in front of `upstream` whose one rule charges one resource.
fn config(upstream: SocketAddr, resource: Resource, rule: Rule) -> SidecarConfig {
    SidecarConfig::proxy(Listener::app(), Upstream::app(upstream)).resource(resource).rule(rule)
}

/// A standalone sidecar (no capacity server) in front of a fresh test upstream, charging
/// `resource` by `rule`: the upstream, the sidecar and its listener.
fn standalone(resource: Resource, rule: Rule) -> (UpstreamProcess, Sidecar, SocketAddr) {
    let upstream = UpstreamProcess::start(None);
    let (sidecar, addr) = standalone_sidecar(Listener::app(), Upstream::app(upstream.addr()), resource, rule);
    (upstream, sidecar, addr)
}

/// A sidecar leasing from a fresh capacity server configured with `repository`, in front of a
/// fresh test upstream, charging `resource` by `rule`: the upstream, the server (restart it at
/// its `grpc` address), the sidecar and its listener.
fn leasing(
    repository: &ServerConfig,
    resource: Resource,
    rule: Rule,
) -> (UpstreamProcess, Server, Sidecar, SocketAddr) {
    let upstream = UpstreamProcess::start(None);
    let server = Server::launch().config(repository).start();
    let sidecar = Sidecar::launch(&config(upstream.addr(), resource, rule).leasing_from([server.grpc])).start();
    let addr = sidecar.listen();
    (upstream, server, sidecar, addr)
}

/// Everything shared by capacity `capacity`, with a safe capacity of 7; `learning`: seconds of
/// learning mode.
fn doorman(capacity: f64, lease: u64, refresh: u64, learning: u64) -> ServerConfig {
    let algorithm = Algorithm::fair_share(lease, refresh).learning(learning);
    ServerConfig::new().template(Template::catch_all(capacity, algorithm).safe_capacity(7.0))
}

/// The sidecar's status for one resource.
fn resource_status(sidecar: &Sidecar, id: &str) -> serde_json::Value {
    let (_, body) = sidecar.get("/debug/status.json");
    let status: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    status["resources"].as_array().unwrap().iter().find(|r| r["id"] == id).cloned().expect("resource listed")
}

#[tokio::test]
async fn reject_mode_answers_at_once_with_429_or_resource_exhausted() {
    let (_upstream, sidecar, addr) =
        standalone(Resource::new("tiny").capacity(1.0).burst(2.0), Rule::charging("tiny").on_limit(OnLimit::Reject));
    let client = http1();
    let url = format!("http://{addr}/echo");

    let mut codes = Vec::new();
    let mut rejection = None;
    for _ in 0..6 {
        let start = Instant::now();
        let answer = get(&client, &url).await;
        if answer.status == 429 {
            assert!(
                start.elapsed() < Duration::from_millis(500),
                "rejections are immediate, took {:?}",
                start.elapsed()
            );
            rejection = Some(answer);
        } else {
            codes.push(answer.status.as_u16());
        }
    }
    assert_eq!(codes, [200, 200], "the burst of 2 passes, the rest is rejected");
    let rejection = rejection.expect("a rejection");
    assert_eq!(rejection.headers["retry-after"], "1");
    assert!(rejection.headers["date"].to_str().unwrap().ends_with(" GMT"), "{:?}", rejection.headers);
    assert_eq!(rejection.headers["ratelimit-policy"], "\"tiny\";q=1;w=1");
    assert!(rejection.headers["ratelimit"].to_str().unwrap().starts_with("\"tiny\";r=0;t="));
    assert!(rejection.body.contains("resource \"tiny\""), "{}", rejection.body);
    assert!(rejection.body.contains("(rule \"rules[0]\")"), "an unnamed rule goes by its place: {}", rejection.body);

    let mut grpc = EchoClient::connect(format!("http://{addr}")).await.unwrap();
    let status = grpc.unary(EchoRequest::default()).await.expect_err("limited");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("tiny"), "{}", status.message());
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some(), "pushback: {:?}", status.metadata());

    assert_eq!(sidecar.metric("sluice_sidecar_requests_total{resource=\"tiny\",decision=\"allowed\"}"), Some(2.0));
    assert_eq!(sidecar.metric("sluice_sidecar_requests_total{resource=\"tiny\",decision=\"rejected\"}"), Some(5.0));
}

#[tokio::test]
async fn delay_mode_never_holds_past_max_wait_or_the_grpc_deadline() {
    let (_upstream, sidecar, addr) = standalone(
        Resource::new("slow").capacity(10.0).burst(1.0),
        Rule::charging("slow").on_limit(OnLimit::Delay).max_wait(Duration::from_millis(300)),
    );
    let client = http1();
    let url = format!("http://{addr}/echo");

    // 12 at once at 10/s: about 3 fit in 300 ms after the first, the rest wait 300 ms and go.
    let calls: Vec<_> = (0..12)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                let answer = get(&client, &url).await;
                (answer.status.as_u16(), start.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.unwrap());
    }
    let passed = results.iter().filter(|(code, _)| *code == 200).count();
    let rejected = results.iter().filter(|(code, _)| *code == 429).count();
    assert_eq!(passed + rejected, 12, "{results:?}");
    assert!((2..=5).contains(&passed), "1 at once plus up to 3 within 300 ms at 10/s: {results:?}");
    for (code, took) in &results {
        // Never past max_wait (plus scheduling slack of a debug build under load).
        assert!(*took < Duration::from_millis(300 + 250), "{code} after {took:?}");
    }
    assert!(sidecar.metric("sluice_sidecar_requests_total{resource=\"slow\",decision=\"delayed\"}").unwrap() >= 2.0);

    // A gRPC deadline shorter than max_wait wins.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut grpc = EchoClient::connect(format!("http://{addr}")).await.unwrap();
    let _ = grpc.unary(EchoRequest::default()).await; // takes the token
    let mut call = tonic::Request::new(EchoRequest::default());
    call.set_timeout(Duration::from_millis(30));
    let start = Instant::now();
    let status = grpc.unary(call).await.expect_err("not admitted within 30 ms");
    assert!(start.elapsed() < Duration::from_millis(250), "held {:?}", start.elapsed());
    assert!(matches!(status.code(), Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled), "{status:?}");
}

#[tokio::test]
async fn a_delayed_call_goes_upstream_with_what_is_left_of_its_deadline() {
    let (_upstream, _sidecar, addr) = standalone(
        Resource::new("slow").capacity(1.0).burst(1.0),
        Rule::charging("slow").on_limit(OnLimit::Delay).max_wait(Duration::from_secs(3)),
    );
    let (client, url) = (http1(), format!("http://{addr}/echo"));
    assert_eq!(get(&client, &url).await.status, 200, "takes the token");
    let timed = http::Request::get(&url).header("grpc-timeout", "5S").body(Full::default()).unwrap();
    let answer = send(&client, timed, Duration::from_secs(10)).await.expect("an answer");
    assert_eq!(answer.status, 200, "delayed about a second, then forwarded");
    let seen: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    let forwarded = seen["headers"].as_array().unwrap().iter().find(|h| h[0] == "grpc-timeout").map(|h| h[1].clone());
    let left: Option<u64> = forwarded.as_ref().and_then(|v| v.as_str()?.strip_suffix('m')?.parse().ok());
    assert!(left.is_some_and(|ms| ms < 5000), "grpc-timeout upstream: {forwarded:?}");
}

#[tokio::test]
async fn shadow_mode_forwards_everything_and_counts() {
    let (_upstream, sidecar, addr) = standalone(
        Resource::new("watched").capacity(1.0).burst(1.0),
        Rule::charging("watched").on_limit(OnLimit::Shadow),
    );
    let client = http1();
    for _ in 0..10 {
        assert_eq!(get(&client, &format!("http://{addr}/echo")).await.status, 200);
    }
    let shadow = sidecar.metric("sluice_sidecar_requests_total{resource=\"watched\",decision=\"shadow_rejected\"}");
    assert!(shadow.unwrap() >= 8.0, "{shadow:?}");
}

#[tokio::test]
async fn concurrency_limits_in_flight_requests_until_their_bodies_end() {
    let (_upstream, _sidecar, addr) = standalone(
        Resource::new("pool").kind(Kind::Concurrency).capacity(2.0),
        Rule::charging("pool").on_limit(OnLimit::Reject),
    );
    let client = http1();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (client, url) = (client.clone(), format!("http://{addr}/slow?ms=400"));
            tokio::spawn(async move { get(&client, &url).await.status.as_u16() })
        })
        .collect();
    let mut codes = Vec::new();
    for call in calls {
        codes.push(call.await.unwrap());
    }
    codes.sort();
    assert_eq!(codes, [200, 200, 429, 429]);
    // Permits come back when the responses end.
    assert_eq!(get(&client, &format!("http://{addr}/echo")).await.status, 200);
}

#[tokio::test]
async fn a_missing_capacity_server_never_fails_requests() {
    let (_upstream, server, sidecar, addr) = leasing(
        &doorman(1000.0, 3, 1, 0),
        Resource::new("orders").when_unreachable(Fallback::Safe),
        Rule::charging("orders").on_limit(OnLimit::Delay).max_wait(Duration::from_secs(2)),
    );
    let grpc = server.grpc;
    let client = http1();
    let url = format!("http://{addr}/echo");
    let traffic = |client: HttpClient, url: String, n: usize| async move {
        let mut failures = 0;
        for _ in 0..n {
            if get(&client, &url).await.status != 200 {
                failures += 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        failures
    };
    assert_eq!(traffic(client.clone(), url.clone(), 5).await, 0);
    eventually("leased", async || resource_status(&sidecar, "orders")["mode"] == "leased").await;

    drop(server); // killed: SIGKILL, no goodbye
    let during = tokio::spawn(traffic(client.clone(), url.clone(), 60));
    eventually("safe fallback after expiry", async || {
        let status = resource_status(&sidecar, "orders");
        status["mode"] == "fallback_safe" && status["capacity"] == 7.0
    })
    .await;

    let _back = Server::launch().config(&doorman(1000.0, 3, 1, 0)).start_at(grpc);
    eventually("leased again", async || resource_status(&sidecar, "orders")["mode"] == "leased").await;
    assert_eq!(during.await.unwrap(), 0, "no request failed while the server was away");
    // The log tells the story once: each change of mode, not every failed refresh.
    let logs = sidecar.logs();
    let lines = |text: &str| logs.lines().filter(|l| l.contains(text)).count();
    assert_eq!(lines("no lease from the capacity servers"), 1, "one warning for the outage:\n{logs}");
    assert_eq!(lines("no valid lease: the fallback applies"), 1, "{logs}");
    assert_eq!(lines("lease back: the fallback no longer applies"), 1, "{logs}");
    assert_eq!(lines("the capacity servers answer again"), 1, "{logs}");
}

#[tokio::test]
async fn a_server_back_in_learning_mode_grants_what_the_fallback_held() {
    let (_upstream, server, sidecar, addr) =
        leasing(&doorman(1000.0, 3, 1, 0), Resource::new("orders"), Rule::charging("orders"));
    let grpc = server.grpc;
    // Steady demand throughout, well under the fallback's 7 a second.
    let traffic = tokio::spawn(async move {
        let (client, url) = (http1(), format!("http://{addr}/echo"));
        loop {
            get(&client, &url).await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    eventually("leased", async || {
        let status = resource_status(&sidecar, "orders");
        status["mode"] == "leased" && status["capacity"].as_f64().is_some_and(|c| c > 0.0)
    })
    .await;
    drop(server);
    eventually("safe fallback after expiry", async || resource_status(&sidecar, "orders")["mode"] == "fallback_safe")
        .await;
    // Back, and learning for 30 s (the sidecar's backoff may take some of that).
    let back = Server::launch().config(&doorman(1000.0, 3, 1, 30)).start_at(grpc);
    // It grants what the sidecar reports holding, its fallback's 7 (or less: its wants), not 0.
    eventually("leased again", async || resource_status(&sidecar, "orders")["mode"] == "leased").await;
    let learning = |server: &Server| {
        let (_, body) = server.get("/debug/status.json");
        let status: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
        status["resources"].as_array().is_some_and(|r| r.iter().any(|r| r["id"] == "orders" && r["learning"] == true))
    };
    let capacity = resource_status(&sidecar, "orders")["capacity"].as_f64().unwrap();
    assert!(learning(&back), "the lease came while the server was still learning");
    assert!(capacity > 0.0 && capacity <= 7.0, "what the fallback held, not 0: {capacity}");
    traffic.abort();
}

#[tokio::test]
async fn after_a_lull_delay_mode_waits_for_a_larger_lease() {
    let (_upstream, _server, sidecar, addr) = leasing(
        &doorman(1000.0, 30, 1, 0),
        Resource::new("orders"),
        // Each request is a surge on its own (more than the 3 units a low rate's noise may add).
        Rule::charging("orders").cost(Cost::Units(4.0)).on_limit(OnLimit::Delay).max_wait(Duration::from_secs(5)),
    );
    let client = http1();
    let url = format!("http://{addr}/echo");
    assert_eq!(get(&client, &url).await.status, 200);
    // The lease follows the demand of that one request down to a trickle: a request in 8 s.
    eventually("a dwindled lease", async || {
        let status = resource_status(&sidecar, "orders");
        status["mode"] == "leased" && status["capacity"].as_f64().is_some_and(|c| c < 0.5)
    })
    .await;
    // Ten at once: the first goes on the saved tokens, the rest wait for the lease the surge asks
    // for (at the trickle's rate, their wait would be far beyond max_wait).
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { get(&client, &url).await.status.as_u16() })
        })
        .collect();
    let mut codes = Vec::new();
    for call in calls {
        codes.push(call.await.unwrap());
    }
    assert_eq!(codes, [200; 10], "at the trickle's rate the last would have waited over a minute");
}

#[tokio::test]
async fn a_lease_that_comes_back_empty_ends_the_wait_for_it() {
    // Learning for longer than the test: a new client is granted nothing.
    let (_upstream, _server, sidecar, addr) = leasing(
        &doorman(1000.0, 30, 1, 60),
        Resource::new("orders"),
        Rule::charging("orders").on_limit(OnLimit::Delay).max_wait(Duration::from_secs(5)),
    );
    // Ten a second for three seconds: demand keeps surging past the 0 each answer brings.
    let calls: Vec<_> = (0..30)
        .map(|i| {
            let (client, url) = (http1(), format!("http://{addr}/echo"));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100 * i)).await;
                let sent = Instant::now();
                let status = get(&client, &url).await.status.as_u16();
                (status, sent.elapsed())
            })
        })
        .collect();
    let mut refused = Vec::new();
    for call in calls {
        let (status, took) = call.await.unwrap();
        if status == 429 {
            refused.push(took);
        }
    }
    assert_eq!(resource_status(&sidecar, "orders")["capacity"], 0.0, "still learning");
    assert!(!refused.is_empty());
    // Refused once an answer brings nothing, not after waiting out max_wait.
    let longest = refused.iter().max().unwrap();
    assert!(*longest < Duration::from_secs(3), "a 429 after {longest:?}");
}

#[tokio::test]
async fn reload_changes_rules_without_dropping_connections() {
    let upstream = UpstreamProcess::start(None);
    let listener = Listener::app();
    let config = |capacity: f64| {
        let r = Resource::new("r").capacity(capacity).burst(1.0);
        SidecarConfig::proxy(listener.clone(), Upstream::app(upstream.addr())).resource(r).rule(Rule::charging("r"))
    };
    let strict = config(1.0).resource(Resource::new("old").capacity(1.0));
    // Without `old`, and with room for every request.
    let loose = config(100_000.0);
    let sidecar = Sidecar::launch(&strict).args(["--config-poll-interval", "100ms"]).start();
    let addr = sidecar.listen();
    // One connection for the whole test: the pool keeps it alive.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build_http::<Full<Bytes>>();
    let url = format!("http://{addr}/echo");
    let first = get(&client, &url).await;
    assert_eq!(first.status, 200);
    assert_eq!(get(&client, &url).await.status, 429);

    sidecar.write_config(&loose);
    eventually("reloaded", async || {
        sidecar.metric("sluice_sidecar_config_reloads_total{result=\"success\"}") == Some(1.0)
    })
    .await;
    for _ in 0..20 {
        assert_eq!(get(&client, &url).await.status, 200, "the new capacity applies on the same connection");
    }
    let seen: serde_json::Value = serde_json::from_str(&get(&client, &url).await.body).unwrap();
    let peer_headers = seen["headers"].as_array().unwrap().len();
    assert!(peer_headers > 0);
    // The removed resource's gauges leave /metrics; the kept one's stay.
    let mode = |id: &str| sidecar.metric(&format!("sluice_sidecar_mode{{resource=\"{id}\",mode=\"standalone\"}}"));
    eventually("the removed resource's series gone", async || mode("old").is_none()).await;
    assert_eq!(mode("r"), Some(1.0));

    // Not YAML: written by hand, as no configuration the kit builds can be.
    sidecar.write_raw_config("listeners: [this is not valid");
    eventually("rejected", async || {
        sidecar.metric("sluice_sidecar_config_reloads_total{result=\"failure\"}") == Some(1.0)
    })
    .await;
    assert_eq!(get(&client, &url).await.status, 200, "the previous configuration stays in force");
    assert!(sidecar.logs().contains("configuration rejected"), "{}", sidecar.logs());
    // The status page says so too, until a good file is applied.
    let rejected = || {
        let status: serde_json::Value = serde_json::from_str(&sidecar.get("/debug/status.json").1).unwrap();
        status["config"]["rejected"]["error"].as_str().map(str::to_owned)
    };
    assert!(rejected().is_some_and(|e| e.contains("listeners")), "{:?}", rejected());
    assert!(sidecar.get("/debug/status").1.contains("last change rejected"));
    sidecar.write_config(&strict);
    eventually("reloaded again", async || rejected().is_none()).await;
}

#[tokio::test]
async fn sigterm_drains_and_releases_leases() {
    let upstream = UpstreamProcess::start(None);
    let server = Server::launch().config(&doorman(100.0, 60, 1, 0)).start();
    let leasing = config(upstream.addr(), Resource::new("jobs"), Rule::charging("jobs")).leasing_from([server.grpc]);
    let mut sidecar = Sidecar::launch(&leasing).args(["--client-id", "pod-a"]).start();
    let addr = sidecar.listen();
    let client = http1();
    get(&client, &format!("http://{addr}/echo")).await;
    let holds = || server.get("/debug/status.json?resource=jobs").1.contains("pod-a");
    eventually("the server holds a lease for pod-a", async || holds()).await;

    // A slow request in flight is allowed to finish; meanwhile the sidecar is not ready and
    // still holds its lease, which goes back once the drain is over.
    let slow = tokio::spawn({
        let client = client.clone();
        async move { get(&client, &format!("http://{addr}/slow?ms=1500")).await.status.as_u16() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    sidecar.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sidecar.get("/ready").0, 503, "draining");
    assert!(holds(), "the lease is kept while draining");
    assert_eq!(slow.await.unwrap(), 200, "drained");
    assert_eq!(sidecar.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(!holds(), "the lease was released");
    let refused = send(
        &client,
        http::Request::get(format!("http://{addr}/echo")).body(Full::default()).unwrap(),
        Duration::from_secs(2),
    );
    assert!(refused.await.is_none(), "no longer listening");
}

#[tokio::test]
async fn a_second_signal_cuts_the_drain_short() {
    let upstream = UpstreamProcess::start(None);
    let config = config(upstream.addr(), Resource::new("r").capacity(100.0), Rule::charging("r"));
    let mut sidecar = Sidecar::launch(&config).args(["--shutdown-grace", "60s"]).start();
    let addr = sidecar.listen();
    let slow = tokio::spawn(async move { get(&http1(), &format!("http://{addr}/slow?ms=20000")).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    sidecar.signal("TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sidecar.get("/ready").0, 503, "still draining the slow request");
    sidecar.signal("INT");
    // The second signal ends the wait of up to a minute.
    assert_eq!(sidecar.wait_exit(Duration::from_secs(10)), Some(0));
    slow.abort();
}

#[test]
fn bad_flags_and_configs_exit_64_with_one_line() {
    for args in [
        &["--worker-threads", "0"][..],
        &["--no-such-flag"],
        &["--config", "/nonexistent/sidecar.yaml"],
        &["--client-id", ""],
        &["--shutdown-grace", "-1s"],
    ] {
        let out = run("sluice-sidecar", args);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim().lines().count(), 1, "{args:?}: {out:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    let config = SidecarConfig::new().listener(Listener::new("a", ([127, 0, 0, 1], 1).into()).upstream("missing"));
    std::fs::write(&path, config.yaml()).unwrap();
    let out = run("sluice-sidecar", &["--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("listeners[0] (a).upstream: no upstream named \"missing\""), "{stderr}");
}
