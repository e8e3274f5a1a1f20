//! A watch of a service through an agent that outlives the connection: when the agent goes
//! away (a restart, an upgrade), it reconnects with a jittered backoff and asks for what
//! changed since what it showed ([`Request::WatchFrom`]), so it neither repeats nor misses a
//! change. `roster watch` is built on it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use roster_transport::backoff::{Backoff, BackoffPolicy, Failure};
use roster_transport::driver::ClientTls;
use roster_transport::handshake::Secret;

use super::{Client, ClientError};
use crate::api::{fingerprint, EventView, InstanceView, Request, ServerMessage};

/// Reconnects: from 200 ms, doubling to 5 s, each drawn within ±50% (the first within 100
/// to 300 ms, so the watchers of a restarted agent spread out); a watch that lived 10 s
/// starts afresh from the first (see [`after_close`]).
const POLICY: BackoffPolicy = BackoffPolicy {
    base_ms: 200,
    cap_ms: 5_000,
    auth_cap_ms: 60_000,
    healthy_after_ms: 10_000,
    jitter_permille: 500,
    // Unused: after a healthy watch, `after_close` starts the backoff afresh instead.
    reconnect_spread_ms: 0,
};

/// What a [`RemoteWatch`] saw.
#[derive(Debug)]
pub enum WatchEvent {
    /// An instance is new to the watch, or its address or metadata changed.
    Up(InstanceView),
    /// Only an instance's status (or note) changed.
    Status(InstanceView),
    /// An instance is gone (or no longer served, for a watch of served instances): what the
    /// watch last showed of it, or only its ids for one it never showed.
    Down {
        /// The service.
        service: String,
        /// The instance id.
        instance: String,
        /// What the watch last showed of it.
        last: Option<InstanceView>,
    },
    /// The connection to the agent ended; the next [`RemoteWatch::next`] reconnects after
    /// `retry_in` and goes on from what was shown.
    Lost {
        /// Why.
        why: ClientError,
        /// How long until it tries again.
        retry_in: Duration,
    },
    /// Connected again after [`WatchEvent::Lost`]: what changed meanwhile follows, as `Up`
    /// and `Down` events.
    Resumed,
}

/// Why a [`RemoteWatch`] cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The agent could not be reached at the start, or refused our credentials.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The agent refused the watch (an invalid service name) or broke the protocol.
    #[error("the agent refused the watch: {0:?}")]
    Refused(ServerMessage),
}

/// A watch of one service through an agent, across the agent's restarts. See the module.
#[derive(Debug)]
pub struct RemoteWatch {
    url: String,
    secret: Option<Secret>,
    tls: Option<ClientTls>,
    service: String,
    all: bool,
    shown: BTreeMap<String, InstanceView>,
    client: Option<Client>,
    ever_connected: bool,
    /// The connection was lost since the last [`WatchEvent::Resumed`] (or the start).
    lost: bool,
    backoff: Backoff,
    started: Instant,
    opened: Instant,
    wait: Option<Duration>,
}

impl RemoteWatch {
    /// A watch of `service` (every live instance with `all`, else the served ones) through
    /// the agent at `url`; it connects at the first [`RemoteWatch::next`].
    pub fn new(url: &str, secret: Option<Secret>, tls: Option<ClientTls>, service: &str, all: bool) -> Self {
        Self {
            url: url.to_string(),
            secret,
            tls,
            service: service.to_string(),
            all,
            shown: BTreeMap::new(),
            client: None,
            ever_connected: false,
            lost: false,
            backoff: Backoff::default(),
            started: Instant::now(),
            opened: Instant::now(),
            wait: None,
        }
    }

    /// The instances the watch shows now, by id.
    pub fn shown(&self) -> &BTreeMap<String, InstanceView> {
        &self.shown
    }

    /// The next change: the current instances first (or, after a reconnect, what changed
    /// while it was away), then each change as the agent receives it. A lost connection is
    /// an event ([`WatchEvent::Lost`]), not an end: call again to go on.
    ///
    /// # Errors
    /// [`WatchError::Client`] when the agent cannot be reached at the first connection or
    /// refuses the credentials; [`WatchError::Refused`] when it refuses the watch.
    pub async fn next(&mut self) -> Result<WatchEvent, WatchError> {
        loop {
            if self.client.is_none() {
                if let Some(wait) = self.wait.take() {
                    tokio::time::sleep(wait).await;
                }
                match self.open().await {
                    Ok(c) => {
                        self.client = Some(c);
                        if std::mem::take(&mut self.lost) {
                            return Ok(WatchEvent::Resumed);
                        }
                    }
                    Err(e) if !self.ever_connected || is_auth(&e) => return Err(e.into()),
                    Err(e) => return Ok(self.lose(e, Failure::Network)),
                }
            }
            let Some(client) = self.client.as_mut() else {
                continue;
            };
            match client.recv().await {
                Ok(ServerMessage::Event(EventView::Up(i) | EventView::Status(i))) => {
                    if let Some(e) = self.show(i) {
                        return Ok(e);
                    }
                }
                Ok(ServerMessage::Event(EventView::Down { service, instance })) => {
                    let last = self.shown.remove(&instance);
                    return Ok(WatchEvent::Down {
                        service,
                        instance,
                        last,
                    });
                }
                Ok(other) => return Err(WatchError::Refused(other)),
                Err(e @ ClientError::Protocol { .. }) => {
                    let lived = ms(self.opened.elapsed());
                    self.client = None;
                    let now = ms(self.started.elapsed());
                    let delay = after_close(&mut self.backoff, lived, now, draw());
                    return Ok(self.lost(e, delay));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Connects and asks for what changed since what is shown.
    async fn open(&mut self) -> Result<Client, ClientError> {
        let mut client = Client::connect_tls(&self.url, self.secret.as_ref(), self.tls.as_ref()).await?;
        let known = self
            .shown
            .iter()
            .map(|(id, i)| (id.clone(), fingerprint(i)))
            .collect();
        let asked = Request::WatchFrom {
            service: self.service.clone(),
            known,
            all: self.all,
        };
        client.start(asked).await?;
        self.ever_connected = true;
        self.opened = Instant::now();
        Ok(client)
    }

    fn lose(&mut self, why: ClientError, failure: Failure) -> WatchEvent {
        let now = ms(self.started.elapsed());
        let delay = self.backoff.fail(&POLICY, failure, now, draw());
        self.lost(why, delay)
    }

    fn lost(&mut self, why: ClientError, delay_ms: u64) -> WatchEvent {
        let retry_in = Duration::from_millis(delay_ms);
        self.wait = Some(retry_in);
        self.lost = true;
        WatchEvent::Lost { why, retry_in }
    }

    /// The event for `i`: `Up` when new or moved, `Status` when only its status did,
    /// nothing when it shows what was shown (written again unchanged).
    fn show(&mut self, i: InstanceView) -> Option<WatchEvent> {
        let e = match self.shown.get(&i.instance) {
            Some(was) if fingerprint(was) == fingerprint(&i) => return None,
            Some(was) if (&was.address, &was.meta) == (&i.address, &i.meta) => WatchEvent::Status(i.clone()),
            _ => WatchEvent::Up(i.clone()),
        };
        self.shown.insert(i.instance.clone(), i);
        Some(e)
    }
}

/// The wait before reconnecting after a connection that lived `lived_ms` closed: a watch
/// that was healthy starts the backoff afresh, so its first wait is 100 to 300 ms; a short
/// one goes on escalating it (an agent that keeps closing watches is not hammered).
fn after_close(backoff: &mut Backoff, lived_ms: u64, now_ms: u64, draw: u64) -> u64 {
    if lived_ms >= POLICY.healthy_after_ms {
        *backoff = Backoff::default();
    }
    backoff.fail(&POLICY, Failure::Network, now_ms, draw)
}

fn is_auth(e: &ClientError) -> bool {
    matches!(e, ClientError::Unauthorized { .. })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn draw() -> u64 {
    getrandom::u64().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_wait_after_a_healthy_watch_is_drawn_within_100_to_300_ms() {
        for draw in [0, 1, 100, 199, 200, 201, u64::MAX] {
            // However the backoff stood before the watch that lived a minute.
            let mut b = Backoff::default();
            for _ in 0..5 {
                b.fail(&POLICY, Failure::Network, 0, draw);
            }
            let first = after_close(&mut b, 60_000, 100_000, draw);
            assert!((100..=300).contains(&first), "{first} ms for draw {draw}");
        }
    }

    #[test]
    fn short_lived_watches_back_off_further_each_time() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..6).map(|i| after_close(&mut b, 50, i * 10_000, 0)).collect();
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert!(waits[0] <= 300 && waits[5] >= 2_500, "{waits:?}");
    }
}
