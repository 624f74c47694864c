//! Where a direct printer is: a raw TCP socket (port 9100), a serial line, or a USB
//! line-printer device, written as a URL:
//!
//! | form | example |
//! |---|---|
//! | `tcp://HOST[:PORT]` | `tcp://192.168.0.50:9100` (port 9100 when omitted) |
//! | `serial://PATH[?baud=N&data_bits=7\|8&parity=none\|odd\|even&stop_bits=1\|2&flow=none\|rtscts\|xonxoff]` | `serial:///dev/ttyUSB0?baud=19200&flow=rtscts` (defaults 9600, 8, none, 1, none) |
//! | `usb://PATH` | `usb:///dev/usb/lp0` (the kernel's `usblp`: written only, no status) |

use std::fmt;

/// The serial line's settings (defaults: 9600 baud, 8 data bits, no parity, 1 stop bit, no
/// flow control: what most thermal printers ship with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialSettings {
    /// Device path, e.g. `/dev/ttyUSB0`.
    pub path: String,
    /// Baud rate.
    pub baud: u32,
    /// 5 to 8.
    pub data_bits: u8,
    /// `none`, `odd`, `even`.
    pub parity: String,
    /// 1 or 2.
    pub stop_bits: u8,
    /// `none`, `rtscts` (hardware), `xonxoff` (software).
    pub flow: String,
}

/// A direct printer's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Raw TCP (JetDirect, port 9100).
    Tcp {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
    /// A serial line (RS-232, or USB-serial).
    Serial(SerialSettings),
    /// A USB line-printer device (`/dev/usb/lp0`).
    Usb {
        /// Device path.
        path: String,
    },
}

/// Why an endpoint does not parse (the text says which part).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("printer endpoint `{text}`: {why}")]
pub struct BadEndpoint {
    /// What was given.
    pub text: String,
    /// What is wrong with it.
    pub why: String,
}

impl Endpoint {
    /// Parses the URL forms of the module docs.
    ///
    /// # Errors
    /// An unknown scheme, an empty host or path, a bad port, an unknown or out-of-range
    /// serial setting.
    pub fn parse(text: &str) -> Result<Endpoint, BadEndpoint> {
        let bad = |why: String| BadEndpoint { text: text.to_string(), why };
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("expected SCHEME://…".into()))?;
        match scheme {
            "tcp" => {
                let bracketed = rest.starts_with('[') && rest.ends_with(']');
                let (host, port) = match rest.rsplit_once(':').filter(|_| !bracketed) {
                    Some((h, p)) => {
                        (h, p.parse::<u16>().map_err(|_| bad(format!("port `{p}` is not a number 1-65535")))?)
                    }
                    _ => (rest, 9100),
                };
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() || port == 0 {
                    return Err(bad("expected tcp://HOST[:PORT]".into()));
                }
                Ok(Endpoint::Tcp { host: host.to_string(), port })
            }
            "usb" => {
                if !rest.starts_with('/') {
                    return Err(bad("expected usb:///dev/usb/lpN".into()));
                }
                Ok(Endpoint::Usb { path: rest.to_string() })
            }
            "serial" => {
                let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
                if !path.starts_with('/') {
                    return Err(bad("expected serial:///dev/ttyX[?…]".into()));
                }
                let mut s = SerialSettings {
                    path: path.to_string(),
                    baud: 9600,
                    data_bits: 8,
                    parity: "none".into(),
                    stop_bits: 1,
                    flow: "none".into(),
                };
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').ok_or_else(|| bad(format!("`{pair}` is not KEY=VALUE")))?;
                    let number = |lo: u32, hi: u32| {
                        v.parse::<u32>()
                            .ok()
                            .filter(|n| (lo..=hi).contains(n))
                            .ok_or_else(|| bad(format!("{k} must be {lo} to {hi}")))
                    };
                    match k {
                        "baud" => s.baud = number(50, 4_000_000)?,
                        "data_bits" => s.data_bits = number(5, 8)? as u8,
                        "stop_bits" => s.stop_bits = number(1, 2)? as u8,
                        "parity" if ["none", "odd", "even"].contains(&v) => s.parity = v.into(),
                        "flow" if ["none", "rtscts", "xonxoff"].contains(&v) => s.flow = v.into(),
                        "parity" => return Err(bad("parity must be none, odd or even".into())),
                        "flow" => return Err(bad("flow must be none, rtscts or xonxoff".into())),
                        _ => return Err(bad(format!("unknown setting `{k}`"))),
                    }
                }
                Ok(Endpoint::Serial(s))
            }
            other => Err(bad(format!("unknown scheme `{other}` (tcp, serial, usb)"))),
        }
    }

    /// Its URL scheme, which is also its `printer.transport` name: `tcp`, `serial`, `usb`.
    pub fn scheme(&self) -> &'static str {
        match self {
            Endpoint::Tcp { .. } => "tcp",
            Endpoint::Serial(_) => "serial",
            Endpoint::Usb { .. } => "usb",
        }
    }

    /// Whether the printer can answer `DLE EOT` over this transport (a USB line printer
    /// is written only: a job counts as done once written).
    pub fn answers_status(&self) -> bool {
        !matches!(self, Endpoint::Usb { .. })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Endpoint::Usb { path } => write!(f, "usb://{path}"),
            Endpoint::Serial(s) => write!(
                f,
                "serial://{}?baud={}&data_bits={}&parity={}&stop_bits={}&flow={}",
                s.path, s.baud, s.data_bits, s.parity, s.stop_bits, s.flow
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_parse_with_their_defaults_and_print_back() {
        assert_eq!(Endpoint::parse("tcp://10.0.0.5").unwrap(), Endpoint::Tcp { host: "10.0.0.5".into(), port: 9100 });
        assert_eq!(Endpoint::parse("tcp://printer.local:9101").unwrap().to_string(), "tcp://printer.local:9101");
        assert_eq!(Endpoint::parse("tcp://[::1]:9100").unwrap(), Endpoint::Tcp { host: "::1".into(), port: 9100 });
        assert_eq!(Endpoint::parse("tcp://[::1]:9100").unwrap().to_string(), "tcp://[::1]:9100");
        assert_eq!(Endpoint::parse("tcp://[::1]").unwrap(), Endpoint::Tcp { host: "::1".into(), port: 9100 });
        assert_eq!(Endpoint::parse("usb:///dev/usb/lp0").unwrap(), Endpoint::Usb { path: "/dev/usb/lp0".into() });
        let s = Endpoint::parse("serial:///dev/ttyUSB0?baud=19200&flow=rtscts&parity=even&stop_bits=2&data_bits=7");
        let Endpoint::Serial(s) = s.unwrap() else { panic!("serial") };
        assert_eq!(
            (s.path.as_str(), s.baud, s.data_bits, s.parity.as_str(), s.stop_bits, s.flow.as_str()),
            ("/dev/ttyUSB0", 19200, 7, "even", 2, "rtscts")
        );
        let d = Endpoint::parse("serial:///dev/ttyS0").unwrap();
        assert_eq!(d.to_string(), "serial:///dev/ttyS0?baud=9600&data_bits=8&parity=none&stop_bits=1&flow=none");
        assert_eq!(Endpoint::parse(&d.to_string()).unwrap(), d, "round trip");
        assert!(!Endpoint::parse("usb:///dev/usb/lp0").unwrap().answers_status());
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        for (text, why) in [
            ("lpt://x", "unknown scheme"),
            ("tcp://", "expected tcp://HOST"),
            ("tcp://h:99999", "port"),
            ("tcp://h:0", "expected tcp://HOST"),
            ("serial://dev/tty", "expected serial:///dev"),
            ("serial:///dev/ttyS0?baud=fast", "baud must be"),
            ("serial:///dev/ttyS0?flow=dtr", "flow must be"),
            ("serial:///dev/ttyS0?data_bits=9", "data_bits must be"),
            ("serial:///dev/ttyS0?speed=9600", "unknown setting"),
            ("usb://lp0", "expected usb://"),
            ("192.168.0.5:9100", "SCHEME://"),
        ] {
            let e = Endpoint::parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
