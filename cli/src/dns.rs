//! The agent's DNS interface (`--dns-listen`, off by default), served with hickory-server
//! from the local replica: no query touches the network.
//!
//! - `<service>.service.<domain>` A and AAAA: the addresses of its passing instances whose
//!   host is an IP address; SRV: one record per passing instance, its port and a target:
//!   the host when it is a name, else `<hex of the IP>.addr.<domain>`, whose address goes
//!   in the additional section (as Consul's DNS does).
//! - `_<service>._tcp.service.<domain>` (RFC 2782): the same as `<service>.service.<domain>`.
//! - `<value>.<key>.meta.<service>.service.<domain>`: the same, for the instances whose
//!   metadata has `key` = `value` (compared without regard to ASCII case).
//! - `<hex>.addr.<domain>` A or AAAA: that address.
//! - `<domain>` SOA: the zone's; every negative answer carries it in its authority section
//!   (RFC 2308), its minimum the `--dns-ttl`, so resolvers cache a miss no longer than a hit.
//! - A service with no live instance (that matches), or any other name in the domain:
//!   NXDOMAIN. A service whose instances are all critical or in maintenance: no records
//!   (NOERROR).
//! - A name outside the domain: REFUSED (this is not a recursive resolver).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use hickory_server::authority::MessageResponseBuilder;
use hickory_server::proto::op::{Header, MessageType, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::ServerFuture;
use tokio::net::{TcpListener, UdpSocket};

/// How many ports a bind to port 0 tries for one free on both TCP and UDP.
const BIND_TRIES: usize = 16;
/// How long a TCP client may take to send its query.
const TCP_TIMEOUT: Duration = Duration::from_secs(5);
/// The most records of one kind in an answer (a UDP answer that does not fit is truncated
/// and the client asks again over TCP).
const MAX_ANSWERS: usize = 256;

/// What `--dns-*` asked for.
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// The zone answered, e.g. `roster.`.
    pub domain: Name,
    /// The TTL of every record.
    pub ttl: Duration,
}

/// Parses `--dns-domain`: a DNS name, made absolute.
///
/// # Errors
/// One line saying what a domain looks like.
pub fn domain(s: &str) -> Result<Name, String> {
    let bad = || format!("DNS domain {s:?} is not a domain name (e.g. roster or roster.example.com)");
    let s = s.trim().trim_end_matches('.');
    if s.is_empty() || s.len() > 200 {
        return Err(bad());
    }
    let mut name = Name::from_ascii(s).map_err(|_| bad())?;
    name.set_fqdn(true);
    Ok(name.to_lowercase())
}

/// The bound sockets, before the node starts (a busy port fails the start, nothing started).
#[derive(Debug)]
pub struct Sockets {
    udp: UdpSocket,
    tcp: TcpListener,
}

impl Sockets {
    /// Binds TCP and UDP on `addr`. With port 0, a port free for both: TCP picks one, and
    /// when UDP cannot have it too (it is another socket's), TCP picks again.
    ///
    /// # Errors
    /// One line naming the address and what to do.
    pub async fn bind(addr: &str) -> Result<Self, crate::Fail> {
        let fail = |e: std::io::Error| {
            crate::Fail::bind(
                &e,
                format!("cannot listen for DNS on {addr}: {e}; pick another --dns-listen address"),
            )
        };
        let mut last = None;
        for _ in 0..BIND_TRIES {
            let tcp = TcpListener::bind(addr).await.map_err(fail)?;
            let at = tcp.local_addr().map_err(fail)?;
            match UdpSocket::bind(at).await {
                Ok(udp) => return Ok(Self { udp, tcp }),
                Err(e) if addr.ends_with(":0") => last = Some(e),
                Err(e) => return Err(fail(e)),
            }
        }
        Err(fail(
            last.unwrap_or_else(|| std::io::Error::other("no free port")),
        ))
    }

    /// Where they listen.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.udp.local_addr().ok()
    }
}

/// Serves DNS from `node` until `stop`.
pub fn spawn(
    node: roster::Node,
    sockets: Sockets,
    config: DnsConfig,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut server = ServerFuture::new(Dns { node, config });
    server.register_socket(sockets.udp);
    server.register_listener(sockets.tcp, TCP_TIMEOUT);
    tokio::spawn(async move {
        stop.cancelled().await;
        if let Err(e) = server.shutdown_gracefully().await {
            tracing::debug!("the DNS server stopped: {e}");
        }
    })
}

struct Dns {
    node: roster::Node,
    config: DnsConfig,
}

/// An answer: its code and records.
#[derive(Debug, Default)]
struct Answer {
    code: Option<ResponseCode>,
    answers: Vec<Record>,
    additionals: Vec<Record>,
}

/// A metadata pair a name asks for: key, value (lowercase).
/// Which of a service's instances a name asks for.
#[derive(Debug, Clone, Copy)]
enum Filter<'a> {
    /// Every one.
    All,
    /// Those whose metadata has this key and value (compared without regard to case).
    Meta(&'a str, &'a str),
    /// Those owned by a live member of this zone.
    Zone(&'a str),
}

/// The SOA's refresh, retry and expire (seconds): nothing transfers this zone, so they are
/// only the usual values, not promises.
const SOA_TIMES: (i32, i32, i32) = (3600, 600, 86400);

impl Answer {
    fn code(code: ResponseCode) -> Self {
        Self {
            code: Some(code),
            ..Self::default()
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Dns {
    async fn handle_request<R: ResponseHandler>(&self, request: &Request, mut response: R) -> ResponseInfo {
        let builder = MessageResponseBuilder::from_message_request(request);
        let mut header = Header::response_from_request(request.header());
        header.set_authoritative(true);
        let answer = if request.op_code() != OpCode::Query || request.message_type() != MessageType::Query {
            Answer::code(ResponseCode::NotImp)
        } else {
            match request.request_info() {
                Ok(info) => self.answer(&Name::from(info.query.name()), info.query.query_type()),
                Err(_) => Answer::code(ResponseCode::FormErr),
            }
        };
        let code = answer.code.unwrap_or(ResponseCode::NoError);
        header.set_response_code(code);
        // A negative answer (no such name, or no records of the type) carries the SOA.
        let negative =
            code == ResponseCode::NXDomain || (code == ResponseCode::NoError && answer.answers.is_empty());
        let soa: Vec<Record> = negative.then(|| self.soa()).into_iter().collect();
        let sent = response
            .send_response(builder.build(
                header,
                answer.answers.iter(),
                &[],
                soa.iter(),
                answer.additionals.iter(),
            ))
            .await;
        sent.unwrap_or_else(|e| {
            tracing::debug!("a DNS answer was not sent: {e}");
            let mut h = Header::new();
            h.set_response_code(ResponseCode::ServFail);
            h.into()
        })
    }
}

impl Dns {
    fn answer(&self, name: &Name, qtype: RecordType) -> Answer {
        // Matched in lower case (the question section goes back as it was asked).
        let domain = &self.config.domain;
        let lower = name.to_lowercase();
        if !domain.zone_of(&lower) {
            return Answer::code(ResponseCode::Refused);
        }
        let labels: Vec<String> = lower
            .iter()
            .take(usize::from(lower.num_labels() - domain.num_labels()))
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect();
        match labels.as_slice() {
            [] => self.apex(qtype),
            [service, kind] if kind == "service" => self.service(name, service, Filter::All, qtype),
            [service, proto, kind] if kind == "service" && proto == "_tcp" => match service.strip_prefix('_')
            {
                Some(service) => self.service(name, service, Filter::All, qtype),
                None => Answer::code(ResponseCode::NXDomain),
            },
            [value, key, meta, service, kind] if meta == "meta" && kind == "service" => {
                self.service(name, service, Filter::Meta(key, value), qtype)
            }
            [zone, z, service, kind] if z == "zone" && kind == "service" => {
                self.service(name, service, Filter::Zone(zone), qtype)
            }
            [hex, kind] if kind == "addr" => match decode_ip(hex) {
                Some(ip) => self.addr(name, ip, qtype),
                None => Answer::code(ResponseCode::NXDomain),
            },
            _ => Answer::code(ResponseCode::NXDomain),
        }
    }

    fn ttl(&self) -> u32 {
        u32::try_from(self.config.ttl.as_secs()).unwrap_or(u32::MAX)
    }

    /// The zone's SOA record.
    fn soa(&self) -> Record {
        let domain = &self.config.domain;
        let at = |label: &str| {
            Name::from_ascii(label)
                .and_then(|n| n.append_domain(domain))
                .unwrap_or_else(|_| domain.clone())
        };
        let (refresh, retry, expire) = SOA_TIMES;
        let soa = SOA::new(at("ns"), at("hostmaster"), 1, refresh, retry, expire, self.ttl());
        Record::from_rdata(domain.clone(), self.ttl(), RData::SOA(soa))
    }

    /// The zone's own name: its SOA; no other records.
    fn apex(&self, qtype: RecordType) -> Answer {
        let mut a = Answer::default();
        if matches!(qtype, RecordType::SOA | RecordType::ANY) {
            a.answers.push(self.soa());
        }
        a
    }

    fn service(&self, name: &Name, service: &str, filter: Filter<'_>, qtype: RecordType) -> Answer {
        // One read: every live instance says whether the name exists; the passing ones answer.
        let live: Vec<roster::Instance> = match roster::registry::ServiceName::new(service) {
            Ok(_) => self.node.lookup_all(service),
            Err(_) => Vec::new(),
        };
        let in_zone = match filter {
            Filter::Zone(zone) => self.nodes_in(zone),
            _ => Vec::new(),
        };
        let live: Vec<roster::Instance> = live
            .into_iter()
            .filter(|i| match filter {
                Filter::All => true,
                Filter::Meta(key, value) => has_meta(i, key, value),
                Filter::Zone(_) => in_zone.contains(&i.node),
            })
            .collect();
        if live.is_empty() {
            return Answer::code(ResponseCode::NXDomain);
        }
        // The agent's own zone first: a client that takes the first answer takes a near one.
        let live = self.node.near_first(live, self.node.zone());
        let passing: Vec<(Host, u16)> = live
            .into_iter()
            .filter(|i| i.status.as_str() == "passing" && self.node.serves(i))
            .filter_map(|i| host_port(&i.address))
            .take(MAX_ANSWERS)
            .collect();
        let mut a = Answer::default();
        for (host, port) in passing {
            match (qtype, &host) {
                (RecordType::A | RecordType::ANY, Host::Ip(IpAddr::V4(ip))) => {
                    a.answers
                        .push(Record::from_rdata(name.clone(), self.ttl(), RData::A(A(*ip))));
                }
                (RecordType::AAAA | RecordType::ANY, Host::Ip(IpAddr::V6(ip))) => {
                    a.answers.push(Record::from_rdata(
                        name.clone(),
                        self.ttl(),
                        RData::AAAA(AAAA(*ip)),
                    ));
                }
                (RecordType::SRV, _) => self.srv(&mut a, name, &host, port),
                _ => {}
            }
        }
        a
    }

    /// The ids of the live members in `zone` (zone names are lowercase, as the question is
    /// matched).
    fn nodes_in(&self, zone: &str) -> Vec<String> {
        let replica = self.node.transport().replica();
        roster::transport::proto::live_members(&replica, wall_ms())
            .into_iter()
            .filter(|m| m.zone == zone)
            .map(|m| m.id.to_string())
            .collect()
    }

    fn srv(&self, a: &mut Answer, name: &Name, host: &Host, port: u16) {
        let target = match host {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => {
                let Ok(n) = Name::from_ascii(format!("{}.addr", encode_ip(*ip)))
                    .and_then(|n| n.append_domain(&self.config.domain))
                else {
                    return;
                };
                a.additionals
                    .push(Record::from_rdata(n.clone(), self.ttl(), ip_rdata(*ip)));
                n
            }
        };
        a.answers.push(Record::from_rdata(
            name.clone(),
            self.ttl(),
            RData::SRV(SRV::new(1, 1, port, target)),
        ));
    }

    fn addr(&self, name: &Name, ip: IpAddr, qtype: RecordType) -> Answer {
        let mut a = Answer::default();
        let fits = matches!(
            (qtype, ip),
            (RecordType::A | RecordType::ANY, IpAddr::V4(_))
                | (RecordType::AAAA | RecordType::ANY, IpAddr::V6(_))
        );
        if fits {
            a.answers
                .push(Record::from_rdata(name.clone(), self.ttl(), ip_rdata(ip)));
        }
        a
    }
}

/// The wall clock in milliseconds since the epoch (0 before it).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `i` has the metadata pair a name asks for.
fn has_meta(i: &roster::Instance, key: &str, value: &str) -> bool {
    i.meta
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case(key) && v.eq_ignore_ascii_case(value))
}

fn ip_rdata(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    }
}

/// An instance's host: an IP address, or a name.
#[derive(Debug, Clone)]
enum Host {
    Ip(IpAddr),
    Name(Name),
}

/// `host:port` or `[v6]:port`, as an address is registered.
fn host_port(address: &str) -> Option<(Host, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some((Host::Ip(ip), port));
    }
    let mut name = Name::from_ascii(host).ok()?;
    name.set_fqdn(true);
    Some((Host::Name(name), port))
}

/// An IP as the hex label of `<hex>.addr.<domain>`: 8 digits for IPv4, 32 for IPv6.
fn encode_ip(ip: IpAddr) -> String {
    let bytes: Vec<u8> = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_ip(hex: &str) -> Option<IpAddr> {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<_>>()?;
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        16 => {
            let octets: [u8; 16] = bytes.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_their_hex_label() {
        for ip in ["10.0.0.7", "::1", "2001:db8::7"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(decode_ip(&encode_ip(ip)), Some(ip));
        }
        assert_eq!(encode_ip("10.0.0.7".parse().unwrap()), "0a000007");
        assert_eq!(decode_ip("0a00007"), None);
        assert_eq!(decode_ip("zz000007"), None);
    }

    #[test]
    fn a_registered_address_is_an_ip_or_a_name_and_a_port() {
        assert!(matches!(host_port("10.0.0.7:80"), Some((Host::Ip(_), 80))));
        assert!(matches!(
            host_port("[::1]:8080"),
            Some((Host::Ip(IpAddr::V6(_)), 8080))
        ));
        assert!(matches!(
            host_port("db.example.com:5432"),
            Some((Host::Name(_), 5432))
        ));
        assert!(host_port("no-port").is_none());
    }

    #[test]
    fn a_domain_is_a_name_made_absolute_and_lowercase() {
        assert_eq!(domain("Roster").unwrap().to_string(), "roster.");
        assert_eq!(
            domain("svc.example.com.").unwrap().to_string(),
            "svc.example.com."
        );
        assert!(domain("").is_err());
        assert!(domain("a..b").is_err());
    }
}
