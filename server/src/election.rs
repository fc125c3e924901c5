//! Master election on etcd v3 (SPEC §3.8).
//!
//! Each replica holds an etcd lease, kept alive, and campaigns on the election key with its
//! advertise address as the value; etcd makes the oldest campaign the leader, and the leader is the
//! master. A replica that waits observes the election, so it can name the master to clients.
//! Losing the lease — etcd unreachable, keep-alives unanswered for a TTL, lease revoked — ends
//! the session: a master steps down at once and forgets its leases, since a replica may take over
//! as soon as etcd lets the lease go. The replica then reconnects and campaigns again, after a
//! backoff.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use sluice_etcd::{
    etcdserverpb::{
        LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest, lease_client::LeaseClient,
    },
    mvccpb::KeyValue,
    v3electionpb::{
        CampaignRequest, LeaderKey, LeaderRequest, LeaderResponse, ResignRequest, election_client::ElectionClient,
    },
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
    time::{Instant, sleep, sleep_until, timeout, timeout_at},
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

use crate::{
    defaults::{ELECTION_RETRY_MAX, ELECTION_RETRY_MIN, ETCD_REQUEST_TIMEOUT},
    etcd::{Connection, Etcd, Service},
    metrics,
    state::{self, Role, State},
};

type Leases = LeaseClient<Service>;

/// What a replica needs to take part in an election.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The etcd key prefix the replicas campaign on.
    pub key: String,
    /// Seconds.
    pub lease_ttl: i64,
    /// What this replica publishes when it is the master: its advertise address.
    pub address: String,
}

/// The running election task.
pub struct Election {
    resign: watch::Sender<bool>,
    task: JoinHandle<()>,
    state: Arc<State>,
}

impl Election {
    /// Starts campaigning on `etcd`; the task sets `state`'s role from then on.
    pub fn spawn(settings: Settings, etcd: Arc<Etcd>, state: Arc<State>) -> Election {
        let (resign, resigned) = watch::channel(false);
        let candidate = Candidate { settings, etcd, state: state.clone(), last_lease: None };
        Election { resign, task: tokio::spawn(candidate.run(resigned)), state }
    }

    /// Gives up mastership, if held, and stops campaigning, so that a replica takes over without
    /// waiting for the lease to expire. For shutdown.
    pub async fn resign(self) {
        let _ = self.resign.send(true);
        let mut task = self.task;
        // Resigning takes two etcd requests (a refused token adds a quick round trip or two).
        if timeout(2 * ETCD_REQUEST_TIMEOUT, &mut task).await.is_err() {
            task.abort();
        }
        // Even if the task could not finish, this server grants nothing more.
        self.state.follow(None, state::now());
    }
}

/// One replica's side of the election, across etcd sessions.
struct Candidate {
    settings: Settings,
    etcd: Arc<Etcd>,
    state: Arc<State>,
    /// The lease of the session that ended last. It may outlive the session (etcd renews every
    /// lease when it restarts), and its campaign would hold the election until it expired.
    last_lease: Option<i64>,
}

impl Candidate {
    async fn run(mut self, mut resign: watch::Receiver<bool>) {
        let mut backoff = ELECTION_RETRY_MIN;
        loop {
            let started = Instant::now();
            let why = match self.session(&mut resign).await {
                Ok(()) => return,
                Err(why) => why,
            };
            // A session that held its lease for a TTL was healthy: start the backoff over.
            if started.elapsed() >= seconds(self.settings.lease_ttl) {
                backoff = ELECTION_RETRY_MIN;
            }
            if self.state.follow(None, state::now()) {
                metrics::record_election(false);
                tracing::warn!(reason = %why, retry_in = ?backoff, "stepped down: lost the etcd session");
            } else {
                tracing::warn!(reason = %why, retry_in = ?backoff, "etcd election session ended");
            }
            tokio::select! {
                () = sleep(backoff) => {}
                () = resigned(&mut resign) => return,
            }
            backoff = (backoff * 2).min(ELECTION_RETRY_MAX);
        }
    }

    /// One etcd session: a lease, a campaign, and mastership once won. Ends with `Ok` when the
    /// server resigns, with why otherwise.
    async fn session(&mut self, resign: &mut watch::Receiver<bool>) -> Result<(), String> {
        let etcd = self.etcd.connect().await?;
        let leases = Leases::new(etcd.service());
        self.revoke_last_lease(&etcd).await?;
        let settings = &self.settings;
        let asked = Instant::now();
        let grant = LeaseGrantRequest { ttl: settings.lease_ttl, id: 0 };
        let lease = etcd.request("lease grant", |s| async move { Leases::new(s).lease_grant(grant).await }).await?;
        if !lease.error.is_empty() {
            return Err(format!("lease grant: {}", lease.error));
        }
        self.last_lease = Some(lease.id);
        // etcd may grant a longer TTL than asked (it has a floor).
        let keep_alive = keep_alive(leases.clone(), lease.id, seconds(lease.ttl), asked);
        let elections = ElectionClient::new(etcd.service());
        let mut campaigner = elections.clone();
        let campaign = campaigner.campaign(CampaignRequest {
            name: settings.key.clone().into_bytes(),
            lease: lease.id,
            value: settings.address.clone().into_bytes(),
        });
        let mut leaders = Leaders::new(elections.clone(), settings.key.clone());
        tokio::pin!(keep_alive, campaign);
        // This replica's campaign key, once it leads.
        let mut leading: Option<LeaderKey> = None;
        loop {
            tokio::select! {
                why = &mut keep_alive => return Err(why),
                won = &mut campaign, if leading.is_none() => {
                    let won = won.map_err(|e| format!("campaign: {}", e.message()))?.into_inner();
                    leading = Some(won.leader.ok_or("campaign won without a leader key")?);
                    self.state.become_master(state::now());
                    metrics::record_election(true);
                    tracing::info!(key = %settings.key, "won the election: master from now, learning");
                }
                leader = leaders.next() => {
                    let leader = leader?;
                    match &leading {
                        // The campaign's own answer says when it wins.
                        None if leader.lease == lease.id => {}
                        None => self.follow(&leader),
                        // Leaders are reported in order; a newer one means this one's key is gone.
                        Some(mine) if leader.create_revision > mine.rev => {
                            return Err("another replica leads: this replica's campaign key is gone".into());
                        }
                        Some(_) => {}
                    }
                }
                () = resigned(resign) => {
                    // Stop granting before etcd lets a replica win.
                    self.state.follow(None, state::now());
                    if let Some(mine) = leading {
                        let resign = ResignRequest { leader: Some(mine) };
                        let resigned = etcd
                            .request("resign", |s| {
                                let resign = resign.clone();
                                async move { ElectionClient::new(s).resign(resign).await }
                            })
                            .await;
                        if let Err(e) = resigned {
                            tracing::warn!(error = %e, "could not resign; replicas wait for the lease to expire");
                        }
                    }
                    let revoke = LeaseRevokeRequest { id: lease.id };
                    let _ = etcd.request("lease revoke", |s| async move { Leases::new(s).lease_revoke(revoke).await }).await;
                    tracing::info!("left the election");
                    return Ok(());
                }
            }
        }
    }

    /// Revokes the last session's lease unless it is gone: its campaign would otherwise hold
    /// the election until the lease expired.
    async fn revoke_last_lease(&mut self, etcd: &Connection) -> Result<(), String> {
        let Some(id) = self.last_lease else { return Ok(()) };
        let revoke = LeaseRevokeRequest { id };
        match etcd
            .request("revoking the last lease", |s| async move { Leases::new(s).lease_revoke(revoke).await })
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == Some(Code::NotFound) => {}
            Err(e) => return Err(e.message),
        }
        self.last_lease = None;
        Ok(())
    }

    /// Follows a leader etcd reported, naming it to clients.
    fn follow(&self, leader: &KeyValue) {
        let address = std::str::from_utf8(&leader.value).ok().map(str::to_owned);
        let known = matches!(&self.state.standing().role, Role::Follower { leader } if *leader == address);
        if !known {
            tracing::info!(master = address.as_deref().unwrap_or("?"), "following");
            self.state.follow(address, state::now());
        }
    }
}

/// Keeps a lease alive until it cannot, and says why. The session counts as lost a TTL after
/// the last answered keep-alive was *sent*: no later than etcd's own deadline, so this replica
/// has stepped down before another can win, even if etcd never answers again.
async fn keep_alive(mut leases: Leases, id: i64, ttl: Duration, granted: Instant) -> String {
    let sent = Instant::now();
    // The stream's first request renews the lease once; each later one is sent on the channel.
    let (keeper, requests) = mpsc::channel(1);
    let _ = keeper.try_send(LeaseKeepAliveRequest { id });
    let opened = leases.lease_keep_alive(ReceiverStream::new(requests));
    let mut answers: Streaming<LeaseKeepAliveResponse> = match timeout_at(granted + ttl, opened).await {
        Ok(Ok(opened)) => opened.into_inner(),
        Ok(Err(e)) => return format!("lease keep-alive: {}", e.message()),
        Err(_) => return "lease expired before keep-alives started".into(),
    };
    // Opening the stream renewed the lease once.
    let mut expires = sent + ttl;
    // etcd's own clients renew at a third of the TTL: two renewals may fail before it runs out.
    let interval = ttl / 3;
    let mut next = sent + interval;
    let mut unanswered: Option<Instant> = None;
    loop {
        tokio::select! {
            () = sleep_until(expires) => return "no keep-alive answered within the lease TTL".into(),
            () = sleep_until(next) => {
                let now = Instant::now();
                match timeout_at(expires, keeper.send(LeaseKeepAliveRequest { id })).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return "lease keep-alive: the request stream closed".into(),
                    Err(_) => return "no keep-alive answered within the lease TTL".into(),
                }
                unanswered.get_or_insert(now);
                next = now + interval;
            }
            answer = answers.message() => match answer {
                Ok(Some(answer)) if answer.ttl > 0 => {
                    if let Some(sent) = unanswered.take() {
                        expires = sent + seconds(answer.ttl);
                    }
                }
                Ok(Some(_)) => return "the lease expired or was revoked".into(),
                Ok(None) => return "etcd closed the keep-alive stream".into(),
                Err(e) => return format!("lease keep-alive: {}", e.message()),
            },
        }
    }
}

/// The call that starts observing an election.
type ObserveCall = Pin<Box<dyn Future<Output = Result<tonic::Response<Streaming<LeaderResponse>>, Status>> + Send>>;

/// The election's leaders as etcd reports them: the current one first, then each new one.
/// etcd answers the observe call itself only once there is a leader, so waiting for that answer is
/// part of waiting for the next leader.
enum Leaders {
    Calling(ObserveCall),
    Streaming(Box<Streaming<LeaderResponse>>),
}

impl Leaders {
    fn new(mut elections: ElectionClient<Service>, key: String) -> Leaders {
        Leaders::Calling(Box::pin(async move { elections.observe(LeaderRequest { name: key.into_bytes() }).await }))
    }

    /// The next leader's campaign key and value. Cancel-safe: the call and stream persist.
    async fn next(&mut self) -> Result<KeyValue, String> {
        loop {
            match self {
                Leaders::Calling(call) => {
                    let stream = call.await.map_err(|e| format!("observe: {}", e.message()))?.into_inner();
                    *self = Leaders::Streaming(Box::new(stream));
                }
                Leaders::Streaming(stream) => match stream.message().await {
                    Ok(Some(answer)) => {
                        if let Some(leader) = answer.kv {
                            return Ok(leader);
                        }
                    }
                    Ok(None) => return Err("etcd closed the observe stream".into()),
                    Err(e) => return Err(format!("observe: {}", e.message())),
                },
            }
        }
    }
}

/// Resolves once the server resigns (or the handle that would tell it is gone).
async fn resigned(resign: &mut watch::Receiver<bool>) {
    let _ = resign.wait_for(|resigned| *resigned).await;
}

fn seconds(n: i64) -> Duration {
    Duration::from_secs(u64::try_from(n).unwrap_or(0))
}
