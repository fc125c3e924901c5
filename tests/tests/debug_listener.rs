//! The `/debug/` pages on a listener of their own (`--debug-addr`): the admin listener keeps
//! probes and `/metrics` for the kubelet and Prometheus and refuses the pages, which show every
//! client and its demand; the debug listener serves those pages and nothing else.

use std::net::SocketAddr;

use sluice_tests::{
    config::{Listener, Resource, Rule, SidecarConfig, Upstream},
    harness::{Server, Sidecar, free_port, http_get},
};

fn get(address: SocketAddr, path: &str) -> (u16, String) {
    http_get(address, path).unwrap_or_else(|e| panic!("GET {address}{path}: {e}"))
}

/// The admin listener answers `kept` and refuses the debug pages; the debug listener the other
/// way round.
fn assert_split(admin: SocketAddr, debug: SocketAddr, kept: &[&str]) {
    for path in kept {
        assert_eq!(get(admin, path).0, 200, "admin {path}");
        let (status, body) = get(debug, path);
        assert_eq!((status, body.as_str()), (404, "only the /debug/ pages are served here\n"), "debug {path}");
    }
    for path in ["/debug/status", "/debug/status.json"] {
        let (status, body) = get(admin, path);
        assert_eq!((status, body.as_str()), (404, "the /debug/ pages are served on --debug-addr\n"), "admin {path}");
        assert_eq!(get(debug, path).0, 200, "debug {path}");
    }
}

#[test]
fn the_debug_pages_move_to_their_own_listener_and_leave_probes_and_metrics() {
    let debug: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let server = Server::launch().args(["--debug-addr", &debug.to_string()]).start();
    assert_split(server.admin, debug, &["/metrics", "/healthz", "/readyz"]);

    let debug: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(([127, 0, 0, 1], free_port()).into()))
        .resource(Resource::new("orders").capacity(5.0))
        .rule(Rule::charging("orders"));
    let sidecar = Sidecar::launch(&config).args(["--debug-addr", &debug.to_string()]).start();
    assert_split(sidecar.admin, debug, &["/metrics", "/live", "/ready"]);
}

#[test]
fn without_a_debug_listener_the_admin_listener_serves_every_page() {
    let server = Server::launch().start();
    for path in ["/metrics", "/healthz", "/readyz", "/debug/status", "/debug/status.json"] {
        assert_eq!(get(server.admin, path).0, 200, "{path}");
    }
}
