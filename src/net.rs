//! Choosing addresses: resolving the store's host, picking the local IP other
//! ranks should connect to, and listening on it.
//!
//! The local IP is the usual trap of multi-host jobs: the host name often
//! resolves to `127.0.1.1` (Debian) or a container bridge, which other hosts
//! cannot reach. So [`choose_local_ip`] asks the kernel which source address
//! it would use to reach the rendezvous store (a connected UDP socket; no
//! packet is sent), unless `RINGWIRE_SOCKET_IFNAME` names an interface.
//!
//! IPv6 link-local addresses (`fe80::/10`) need a scope (interface) id.
//! [`resolve`] accepts `fe80::1%eth0` (or `%2`) and keeps the scope in the
//! `SocketAddrV6`; [`bind_listener`] fills in the scope of a local link-local
//! address by looking up the interface that owns it. [`choose_local_ip`]
//! returns a bare [`IpAddr`], so peers connecting to a link-local address it
//! picked must supply their own scope; it prefers other addresses when an
//! interface has both.

use std::io;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, ToSocketAddrs, UdpSocket,
};

use socket2::{Domain, Socket, Type};
use thiserror::Error;

/// Listen backlog: every rank may connect at once.
const BACKLOG: i32 = 1024;

/// Why an address could not be resolved, chosen or bound.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NetError {
    /// The host name is empty.
    #[error("empty host name; set MASTER_ADDR to the host name or IP address of rank 0")]
    EmptyHost,
    /// Name resolution failed.
    #[error(
        "could not resolve host {host:?} (port {port}): {source}; MASTER_ADDR must be a host \
         name or IP address reachable from this machine, without a port (that goes in \
         MASTER_PORT)"
    )]
    Resolve {
        /// The host as given.
        host: String,
        /// The port.
        port: u16,
        /// The resolver's error.
        source: io::Error,
    },
    /// Name resolution returned nothing.
    #[error("host {host:?} resolved to no addresses; check MASTER_ADDR")]
    NoAddresses {
        /// The host as given.
        host: String,
    },
    /// An IPv6 zone (`%eth0`) names no interface.
    #[error(
        "host {host:?}: {zone:?} is not an interface name or index here; interfaces here: {}",
        available.join(", ")
    )]
    BadZone {
        /// The host as given.
        host: String,
        /// The zone given.
        zone: String,
        /// The interfaces there are.
        available: Vec<String>,
    },
    /// The system's interface list could not be read.
    #[error("could not list this machine's network interfaces: {0}")]
    ListInterfaces(io::Error),
    /// The named interface does not exist (or has no IP address).
    #[error(
        "RINGWIRE_SOCKET_IFNAME={name}: no such interface (or it has no IP address); \
         interfaces here: {}",
        available.join(", ")
    )]
    NoSuchInterface {
        /// The interface named.
        name: String,
        /// The interfaces there are.
        available: Vec<String>,
    },
    /// No local address can reach the store.
    #[error(
        "no route from this machine to the rendezvous store at {} ({last_error}); check \
         MASTER_ADDR, or set RINGWIRE_SOCKET_IFNAME to the interface to use",
        list(master)
    )]
    NoRoute {
        /// The store's addresses.
        master: Vec<SocketAddr>,
        /// The last attempt's error.
        last_error: io::Error,
    },
    /// Listening on the chosen address failed.
    #[error(
        "could not listen on {ip}: {source}; check that {ip} is an address of this machine \
         (RINGWIRE_SOCKET_IFNAME selects the interface)"
    )]
    Bind {
        /// The address chosen.
        ip: IpAddr,
        /// The operating system's error.
        source: io::Error,
    },
}

/// Resolves `host` (a name, an IPv4 literal, or an IPv6 literal with or
/// without brackets and with an optional `%zone`) and `port` to socket
/// addresses, keeping both families in the resolver's order.
pub fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, NetError> {
    let trimmed = host.trim();
    if trimmed.is_empty() {
        return Err(NetError::EmptyHost);
    }
    let bare = trimmed
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(trimmed);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if let Some((ip, zone)) = bare.split_once('%')
        && let Ok(ip) = ip.parse::<Ipv6Addr>() {
            let scope = zone_index(host, zone)?;
            return Ok(vec![SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))]);
        }
    let resolved = (bare, port)
        .to_socket_addrs()
        .map_err(|source| NetError::Resolve {
            host: host.to_owned(),
            port,
            source,
        })?;
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for a in resolved {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    if addrs.is_empty() {
        return Err(NetError::NoAddresses {
            host: host.to_owned(),
        });
    }
    Ok(addrs)
}

/// The IP addresses of the interface called `ifname`, in the system's order.
pub fn interface_addrs(ifname: &str) -> Result<Vec<IpAddr>, NetError> {
    let all = if_addrs::get_if_addrs().map_err(NetError::ListInterfaces)?;
    let ips: Vec<IpAddr> = all
        .iter()
        .filter(|i| i.name == ifname)
        .map(if_addrs::Interface::ip)
        .collect();
    if ips.is_empty() {
        return Err(NetError::NoSuchInterface {
            name: ifname.to_owned(),
            available: names(&all),
        });
    }
    Ok(ips)
}

/// The rate of the interface that holds `ip`, in gigabits per second, as
/// its driver reports it (`/sys/class/net/NAME/speed`, megabits); `None`
/// for loopback and for interfaces that report none.
pub(crate) fn link_gbps(ip: IpAddr) -> Option<f64> {
    let all = if_addrs::get_if_addrs().ok()?;
    let name = &all.iter().find(|i| i.ip() == ip && !i.is_loopback())?.name;
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    let mbps: i64 = text.trim().parse().ok()?;
    (mbps > 0).then(|| mbps as f64 / 1000.0)
}

/// The local IP other ranks should use to reach this one.
///
/// With `ifname`, an address of that interface, of the same family as the
/// first `master` address when it has one (IPv4 if `master` is empty), and
/// not link-local when another address will do. Without, the address the
/// kernel would send from to reach `master` (tried in order); a loopback
/// master gives loopback.
pub fn choose_local_ip(ifname: Option<&str>, master: &[SocketAddr]) -> Result<IpAddr, NetError> {
    if let Some(name) = ifname {
        let ips = interface_addrs(name)?;
        let want_v6 = master.first().is_some_and(SocketAddr::is_ipv6);
        let rank = |ip: &IpAddr| (ip.is_ipv6() != want_v6, is_link_local(ip));
        // `min_by_key` keeps the first of equals, so the system's order wins.
        return ips
            .iter()
            .copied()
            .min_by_key(rank)
            .ok_or_else(|| NetError::NoSuchInterface {
                name: name.to_owned(),
                available: Vec::new(),
            });
    }
    let mut last_error = io::Error::new(io::ErrorKind::InvalidInput, "no store address given");
    for &addr in master {
        match source_ip_toward(addr) {
            Ok(ip) => return Ok(ip),
            Err(e) => last_error = e,
        }
    }
    Err(NetError::NoRoute {
        master: master.to_vec(),
        last_error,
    })
}

/// Listens on an OS-chosen port of exactly `ip` (with `IPV6_V6ONLY` for IPv6)
/// with a large backlog. The caller keeps the listener and publishes its port,
/// so nothing else can take the port in between.
pub fn bind_listener(ip: IpAddr) -> Result<TcpListener, NetError> {
    let bind = || -> io::Result<TcpListener> {
        let addr = match ip {
            IpAddr::V4(v4) => SocketAddr::new(IpAddr::V4(v4), 0),
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, local_scope(v6))),
        };
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.bind(&addr.into())?;
        socket.listen(BACKLOG)?;
        Ok(socket.into())
    };
    bind().map_err(|source| NetError::Bind { ip, source })
}

/// The source address the kernel picks for packets to `dest`.
fn source_ip_toward(dest: SocketAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match dest {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any)?;
    // Port 0 cannot be connected to; the route does not depend on the port.
    let mut dest = dest;
    if dest.port() == 0 {
        dest.set_port(9);
    }
    socket.connect(dest)?;
    let ip = socket.local_addr()?.ip();
    if ip.is_unspecified() {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            "the kernel chose no source address",
        ));
    }
    Ok(ip)
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => is_v6_link_local(v6),
    }
}

fn is_v6_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The scope id to bind `ip` with: the index of the interface that owns it if
/// it is link-local, else 0.
fn local_scope(ip: Ipv6Addr) -> u32 {
    if !is_v6_link_local(&ip) {
        return 0;
    }
    if_addrs::get_if_addrs()
        .ok()
        .and_then(|all| {
            all.into_iter()
                .find(|i| i.ip() == IpAddr::V6(ip))
                .and_then(|i| i.index)
        })
        .unwrap_or(0)
}

/// The interface index for an IPv6 zone: a number, or an interface name.
fn zone_index(host: &str, zone: &str) -> Result<u32, NetError> {
    if let Ok(index) = zone.parse::<u32>() {
        return Ok(index);
    }
    let all = if_addrs::get_if_addrs().map_err(NetError::ListInterfaces)?;
    all.iter()
        .find(|i| i.name == zone)
        .and_then(|i| i.index)
        .ok_or_else(|| NetError::BadZone {
            host: host.to_owned(),
            zone: zone.to_owned(),
            available: names(&all),
        })
}

/// Sorted, deduplicated interface names.
fn names(all: &[if_addrs::Interface]) -> Vec<String> {
    let mut names: Vec<String> = all.iter().map(|i| i.name.clone()).collect();
    names.sort();
    names.dedup();
    names
}

fn list(addrs: &[SocketAddr]) -> String {
    if addrs.is_empty() {
        return "(no address)".to_owned();
    }
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `read`, restarted when a signal interrupts it. Sockets with a timeout
/// report an interruption as EINTR instead of restarting, and threads that
/// drive io_uring are interrupted whenever the kernel queues completion
/// work for them (decision 0007); `read_exact` restarts by itself, single
/// reads (rustls's, ours) need this.
pub(crate) fn read_restarting<R: io::Read + ?Sized>(
    r: &mut R,
    buf: &mut [u8],
) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The Unix address of a peer that published `theirs`, if it runs on this
/// host and network namespace (`mine` is this rank's own publication).
pub(crate) fn same_host_unix_addr(mine: &str, theirs: &[u8]) -> Option<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    let theirs = std::str::from_utf8(theirs).ok()?;
    let (my_host, _) = mine.split_once(' ')?;
    let (host, name) = theirs.split_once(' ')?;
    (host == my_host)
        .then(|| std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv6_loopback_available() -> bool {
        UdpSocket::bind((Ipv6Addr::LOCALHOST, 0)).is_ok()
    }

    #[test]
    fn resolve_v4_literal() {
        assert_eq!(
            resolve("10.1.2.3", 29500).unwrap(),
            ["10.1.2.3:29500".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn resolve_v6_literals_with_and_without_brackets() {
        let want: SocketAddr = "[fd00::1]:80".parse().unwrap();
        assert_eq!(resolve("fd00::1", 80).unwrap(), [want]);
        assert_eq!(resolve("[fd00::1]", 80).unwrap(), [want]);
        assert_eq!(resolve(" [fd00::1] ", 80).unwrap(), [want]);
    }

    #[test]
    fn resolve_v6_zone() {
        let got = resolve("fe80::1%7", 80).unwrap();
        let SocketAddr::V6(v6) = got[0] else {
            panic!("{got:?}");
        };
        assert_eq!(v6.scope_id(), 7);
        let e = resolve("[fe80::1%no-such-if0]", 80).unwrap_err();
        assert!(matches!(e, NetError::BadZone { .. }), "{e}");
    }

    #[test]
    fn resolve_localhost() {
        let got = resolve("localhost", 5).unwrap();
        assert!(!got.is_empty());
        assert!(
            got.iter().all(|a| a.ip().is_loopback() && a.port() == 5),
            "{got:?}"
        );
    }

    #[test]
    fn resolve_errors() {
        assert!(matches!(resolve("  ", 1), Err(NetError::EmptyHost)));
        let e = resolve("no-such-host.invalid", 1).unwrap_err();
        assert!(
            matches!(e, NetError::Resolve { .. } | NetError::NoAddresses { .. }),
            "{e}"
        );
        let msg = e.to_string();
        assert!(msg.contains("no-such-host.invalid"), "{msg}");
    }

    #[test]
    fn choose_toward_v4_loopback() {
        let master = resolve("127.0.0.1", 29500).unwrap();
        assert_eq!(
            choose_local_ip(None, &master).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn choose_toward_v6_loopback() {
        if !ipv6_loopback_available() {
            eprintln!("skipped: ::1 is not available here");
            return;
        }
        let master = resolve("::1", 29500).unwrap();
        assert_eq!(
            choose_local_ip(None, &master).unwrap(),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        );
    }

    #[test]
    fn choose_without_master_is_no_route() {
        let e = choose_local_ip(None, &[]).unwrap_err();
        assert!(matches!(e, NetError::NoRoute { .. }), "{e}");
    }

    #[test]
    fn choose_by_interface_prefers_the_master_family() {
        let Ok(lo_ips) = interface_addrs(loopback_name()) else {
            eprintln!("skipped: no {} interface", loopback_name());
            return;
        };
        let v4: SocketAddr = "10.0.0.1:1".parse().unwrap();
        assert_eq!(
            choose_local_ip(Some(loopback_name()), &[v4]).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        if lo_ips.contains(&IpAddr::V6(Ipv6Addr::LOCALHOST)) {
            let v6: SocketAddr = "[fd00::1]:1".parse().unwrap();
            assert_eq!(
                choose_local_ip(Some(loopback_name()), &[v6]).unwrap(),
                IpAddr::V6(Ipv6Addr::LOCALHOST)
            );
        }
    }

    fn loopback_name() -> &'static str {
        if cfg!(target_os = "linux") {
            "lo"
        } else {
            "lo0"
        }
    }

    #[test]
    fn link_rates_come_from_real_interfaces_only() {
        // Loopback reports none; an address no interface holds, none.
        assert_eq!(link_gbps("127.0.0.1".parse().unwrap()), None);
        assert_eq!(link_gbps("192.0.2.77".parse().unwrap()), None);
        // An interface whose driver reports a speed gives it in Gb/s.
        for i in if_addrs::get_if_addrs().unwrap() {
            let speed = std::fs::read_to_string(format!("/sys/class/net/{}/speed", i.name));
            let mbps = speed.ok().and_then(|s| s.trim().parse::<i64>().ok());
            if let Some(mbps) = mbps.filter(|&m| m > 0 && !i.is_loopback()) {
                assert_eq!(link_gbps(i.ip()), Some(mbps as f64 / 1000.0), "{}", i.name);
            }
        }
    }

    #[test]
    fn loopback_interface_has_127_0_0_1() {
        match interface_addrs(loopback_name()) {
            Ok(ips) => assert!(ips.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{ips:?}"),
            Err(e) => eprintln!("skipped: {e}"),
        }
    }

    #[test]
    fn unknown_interface_lists_the_real_ones() {
        let e = interface_addrs("eth7-does-not-exist").unwrap_err();
        let NetError::NoSuchInterface { name, available } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(name, "eth7-does-not-exist");
        assert!(!available.is_empty());
        let msg = e.to_string();
        assert!(
            msg.starts_with("RINGWIRE_SOCKET_IFNAME=eth7-does-not-exist: no such interface"),
            "{msg}"
        );
        assert!(msg.contains(&available.join(", ")), "{msg}");
        // choose_local_ip passes the error through.
        assert!(matches!(
            choose_local_ip(Some("eth7-does-not-exist"), &[]),
            Err(NetError::NoSuchInterface { .. })
        ));
    }

    #[test]
    fn bind_listener_on_loopback() {
        let l = bind_listener(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let addr = l.local_addr().unwrap();
        assert_eq!(addr.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_ne!(addr.port(), 0);
        // It is a real listener.
        let _c = std::net::TcpStream::connect(addr).unwrap();
        assert!(l.accept().is_ok());
    }

    #[test]
    fn bind_listener_on_v6_loopback() {
        if !ipv6_loopback_available() {
            eprintln!("skipped: ::1 is not available here");
            return;
        }
        let l = bind_listener(IpAddr::V6(Ipv6Addr::LOCALHOST)).unwrap();
        assert_ne!(l.local_addr().unwrap().port(), 0);
    }

    #[test]
    fn bind_listener_on_a_foreign_address_fails_helpfully() {
        // TEST-NET-3: not an address of any real machine.
        let ip: IpAddr = "203.0.113.77".parse().unwrap();
        let e = bind_listener(ip).unwrap_err();
        assert!(matches!(e, NetError::Bind { .. }));
        assert!(e.to_string().contains("203.0.113.77"), "{e}");
    }
}
