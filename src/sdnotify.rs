//! systemd's readiness protocol (`Type=notify`): a datagram to `$NOTIFY_SOCKET`. A no-op when
//! not started by systemd.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to systemd, if it is listening. Errors are logged, never fatal.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let result = UnixDatagram::unbound().and_then(|sock| {
        let bytes = path.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            // an abstract socket name
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)
        } else {
            sock.send_to(state.as_bytes(), &path)
        }
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, state, "could not notify systemd");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn notify_without_systemd_does_nothing() {
        // NOTIFY_SOCKET is not set under cargo test
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            super::notify("READY=1");
        }
    }
}
