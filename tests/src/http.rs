//! HTTP clients for the end-to-end tests and the demo: HTTP/1.1 and h2c with hyper-util's pooled
//! client, and one-shot GETs that return everything a test asserts on.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http1() -> HttpClient {
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build_http()
}

pub fn h2c() -> HttpClient {
    Client::builder(TokioExecutor::new()).http2_only(true).build_http()
}

/// A response read to its end.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

/// Sends `request` and reads the whole response; `None` if the connection failed or it took
/// longer than `timeout`.
pub async fn send(client: &HttpClient, request: http::Request<Full<Bytes>>, timeout: Duration) -> Option<Answer> {
    let exchange = async {
        let response = client.request(request).await.ok()?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some(Answer { status: parts.status, headers: parts.headers, body: String::from_utf8_lossy(&body).into_owned() })
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// GET `url` with a 10 s timeout, panicking when no response comes.
pub async fn get(client: &HttpClient, url: &str) -> Answer {
    let request = http::Request::get(url).body(Full::default()).expect("a valid request");
    send(client, request, Duration::from_secs(10)).await.unwrap_or_else(|| panic!("no response to GET {url}"))
}

/// GETs `url` `rate` times a second, open loop (each at its time, whatever is outstanding),
/// until `stop`; returns each request's status (`None`: no answer within 10 s).
pub fn offer(url: &str, rate: f64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Option<u16>>> {
    let url = url.to_owned();
    tokio::spawn(async move {
        let client = http1();
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        let mut sent = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            let client = client.clone();
            let request = http::Request::get(&url).body(Default::default()).expect("a valid request");
            sent.push(tokio::spawn(async move {
                send(&client, request, Duration::from_secs(10)).await.map(|answer| answer.status.as_u16())
            }));
        }
        let mut statuses = Vec::new();
        for request in sent {
            statuses.push(request.await.expect("the request task ends"));
        }
        statuses
    })
}
