//! The W3C `traceparent` header a job may carry: parsed in one place for the
//! consumer (which continues the trace) and the CLI (which checks what a
//! user passes).

/// A valid `traceparent`: `<2 hex version>-<32 hex trace id>-<16 hex
/// parent id>-<2 hex flags>`, ids not all zero, version not `ff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent<'a> {
    pub version: u8,
    /// 32 lowercase or uppercase hex digits.
    pub trace_id: &'a str,
    /// 16 hex digits.
    pub parent_id: &'a str,
    pub flags: u8,
}

impl<'a> TraceParent<'a> {
    /// None when malformed (a job then starts a new trace).
    pub fn parse(value: &'a str) -> Option<TraceParent<'a>> {
        let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        let mut parts = value.trim().split('-');
        let (version, trace_id, parent_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if !(hex(version, 2) && hex(trace_id, 32) && hex(parent_id, 16) && hex(flags, 2)) {
            return None;
        }
        let version = u8::from_str_radix(version, 16).ok()?;
        // Version 00 has exactly four fields; later versions may add more.
        if version == 0xff || (version == 0 && parts.next().is_some()) {
            return None;
        }
        if zero(trace_id) || zero(parent_id) {
            return None;
        }
        Some(TraceParent {
            version,
            trace_id,
            parent_id,
            flags: u8::from_str_radix(flags, 16).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn valid_headers_parse_and_the_rest_do_not() {
        let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(
            tp,
            Some(TraceParent {
                version: 0,
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
                parent_id: "00f067aa0ba902b7",
                flags: 1,
            })
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version may carry more fields.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_some()
        );
    }
}
