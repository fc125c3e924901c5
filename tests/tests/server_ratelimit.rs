//! The real `sluice-server` taking its limits' capacities from an envoyproxy/ratelimit file its
//! configuration names, and following that file as it changes, over real gRPC.

use serde_json::Value;
use sluice_proto::{GetCapacityRequest, ResourceRequest, capacity_client::CapacityClient};
use sluice_tests::{
    config::{Algorithm, ServerConfig, Template},
    harness::Server,
    wait::eventually,
};
use tonic::transport::Channel;

/// envoyproxy/ratelimit's file: `demo` at `per_second` a second, each remote address at 600 a
/// minute (10 a second).
fn limits(per_second: u32) -> String {
    format!(
        "domain: edge
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {{unit: second, requests_per_unit: {per_second}}}
  - key: remote_address
    rate_limit: {{unit: minute, requests_per_unit: 600}}
"
    )
}

/// The capacity one client, asking for 100, gets of `resource`.
async fn capacity(client: &mut CapacityClient<Channel>, resource: &str) -> f64 {
    let request = GetCapacityRequest {
        client_id: "a".into(),
        resource: vec![ResourceRequest { resource_id: resource.into(), priority: 0, has: None, wants: 100.0, signals: None }],
    };
    client.get_capacity(request).await.expect("GetCapacity").into_inner().response[0].gets.capacity
}

fn status(server: &Server) -> Value {
    let (code, body) = server.get("/debug/status.json");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status JSON")
}

#[tokio::test]
async fn capacities_come_from_the_rate_limit_file_and_follow_it() {
    // No learning mode, so that a client gets its share at once.
    let algorithm = Algorithm::fair_share(30, 1).learning(0);
    let config = ServerConfig::new()
        .rate_limits(&["ratelimit.yaml"], Some(algorithm.clone()))
        .template(Template::catch_all(1000.0, algorithm));
    let server = Server::launch()
        .config(&config)
        .file("ratelimit.yaml", &limits(20))
        .args(["--config-poll-interval", "100ms"])
        .start();
    let mut client = server.client().await;
    assert_eq!(capacity(&mut client, "edge/generic_key=demo").await, 20.0);
    assert_eq!(capacity(&mut client, "edge/remote_address=/10.0.0.1").await, 10.0, "a keyed limit: each key");
    assert_eq!(capacity(&mut client, "other").await, 100.0, "the catch-all's");
    assert_eq!(status(&server).pointer("/templates/0/identifier_glob"), Some(&Value::from("edge/remote_address=/*")));

    // Only the rate limit file changes: the server follows it.
    let successes = || server.metric("sluice_server_config_reloads_total{result=\"success\"}");
    server.write_file("ratelimit.yaml", &limits(40));
    eventually("the reload of the changed rate limit file", async || successes() == Some(1.0)).await;
    assert_eq!(capacity(&mut client, "edge/generic_key=demo").await, 40.0);

    // An invalid file is rejected, shown, and the capacities in force stay.
    server.write_file("ratelimit.yaml", &limits(50).replace("unit: second", "unit: fortnight"));
    eventually("the rejection", async || {
        server.metric("sluice_server_config_reloads_total{result=\"failure\"}") == Some(1.0)
    })
    .await;
    let rejection = status(&server).pointer("/config/rejected/error").and_then(Value::as_str).map(str::to_owned);
    assert!(
        rejection.as_deref().is_some_and(|e| e.starts_with("rate_limits.files[0] (ratelimit.yaml): descriptors[0]")),
        "shown on the status page: {rejection:?}"
    );
    assert_eq!(capacity(&mut client, "edge/generic_key=demo").await, 40.0, "the capacity in force stays");

    // Fixed: taken, and the rejection cleared.
    server.write_file("ratelimit.yaml", &limits(50));
    eventually("the fix", async || successes() == Some(2.0)).await;
    assert_eq!(capacity(&mut client, "edge/generic_key=demo").await, 50.0);
    assert_eq!(status(&server).pointer("/config/rejected"), Some(&Value::Null));
}
