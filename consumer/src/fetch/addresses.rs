//! Which addresses an input URL may reach, enforced where the connection is
//! made: the HTTP client resolves names through [`GuardedResolver`], which
//! refuses a name when any address it resolves to is one the policy closes,
//! so the address checked is the address connected (no second lookup a DNS
//! rebinding could change). Literal addresses never reach a resolver; the
//! fetcher checks them with [`refusal`] before it connects.
//!
//! Closed by default: loopback, private (RFC 1918), unique-local, CGNAT,
//! unspecified, multicast and broadcast addresses ("internal"), and
//! link-local ones, where cloud metadata services live; an IPv6 address that
//! carries an IPv4 one (mapped, NAT64, 6to4, IPv4-compatible, Teredo) is
//! judged by that IPv4 address. A host on `--input-allow-hosts`, or the
//! consumer's own S3 endpoint, may be internal; link-local needs
//! `--input-allow-link-local` as well. The fetcher's clients ignore proxy
//! variables, which would carry a request past the resolver.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

/// What an input's host may resolve to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub internal: bool,
    pub link_local: bool,
}

/// Why `ip` is closed under `reach`; None when it is open. An IPv6
/// address that carries an IPv4 one (mapped, NAT64, 6to4, IPv4-compatible,
/// Teredo) is judged by the IPv4 address it reaches.
pub fn refusal(ip: IpAddr, reach: Reach) -> Option<String> {
    let kind = match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4_kind(v4),
            None => v6_kind(v6).or_else(|| carried_v4(v6).and_then(v4_kind)),
        },
    }?;
    let open = if kind == Kind::LinkLocal {
        reach.link_local
    } else {
        reach.internal
    };
    (!open).then(|| {
        let fix = if kind == Kind::LinkLocal {
            "where cloud metadata services live; input_allow_link_local is off"
        } else {
            "list the host in input_allow_hosts to allow it"
        };
        format!("{ip} is a {} address ({fix})", kind.name())
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Loopback,
    Private,
    UniqueLocal,
    Cgnat,
    LinkLocal,
    Unspecified,
    Multicast,
    Broadcast,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Loopback => "loopback",
            Kind::Private => "private (RFC 1918)",
            Kind::UniqueLocal => "unique-local",
            Kind::Cgnat => "CGNAT (100.64.0.0/10)",
            Kind::LinkLocal => "link-local",
            Kind::Unspecified => "unspecified",
            Kind::Multicast => "multicast",
            Kind::Broadcast => "broadcast",
        }
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<Kind> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_loopback() {
        Kind::Loopback
    } else if ip.is_private() {
        Kind::Private
    } else if a == 100 && (64..128).contains(&b) {
        Kind::Cgnat
    } else if ip.is_link_local() {
        Kind::LinkLocal
    } else if a == 0 {
        // 0.0.0.0/8: "this network"; connecting to it reaches this host.
        Kind::Unspecified
    } else if ip.is_multicast() {
        Kind::Multicast
    } else if ip.is_broadcast() {
        Kind::Broadcast
    } else {
        return None;
    })
}

fn v6_kind(ip: Ipv6Addr) -> Option<Kind> {
    let first = ip.segments()[0];
    Some(if ip.is_loopback() {
        Kind::Loopback
    } else if ip.is_unspecified() {
        Kind::Unspecified
    } else if first & 0xffc0 == 0xfe80 {
        Kind::LinkLocal
    } else if ip.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] {
        // AWS's IPv6 metadata service, in the unique-local range.
        Kind::LinkLocal
    } else if first & 0xfe00 == 0xfc00 {
        Kind::UniqueLocal
    } else if ip.is_multicast() {
        Kind::Multicast
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 one reaches through a translation or a tunnel:
/// NAT64's well-known prefix 64:ff9b::/96 and its local-use 64:ff9b:1::/48
/// (RFC 6052, 8215: the last 32 bits), 6to4 2002::/16 (the 32 bits after
/// the prefix), the deprecated IPv4-compatible ::/96 (the last 32 bits;
/// `::` and `::1` are judged as IPv6 before this), and Teredo 2001::/32 (the
/// server's address, after the prefix, and the client's, the last 32 bits
/// inverted: the first closed one of the two counts).
fn carried_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        [0x64, 0xff9b, 1, ..] => Some(v4(s[6], s[7])),
        [0x2002, hi, lo, ..] => Some(v4(hi, lo)),
        [0, 0, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        [0x2001, 0, server_hi, server_lo, _, _, hi, lo] => {
            let server = v4(server_hi, server_lo);
            let client = v4(!hi, !lo);
            Some(if v4_kind(server).is_some() {
                server
            } else {
                client
            })
        }
        _ => None,
    }
}

/// A host name refused by the policy; found in a connect error's sources.
#[derive(Debug)]
pub struct NotAllowed(pub String);

impl std::fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotAllowed {}

/// Resolves a host name to its addresses: the system's resolver, or a
/// test's table.
pub trait Lookup: Send + Sync {
    fn lookup(
        &self,
        host: String,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;
}

/// The system resolver (getaddrinfo, through tokio).
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(
        &self,
        host: String,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// The HTTP client's resolver: every address of a name must be open under
/// `reach`, or the name is refused and nothing is connected.
pub struct GuardedResolver {
    pub lookup: Arc<dyn Lookup>,
    pub reach: Reach,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (lookup, reach) = (Arc::clone(&self.lookup), self.reach);
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = lookup.lookup(host.clone()).await?;
            if let Some(why) = addrs.iter().find_map(|ip| refusal(*ip, reach)) {
                let err: Box<dyn std::error::Error + Send + Sync> =
                    Box::new(NotAllowed(format!("host {host} resolves to {why}")));
                return Err(err);
            }
            let addrs: reqwest::dns::Addrs =
                Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const CLOSED: Reach = Reach {
        internal: false,
        link_local: false,
    };

    fn refused(ip: &str, reach: Reach) -> Option<String> {
        refusal(ip.parse().unwrap(), reach)
    }

    #[test]
    fn internal_and_link_local_addresses_are_closed_by_default() {
        for (ip, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("::1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.254", "private"),
            ("192.168.1.1", "private"),
            ("fd12:3456::1", "unique-local"),
            ("fc00::1", "unique-local"),
            ("100.64.0.1", "CGNAT"),
            ("100.127.255.254", "CGNAT"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("fd00:ec2::254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("::", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("ff02::1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            // IPv4 carried in IPv6: NAT64, 6to4, IPv4-compatible, Teredo.
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("64:ff9b:1::c0a8:101", "private"),
            ("2002:7f00:1::", "loopback"),
            ("2002:a9fe:a9fe::1", "link-local"),
            ("::127.0.0.1", "loopback"),
            ("::169.254.169.254", "link-local"),
            ("::10.0.0.1", "private"),
            ("2001:0:7f00:1::", "loopback"),
            ("2001:0:5db8:3a3a:0:0:80ff:fffe", "loopback"),
        ] {
            let why = refused(ip, CLOSED).unwrap_or_else(|| panic!("{ip} is open"));
            assert!(why.contains(kind), "{ip}: {why}");
        }
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            // The same translations of a public address stay open.
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
            "::93.184.216.34",
        ] {
            assert_eq!(refused(ip, CLOSED), None, "{ip}");
        }
    }

    #[test]
    fn a_listed_host_may_be_internal_but_link_local_needs_its_own_flag() {
        let listed = Reach {
            internal: true,
            link_local: false,
        };
        assert_eq!(refused("127.0.0.1", listed), None);
        assert_eq!(refused("10.0.0.1", listed), None);
        let why = refused("169.254.169.254", listed).unwrap();
        assert!(why.contains("input_allow_link_local is off"), "{why}");
        let everything = Reach {
            internal: true,
            link_local: true,
        };
        assert_eq!(refused("169.254.169.254", everything), None);
        // The flag alone opens link-local, not the rest.
        let only_link_local = Reach {
            internal: false,
            link_local: true,
        };
        assert_eq!(refused("fe80::1", only_link_local), None);
        assert!(
            refused("127.0.0.1", only_link_local)
                .unwrap()
                .contains("input_allow_hosts")
        );
    }
}
