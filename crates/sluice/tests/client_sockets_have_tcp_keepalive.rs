//! Every client connection gets TCP keepalive after `--tcp-keepalive-secs` of silence, so a
//! client that vanished without closing is noticed even on an idle WebSocket; 0 turns it off.
//!
//! Read from the kernel itself: `/proc/net/tcp` shows, for each socket, which timer is armed
//! (`tr`: 2 = the keepalive timer on an idle established socket) and when it fires (`tm->when`,
//! in 1/100 s). The server's end of an idle WebSocket must have it armed within the flag's
//! seconds (Linux's default would be two hours), and none with `--tcp-keepalive-secs 0`.

mod common;

use std::time::Duration;

use common::{Server, TempDir};

/// The kernel reports `tm->when` in clock ticks of 1/100 s (`USER_HZ`).
const TICKS_PER_SEC: u64 = 100;
/// Safety bound on every wait; never an assertion about speed.
const WAIT: Duration = Duration::from_secs(20);

/// `(timer, ticks until it fires)` of each established socket whose local port is `port`.
fn server_side_timers(port: u16) -> Vec<(u8, u64)> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(timer)) = (cols.get(1), cols.get(3), cols.get(5))
            else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port != Some(port) || *state != "01" {
                continue;
            }
            let (kind, when) = timer.split_once(':').expect("tr:tm->when");
            out.push((
                kind.parse().expect("a timer kind"),
                u64::from_str_radix(when, 16).expect("ticks"),
            ));
        }
    }
    out
}

/// Opens an idle WebSocket to a server started with `--tcp-keepalive-secs secs` and returns
/// the timers of the server's end once the connection has been idle a moment.
async fn idle_websocket_timers(secs: &str) -> Vec<(u8, u64)> {
    let dir = TempDir::new("keepalive");
    let server = Server::start(
        &dir.join("data"),
        dir.path(),
        &["--tcp-keepalive-secs", secs],
    );
    let url = format!("ws://{}/v1/ws", server.addr);
    let (_ws, _) =
        tokio_tungstenite::connect_async(common::ws_request(&url, Some("sluice.json.v1")))
            .await
            .expect("open the WebSocket");
    // Until the handshake's delayed ACKs and retransmit timers are done with.
    let started = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let timers = server_side_timers(server.addr.port());
        assert!(
            !timers.is_empty(),
            "the server's end of the WebSocket is listed"
        );
        if timers.iter().all(|&(kind, _)| kind == 0 || kind == 2) || started.elapsed() > WAIT {
            return timers;
        }
    }
}

#[tokio::test]
async fn client_sockets_have_tcp_keepalive() {
    let timers = idle_websocket_timers("5").await;
    for (kind, ticks) in &timers {
        assert_eq!(*kind, 2, "the keepalive timer is armed: {timers:?}");
        assert!(
            *ticks <= 5 * TICKS_PER_SEC,
            "it fires within --tcp-keepalive-secs 5, not the kernel's two hours: {timers:?}"
        );
    }
    let timers = idle_websocket_timers("0").await;
    assert!(
        timers.iter().all(|&(kind, _)| kind == 0),
        "--tcp-keepalive-secs 0: no keepalive timer: {timers:?}"
    );
}

#[test]
fn a_keepalive_out_of_range_is_refused_by_name() {
    let dir = TempDir::new("keepalive-flag");
    let (status, stderr) = Server::start_expecting_failure(
        &dir.join("data"),
        dir.path(),
        &["--tcp-keepalive-secs", "7201"],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("--tcp-keepalive-secs 7201 is above 7200"),
        "{stderr}"
    );
}
