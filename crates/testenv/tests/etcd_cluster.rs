//! The multi-member etcd of the test environment against Debian's etcd: members die, a new leader
//! is elected, and the dead member comes back.

use std::time::{Duration, Instant};

use berth_testenv::EtcdCluster;

#[test]
fn a_three_member_cluster_elects_a_new_leader_when_the_leader_is_killed_and_takes_it_back() {
    let t = Instant::now();
    let mut cluster = EtcdCluster::start(3);
    eprintln!("3 members healthy after {:?}", t.elapsed());
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    for (i, e) in endpoints.iter().enumerate() {
        assert!(e.starts_with("http://127.0.0.1:"), "{e}");
        assert_eq!(cluster.endpoint(i), e);
    }

    let old = cluster.wait_for_leader(Duration::from_secs(5)).expect("a leader after start");
    assert!((0..3).all(|i| cluster.running(i)));

    let t = Instant::now();
    cluster.kill(old);
    assert!(!cluster.running(old));
    let new = cluster.wait_for_leader(Duration::from_secs(15)).unwrap_or_else(|| {
        panic!(
            "no new leader 15 s after killing member {old}; logs:\n{}",
            (0..3).map(|i| cluster.log(i)).collect::<String>()
        )
    });
    eprintln!("member {old} killed; member {new} leads after {:?}", t.elapsed());
    assert_ne!(new, old);

    let t = Instant::now();
    cluster.restart(old);
    eprintln!("member {old} healthy again after {:?}", t.elapsed());
    assert!(cluster.running(old));
    assert!(cluster.log(old).contains("member-"), "the restarted member logs to its file");
    for i in 0..3 {
        assert_eq!(cluster.leader_seen_by(i), Some(new), "leader as member {i} sees it");
    }
    assert_eq!(cluster.leader(), Some(new));
}
