//! The guest's TCP connections as its `/proc/net/tcp` and `/proc/net/tcp6` list them (gVisor
//! writes these from its netstack), read before a checkpoint: runsc aborts every connection
//! that leaves the sandbox when it saves one, in the source too (docs/network.md, "Fork and
//! restore"). The text comes from the guest, so it is parsed, bounded and never trusted to be
//! well formed: a line that does not parse is skipped, and at most [`MAX_LINES`] are read.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Lines read from one table; a guest with more sockets than this is judged by these.
pub const MAX_LINES: usize = 8192;

/// One TCP connection of the guest that a checkpoint would abort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The guest's end.
    pub local: SocketAddr,
    /// The far end.
    pub remote: SocketAddr,
    /// The TCP state's name (`ESTABLISHED`, `CLOSE_WAIT`, ...).
    pub state: &'static str,
}

impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} ({})", self.local, self.remote, self.state)
    }
}

/// The state names of `/proc/net/tcp`'s `st` column (Linux's `TCP_*` numbering), or `None`
/// for a state a checkpoint keeps: listening, `TIME_WAIT` and closed sockets hold no
/// connection for runsc to abort.
fn open_state(code: u8) -> Option<&'static str> {
    Some(match code {
        0x01 => "ESTABLISHED",
        0x02 => "SYN_SENT",
        0x03 => "SYN_RECV",
        0x04 => "FIN_WAIT1",
        0x05 => "FIN_WAIT2",
        0x08 => "CLOSE_WAIT",
        0x09 => "LAST_ACK",
        0x0B => "CLOSING",
        _ => return None,
    })
}

/// `HEX:PORT` as the tables write it: an IPv4 address is one 32-bit word and an IPv6 address
/// four, each in the host's (little-endian) byte order.
fn parse_addr(field: &str) -> Option<SocketAddr> {
    let (addr, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_le_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// True for a far end inside the guest itself: loopback (also as an IPv4-mapped IPv6
/// address), or the guest's own address. runsc saves and restores those connections whole.
fn inside(local: &SocketAddr, remote: &SocketAddr) -> bool {
    let unmapped = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let ip = unmapped(remote.ip());
    ip.is_loopback() || ip.is_unspecified() || ip == unmapped(local.ip())
}

/// The connections in one table's text that a checkpoint would abort: open (not listening,
/// not `TIME_WAIT`, not closed) and leaving the guest.
pub fn leaving(table: &str) -> Vec<Connection> {
    let mut found = Vec::new();
    for line in table.lines().skip(1).take(MAX_LINES) {
        let mut fields = line.split_ascii_whitespace();
        // sl, local_address, rem_address, st
        let (Some(_), Some(local), Some(remote), Some(st)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Some(local), Some(remote), Ok(code)) =
            (parse_addr(local), parse_addr(remote), u8::from_str_radix(st, 16))
        else {
            continue;
        };
        if let Some(state) = open_state(code) {
            if !inside(&local, &remote) {
                found.push(Connection { local, remote, state });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

    fn table(lines: &[&str]) -> String {
        let mut t = HEADER.to_string();
        for l in lines {
            t.push_str(l);
            t.push('\n');
        }
        t
    }

    #[test]
    fn an_established_connection_out_of_the_guest_is_found_with_its_addresses() {
        // What gVisor listed for a Python client of 203.0.113.10:8000 in a networked sandbox.
        let t = table(&["   4: 0200C80A:ED8A 0A7100CB:1F40 01 00000000:00000000 00:00000000 00000000     0        0        5 1 0000000000000000 0 0 0 0 -1"]);
        let found = leaving(&t);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].local, "10.200.0.2:60810".parse().unwrap());
        assert_eq!(found[0].remote, "203.0.113.10:8000".parse().unwrap());
        assert_eq!(found[0].to_string(), "10.200.0.2:60810 -> 203.0.113.10:8000 (ESTABLISHED)");
    }

    #[test]
    fn listening_time_wait_closed_and_loopback_sockets_are_kept_by_a_checkpoint() {
        let t = table(&[
            // listening on 0.0.0.0:8080
            "   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1",
            // TIME_WAIT and CLOSE to the outside
            "   1: 0200C80A:ED8A 0A7100CB:1F40 06 00000000:00000000 00:00000000 00000000     0        0 2",
            "   2: 0200C80A:ED8B 0A7100CB:1F40 07 00000000:00000000 00:00000000 00000000     0        0 3",
            // established over loopback, and to the guest's own address
            "   3: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4",
            "   4: 0200C80A:9C41 0200C80A:1F90 01 00000000:00000000 00:00000000 00000000     0        0 5",
        ]);
        assert_eq!(leaving(&t), vec![]);
    }

    #[test]
    fn ipv6_tables_are_read_word_by_word_and_mapped_loopback_is_inside() {
        // [2001:db8::1]:443 from [2001:db8::2]:50000, then ::ffff:127.0.0.1 both ends.
        let t = table(&[
            "   0: B80D0120000000000000000002000000:C350 B80D0120000000000000000001000000:01BB 01 0 0 0",
            "   1: 0000000000000000FFFF00000100007F:C351 0000000000000000FFFF00000100007F:1F90 01 0 0 0",
        ]);
        let found = leaving(&t);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].remote, "[2001:db8::1]:443".parse().unwrap());
        assert_eq!(found[0].local, "[2001:db8::2]:50000".parse().unwrap());
    }

    #[test]
    fn hostile_text_is_skipped_line_by_line_and_bounded() {
        let t = table(&[
            "garbage",
            "   0: 0200C80A 0A7100CB:1F40 01",
            "   0: 0200C80A:ZZZZ 0A7100CB:1F40 01",
            "   0: 0200C80A:ED8A 0A7100CB:1F40 1FF",
            "   0: 0200C80A:ED8A 0A7100CB:1F40",
            "   0: 0200C8é0A:ED8A 0A7100CB:1F40 01",
            "   0: 0200C80A0:ED8A 0A7100CB:1F40 01",
            "   0: 0200C80A:ED8A 0A7100CB:1F40 01",
        ]);
        assert_eq!(leaving(&t).len(), 1);
        let line = "   0: 0200C80A:ED8A 0A7100CB:1F40 01\n";
        let many = HEADER.to_string() + &line.repeat(MAX_LINES + 10);
        assert_eq!(leaving(&many).len(), MAX_LINES);
        assert_eq!(leaving(""), vec![]);
    }
}
