//! Times as the API server keeps them: whole seconds (a `metav1.Time` is RFC3339 to the
//! second), so what the daemon holds in memory compares equal to what it reads back; and
//! deadlines made of durations the API gives, which never overflow ([`later`]).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// Now, at the precision the API keeps (whole seconds).
pub fn now_seconds() -> Time {
    let t = Timestamp::now();
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// Now as the API writes times in annotations and status strings: RFC3339, UTC, to the second
/// (`2026-12-03T10:00:00Z`).
pub fn now_rfc3339() -> String {
    now_seconds().0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `at + d`, or the farthest time an `Instant` holds past `at` when that overflows (an `Instant`
/// plus a duration from the API panics on overflow; the durations are clamped to a year at the
/// boundary, and this keeps any later sum safe too).
pub fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(super::crd::MAX_API_DURATION))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_has_whole_seconds_so_it_survives_a_round_trip() {
        let t = now_seconds();
        let back: Time =
            serde_json::from_value(serde_json::to_value(&t).expect("encode")).expect("decode");
        assert_eq!(t, back);
        assert_eq!(t.0.subsec_nanosecond(), 0);
    }

    #[test]
    fn the_rfc3339_form_is_the_seconds_form_written_out() {
        let text = now_rfc3339();
        assert_eq!(text.len(), "2026-12-03T10:00:00Z".len(), "{text}");
        assert!(text.ends_with('Z'), "{text}");
        let t: Timestamp = text.parse().expect("RFC3339");
        assert_eq!(t.subsec_nanosecond(), 0);
    }
}
