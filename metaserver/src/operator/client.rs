//! The operator commands' client of the cluster: the members given with `--server`, the token,
//! and how a request is sent again (to the next member) when a member cannot answer.

use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;

use super::members::Members;
use super::notices::Notices;
use crate::cli::ClientArgs;

/// How long [`Operator::send_retrying`] keeps trying.
pub(crate) const RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(60);
/// Its pause between tries.
pub(crate) const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);
/// After how long of asking again it says so on stderr, once.
const RETRY_NOTICE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long connecting to a member may take: one that does not accept connections this fast
/// is down to a command, which asks the next member.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long a request may take, answer included, unless it says otherwise: longer than the
/// longest watch (55 s) and the member's own forwarding timeout (30 s), so that only a member
/// that stopped answering (a paused process) runs into it.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(70);

/// What to add to an error whose causes show a TLS exchange answered in plain HTTP: rustls
/// names only what it got where a TLS record was due, not who sent it.
pub(crate) fn plain_http_hint(e: &anyhow::Error) -> Option<&'static str> {
    e.chain()
        .any(meta_http::peer_client::answered_plain)
        .then_some(
            " (the server answers in plain HTTP, not TLS: leave out --tls-ca for a cluster \
             without TLS)",
        )
}

/// After how long without an answer [`Operator::send`] asks the next member given too, or,
/// with none left, says on stderr what it waits for (as [`Operator::send_retrying`] does).
const SLOW_NOTICE: std::time::Duration = std::time::Duration::from_secs(5);

/// Awaits `sent`, a request (maybe a write, not sent twice at once) to `asked`; says on
/// stderr, once, when no answer came within [`SLOW_NOTICE`]: a paused member takes the whole
/// [`REQUEST_TIMEOUT`] before the request is asked again.
async fn told_if_slow<T>(
    sent: impl std::future::Future<Output = T>,
    asked: &str,
    notices: &Notices,
) -> T {
    let mut sent = std::pin::pin!(sent);
    tokio::select! {
        answer = &mut sent => return answer,
        () = tokio::time::sleep(SLOW_NOTICE) => {}
    }
    say_silent(notices, asked, "waiting for it before asking again");
    sent.await
}

/// Says on stderr that `asked` has not answered in [`SLOW_NOTICE`], and what is done (`then`).
fn say_silent(notices: &Notices, asked: &str, then: &str) {
    notices.say(format!(
        "metaserver: {asked} has not answered in {} s (paused, or overloaded?); {then} (a \
         request gets up to {} s)",
        SLOW_NOTICE.as_secs(),
        REQUEST_TIMEOUT.as_secs()
    ));
}

/// A client of the members given with `--server`.
pub struct Operator {
    members: Members,
    token: Option<String>,
    /// Whether `token` is the member token (given, it is sent instead of `--token`).
    sends_member_token: bool,
    http: reqwest::Client,
    /// Requests answered after being sent again once an attempt's outcome was unknown.
    resent_after_unknown: std::sync::atomic::AtomicU32,
    /// What it said on stderr lately, so that its requests in flight say it once.
    notices: Notices,
}

/// A member's answer that is not a success, as an error.
#[derive(Debug)]
pub(crate) struct Answered {
    member: String,
    pub status: reqwest::StatusCode,
    detail: String,
}

impl std::fmt::Display for Answered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answered {}: {}",
            self.member, self.status, self.detail
        )
    }
}

impl std::error::Error for Answered {}

/// A member's non-2xx answer: its status, and the API's error code and message when the
/// body is the API's JSON error (else the body).
pub(crate) struct Refused {
    pub status: reqwest::StatusCode,
    error: Option<(String, String)>,
    body: String,
}

impl Refused {
    pub(crate) async fn read(response: reqwest::Response) -> Refused {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        let error = serde_json::from_str::<Value>(&body).ok().and_then(|v| {
            let e = v.get("error")?;
            Some((
                e.get("code")?.as_str()?.to_owned(),
                e.get("message")?.as_str()?.to_owned(),
            ))
        });
        Refused {
            status,
            error,
            body,
        }
    }

    /// The API's error code, when the body is the API's JSON error.
    pub fn code(&self) -> Option<&str> {
        self.error.as_ref().map(|(code, _)| code.as_str())
    }

    /// The API's error message, else the body as it came.
    pub fn message(&self) -> &str {
        self.error
            .as_ref()
            .map_or(&self.body, |(_, message)| message)
    }
}

impl Operator {
    /// A client of `--server`: one member, or several separated by commas.
    pub fn new(args: &ClientArgs) -> Result<Self> {
        let members = Members::parse(&args.server, args.tls_ca.is_some())?;
        let mut http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(ca) = &args.tls_ca {
            let tls = meta_http::tls::client_config_from(ca).context("--tls-ca")?;
            http = http.use_preconfigured_tls(tls).https_only(true);
        }
        let http = http.build().context("building the HTTP client")?;
        // A header cannot carry such a token (reqwest said only "failed to parse header
        // value").
        for (token, what) in [
            (&args.token, "--token (METASERVER_TOKEN)"),
            (
                &args.member_token,
                "--member-token (METASERVER_MEMBER_TOKEN)",
            ),
        ] {
            if let Some(t) = token {
                crate::settings::check_token_text(t, what)?;
            }
        }
        Ok(Operator {
            members,
            sends_member_token: args.member_token().is_some(),
            // The member token opens every route, also those that name where a member listens.
            token: args
                .member_token()
                .or(args.client_token())
                .map(str::to_owned),
            http,
            resent_after_unknown: Default::default(),
            notices: Notices::default(),
        })
    }

    /// How many requests [`Operator::send_retrying`] got answered only after sending them again
    /// once an attempt's outcome was unknown (a 504, or cut off before its answer): an earlier
    /// attempt may have taken effect, and the answer counts only what the last one did.
    pub(crate) fn resent_after_unknown(&self) -> u32 {
        self.resent_after_unknown.load(Ordering::Relaxed)
    }

    /// Notes whether an exchange with the member asked failed in its TLS handshake (`failed`
    /// counts such members in a row), and says whether every member given did: a failed
    /// handshake (an untrusted certificate, a plain-HTTP member) fails again, and asking again
    /// would only hide why.
    pub(crate) fn handshakes_all_failed(
        &self,
        failed: &mut usize,
        error: Option<&reqwest::Error>,
    ) -> bool {
        match error.and_then(|e| meta_http::peer_client::tls_error(e)) {
            Some(_) => *failed += 1,
            None => *failed = 0,
        }
        *failed >= self.members()
    }

    /// Whether only one member was given (none to move on to).
    pub(crate) fn one_member(&self) -> bool {
        self.members() == 1
    }

    /// How many members were given.
    pub(crate) fn members(&self) -> usize {
        self.members.len()
    }

    /// The base URL of the member asked now.
    pub(crate) fn member(&self) -> &str {
        self.members.current()
    }

    /// Moves on from `asked`, a member that could not answer, to the next one (see
    /// [`Members::next`]); `true` once every member was asked: pause before asking again.
    pub(crate) fn next_member(&self, asked: &str) -> bool {
        self.members.next(asked)
    }

    /// A request to the member asked now, which gives up after [`REQUEST_TIMEOUT`] (a request
    /// that may take longer sets its own timeout).
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}{path}", self.members.current()))
            .timeout(REQUEST_TIMEOUT);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends the read (a GET) `build` makes to the member asked now, and to each next one while
    /// they did not answer it: not reached, cut off, or 503 (no leader took it; but not
    /// `cluster_version`, which every member answers alike). A member silent for
    /// [`SLOW_NOTICE`] (a paused process, which would hold the read for the whole
    /// [`REQUEST_TIMEOUT`]) gets company: the next member is asked too, and the first answer
    /// counts (a read may be sent twice). Each member is asked at most once, without pauses
    /// (see [`Operator::send_retrying`] for a command that waits out a leader change); the one
    /// that answered is asked first by the command's next request. A non-2xx answer becomes an
    /// error with the API's code and message.
    pub(crate) async fn send(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let order = self.members.in_turn();
        // `build` makes a request to the member asked now: each member asked is made so first.
        let ask = |asked: &str| {
            self.members.settle(asked);
            let sent = build().send();
            let asked = asked.to_owned();
            async move { (asked, sent.await) }
        };
        let mut asking = FuturesUnordered::new();
        asking.push(ask(&order[0]));
        let mut next = 1;
        let mut told = false;
        let slow = tokio::time::sleep(SLOW_NOTICE);
        let mut slow = std::pin::pin!(slow);
        // Why each member asked before the last could not take it, for the last one's error:
        // its answer alone (a refused connection) could hide another's (503 no leader).
        let mut before: Vec<String> = Vec::new();
        loop {
            let (asked, sent) = tokio::select! {
                Some(done) = asking.next() => done,
                () = &mut slow, if next < order.len() || !told => {
                    match order.get(next) {
                        Some(company) => {
                            say_silent(
                                &self.notices,
                                &order[next - 1],
                                &format!("asking {company} too"),
                            );
                            asking.push(ask(company));
                            next += 1;
                            slow.as_mut().reset(tokio::time::Instant::now() + SLOW_NOTICE);
                        }
                        None => {
                            told = true;
                            say_silent(&self.notices, &order[next - 1], "waiting for it");
                        }
                    }
                    continue;
                }
            };
            let last = next == order.len() && asking.is_empty();
            match sent {
                Ok(r) if r.status().is_success() => {
                    self.members.settle(&asked);
                    return Ok(r);
                }
                Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE && !last => {
                    let refused = Refused::read(r).await;
                    if refused.code() == Some("cluster_version") {
                        return Err(self.refused_by(&asked, refused));
                    }
                    before.push(format!("{asked} answered 503: {}", refused.message()));
                }
                Ok(r) => {
                    let e = self.refused_by(&asked, Refused::read(r).await);
                    return Err(match before.is_empty() {
                        true => e,
                        false => e.context(self.contacting(&asked, &before)),
                    });
                }
                // A read: one cut off after it was sent may be sent again.
                Err(e) if !last => before.push(format!("{asked}: {:#}", anyhow::Error::new(e))),
                Err(e) => return Err(e).with_context(|| self.contacting(&asked, &before)),
            }
            // This one could not answer: the next is asked now, not after the others' wait.
            if let Some(then) = order.get(next) {
                asking.push(ask(then));
                next += 1;
                slow.as_mut()
                    .reset(tokio::time::Instant::now() + SLOW_NOTICE);
            }
        }
    }

    /// Whether `e` is a request cut off without an answer (not reached, no answer in time, or
    /// the connection closed: the member went away), not an answer of the member's.
    pub(crate) fn cut_off(e: &anyhow::Error) -> bool {
        e.downcast_ref::<Answered>().is_none() && e.chain().any(|c| c.is::<reqwest::Error>())
    }

    /// The context of a failure to reach `asked`: with several members, it was the last one
    /// tried, the others having failed before.
    fn contacting(&self, asked: &str, before: &[String]) -> String {
        match (self.members.len(), before.is_empty()) {
            (1, _) => format!("contacting {asked}"),
            (n, true) => format!(
                "contacting {asked} (the last of the {n} members given; the others could not \
                 answer either)"
            ),
            (n, false) => format!(
                "contacting {asked} (the last of the {n} members given; before it, {})",
                before.join("; ")
            ),
        }
    }

    /// Sends `request` to the member asked now, and only to it (a download of the snapshot
    /// that member built); a non-2xx answer becomes an error with the API's code and message.
    pub(crate) async fn send_here(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let response = request
            .send()
            .await
            .with_context(|| format!("contacting {}", self.member()))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(self.refusal(response).await)
    }

    /// The error for a non-2xx answer: its status, and the API's code and message.
    pub(crate) async fn refusal(&self, response: reqwest::Response) -> anyhow::Error {
        self.refused_error(Refused::read(response).await)
    }

    /// The error for `refused`: its status, and the API's code and message (or the body). A
    /// caller may look at the status ([`Answered`]).
    pub(crate) fn refused_error(&self, refused: Refused) -> anyhow::Error {
        self.refused_by(self.member(), refused)
    }

    /// [`Operator::refused_error`] for an answer of `member`, which may not be the one asked
    /// now (a read sent to two members).
    fn refused_by(&self, member: &str, refused: Refused) -> anyhow::Error {
        let mut detail = match refused.error {
            Some((code, message)) => format!("{code}: {message}"),
            None => refused.body,
        };
        if refused.status == reqwest::StatusCode::UNAUTHORIZED && self.sends_member_token {
            // Else it reads as a wrong --token, which was not sent.
            detail.push_str(
                " (this command sent the member token, --member-token or \
                 METASERVER_MEMBER_TOKEN, instead of --token)",
            );
        }
        anyhow::Error::new(Answered {
            member: member.to_owned(),
            status: refused.status,
            detail,
        })
    }

    /// Sends the request `build` makes, and again while the member cannot be reached, the
    /// cluster has no leader (503), or the outcome is unknown (504: the leader stopped while
    /// the request ran, or the member itself went away), every [`RETRY_PAUSE`] for at most
    /// [`RETRY_FOR`]: a leader change, a leader's crash or a member restarting does not end a
    /// long command. With several members, each retry goes to the next one, pausing once all
    /// were asked. A 503 without `Retry-After` says waiting does not help: `cluster_version`
    /// (a member runs an older build than the request needs) ends the command, and so does
    /// `no_leader` from the only member (it was removed from the cluster, or its voters refuse
    /// it); with several, the next is asked. A request that may have been applied before its
    /// answer was lost may so be sent twice: callers send only requests that apply once (a
    /// replica registered again is `unchanged`) or check. After [`RETRY_NOTICE`] of this, it
    /// says on stderr, once, what it waits for.
    pub(crate) async fn send_retrying(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        self.answer_retrying(build)
            .await?
            .map_err(|refused| self.refused_error(refused))
    }

    /// [`Operator::send_retrying`], which hands back the non-2xx answer it stops at rather than
    /// an error, for callers that act on its status or code.
    pub(crate) async fn answer_retrying(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<std::result::Result<reqwest::Response, Refused>> {
        let started = std::time::Instant::now();
        let deadline = started + RETRY_FOR;
        let mut told = false;
        // Whether an attempt may have taken effect unseen (a 504, or cut off after it was sent).
        let mut unknown = false;
        let mut handshakes_failed = 0;
        loop {
            let last_try = std::time::Instant::now() + RETRY_PAUSE > deadline;
            let asked = self.member().to_owned();
            let sent = told_if_slow(build().send(), &asked, &self.notices).await;
            let all_failed =
                self.handshakes_all_failed(&mut handshakes_failed, sent.as_ref().err());
            let why = match sent {
                Ok(r) if r.status().is_success() => {
                    if unknown {
                        self.resent_after_unknown.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(Ok(r));
                }
                Ok(r) if r.status() == reqwest::StatusCode::GATEWAY_TIMEOUT && !last_try => {
                    unknown = true;
                    Refused::read(r).await.message().to_owned()
                }
                Ok(r) if r.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE || last_try => {
                    return Ok(Err(Refused::read(r).await))
                }
                Ok(r) if !r.headers().contains_key(reqwest::header::RETRY_AFTER) => {
                    let refused = Refused::read(r).await;
                    if refused.code() == Some("cluster_version") || self.members.len() == 1 {
                        return Ok(Err(refused));
                    }
                    refused.message().to_owned()
                }
                Ok(r) => Refused::read(r).await.message().to_owned(),
                // With every member given failing its handshake, the command ends.
                Err(e) if e.is_builder() || last_try || all_failed => {
                    return Err(e).with_context(|| self.contacting(&asked, &[]))
                }
                // Not reached, or cut off before it answered: the same as a 504.
                Err(e) => {
                    unknown |= !e.is_connect();
                    e.to_string()
                }
            };
            // Not silent for a minute: once the wait is noticeable, say what it waits for.
            if !told && started.elapsed() >= RETRY_NOTICE {
                told = true;
                self.notices.say(format!(
                    "metaserver: {asked} cannot take the request yet ({why}); asking again for \
                     up to {} s in all",
                    RETRY_FOR.as_secs()
                ));
            }
            if self.next_member(&asked) {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }

    /// `GET path`, sent as [`Operator::send`] sends, decoded from JSON.
    pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        let response = self
            .send(|| self.request(reqwest::Method::GET, path))
            .await?;
        decode(response, path).await
    }

    /// [`Operator::get_json`], sent again as [`Operator::send_retrying`] sends, for a long
    /// command's reads that must ride out a leader change or a member restarting.
    pub(crate) async fn get_json_retrying<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T> {
        let response = self
            .send_retrying(|| self.request(reqwest::Method::GET, path))
            .await?;
        decode(response, path).await
    }
}

async fn decode<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    path: &str,
) -> Result<T> {
    response
        .json()
        .await
        .with_context(|| format!("decoding the answer to GET {path}"))
}
