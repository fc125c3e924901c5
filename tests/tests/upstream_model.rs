//! The capacity model of `sluice-upstream` (`--workers`): `/job` served by a bounded number of
//! workers behind a bounded queue, changed while it runs by `PUT /model`. Only orderings and lower
//! bounds of time are asserted: upper bounds fail on a loaded machine.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use sluice_tests::{
    harness::{binary, run},
    http::{Answer, HttpClient, get, http1, send},
    upstream::{SHED_HEADER, UpstreamProcess},
    wait::eventually,
};

fn start(args: &[&str]) -> UpstreamProcess {
    UpstreamProcess::launch(&binary("sluice-upstream"), args).unwrap_or_else(|e| panic!("{e}"))
}

/// Sends `n` `GET /job` at once; each answer's status and how long it took.
fn work(client: &HttpClient, addr: SocketAddr, n: usize) -> Vec<tokio::task::JoinHandle<(u16, Duration)>> {
    (0..n)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let answer = get(&client, &format!("http://{addr}/job")).await;
                (answer.status.as_u16(), sent.elapsed())
            })
        })
        .collect()
}

async fn put(client: &HttpClient, addr: SocketAddr, query: &str) -> Answer {
    let request = http::Request::put(format!("http://{addr}/model?{query}")).body(Full::<Bytes>::default()).unwrap();
    send(client, request, Duration::from_secs(10)).await.expect("an answer to PUT /model")
}

async fn model(client: &HttpClient, addr: SocketAddr) -> serde_json::Value {
    let answer = get(client, &format!("http://{addr}/model")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).expect("JSON")
}

/// Waits until the model holds `in_flight` requests at its workers and `waiting` in its queue.
async fn wait_for(client: &HttpClient, addr: SocketAddr, in_flight: u64, waiting: u64) {
    eventually(format!("{in_flight} in flight, {waiting} waiting"), async || {
        let now = model(client, addr).await;
        now["in_flight"] == in_flight && now["waiting"] == waiting
    })
    .await;
}

#[tokio::test]
async fn workers_bound_the_requests_served_at_once() {
    let upstream = start(&["--workers", "2", "--service-time", "100ms"]);
    let client = http1();
    let mut took = Vec::new();
    for request in work(&client, upstream.addr(), 4) {
        let (status, elapsed) = request.await.unwrap();
        assert_eq!(status, 200);
        took.push(elapsed);
    }
    took.sort();
    assert!(took[0] >= Duration::from_millis(100), "no request is served faster than the service time: {took:?}");
    // Two workers serve four requests in two rounds: the last waited for one in the queue.
    assert!(took[3] >= Duration::from_millis(200), "the last of 4 requests on 2 workers: {took:?}");
}

#[tokio::test]
async fn put_changes_the_workers_and_the_service_time_while_it_runs() {
    let upstream = start(&["--workers", "2", "--service-time", "500ms"]);
    let (client, addr) = (http1(), upstream.addr());

    let answer = put(&client, addr, "workers=4").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let settings: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!((settings["workers"].as_u64(), settings["service_time"].as_str()), (Some(4), Some("500ms")));
    let more = work(&client, addr, 6);
    wait_for(&client, addr, 4, 2).await;

    // Cut to one worker while four are busy: the four finish, then the other two go one by one,
    // which without the cut would have been served together.
    let answer = put(&client, addr, "workers=1").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let mut took = Vec::new();
    for request in more {
        let (status, elapsed) = request.await.unwrap();
        assert_eq!(status, 200);
        took.push(elapsed);
    }
    took.sort();
    assert!(took[5] >= Duration::from_millis(1_400), "the last of 6 after the cut to 1 worker: {took:?}");

    let answer = put(&client, addr, "service_time=300ms").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let settings = model(&client, addr).await;
    assert_eq!((settings["workers"].as_u64(), settings["service_time"].as_str()), (Some(1), Some("300ms")));
    let (status, elapsed) = work(&client, addr, 1).remove(0).await.unwrap();
    assert_eq!(status, 200);
    assert!(elapsed >= Duration::from_millis(300), "the new service time applies: {elapsed:?}");
}

#[tokio::test]
async fn a_full_queue_answers_503_at_once() {
    let upstream = start(&["--workers", "1", "--service-time", "3s", "--queue", "2"]);
    let (client, addr) = (http1(), upstream.addr());
    let queued = work(&client, addr, 3);
    wait_for(&client, addr, 1, 2).await;

    let answer = get(&client, &format!("http://{addr}/job")).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.headers.get(SHED_HEADER).map(|v| v.as_bytes()), Some(&b"queue"[..]));
    // Answered while the worker was still busy with the first of the others.
    assert!(queued.iter().all(|request| !request.is_finished()), "the 503 came before any request was served");
}

#[tokio::test]
async fn a_bad_put_answers_400_and_changes_nothing() {
    let upstream = start(&["--workers", "3", "--service-time", "20ms"]);
    let (client, addr) = (http1(), upstream.addr());
    let before = model(&client, addr).await;
    for query in [
        "workers=0",
        "workers=10001",
        "workers=many",
        "service_time=0ms",
        "service_time=11s",
        "service_time=soon",
        "workers=5&service_time=soon",
        "queue=5",
        "",
    ] {
        let answer = put(&client, addr, query).await;
        assert_eq!(answer.status, 400, "PUT /model?{query}: {}", answer.body);
        assert_eq!(answer.body.lines().count(), 1, "one line for {query:?}: {}", answer.body);
        assert_eq!(model(&client, addr).await, before, "PUT /model?{query} changed nothing");
    }
}

#[tokio::test]
async fn without_workers_there_is_no_model() {
    let upstream = start(&[] as &[&str]);
    let client = http1();
    for path in ["/job", "/model"] {
        assert_eq!(get(&client, &format!("http://{}{path}", upstream.addr())).await.status, 404, "{path}");
    }
}

#[test]
fn bad_model_flags_exit_64_with_one_line() {
    for args in [&["--workers", "0"][..], &["--workers", "2", "--service-time", "20s"], &["--queue", "5"]] {
        let output = run("sluice-upstream", args);
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&output.stderr).lines().count(), 1, "{args:?}");
    }
}
