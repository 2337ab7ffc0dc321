//! systemd's service protocol (`Type=notify`, `WatchdogSec=`): datagrams to `$NOTIFY_SOCKET`.
//! A no-op when not started by systemd.
//!
//! `READY=1` says start-up is over (configuration valid, admin port bound, loops started);
//! whether the daemon can do its work now is `/readyz`, mirrored in `STATUS=`. `WATCHDOG=1` is
//! sent by the daemon only while its loops beat (see `daemon.rs`), so systemd restarts a daemon
//! whose loops hang even though its process is alive.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends `state` (e.g. `READY=1`) to systemd, if it is listening. Errors are logged, never fatal.
pub fn notify(state: &str) {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        notify_to(&path, state);
    }
}

/// Sends `state` to the notification socket `path` (`@name`: an abstract socket).
fn notify_to(path: &std::ffi::OsStr, state: &str) {
    let result = UnixDatagram::unbound().and_then(|sock| {
        let bytes = path.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            // an abstract socket name
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)
        } else {
            sock.send_to(state.as_bytes(), path)
        }
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, state, "could not notify systemd");
    }
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC` (systemd's advice), when systemd
/// set a watchdog for this process (`$WATCHDOG_PID` absent or ours).
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    parse_watchdog(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// [`watchdog_interval`] over given values: `None` when there is no watchdog, it is meant for
/// another process, or the values do not parse.
pub fn parse_watchdog(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(own_pid)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_without_systemd_does_nothing() {
        // NOTIFY_SOCKET is not set under cargo test
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            notify("READY=1");
        }
    }

    #[test]
    fn the_watchdog_is_pinged_at_half_its_timeout() {
        assert_eq!(
            parse_watchdog(Some("30000000"), None, 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            parse_watchdog(Some("30000000"), Some("7"), 7),
            Some(Duration::from_secs(15))
        );
    }

    #[test]
    fn no_watchdog_when_unset_zero_garbage_or_for_another_process() {
        assert_eq!(parse_watchdog(None, None, 7), None);
        assert_eq!(parse_watchdog(Some("0"), None, 7), None);
        assert_eq!(parse_watchdog(Some("soon"), None, 7), None);
        assert_eq!(parse_watchdog(Some("30000000"), Some("8"), 7), None);
        assert_eq!(parse_watchdog(Some("30000000"), Some("x"), 7), None);
    }

    #[test]
    fn a_notification_reaches_the_socket_as_one_datagram() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).expect("bind");
        notify_to(path.as_os_str(), "WATCHDOG=1");
        let mut buf = [0u8; 32];
        let n = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }
}
