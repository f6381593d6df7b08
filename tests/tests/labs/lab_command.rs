//! `rocev2 lab up|down|status`: a persistent leaf-spine lab in namespaces.
//! Builds a real lab, checks the spines forward in the kernel, runs the real
//! dataplane on the RTSW and pings through it, then takes the lab down.

use std::{
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use rocev2_tests::{require_root, rocev2_bin, LabGuard};
use rocev2_user::{
    control::config::Config,
    sys::netns,
    testbed::ecmp_lab::DataplaneProcess,
    testbed::lab::{self, record_path, LabFamily, LabRouting, LabUpArgs},
};

/// A lab name unique to this process and call: 1-8 of [a-z0-9].
fn lab_name(tag: char) -> String {
    let mut pid = std::process::id();
    let mut base36 = String::new();
    while pid > 0 {
        base36.insert(0, std::char::from_digit(pid % 36, 36).unwrap());
        pid /= 36;
    }
    let name = format!("t{tag}{base36}");
    name[..name.len().min(8)].to_owned()
}

fn up_args(name: &str, hosts: u32, spines: u32, links: u32) -> LabUpArgs {
    LabUpArgs {
        name: name.into(),
        hosts,
        spines,
        links_per_spine: links,
        family: LabFamily::Both,
        hash: rocev2_common::hash::HashMode::Qp,
        hash_version: rocev2_common::hash::HashVersion::V1,
        config_out: None,
        routing: LabRouting::Static,
        racks: None,
        seed: rocev2_user::tools::fabric::SeedPlan::Auto,
        zones: 1,
        aggs: None,
        unnumbered: false,
        rdma: Default::default(),
        links: Default::default(),
        host_bridge: false,
        telemetry: false,
        uplinks: 4,
    }
}

fn netns_list() -> String {
    rocev2_user::sys::netns::ip(&["netns", "list"]).unwrap()
}

/// One ICMP echo from namespace `ns` to `dst` over a raw socket (no `ping`
/// binary needed); three tries, one second each.
fn ping(ns: &str, dst: &str) -> Result<(), String> {
    let dst: IpAddr = dst.parse().unwrap();
    let mut last = String::new();
    for seq in 1..=3u16 {
        match netns::in_netns(ns, move || echo(dst, seq)) {
            Ok(()) => return Ok(()),
            Err(e) => last = format!("{ns} -> {dst}: {e:#}"),
        }
    }
    Err(last)
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn echo(dst: IpAddr, seq: u16) -> anyhow::Result<()> {
    let id = (std::process::id() & 0xffff) as u16;
    let (domain, proto, kind, reply) = match dst {
        IpAddr::V4(_) => (libc::AF_INET, libc::IPPROTO_ICMP, 8u8, 0u8),
        IpAddr::V6(_) => (libc::AF_INET6, libc::IPPROTO_ICMPV6, 128, 129),
    };
    let mut packet = vec![kind, 0, 0, 0];
    packet.extend_from_slice(&id.to_be_bytes());
    packet.extend_from_slice(&seq.to_be_bytes());
    packet.extend_from_slice(b"rocev2 lab ping!");
    if dst.is_ipv4() {
        let c = checksum(&packet);
        packet[2..4].copy_from_slice(&c.to_be_bytes());
    } // The kernel fills in the ICMPv6 checksum on raw sockets.
      // SAFETY: plain socket syscalls on a descriptor owned by this function.
    unsafe {
        let fd = libc::socket(domain, libc::SOCK_RAW, proto);
        anyhow::ensure!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let tv = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const _,
            std::mem::size_of_val(&tv) as u32,
        );
        let sent = match dst {
            IpAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as u16;
                sa.sin_addr.s_addr = u32::from_ne_bytes(a.octets());
                libc::sendto(
                    fd,
                    packet.as_ptr() as *const _,
                    packet.len(),
                    0,
                    &sa as *const _ as *const _,
                    std::mem::size_of_val(&sa) as u32,
                )
            }
            IpAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as u16;
                sa.sin6_addr.s6_addr = a.octets();
                libc::sendto(
                    fd,
                    packet.as_ptr() as *const _,
                    packet.len(),
                    0,
                    &sa as *const _ as *const _,
                    std::mem::size_of_val(&sa) as u32,
                )
            }
        };
        if sent < 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            anyhow::bail!("sendto: {e}");
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            let n = libc::recv(fd, buf.as_mut_ptr() as *mut _, buf.len(), 0);
            if n <= 0 {
                continue;
            }
            let data = &buf[..n as usize];
            // Raw IPv4 sockets see the IP header; IPv6 ones do not.
            let icmp = if dst.is_ipv4() { &data[usize::from(data[0] & 0xf) * 4..] } else { data };
            if icmp.len() >= 8 && icmp[0] == reply && icmp[4..6] == id.to_be_bytes() && icmp[6..8] == seq.to_be_bytes()
            {
                libc::close(fd);
                return Ok(());
            }
        }
        libc::close(fd);
    }
    anyhow::bail!("no echo reply within 1 s")
}

#[test]
fn lab_up_forwards_through_the_dataplane_and_down_removes_everything() {
    require_root();
    let name = lab_name('a');
    let guard = LabGuard(name.clone());
    let printed = lab::up(&up_args(&name, 2, 2, 2)).expect("lab up");
    let namespaces: Vec<String> =
        ["rtsw", "h1", "h2", "s1", "s2", "dst"].iter().map(|s| format!("{name}-{s}")).collect();
    let list = netns_list();
    for ns in &namespaces {
        assert!(list.contains(ns.as_str()), "{ns} missing from `ip netns list`:\n{list}");
    }
    let config_path = Path::new("/run/rocev2").join(format!("lab-{name}")).join("rtsw.toml");
    assert!(
        printed.contains(&format!("rocev2 --netns {name}-rtsw run --config {}", config_path.display())),
        "{printed}"
    );
    assert!(printed.contains(&format!("rocev2 lab down --name {name}")), "{printed}");
    assert!(printed.contains("gen --dev eth0 --dst-mac 02:52:32:10:00:01"), "{printed}");

    let config = Config::load(&config_path).expect("the generated config loads");
    assert_eq!(config.groups[0].name, "spines");
    assert_eq!(config.groups[0].members.len(), 4, "2 spines x 2 links");
    assert_eq!(config.ports.len(), 2 + 4);

    // A second `up` with the same name is refused.
    let err = lab::up(&up_args(&name, 1, 1, 1)).unwrap_err();
    assert!(format!("{err:#}").contains("lab down"), "{err:#}");

    // Spines forward in the kernel; the RTSW does not.
    ping(&format!("{name}-s1"), "10.1.0.1").expect("spine 1 reaches the destination over IPv4");
    ping(&format!("{name}-s2"), "fd01::1").expect("spine 2 reaches the destination over IPv6");
    assert!(ping(&format!("{name}-h1"), "10.1.0.1").is_err(), "without rocev2 the RTSW must not forward");

    let status = lab::status(&name).unwrap();
    for ns in &namespaces {
        assert!(status.contains(ns.as_str()), "status names {ns}:\n{status}");
    }
    assert!(status.contains("10.0.1.1/24") && !status.contains("dataplane attached"), "{status}");

    let dataplane =
        DataplaneProcess::start(&rocev2_bin(), &format!("{name}-rtsw"), &config_path).expect("rocev2 run on the RTSW");
    let pings = [
        ping(&format!("{name}-h1"), "10.1.0.1"),
        ping(&format!("{name}-h2"), "fd01::1"),
        ping(&format!("{name}-h2"), "10.1.0.1"),
    ];
    let status = lab::status(&name).unwrap();
    let output = dataplane.stop().expect("rocev2 run stops cleanly");
    for p in pings {
        p.unwrap_or_else(|e| panic!("ping through the dataplane failed: {e}\nrocev2 run said:\n{output}"));
    }
    assert!(status.contains(&format!("{name}-rtsw: dataplane attached")), "{status}");
    // Both directions went through XDP: forwarded counters on host and uplink ports.
    assert!(output.contains("forwarded"), "{output}");

    let down = lab::down(&name).expect("lab down");
    assert!(down.contains(&format!("removed namespace {name}-rtsw")), "{down}");
    let list = netns_list();
    for ns in &namespaces {
        assert!(!list.contains(ns.as_str()), "{ns} still exists:\n{list}");
    }
    assert!(!config_path.exists() && !config_path.parent().unwrap().exists());
    assert!(!record_path(&name).exists());
    assert!(lab::status(&name).is_err(), "status of a removed lab is an error");
    drop(guard);
}

#[test]
fn lab_down_copes_with_things_already_gone_and_touches_nothing_else() {
    require_root();
    let name = lab_name('b');
    let _guard = LabGuard(name.clone());
    let out = std::env::temp_dir().join(format!("{name}-rtsw.toml"));
    let mut args = up_args(&name, 1, 1, 1);
    args.config_out = Some(out.clone());
    lab::up(&args).expect("lab up");
    assert!(Config::load(&out).is_ok());
    // A namespace with the lab's prefix that the lab did not make.
    let stranger = format!("{name}-x");
    rocev2_user::sys::netns::ip(&["netns", "add", &stranger]).unwrap();
    rocev2_user::sys::netns::ip(&["netns", "del", &format!("{name}-s1")]).unwrap();
    std::fs::remove_file(&out).unwrap();

    let down = lab::down(&name).expect("down works with parts already gone");
    assert!(down.contains(&format!("namespace {name}-s1 was already gone")), "{down}");
    let list = netns_list();
    let still_there = list.contains(stranger.as_str());
    rocev2_user::sys::netns::ip(&["netns", "del", &stranger]).unwrap();
    assert!(still_there, "down removed a namespace it did not make");
    assert!(!list.contains(&format!("{name}-rtsw")) && !list.contains(&format!("{name}-dst")), "{list}");
    assert!(!record_path(&name).exists());
    // /tmp itself was not made by the lab and stays.
    assert!(std::env::temp_dir().exists());
}

/// `lab up --routing bgp`: FRR on the RTSW and both spines; the RTSW's
/// rocev2 learns the destination from BGP (a learned group of every link),
/// hosts ping through it both ways, and `lab down` stops the daemons and
/// removes their state.
#[test]
fn lab_up_with_bgp_routes_through_learned_groups() {
    require_root();
    let name = lab_name('g');
    let _guard = LabGuard(name.clone());
    let mut args = up_args(&name, 2, 2, 2);
    args.routing = LabRouting::Bgp;
    let printed = lab::up(&args).expect("lab up --routing bgp");
    assert!(printed.contains("BGP converged in"), "{printed}");
    let config_path = Path::new("/run/rocev2").join(format!("lab-{name}")).join("rtsw.toml");
    let config = Config::load(&config_path).unwrap();
    assert!(config.routing.kernel_table.is_some() && !config.groups.iter().any(|g| g.name == "spines"));
    let dataplane = DataplaneProcess::start(&rocev2_bin(), &format!("{name}-rtsw"), &config_path).unwrap();
    let pings = [ping(&format!("{name}-h1"), "10.1.0.1"), ping(&format!("{name}-h2"), "fd01::1")];
    let stats = std::process::Command::new(rocev2_bin())
        .args(["stats", "--json", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    let output = dataplane.stop().unwrap();
    for p in pings {
        p.unwrap_or_else(|e| panic!("ping through the BGP-routed dataplane failed: {e}\n{output}"));
    }
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    let learned = stats["groups"].as_array().unwrap().iter().find(|g| g["name"] == "nh:s1l1+s1l2+s2l1+s2l2");
    let learned = learned.unwrap_or_else(|| panic!("no learned group of the four links: {}", stats["groups"]));
    let packets: u64 = learned["members"].as_array().unwrap().iter().map(|m| m["packets"].as_u64().unwrap()).sum();
    assert!(packets > 0, "the pings went over the learned group: {learned}");
    let down = lab::down(&name).unwrap();
    assert!(down.contains("(FRR state)"), "{down}");
    assert!(netns::ip(&["netns", "pids", &format!("{name}-s1")]).is_err(), "spine namespace gone");
}
