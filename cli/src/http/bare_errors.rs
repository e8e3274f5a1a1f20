//! hyper answers a request it cannot parse (a garbage request line, a bad header, a head
//! too large) by itself, before the router sees anything: a status line and
//! `content-length: 0`. This wrapper of the connection's stream rewrites that one answer
//! into the API's JSON error body (docs/reference/http.md, "Errors"), so every error the
//! API sends is one a client can read the same way.
//!
//! It recognises hyper's answer by its shape: a 4xx or 5xx head with `connection: close`
//! and `content-length: 0`, written as one buffer (vectored writes are off). The router's
//! own errors always carry a JSON body, so they never have that shape.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose bare error answers (hyper's) are given the API's JSON body.
pub struct JsonBareErrors<I> {
    inner: I,
    /// The rewritten answer, and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
}

impl<I> JsonBareErrors<I> {
    pub fn new(inner: I) -> Self {
        Self { inner, pending: None }
    }
}

impl<I: AsyncWrite + Unpin> JsonBareErrors<I> {
    /// Writes what is pending of a rewritten answer.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, done)) = &mut self.pending {
            if *done == bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for JsonBareErrors<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for JsonBareErrors<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.drive(cx))?;
        if let Some(answer) = rewrite(buf) {
            self.pending = Some((answer, 0));
            // Written or not yet, it is ours to finish (at the flush): hyper is done with it.
            let _ = self.drive(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drive(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drive(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// hyper's bare error answer `head`, rewritten with a JSON error body; `None` for anything
/// else.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let (lines, rest) = text.split_once("\r\n\r\n")?;
    let mut lines = lines.split("\r\n");
    let status = lines.next()?;
    let code: u16 = status.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let headers: Vec<&str> = lines.collect();
    let has = |h: &str| headers.iter().any(|l| l.eq_ignore_ascii_case(h));
    if !(400..600).contains(&code)
        || !rest.is_empty()
        || !has("connection: close")
        || !has("content-length: 0")
    {
        return None;
    }
    let message = match code {
        414 => "the request's URI is too long; see docs/reference/http.md for the endpoints",
        431 => "the request's headers are too large; send fewer or shorter ones",
        _ => "the request is not HTTP/1.1 this API can read (its request line or a header is malformed); see docs/reference/http.md",
    };
    let kind = if code < 500 { "invalid" } else { "failed" };
    let body = format!(r#"{{"error":{{"kind":"{kind}","message":"{message}"}}}}"#);
    let mut out = format!("{status}\r\n");
    for h in headers
        .iter()
        .filter(|l| !l.to_ascii_lowercase().starts_with("content-length:"))
    {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    Some(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bare_400_gets_the_json_error_body() {
        let bare = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 05:30:27 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(bare).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ndate: "),
            "{head}"
        );
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["kind"], "invalid");
        assert!(v["error"]["message"].as_str().unwrap().contains("malformed"));
    }

    #[test]
    fn an_answer_of_the_router_is_left_alone() {
        let json =
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(rewrite(json).is_none());
        let ok = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert!(rewrite(ok).is_none());
        assert!(rewrite(b"{\"instance\":").is_none());
    }
}
