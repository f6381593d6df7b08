//! The system interfaces against the real kernel, in namespaces of their
//! own: namespaces and veths, raw packet sockets, rtnetlink (links,
//! addresses, neighbour resolution, veth peer NAPI). These need root, so
//! they live here rather than in the library's unit tests.

use std::{
    future::Future,
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use rocev2_common::bth::{opcode, Bth};
use rocev2_tests::require_root;
use rocev2_user::{
    sys::netlink::{ensure_veth_peer_napi, poke_with_datagram, Neighbour, Netlink, PeerNapi, NEIGHBOUR_POLL},
    sys::netns::{self, in_netns, spawn_in_netns, unique_name, veth_between, Netns},
    sys::rawsock::PacketSocket,
    tools::packet::{build_roce_frame, parse_roce, RoceFrameSpec},
};

fn netns_list() -> String {
    netns::ip(&["netns", "list"]).unwrap()
}

/// The calling thread's ifindex of `name` (0: no such interface here).
fn ifindex(name: &str) -> u32 {
    rocev2_user::sys::ifindex(name).unwrap_or(0)
}

// ---- namespaces and veths

#[test]
fn veth_links_two_namespaces_and_drop_removes_them() {
    require_root();
    let a = Netns::create(&unique_name("nta")).unwrap();
    let b = Netns::create(&unique_name("ntb")).unwrap();
    let names = (a.name().to_owned(), b.name().to_owned());
    let (a_if, b_if) = (unique_name("ea"), unique_name("eb"));
    veth_between(
        &a,
        &a_if,
        [2, 0, 0, 0, 0xA, 1],
        &["198.51.100.1/24", "fd00:51::1/64"],
        &b,
        &b_if,
        [2, 0, 0, 0, 0xB, 2],
        &["198.51.100.2/24"],
    )
    .unwrap();

    let link = a.exec(&["ip", "-o", "link", "show", &a_if]).unwrap();
    assert!(link.contains("02:00:00:00:0a:01"), "{link}");
    assert!(link.contains("state UP") || link.contains(",UP"), "{link}");
    let addrs = netns::ip(&["-n", a.name(), "-o", "addr", "show", "dev", &a_if]).unwrap();
    assert!(addrs.contains("198.51.100.1/24") && addrs.contains("fd00:51::1/64"), "{addrs}");
    let peer = netns::ip(&["-n", b.name(), "-o", "link", "show", &b_if]).unwrap();
    assert!(peer.contains("02:00:00:00:0b:02"), "{peer}");

    // Each thread sees only its own namespace's interfaces.
    let b_if2 = b_if.clone();
    let seen = in_netns(b.name(), move || Ok(ifindex(&b_if2))).unwrap();
    assert_ne!(seen, 0);
    assert_eq!(ifindex(&b_if), 0, "calling thread must stay in its namespace");

    let list = netns_list();
    assert!(list.contains(&names.0) && list.contains(&names.1), "{list}");
    drop(a);
    drop(b);
    let list = netns_list();
    assert!(!list.contains(&names.0) && !list.contains(&names.1), "{list}");
}

#[test]
fn namespace_is_removed_when_a_test_panics() {
    require_root();
    let name = unique_name("ntp");
    let n2 = name.clone();
    let result = std::panic::catch_unwind(move || {
        let _ns = Netns::create(&n2).unwrap();
        panic!("test failure inside the namespace's scope");
    });
    assert!(result.is_err());
    assert!(!netns_list().contains(&name));
}

#[test]
fn namespace_errors_say_what_failed() {
    require_root();
    let err = in_netns("no-such-netns-xyz", || Ok(())).unwrap_err();
    assert!(format!("{err:#}").contains("no-such-netns-xyz"), "{err:#}");

    let ns = Netns::create(&unique_name("nte")).unwrap();
    let err = ns.exec(&["ip", "link", "show", "nosuchdev0"]).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("nosuchdev0") && msg.contains("does not exist"), "{msg}");

    let err = Netns::create(ns.name()).unwrap_err();
    assert!(format!("{err:#}").contains(ns.name()), "{err:#}");
    // The failed duplicate create must not have deleted the original.
    assert!(netns_list().contains(ns.name()));
}

#[test]
fn in_netns_passes_on_panics_and_results() {
    require_root();
    let ns = Netns::create(&unique_name("ntr")).unwrap();
    assert_eq!(in_netns(ns.name(), || Ok(41 + 1)).unwrap(), 42);
    let err = in_netns(ns.name(), || -> anyhow::Result<()> { anyhow::bail!("inner failure") }).unwrap_err();
    assert_eq!(err.to_string(), "inner failure");
    let name = ns.name().to_owned();
    let panicked = std::panic::catch_unwind(move || in_netns(&name, || -> anyhow::Result<()> { panic!("boom") }));
    assert!(panicked.is_err());
}

// ---- raw packet sockets

const MAC_A: [u8; 6] = [0x02, 0xAA, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [0x02, 0xBB, 0, 0, 0, 2];

fn frames(n: u32) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            build_roce_frame(&RoceFrameSpec {
                src_mac: MAC_A,
                dst_mac: MAC_B,
                // Every third frame tagged: the tag must survive the
                // kernel's VLAN stripping on the receive side.
                vlan: (i % 3 == 0).then_some(100 + i as u16),
                src_ip: Ipv4Addr::new(192, 0, 2, 1).into(),
                dst_ip: Ipv4Addr::new(192, 0, 2, 2).into(),
                ttl: 64,
                dscp: 26,
                ecn: 2,
                src_port: 0xC000 | i as u16,
                bth: Bth::new(opcode::WRITE_MIDDLE, 0x100 + i, i),
                payload_len: 1 + (i as usize * 37) % 1400,
            })
        })
        .collect()
}

#[test]
fn hundred_frames_cross_a_veth_byte_identical() {
    require_root();
    let a = Netns::create(&unique_name("rsa")).unwrap();
    let b = Netns::create(&unique_name("rsb")).unwrap();
    let (a_if, b_if) = (unique_name("va"), unique_name("vb"));
    veth_between(&a, &a_if, MAC_A, &[], &b, &b_if, MAC_B, &[]).unwrap();
    let sent = frames(100);

    // Open the receiver before sending so nothing is missed; it reports
    // readiness through a channel.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let expect = sent.len();
    let b_if2 = b_if.clone();
    let receiver = spawn_in_netns(b.name(), move || {
        let sock = PacketSocket::open(&b_if2)?;
        ready_tx.send(())?;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 2048];
        while got.len() < expect {
            match sock.recv(&mut buf, Duration::from_secs(5))? {
                // Skip the kernel's own chatter (IPv6 router/neighbour
                // solicitations) that a fresh link sends.
                Some(n) if parse_roce(&buf[..n]).is_ok() => got.push(buf[..n].to_vec()),
                Some(_) => {}
                None => break,
            }
        }
        Ok(got)
    })
    .unwrap();
    ready_rx.recv_timeout(Duration::from_secs(5)).expect("receiver ready");

    let to_send = sent.clone();
    in_netns(a.name(), move || {
        let sock = PacketSocket::open(&a_if)?;
        assert_ne!(sock.ifindex(), 0);
        for f in &to_send {
            sock.send(f)?;
        }
        // Our own frames must not come back to us as received.
        let mut buf = vec![0u8; 2048];
        while let Some(n) = sock.recv(&mut buf, Duration::from_millis(200))? {
            assert!(parse_roce(&buf[..n]).is_err(), "own transmitted frame was received");
        }
        Ok(())
    })
    .unwrap();

    let got = receiver.join().expect("receiver thread").unwrap();
    assert_eq!(got.len(), sent.len(), "frames lost");
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(g, s, "frame {i} differs");
    }

    let names = [a.name().to_owned(), b.name().to_owned()];
    drop((a, b));
    let list = netns_list();
    assert!(names.iter().all(|n| !list.contains(n.as_str())), "{list}");
}

// ---- rtnetlink

const NL_MAC_A: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0x00, 0x01];
const NL_MAC_B: [u8; 6] = [0x02, 0x00, 0x00, 0xbb, 0x00, 0x02];

/// Two fresh namespaces joined by a veth (`va` in `a`, `vb` in `b`),
/// removed on drop, also when the test panics. Addresses: 10.`net`.0.1/24
/// and fd00:`net`::1/64 on `va`, .2 / ::2 on `vb`.
struct VethPair {
    a: Netns,
    b: Netns,
}

impl VethPair {
    fn new(tag: &str, net: u8) -> Self {
        require_root();
        let a = Netns::create(&unique_name(&format!("nl{tag}a"))).unwrap();
        let b = Netns::create(&unique_name(&format!("nl{tag}b"))).unwrap();
        let (a4, a6, b4, b6) = (
            format!("10.{net}.0.1/24"),
            format!("fd00:{net}::1/64"),
            format!("10.{net}.0.2/24"),
            format!("fd00:{net}::2/64"),
        );
        veth_between(&a, "va", NL_MAC_A, &[&a4, &a6], &b, "vb", NL_MAC_B, &[&b4, &b6]).unwrap();
        Self { a, b }
    }
}

/// Runs `f` on a current-thread tokio runtime in a thread inside `ns`.
fn in_netns_async<F, Fut, T>(ns: &Netns, f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    in_netns(ns.name(), move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(runtime.block_on(f()))
    })
    .unwrap()
}

#[test]
fn netlink_link_finds_veth_and_its_peer() {
    let pair = VethPair::new("l", 201);
    let vb = in_netns_async(&pair.b, || async { Netlink::new()?.link("vb").await }).expect("link vb");
    let (va, missing) = in_netns_async(&pair.a, || async {
        let netlink = Netlink::new().expect("Netlink::new");
        (netlink.link("va").await, netlink.link("nosuchdev0").await)
    });
    let va = va.expect("link va");
    assert_eq!(va.name, "va");
    assert_eq!(va.mac, NL_MAC_A);
    assert!(va.up);
    assert_eq!(va.kind.as_deref(), Some("veth"));
    let peer = va.veth_peer.expect("veth peer");
    assert_eq!(peer.ifindex, vb.ifindex);
    assert!(peer.netnsid.is_some(), "peer in another namespace must carry an nsid");
    assert_eq!(vb.mac, NL_MAC_B);
    let missing = missing.expect_err("nosuchdev0 must not exist");
    assert_eq!(missing.to_string(), "no interface named nosuchdev0");
}

#[test]
fn netlink_local_addresses_lists_configured_addresses() {
    let pair = VethPair::new("a", 202);
    let addresses = in_netns_async(&pair.a, || async { Netlink::new()?.local_addresses().await }).expect("addresses");
    assert!(addresses.contains(&IpAddr::V4(Ipv4Addr::new(10, 202, 0, 1))), "{addresses:?}");
    assert!(addresses.contains(&"fd00:202::1".parse().unwrap()), "{addresses:?}");
    assert!(!addresses.contains(&IpAddr::V4(Ipv4Addr::new(10, 202, 0, 2))), "{addresses:?}");
}

#[test]
fn netlink_resolve_neighbour_from_empty_table() {
    let pair = VethPair::new("n", 203);
    in_netns_async(&pair.a, || async {
        let netlink = Netlink::new().expect("Netlink::new");
        let va = netlink.link("va").await.expect("link va");
        let peer_v4: IpAddr = "10.203.0.2".parse().unwrap();
        let peer_v6: IpAddr = "fd00:203::2".parse().unwrap();

        assert_eq!(netlink.neighbour(va.ifindex, peer_v4).await.unwrap(), None);
        let timeout = Duration::from_secs(3);
        let mac = netlink.resolve_neighbour(va.ifindex, peer_v4, timeout).await.expect("ARP");
        assert_eq!(mac, NL_MAC_B);
        let mac = netlink.resolve_neighbour(va.ifindex, peer_v6, timeout).await.expect("NDP");
        assert_eq!(mac, NL_MAC_B);
        let refreshed = netlink.refresh_neighbour(va.ifindex, peer_v4).await.expect("refresh");
        assert_eq!(refreshed, Some(NL_MAC_B));

        // Nobody has .99: a clear error, on time.
        let started = Instant::now();
        let error = netlink
            .resolve_neighbour(va.ifindex, "10.203.0.99".parse().unwrap(), Duration::from_secs(1))
            .await
            .expect_err("10.203.0.99 must not resolve");
        assert!(started.elapsed() < Duration::from_millis(1500), "took {:?}", started.elapsed());
        assert_eq!(error.to_string(), "neighbour 10.203.0.99 on va did not answer ARP within 1s");
        // A missing entry is created and resolution started, not reported.
        let absent = netlink.refresh_neighbour(va.ifindex, "10.203.0.98".parse().unwrap()).await;
        assert_eq!(absent.expect("refresh of an absent entry"), None);
    });
}

/// Polls the table (no triggering) until `addr` has a usable entry.
async fn wait_for_usable_entry(netlink: &Netlink, ifindex: u32, addr: IpAddr) -> [u8; 6] {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let entry = netlink.neighbour(ifindex, addr).await.expect("neighbour get");
        if let Some(mac) = entry.as_ref().and_then(Neighbour::usable_mac) {
            return mac;
        }
        assert!(Instant::now() < deadline, "{addr} never became usable: {entry:?}");
        tokio::time::sleep(NEIGHBOUR_POLL).await;
    }
}

/// Both trigger mechanisms work on their own on this kernel.
#[test]
fn netlink_ntf_use_and_datagram_each_trigger_resolution() {
    let pair = VethPair::new("t", 205);
    in_netns_async(&pair.a, || async {
        let netlink = Netlink::new().expect("Netlink::new");
        let va = netlink.link("va").await.expect("link va");
        for (addr, via_ntf_use) in
            [("10.205.0.2", true), ("fd00:205::2", true), ("10.205.0.2", false), ("fd00:205::2", false)]
        {
            let addr: IpAddr = addr.parse().unwrap();
            // Runs in this thread's namespace (the child inherits it).
            netns::ip(&["neigh", "flush", "dev", "va"]).unwrap();
            assert_eq!(netlink.neighbour(va.ifindex, addr).await.unwrap(), None);
            if via_ntf_use {
                netlink.use_neighbour(va.ifindex, addr).await.expect("NTF_USE");
            } else {
                poke_with_datagram("va", va.ifindex, addr).expect("datagram");
            }
            assert_eq!(wait_for_usable_entry(&netlink, va.ifindex, addr).await, NL_MAC_B);
        }
    });
}

#[test]
fn netlink_enables_gro_on_peer_in_other_namespace() {
    let pair = VethPair::new("g", 204);
    let gro_of_vb = || {
        let out = pair.b.exec(&["ethtool", "-k", "vb"]).expect("running ethtool");
        out.lines().find(|l| l.starts_with("generic-receive-offload:")).map(str::to_string)
    };
    assert_eq!(gro_of_vb().as_deref(), Some("generic-receive-offload: off"));

    let (first, second, lo) = in_netns_async(&pair.a, || async {
        let netlink = Netlink::new().expect("Netlink::new");
        let va = netlink.link("va").await.expect("link va");
        let lo = netlink.link("lo").await.expect("link lo");
        (ensure_veth_peer_napi(&va), ensure_veth_peer_napi(&va), ensure_veth_peer_napi(&lo))
    });
    assert_eq!(
        first.expect("first call"),
        PeerNapi::EnabledGro { peer_name: "vb".into(), netns: format!("/run/netns/{}", pair.b.name()) }
    );
    assert_eq!(second.expect("second call"), PeerNapi::AlreadyOn);
    assert_eq!(lo.expect("lo"), PeerNapi::NotVeth);
    assert_eq!(gro_of_vb().as_deref(), Some("generic-receive-offload: on"));
}

#[test]
fn netlink_enables_gro_on_peer_in_same_namespace() {
    let pair = VethPair::new("h", 206);
    netns::ip(&["-n", pair.a.name(), "link", "add", "vc", "type", "veth", "peer", "name", "vd"]).unwrap();
    let (vc, result) = in_netns_async(&pair.a, || async {
        let vc = Netlink::new().expect("Netlink::new").link("vc").await.expect("link vc");
        let result = ensure_veth_peer_napi(&vc);
        (vc, result)
    });
    assert_eq!(vc.veth_peer.and_then(|p| p.netnsid), None);
    assert_eq!(
        result.expect("ensure_veth_peer_napi"),
        PeerNapi::EnabledGro { peer_name: "vd".into(), netns: "current network namespace".into() }
    );
}
