//! Checks every RPC argument before anything is touched (SPEC §3.9): a bad request gets
//! INVALID_ARGUMENT naming the field, and the ledger never sees it.

use std::collections::HashSet;

use sluice_proto::{
    GetCapacityRequest, GetServerCapacityRequest, Lease, PriorityBandAggregate, ReleaseCapacityRequest, Signals,
};
use tonic::Status;

use smallvec::SmallVec;

use crate::{
    core::{Claim, Holds, Report, Wants},
    defaults::{
        MAX_AMOUNT, MAX_BANDS, MAX_ID_BYTES, MAX_PROFILE_GROUPS, MAX_RESOURCES_PER_REQUEST, MAX_SIGNAL_SECONDS,
        MAX_SUBCLIENTS,
    },
};

/// A validated claim on one resource.
pub type ResourceClaim<'a> = (&'a str, Claim);

pub fn get_capacity(req: &GetCapacityRequest) -> Result<Vec<ResourceClaim<'_>>, Status> {
    id("client_id", &req.client_id)?;
    claims(
        &req.resource,
        |r| &r.resource_id,
        |i, r| {
            amount(&format!("resource[{i}].wants"), r.wants)?;
            let has = reported(&format!("resource[{i}].has"), r.has.as_ref())?;
            let signals = signals(&format!("resource[{i}].signals"), r.signals.as_deref())?;
            Ok(Claim { signals, ..Claim::single(r.priority, r.wants, has) })
        },
    )
}

/// A child server (an intermediate server below this one) claims for all its clients: per
/// priority band, one entry, or one per group of its profile. A resource without bands counts
/// as one subclient wanting nothing.
pub fn get_server_capacity(req: &GetServerCapacityRequest) -> Result<Vec<ResourceClaim<'_>>, Status> {
    id("server_id", &req.server_id)?;
    claims(
        &req.resource,
        |r| &r.resource_id,
        |i, r| {
            if r.wants.len() > MAX_BANDS {
                return Err(invalid(format!(
                    "resource[{i}].wants: at most {MAX_BANDS} priority bands per resource, got {}",
                    r.wants.len()
                )));
            }
            let mut bands = SmallVec::with_capacity(r.wants.len());
            let mut priorities = HashSet::with_capacity(r.wants.len());
            for (j, band) in r.wants.iter().enumerate() {
                amount(&format!("resource[{i}].wants[{j}].wants"), band.wants)?;
                clients(&format!("resource[{i}].wants[{j}].num_clients"), band.num_clients)?;
                if !priorities.insert(band.priority) {
                    return Err(invalid(format!(
                        "resource[{i}].wants[{j}].priority: band {} appears twice",
                        band.priority
                    )));
                }
                groups(&format!("resource[{i}].wants[{j}]"), band, &mut bands)?;
            }
            let has = reported(&format!("resource[{i}].has"), r.has.as_ref())?;
            // A server that leaves out `has` does not know what its clients hold (a new master,
            // still learning).
            let signals = signals(&format!("resource[{i}].signals"), r.signals.as_deref())?;
            let claim = Claim { wants: bands, has, holds: has.map_or(Holds::Unknown, Holds::Reported), signals };
            amount(&format!("resource[{i}].wants"), claim.total_wants())?;
            if claim.wants.is_empty() {
                return Ok(Claim { wants: Claim::single(0, 0.0, None).wants, ..claim });
            }
            Ok(claim)
        },
    )
}

/// Files a band (already checked, `field` its name) as demands: one per group of its profile
/// (`field.profile.group[k]`), which must add up to the band, or the band as one without.
fn groups(field: &str, band: &PriorityBandAggregate, into: &mut SmallVec<[Wants; 1]>) -> Result<(), Status> {
    let wants = |wants, num_clients: i64| Wants { priority: band.priority, wants, subclients: num_clients as f64 };
    let Some(profile) = &band.profile else {
        into.push(wants(band.wants, band.num_clients));
        return Ok(());
    };
    let field = format!("{field}.profile");
    if !(1..=MAX_PROFILE_GROUPS).contains(&profile.group.len()) {
        return Err(invalid(format!(
            "{field}: must have 1 to {MAX_PROFILE_GROUPS} groups, got {}",
            profile.group.len()
        )));
    }
    let (mut num_clients, mut sum) = (0i64, 0.0);
    for (k, group) in profile.group.iter().enumerate() {
        amount(&format!("{field}.group[{k}].wants"), group.wants)?;
        clients(&format!("{field}.group[{k}].num_clients"), group.num_clients)?;
        num_clients = num_clients.saturating_add(group.num_clients);
        sum += group.wants;
    }
    // The sender sums in its own order: allow for the rounding of a few dozen additions.
    if num_clients != band.num_clients || (sum - band.wants).abs() > 1e-9 * band.wants.max(1.0) {
        return Err(invalid(format!(
            "{field}: the groups add up to {num_clients} clients wanting {sum}, the band to {} wanting {}",
            band.num_clients, band.wants
        )));
    }
    into.extend(profile.group.iter().map(|group| wants(group.wants, group.num_clients)));
    Ok(())
}

/// Validates the resource ids of a request, then each resource's claim (`i` is its position).
fn claims<'a, R>(
    resources: &'a [R],
    resource_id: impl Fn(&'a R) -> &'a str,
    claim: impl Fn(usize, &'a R) -> Result<Claim, Status>,
) -> Result<Vec<ResourceClaim<'a>>, Status> {
    let ids = resource_ids(resources.iter().map(&resource_id), "resource", |i| format!("resource[{i}].resource_id"))?;
    resources.iter().zip(ids).enumerate().map(|(i, (r, id))| Ok((id, claim(i, r)?))).collect()
}

/// Doorman's own Go client pads the list it releases at `Close()` with empty ids (so an id may
/// also come twice). Releasing is idempotent, so those are let through and ignored, as Doorman's
/// server does: refused, that client would retry for ever and never close.
/// Returns the ids to release.
pub fn release_capacity(req: &ReleaseCapacityRequest) -> Result<Vec<&str>, Status> {
    id("client_id", &req.client_id)?;
    let ids: Vec<(usize, &str)> =
        req.resource_id.iter().map(String::as_str).enumerate().filter(|(_, id)| !id.is_empty()).collect();
    at_most_per_request("resource_id", ids.len())?;
    ids.into_iter()
        .map(|(i, resource_id)| id(&format!("resource_id[{i}]"), resource_id).map(|()| resource_id))
        .collect()
}

fn at_most_per_request(field: &str, len: usize) -> Result<(), Status> {
    match len > MAX_RESOURCES_PER_REQUEST {
        true => Err(invalid(format!("{field}: at most {MAX_RESOURCES_PER_REQUEST} resources per request, got {len}"))),
        false => Ok(()),
    }
}

/// The resource ids of a request (the list `field`, each id `name(i)`): each a valid id, no
/// repeats, not too many.
fn resource_ids<'a>(
    ids: impl ExactSizeIterator<Item = &'a str>,
    field: &str,
    name: impl Fn(usize) -> String,
) -> Result<Vec<&'a str>, Status> {
    at_most_per_request(field, ids.len())?;
    let mut seen = HashSet::with_capacity(ids.len());
    ids.enumerate()
        .map(|(i, resource_id)| {
            let name = name(i);
            id(&name, resource_id)?;
            if !seen.insert(resource_id) {
                return Err(invalid(format!("{name}: resource {resource_id:?} appears twice")));
            }
            Ok(resource_id)
        })
        .collect()
}

fn id(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(invalid(format!("{field}: must not be empty")));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(invalid(format!("{field}: at most {MAX_ID_BYTES} bytes, got {}", value.len())));
    }
    // Ids end up in log lines, metric labels and the status page.
    if value.chars().any(char::is_control) {
        return Err(invalid(format!("{field}: must not contain control characters, got {value:?}")));
    }
    Ok(())
}

fn amount(field: &str, value: f64) -> Result<(), Status> {
    if (0.0..=MAX_AMOUNT).contains(&value) {
        Ok(())
    } else {
        Err(invalid(format!("{field}: {}", sluice_client::out_of_range(value, ""))))
    }
}

fn clients(field: &str, value: i64) -> Result<(), Status> {
    match (1..=MAX_SUBCLIENTS).contains(&value) {
        true => Ok(()),
        false => Err(invalid(format!("{field}: must be 1 to {MAX_SUBCLIENTS}, got {value}"))),
    }
}

fn reported(field: &str, has: Option<&Lease>) -> Result<Option<f64>, Status> {
    has.map(|lease| amount(&format!("{field}.capacity"), lease.capacity).map(|()| lease.capacity)).transpose()
}

/// A client's signals (proto `Signals`): counts within what a client can have seen, latencies
/// and span within [`MAX_SIGNAL_SECONDS`], the span given.
fn signals(field: &str, signals: Option<&Signals>) -> Result<Option<Box<Report>>, Status> {
    let Some(s) = signals else { return Ok(None) };
    let (completed, errors) = (s.completed.unwrap_or(0), s.errors.unwrap_or(0));
    let count = |name: &str, value: i64| match (0..=MAX_AMOUNT as i64).contains(&value) {
        true => Ok(value as f64),
        false => Err(invalid(format!("{field}.{name}: must be from 0 to {MAX_AMOUNT:e}, got {value}"))),
    };
    let seconds = |name: &str, value: f64, most: f64| match (0.0..=most).contains(&value) {
        true => Ok(value),
        false => Err(invalid(format!("{field}.{name}: must be from 0 to {most} seconds, got {value}"))),
    };
    let (completed, errors) = (count("completed", completed)?, count("errors", errors)?);
    if errors > completed {
        return Err(invalid(format!("{field}.errors: more than completed ({errors} > {completed})")));
    }
    let ok = completed - errors;
    let Some(span) = s.seconds else { return Err(invalid(format!("{field}.seconds: required"))) };
    let span = seconds("seconds", span, MAX_SIGNAL_SECONDS)?;
    Ok(Some(Box::new(Report {
        completed,
        errors,
        latency_sum: seconds("latency_sum", s.latency_sum.unwrap_or(0.0), ok * MAX_SIGNAL_SECONDS)?,
        min_latency: s.min_latency.map(|m| seconds("min_latency", m, MAX_SIGNAL_SECONDS)).transpose()?,
        seconds: span,
    })))
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

#[cfg(test)]
mod tests {
    use sluice_proto::{ClientGroup, ResourceRequest, ServerCapacityResourceRequest, WantsProfile};
    use tonic::Code;

    use super::*;

    fn request(resources: &[(&str, f64)]) -> GetCapacityRequest {
        GetCapacityRequest {
            client_id: "c".into(),
            resource: resources
                .iter()
                .map(|&(id, wants)| ResourceRequest {
                    resource_id: id.into(),
                    priority: 0,
                    has: None,
                    wants,
                    signals: None,
                })
                .collect(),
        }
    }

    fn message(result: Result<impl std::fmt::Debug, Status>) -> String {
        let status = result.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        status.message().to_owned()
    }

    #[test]
    fn signals_are_bounded_and_need_their_span() {
        let with = |signals: Signals| {
            let mut req = request(&[("r", 1.0)]);
            req.resource[0].signals = Some(Box::new(signals));
            get_capacity(&req).map(|claims| claims[0].1.signals.clone())
        };
        let good = Signals {
            completed: Some(10),
            errors: Some(2),
            latency_sum: Some(0.08),
            min_latency: Some(0.005),
            seconds: Some(1.0),
        };
        let report = with(good).unwrap().unwrap();
        assert_eq!((report.completed, report.errors, report.latency_sum), (10.0, 2.0, 0.08));
        assert_eq!(message(with(Signals { seconds: None, ..good })), "resource[0].signals.seconds: required");
        assert_eq!(
            message(with(Signals { errors: Some(11), ..good })),
            "resource[0].signals.errors: more than completed (11 > 10)"
        );
        assert_eq!(
            message(with(Signals { completed: Some(-1), ..good })),
            "resource[0].signals.completed: must be from 0 to 1e15, got -1"
        );
        assert!(
            message(with(Signals { latency_sum: Some(f64::NAN), ..good }))
                .starts_with("resource[0].signals.latency_sum")
        );
        assert!(
            message(with(Signals { min_latency: Some(-1.0), ..good })).starts_with("resource[0].signals.min_latency")
        );
        assert!(message(with(Signals { seconds: Some(1e9), ..good })).starts_with("resource[0].signals.seconds"));
    }

    #[test]
    fn rejects_bad_amounts_and_ids() {
        assert_eq!(
            message(get_capacity(&request(&[("a", f64::NAN)]))),
            "resource[0].wants: must be from 0 to 1e15, got NaN"
        );
        assert_eq!(
            message(get_capacity(&request(&[("a", 1.0), ("b", f64::INFINITY)]))),
            "resource[1].wants: must be from 0 to 1e15, got inf"
        );
        assert_eq!(
            message(get_capacity(&request(&[("a", -1.0)]))),
            "resource[0].wants: must be from 0 to 1e15, got -1"
        );
        assert_eq!(
            message(get_capacity(&request(&[("a", 2e15)]))),
            "resource[0].wants: must be from 0 to 1e15, got 2000000000000000"
        );
        assert_eq!(message(get_capacity(&request(&[("", 1.0)]))), "resource[0].resource_id: must not be empty");
        assert_eq!(
            message(get_capacity(&request(&[("a", 1.0), ("a", 2.0)]))),
            "resource[1].resource_id: resource \"a\" appears twice"
        );
        assert_eq!(
            message(get_capacity(&request(&[("a\0b", 1.0)]))),
            "resource[0].resource_id: must not contain control characters, got \"a\\0b\""
        );
        let mut r = request(&[("a", 1.0)]);
        r.client_id.clear();
        assert_eq!(message(get_capacity(&r)), "client_id: must not be empty");
        r.client_id = "x".repeat(MAX_ID_BYTES + 1);
        assert!(message(get_capacity(&r)).starts_with("client_id: at most"));
        let many: Vec<String> = (0..=MAX_RESOURCES_PER_REQUEST).map(|i| i.to_string()).collect();
        let many: Vec<(&str, f64)> = many.iter().map(|s| (s.as_str(), 1.0)).collect();
        assert_eq!(message(get_capacity(&request(&many))), "resource: at most 10000 resources per request, got 10001");
        assert_eq!(
            get_capacity(&request(&many[..MAX_RESOURCES_PER_REQUEST])).unwrap().len(),
            MAX_RESOURCES_PER_REQUEST
        );
    }

    #[test]
    fn server_requests_keep_their_bands() {
        let band =
            |num_clients, wants| PriorityBandAggregate { priority: num_clients, num_clients, wants, profile: None };
        let mut req = GetServerCapacityRequest {
            server_id: "leaf".into(),
            resource: vec![ServerCapacityResourceRequest {
                resource_id: "r".into(),
                has: None,
                wants: vec![band(3, 10.0), band(2, 5.0)],
                signals: None,
            }],
        };
        let claims = get_server_capacity(&req).unwrap();
        let wants = |priority, wants, subclients| Wants { priority, wants, subclients };
        assert_eq!(claims[0].1.wants.as_slice(), [wants(3, 10.0, 3.0), wants(2, 5.0, 2.0)]);
        req.resource[0].wants.clear();
        assert_eq!(
            get_server_capacity(&req).unwrap()[0].1,
            Claim { holds: Holds::Unknown, ..Claim::single(0, 0.0, None) },
            "no bands: one idle subclient"
        );
        req.resource[0].wants.push(band(2, 5.0));
        req.resource[0].wants.push(band(0, 1.0));
        assert_eq!(
            message(get_server_capacity(&req)),
            "resource[0].wants[1].num_clients: must be 1 to 1000000000, got 0"
        );
        req.resource[0].wants[1] = PriorityBandAggregate { priority: 2, num_clients: 1, wants: 1.0, profile: None };
        assert_eq!(message(get_server_capacity(&req)), "resource[0].wants[1].priority: band 2 appears twice");
        req.resource[0].wants = (1..=MAX_BANDS as i64).map(|p| band(p, 1.0)).collect();
        assert_eq!(get_server_capacity(&req).unwrap()[0].1.wants.len(), MAX_BANDS);
        req.resource[0].wants.push(band(MAX_BANDS as i64 + 1, 1.0));
        assert_eq!(
            message(get_server_capacity(&req)),
            format!("resource[0].wants: at most {MAX_BANDS} priority bands per resource, got {}", MAX_BANDS + 1)
        );
    }

    #[test]
    fn a_profile_becomes_one_demand_per_group_and_must_add_up_to_its_band() {
        let group = |num_clients, wants| ClientGroup { num_clients, wants };
        let with = |groups: Vec<ClientGroup>| GetServerCapacityRequest {
            server_id: "leaf".into(),
            resource: vec![ServerCapacityResourceRequest {
                resource_id: "r".into(),
                has: None,
                wants: vec![PriorityBandAggregate {
                    priority: 1,
                    num_clients: 3,
                    wants: 30.0,
                    profile: Some(WantsProfile { group: groups }),
                }],
                signals: None,
            }],
        };
        let req = with(vec![group(2, 4.0), group(1, 26.0)]);
        let claims = get_server_capacity(&req).unwrap();
        let wants = |wants, subclients| Wants { priority: 1, wants, subclients };
        assert_eq!(claims[0].1.wants.as_slice(), [wants(4.0, 2.0), wants(26.0, 1.0)]);
        assert_eq!(
            message(get_server_capacity(&with(vec![group(2, 4.0), group(2, 26.0)]))),
            "resource[0].wants[0].profile: the groups add up to 4 clients wanting 30, the band to 3 wanting 30"
        );
        assert_eq!(
            message(get_server_capacity(&with(vec![group(2, 4.0), group(1, 25.0)]))),
            "resource[0].wants[0].profile: the groups add up to 3 clients wanting 29, the band to 3 wanting 30"
        );
        assert_eq!(
            message(get_server_capacity(&with(vec![group(3, 30.0), group(0, 0.0)]))),
            "resource[0].wants[0].profile.group[1].num_clients: must be 1 to 1000000000, got 0"
        );
        assert_eq!(
            message(get_server_capacity(&with(vec![group(3, f64::NAN)]))),
            "resource[0].wants[0].profile.group[0].wants: must be from 0 to 1e15, got NaN"
        );
        assert_eq!(
            message(get_server_capacity(&with(Vec::new()))),
            format!("resource[0].wants[0].profile: must have 1 to {MAX_PROFILE_GROUPS} groups, got 0")
        );
        let many = (0..=MAX_PROFILE_GROUPS).map(|_| group(1, 1.0)).collect();
        assert!(message(get_server_capacity(&with(many))).ends_with(&format!("got {}", MAX_PROFILE_GROUPS + 1)));
    }
}
