//! Sluice's additions to Doorman's messages are optional fields numbered 100 and above, which a
//! parser that knows only Doorman's fields skips: checked against a message declared with
//! Doorman's fields alone.

use prost::Message;
use sluice_proto::{ClientGroup, PriorityBandAggregate, WantsProfile};

/// `PriorityBandAggregate` as Doorman declares it.
#[derive(Clone, PartialEq, Message)]
struct DoormanBand {
    #[prost(int64, required, tag = "1")]
    priority: i64,
    #[prost(int64, required, tag = "2")]
    num_clients: i64,
    #[prost(double, required, tag = "3")]
    wants: f64,
}

#[test]
fn doorman_reads_a_band_with_a_profile_as_the_band_alone() {
    let group = |num_clients, wants| ClientGroup { num_clients, wants };
    let band = PriorityBandAggregate {
        priority: 1,
        num_clients: 3,
        wants: 100.0,
        profile: Some(WantsProfile { group: vec![group(2, 10.0), group(1, 90.0)] }),
    };
    let read = DoormanBand::decode(band.encode_to_vec().as_slice()).unwrap();
    assert_eq!(read, DoormanBand { priority: 1, num_clients: 3, wants: 100.0 });
}

#[test]
fn a_band_from_doorman_has_no_profile() {
    let doorman = DoormanBand { priority: 0, num_clients: 5, wants: 50.0 };
    let read = PriorityBandAggregate::decode(doorman.encode_to_vec().as_slice()).unwrap();
    assert_eq!(read, PriorityBandAggregate { priority: 0, num_clients: 5, wants: 50.0, profile: None });
}
